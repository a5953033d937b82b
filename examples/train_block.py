"""Trains one small transformer block twice, on jax_cluster's layers and on
Flax's own, from the same initial parameters and data, and compares the
loss curves and step times.

    python examples/train_block.py [--steps 200] [--dtype bfloat16|float32]
                                   [--size small|medium] [--out DIR]

The block: causal attention (plain jnp), a dense MLP (Linear + bias + gelu,
one jax_cluster Linear, which fuses them where its kernel runs) and a
mixture-of-experts MLP (top-2), each behind a LayerNorm and a residual. The
task is synthetic: recall the previous token, x[t-1]. `--size small` (512
tokens, width 64, 4 experts) is launch-bound: it checks the loss curves in
seconds; `medium` (4096 tokens, width 1024, 8 experts of 2816) is a layer
whose GEMMs take the time; `compact` (512 tokens, width 128) is the smallest
that the fp8 recipe takes. `--fp8` trains jax_cluster's side in the
blockwise fp8 recipe (`--fp8 mxfp8`: the MXFP8 one), against Flax's bf16.
`--data-parallel` trains both sides on every device (8 host devices on a
CPU): the batch split across them, the parameters replicated, jax_cluster's
MoE routing each device's tokens on their own (`token_blocks`), so its
grouped products and fp8 quantizations run per device and only the
gradients are all-reduced. Exits non-zero if the two curves differ by more
than the tolerance. --out writes both curves and step times to
DIR/train_block_<dtype>[_<size>][_fp8|_mxfp8][_dp<devices>].json and the
curves to a .png beside it (the PNG needs matplotlib).

Times, in wall milliseconds with the host included: the training step as the
loop runs it (one sync per step, for the loss), the same step dispatched
back to back (one sync per round), and each block alone (attention, dense MLP,
MoE MLP: forward + backward of the block's parameters and input). The last
two alternate between the sides, round by round, and report the median.
"""

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import statistics
import sys
import time

if "--data-parallel" in sys.argv and "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jax_cluster import nn as jcnn  # noqa: E402
from jax_cluster.ops.fp8_training import RECIPES  # noqa: E402
from jax_cluster.tuning.timing import back_to_back_ms, cupti_ms  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Dims:
    vocab: int
    seq: int
    batch: int
    features: int
    heads: int
    hidden: int
    experts: int
    top_k: int


SIZES = {
    "small": Dims(vocab=64, seq=32, batch=16, features=64, heads=4, hidden=128, experts=4, top_k=2),
    "medium": Dims(vocab=1024, seq=512, batch=8, features=1024, heads=8, hidden=2816, experts=8, top_k=2),
    # every width, the tokens and the expert rows in multiples of 128, as the fp8 recipe needs
    "compact": Dims(vocab=128, seq=64, batch=8, features=128, heads=4, hidden=256, experts=4, top_k=2),
}


def products(kind, fp8=None, token_blocks=1):
    """The layer class and products of each side: jax_cluster's (with the fp8
    recipe, or not; the MoE routing `token_blocks` blocks of tokens apart)
    or Flax/XLA's (lax.ragged_dot takes one block)."""
    if kind == "jax_cluster":
        return functools.partial(jcnn.Linear, fp8=fp8), {"fp8": fp8, "token_blocks": token_blocks}
    return nnx.Linear, {"dot_general": lax.dot_general, "ragged_dot": lax.ragged_dot}


