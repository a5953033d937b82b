"""Grouped (ragged) matmul on one GPU, every contender side by side in one run.

Contenders: XLA's `lax.ragged_dot` (and its autodiff), Pallas Mosaic GPU's
`ragged_dot_mgpu` / `transposed_ragged_dot_mgpu` at the best of a small tile
sweep, tokamax's mosaic `ragged_dot` (the backend MaxText picks on GPU) at its
default config and at the best of a sweep over its Config (block_m, block_k,
stages, persistent, grid order), each through its own VJP for the backward
products, `torch._grouped_mm` as an outside reference (never a dependency),
and `jax_cluster.ragged_dot`. Each case (M tokens, G groups, K, N; bf16) runs with
uniform and skewed (Dirichlet) group sizes, and three products, each its own
jitted call:

    fwd    out[M,N]    = lhs_g · rhs[g]        rows of each group
    d_lhs  dlhs[M,K]   = dy_g · rhs[g]^T       rows of each group
    d_rhs  drhs[G,K,N] = lhs_g^T · dy_g        one matrix per group

FLOPs are 2·sum(group_sizes)·K·N for every product. JAX contenders are timed
by CUPTI kernel time (`jax_cluster.tuning.timing.cupti_ms`, inputs rotated past L2); torch by
CUDA events around its calls (see `torch_event_ms`). Every output is checked
against XLA's (in float32) before it is timed. Prints a table; writes JSON and
a PNG under benchmarks/results/<gpu>/ (after every case, so a cut-short run
keeps what it measured).

    python benchmarks/bench_ragged.py                 # the suite
    python benchmarks/bench_ragged.py --quick         # two smallest cases, uniform
    python benchmarks/bench_ragged.py --dry-run       # cases and group sizes only, no GPU
    python benchmarks/bench_ragged.py --cases 4096x128x2048x768 --merge   # add to earlier rows
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import re
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
# An installed jax_cluster wins; a bare checkout falls back to its own source.
sys.path.append(str(pathlib.Path(__file__).resolve().parent.parent))
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

# (M tokens, G groups, K, N)
SUITE = [
    (16384, 8, 4096, 14336),
    (32768, 64, 2048, 1408),
    (4096, 128, 2048, 768),
    (16384, 16, 2048, 16384),
    (65536, 256, 2048, 512),
]
DISTRIBUTIONS = ("uniform", "skewed")
PRODUCTS = ("fwd", "d_lhs", "d_rhs")
CONTENDERS = ("xla", "mgpu", "tokamax", "tokamax_best", "torch", "jax_cluster")
OTHERS = ("xla", "mgpu", "tokamax", "tokamax_best", "torch")  # what jax_cluster is compared against
LABELS = {
    "xla": "XLA ragged_dot",
    "mgpu": "Pallas MGPU (best cfg)",
    "tokamax": "tokamax mosaic (default)",
    "tokamax_best": "tokamax mosaic (best cfg)",
    "torch": "torch._grouped_mm",
    "jax_cluster": "jax_cluster",
}
STEM = "ragged_bf16"
SKEW_ALPHA = 0.5
SKEW_SEED = 1234  # one fixed draw per (M, G), reproducible
MAX_REL_ERR = 2e-2
TARGET_VS_XLA = 10.0  # on every case
TORCH_SPIN_CYCLES = 20_000_000  # ~10 ms of GPU clock, ahead of each torch sample
DTYPE = jnp.bfloat16

# Pallas MGPU tile sweeps (block_m, block_n, block_k, max_concurrent_steps,
# grid_block_n), at most 8 each. `ragged_dot` runs fwd and, with
# transpose_rhs=True, d_lhs; `transposed_ragged_dot` runs d_rhs, where block_k
# tiles the ragged (token) dimension.
MGPU_FIELDS = ("block_m", "block_n", "block_k", "max_concurrent_steps", "grid_block_n")
MGPU_RAGGED_CONFIGS = [
    (128, 128, 64, 4, 1),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 6, 8),
    (64, 128, 64, 6, 4),
    (64, 256, 64, 4, 4),
    (128, 128, 128, 2, 4),
    (192, 128, 64, 4, 4),
    (128, 64, 64, 6, 4),
]
MGPU_TRANSPOSED_CONFIGS = [
    (128, 128, 64, 4, 1),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 6, 8),
    (128, 128, 128, 2, 4),
    (64, 128, 64, 6, 4),
    (128, 64, 64, 6, 4),
    (64, 64, 128, 4, 4),
    (128, 128, 128, 3, 1),
]


# tokamax's mosaic Config sweep on sm90 (a part of tokamax's own autotuning
# space): (block_m, block_k, num_stages, persistent, grid_minor_dim 0=M 1=N,
# grid_tile_width); block_n is 64 (its bf16 output swizzle), split_k 1.
TOKAMAX_FIELDS = ("block_m", "block_k", "num_stages", "persistent", "grid_minor_dim", "grid_tile_width")
TOKAMAX_CONFIGS = [
    (64, 128, 2, False, 0, 1),
    (128, 128, 4, True, 0, 4),
    (128, 128, 4, False, 1, 4),
    (64, 256, 4, True, 0, 8),
    (128, 256, 2, True, 1, 2),
    (32, 128, 4, True, 0, 4),
    (64, 128, 4, True, 1, 1),
    (128, 512, 2, False, 0, 8),
]


# ----------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    m: int
    g: int
    k: int
    n: int
    dist: str
    sizes: tuple[int, ...]

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.g}x{self.k}x{self.n}"

    @property
    def flops(self) -> int:
        return 2 * sum(self.sizes) * self.k * self.n


def uniform_sizes(m: int, g: int) -> list[int]:
    base, extra = divmod(m, g)
    return [base + (1 if i < extra else 0) for i in range(g)]


def skewed_sizes(m: int, g: int, alpha: float = SKEW_ALPHA, seed: int = SKEW_SEED) -> list[int]:
    """Dirichlet(alpha) shares of m rows, rounded so they sum to m exactly."""
    shares = np.random.default_rng(seed).dirichlet(np.full(g, alpha)) * m
    sizes = np.floor(shares).astype(np.int64)
    # Flooring loses fewer than g rows; give them to the largest remainders.
    lost = m - int(sizes.sum())
    sizes[np.argsort(-(shares - sizes), kind="stable")[:lost]] += 1
    return [int(s) for s in sizes]


def group_sizes(dist: str, m: int, g: int) -> list[int]:
    sizes = uniform_sizes(m, g) if dist == "uniform" else skewed_sizes(m, g)
    assert sum(sizes) == m and min(sizes) >= 0
    return sizes


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    shapes = []
    for item in filter(None, text.split(",")):
        parts = [int(v) for v in re.split(r"[x:]", item)]
        if len(parts) != 4:
            raise SystemExit(f"--cases wants MxGxKxN, got {item!r}")
        shapes.append(tuple(parts))
    return shapes


def build_cases(args) -> list[Case]:
    if args.cases:
        shapes = parse_shapes(args.cases)
    elif args.quick:  # the two with the fewest FLOPs
        shapes = sorted(SUITE, key=lambda s: s[0] * s[2] * s[3])[:2]
    else:
        shapes = SUITE
    dists = args.dists.split(",") if args.dists else (["uniform"] if args.quick else DISTRIBUTIONS)
    for d in dists:
        if d not in DISTRIBUTIONS:
            raise SystemExit(f"--dists: unknown distribution {d!r}")
    return [Case(m, g, k, n, d, tuple(group_sizes(d, m, g))) for m, g, k, n in shapes for d in dists]


def print_cases(cases: list[Case], products) -> None:
    print(f"{'case MxGxKxN':>22} {'dist':>8} {'min':>6} {'max':>6} {'sum':>7} {'GFLOP':>9}  sizes")
    for c in cases:
        head = ",".join(str(s) for s in c.sizes[:8]) + (",..." if c.g > 8 else "")
        print(
            f"{c.shape:>22} {c.dist:>8} {min(c.sizes):6d} {max(c.sizes):6d} {sum(c.sizes):7d} "
            f"{c.flops / 1e9:9.1f}  [{head}]"
        )
    print(
        f"{len(cases)} cases x products {','.join(products)}; skewed = Dirichlet(alpha={SKEW_ALPHA}), "
        f"numpy seed {SKEW_SEED}"
    )


# ----------------------------------------------------------------------------- inputs


def make_inputs(case: Case, sets: int) -> list[dict]:
    """Fresh normal bf16 operands (never zeros), `sets` copies for L2 rotation."""
    seed = case.m * 131 + case.g * 17 + case.k * 7 + case.n + DISTRIBUTIONS.index(case.dist)
    keys = jax.random.split(jax.random.key(seed), 3 * sets)
    return [
        {
            "lhs": common.randn(keys[3 * i], (case.m, case.k), DTYPE),
            "rhs": common.randn(keys[3 * i + 1], (case.g, case.k, case.n), DTYPE),
            "dy": common.randn(keys[3 * i + 2], (case.m, case.n), DTYPE),
        }
        for i in range(sets)
    ]


def bytes_per_set(case: Case) -> int:
    # Every product touches one [M,K], one [G,K,N] and one [M,N] array.
    return (case.m * case.k + case.g * case.k * case.n + case.m * case.n) * jnp.dtype(DTYPE).itemsize


def grouped_reference(case: Case, product: str, inp: dict):
    """Float32 per-group dots: the reference only when XLA's own product fails."""
    bounds = np.concatenate([[0], np.cumsum(case.sizes)]).tolist()
    spans = list(zip(bounds[:-1], bounds[1:]))
    dot = functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731

    def reference(lhs, rhs, dy):
        if product == "fwd":
            return jnp.concatenate([dot(f32(lhs[a:b]), f32(rhs[i])) for i, (a, b) in enumerate(spans)])
        if product == "d_lhs":
            return jnp.concatenate([dot(f32(dy[a:b]), f32(rhs[i]).T) for i, (a, b) in enumerate(spans)])
        return jnp.stack([dot(f32(lhs[a:b]).T, f32(dy[a:b])) for a, b in spans])

    return jax.jit(reference)(inp["lhs"], inp["rhs"], inp["dy"])


