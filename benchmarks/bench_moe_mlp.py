"""The mixture-of-experts MLP, forward + backward, as users train it: one
layer on jax_cluster, tokamax, XLA and torch, side by side in one run.

The unit timed is `jax_cluster.nn.MoEMLP.routed`: the routed tokens gathered
in expert order, the gate and up grouped products, SwiGLU (silu(gate) * up),
the down grouped product, and each token's weighted sum over its top-k
experts; forward plus the backward for the tokens and all three expert
weights. The router (a [D, E] linear and the top-k sort) is not included: the
routing is drawn from a distribution, so every contender sees the same group
sizes. The distributions: `uniform` (every expert gets T*top_k/E rows),
`skewed` (expert shares from Dirichlet(0.5), each token's top_k drawn from
them) and `one_hot` (every token picks experts 0..top_k-1).

Contenders, each the same MoEMLP layer with another `ragged_dot`:
- jax_cluster: `jax_cluster.ragged_dot` (the grouped kernels), as the layer
  is by default (`jc_ms`) and with `fuse_gate_up=True` (`jc_fused_ms`: gate
  and up as one grouped product over the same weights) and, with --fp8, in
  the blockwise fp8 recipe (`jc_fp8_ms`: `MoEMLP(..., fp8="blockwise")`, its
  three products' operands quantized on the fly, the weights by the
  one-pass kernel where it runs; the weights stay bf16), and the same with
  the weights quantized by XLA's passes (`jc_fp8_xla_weights_ms`;
  primitives/weight_block_quantize.py), and
  with --token-blocks S, routed in S blocks of tokens (`jc_blocks_ms`:
  `MoEMLP(token_blocks=S)`'s data-parallel form on one device, [S, E]
  group sizes, each block's products and weight-gradient partials apart),
  and with --micro-batches M, a step of M micro-batches accumulated in a
  `lax.scan` over the same weights into bf16 sums, per micro-batch
  (`jc_accum_ms`, and with --fp8 `jc_fp8_accum_ms`, each micro-batch's
  products quantizing the weights, which the compiler may or may not move
  out of the loop, and `jc_fp8_accum_ahead_ms`, the weights quantized once
  before the loop by `MoEMLP.fp8_weights()` and read by every micro-batch);
- tokamax: `tokamax.ragged_dot(..., implementation="mosaic")`, its default
  config (the backend MaxText picks on GPU);
- xla: `jax.lax.ragged_dot`;
- torch: the same layer on `torch._grouped_mm` with autograd, an outside
  reference only (CUDA-event time; see bench_ragged.torch_event_ms);
- with --experimental-xla, XLA's experimental GPU paths for ragged dots, each
  in a process of its own (they are process-wide settings): the cuDNN
  ragged-dot fusion, the grouped-GEMM rewrite and the Pallas-Triton lowering
  (`xla_cudnn`, `xla_grouped_gemm`, `xla_pallas_triton`; see XLA_PATHS). A path
  the installed jax or XLA lacks is recorded with its error.
A contender that cannot run a case is recorded with its error (`*_error`),
never dropped. Weights and activations are bf16; the JAX contenders share one
copy of the weights.

Checks before timing: jax_cluster's forward against a float32 evaluation of
sampled tokens, and every other contender's output and gradients against
jax_cluster's (bf16 both sides). Device time from CUPTI for the JAX
contenders. Writes moe_mlp.json ({"rows": [{"config", "tokens", "routing",
"jc_ms", "tokamax_ms", "xla_ms", "torch_ms", ...}]}) and a PNG.

    python benchmarks/bench_moe_mlp.py --list                 # the cases, no GPU
    python benchmarks/bench_moe_mlp.py --out benchmarks/results/h200
    python benchmarks/bench_moe_mlp.py --smoke                # tiny shapes, any device
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import bench_ragged  # noqa: E402
import common  # noqa: E402

import jax_cluster  # noqa: E402
from jax_cluster.nn import MoEMLP, join_gate_up, split_gate_up  # noqa: E402
from jax_cluster.primitives import weight_block_quantize  # noqa: E402
from jax_cluster.tuning import timing  # noqa: E402
from jax_cluster.tuning.accuracy import relative_error  # noqa: E402

DTYPE = jnp.bfloat16
ROUTINGS = ("uniform", "skewed", "one_hot")
SKEW_ALPHA, SEED = 0.5, 20261202
# bf16 layers against each other (all gradients included): tokamax differs from
# jax_cluster by 2.6-3.2e-2 on Mixtral, torch by 5e-3; the f32 check is tighter
MAX_REL_ERR = 5e-2
# the fp8 recipe against the bf16 layer: e4m3 moves one layer's gradients 4-5%
MAX_FP8_REL_ERR = 1e-1
AGREEMENT_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    features: int  # D, the model width
    hidden: int  # each expert's hidden width
    experts: int
    top_k: int

    def flops(self, tokens: int) -> int:
        """Forward + backward: three grouped products forward, six backward."""
        return 9 * 2 * tokens * self.top_k * self.features * self.hidden


# Published configurations (model width, expert hidden width, experts, top-k)
CONFIGS = [
    Config("mixtral-8x7b", 4096, 14336, 8, 2),
    Config("mixtral-8x22b", 6144, 16384, 8, 2),
    Config("deepseek-v2-lite", 2048, 1408, 64, 6),
    Config("deepseek-v3", 7168, 2048, 256, 8),
    Config("qwen3-30b-a3b", 2048, 768, 128, 8),
    Config("qwen3-235b-a22b", 4096, 1536, 128, 8),
    Config("olmoe-1b-7b", 2048, 1024, 64, 8),
    Config("gpt-oss-20b", 2880, 2880, 32, 4),
    Config("gpt-oss-120b", 2880, 2880, 128, 4),
    Config("dbrx", 6144, 10752, 16, 4),
    Config("phi-3.5-moe", 4096, 6400, 16, 2),
    Config("llama4-scout", 5120, 8192, 16, 1),
    Config("granite-3-3b-a800m", 1536, 512, 40, 8),
]
TRAINING_TOKENS = 8192
# XLA's experimental ragged-dot paths: (environment variable, value) or a jax config name
XLA_PATHS = {
    "xla_cudnn": ("XLA_FLAGS", "--xla_gpu_experimental_use_ragged_dot_fusion=true"),
    "xla_grouped_gemm": ("XLA_FLAGS", "--xla_gpu_experimental_use_ragged_dot_grouped_gemm=true"),
    "xla_pallas_triton": ("jax_config", "jax_ragged_dot_use_gpu_pallas_triton_lowering"),
}
# smoke-c: the smallest the fp8 recipe takes (widths and routed rows in multiples of 128)
SMOKE = [Config("smoke-a", 64, 128, 8, 2), Config("smoke-b", 128, 64, 16, 4), Config("smoke-c", 128, 128, 8, 2)]


def assignment(routing: str, tokens: int, experts: int, top_k: int):
    """Each token's top_k distinct experts [T, top_k], drawn with a fixed seed."""
    rng = np.random.default_rng(SEED)
    if routing == "uniform":  # token t takes experts t*top_k .. t*top_k+top_k-1 (mod E)
        return (np.arange(tokens)[:, None] * top_k + np.arange(top_k)[None, :]) % experts
    if routing == "one_hot":
        return np.broadcast_to(np.arange(top_k), (tokens, top_k)).copy()
    if routing == "skewed":  # Gumbel top-k on log shares: k distinct experts per token
        shares = rng.dirichlet(np.full(experts, SKEW_ALPHA))
        keys = np.log(shares + 1e-30)[None, :] + rng.gumbel(size=(tokens, experts))
        return np.argsort(-keys, axis=1)[:, :top_k]
    raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")


