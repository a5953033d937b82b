"""The Plan: every static choice one GEMM call makes.

Its kernel fields come from the contract table (planning/contract.json), which
also generates the C++ struct the FFI handler decodes, so the two sides share
one list of names. The other fields say which call the plan was made for and
why it was chosen (provenance); they never reach C++.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jax_cluster.planning import tables
from jax_cluster.planning.call import Call
from jax_cluster.planning.device import DeviceInfo

KERNEL_FIELDS = tuple(name for name, _ in tables.PLAN_FIELDS)

# The kernel fields as a dataclass generated from the table; Plan adds the rest.
KernelFields = dataclasses.make_dataclass(
    "KernelFields",
    [
        (name, int if kind == "int" else str, dataclasses.field(default=tables.PLAN_FIELD_DEFAULTS[name]))
        for name, kind in tables.PLAN_FIELDS
    ],
    frozen=True,
    kw_only=True,
)
KernelFields.__doc__ = "The Plan's kernel fields, as the C++ struct attribute (common/contract.h) has them."

# numpy's dtype -> the contract's first name for it (float8_e4m3fn is "e4m3";
# "mxe4m3", the same values with MX scales, is named by the ops that mean it)
_DTYPE_NAMES: dict = {}
for _name, _numpy_name in tables.NUMPY_DTYPES.items():
    _DTYPE_NAMES.setdefault(np.dtype(jnp.dtype(_numpy_name)), _name)


def dtype_name(dtype) -> str:
    """The contract's name of a dtype ("bf16", "f16", "f32"), else numpy's."""
    if isinstance(dtype, str) and dtype in tables.DTYPE_BYTES:
        return dtype
    dt = np.dtype(dtype)
    return _DTYPE_NAMES.get(dt, dt.name)


# mypy cannot see the fields of a base made at run time, hence the ignore below.
@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan(KernelFields):  # type: ignore[misc, valid-type]
    # the call it was made for
    m: int
    n: int
    k: int
    batch: int
    dtype: str
    out_dtype: str
    a_major: str  # "k": A is [M,K]; "m": A is [K,M]
    b_major: str  # "k": B is [N,K]; "n": B is [K,N]
    # "ragged_m" / "ragged_k" for a grouped GEMM (plan_ragged); m, n, k are then its GEMM view
    problem: str = "dense"
    groups: int = 0
    # "bias_act": the kernel also applies act(alpha*A·B + beta*C + bias) (jax_cluster.linear)
    epilogue: str = "none"
    # provenance: what was decided, on what, and why
    path: str  # "kernel" or "xla"
    reason: str  # why this path, in one sentence
    device: DeviceInfo
    residency: str = "modelled"  # "queried" (cudaOccupancyMaxActiveClusters) or "modelled"
    workspace_bytes: int = 0
    waves: float = 0.0
    predicted_efficiency: float = 0.0
    notes: tuple[str, ...] = ()
    # the chosen candidate's modelled HBM time exceeds its compute makespan
    memory_bound: bool = False
    # the variant's kernel kind (contract.json "kinds"), and whether it computes
    # D^T = B^T·A^T (a swap-AB menu row)
    kind: str = ""
    swap_ab: bool = False

    @property
    def uses_kernel(self) -> bool:
        return self.path == "kernel"

    @property
    def call(self) -> Call:
        """The call this plan was made for (see `planning.call.fits`)."""
        count = self.groups if self.problem != "dense" else self.batch
        return Call(
            self.problem,
            self.m,
            self.n,
            self.k,
            count,
            self.a_major,
            self.b_major,
            self.dtype,
            self.out_dtype,
            self.epilogue,
        )

    def ffi_attrs(self) -> dict:
        """The kernel fields, as the FFI handler's "plan" struct attribute."""
        out = {}
        for name in KERNEL_FIELDS:
            value = getattr(self, name)
            out[name] = np.int64(value) if isinstance(value, int) else value
        return out

    def explain(self) -> str:
        from jax_cluster.planning.explain import explain  # explain reads plans; plans print through it

        return explain(self)

    def _repr_pretty_(self, printer, cycle):  # IPython / notebooks
        printer.text(self.explain())