# ----------------------------------------------------------------------------- measuring


def brief(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    return text[:300]


def check_then_time(produce, time_ms, reference, flops: int, timer: str) -> dict:
    """Run once, compare with the reference, and time only what was right."""
    try:
        out = produce()
        err = float(relative_error(out, reference))
    except Exception as e:  # a contender that cannot run this case is recorded, never fatal
        return {"status": f"failed: {brief(e)}"}
    if not err < MAX_REL_ERR:  # also catches NaN
        return {"status": f"wrong: err={err:.2e}", "rel_err": err}
    try:
        ms = time_ms()
    except Exception as e:
        return {"status": f"timing failed: {brief(e)}", "rel_err": err}
    return {"status": "ok", "ms": ms, "tflops": flops / ms / 1e9, "rel_err": err, "timing": timer}


def apply_pullback(pullback, dy):
    return pullback(dy)[0]


def pullback_args(ragged_dot, product: str, inputs: list[dict], gs) -> list[tuple]:
    """(pullback, dy) per input set.

    jax.vjp is taken here, outside the timed call: the pullback carries its
    residuals as arrays, so the timed call `apply_pullback` is exactly the
    cotangent computation that autodiff emits for one operand, and nothing of
    the forward pass.
    """
    args = []
    for inp in inputs:
        if product == "d_lhs":
            _, pullback = jax.vjp(lambda x, inp=inp: ragged_dot(x, inp["rhs"], gs), inp["lhs"])
        else:
            _, pullback = jax.vjp(lambda w, inp=inp: ragged_dot(inp["lhs"], w, gs), inp["rhs"])
        args.append((pullback, inp["dy"]))
    return args


def jax_call(ragged_dot, product: str, inputs: list[dict], gs):
    """The function to time and its argument sets, for a lax.ragged_dot-like callable."""
    if product == "fwd":
        return (lambda lhs, rhs, gs: ragged_dot(lhs, rhs, gs)), [(i["lhs"], i["rhs"], gs) for i in inputs]
    return apply_pullback, pullback_args(ragged_dot, product, inputs, gs)


def bench_jax_contender(ragged_dot, product, inputs, gs, reference, flops, iterations) -> dict:
    try:
        fn, args_list = jax_call(ragged_dot, product, inputs, gs)
    except Exception as e:
        return {"status": f"failed: {brief(e)}"}
    return check_then_time(
        lambda: jax.jit(fn)(*args_list[0]),
        lambda: timing.cupti_ms(fn, args_list, iterations),
        reference,
        flops,
        "cupti",
    )


# ----------------------------------------------------------------------------- XLA


def xla_ragged_dot(lhs, rhs, gs):
    return lax.ragged_dot(lhs, rhs, gs)


def run_xla(product, inputs, gs):
    """XLA's product on the first input set: (fn, args_list, output) or the error."""
    try:
        fn, args_list = jax_call(xla_ragged_dot, product, inputs, gs)
        return fn, args_list, jax.jit(fn)(*args_list[0]), None
    except Exception as e:
        return None, None, None, e


# ----------------------------------------------------------------------------- Pallas MGPU


@functools.cache
def mgpu_modules():
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu

    return ragged_dot_mgpu, transposed_ragged_dot_mgpu


def mgpu_import_problem() -> str | None:
    try:
        mgpu_modules()
    except Exception as e:
        return f"unavailable: {brief(e)}"
    return None


def mgpu_configs(product: str, limit: int) -> list[dict]:
    table = MGPU_TRANSPOSED_CONFIGS if product == "d_rhs" else MGPU_RAGGED_CONFIGS
    return [dict(zip(MGPU_FIELDS, c)) for c in table[:limit]]


def mgpu_tiling_problem(case: Case, product: str, cfg: dict) -> str | None:
    """Why `cfg` cannot tile this case: the kernels need whole K tiles, and we
    keep to whole output tiles too."""
    if product == "d_rhs":  # out[G, K, N]; block_k runs over the ragged tokens
        need = [("K", case.k, "block_m"), ("N", case.n, "block_n")]
    else:
        contraction, width = (case.k, case.n) if product == "fwd" else (case.n, case.k)
        need = [("contraction", contraction, "block_k"), ("output width", width, "block_n")]
    for what, size, block in need:
        if size % cfg[block]:
            return f"{what} {size} is not a multiple of {block}={cfg[block]}"
    return None


def mgpu_call(product: str, cfg: dict, inputs: list[dict], gs):
    ragged, transposed = mgpu_modules()
    if product == "fwd":
        fn = lambda lhs, rhs, gs: ragged.ragged_dot(lhs, rhs, group_sizes=gs, **cfg)  # noqa: E731
        return fn, [(i["lhs"], i["rhs"], gs) for i in inputs]
    if product == "d_lhs":  # rhs [G,K,N] read as [G, out, contraction]
        fn = lambda dy, rhs, gs: ragged.ragged_dot(
            dy,
            rhs,
            group_sizes=gs,  # noqa: E731
            transpose_rhs=True,
            **cfg,
        )
        return fn, [(i["dy"], i["rhs"], gs) for i in inputs]
    fn = lambda lhs, dy, gs: transposed.transposed_ragged_dot(lhs, dy, group_sizes=gs, **cfg)  # noqa: E731
    return fn, [(i["lhs"], i["dy"], gs) for i in inputs]


def bench_mgpu(case, product, inputs, gs, reference, settings) -> dict:
    """Every config of the sweep is checked and timed; the fastest is the result."""
    if settings.mgpu_problem:
        return {"status": settings.mgpu_problem}
    sweep, best = [], None
    for cfg in mgpu_configs(product, settings.mgpu_config_limit):
        problem = mgpu_tiling_problem(case, product, cfg)
        if problem:
            sweep.append({"config": cfg, "status": f"skipped: {problem}"})
            continue
        fn, args_list = mgpu_call(product, cfg, inputs, gs)
        result = check_then_time(
            lambda fn=fn, args_list=args_list: jax.jit(fn)(*args_list[0]),
            lambda fn=fn, args_list=args_list: timing.cupti_ms(fn, args_list, settings.iterations),
            reference,
            case.flops,
            "cupti",
        )
        sweep.append({"config": cfg, **result})
        if result["status"] == "ok" and (best is None or result["ms"] < best["ms"]):
            best = {**result, "config": cfg}
    if best is None:
        return {"status": "failed: no config of the sweep ran correctly", "sweep": sweep}
    return {**best, "sweep": sweep}


# ----------------------------------------------------------------------------- tokamax


def tokamax_problem() -> str | None:
    try:
        import tokamax  # noqa: F401
    except Exception as e:
        return f"unavailable: {brief(e)}"
    return None


def tokamax_ragged_dot(config: dict | None):
    """tokamax.ragged_dot on its mosaic backend: its own config, or `config`."""
    import tokamax

    if config is None:
        implementation = "mosaic"
    else:
        # the module tokamax.ragged_dot itself dispatches to: tokamax.ops.gpu
        # exports the same classes but also imports its Triton ops (jax_triton)
        from tokamax._src.ops.ragged_dot import pallas_mosaic_gpu as mosaic

        op = mosaic.PallasMosaicGpuRaggedDot(config=mosaic.Config(block_n=64, split_k=1, **config))
        implementation = [op]

    def ragged_dot(lhs, rhs, group_sizes, *args, **kwargs):  # lax.ragged_dot's signature
        return tokamax.ragged_dot(lhs, rhs, group_sizes, *args, implementation=implementation, **kwargs)

    return ragged_dot


def bench_tokamax(case, product, inputs, gs, reference, settings) -> tuple[dict, dict]:
    """(its default config's result, the best of the default and the sweep)."""
    if settings.tokamax_problem:
        return {"status": settings.tokamax_problem}, {"status": settings.tokamax_problem}
    flops, iterations = case.flops, settings.iterations
    default = bench_jax_contender(tokamax_ragged_dot(None), product, inputs, gs, reference, flops, iterations)
    best = {**default, "config": "default"} if default["status"] == "ok" else None
    sweep = []
    for values in TOKAMAX_CONFIGS[: settings.tokamax_config_limit]:
        cfg = dict(zip(TOKAMAX_FIELDS, values))
        result = bench_jax_contender(tokamax_ragged_dot(cfg), product, inputs, gs, reference, flops, iterations)
        sweep.append({"config": cfg, **result})
        if result["status"] == "ok" and (best is None or result["ms"] < best["ms"]):
            best = {**result, "config": cfg}
    if best is None:
        return default, {"status": "failed: no config of the sweep ran correctly", "sweep": sweep}
    return default, {**best, "sweep": sweep}


# ----------------------------------------------------------------------------- torch


def load_torch():
    """torch, or why not. An outside reference only: any failure just records a reason."""
    try:
        import torch
    except Exception as e:
        return None, f"unavailable: import torch failed ({brief(e)})"
    if not hasattr(torch, "_grouped_mm"):
        return None, f"unavailable: torch {torch.__version__} has no _grouped_mm"
    if not torch.cuda.is_available():
        return None, "unavailable: torch sees no CUDA device"
    return torch, None


def load_torch_with(op: str):
    """torch, or why not, when it has `torch.<op>` as well (an outside reference only)."""
    torch, why = load_torch()
    if torch is not None and not hasattr(torch, op):
        return None, f"unavailable: torch {torch.__version__} has no {op}"
    return torch, why


def torch_alignment_problem(case: Case) -> str | None:
    # _grouped_mm wants 16-byte leading strides (8 bf16) and fewer than 1024 groups.
    for name, size in (("K", case.k), ("N", case.n)):
        if size % 8:
            return f"skipped: {name}={size} is not a multiple of 8 (16-byte strides)"
    if case.g >= 1024:
        return f"skipped: G={case.g} >= 1024 groups"
    return None


def to_torch(torch, x):
    try:
        return torch.from_dlpack(x)  # shares the device buffer, no copy
    except Exception:
        host = torch.from_numpy(np.asarray(x.astype(jnp.float32)))
        return host.to(device="cuda", dtype=torch.bfloat16 if x.dtype == DTYPE else torch.float32)


def from_torch(torch, t):
    torch.cuda.synchronize()
    try:
        return jnp.from_dlpack(t.contiguous())
    except Exception:
        return jnp.asarray(t.float().cpu().numpy())


def torch_call(torch, product: str, t_inputs: list[dict], offs):
    """torch._grouped_mm(mat_a, mat_b, offs) with offs the cumulative group ends."""
    if product == "fwd":  # 2d x 3d: [M,K] x [G,K,N]
        fn = lambda lhs, rhs: torch._grouped_mm(lhs, rhs, offs=offs)  # noqa: E731
        return fn, [(t["lhs"], t["rhs"]) for t in t_inputs]
    if product == "d_lhs":  # 2d x 3d: [M,N] x [G,N,K] (a transposed view, no copy)
        fn = lambda dy, rhs: torch._grouped_mm(dy, rhs.transpose(-2, -1), offs=offs)  # noqa: E731
        return fn, [(t["dy"], t["rhs"]) for t in t_inputs]
    # 2d x 2d, offsets on the contraction: [K,M] (a view of lhs) x [M,N] -> [G,K,N]
    fn = lambda lhs, dy: torch._grouped_mm(lhs.t(), dy, offs=offs)  # noqa: E731
    return fn, [(t["lhs"], t["dy"]) for t in t_inputs]


def torch_event_ms(torch, fn, args_list, iterations: int) -> float:
    """Median time of one call from CUDA events around its calls.

    CUDA-event time, not CUPTI: torch.profiler would give kernel time, but it
    uses CUPTI too, and the legacy CUPTI API allows one subscriber, which the
    JAX timings in this process need. A GPU-side spin queued first keeps the
    GPU busy while the host queues the calls, so host launch overhead stays
    out of the events; only gaps between torch's own kernels remain.
    """
    spin = getattr(torch.cuda, "_sleep", None)
    for args in args_list:
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if spin is not None:
            spin(TORCH_SPIN_CYCLES)
        start.record()
        for args in args_list:
            fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(args_list))
    return statistics.median(times)