def routed_inputs(experts_of: np.ndarray, num_experts: int):
    """What `route` would give for these choices: order, weights and group sizes."""
    tokens, top_k = experts_of.shape
    flat = experts_of.reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.int32)
    logits = np.random.default_rng(SEED + 1).normal(size=(tokens, top_k))
    weights = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    sizes = np.bincount(flat, minlength=num_experts).astype(np.int32)
    return jnp.asarray(order), jnp.asarray(weights.reshape(-1), jnp.float32), jnp.asarray(sizes)


def case_inputs(cfg: Config, tokens: int, routing: str):
    """One case's inputs, the same on every call: each token's experts
    [T, top_k], what `route` would give for them (order, weights, sizes), and
    the layer's input x and output gradient dy [T, D]."""
    experts_of = assignment(routing, tokens, cfg.experts, cfg.top_k)
    kx, kdy = jax.random.split(jax.random.key(tokens + cfg.features))
    x, dy = (common.randn(k, (tokens, cfg.features), DTYPE) for k in (kx, kdy))
    return experts_of, routed_inputs(experts_of, cfg.experts), (x, dy)


def make_layer(cfg: Config, ragged_dot, abstract: bool, fuse_gate_up=False, fp8=None):
    def build():
        return MoEMLP(
            cfg.features,
            cfg.hidden,
            cfg.experts,
            cfg.top_k,
            fuse_gate_up=fuse_gate_up,
            fp8=fp8,
            dtype=DTYPE,
            param_dtype=DTYPE,
            ragged_dot=ragged_dot,
            rngs=nnx.Rngs(0),
        )

    return nnx.split(nnx.eval_shape(build) if abstract else build())


