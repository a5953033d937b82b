"""The machine code contract of every compiled variant, read from the built
extension: each row's kernel carries the row's tag type (rows::NAME, from
cc/gen_variants.py) in its symbol, so every GEMM kernel of every embedded
cubin is matched to its own menu row and checked against that row's
contract, whatever other rows share its build unit."""

import re
import subprocess

import pytest
import sass

from jax_cluster import _ffi
from jax_cluster.planning import tables

pytestmark = [
    pytest.mark.skipif(not _ffi.with_kernels(), reason="built without kernels"),
    pytest.mark.skipif(sass.cuobjdump() is None, reason="cuobjdump not installed"),
]

# jax_cluster::rows::NAME in a mangled kernel name: "4rows", then NAME's length and NAME
ROW_TAG = re.compile(r"4rows(\d+)")
FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.MULTILINE)
GEMM_KERNEL = "_ZN7cutlass13device_kernel"  # the ragged rows' helper kernels are not GEMMs
DECODE_KERNELS = (  # the CUDA-core decode kernels, plain and block-scaled
    "_ZN11jax_cluster4sm906decode20ragged_decode_kernel",
    "_ZN11jax_cluster4sm9016decode_blockwise30ragged_decode_blockwise_kernel",
)
WORK_QUEUE_FETCH = r"\bATOMG\.E\.ADD\.STRONG\.GPU\b"  # integer add that returns the old value
CLUSTER_BROADCAST = r"\bSTAS\b"
# tcgen05.cp: the block-scaled UMMA reads its scale factors from tensor memory
MX_SCALE_COPY = r"\bUTCCP\b"
# fence.proxy.tensormap acquire: a grouped kernel rewrites its TMA descriptors per group
DESCRIPTOR_ACQUIRE = r"\bUTMACCTL\.IV\b"
# griddepcontrol.wait: a dense sm90 kernel without a workspace is launched
# overlapping the kernel before it, so it must wait before touching global memory
GRID_DEPENDENCY_WAIT = r"\bACQBULK\b"
# griddepcontrol.launch_dependents after a CTA's last mainloop: the kernel after
# a statically scheduled one starts while its epilogues run
GRID_DEPENDENTS_RELEASE = r"\bPREEXIT\b"


def required(v: tables.Variant) -> dict[str, str]:
    """Instruction (regex) -> why the variant must contain it."""
    if v.kind == "decode":
        need = {
            r"\bLDG\.E\.128\.CONSTANT\b": "16-byte read-only loads of the weights",
            r"\bUCGABAR_ARV\b": "cluster barrier arrive (the CTAs' partial sums are complete)",
            r"\bUCGABAR_WAIT\b": "cluster barrier wait",
            r"\bLD\.E\b": "generic loads: the other CTAs' partial sums in distributed shared memory",
        }
        if v.dtype in tables.BLOCK_SCALED_DTYPES:  # cvt.rn.f16x2.e4m3x2 on the CUDA cores
            need[rf"\bF2FP\.F16\.{v.dtype.upper()}\.UNPACK_B\b"] = f"fp8 ({v.dtype}) pairs widened to f16"
        return need
    need = {}
    if v.problem != "dense":
        need[DESCRIPTOR_ACQUIRE] = "per-group TMA descriptor acquire (tensormap fence)"
    if v.arch == "sm90a":
        if v.dtype in tables.BLOCK_SCALED_DTYPES:  # fp8 wgmma is QGMMA in SASS
            need[rf"\bQGMMA\.[\w.]*{v.dtype.upper()}"] = f"fp8 wgmma ({v.dtype})"
        else:
            need[r"\bHGMMA\."] = "wgmma (warpgroup MMA)"
        if v.cluster_size > 1:
            need[r"\bUTMALDG\.[\w.]*MULTICAST"] = "multicast TMA load across the cluster"
        if v.problem == "dense":
            need[GRID_DEPENDENCY_WAIT] = "a wait for the kernel before it (griddepcontrol.wait)"
            if "dynamic" not in v.schedules:
                need[GRID_DEPENDENTS_RELEASE] = "an early release of the kernel after it (launch_dependents)"
        if "dynamic" in v.schedules:
            need[WORK_QUEUE_FETCH] = "work-queue fetch (global atomic add)"
            if v.cluster_size > 1:
                need[CLUSTER_BROADCAST] = "tile broadcast to the cluster (st.async)"
    else:
        need[r"\bUTC\w*MMA\b"] = "tcgen05 UMMA"
        if v.dtype in tables.BLOCK_SCALED_DTYPES:  # MXFP8: fp8 UMMA that reads scales from tensor memory
            need[r"\bUTCQMMA\b"] = f"fp8 UMMA ({v.dtype})"
            need[MX_SCALE_COPY] = "scale factors copied from shared to tensor memory (block-scaled UMMA)"
        if v.mma == "2cta":
            need[r"\bUTC\w*MMA\.2CTA"] = "2-CTA UMMA (cta_group::2)"
            need[r"\bUTMALDG\.[\w.]*2CTA"] = "2-SM TMA load"
        if v.kind.endswith("clc"):
            need[r"\bUGETNEXTWORKID"] = "Cluster Launch Control work fetch"
    return need