def torch_inputs(torch, case: Case, inputs: list[dict]):
    t_inputs = [{name: to_torch(torch, x) for name, x in inp.items()} for inp in inputs]
    offs = torch.tensor(np.cumsum(case.sizes), dtype=torch.int32, device="cuda")
    return t_inputs, offs


def bench_torch(case, product, torch_state, reference, settings) -> dict:
    torch, reason, t_inputs, offs = torch_state
    if torch is None:
        return {"status": reason}
    fn, args_list = torch_call(torch, product, t_inputs, offs)
    result = check_then_time(
        lambda: from_torch(torch, fn(*args_list[0])),
        lambda: torch_event_ms(torch, fn, args_list, settings.iterations),
        reference,
        case.flops,
        "cuda_events",
    )
    if settings.torch_note:
        result["note"] = settings.torch_note
    return result


# ----------------------------------------------------------------------------- jax_cluster


def gemm_view(case: Case, product: str) -> dict:
    """The product as jax_cluster's planner sees it (jax_cluster/planning/grouped.py):
    d_lhs reads rhs [G,K,N] as B [G,N',K'] k-major; d_rhs is ragged_k, (K, N, M)."""
    if product == "fwd":
        return {"m": case.m, "n": case.n, "k": case.k, "problem": "ragged_m", "b_major": "n"}
    if product == "d_lhs":
        return {"m": case.m, "n": case.k, "k": case.n, "problem": "ragged_m", "b_major": "k"}
    return {"m": case.k, "n": case.n, "k": case.m, "problem": "ragged_k", "b_major": "n"}


