"""jax_cluster: cluster-persistent GEMM kernels for JAX on Hopper and Blackwell.

`matmul` and `dot_general` run CUTLASS-based sm90a/sm100a kernels through XLA
FFI when the planner picks one, and XLA's own dot everywhere else.
`autotune` times the candidate plans on the present GPU and caches the
winners; `use_autotune_cache(True)` makes the planner read them.
`ragged_dot` is the grouped GEMM (jax.lax.ragged_dot's semantics) on grouped kernels.
`linear` is a dense layer's act(x @ W + residual + b) with the epilogue fused into the GEMM.
matmul, dot_general and ragged_dot partition under jit over a mesh (partition_gemm.py,
partition_ragged.py); linear does not yet.
`jax_cluster.nn` (imported on its own; needs flax) has the Flax layers.
"""
from jax_cluster import _ffi
from jax_cluster.api import dot_general, matmul
from jax_cluster.device import DeviceInfo
from jax_cluster.epilogue_primitives import gemm_epilogue_p
from jax_cluster.info import info
from jax_cluster.linear import linear
from jax_cluster.plan import Plan, plan
from jax_cluster.primitives import gemm_p
from jax_cluster.ragged import ragged_dot
from jax_cluster.ragged_plan import plan_ragged
from jax_cluster.ragged_primitives import ragged_dot_p
from jax_cluster.tuning import autotune
from jax_cluster.tuning_cache import use_autotune_cache

__all__ = ["DeviceInfo", "Plan", "autotune", "dot_general", "gemm_epilogue_p", "gemm_p", "info",
           "linear", "matmul", "plan", "plan_ragged", "ragged_dot", "ragged_dot_p",
           "use_autotune_cache"]
__version__ = "0.1.0"

_ffi.warn_if_no_kernels()
