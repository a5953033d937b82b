"""jax_cluster: cluster-persistent GEMM kernels for JAX on Hopper and Blackwell.

`matmul` and `dot_general` run CUTLASS-based sm90a/sm100a kernels through XLA
FFI when the planner picks one, and XLA's own dot everywhere else.
"""
from jax_cluster import _ffi
from jax_cluster.api import dot_general, matmul
from jax_cluster.device import DeviceInfo
from jax_cluster.info import info
from jax_cluster.plan import Plan, plan
from jax_cluster.primitives import gemm_p

__all__ = ["DeviceInfo", "Plan", "dot_general", "gemm_p", "info", "matmul", "plan"]
__version__ = "0.1.0"

_ffi.warn_if_no_kernels()
