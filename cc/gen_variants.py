"""Generates the CUDA instantiations of the menu rows and the dispatch table.

Run by CMake at configure time:
gen_variants.py MENU_DIR OUT_DIR ARCHS [REGEX [UNIT_SIZE]]
(MENU_DIR holds tables.py and variants.json: jax_cluster/planning; REGEX, if
given, keeps only the rows whose name it matches). Rows are
compiled UNIT_SIZE (default 1) to a translation unit: nvcc's front end and
the first instantiation of CUTLASS's common templates cost most of a unit's
time, which then grows by about 12 s a row (one sm90a row took 98 s, eight
rows 181 s; one dense and one grouped row together 132 s against 208 s
apart). A unit holds rows of one arch, of as few kinds as the split allows.
Each row's kernel carries the row's tag type (rows::NAME) in its symbol, so
tests/native/test_sass_contract.py checks every kernel against its own row.
Prints 'ARCH|FILE' lines for CMake and rewrites a file only when its text
changes.
"""

import pathlib
import re
import sys

from gen_contract import load_tables  # beside this file: one loader for both generators

# CUTLASS layout tags: A [M,K] is RowMajor; B [N,K] is ColumnMajor.
A_LAYOUT = {"k": "cutlass::layout::RowMajor", "m": "cutlass::layout::ColumnMajor"}
B_LAYOUT = {"k": "cutlass::layout::ColumnMajor", "n": "cutlass::layout::RowMajor"}
# The dense kernel template of each arch (in tables.ARCH_NAMESPACES[arch]);
# grouped rows use their kind's template there, GroupedGemm where it is empty.
DENSE_TEMPLATES = {"sm90a": "GemmWsPersistent", "sm100f": "GemmTcgen05Persistent"}
# A grouped row with a fused epilogue runs that epilogue's template instead of its kind's.
GROUPED_EPILOGUE_TEMPLATES = {"gated": "GroupedGatedGemm"}


# A swapped kernel's A is the caller's B and its B the caller's A: B [K,N]
# (n-major) read as A^T is m-major, and A [K,M] read as B^T is n-major.
SWAPPED_A_MAJOR = {"n": "m", "k": "k"}  # from the caller's b_major
SWAPPED_B_MAJOR = {"k": "k", "m": "n"}  # from the caller's a_major


def _template(t, v) -> str:
    """The C++ type of row `v`; `t` is the tables module."""
    types, ns = t.CUTLASS_TYPES, t.ARCH_NAMESPACES[v.arch]
    kind = t.KINDS[v.kind]["template"]
    if v.problem != "dense":
        problem = {"ragged_m": "kRaggedM", "ragged_k": "kRaggedK"}[v.problem]
        cluster = f"{v.cluster_m}, {v.cluster_n}, " if t.KINDS[v.kind].get("cluster_in_template") else ""
        kind = GROUPED_EPILOGUE_TEMPLATES.get(v.epilogue) or kind or "GroupedGemm"
        return (
            f"{ns}::{kind}<rows::{v.name}, {types[v.dtype]}, {types[v.out]}, "
            f"{A_LAYOUT[v.a_major]}, {B_LAYOUT[v.b_major]}, {v.tile_m}, {v.tile_n}, "
            f"{v.tile_k}, {cluster}{v.stages}, RaggedProblem::{problem}>"
        )
    if v.swap_ab:  # the kernel's own problem is the transposed one
        a, b = A_LAYOUT[SWAPPED_A_MAJOR[v.b_major]], B_LAYOUT[SWAPPED_B_MAJOR[v.a_major]]
        (tm, tn), (cm, cn) = (v.tile_n, v.tile_m), (v.cluster_n, v.cluster_m)
    else:
        a, b = A_LAYOUT[v.a_major], B_LAYOUT[v.b_major]
        (tm, tn), (cm, cn) = (v.tile_m, v.tile_n), (v.cluster_m, v.cluster_n)
    epilogue = {"none": "", "bias_act": ", BiasActEpilogue"}[v.epilogue]
    if v.swap_ab:
        epilogue = ", PlainEpilogue, true"
    return (
        f"{ns}::{DENSE_TEMPLATES[v.arch]}<rows::{v.name}, {types[v.dtype]}, {types[v.out]}, {a}, {b}, "
        f"{tm}, {tn}, {v.tile_k}, {cm}, {cn}, {v.stages}, {kind}{epilogue}>"
    )


