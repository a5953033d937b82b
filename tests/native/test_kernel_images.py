"""The record stage hands XLA each kernel's cubin, which the extension reads
from its own .nv_fatbin section (cc/ffi/kernel_image.cc). Checked against
cuobjdump: the same cubins, one per unit and arch, and every GEMM kernel
cuobjdump disassembles is a function the parser found in a cubin of its SM."""

import re
import subprocess

import pytest
import sass

from jax_cluster import _ffi

pytestmark = [
    pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels"),
    pytest.mark.skipif(sass.cuobjdump() is None, reason="cuobjdump not installed"),
]

FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.MULTILINE)


@pytest.fixture(scope="module")
def parsed():
    return _ffi.extension().embedded_kernel_images()


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """SM -> [the function names of each cubin cuobjdump extracts]."""
    out = tmp_path_factory.mktemp("cubins")
    subprocess.run(
        [sass.cuobjdump(), "-xelf", "all", str(sass.extension_path())], cwd=out, check=True, capture_output=True
    )
    found = {}
    for cubin in sorted(out.glob("*.cubin")):
        sm = int(re.search(r"\.sm_(\d+)[a-z]?\.cubin$", cubin.name).group(1))
        found.setdefault(sm, []).append(set(FUNCTION.findall(sass.run_on(cubin, "--dump-sass"))))
    return found


def test_the_parser_finds_the_cubins_cuobjdump_extracts(parsed, dumped):
    counts = {}
    for cubin in parsed:
        counts[cubin["sm"]] = counts.get(cubin["sm"], 0) + 1
    assert counts == {sm: len(cubins) for sm, cubins in dumped.items()}


def test_every_disassembled_kernel_is_found_in_a_cubin_of_its_sm(parsed, dumped):
    for sm, cubins in dumped.items():
        mine = [set(c["kernels"]) for c in parsed if c["sm"] == sm]
        for functions in cubins:
            assert any(functions <= kernels for kernels in mine), (sm, sorted(functions)[:3])


def test_the_built_archs_each_have_cubins(parsed):
    built = {int(re.sub(r"\D", "", arch)) for arch in _ffi.built_archs()}
    assert {c["sm"] for c in parsed} == built
