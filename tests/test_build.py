"""What the build produced: kernels for both architectures, as SASS."""
import os
import re

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
