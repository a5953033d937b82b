"""What the build produced: kernels for both architectures, as SASS; and what
its generators (cc/gen_contract.py, cc/gen_variants.py) make of the tables."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import sass

from jax_cluster import _ffi
from jax_cluster.planning import tables

# scripts/test.sh sets this: CI's machine has nvcc, so a build without kernels is a failure there.
REQUIRE = os.environ.get("JAX_CLUSTER_REQUIRE_KERNELS") == "1"


def test_extension_has_kernels_where_required():
    if REQUIRE:
        assert _ffi.with_kernels(), _ffi.why_no_kernels()
    elif not _ffi.with_kernels():
        pytest.skip(_ffi.why_no_kernels())


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
def test_every_menu_row_is_compiled():
    built = set(_ffi.built_archs())
    want = {v.name for v in tables.load_menu() if v.arch in built}
    assert want == set(_ffi.compiled_variant_names())


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
@pytest.mark.parametrize("command_buffers", [True, False])
def test_every_ffi_target_has_an_execute_handler(command_buffers):
    stages = _ffi.extension().registrations(command_buffers)
    assert set(stages) == set(tables.FFI_TARGETS.values())
    assert all("execute" in handlers for handlers in stages.values())


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
@pytest.mark.skipif(sass.cuobjdump() is None, reason="cuobjdump not installed")
def test_extension_holds_machine_code_for_every_built_arch():
    listing = sass.run()
    assert set(sass.archs(listing)) == set(_ffi.built_archs()), listing
    assert not sass.run("--list-ptx").strip(), "PTX is embedded: the driver could JIT it"


ROOT = pathlib.Path(__file__).resolve().parents[2]
PLANNING = ROOT / "jax_cluster" / "planning"
DEFINED = re.compile(r"const VariantOps& ops_(\w+)\(\) \{ return (.*)::ops; \}")


def generate(out_dir, archs: str, pattern: str = "", unit_size: int = 1) -> dict[str, dict]:
    """Runs the build's generator; unit file stem -> {row name: template}."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "cc" / "gen_variants.py"),
            str(PLANNING),
            str(out_dir),
            archs,
            pattern,
            str(unit_size),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    sources = [line.split("|")[1] for line in out.splitlines() if not line.startswith("table|")]
    return {pathlib.Path(s).stem: dict(DEFINED.findall(pathlib.Path(s).read_text())) for s in sources}


def test_variant_filter_generates_only_matching_rows(tmp_path):
    """JAX_CLUSTER_VARIANTS (a regex) builds a few rows for a quick measurement."""
    pattern = "_kn_128x256x64_c2x1_s4_cooperative(_bias_act)?$"
    units = generate(tmp_path, "sm90a,sm100f", pattern)
    want = {v.name for v in tables.load_menu() if re.search(pattern, v.name)}
    assert len(want) >= 2 and {name for rows in units.values() for name in rows} == want
    table = (tmp_path / "variant_table.cc").read_text()
    assert table.count("&generated::ops_") == len(want)


