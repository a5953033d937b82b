"""What a call asks of a kernel, and the one check that a plan fits it.

Every op, binder and partition rule asks `fits(plan, call)` before it runs a
plan: the plan must have been made for exactly the problem, sizes, layouts,
dtypes and epilogue the kernel will see, since the kernel obeys each of them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Call:
    problem: str  # "dense", "ragged_m" or "ragged_k"
    m: int  # for a grouped problem, its GEMM view (planning/grouped.py)
    n: int
    k: int
    count: int  # the batch of a dense call, the group count of a grouped one
    a_major: str
    b_major: str
    dtype: str
    out_dtype: str
    epilogue: str = "none"

    def describe(self) -> str:
        count = f"batch={self.count}" if self.problem == "dense" else f"G={self.count}"
        epilogue = "" if self.epilogue == "none" else f" epilogue {self.epilogue!r}"
        return (
            f"{self.problem} M={self.m} N={self.n} K={self.k} {count} A {self.a_major}-major "
            f"B {self.b_major}-major {self.dtype}->{self.out_dtype}{epilogue}"
        )


def fits(plan, call: Call) -> str:
    """ "" when `plan` was made for `call`; otherwise what differs, in one sentence."""
    made = plan.call
    if made == call:
        return ""
    return f"the plan was made for {made.describe()}, but this call is {call.describe()}"
