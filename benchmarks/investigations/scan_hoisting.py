"""Whether XLA hoists the fp8 recipe's weight quantization out of a
gradient-accumulation lax.scan on this device, for the weight-block kernel
and for XLA's own form: where each lands in the optimized HLO, and which
while-loop passes the compiler's pipeline ran (from its pass dump)."""

import argparse
import glob
import json
import os
import sys
import tempfile

DUMP = tempfile.mkdtemp(prefix="scan_hoisting_")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP} --xla_dump_hlo_pass_re=while"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from helpers import compiled_text, in_while_loops  # noqa: E402

from jax_cluster.ops.fp8_training import fp8_grouped  # noqa: E402
from jax_cluster.planning.tables import FFI_TARGETS  # noqa: E402
from jax_cluster.primitives.weight_block_quantize import kernel_default_as  # noqa: E402


def accumulate(w, xs, sizes):
    def weight_gradient(x):
        loss = lambda w: jnp.sum(fp8_grouped(x, w, sizes).astype(jnp.float32) ** 2)  # noqa: E731
        return jax.grad(loss)(w).astype(jnp.float32)

    return jax.lax.scan(lambda total, x: (total + weight_gradient(x), None), jnp.zeros(w.shape, jnp.float32), xs)[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    w = (jax.random.normal(jax.random.key(3), (4, 256, 384)) * 0.05).astype(jnp.bfloat16)
    xs = jax.random.normal(jax.random.key(4), (3, 512, 256), jnp.bfloat16)
    sizes = jnp.asarray([128, 200, 0, 184], jnp.int32)
    # XLA's form: the blocks' amax, a reduction over the two in-block axes of [G, K/128, 128, N/128, 128]
    kernel_call = f'custom_call_target="{FFI_TARGETS["quantize_weight_blocks"]}"'
    needles = {"kernel": kernel_call, "xla": "dimensions={2,4}, to_apply"}
    report = {"device": jax.devices()[0].device_kind, "jax_version": jax.__version__}
    for form, use_kernel in (("kernel", True), ("xla", False)):
        with kernel_default_as(use_kernel):
            hlo = compiled_text(jax.jit(accumulate), w, xs, sizes)
        report[form] = {"calls": hlo.count(needles[form]), "in_while_loops": in_while_loops(hlo, needles[form])}
    passes = sorted({os.path.basename(p).split(".", 3)[-1] for p in glob.glob(f"{DUMP}/*.txt")})
    report["while_passes_dumped"] = [p for p in passes if "invariant" in p or "while" in p][:40]
    print(json.dumps(report, indent=1))
    with open(os.path.join(args.out, "scan_hoisting.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