def forbidden(v: tables.Variant) -> dict[str, str]:
    """Instructions a variant must not contain: they would mean the marker
    matched the wrong cubin, or the kernel is not the kind its row says."""
    if v.kind == "decode":
        return {
            r"\b[HQ]GMMA\.": "warpgroup MMA in a CUDA-core decode kernel",
            DESCRIPTOR_ACQUIRE: "a TMA descriptor rewrite in a kernel without TMA",
            WORK_QUEUE_FETCH: "work-queue fetch in a statically scheduled kernel",
            r"\bATOMS\.CAST\.SPIN\b": "a shared-memory compare-and-swap loop (emulated float atomics)",
        }
    out = {}
    if "dynamic" not in v.schedules:  # static, stream-K and CLC kernels have no work queue
        out[WORK_QUEUE_FETCH] = "work-queue fetch (global atomic add) in a kernel without a queue"
    if v.arch != "sm100f":
        out[r"\bUTC\w*MMA\b"] = "tcgen05 in an sm90 kernel"
        if "dynamic" not in v.schedules:
            out[CLUSTER_BROADCAST] = "work-queue broadcast in a statically scheduled kernel"
        return out
    if v.mma == "1cta":
        out[r"\bUTC\w*MMA\.2CTA"] = "2-CTA UMMA in a 1-CTA variant"
    if v.dtype not in tables.BLOCK_SCALED_DTYPES:
        out[MX_SCALE_COPY] = "a scale-factor copy in a kernel without block scales"
    if not v.kind.endswith("clc"):
        out[r"\bUGETNEXTWORKID"] = "CLC work fetch in a static variant"
    return out


def gemm_kernels(sass_text: str) -> list[tuple[str, str]]:
    """(function name, SASS) of each GEMM kernel function in one cubin's dump."""
    parts = FUNCTION.split(sass_text)
    return [
        (name, body) for name, body in zip(parts[1::2], parts[2::2]) if name.startswith((GEMM_KERNEL, *DECODE_KERNELS))
    ]


def row_of(function: str) -> str | None:
    """The menu row a kernel's mangled name carries, or None."""
    tag = ROW_TAG.search(function)
    return function[tag.end() : tag.end() + int(tag.group(1))] if tag else None


def test_row_of_reads_the_tag_of_a_mangled_name():
    name = "_ZN7cutlass13device_kernelIN11jax_cluster9RowKernelINS1_4rows9sm90_rowAENS_4gemmEEEEEvNT_6ParamsE"
    assert row_of(name) == "sm90_rowA"
    assert row_of("_ZN7cutlass13device_kernelIiEEvv") is None


@pytest.fixture(scope="module")
def cubins(tmp_path_factory) -> list:
    """Every cubin embedded in the extension, extracted."""
    out = tmp_path_factory.mktemp("cubins")
    subprocess.run(
        [sass.cuobjdump(), "-xelf", "all", str(sass.extension_path())], cwd=out, check=True, capture_output=True
    )
    return sorted(out.glob("*.cubin"))