def fused_layer(cfg: Config, state):
    """(graph, state) of the layer with `fuse_gate_up=True` holding the same
    weights as the unfused `state`."""
    layer = nnx.merge(*make_layer(cfg, jax_cluster.ragged_dot, abstract=True, fuse_gate_up=True))
    layer.gate_up.kernel = nnx.Param(join_gate_up(kernel(state, "gate"), kernel(state, "up")))
    layer.down.kernel = nnx.Param(kernel(state, "down"))
    layer.router.kernel = nnx.Param(jax.tree.leaves(state["router"])[0])
    return nnx.split(layer)


def fused_outputs(result) -> list:
    """`named_outputs` of the fused layer: its gate_up gradient split in two."""
    y, state_grad, x_grad = result
    d_gate, d_up = split_gate_up(kernel(state_grad, "gate_up"))
    return [y, d_gate, d_up, kernel(state_grad, "down"), x_grad]


def blocked_inputs(experts_of: np.ndarray, weights, num_experts: int, blocks: int):
    """`routed_inputs` for each of `blocks` equal blocks of tokens, stacked:
    order and weights [S, T/S * top_k], sizes [S, E]; the weights the same
    per token as the whole routing's."""
    per_block = experts_of.reshape(blocks, -1, experts_of.shape[1])
    order = np.stack([np.argsort(b.reshape(-1), kind="stable") for b in per_block]).astype(np.int32)
    sizes = np.stack([np.bincount(b.reshape(-1), minlength=num_experts) for b in per_block]).astype(np.int32)
    return jnp.asarray(order), jnp.asarray(weights).reshape(blocks, -1), jnp.asarray(sizes)


def blocked_step_fn(graph, blocks: int):
    """step_fn's signature, the tokens routed in `blocks` blocks ([S, ...] routing)."""

    def step(state, x, dy, order, weights, sizes):
        def forward(state, x):
            tokens = x.reshape(blocks, -1, x.shape[-1])
            return nnx.merge(graph, state).routed(tokens, order, weights, sizes).reshape(x.shape)

        y, pullback = jax.vjp(forward, state, x)
        return y, *pullback(dy)

    return step


def step_fn(graph):
    """(state, x, dy, order, weights, sizes) -> (y, state gradient, x gradient)."""

    def step(state, x, dy, order, weights, sizes, fp8_weights=None):
        def forward(state, x):
            layer = nnx.merge(graph, state)
            return layer.routed(x[None], order[None], weights[None], sizes[None], fp8_weights=fp8_weights)[0]

        y, pullback = jax.vjp(forward, state, x)
        return y, *pullback(dy)

    return step


def accumulated_step_fn(graph, ahead: bool = False):
    """(state, xs, dys, order, weights, sizes) -> the state gradient summed
    over the micro-batches xs, dys [M, T, D] (one routing for all), in the
    parameters' dtype: a float32 sum of a DeepSeek-V3 layer's gradients
    would hold 45 GB beside them. `ahead`: the fp8 layer's weights quantized
    once, before the loop (`MoEMLP.fp8_weights()`)."""
    step = step_fn(graph)

    def accumulate(state, xs, dys, order, weights, sizes):
        quantized = nnx.merge(graph, state).fp8_weights() if ahead else None

        def one(total, batch):
            grads = step(state, *batch, order, weights, sizes, quantized)[1]
            return jax.tree.map(lambda t, g: t + g.astype(t.dtype), total, grads), None

        return jax.lax.scan(one, jax.tree.map(jnp.zeros_like, state), (xs, dys))[0]

    return accumulate


def micro_batches(x, dy, count: int):
    """`count` micro-batches of the case's x and dy, each scaled apart."""
    scale = (1.0 + 0.01 * jnp.arange(count, dtype=jnp.float32))[:, None, None]
    return (x[None] * scale).astype(x.dtype), (dy[None] * scale).astype(dy.dtype)


