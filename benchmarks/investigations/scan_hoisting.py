"""Whether XLA hoists the fp8 recipe's weight quantization out of a
gradient-accumulation lax.scan on this device, for the weight-block kernel
and for XLA's own form: where each lands in the optimized HLO, and which
while-loop passes the compiler's pipeline ran (from its pass dump). Beside
them the weights quantized ahead (fp8_weights, before the loop), where the
kernel's call is outside the loop by construction."""

import argparse
import glob
import json
import os
import sys
import tempfile

DUMP = tempfile.mkdtemp(prefix="scan_hoisting_")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP} --xla_dump_hlo_pass_re=while"

import jax  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from helpers import WEIGHT_BLOCK_AMAX, compiled_text, fp8_accumulation_case, in_while_loops  # noqa: E402

from jax_cluster.planning.tables import FFI_TARGETS  # noqa: E402
from jax_cluster.primitives.weight_block_quantize import kernel_default_as  # noqa: E402


def licm_steps(module: str, needle: str) -> list:
    """Each dumped run of the while-loop invariant code motion pass on one
    module: whether the form (`needle`) sat inside a while loop's body
    before it and after it."""
    steps = []
    for before in sorted(glob.glob(f"{DUMP}/{module}.*before_while-loop-invariant-code-motion.txt")):
        index = int(os.path.basename(before).split(".")[2])
        after = glob.glob(f"{DUMP}/{module}.*.{index + 1:04d}.*after_while-loop-invariant-code-motion*.txt")
        inside = lambda path: bool(in_while_loops(open(path).read(), needle))  # noqa: E731
        steps.append(
            {
                "pipeline": os.path.basename(before).split(".")[3],
                "inside_before": inside(before),
                "inside_after": inside(after[0]) if after else None,
            }
        )
    return steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    kernel_call = f'custom_call_target="{FFI_TARGETS["quantize_weight_blocks"]}"'
    report = {"device": jax.devices()[0].device_kind, "jax_version": jax.__version__}
    forms = (("kernel", True, False, kernel_call), ("xla", False, False, WEIGHT_BLOCK_AMAX))
    forms += (("kernel_ahead", True, True, kernel_call),)
    for form, use_kernel, ahead, needle in forms:
        accumulate, _, w, xs = fp8_accumulation_case(ahead)
        with kernel_default_as(use_kernel):
            hlo = compiled_text(jax.jit(accumulate), w, xs)
        report[form] = {"calls": hlo.count(needle), "in_while_loops": in_while_loops(hlo, needle)}
    # the forms compiled one jit_accumulate module each, in order
    modules = sorted({os.path.basename(p).split(".")[0] for p in glob.glob(f"{DUMP}/*.jit_accumulate.*")})
    for (form, _, _, needle), module in zip(forms, modules):
        report[form]["invariant_code_motion"] = licm_steps(module, needle)
    passes = sorted({os.path.basename(p).split(".", 3)[-1] for p in glob.glob(f"{DUMP}/*.txt")})
    report["while_passes_dumped"] = [p for p in passes if "invariant" in p or "while" in p][:40]
    print(json.dumps(report, indent=1))
    with open(os.path.join(args.out, "scan_hoisting.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
