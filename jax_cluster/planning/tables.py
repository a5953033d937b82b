"""The tables Python and C++ share: the contract (contract.json) and the menu
of compiled variants (variants.json).

Standard library only: the build loads this file by path (cc/gen_contract.py,
cc/gen_variants.py) to generate the C++ side of both tables.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

CONTRACT_PATH = pathlib.Path(__file__).with_name("contract.json")
MENU_PATH = pathlib.Path(__file__).with_name("variants.json")

_CONTRACT = json.loads(CONTRACT_PATH.read_text())

# The Plan's kernel fields, in the order of the C++ struct: (name, "int" | "str").
PLAN_FIELDS: tuple[tuple[str, str], ...] = tuple(tuple(f) for f in _CONTRACT["plan_fields"])
# What a plan that runs no kernel holds in them (Python only; C++ always gets all).
PLAN_FIELD_DEFAULTS: dict[str, int | str] = {
    name: _CONTRACT["plan_field_defaults"].get(name, 0 if kind == "int" else "") for name, kind in PLAN_FIELDS
}
SCHEDULES: tuple[str, ...] = tuple(_CONTRACT["schedules"])
RASTERS: tuple[str, ...] = tuple(_CONTRACT["rasters"])
SWIZZLES: tuple[int, ...] = tuple(_CONTRACT["swizzles"])
# The kernel's activation codes are positions in this list.
ACTIVATIONS: dict[str, int] = {name: i for i, name in enumerate(_CONTRACT["activations"])}
# dense: D = A·B (batched). ragged_m: rows of A and D split into groups, B[g]
# per group (ragged_dot forward, d_lhs). ragged_k: the contraction split into
# groups, D[g] per group (ragged_dot's d_rhs).
PROBLEMS: tuple[str, ...] = tuple(_CONTRACT["problems"])
# none: D = A·B. bias_act: D = act(alpha*A·B + beta*C + bias[n]), the
# activation chosen at run time (dense rows only).
EPILOGUES: tuple[str, ...] = tuple(_CONTRACT["epilogues"])
DTYPE_BYTES: dict[str, int] = {name: d["bytes"] for name, d in _CONTRACT["dtypes"].items()}
# The contract's dtype names and numpy's (bfloat16 is ml_dtypes', which jax registers).
NUMPY_DTYPES: dict[str, str] = {name: d["numpy"] for name, d in _CONTRACT["dtypes"].items()}
INPUT_DTYPES: tuple[str, ...] = tuple(n for n, d in _CONTRACT["dtypes"].items() if d["input"])
CUTLASS_TYPES: dict[str, str] = {name: d["cutlass"] for name, d in _CONTRACT["dtypes"].items()}
# What the kernels write from each input dtype.
OUTPUT_DTYPES: dict[str, tuple[str, ...]] = {n: tuple(d.get("outputs", ())) for n, d in _CONTRACT["dtypes"].items()}
# fp8 inputs carry block scales and run on the scaled-GEMM target only.
BLOCK_SCALED_DTYPES: tuple[str, ...] = tuple(n for n, d in _CONTRACT["dtypes"].items() if d.get("block_scaled"))
# Each block-scaled dtype's scale block (values per scale along K) and the
# numpy and FFI dtypes of its scales.
SCALE_BLOCKS: dict[str, int] = {n: _CONTRACT["dtypes"][n]["scale_block"] for n in BLOCK_SCALED_DTYPES}
SCALE_NUMPY_DTYPES: dict[str, str] = {n: _CONTRACT["dtypes"][n]["scale_numpy"] for n in BLOCK_SCALED_DTYPES}
# e4m3 (DeepSeek-V3's recipe): A in 1 x SCALE_BLOCK tiles along K, B in
# SCALE_BLOCK x SCALE_BLOCK blocks, float32 scales.
SCALE_BLOCK = SCALE_BLOCKS["e4m3"]
# mxe4m3 (MXFP8): A and B in 1 x MX_SCALE_BLOCK tiles along K, e8m0 scales.
MX_DTYPE = "mxe4m3"
MX_SCALE_BLOCK = SCALE_BLOCKS[MX_DTYPE]
FFI_DTYPES: dict[str, str] = {name: d["ffi"] for name, d in _CONTRACT["dtypes"].items()}  # xla::ffi::DataType
# The compute capabilities whose machine code each arch's kernels are.
ARCH_CAPABILITIES: dict[str, tuple[tuple[int, int], ...]] = {
    arch: tuple(tuple(cc) for cc in d["compute_capabilities"]) for arch, d in _CONTRACT["archs"].items()
}
ARCH_NAMESPACES: dict[str, str] = {arch: d["namespace"] for arch, d in _CONTRACT["archs"].items()}
KINDS: dict[str, dict] = _CONTRACT["kinds"]
SCHEDULES_BY_KIND: dict[str, tuple[str, ...]] = {k: tuple(d["schedules"]) for k, d in KINDS.items()}
FFI_TARGETS: dict[str, str] = dict(_CONTRACT["ffi_targets"])
# The most groups a decode row takes: its CTAs keep every group's rows in shared memory.
DECODE_MAX_GROUPS: int = _CONTRACT["decode_max_groups"]
# The warps of a block-scaled decode CTA: each owns tile_n / DECODE_BLOCKWISE_WARPS columns.
DECODE_BLOCKWISE_WARPS: int = _CONTRACT["decode_blockwise_warps"]
# A bf16/f16 decode item of up to this many rows reads A in registers; larger ones stage it.
DECODE_REGISTER_ROWS: int = _CONTRACT["decode_register_rows"]
# The gated epilogue's B: gate and up columns alternate in blocks of GATE_BLOCK.
GATE_BLOCK: int = _CONTRACT["gate_block"]
# The problem each fused epilogue serves.
EPILOGUE_PROBLEMS: dict[str, str] = {"bias_act": "dense", "gated": "ragged_m"}


def arch_for_compute_capability(cc: tuple[int, int]) -> str | None:
    """The kernel arch whose machine code runs on `cc`, or None (XLA's path)."""
    return _arch_for(tuple(cc))


@functools.cache  # every plan asks, once per menu row
def _arch_for(cc: tuple[int, int]) -> str | None:
    return next((a for a, ccs in ARCH_CAPABILITIES.items() if cc in ccs), None)


def capabilities_text(arch: str) -> str:
    """'9.0' or '10.0 or 10.3': the capabilities an arch runs on, for messages."""
    return " or ".join(f"{x}.{y}" for x, y in ARCH_CAPABILITIES[arch])


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
    # False until a GPU has run the row's self-test: planners take it only when pinned.
    validated: bool = True

    @property
    def mma(self) -> str:
        return KINDS[self.kind]["mma"]

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

    @functools.cached_property  # the planners match every menu row by name on every call
    def name(self) -> str:
        problem = "" if self.problem == "dense" else f"{self.problem}_"
        epilogue = "" if self.epilogue == "none" else f"_{self.epilogue}"
        swap = "_swapab" if self.swap_ab else ""
        return (
            f"{self.family}_{problem}{self.dtype}_{self.out}_{self.a_major}{self.b_major}_"
            f"{self.tile_m}x{self.tile_n}x{self.tile_k}_c{self.cluster_m}x{self.cluster_n}_"
            f"s{self.stages}_{self.kind}{epilogue}{swap}"
        )


def _check(row: dict, family: dict) -> None:
    where = f"{MENU_PATH.name}: {row}"
    if family["arch"] not in ARCH_CAPABILITIES:
        raise ValueError(f"{MENU_PATH.name}: unknown arch {family['arch']!r}")
    if row["kind"] not in KINDS:
        raise ValueError(f"{MENU_PATH.name}: unknown kind {row['kind']!r}")
    if KINDS[row["kind"]]["arch"] != family["arch"]:
        raise ValueError(f"kind {row['kind']!r} is not an {family['arch']} kind in {where}")
    if row["dtype"] not in INPUT_DTYPES or row["out"] not in DTYPE_BYTES:
        raise ValueError(f"unsupported dtypes in {where}")
    if row["a_major"] not in ("k", "m") or row["b_major"] not in ("k", "n"):
        raise ValueError(f"bad operand majors in {where}")
    problem, epilogue = row.get("problem", "dense"), row.get("epilogue", "none")
    if problem not in PROBLEMS:
        raise ValueError(f"{MENU_PATH.name}: unknown problem {problem!r}")
    if epilogue not in EPILOGUES:
        raise ValueError(f"{MENU_PATH.name}: unknown epilogue {epilogue!r}")
    if epilogue != "none" and problem != EPILOGUE_PROBLEMS[epilogue]:
        raise ValueError(f"the {epilogue} epilogue needs a {EPILOGUE_PROBLEMS[epilogue]} row: {where}")
    if row.get("swap_ab", False) and (
        family["arch"] != "sm90a" or row["kind"] != "cooperative" or problem != "dense" or epilogue != "none"
    ):
        raise ValueError(f"swap_ab needs a plain dense sm90a cooperative row: {where}")


@functools.cache
def load_menu(path: pathlib.Path = MENU_PATH) -> tuple[Variant, ...]:
    menu = json.loads(pathlib.Path(path).read_text())
    out = []
    for row in menu["variants"]:
        family = menu["families"][row["family"]]
        _check(row, family)
        tm, tn, tk = row["tile"]
        cm, cn = row["cluster"]
        out.append(
            Variant(
                row["family"],
                family["arch"],
                row["kind"],
                tm,
                tn,
                tk,
                cm,
                cn,
                row["stages"],
                row["dtype"],
                row["out"],
                row["a_major"],
                row["b_major"],
                family["header"],
                row.get("problem", "dense"),
                row.get("epilogue", "none"),
                bool(row.get("swap_ab", False)),
                bool(row.get("validated", True)),
            )
        )
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{MENU_PATH.name}: two rows give the same variant")
    return tuple(out)