def sampled_reference(state, cfg: Config, x, experts_of, weights, samples: int):
    """A float32 evaluation of the layer for the first `samples` tokens, one
    token at a time through its own experts' weights (no grouped product)."""
    gate, up, down = (kernel(state, name) for name in ("gate", "up", "down"))
    f32 = lambda w: w.astype(jnp.float32)  # noqa: E731  one expert's slice at a time
    rows = []
    for t in range(samples):
        y = jnp.zeros((cfg.features,), jnp.float32)
        xt = x[t].astype(jnp.float32)
        for j in range(cfg.top_k):
            e = int(experts_of[t, j])
            h = jax.nn.silu(xt @ f32(gate[e])) * (xt @ f32(up[e]))
            y = y + weights[t * cfg.top_k + j] * (h @ f32(down[e]))
        rows.append(y)
    return jnp.stack(rows)


def kernel(state, name):
    """The [E, in, out] weights of one of the layer's grouped products."""
    return jax.tree.leaves(state[name])[0]


def named_outputs(result) -> list:
    """A step's output and the gradients the layer trains, in one order:
    y, d gate, d up, d down, dx (the router, outside `routed`, has none)."""
    y, state_grad, x_grad = result
    return [y, *(kernel(state_grad, name) for name in ("gate", "up", "down")), x_grad]


