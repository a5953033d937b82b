"""The menu of compiled kernel variants, read from ``variants.json``.

The build (``cc/gen_variants.py``) and the planner both read this module, so it
must not import jax: it runs at build time too.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

MENU_PATH = pathlib.Path(__file__).with_name("variants.json")

# Which schedules each kernel kind can run; the Plan's schedule must be one.
SCHEDULES_BY_KIND = {
    "cooperative": ("static", "stream_k", "split_k"),
    "cooperative_dynamic": ("dynamic",),
    "grouped_dynamic": ("dynamic",),
    "pingpong": ("static",),
    "2sm_clc": ("clc",),
    "2sm_grouped_clc": ("clc",),
    "1sm_clc": ("clc",),
    "2sm_static": ("static",),
    "1sm_static": ("static",),
}
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}
# dense: D = A·B (batched). ragged_m: rows of A and D split into groups, B[g]
# per group (ragged_dot forward, d_lhs). ragged_k: the contraction split into
# groups, D[g] per group (ragged_dot's d_rhs).
PROBLEMS = ("dense", "ragged_m", "ragged_k")
# none: D = A·B. bias_act: D = act(alpha*A·B + beta*C + bias[n]), the
# activation chosen at run time (dense rows only).
EPILOGUES = ("none", "bias_act")


@dataclasses.dataclass(frozen=True)
class Variant:
    family: str
    arch: str
    kind: str
    tile_m: int
    tile_n: int
    tile_k: int
    cluster_m: int
    cluster_n: int
    stages: int
    dtype: str
    out: str
    a_major: str
    b_major: str
    header: str
    problem: str = "dense"
    epilogue: str = "none"
    # The kernel runs D^T = B^T·A^T: M lands on the MMA's N side, which can be
    # 32 or 64 rows, where a cooperative M tile is 128 (small-M, memory-bound rows).
    # The tile stays in the caller's terms (tile_m rows of M).
    swap_ab: bool = False

    @property
    def mma(self) -> str:
        return "2cta" if self.kind.startswith("2sm") else "1cta"

    @property
    def schedules(self) -> tuple[str, ...]:
        return SCHEDULES_BY_KIND[self.kind]

    @property
    def pads_swizzle(self) -> bool:
        """CUTLASS's schedulers round the tile grid up to swizzle x cluster and run
        the padded tiles; the sm90 work queue's banded walk does not
        (cc/common/cluster_tile_order.h)."""
        return self.kind != "cooperative_dynamic"

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n

    @property
    def cta_tile_m(self) -> int:
        """Rows of the output one CTA owns (a 2-CTA MMA splits M over the pair)."""
        return self.tile_m // 2 if self.mma == "2cta" else self.tile_m

    @property
    def name(self) -> str:
        problem = "" if self.problem == "dense" else f"{self.problem}_"
        epilogue = "" if self.epilogue == "none" else f"_{self.epilogue}"
        swap = "_swapab" if self.swap_ab else ""
        return (f"{self.family}_{problem}{self.dtype}_{self.out}_{self.a_major}{self.b_major}_"
                f"{self.tile_m}x{self.tile_n}x{self.tile_k}_c{self.cluster_m}x{self.cluster_n}_"
                f"s{self.stages}_{self.kind}{epilogue}{swap}")


def _check(row: dict, family: dict) -> None:
    if row["kind"] not in SCHEDULES_BY_KIND:
        raise ValueError(f"variants.json: unknown kind {row['kind']!r}")
    if row["dtype"] not in ("bf16", "f16") or row["out"] not in DTYPE_BYTES:
        raise ValueError(f"variants.json: unsupported dtypes in {row}")
    if row["a_major"] not in "km" or row["b_major"] not in "kn":
        raise ValueError(f"variants.json: bad operand majors in {row}")
    if row.get("problem", "dense") not in PROBLEMS:
        raise ValueError(f"variants.json: unknown problem {row['problem']!r}")
    if row.get("epilogue", "none") not in EPILOGUES:
        raise ValueError(f"variants.json: unknown epilogue {row['epilogue']!r}")
    if row.get("epilogue", "none") != "none" and row.get("problem", "dense") != "dense":
        raise ValueError(f"variants.json: a fused epilogue needs a dense row: {row}")
    if row.get("swap_ab", False) and (
            family["arch"] != "sm90a" or row["kind"] != "cooperative"
            or row.get("problem", "dense") != "dense" or row.get("epilogue", "none") != "none"):
        raise ValueError(f"variants.json: swap_ab needs a plain dense sm90a cooperative row: {row}")
    if family["arch"] not in ("sm90a", "sm100a"):
        raise ValueError(f"variants.json: unknown arch {family['arch']!r}")


@functools.cache
def load_menu(path: pathlib.Path = MENU_PATH) -> tuple[Variant, ...]:
    menu = json.loads(path.read_text())
    out = []
    for row in menu["variants"]:
        family = menu["families"][row["family"]]
        _check(row, family)
        tm, tn, tk = row["tile"]
        cm, cn = row["cluster"]
        out.append(Variant(row["family"], family["arch"], row["kind"], tm, tn, tk, cm, cn,
                           row["stages"], row["dtype"], row["out"], row["a_major"],
                           row["b_major"], family["header"], row.get("problem", "dense"),
                           row.get("epilogue", "none"), bool(row.get("swap_ab", False))))
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise ValueError("variants.json: two rows give the same variant")
    return tuple(out)