class Block(nnx.Module):
    def __init__(self, kind, dims: Dims, dtype, rngs, fp8=None, token_blocks=1):
        linear, moe_products = products(kind, fp8, token_blocks)
        dense = lambda i, o: linear(i, o, dtype=dtype, rngs=rngs)  # noqa: E731
        features, hidden = dims.features, dims.hidden
        self.heads = dims.heads
        self.embed = nnx.Embed(dims.vocab, features, rngs=rngs)
        self.position = nnx.Embed(dims.seq, features, rngs=rngs)
        norm = lambda: nnx.LayerNorm(features, rngs=rngs)  # noqa: E731
        self.norm_attn, self.norm_mlp, self.norm_moe, self.norm_out = norm(), norm(), norm(), norm()
        self.qkv, self.attn_out = dense(features, 3 * features), dense(features, features)
        # jax_cluster's Linear takes the activation: its kernel's epilogue fuses it with the bias
        if kind == "jax_cluster":
            self.mlp_in = linear(features, hidden, activation="gelu", dtype=dtype, rngs=rngs)
            self.mlp_act = lambda h: h
        else:
            self.mlp_in, self.mlp_act = dense(features, hidden), jax.nn.gelu
        self.mlp_out = dense(hidden, features)
        self.moe = jcnn.MoEMLP(features, hidden, dims.experts, dims.top_k, dtype=dtype, rngs=rngs, **moe_products)
        self.head = dense(features, dims.vocab)

    def attention(self, x):
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
        heads = lambda t: t.reshape(*t.shape[:2], self.heads, -1)  # noqa: E731
        scores = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / (x.shape[-1] // self.heads) ** 0.5
        causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
        probs = jax.nn.softmax(jnp.where(causal, scores.astype(jnp.float32), -1e9), axis=-1)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), heads(v))
        return self.attn_out(mixed.reshape(x.shape))

    def dense_mlp(self, x):
        return self.mlp_out(self.mlp_act(self.mlp_in(self.norm_mlp(x))))

    def moe_mlp(self, x):
        return self.moe(self.norm_moe(x))

    def __call__(self, tokens):
        x = self.embed(tokens) + self.position(jnp.arange(tokens.shape[1]))
        x = x + self.attention(self.norm_attn(x))
        x = x + self.dense_mlp(x)
        x = x + self.moe_mlp(x)
        return self.head(self.norm_out(x)).astype(jnp.float32)


BLOCKS = {"attention": lambda m, x: m.attention(m.norm_attn(x)), "dense_mlp": Block.dense_mlp, "moe_mlp": Block.moe_mlp}


def batches(dims: Dims, steps):
    keys = jax.random.split(jax.random.key(42), steps)
    for key in keys:
        tokens = jax.random.randint(key, (dims.batch, dims.seq), 0, dims.vocab)
        yield tokens, jnp.roll(tokens, 1, axis=1)


