"""jax_cluster: cluster-persistent GEMM kernels for JAX on Hopper and Blackwell.

`matmul` and `dot_general` run CUTLASS-based sm90a/sm100f kernels through XLA
FFI when the planner picks one, and XLA's own dot everywhere else.
`ragged_dot` is the grouped GEMM (jax.lax.ragged_dot's semantics), and
`gated_ragged_dot` the gated one (act(x @ gate) * (x @ up) per group, the
gate in its epilogue);
`quantize` / `dequantize` make and read block-scaled fp8 operands (qwix
QArrays) that the three ops take, `quantize_weight` a weight in both layouts;
`linear` is a dense layer's act(x @ W + residual + b) with the epilogue fused
into the GEMM. `plan` / `plan_ragged` return the static choices a call makes,
and `Plan.explain()` says why. `autotune` times the candidate plans on the
present GPU and caches the winners; `use_autotune_cache(True)` makes calls
read them. `jax_cluster.nn` (imported on its own; needs flax) has the Flax layers,
and `checkpoint_policies` remat policies that save jax_cluster's products
as JAX's save dot_general.

The package is laid out by layer: ops/ -> primitives/ -> planning/, with
tuning/ beside the ops and tools/ on top (docs/architecture.md).
"""

from jax_cluster import _ffi, checkpoint_policies
from jax_cluster.info import info
from jax_cluster.ops.dense import dot_general, matmul, plan
from jax_cluster.ops.gated import gated_ragged_dot, interleave_gate_up, split_gate_up_blocks
from jax_cluster.ops.linear import linear
from jax_cluster.ops.quantize import dequantize, quantize, quantize_weight
from jax_cluster.ops.ragged_dot import ragged_dot
from jax_cluster.planning.autotune_cache import use_autotune_cache
from jax_cluster.planning.device import DeviceInfo
from jax_cluster.planning.grouped import plan_ragged
from jax_cluster.planning.plan import Plan
from jax_cluster.primitives.epilogue import gemm_epilogue_p
from jax_cluster.primitives.gated import gated_ragged_p
from jax_cluster.primitives.gemm import gemm_p
from jax_cluster.primitives.ragged import ragged_dot_p
from jax_cluster.tuning.autotuner import autotune
from jax_cluster.version import VERSION

__all__ = [
    "DeviceInfo",
    "Plan",
    "autotune",
    "checkpoint_policies",
    "dequantize",
    "dot_general",
    "gated_ragged_dot",
    "gated_ragged_p",
    "gemm_epilogue_p",
    "gemm_p",
    "info",
    "interleave_gate_up",
    "linear",
    "matmul",
    "plan",
    "plan_ragged",
    "quantize",
    "quantize_weight",
    "ragged_dot",
    "ragged_dot_p",
    "split_gate_up_blocks",
    "use_autotune_cache",
]

__version__ = VERSION

_ffi.warn_if_no_kernels()