def test_units_hold_rows_of_one_arch_each_tagged_with_its_row(tmp_path):
    """Rows compiled together share an arch (one cubin target) and come in
    runs of one kind; every row is compiled exactly once, with its own tag
    type as the kernel's first template argument; no unit is too big."""
    menu = {v.name: v for v in tables.load_menu()}
    units = generate(tmp_path, "sm90a,sm100f", unit_size=12)
    names = [name for rows in units.values() for name in rows]
    assert sorted(names) == sorted(menu)
    for stem, rows in units.items():
        assert 1 <= len(rows) <= 12, stem
        assert len({menu[n].arch for n in rows}) == 1, stem
        assert all(f"<rows::{name}, " in template for name, template in rows.items()), stem
        text = (tmp_path / f"{stem}.cu").read_text()
        assert all(f"struct {name};" in text for name in rows), stem
    kinds = [(menu[n].family, menu[n].kind) for n in names]
    runs = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert len(runs) == len(set(runs)), "a kind's rows are split across the build"
    assert len(units) == sum(-(-sum(v.arch == a for v in menu.values()) // 12) for a in ("sm90a", "sm100f"))
    again = generate(tmp_path, "sm90a", unit_size=1)  # a smaller build drops the stale units
    assert {p.stem for p in tmp_path.glob("*.cu")} == set(again)
    with pytest.raises(subprocess.CalledProcessError):
        generate(tmp_path, "sm90a", unit_size=0)


def test_swapped_rows_instantiate_the_transposed_problem(tmp_path):
    """A swap_ab row's kernel computes D^T = B^T·A^T: B [K,N] becomes an m-major
    A, A [M,K] a k-major B, and the tile's M and N trade places."""
    swapped = [v for v in tables.load_menu() if v.swap_ab]
    assert len(swapped) >= 2  # the 64- and 32-row tiles
    templates = {name: t for rows in generate(tmp_path, "sm90a", "swapab$").values() for name, t in rows.items()}
    for v in swapped:
        want = (
            f"cutlass::layout::ColumnMajor, cutlass::layout::ColumnMajor, {v.tile_n}, "
            f"{v.tile_m}, {v.tile_k}, {v.cluster_n}, {v.cluster_m}, {v.stages}, "
            "sm90::Cooperative, PlainEpilogue, true>"
        )
        assert (v.a_major, v.b_major) == ("k", "n") and want in templates[v.name], v.name


@pytest.mark.parametrize(
    "change",
    [dict(epilogue="bias_act"), dict(kind="cooperative_dynamic"), dict(family="sm100_gemm_tcgen05_persistent")],
)
def test_swap_ab_needs_a_plain_sm90_cooperative_row(change, tmp_path):
    import json

    menu = json.loads(tables.MENU_PATH.read_text())
    row = next(r for r in menu["variants"] if r.get("swap_ab"))
    menu["variants"] = [{**row, **change}]
    path = tmp_path / "variants.json"
    path.write_text(json.dumps(menu))
    with pytest.raises(ValueError, match="swap_ab"):
        tables.load_menu(path)


CONTRACT = json.loads((PLANNING / "contract.json").read_text())


def generate_contract(out_dir) -> pathlib.Path:
    subprocess.run(
        [sys.executable, str(ROOT / "cc" / "gen_contract.py"), str(PLANNING), str(out_dir)],
        check=True,
        capture_output=True,
        text=True,
    )
    return pathlib.Path(out_dir) / "common" / "contract.h"


def camel(name: str) -> str:
    return "k" + "".join(part.capitalize() for part in name.split("_"))


def test_contract_header_names_every_table_entry(tmp_path):
    """common/contract.h carries every plan field, enum name, arch capability,
    dtype and FFI target of contract.json, and includes neither XLA nor CUDA."""
    path = generate_contract(tmp_path)
    text = path.read_text()
    cpp_type = {"int": "int64_t", "str": "std::string_view"}
    for name, kind in CONTRACT["plan_fields"]:
        assert f"X({cpp_type[kind]}, {name})" in text, name
    for enum, key in (("Schedule", "schedules"), ("Raster", "rasters"), ("Activation", "activations")):
        names = CONTRACT[key]
        assert (
            f"enum class {enum} : int {{ " + ", ".join(f"{camel(n)} = {i}" for i, n in enumerate(names)) + " };" in text
        ), enum
        assert f"k{enum}Names[] = {{" + ", ".join(f'"{n}"' for n in names) + "};" in text, enum
    assert "kSwizzles[] = {" + ", ".join(map(str, CONTRACT["swizzles"])) + "};" in text
    for arch, d in CONTRACT["archs"].items():
        for major, minor in d["compute_capabilities"]:
            assert f'{{"{arch}", {major}, {minor}}}' in text, arch
    first_of_ffi = {}  # one X() row per FFI element type; later names map to its value type
    for name, d in CONTRACT["dtypes"].items():
        first = first_of_ffi.setdefault(d["ffi"], name)
        assert f'{{"{name}", "{first}"}}' in text, name
        if first == name:
            assert f"X({name}, {d['bytes']}, {d['ffi']})" in text, name
    for name in CONTRACT["ffi_targets"].values():
        assert f'"{name}"' in text, name
    assert not re.search(r"#include <(xla|cuda)", text)
    mtime = path.stat().st_mtime_ns
    generate_contract(tmp_path)  # the same text: the file (and so the build) is left alone
    assert path.stat().st_mtime_ns == mtime


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_contract_header_compiles_with_the_table_values(tmp_path):
    """The enumerator values are list positions, and the names read back."""
    header = generate_contract(tmp_path)
    checks = [
        f'static_assert(index_of(k{enum}Names, "{n}") == {i});\n'
        f"static_assert(static_cast<int>({enum}::{camel(n)}) == {i});\n"
        f'static_assert(name({enum}::{camel(n)}) == "{n}");'
        for enum, key in (("Schedule", "schedules"), ("Raster", "rasters"), ("Activation", "activations"))
        for i, n in enumerate(CONTRACT[key])
    ]
    source = tmp_path / "check.cc"
    source.write_text(f'#include "{header}"\nnamespace jax_cluster {{\n' + "\n".join(checks) + "\n}\n")
    subprocess.run(["c++", "-std=c++17", "-fsyntax-only", str(source)], check=True)


def test_no_hand_copy_of_the_contract_in_cc():
    """The C++ sources take these tables from the generated header only: no string
    literal names a schedule, raster, activation, arch or FFI target, and no
    source defines the plan fields, the enums or an arch's capability."""
    names = (
        CONTRACT["schedules"]
        + CONTRACT["rasters"]
        + CONTRACT["activations"]
        + list(CONTRACT["archs"])
        + list(CONTRACT["ffi_targets"].values())
    )
    # "none" is an epilogue name too, which C++ compares with the variant table's;
    # messages may use "static" and "dynamic" as words, not as a literal of their own.
    english = {"static", "dynamic"}
    word = re.compile(r"\b(" + "|".join(re.escape(n) for n in names if n not in english | {"none"}) + r")\b")
    exact = {f'"{n}"' for n in english}
    found = []
    for path in sorted((ROOT / "cc").rglob("*")):
        if path.suffix not in (".cc", ".h", ".cuh", ".cu"):
            continue
        code = re.sub(r"//[^\n]*", "", path.read_text())  # comments may name them,
        code = re.sub(r'nb::arg\("\w+"\)', "", code)  # and so may keyword argument names
        for literal in re.findall(r'"(?:[^"\\\n]|\\.)*"', code):
            if word.search(literal) or literal in exact:
                found.append(f"{path.relative_to(ROOT)}: {literal}")
        for copy in (
            "#define JAX_CLUSTER_PLAN_FIELDS",
            "enum class Schedule",
            "enum class Raster",
            "enum class Activation",
            "10, 3",
            "minor == 3",
        ):
            if copy in code:
                found.append(f"{path.relative_to(ROOT)}: {copy}")
    assert not found, "hand-written copies of contract.json:\n" + "\n".join(found)


def test_compile_progress_names_the_unit_and_keeps_the_exit_status(tmp_path):
    """The kernel units' compiler launcher (cc/compile_progress.py) says which
    unit of how many it compiled, and fails as the compiler failed."""
    units = tmp_path / "units.txt"
    units.write_text("/gen/first_0.cu\n/gen/second_0.cu\n")
    compiler = [sys.executable, "-c", "import sys; sys.exit(3)", "-c", "/gen/second_0.cu"]
    run = subprocess.run(
        [sys.executable, str(ROOT / "cc" / "compile_progress.py"), str(units), *compiler],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 3
    assert re.fullmatch(r"\[jax_cluster\] failed to compile unit 2/2 in \d+ s: second_0\n", run.stdout)
