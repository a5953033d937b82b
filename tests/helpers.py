"""Reference checks shared by the CPU and GPU tests."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_cluster.primitives.activations import activation_fn

_key = [jax.random.key(int.from_bytes(np.random.bytes(4), "little"))]


def fresh_key():
    """A new key per call; the seed is random, so every run draws new inputs."""
    _key[0], sub = jax.random.split(_key[0])
    return sub


def randn(shape, dtype):
    return jax.random.normal(fresh_key(), shape, jnp.float32).astype(dtype)


def put(mesh, x, spec):
    """x placed on `mesh` with PartitionSpec `spec`."""
    return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))


def rerun_on_8_host_devices(path: str) -> None:
    """Runs the test file `path` in a subprocess on 8 CPU devices (the host
    device count is fixed when jax starts) and fails with its output if it fails."""
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=8 " + os.environ.get("XLA_FLAGS", ""),
        JAX_PLATFORMS="cpu",
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" in run.stdout  # the launcher itself skips


def check_kernel_default_by_arch(kernel_by_default, monkeypatch) -> None:
    """A quantization kernel's kernel_by_default holds on the compute
    capabilities the extension's archs run (9.0 by sm_90a, 10.0 and 10.3 by
    sm_100f) and nowhere else, nor on a build that lacks the arch. Leaves
    the build described as having both archs."""
    from jax_cluster import _ffi
    from jax_cluster.planning.device import DeviceInfo

    monkeypatch.setattr(_ffi, "built_archs", lambda: ("sm90a", "sm100f"))
    for cc, runs in (((9, 0), True), ((10, 0), True), ((10, 3), True), ((8, 0), False), ((12, 0), False)):
        assert kernel_by_default(DeviceInfo("cuda", compute_capability=cc)) is runs, cc
    assert not kernel_by_default(DeviceInfo("cpu"))
    monkeypatch.setattr(_ffi, "built_archs", lambda: ("sm90a",))  # a build for the H100/H200 only
    assert not kernel_by_default(DeviceInfo("cuda", compute_capability=(10, 0)))
    monkeypatch.setattr(_ffi, "built_archs", lambda: ("sm90a", "sm100f"))


def compiled_text(f, *args) -> str:
    """The optimised HLO of jitted `f`, where the partitioner's collectives show."""
    return f.lower(*args).compile().as_text()


def in_while_loops(hlo: str, needle: str) -> list[str]:
    """The computations of an optimized HLO module that its while loops run
    (bodies, conditions and all they call) whose text holds `needle`."""
    blocks = {}
    for block in hlo.split("\n\n"):
        head = block.strip().split("\n", 1)[0]
        blocks[head.removeprefix("ENTRY ").split(" ", 1)[0]] = block
    callees = re.compile(r"(?:calls|to_apply|body|condition)=(%[\w.\-]+)")
    todo = [m for block in blocks.values() for m in re.findall(r"(?:body|condition)=(%[\w.\-]+)", block)]
    seen = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(callees.findall(blocks.get(name, "")))
    return sorted(name for name in seen if needle in blocks.get(name, ""))


# XLA's form of the weight-block quantization: the blocks' amax, a reduction
# over the two in-block axes of w as [G, K/128, 128, N/128, 128]
WEIGHT_BLOCK_AMAX = "dimensions={2,4}, to_apply"


def fp8_accumulation_case(ahead: bool = False):
    """A gradient-accumulation step of the fp8 grouped recipe, three
    micro-batches in a lax.scan over one set of weights: (accumulate,
    weight_gradient, w, xs), accumulate(w, xs) summing weight_gradient(x, w).
    With `ahead` the step quantizes the weights once, before the loop
    (fp8_weights), and every micro-batch reads that; weight_gradient always
    quantizes its own."""
    from jax_cluster.ops.fp8_training import fp8_grouped, fp8_weights

    w = (jax.random.normal(jax.random.key(3), (4, 256, 384)) * 0.05).astype(jnp.bfloat16)
    xs = jax.random.normal(jax.random.key(4), (3, 512, 256), jnp.bfloat16)
    sizes = jnp.asarray([128, 200, 0, 184], jnp.int32)

    def weight_gradient(x, w, weights=None):
        def loss(w):
            y = fp8_grouped(x, w, sizes, "blockwise", jnp.float8_e4m3fn, None, weights)
            return jnp.sum(y.astype(jnp.float32) ** 2)

        return jax.grad(loss)(w).astype(jnp.float32)

    def accumulate(w, xs):
        weights = fp8_weights(w) if ahead else None
        step = lambda total, x: (total + weight_gradient(x, w, weights), None)  # noqa: E731
        return jax.lax.scan(step, jnp.zeros(w.shape, jnp.float32), xs)[0]

    return accumulate, weight_gradient, w, xs


def rel_error(out, ref) -> float:
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    ref = np.asarray(jnp.asarray(ref, jnp.float32), np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.isfinite(out).all(), "non-finite output: an element was not written"
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def tolerance(out_dtype) -> float:
    """Relative-norm bound: the output's rounding dominates (inputs are exact
    in the reference, and accumulation is fp32)."""
    return max(float(jnp.finfo(out_dtype).eps), 1e-4)


def reference(a, b, a_major="k", b_major="n"):
    """float64 product on the host, from the operands as stored."""
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    if a_major == "m":
        a = np.swapaxes(a, -1, -2)
    if b_major == "k":
        b = np.swapaxes(b, -1, -2)
    return a @ b


def group_bounds(sizes, rows):
    """[lo, hi) rows of each group under the documented rule: a negative size
    counts as 0 and groups are cut at `rows`."""
    bounds, start = [], 0
    for size in np.asarray(sizes).tolist():
        size = max(int(size), 0)
        bounds.append((min(start, rows), min(start + size, rows)))
        start += size
    return bounds


def _f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def ragged_reference(lhs, rhs, sizes, rhs_layout="gkn"):
    """float64 ragged_dot on the host: rows of group g times rhs[g], the rest zero."""
    lhs, rhs = _f64(lhs), _f64(rhs)
    if rhs_layout == "gnk":
        rhs = np.swapaxes(rhs, 1, 2)
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    for g, (lo, hi) in enumerate(group_bounds(sizes, lhs.shape[0])):
        out[lo:hi] = lhs[lo:hi] @ rhs[g]
    return out


def ragged_k_reference(a, b, sizes):
    """float64 out[g] = a[rows of g]^T b[rows of g] (ragged_dot's d_rhs)."""
    a, b = _f64(a), _f64(b)
    bounds = group_bounds(sizes, a.shape[0])
    return np.stack([a[lo:hi].T @ b[lo:hi] for lo, hi in bounds]) if bounds else np.zeros((0, a.shape[1], b.shape[1]))


def linear_reference(x, w, bias=None, residual=None, *, activation="none", alpha=1.0, beta=None, layout="kn"):
    """jax_cluster.linear in float32 from the operands as given."""
    f32 = lambda t: None if t is None else jnp.asarray(t, jnp.float32)  # noqa: E731
    x, w, bias, residual = f32(x), f32(w), f32(bias), f32(residual)
    w = w if layout == "kn" else w.T
    z = alpha * jnp.einsum("...k,kn->...n", x, w, precision=jax.lax.Precision.HIGHEST)
    if residual is not None:
        z = z + (1.0 if beta is None else beta) * residual
    if bias is not None:
        z = z + bias
    return activation_fn(activation)(z)