@pytest.fixture(scope="module")
def sass_by_variant(cubins):
    """Variant name -> the SASS of its kernels (one per row)."""
    menu = {v.name: v for v in tables.load_menu()}
    found = {}
    for cubin in cubins:
        kernels = gemm_kernels(sass.run_on(cubin, "--dump-sass"))
        if not kernels:
            continue
        # the cubin's machine code target (sm_90a, sm_100f) is the arch of every row in it
        target = sass.archs(sass.run_on(cubin, "-elf"))
        assert len(target) == 1, f"cannot read the target of {cubin.name}"
        for function, body in kernels:
            row = row_of(function)
            assert row in menu, f"{cubin.name}: a GEMM kernel names no menu row: {function[:200]}"
            assert menu[row].arch == target[0], f"{row} ({menu[row].arch}) compiled for {target[0]}"
            found.setdefault(row, []).append(body)
    return found


def test_every_compiled_variant_has_its_kernel(sass_by_variant):
    assert set(sass_by_variant) == set(_ffi.compiled_variant_names())
    twice = sorted(name for name, bodies in sass_by_variant.items() if len(bodies) != 1)
    assert not twice, f"rows with more than one kernel: {twice}"


@pytest.mark.parametrize("v", tables.load_menu(), ids=lambda v: v.name)
def test_variant_contains_its_instructions(v, sass_by_variant):
    if v.name not in _ffi.compiled_variant_names():
        pytest.skip(f"{v.arch} not built")
    for text in sass_by_variant[v.name]:
        missing = [f"{why} ({pattern})" for pattern, why in required(v).items() if not re.search(pattern, text)]
        assert not missing, f"a kernel built with {v.name} lacks: " + "; ".join(missing)
        wrong = [f"{why} ({pattern})" for pattern, why in forbidden(v).items() if re.search(pattern, text)]
        assert not wrong, f"a kernel built with {v.name} contains: " + "; ".join(wrong)


@pytest.mark.parametrize("v", [v for v in tables.load_menu() if v.family == "sm100_grouped_gemm"], ids=lambda v: v.name)
def test_clc_grouped_rows_check_pair_clc_and_descriptors(v):
    """The rules above give every sm100 grouped row the whole contract of its design."""
    need, never = required(v), forbidden(v)
    for pattern in (r"\bUTC\w*MMA\.2CTA", r"\bUTMALDG\.[\w.]*2CTA", r"\bUGETNEXTWORKID", DESCRIPTOR_ACQUIRE):
        assert pattern in need, f"{v.name}: {pattern} not required"
    assert WORK_QUEUE_FETCH in never, f"{v.name}: the work-queue atomic is not forbidden"


# The fused epilogue's run-time activation must branch once per subtile: a
# switch per value (128 jump tables in an sm90 row) made the kernel 2.2x
# slower, measured on an H200 on 2026-11-30 (docs/performance.md). The rows
# built since have 8 (sm90) and 5 (sm100).
MAX_ACTIVATION_JUMP_TABLES = 16


@pytest.mark.parametrize("v", [v for v in tables.load_menu() if v.epilogue == "bias_act"], ids=lambda v: v.name)
def test_fused_activation_branches_once_per_subtile(v, sass_by_variant):
    if v.name not in _ffi.compiled_variant_names():
        pytest.skip(f"{v.arch} not built")
    tables = max(len(re.findall(r"\bBRX\b", text)) for text in sass_by_variant[v.name])
    assert tables <= MAX_ACTIVATION_JUMP_TABLES, f"{v.name}: {tables} indirect branches (BRX)"