PLAN_FIELDS = (
    "path",
    "variant",
    "problem",
    "schedule",
    "tile_m",
    "tile_n",
    "tile_k",
    "cluster_m",
    "cluster_n",
    "max_active_clusters",
    "predicted_efficiency",
    "reason",
)


def ragged_plan_record(case: Case, product: str) -> dict:
    """What jax_cluster.plan_ragged picks for this product (the choice the call makes)."""
    if not hasattr(jax_cluster, "plan_ragged"):
        return {"status": "unavailable: jax_cluster has no plan_ragged"}
    view = gemm_view(case, product)
    try:
        plan = jax_cluster.plan_ragged(
            view["m"], view["n"], view["k"], case.g, dtype=DTYPE, problem=view["problem"], b_major=view["b_major"]
        )
    except Exception as e:  # its API is new; a mismatch is recorded, not fatal
        return {"status": f"failed: {brief(e)}", "view": view}
    fields = {f: getattr(plan, f) for f in PLAN_FIELDS if hasattr(plan, f)}
    return {
        "status": "ok",
        "view": view,
        **{f: v if isinstance(v, (int, float, str)) else str(v) for f, v in fields.items()},
    }


def bench_jax_cluster(case, product, inputs, gs, reference, settings) -> dict:
    if not hasattr(jax_cluster, "ragged_dot"):
        return {"status": "unavailable: jax_cluster has no ragged_dot in this build"}
    result = bench_jax_contender(
        jax_cluster.ragged_dot, product, inputs, gs, reference, case.flops, settings.iterations
    )
    result["plan"] = ragged_plan_record(case, product)
    return result


