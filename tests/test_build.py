"""What the build produced: kernels for both architectures, as SASS."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from jax_cluster import _ffi, variants
import sass

# scripts/test.sh sets this: CI's machine has nvcc, so a build without kernels is a failure there.
REQUIRE = os.environ.get("JAX_CLUSTER_REQUIRE_KERNELS") == "1"


def test_extension_has_kernels_where_required():
    if REQUIRE:
        assert _ffi.with_kernels(), _ffi.why_no_kernels()
    elif not _ffi.with_kernels():
        pytest.skip(_ffi.why_no_kernels())


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
def test_every_menu_row_is_compiled():
    built = set(_ffi.extension().built_archs.split(","))
    want = {v.name for v in variants.load_menu() if v.arch in built}
    assert want == set(_ffi.compiled_variant_names())


@pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels")
@pytest.mark.skipif(sass.cuobjdump() is None, reason="cuobjdump not installed")
def test_extension_holds_sm90a_and_sm100a_sass():
    listing = sass.run("--list-elf")
    archs = set(re.findall(r"sm_(\d+a?)", listing))
    assert {"90a", "100a"} <= archs, listing
    assert not sass.run("--list-ptx").strip(), "PTX is embedded: the driver could JIT it"


ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFINED = re.compile(r"const VariantOps& ops_(\w+)\(\) \{ return (.*)::ops; \}")


def generate(out_dir, archs: str, pattern: str = "", unit_size: int = 1) -> dict[str, dict]:
    """Runs the build's generator; unit file stem -> {row name: template}."""
    out = subprocess.run([sys.executable, str(ROOT / "cc" / "gen_variants.py"), str(ROOT / "jax_cluster"),
                          str(out_dir), archs, pattern, str(unit_size)],
                         check=True, capture_output=True, text=True).stdout
    sources = [line.split("|")[1] for line in out.splitlines() if not line.startswith("table|")]
    return {pathlib.Path(s).stem: dict(DEFINED.findall(pathlib.Path(s).read_text())) for s in sources}


def test_variant_filter_generates_only_matching_rows(tmp_path):
    """JAX_CLUSTER_VARIANTS (a regex) builds a few rows for a quick measurement."""
    pattern = "_kn_128x256x64_c2x1_s4_cooperative(_bias_act)?$"
    units = generate(tmp_path, "sm90a,sm100a", pattern)
    want = {v.name for v in variants.load_menu() if re.search(pattern, v.name)}
    assert len(want) >= 2 and {name for rows in units.values() for name in rows} == want
    table = (tmp_path / "variant_table.cc").read_text()
    assert table.count("&generated::ops_") == len(want)


def test_units_hold_rows_of_one_kind(tmp_path):
    """Rows compiled together share arch, family, kind and clustering (so one
    SASS contract); every row is compiled exactly once; no unit is too big."""
    menu = {v.name: v for v in variants.load_menu()}
    units = generate(tmp_path, "sm90a,sm100a", unit_size=4)
    names = [name for rows in units.values() for name in rows]
    assert sorted(names) == sorted(menu)
    for stem, rows in units.items():
        assert 1 <= len(rows) <= 4, stem
        assert len({(menu[n].arch, menu[n].family, menu[n].kind, menu[n].cluster_size > 1)
                    for n in rows}) == 1, stem
    assert len(units) < len(menu) / 2
    again = generate(tmp_path, "sm90a", unit_size=1)  # a smaller build drops the stale units
    assert {p.stem for p in tmp_path.glob("*.cu")} == set(again)
    with pytest.raises(subprocess.CalledProcessError):
        generate(tmp_path, "sm90a", unit_size=0)


def test_swapped_rows_instantiate_the_transposed_problem(tmp_path):
    """A swap_ab row's kernel computes D^T = B^T·A^T: B [K,N] becomes an m-major
    A, A [M,K] a k-major B, and the tile's M and N trade places."""
    swapped = [v for v in variants.load_menu() if v.swap_ab]
    assert len(swapped) >= 2  # the 64- and 32-row tiles
    templates = {name: t for rows in generate(tmp_path, "sm90a", "swapab$").values()
                 for name, t in rows.items()}
    for v in swapped:
        want = (f"cutlass::layout::ColumnMajor, cutlass::layout::ColumnMajor, {v.tile_n}, "
                f"{v.tile_m}, {v.tile_k}, {v.cluster_n}, {v.cluster_m}, {v.stages}, "
                "sm90::Cooperative, PlainEpilogue, true>")
        assert (v.a_major, v.b_major) == ("k", "n") and want in templates[v.name], v.name


@pytest.mark.parametrize("change", [dict(epilogue="bias_act"), dict(kind="cooperative_dynamic"),
                                    dict(family="sm100_gemm_tcgen05_persistent")])
def test_swap_ab_needs_a_plain_sm90_cooperative_row(change, tmp_path):
    import json
    menu = json.loads(variants.MENU_PATH.read_text())
    row = next(r for r in menu["variants"] if r.get("swap_ab"))
    menu["variants"] = [{**row, **change}]
    path = tmp_path / "variants.json"
    path.write_text(json.dumps(menu))
    with pytest.raises(ValueError, match="swap_ab"):
        variants.load_menu(path)
