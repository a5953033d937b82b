"""Generates common/contract.h, the C++ side of jax_cluster/planning/contract.json.

Run by CMake at configure time: gen_contract.py PLANNING_DIR OUT_DIR
writes OUT_DIR/common/contract.h, rewriting it only when its text changes:
the Plan's fields, the schedule, raster and activation enums with their
names, the allowed swizzles, each arch's compute capabilities, the dtypes and
the FFI target names. The header includes no XLA or CUDA header: kernels
include it too.
"""

import importlib.util
import pathlib
import sys

CPP_TYPES = {"int": "int64_t", "str": "std::string_view"}

PREAMBLE = """\
// Generated from jax_cluster/planning/contract.json by cc/gen_contract.py; do not edit.
// The tables C++ shares with Python. No XLA or CUDA header: kernels include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
"""

INDEX_OF = """\
// The position of `item` in one of the tables above, or -1.
template <class T, size_t N, class U>
constexpr int index_of(const T (&table)[N], const U& item) {
  for (size_t i = 0; i < N; ++i)
    if (table[i] == item) return static_cast<int>(i);
  return -1;
}
"""


def load_tables(planning_dir: pathlib.Path):
    spec = importlib.util.spec_from_file_location("jax_cluster_tables", planning_dir / "tables.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses looks the module up while it runs
    spec.loader.exec_module(mod)
    return mod


def camel(name: str) -> str:
    return "k" + "".join(part.capitalize() for part in name.split("_"))


def choices(items) -> str:
    """'a, b or c', for messages."""
    items = [str(i) for i in items]
    return ", ".join(items[:-1]) + " or " + items[-1] if len(items) > 1 else items[0]


def x_macro(name: str, rows) -> str:
    lines = [f"#define {name}(X)"] + [f"  X({', '.join(map(str, row))})" for row in rows]
    return " \\\n".join(lines) + "\n"


def enum(type_name: str, names, numbered: bool = False) -> str:
    """The enum (values are list positions), its names and the message text."""
    enumerators = ", ".join(f"{camel(n)} = {i}" for i, n in enumerate(names))
    quoted = ", ".join(f'"{n}"' for n in names)
    listed = choices(f"{i} ({n})" if numbered else n for i, n in enumerate(names))
    return (
        f"enum class {type_name} : int {{ {enumerators} }};\n"
        f"inline constexpr std::string_view k{type_name}Names[] = {{{quoted}}};\n"
        f'inline constexpr const char k{type_name}Choices[] = "{listed}";\n'
        f"constexpr std::string_view name({type_name} v) {{ "
        f"return k{type_name}Names[static_cast<int>(v)]; }}\n"
    )


def header(t) -> str:
    ffi = t.FFI_DTYPES
    capabilities = ", ".join(
        f'{{"{arch}", {major}, {minor}}}' for arch, ccs in t.ARCH_CAPABILITIES.items() for major, minor in ccs
    )
    scaled = ", ".join(f'"{n}"' for n in t.BLOCK_SCALED_DTYPES)
    storage = {}  # FFI enumerator -> the first dtype name that has it
    for name in t.DTYPE_BYTES:
        storage.setdefault(ffi[name], name)
    values = ", ".join(f'{{"{n}", "{storage[ffi[n]]}"}}' for n in t.DTYPE_BYTES)
    parts = [
        PREAMBLE,
        "// The Plan's kernel fields, in the order of the struct: X(type, name).\n"
        + x_macro("JAX_CLUSTER_PLAN_FIELDS", [(CPP_TYPES[ty], n) for n, ty in t.PLAN_FIELDS]),
        "// The element types, one per xla::ffi::DataType: X(name, bytes, enumerator).\n"
        + x_macro("JAX_CLUSTER_DTYPES", [(n, t.DTYPE_BYTES[n], ffi[n]) for n in storage.values()]),
        "namespace jax_cluster {\n",
        "// Each dtype name and the name of the element type its buffers hold\n"
        "// (mxe4m3's values are e4m3's; only their scales differ).\n"
        "struct ValueDtype {\n  std::string_view name, value;\n};\n"
        f"inline constexpr ValueDtype kValueDtypes[] = {{{values}}};\n"
        "// fp8 dtypes: their A and B come with block scales (the scaled-GEMM target).\n"
        f"inline constexpr std::string_view kBlockScaledDtypes[] = {{{scaled}}};\n"
        f"inline constexpr int kScaleBlock = {t.SCALE_BLOCK};\n"
        f'inline constexpr std::string_view kMxDtype = "{t.MX_DTYPE}";\n'
        f"inline constexpr int kMxScaleBlock = {t.MX_SCALE_BLOCK};\n"
        "// The most groups a decode row takes (its group table lives in shared memory).\n"
        f"inline constexpr int kDecodeMaxGroups = {t.DECODE_MAX_GROUPS};\n"
        "// The warps of a block-scaled decode CTA, each owning tile_n / this many columns.\n"
        f"inline constexpr int kDecodeBlockwiseWarps = {t.DECODE_BLOCKWISE_WARPS};\n"
        "// A bf16/f16 decode item of up to this many rows reads A in registers.\n"
        f"inline constexpr int kDecodeRegisterRows = {t.DECODE_REGISTER_ROWS};\n"
        "// The gated epilogue's B: gate and up columns alternate in blocks of this many.\n"
        f"inline constexpr int kGateBlock = {t.GATE_BLOCK};\n",
        "// Enumerator values are positions in the table; k*Names[value] is its name.\n"
        + enum("Schedule", t.SCHEDULES),
        enum("Raster", t.RASTERS),
        "// The fused epilogue's activation attribute is the enumerator's value.\n"
        + enum("Activation", list(t.ACTIVATIONS), numbered=True),
        f"inline constexpr int64_t kSwizzles[] = {{{', '.join(map(str, t.SWIZZLES))}}};\n"
        f'inline constexpr const char kSwizzleChoices[] = "{choices(t.SWIZZLES)}";\n',
        "// The compute capabilities each arch's machine code runs on, one row each.\n"
        "struct ArchCapability {\n  std::string_view arch;\n  int cc_major, cc_minor;\n};\n"
        f"inline constexpr ArchCapability kArchCapabilities[] = {{{capabilities}}};\n",
        "// The FFI custom call targets.\n"
        + "".join(
            f'inline constexpr const char {camel(key)}Target[] = "{name}";\n' for key, name in t.FFI_TARGETS.items()
        ),
        INDEX_OF,
        "}  // namespace jax_cluster\n",
    ]
    return "\n".join(parts)


def main(planning_dir: str, out_dir: str) -> None:
    path = pathlib.Path(out_dir) / "common" / "contract.h"
    text = header(load_tables(pathlib.Path(planning_dir)))
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    print(path)


if __name__ == "__main__":
    main(*sys.argv[1:])