# ----------------------------------------------------------------------------- one case


@dataclasses.dataclass
class Settings:
    iterations: int
    products: tuple[str, ...]
    mgpu_problem: str | None
    mgpu_config_limit: int
    tokamax_problem: str | None
    tokamax_config_limit: int
    torch_module: object
    torch_problem: str | None
    torch_note: str | None


def bench_product(case, product, inputs, gs, torch_state, settings) -> dict:
    fn, args_list, xla_out, xla_error = run_xla(product, inputs, gs)
    if xla_error is None:
        reference, reference_source = xla_out.astype(jnp.float32), "xla"
        xla = check_then_time(
            lambda out=xla_out: out,
            lambda: timing.cupti_ms(fn, args_list, settings.iterations),
            reference,
            case.flops,
            "cupti",
        )
    else:
        reference, reference_source = grouped_reference(case, product, inputs[0]), "per_group_f32"
        xla = {"status": f"failed: {brief(xla_error)}"}
    del xla_out
    results = {"xla": xla}
    results["jax_cluster"] = bench_jax_cluster(case, product, inputs, gs, reference, settings)
    results["torch"] = bench_torch(case, product, torch_state, reference, settings)
    results["mgpu"] = bench_mgpu(case, product, inputs, gs, reference, settings)
    results["tokamax"], results["tokamax_best"] = bench_tokamax(case, product, inputs, gs, reference, settings)
    return make_row(case, product, results, reference_source)


