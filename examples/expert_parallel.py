"""Expert parallelism with shard_map: each device holds E/D experts and a
shard of the tokens; tokens travel to their experts' devices by all_to_all,
run there as one grouped GEMM, and travel back.

    python examples/expert_parallel.py [--dtype bfloat16]

On a CPU it makes 8 host devices; on a GPU machine it uses every GPU.

Every device sends each peer a fixed-capacity block of rows sorted by expert,
so a device receives D blocks, block s holding rows from device s for its
local experts: exactly the [S, G] block group sizes of `jax_cluster.ragged_dot`.
`--dispatch gather` instead gathers every token on every device, runs all rows
against the local experts with `group_offset` (other experts' rows come out
zero) and reduce-scatters the sum back: no all_to_all, more rows per device.
Exits non-zero if the result differs from a dense reference (bf16 inputs,
which the grouped kernels take on an H200, are checked to 2e-2).
"""

import argparse
import os
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_cluster  # noqa: E402

AXIS = "expert"


def top_k_routing(x, router, top_k):
    logits = jnp.matmul(x, router, precision="highest")
    experts = jnp.argsort(-logits, axis=-1, stable=True)[:, :top_k]
    weights = jax.nn.softmax(jnp.take_along_axis(logits, experts, -1), axis=-1)
    return experts, weights


def expert_parallel_mlp(x, router, w_in, w_out, *, top_k):
    """Per device: x [T, D] local tokens; w_in [E_local, D, H], w_out [E_local, H, D]."""
    devices, local_experts = lax.axis_size(AXIS), w_in.shape[0]
    tokens, features = x.shape
    experts, weights = top_k_routing(x, router, top_k)
    flat = experts.reshape(-1)  # [T*k] (token, slot)
    order = jnp.argsort(flat, stable=True)  # by expert, so by device
    sizes = jnp.bincount(flat, length=devices * local_experts).astype(jnp.int32)
    sizes = sizes.reshape(devices, local_experts)  # rows for each peer's experts
    per_peer = sizes.sum(1)
    starts = jnp.cumsum(per_peer) - per_peer
    capacity = tokens * top_k  # no row is ever dropped
    slot = jnp.arange(capacity)
    pick = jnp.clip(starts[:, None] + slot, 0, capacity - 1)  # [devices, capacity]
    valid = slot[None, :] < per_peer[:, None]
    send = jnp.where(valid[..., None], x[order[pick] // top_k], 0)

    recv = lax.all_to_all(send, AXIS, 0, 0)  # recv[s]: rows from device s
    recv_sizes = lax.all_to_all(sizes, AXIS, 0, 0)  # [S=devices, G=local experts]
    rows = recv.reshape(devices * capacity, features)
    hidden = jax.nn.gelu(jax_cluster.ragged_dot(rows, w_in, recv_sizes))
    out = jax_cluster.ragged_dot(hidden, w_out, recv_sizes).reshape(devices, capacity, features)
    back = lax.all_to_all(out, AXIS, 0, 0)  # back[d]: my rows, done on d

    peer = jnp.repeat(jnp.arange(devices), per_peer, total_repeat_length=capacity)
    by_sorted = back[peer, jnp.arange(capacity) - starts[peer]]
    by_slot = by_sorted[jnp.argsort(order)].reshape(tokens, top_k, features)
    return (by_slot * weights[..., None]).sum(1)


def gathered_mlp(x, router, w_in, w_out, *, top_k):
    """Per device: every token, sorted by global expert; the local experts from
    group_offset = device index x local experts; the partial sums reduce-scattered."""
    local_experts = w_in.shape[0]
    everyone = lax.all_gather(x, AXIS, tiled=True)  # [T_all, D]
    experts, weights = top_k_routing(everyone, router, top_k)
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=router.shape[1]).astype(jnp.int32)  # all experts' rows
    offset = lax.axis_index(AXIS) * local_experts
    rows = everyone[order // top_k]
    hidden = jax.nn.gelu(jax_cluster.ragged_dot(rows, w_in, sizes, group_offset=offset))
    out = jax_cluster.ragged_dot(hidden, w_out, sizes, group_offset=offset)  # zero off my experts
    by_slot = out[jnp.argsort(order)].reshape(everyone.shape[0], top_k, -1)
    partial = (by_slot * weights[..., None]).sum(1)
    return lax.psum_scatter(partial, AXIS, scatter_dimension=0, tiled=True)


def dense_reference(x, router, w_in, w_out, top_k):
    """Every expert on every token, weighted by the same routing, in fp32."""
    x, router, w_in, w_out = (t.astype(jnp.float32) for t in (x, router, w_in, w_out))
    experts, weights = top_k_routing(x, router, top_k)
    hidden = jax.nn.gelu(jnp.einsum("td,edh->teh", x, w_in, precision="highest"))
    every = jnp.einsum("teh,ehd->ted", hidden, w_out, precision="highest")
    chosen = jnp.take_along_axis(every, experts[..., None], axis=1)
    return (chosen * weights[..., None]).sum(1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--dispatch", choices=["all_to_all", "gather"], default="all_to_all")
    args = parser.parse_args(argv)
    dtype = jnp.dtype(args.dtype)
    mlp = expert_parallel_mlp if args.dispatch == "all_to_all" else gathered_mlp
    devices = jax.device_count()
    mesh = jax.make_mesh((devices,), (AXIS,), axis_types=(AxisType.Auto,))
    experts, top_k, features, hidden, tokens = 2 * devices, 2, 64, 128, 32 * devices
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (tokens, features))
    router = jax.random.normal(keys[1], (features, experts))
    w_in = jax.random.normal(keys[2], (experts, features, hidden)) / features**0.5
    w_out = jax.random.normal(keys[3], (experts, hidden, features)) / hidden**0.5
    x, w_in, w_out = (t.astype(dtype) for t in (x, w_in, w_out))

    layer = jax.jit(
        jax.shard_map(
            lambda *a: mlp(*a, top_k=top_k),
            mesh=mesh,
            in_specs=(P(AXIS), P(), P(AXIS), P(AXIS)),
            out_specs=P(AXIS),
            check_vma=False,
        )
    )
    y = layer(x, router, w_in, w_out)
    ref = dense_reference(x, router, w_in, w_out, top_k)
    err = float(jnp.abs(y.astype(jnp.float32) - ref).max() / jnp.abs(ref).max())
    print(
        f"{args.dispatch}: {devices} devices x {experts // devices} experts, {tokens} tokens, top-{top_k}, "
        f"{dtype.name}: max relative difference to the dense reference {err:.2e}"
    )
    return 0 if err < (1e-4 if dtype == jnp.float32 else 2e-2) else 1


if __name__ == "__main__":
    sys.exit(main())