def _instantiation(t, v) -> str:
    return (
        f"namespace jax_cluster {{\n"
        f"namespace rows {{\n"
        f"struct {v.name};  // names the row's kernel symbol\n"
        f"}}  // namespace rows\n"
        f"namespace generated {{\n"
        f"const VariantOps& ops_{v.name}() {{ return {_template(t, v)}::ops; }}\n"
        f"}}  // namespace generated\n"
        f"}}  // namespace jax_cluster\n"
    )


def _unit(t, rows) -> str:
    headers = "".join(f'#include "{h}"\n' for h in dict.fromkeys(v.header for v in rows))
    return f"// Generated from jax_cluster/planning/variants.json by cc/gen_variants.py.\n{headers}\n" + "\n".join(
        _instantiation(t, v) for v in rows
    )


def _units(variants, size: int) -> dict[str, list]:
    """The rows of each arch in menu order grouped by family and kind (rows
    of a kind share the most template instantiations), split into units of at
    most `size` rows, as even as the split allows."""
    archs: dict[str, list] = {}
    for v in variants:
        archs.setdefault(v.arch, []).append(v)
    units = {}
    for arch, rows in archs.items():
        kinds = list(dict.fromkeys((v.family, v.kind) for v in rows))
        rows = sorted(rows, key=lambda v: kinds.index((v.family, v.kind)))
        count = -(-len(rows) // size)
        for i in range(count):
            units[f"{arch}_kernels_{i}"] = rows[i * len(rows) // count : (i + 1) * len(rows) // count]
    return units


def _table(variants) -> str:
    decls = "".join(f"const VariantOps& ops_{v.name}();\n" for v in variants)
    rows = "".join(
        f'    {{"{v.name}", "{v.arch}", "{v.dtype}", "{v.out}", \'{v.a_major}\', \'{v.b_major}\', '
        f"{v.tile_m}, {v.tile_n}, {v.tile_k}, {v.cluster_m}, {v.cluster_n}, {v.stages}, "
        f'"{v.mma}", "{v.kind}", "{v.problem}", "{v.epilogue}", "{",".join(v.schedules)}", '
        f"&generated::ops_{v.name}}},\n"
        for v in variants
    )
    return (
        "// Generated from jax_cluster/planning/variants.json by cc/gen_variants.py.\n"
        '#include "dispatch/variant_table.h"\n\n'
        f"namespace jax_cluster {{\nnamespace generated {{\n{decls}}}  // namespace generated\n\n"
        f"const VariantEntry kVariants[] = {{\n{rows}}};\n"
        f"const size_t kNumVariants = {len(variants)};\n}}  // namespace jax_cluster\n"
    )


def _write(path: pathlib.Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def main(menu_dir: str, out_dir: str, archs: str, only: str = "", unit_size: str = "1") -> None:
    tables = load_tables(pathlib.Path(menu_dir))
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(archs.split(","))
    variants = [
        v
        for v in tables.load_menu(pathlib.Path(menu_dir) / "variants.json")
        if v.arch in wanted and re.search(only, v.name)
    ]
    if not unit_size.isdigit() or int(unit_size) < 1:
        raise SystemExit(
            f"gen_variants.py: JAX_CLUSTER_UNIT_SIZE must be a whole number of at least 1, not {unit_size!r}"
        )
    units = _units(variants, int(unit_size))
    for stale in set(out.glob("*.cu")) - {out / f"{name}.cu" for name in units}:
        stale.unlink()  # a row moved to another unit, or left the build
    for name, rows in units.items():
        path = out / f"{name}.cu"
        _write(path, _unit(tables, rows))
        print(f"{rows[0].arch}|{path}")
    _write(out / "variant_table.cc", _table(variants))
    print(f"table|{out / 'variant_table.cc'}")


if __name__ == "__main__":
    main(*sys.argv[1:])