def make_row(case: Case, product: str, results: dict, reference_source: str) -> dict:
    ms = {name: r["ms"] for name, r in results.items() if r["status"] == "ok"}
    for name, r in results.items():
        if name in ms and "xla" in ms:
            r["speedup_vs_xla"] = ms["xla"] / ms[name]
    best_other = min((n for n in OTHERS if n in ms), key=ms.get, default=None)
    ours = ms.get("jax_cluster")
    return {
        "case": case.shape,
        "m": case.m,
        "g": case.g,
        "k": case.k,
        "n": case.n,
        "distribution": case.dist,
        "product": product,
        "dtype": jnp.dtype(DTYPE).name,
        "group_sizes_min": min(case.sizes),
        "group_sizes_max": max(case.sizes),
        "flops": case.flops,
        "reference": reference_source,
        "contenders": {name: results[name] for name in CONTENDERS},
        "best_of_others": {"name": best_other, "ms": ms.get(best_other)},
        "jax_cluster_vs_xla": ms["xla"] / ours if ours and "xla" in ms else None,
        "jax_cluster_vs_best_other": ms[best_other] / ours if ours and best_other else None,
    }


def bench_case(case: Case, settings: Settings) -> list[dict]:
    gs = jnp.asarray(case.sizes, jnp.int32)
    inputs = make_inputs(case, timing.rotation(bytes_per_set(case)))
    torch = settings.torch_module
    reason = settings.torch_problem or (torch_alignment_problem(case) if torch else None)
    t_inputs, offs = (None, None)
    if torch is not None and reason is None:
        try:
            t_inputs, offs = torch_inputs(torch, case, inputs)
        except Exception as e:
            reason = f"failed: {brief(e)}"
    torch_state = (torch if reason is None else None, reason, t_inputs, offs)
    rows = []
    for product in settings.products:
        try:
            row = bench_product(case, product, inputs, gs, torch_state, settings)
        except Exception as e:  # e.g. no reference could be made: record the case, go on
            row = make_row(case, product, {n: {"status": f"failed: {brief(e)}"} for n in CONTENDERS}, "none")
        print_row(row)
        rows.append(row)
    del t_inputs, offs, torch_state
    if torch is not None:
        torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------- report


def cell(result: dict) -> str:
    if result["status"] == "ok":
        return f"{result['tflops']:8.1f}"
    return result["status"].split(":")[0][:8].rjust(8)


def ratio(value) -> str:
    return f"{value:7.2f}" if value else "      -"


def print_header() -> None:
    names = "".join(f"{n[:8]:>9}" for n in CONTENDERS)
    print(
        f"{'case MxGxKxN':>22} {'dist':>8} {'product':>7}{names}  {'vs XLA':>7} {'vs best':>7}   (TFLOP/s)", flush=True
    )