def kept(outputs: list) -> list:
    """Each output as a strided sample of at most AGREEMENT_ELEMENTS elements:
    what `agreement` compares, small enough to hold beside another step's
    outputs (a DeepSeek-V3 layer's weight gradients alone take 21 GiB)."""
    return [a.reshape(-1)[:: max(1, a.size // AGREEMENT_ELEMENTS)] for a in outputs]


def agreement(ours: list, theirs: list) -> float:
    """The largest relative error over the output and every gradient (their
    `kept` samples)."""
    return max(float(relative_error(t, o.astype(jnp.float32))) for t, o in zip(theirs, ours, strict=True))


# ----------------------------------------------------------------------------- torch


def torch_layer_ms(torch, cfg, state, x, dy, experts_of, weights, sizes, iterations):
    """(ms, outputs) of the same layer on torch._grouped_mm, forward + backward;
    the outputs in `named_outputs`' order."""
    to_t = lambda a: bench_ragged.to_torch(torch, a)  # noqa: E731
    wg, wu, wd = (to_t(kernel(state, n)).requires_grad_() for n in ("gate", "up", "down"))
    xt = to_t(x).requires_grad_()
    dyt = to_t(dy)
    flat = torch.as_tensor(np.asarray(experts_of).reshape(-1), device="cuda")
    order = torch.argsort(flat, stable=True)
    inverse = torch.argsort(order)
    offs = torch.cumsum(torch.as_tensor(np.asarray(sizes), device="cuda"), 0).to(torch.int32)
    w = torch.as_tensor(np.asarray(weights), device="cuda").to(torch.bfloat16).reshape(-1, cfg.top_k, 1)

    def run():
        rows = xt[order // cfg.top_k]
        h = torch.nn.functional.silu(torch._grouped_mm(rows, wg, offs=offs)) * torch._grouped_mm(rows, wu, offs=offs)
        out = torch._grouped_mm(h, wd, offs=offs)[inverse].reshape(-1, cfg.top_k, cfg.features)
        y = (out * w).sum(1)
        grads = torch.autograd.grad(y, (wg, wu, wd, xt), dyt)
        return y, grads

    y, grads = run()
    outputs = kept([bench_ragged.from_torch(torch, t.detach()) for t in (y, *grads)])
    del y, grads
    ms = bench_ragged.torch_event_ms(torch, run, [()], iterations)
    return ms, outputs


# ----------------------------------------------------------------------------- one case


class WrongResult(AssertionError):
    """jax_cluster's own layer is off its float32 reference: the run stops."""


def measure(
    cfg: Config,
    tokens: int,
    routing: str,
    contenders: dict,
    iterations: int,
    samples: int,
    others_too=True,
    fp8=False,
    token_blocks=1,
    micro=0,
):
    row = {
        "config": cfg.name,
        "features": cfg.features,
        "hidden": cfg.hidden,
        "experts": cfg.experts,
        "top_k": cfg.top_k,
        "tokens": tokens,
        "routing": routing,
        "router_included": False,
        "flops": cfg.flops(tokens),
        "commit": common.run_record()["commit"],  # a resumed file holds rows of several runs
    }
    experts_of, (order, weights, sizes), (x, dy) = case_inputs(cfg, tokens, routing)
    row["largest_group"], row["empty_groups"] = int(sizes.max()), int((sizes == 0).sum())
    graph, state = make_layer(cfg, jax_cluster.ragged_dot, abstract=False)
    step = step_fn(graph)
    full = named_outputs(jax.jit(step)(state, x, dy, order, weights, sizes))
    want = sampled_reference(state, cfg, x, experts_of, weights, samples)
    row["jc_rel_err_vs_f32"] = float(relative_error(full[0][:samples], want))
    ours = kept(full)
    del full
    if not row["jc_rel_err_vs_f32"] < 2e-2:
        raise WrongResult(f"{cfg.name} {routing}: jax_cluster's forward is off by {row['jc_rel_err_vs_f32']:.2e}")
    args = [(state, x, dy, order, weights, sizes)]
    timer = timing.cupti_ms if timing.cupti_works(x) else timing.wall_ms
    row["timing"] = "cupti" if timer is timing.cupti_ms else "wall"
    row["jc_ms"] = timer(step, args, iterations)
    row["jc_fused_ms"] = None
    if others_too:  # the same layer with gate and up as one grouped product
        try:
            fused_graph, fused_state = fused_layer(cfg, state)
            fused = step_fn(fused_graph)
            got = kept(fused_outputs(jax.jit(fused)(fused_state, x, dy, order, weights, sizes)))
            row["jc_fused_rel_err_vs_jc"] = err = agreement(ours, got)
            if err < MAX_REL_ERR:
                row["jc_fused_ms"] = timer(fused, [(fused_state, *args[0][1:])], iterations)
            else:
                row["jc_fused_error"] = f"wrong: relative error {err:.2e} against jax_cluster"
        except Exception as e:
            row["jc_fused_error"] = bench_ragged.brief(e)
        fused_state = None  # its copy of the weights must not stay for the other contenders
    if token_blocks > 1:  # the data-parallel form of the same layer, on this one device
        row["token_blocks"], row["jc_blocks_ms"] = token_blocks, None
        try:
            blocked = blocked_step_fn(graph, token_blocks)
            blocked_args = (state, x, dy, *blocked_inputs(experts_of, weights, cfg.experts, token_blocks))
            row["jc_blocks_rel_err_vs_jc"] = err = agreement(ours, kept(named_outputs(jax.jit(blocked)(*blocked_args))))
            if err < MAX_REL_ERR:
                row["jc_blocks_ms"] = timer(blocked, [blocked_args], iterations)
            else:
                row["jc_blocks_error"] = f"wrong: relative error {err:.2e} against jax_cluster"
        except Exception as e:
            row["jc_blocks_error"] = bench_ragged.brief(e)
    if fp8:  # the same weights, the products in the blockwise fp8 recipe
        # jc_fp8: the weights quantized by the one-pass kernel (where it runs); jc_fp8_xla_weights: by XLA's passes
        for key, weight_kernel in (("jc_fp8", True), ("jc_fp8_xla_weights", False)):
            row[f"{key}_ms"] = None
            try:
                with weight_block_quantize.kernel_default_as(weight_kernel):
                    fp8_step = step_fn(make_layer(cfg, jax_cluster.ragged_dot, abstract=True, fp8="blockwise")[0])
                    err = agreement(ours, kept(named_outputs(jax.jit(fp8_step)(*args[0]))))
                    row[f"{key}_rel_err_vs_jc"] = err
                    if err < MAX_FP8_REL_ERR:
                        row[f"{key}_ms"] = timer(fp8_step, args, iterations)
                    else:
                        row[f"{key}_error"] = f"wrong: relative error {err:.2e} against jax_cluster's bf16"
            except Exception as e:  # e.g. widths that are not multiples of 128
                row[f"{key}_error"] = bench_ragged.brief(e)
    if micro > 1:  # gradient accumulation: M micro-batches a step, per micro-batch
        row["micro_batches"] = micro
        xs, dys = micro_batches(x, dy, micro)
        forms = [("jc_accum", None, False)]
        if fp8:
            forms += [("jc_fp8_accum", "blockwise", False), ("jc_fp8_accum_ahead", "blockwise", True)]
        for key, recipe, ahead in forms:
            row[f"{key}_ms"] = None
            try:
                layer_graph = make_layer(cfg, jax_cluster.ragged_dot, abstract=True, fp8=recipe)[0]
                accumulate = accumulated_step_fn(layer_graph, ahead)
                total = kept(jax.tree.leaves(jax.jit(accumulate)(state, xs, dys, order, weights, sizes)))
                # against samples of the same micro-batches' gradients, taken one by one, summed in float32
                single, summed = jax.jit(step_fn(layer_graph)), None
                for i in range(micro):
                    part = [
                        p.astype(jnp.float32)
                        for p in kept(jax.tree.leaves(single(state, xs[i], dys[i], order, weights, sizes)[1]))
                    ]
                    summed = part if summed is None else [a + b for a, b in zip(summed, part)]
                row[f"{key}_rel_err_vs_sum"] = err = max(float(relative_error(t, w)) for t, w in zip(total, summed))
                if err < 1e-2:  # the sum rounded to bf16 each micro-batch
                    row[f"{key}_ms"] = timer(accumulate, [(state, xs, dys, order, weights, sizes)], iterations) / micro
                else:
                    row[f"{key}_error"] = f"wrong: relative error {err:.2e} against the summed micro-batches"
            except Exception as e:
                row[f"{key}_error"] = bench_ragged.brief(e)
        del xs, dys
    for name, (ragged_dot, why_not) in contenders.items():
        row[f"{name}_ms"] = None
        if ragged_dot is None:
            row[f"{name}_error"] = why_not
            continue
        try:
            other_graph, _ = make_layer(cfg, ragged_dot, abstract=True)
            other = step_fn(other_graph)
            err = agreement(ours, kept(named_outputs(jax.jit(other)(state, x, dy, order, weights, sizes))))
            row[f"{name}_rel_err_vs_jc"] = err
            if not err < MAX_REL_ERR:
                row[f"{name}_error"] = f"wrong: relative error {err:.2e} against jax_cluster"
                continue
            row[f"{name}_ms"] = timer(other, args, iterations)
        except Exception as e:  # a contender that cannot run the case is recorded, never fatal
            row[f"{name}_error"] = bench_ragged.brief(e)
    torch, why_not = bench_ragged.load_torch() if others_too else (None, "not run in this process")
    row["torch_ms"] = None
    if torch is None:
        row["torch_error"] = why_not
    else:
        try:
            ms, got = torch_layer_ms(torch, cfg, state, x, dy, experts_of, weights, sizes, iterations)
            err = agreement(ours, got)
            row["torch_rel_err_vs_jc"] = err
            if err < MAX_REL_ERR:
                row["torch_ms"] = ms
            else:
                row["torch_error"] = f"wrong: relative error {err:.2e} against jax_cluster"
        except Exception as e:
            row["torch_error"] = bench_ragged.brief(e)
    return row


# ----------------------------------------------------------------------------- XLA's experimental paths


def experimental_xla(path: str, argv: list[str]) -> list[dict]:
    """The rows of a child process that runs only XLA's contender on `path`."""
    setting, value = XLA_PATHS[path]
    env = dict(os.environ)
    if setting == "XLA_FLAGS":
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {value}".strip()
    with tempfile.TemporaryDirectory() as tmp:
        rows_file = pathlib.Path(tmp) / "rows.json"
        child = [sys.executable, __file__, *argv, "--xla-only", path, "--rows-file", str(rows_file)]
        run = subprocess.run(child, env=env, capture_output=True, text=True)
        if run.returncode != 0 or not rows_file.exists():
            tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
            return [{"error": f"exit {run.returncode}: {tail[0][:300]}"}]
        return json.loads(rows_file.read_text())


def merge_experimental(rows: list[dict], path: str, child_rows: list[dict]) -> None:
    by_case = {(r["config"], r["routing"]): r for r in child_rows if "config" in r}
    failure = next((r["error"] for r in child_rows if "error" in r), None)
    for row in rows:
        child = by_case.get((row["config"], row["routing"]))
        row[f"{path}_ms"] = child.get("xla_ms") if child else None
        if row[f"{path}_ms"] is None:
            row[f"{path}_error"] = (child or {}).get("xla_error") or failure or "not measured"


# ----------------------------------------------------------------------------- summary


def best_other(row) -> float | None:
    names = ("tokamax_ms", "xla_ms", "torch_ms", *(f"{path}_ms" for path in XLA_PATHS))
    times = [row[k] for k in names if row.get(k)]
    return min(times) if times else None


def summary(rows) -> dict:
    def geomean(values):
        values = [v for v in values if v]
        return math.exp(sum(map(math.log, values)) / len(values)) if values else None

    failed = sum(1 for r in rows if not r.get("jc_ms"))
    rows = [r for r in rows if r.get("jc_ms")]
    return {
        "rows": len(rows) + failed,
        "rows_jax_cluster_could_not_run": failed,
        "geomean_speedup_vs_tokamax": geomean(r["tokamax_ms"] / r["jc_ms"] for r in rows if r.get("tokamax_ms")),
        "geomean_speedup_vs_best_other": geomean(best_other(r) / r["jc_ms"] for r in rows if best_other(r)),
        "min_speedup_vs_best_other": min((best_other(r) / r["jc_ms"] for r in rows if best_other(r)), default=None),
        "cases_without_tokamax": sum(1 for r in rows if not r.get("tokamax_ms")),
        "geomean_speedup_fused_vs_unfused": geomean(
            r["jc_ms"] / r["jc_fused_ms"] for r in rows if r.get("jc_fused_ms")
        ),
        "geomean_speedup_fp8_vs_bf16": geomean(r["jc_ms"] / r["jc_fp8_ms"] for r in rows if r.get("jc_fp8_ms")),
        "geomean_speedup_fp8_xla_weights_vs_bf16": geomean(
            r["jc_ms"] / r["jc_fp8_xla_weights_ms"] for r in rows if r.get("jc_fp8_xla_weights_ms")
        ),
        "geomean_speedup_fp8_vs_bf16_accumulated": geomean(
            r["jc_accum_ms"] / r["jc_fp8_accum_ms"] for r in rows if r.get("jc_fp8_accum_ms") and r.get("jc_accum_ms")
        ),
        "geomean_speedup_fp8_ahead_vs_bf16_accumulated": geomean(
            r["jc_accum_ms"] / r["jc_fp8_accum_ahead_ms"]
            for r in rows
            if r.get("jc_fp8_accum_ahead_ms") and r.get("jc_accum_ms")
        ),
    }


def plot(payload, path):
    """jax_cluster against the best other contender of each case (tokamax's
    ratios are in the JSON's summary)."""
    rows = [r for r in payload["rows"] if best_other(r) and r.get("jc_ms")]
    labels = [f"{r['config']} {r['routing']}" for r in rows]
    common.plot_pairs(
        path,
        labels,
        [best_other(r) for r in rows],
        [r["jc_ms"] for r in rows],
        baseline_label="best other (tokamax, XLA or torch)",
        ratios=[best_other(r) / r["jc_ms"] for r in rows],
        ylabel="ms per forward + backward (device time)",
        title=f"MoE MLP forward + backward, bf16, {payload['device']}, {payload['tokens']} tokens",
    )


def cases(args):
    configs = SMOKE if args.smoke else CONFIGS
    if args.configs:
        wanted = set(args.configs.split(","))
        configs = [c for c in configs if c.name in wanted]
    routings = args.routings.split(",")
    return [(cfg, routing) for cfg in configs for routing in routings]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_out_argument(parser)
    parser.add_argument("--tokens", type=int, default=TRAINING_TOKENS)
    parser.add_argument("--routings", default=",".join(ROUTINGS))
    parser.add_argument("--configs", default="", help="comma-separated config names (default: all)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--samples", type=int, default=4, help="tokens checked against float32")
    parser.add_argument("--smoke", action="store_true", help="tiny configurations, for any device")
    parser.add_argument("--list", action="store_true", help="print the cases and exit (no GPU)")
    parser.add_argument(
        "--experimental-xla", action="store_true", help="also XLA's experimental ragged-dot paths (XLA_PATHS)"
    )
    parser.add_argument(
        "--resume",
        type=pathlib.Path,
        help="an earlier moe_mlp.json: its cases are kept, not measured again (a long run split over several)",
    )
    parser.add_argument("--fp8", action="store_true", help="also jax_cluster's layer in the blockwise fp8 recipe")
    parser.add_argument(
        "--token-blocks", type=int, default=1, help="also jax_cluster's layer routed in this many blocks of tokens"
    )
    parser.add_argument(
        "--micro-batches",
        type=int,
        default=0,
        help="also jax_cluster's layer (and with --fp8 its fp8 recipe) accumulating this many micro-batches a step",
    )
    parser.add_argument("--xla-only", choices=sorted(XLA_PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--rows-file", type=pathlib.Path, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    tokens = 64 if args.smoke and args.tokens == TRAINING_TOKENS else args.tokens
    todo = cases(args)
    if args.list:
        for cfg, routing in todo:
            sizes = np.bincount(assignment(routing, tokens, cfg.experts, cfg.top_k).reshape(-1), minlength=cfg.experts)
            print(
                f"{cfg.name:<20} D={cfg.features:<5} H={cfg.hidden:<6} E={cfg.experts:<4} k={cfg.top_k} "
                f"{routing:<8} rows={tokens * cfg.top_k} largest group {sizes.max()}, empty {int((sizes == 0).sum())}"
            )
        print(f"{len(todo)} cases, {tokens} tokens each")
        return
    if args.xla_only:  # a child of --experimental-xla: XLA alone, on one path
        setting, name = XLA_PATHS[args.xla_only]
        if setting == "jax_config":
            jax.config.update(name, True)  # an AttributeError if this jax lacks it: the parent records it
        xla = {"xla": (jax.lax.ragged_dot, None)}
        rows = [measure(c, tokens, r, xla, args.iterations, 1, others_too=False) for c, r in todo]
        args.rows_file.write_text(json.dumps(rows))
        return
    kept = earlier_rows(args.resume)
    todo = [(c, r) for c, r in todo if (c.name, r) not in kept]
    rows = list(kept.values())
    out_dir = common.results_dir(args.out)
    why_no_tokamax = bench_ragged.tokamax_problem()
    tokamax = None if why_no_tokamax else bench_ragged.tokamax_ragged_dot(None)
    contenders = {"tokamax": (tokamax, why_no_tokamax), "xla": (jax.lax.ragged_dot, None)}
    for cfg, routing in todo:
        try:
            row = measure(
                cfg,
                tokens,
                routing,
                contenders,
                args.iterations,
                args.samples,
                fp8=args.fp8,
                token_blocks=args.token_blocks,
                micro=args.micro_batches,
            )
        except WrongResult:
            raise
        except Exception as e:  # e.g. a layer too large for this card: recorded, and the run goes on
            row = {"config": cfg.name, "routing": routing, "tokens": tokens, "jc_ms": None}
            row["jc_error"] = bench_ragged.brief(e)
        rows.append(row)
        cells = " ".join(
            f"{k[:-3]} {row[k]:.3f}" if row.get(k) else f"{k[:-3]} -"
            for k in ("jc_ms", "tokamax_ms", "xla_ms", "torch_ms")
        )
        print(f"{cfg.name:<20} {routing:<8} {cells} {row.get('jc_error', '')}", flush=True)
        write(out_dir, tokens, rows)  # after every case: a run cut off keeps what it measured
        release_memory()
    child_argv = [a for a in argv if a not in ("--experimental-xla",)]
    for path in XLA_PATHS if args.experimental_xla else ():
        for r in rows:  # no jax_cluster row to compare with (and likely no room for XLA's either)
            if not r.get("jc_ms") and f"{path}_ms" not in r:
                r[f"{path}_ms"], r[f"{path}_error"] = None, "not run: jax_cluster's layer did not run this case"
        missing = [r for r in rows if f"{path}_ms" not in r]
        if missing:
            names = sorted({r["config"] for r in missing})
            routings = sorted({r["routing"] for r in missing})
            child = [*strip_option(child_argv, "--configs"), "--configs", ",".join(names)]
            child = [*strip_option(child, "--routings"), "--routings", ",".join(routings)]
            merge_experimental(missing, path, experimental_xla(path, strip_option(child, "--resume")))
            write(out_dir, tokens, rows)
        print(f"{path}: " + ", ".join(f"{r['config']} {r['routing']} {r.get(path + '_ms') or '-'}" for r in rows))
    print(json.dumps(summary(rows), indent=1))


def release_memory():
    """Frees what one case leaves behind (compiled layers, torch's cached
    blocks), so the 65536-row cases find room for their temporaries."""
    gc.collect()
    jax.clear_caches()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def earlier_rows(path) -> dict:
    """{(config, routing): row} of an earlier run's JSON: all of its rows are
    kept, whether or not this run's cases include them."""
    if path is None or not path.exists():
        return {}
    return {(r["config"], r["routing"]): r for r in json.loads(path.read_text())["rows"]}


def strip_option(argv, name) -> list[str]:
    """argv without `name` and its value (either `name value` or `name=value`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def write(out_dir, tokens, rows):
    order = {(c.name, r): i for i, (c, r) in enumerate((c, r) for c in CONFIGS + SMOKE for r in ROUTINGS)}
    rows.sort(key=lambda r: order.get((r["config"], r["routing"]), len(order)))
    payload = {
        "device": common.device_name(),
        "jax_version": jax.__version__,
        "commit": common.run_record()["commit"],
        "tokens": tokens,
        "notes": [
            "ms: device time (CUPTI) of forward + backward of MoEMLP.routed (router not included); torch: CUDA events",
            "*_error: why a contender has no time for that case",
        ],
        "summary": summary(rows),
        "rows": rows,
    }
    common.write_results(out_dir, "moe_mlp", payload, plot)


if __name__ == "__main__":
    main()