def training_step(graph, rest, optimizer):
    """The jitted training step of a split Block: (params, opt_state, tokens,
    targets) -> (params, opt_state, loss)."""

    def loss_fn(params, tokens, targets):
        logits = nnx.merge(graph, params, rest)(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    @jax.jit
    def step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def train(kind, dims: Dims, dtype, steps, fp8=None, mesh=None):
    """(losses, seconds per step after the first, final parameters, the
    timing probes: the step and each block as (function, arguments)).
    With a mesh: the batch split over its "data" axis, the rest replicated."""
    devices = 1 if mesh is None else mesh.size
    model = Block(kind, dims, dtype, nnx.Rngs(0), fp8, token_blocks=devices)
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    place = (lambda t, spec: t) if mesh is None else (lambda t, spec: jax.device_put(t, NamedSharding(mesh, spec)))  # noqa: E731
    params = jax.tree.map(lambda t: place(t, P()), params)
    optimizer = optax.adamw(3e-3)
    step = training_step(graph, rest, optimizer)
    opt_state = optimizer.init(params)
    losses, start = [], None
    for i, (tokens, targets) in enumerate(batches(dims, steps)):
        tokens, targets = place(tokens, P("data")), place(targets, P("data"))
        params, opt_state, loss = step(params, opt_state, tokens, targets)
        losses.append(float(loss))  # waits for the step
        if i == 0:
            start = time.perf_counter()  # the first step compiles
    per_step = (time.perf_counter() - start) / max(steps - 1, 1)
    probes = {"step": (step, (params, opt_state, tokens, targets))}
    x = jax.random.normal(jax.random.key(7), (dims.batch, dims.seq, dims.features), jnp.float32).astype(dtype)
    x = place(x, P("data"))
    for name, block in BLOCKS.items():

        def block_loss(params, x, block=block):
            return block(nnx.merge(graph, params, rest), x).astype(jnp.float32).sum()

        probes[name] = (jax.grad(block_loss, argnums=(0, 1)), (params, x))
    return losses, per_step, params, probes


def interleaved_ms(probes_by_side, rounds=5, calls=50):
    """({probe: {side: median span ms}}, {probe: {side: median enqueue ms}})
    of back-to-back calls (timing.back_to_back_ms), the sides alternating
    round by round."""
    names = next(iter(probes_by_side.values()))
    times = {name: {side: [] for side in probes_by_side} for name in names}
    for r in range(rounds):
        sides = list(probes_by_side) if r % 2 == 0 else list(probes_by_side)[::-1]
        for name in times:
            for side in sides:
                fn, args = probes_by_side[side][name]
                times[name][side].append(back_to_back_ms(fn, [args], calls=calls))

    def medians(i):  # i: 0 the enqueue, 1 the span of back_to_back_ms's pair
        return {
            name: {side: statistics.median(p[i] for p in pairs) for side, pairs in by.items()}
            for name, by in times.items()
        }

    return medians(1), medians(0)


def device_ms(probes_by_side, iterations=10):
    """{probe: {side: kernel ms per call}} from CUPTI, or None where it cannot
    time (no GPU): the programs' own cost, free of the host's dispatch."""
    if jax.devices()[0].platform != "gpu":
        return None
    times = {name: {} for name in next(iter(probes_by_side.values()))}
    try:
        for side, probes in probes_by_side.items():
            for name, (fn, args) in probes.items():
                times[name][side] = cupti_ms(fn, [args], iterations)
    except (ImportError, RuntimeError) as e:
        print(f"device time: CUPTI cannot time here ({e})")
        return None
    return times


def curve_difference(ours, theirs):
    """The largest gap between two loss curves, relative to the first loss."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"curves of {len(ours)} and {len(theirs)} steps cannot be compared")
    return max(abs(a - b) for a, b in zip(ours, theirs)) / abs(theirs[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--fp8",
        nargs="?",
        const="blockwise",
        default=None,
        choices=sorted(RECIPES),
        help="jax_cluster's side in this fp8 recipe (default blockwise; sizes compact, medium)",
    )
    parser.add_argument(
        "--tolerance", type=float, default=None, help="max |loss difference| / first loss (default 3e-2 bf16, 1e-4 f32)"
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="directory for train_block_<dtype>.json and .png"
    )
    parser.add_argument(
        "--data-parallel", action="store_true", help="split the batch over every device (8 host devices on a CPU)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--calls", type=int, default=50, help="back-to-back calls in one timing round")
    args = parser.parse_args(argv)
    dtype = jnp.dtype(args.dtype)
    tolerance = args.tolerance
    if tolerance is None:
        # fp8: e4m3 on all three products shifts when the loss falls fastest (on the
        # CPU, 6.9e-2 of the first loss at step 60 of 200; the last 20 steps within 1%)
        tolerance = 1e-1 if args.fp8 else 3e-2 if args.dtype == "bfloat16" else 1e-4

    dims = SIZES[args.size]
    recipe = args.fp8
    auto = (jax.sharding.AxisType.Auto,)  # the sharding propagation, not sharding in types
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=auto) if args.data_parallel else None
    if mesh is not None and dims.batch % mesh.size:
        parser.error(f"--data-parallel: the batch of {dims.batch} does not split over {mesh.size} devices")
    ours, our_time, our_params, our_probes = train("jax_cluster", dims, dtype, args.steps, recipe, mesh)
    theirs, their_time, their_params, their_probes = train("flax", dims, dtype, args.steps, mesh=mesh)
    assert jax.tree.structure(our_params) == jax.tree.structure(their_params)
    probes = {"jax_cluster": our_probes, "flax": their_probes}
    timed, enqueued = interleaved_ms(probes, args.rounds, args.calls)
    device = device_ms(probes)

    side = f", jax_cluster in fp8 ({recipe})" if recipe else ""
    side += f", data parallel over {mesh.size} devices" if mesh is not None else ""
    print(f"{jax.devices()[0].platform}, {args.dtype}{side}, {args.size} block {dims}, {args.steps} steps")
    print(f"{'step':>6} {'jax_cluster':>12} {'flax':>12}")
    for i in range(0, args.steps, max(args.steps // 10, 1)):
        print(f"{i:>6} {ours[i]:>12.5f} {theirs[i]:>12.5f}")
    print(f"{args.steps - 1:>6} {ours[-1]:>12.5f} {theirs[-1]:>12.5f}")
    diff = curve_difference(ours, theirs)
    tail = min(20, len(ours))
    final = abs(sum(ours[-tail:]) - sum(theirs[-tail:])) / abs(sum(theirs[-tail:]))
    print(f"max |loss difference| {diff * theirs[0]:.2e} ({diff:.2e} of the first loss, tolerance {tolerance:.0e})")
    print(f"mean loss of the last {tail} steps: {final:.2%} apart")
    print(f"step time in the loop: jax_cluster {our_time * 1e3:.2f} ms, flax {their_time * 1e3:.2f} ms")
    for name, by_side in timed.items():
        print(
            f"{name} (back to back, median of {args.rounds} interleaved rounds): jax_cluster "
            f"{by_side['jax_cluster']:.3f} ms, flax {by_side['flax']:.3f} ms "
            f"({by_side['flax'] / by_side['jax_cluster']:.2f}x)"
        )
    for name, by_side in enqueued.items():
        print(
            f"{name} (host time to enqueue a call, median of {args.rounds} interleaved rounds): jax_cluster "
            f"{by_side['jax_cluster'] * 1e3:.1f} us, flax {by_side['flax'] * 1e3:.1f} us"
        )
    for name, by_side in (device or {}).items():
        print(
            f"{name} (device time, CUPTI): jax_cluster {by_side['jax_cluster']:.3f} ms, "
            f"flax {by_side['flax']:.3f} ms ({by_side['flax'] / by_side['jax_cluster']:.2f}x)"
        )
    if args.out is not None:
        record = {
            "device": jax.devices()[0].device_kind,
            "platform": jax.devices()[0].platform,
            "dtype": args.dtype,
            "size": args.size,
            "fp8": recipe,
            "data_parallel_devices": mesh.size if mesh is not None else None,
            "dims": dataclasses.asdict(dims),
            "steps": args.steps,
            "loss": {"jax_cluster": ours, "flax": theirs},
            "max_difference_of_first_loss": diff,
            "difference_of_the_last_20_steps": final,  # relative, of their mean losses
            "tolerance": tolerance,
            "step_ms": {"jax_cluster": our_time * 1e3, "flax": their_time * 1e3},
            # step and each block, forward + backward, dispatched back to back
            "timed_ms": timed,
            # the host's share of timed_ms: dispatching the calls, before their sync
            "enqueue_ms": enqueued,
            # the same probes' kernel time per call (CUPTI); null without a GPU
            "device_ms": device,
            "notes": [
                "step_ms: wall time per step after the first in the training loop, which syncs every step",
                f"timed_ms: wall ms per call over {args.calls} back-to-back calls synced once, median of "
                f"{args.rounds} rounds alternating the sides; blocks are forward + backward",
                "enqueue_ms: host ms per call to dispatch the same back-to-back calls, up to their sync",
                "device_ms: median CUPTI kernel time per call over 10 calls, the host's dispatch left out",
            ],
        }
        fp8_suffix = {None: "", "blockwise": "_fp8"}.get(recipe, f"_{recipe}")
        suffix = ("" if args.size == "small" else f"_{args.size}") + fp8_suffix
        suffix += f"_dp{mesh.size}" if mesh is not None else ""
        write_record(args.out, f"train_block_{args.dtype}{suffix}", record)
    return 0 if diff <= tolerance else 1


def write_record(out_dir, stem, record):
    """The run as JSON, and its two loss curves as a PNG when matplotlib is there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(record, indent=1))
    try:
        import matplotlib
    except ImportError:
        print("no plot (matplotlib is not installed)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for side, losses in record["loss"].items():
        steps = record.get("loss_steps", range(len(losses)))
        ax.plot(list(steps), losses, label=f"{side} ({record['step_ms'][side]:.2f} ms/step)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.set_title(
        f"train_block ({record.get('size', 'small')}), {record['dtype']}, {record['device']}: max gap "
        f"{record['max_difference_of_first_loss']:.1e} of the first loss"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