def print_row(row: dict) -> None:
    cells = "".join(" " + cell(row["contenders"].get(n, {"status": "absent"})) for n in CONTENDERS)
    mgpu = row["contenders"]["mgpu"]
    extra = f"  mgpu {mgpu['config']}" if "config" in mgpu else ""
    print(
        f"{row['case']:>22} {row['distribution']:>8} {row['product']:>7}{cells}  "
        f"{ratio(row['jax_cluster_vs_xla'])} {ratio(row['jax_cluster_vs_best_other'])}{extra}",
        flush=True,
    )


def geomean(values) -> float | None:
    values = [v for v in values if v]
    return statistics.geometric_mean(values) if values else None


def label(row: dict) -> str:
    return f"{row['case']} {row['distribution']} {row['product']}"


def summarize(rows: list[dict]) -> dict:
    """Geomeans and the cases that miss: >= 10x XLA on every case, >= best of
    the others on the geomean."""
    misses, unverified = [], []
    for r in rows:
        ours, xla = r["contenders"]["jax_cluster"], r["contenders"]["xla"]
        if ours["status"] != "ok":
            misses.append(f"{label(r)}: jax_cluster {ours['status']}")
        elif xla["status"] != "ok":
            unverified.append(f"{label(r)}: XLA {xla['status']}")
        elif r["jax_cluster_vs_xla"] < TARGET_VS_XLA:
            misses.append(f"{label(r)}: {r['jax_cluster_vs_xla']:.2f}x XLA")
    vs_best = geomean(r["jax_cluster_vs_best_other"] for r in rows)
    per_contender = {n: geomean(r["contenders"].get(n, {}).get("speedup_vs_xla") for r in rows) for n in CONTENDERS}
    return {
        "rows": len(rows),
        "geomean_jax_cluster_vs_xla": geomean(r["jax_cluster_vs_xla"] for r in rows),
        "geomean_jax_cluster_vs_best_other": vs_best,
        "geomean_speedup_vs_xla_by_contender": per_contender,
        "target_10x_xla_every_case_met": not misses and not unverified and bool(rows),
        "target_geomean_vs_best_other_met": vs_best is not None and vs_best >= 1.0,
        "misses_10x_xla": misses,
        "unverified_no_xla_time": unverified,
        "behind_best_other": [
            f"{label(r)}: {r['jax_cluster_vs_best_other']:.2f}x {r['best_of_others']['name']}"
            for r in rows
            if r["jax_cluster_vs_best_other"] and r["jax_cluster_vs_best_other"] < 1
        ],
    }


def print_summary(summary: dict) -> None:
    fmt = lambda v: f"{v:.2f}x" if v else "n/a"  # noqa: E731
    print(
        f"geomean jax_cluster vs XLA {fmt(summary['geomean_jax_cluster_vs_xla'])}, "
        f"vs best of others {fmt(summary['geomean_jax_cluster_vs_best_other'])}"
    )
    print(
        "geomean speedup vs XLA by contender: "
        + ", ".join(f"{n} {fmt(v)}" for n, v in summary["geomean_speedup_vs_xla_by_contender"].items())
    )
    print(
        f"target >= {TARGET_VS_XLA:g}x XLA on every case: "
        f"{'met' if summary['target_10x_xla_every_case_met'] else 'MISSED'}"
    )
    for line in summary["misses_10x_xla"] + summary["unverified_no_xla_time"]:
        print("  miss:", line)
    print(
        f"target >= best of others on the geomean: {'met' if summary['target_geomean_vs_best_other_met'] else 'MISSED'}"
    )
    for line in summary["behind_best_other"]:
        print("  behind:", line)