@pytest.mark.parametrize("v", [v for v in tables.load_menu() if v.epilogue == "gated"], ids=lambda v: v.name)
def test_gated_epilogue_stores_from_registers_with_fast_activations(v, sass_by_variant):
    """The gated row's kernel has no TMA store (its epilogue writes from
    registers) where the plain grouped ragged_m kernels of its arch and dtype
    have one, its gates run on the special-function unit (MUFU exponentials;
    the fast division adds no subroutine call over the plain kernels'), and
    it does not spill."""
    if v.name not in _ffi.compiled_variant_names():
        pytest.skip(f"{v.arch} not built")
    (gated,) = sass_by_variant[v.name]
    plain = [
        text
        for w in tables.load_menu()
        if (w.family, w.problem, w.dtype, w.epilogue) == (v.family, v.problem, v.dtype, "none")
        for text in sass_by_variant.get(w.name, [])
    ]
    assert plain and all("UTMASTG" in k for k in plain), "the plain grouped kernels store by TMA"
    assert "UTMASTG" not in gated, f"{v.name} stores D by TMA"
    assert len(re.findall(r"\bMUFU\.EX2\b", gated)) >= 64, "the gate's exponentials are not on MUFU"
    calls = len(re.findall(r"\bCALL\b", gated))
    assert calls <= max(len(re.findall(r"\bCALL\b", k)) for k in plain), "slow-path calls"
    assert not re.search(r"\b(LDL|STL)\b", gated), "the gated kernel spills to local memory"


# The fp8 quantization kernels outside the menu (kernels/*_quantize.cu): one
# instantiation per input (bf16, f16, f32) and output (e4m3, e5m2) format, in
# every arch the extension is built for, each moving 16 bytes per load or
# store where the design says so, none spilling, and spending one
# instruction on a NaN-keeping max (FMNMX3 on sm_100 takes three values) and
# one conversion on two values.
QUANTIZE_KERNELS = {
    "quantize_weight_blocks_kernel": {
        r"\bLDG\.E\.128\b": "16-byte loads of the weights' rows",
        r"\bSTG\.E\.128\b": "16-byte stores of the transposed copy's columns",
        r"\bSHFL\.BFLY\b": "the block amax reduced across the warp",
        r"\bFMNMX3?\.NAN\b": "the NaN-keeping amax as one instruction",
    },
    "quantize_token_tiles_kernel": {
        r"\bLDG\.E\.128\b": "16-byte loads of the rows",
        r"\bSTG\.E\.128\b": "16-byte stores of each column's fp8 values",
        r"\bFMNMX3?\.NAN\b": "the NaN-keeping amax as one instruction",
    },
}
# an fp8 conversion with a zero for one of its pair: a value converted alone
SINGLE_CONVERSION = re.compile(r"\bF2FP\.SATFINITE\.E[45]M[23]\.F32\.PACK_AB\S*\s+R\d+,\s*RZ,")


@pytest.fixture(scope="module")
def quantize_sass(cubins):
    """(arch, kernel) -> the SASS of each of its instantiations."""
    found = {}
    for cubin in cubins:
        (target,) = sass.archs(sass.run_on(cubin, "-elf"))
        parts = FUNCTION.split(sass.run_on(cubin, "--dump-sass"))
        for name, body in zip(parts[1::2], parts[2::2]):
            for kernel in QUANTIZE_KERNELS:
                if kernel in name:
                    found.setdefault((target, kernel), []).append(body)
    return found


@pytest.mark.parametrize("kernel", sorted(QUANTIZE_KERNELS))
def test_quantization_kernels_move_16_bytes_and_do_not_spill(kernel, quantize_sass):
    for arch in _ffi.built_archs():
        bodies = quantize_sass.get((arch, kernel), [])
        assert len(bodies) == 6, f"{kernel} on {arch}: {len(bodies)} instantiations, want 3 inputs x 2 outputs"
        for text in bodies:
            missing = [why for pattern, why in QUANTIZE_KERNELS[kernel].items() if not re.search(pattern, text)]
            assert not missing, f"{kernel} on {arch} lacks: " + "; ".join(missing)
            assert not re.search(r"\b(LDL|STL)\b", text), f"{kernel} on {arch} spills to local memory"
            assert not SINGLE_CONVERSION.search(text), f"{kernel} on {arch} converts values to fp8 one at a time"