def plot(payload: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = payload["rows"]
    width = 0.8 / len(CONTENDERS)
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.7), 6))
    for j, name in enumerate(CONTENDERS):
        xs = [i + (j - (len(CONTENDERS) - 1) / 2) * width for i in range(len(rows))]
        ys = [r["contenders"].get(name, {}).get("tflops", np.nan) for r in rows]
        ax.bar(xs, ys, width, label=LABELS[name])
        if name == "jax_cluster":  # its speedup over XLA above its bar
            for x, y, r in zip(xs, ys, rows):
                if r["jax_cluster_vs_xla"]:
                    ax.annotate(f"{r['jax_cluster_vs_xla']:.1f}x", (x, y), ha="center", va="bottom", fontsize=6)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), [label(r) for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s = 2·sum(sizes)·K·N / time (missing bar: no time, see JSON)")
    ax.set_title(
        f"ragged_dot bf16 on {payload['device']} (jax {payload['jax_version']}); "
        f"label above jax_cluster: speedup vs XLA"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--quick", action="store_true", help="the two smallest cases (by FLOPs), uniform sizes only")
    parser.add_argument("--cases", default="", help="MxGxKxN,... instead of the suite")
    parser.add_argument("--dists", default="", help="uniform,skewed (default: both)")
    parser.add_argument("--products", default=",".join(PRODUCTS), help="fwd,d_lhs,d_rhs")
    parser.add_argument("--skip-mgpu", action="store_true", help="leave out Pallas Mosaic GPU")
    parser.add_argument("--skip-torch", action="store_true", help="leave out torch._grouped_mm")
    parser.add_argument("--skip-tokamax", action="store_true", help="leave out tokamax")
    parser.add_argument(
        "--tokamax-configs", type=int, default=8, help="how many configs of tokamax's sweep to try (at most 8)"
    )
    parser.add_argument(
        "--mgpu-configs", type=int, default=8, help="how many configs of each Pallas MGPU sweep to try (at most 8)"
    )
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of an earlier run in --out that this run does not "
        "redo (to build the suite from several shorter runs)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the cases and group sizes, touch no GPU")
    args = parser.parse_args(argv)
    products = tuple(p for p in args.products.split(",") if p)
    if not products or set(products) - set(PRODUCTS):
        parser.error(f"--products: choose from {','.join(PRODUCTS)}")
    args.products = products
    return args


def make_settings(args, device_kind: str) -> Settings:
    mgpu_problem = "skipped (--skip-mgpu)" if args.skip_mgpu else mgpu_import_problem()
    torch, torch_problem = (None, "skipped (--skip-torch)") if args.skip_torch else load_torch()
    torch_note = None
    if torch is not None and torch.cuda.get_device_capability()[0] not in (9, 10):
        torch_note = "not sm90/sm100: torch runs its per-group mm fallback"
    return Settings(
        iterations=args.iterations,
        products=args.products,
        mgpu_problem=mgpu_problem,
        mgpu_config_limit=min(8, args.mgpu_configs),
        tokamax_problem="skipped (--skip-tokamax)" if args.skip_tokamax else tokamax_problem(),
        tokamax_config_limit=min(len(TOKAMAX_CONFIGS), args.tokamax_configs),
        torch_module=torch,
        torch_problem=torch_problem,
        torch_note=torch_note,
    )


def describe_run(settings: Settings, device: str) -> dict:
    torch = settings.torch_module
    return {
        "device": device,
        "jax_version": jax.__version__,
        "torch_version": getattr(torch, "__version__", None),
        "jax_cluster_info": str(jax_cluster.info()),
        "dtype": jnp.dtype(DTYPE).name,
        "iterations": settings.iterations,
        "skew": {"distribution": "dirichlet", "alpha": SKEW_ALPHA, "numpy_seed": SKEW_SEED},
        "max_rel_err": MAX_REL_ERR,
        "target_vs_xla": TARGET_VS_XLA,
        "unavailable": {
            "mgpu": settings.mgpu_problem,
            "tokamax": settings.tokamax_problem,
            "torch": settings.torch_problem,
        },
        "notes": [
            "FLOPs = 2*sum(group_sizes)*K*N for every product.",
            "JAX contenders: CUPTI kernel time (all kernels of the call), inputs rotated "
            "past L2. torch: CUDA-event time around its calls, queued behind a GPU "
            "spin so host launch overhead is hidden (not CUPTI).",
            "XLA d_lhs/d_rhs: jax.vjp of lax.ragged_dot taken outside the timing; the "
            "timed call applies the pullback (cotangent only). Same for jax_cluster.",
            "Reference: XLA's output in float32 ('reference': 'xla'), or float32 "
            "per-group dots when XLA failed ('per_group_f32').",
            "Pallas MGPU: fwd = ragged_dot, d_lhs = ragged_dot(transpose_rhs=True), "
            "d_rhs = transposed_ragged_dot; best of the sweep, all configs in 'sweep'.",
            "tokamax: tokamax.ragged_dot(implementation='mosaic') at its own config ('tokamax') and "
            "the best of it and a Config sweep ('tokamax_best', all configs in 'sweep'); d_lhs/d_rhs "
            "through tokamax's VJP.",
        ],
    }


def earlier_rows(out_dir: pathlib.Path, cases: list[Case], products) -> list[dict]:
    """Rows of an earlier ragged_bf16.json that this run will not measure again."""
    path = out_dir / f"{STEM}.json"
    if not path.exists():
        return []
    redo = {(c.shape, c.dist, p) for c in cases for p in products}
    rows = json.loads(path.read_text()).get("rows", [])
    return [r for r in rows if (r["case"], r["distribution"], r["product"]) not in redo]


def main(argv=None):
    args = parse_args(argv)
    cases = build_cases(args)
    if args.dry_run:
        print_cases(cases, args.products)
        return
    device = common.device_name()
    out_dir = common.results_dir(args.out)
    settings = make_settings(args, device)
    payload = {**describe_run(settings, device), "rows": []}
    earlier = earlier_rows(out_dir, cases, args.products) if args.merge else []
    print(
        f"{device}; mgpu: {settings.mgpu_problem or 'available'}; "
        f"torch: {settings.torch_problem or getattr(settings.torch_module, '__version__', '')}"
    )
    print_header()
    for case in cases:
        payload["rows"].extend(bench_case(case, settings))
        payload["rows_from_earlier_runs"] = len(earlier)
        payload["summary"] = summarize(earlier + payload["rows"])
        common.write_results(out_dir, STEM, {**payload, "rows": earlier + payload["rows"]}, plot)
    print_summary(payload["summary"])


if __name__ == "__main__":
    main()
