"""jax_cluster.info(): what was built, what device is here, which path a call takes."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_cluster import _ffi
from jax_cluster.planning import routing, tables
from jax_cluster.planning.dense import plan_gemm
from jax_cluster.planning.device import describe


@dataclasses.dataclass(frozen=True)
class Info:
    jax_version: str
    with_kernels: bool
    why_no_kernels: str
    cuda_compiler: str
    built_archs: tuple[str, ...]
    compiled_variants: tuple[str, ...]
    menu_variants: int
    device: str
    device_arch: str | None
    sample_call: str
    sample_path: str
    sample_reason: str
    command_buffers: bool  # whether XLA may trace kernel calls into its CUDA graphs
    record_stage: bool  # whether those that can be are recorded as kernel nodes instead
    route: str  # the dense calls' default route ("measured" or "kernel")

    def __str__(self) -> str:
        lines = [
            f"jax_cluster on jax {self.jax_version}",
            f"kernels: {'yes' if self.with_kernels else 'no: ' + self.why_no_kernels}",
        ]
        if self.with_kernels:
            lines.append(f"  compiler: {self.cuda_compiler}; archs: {', '.join(self.built_archs)}")
            lines.append(f"  {len(self.compiled_variants)} of {self.menu_variants} menu variants compiled:")
            lines.extend(f"    {name}" for name in self.compiled_variants)
        lines.append(f"device: {self.device} -> {self.device_arch or 'XLA fallback'}")
        if self.with_kernels:
            graphs = "traced into XLA's command buffers" if self.command_buffers else "their own thunks"
            if self.command_buffers and self.record_stage:
                graphs += " (recorded as kernel nodes where they can be)"
            lines.append(f"kernel calls: {graphs}; dense calls routed: {self.route}")
        lines.append(f"{self.sample_call} takes the {self.sample_path} path: {self.sample_reason}")
        return "\n".join(lines)


def info(device=None) -> Info:
    ext = _ffi.extension()
    dev = describe(device)
    p = plan_gemm(4096, 4096, 4096, dtype=jnp.bfloat16, device=dev)
    with_kernels = _ffi.with_kernels()
    return Info(
        jax_version=jax.__version__,
        with_kernels=with_kernels,
        why_no_kernels=_ffi.why_no_kernels(),
        cuda_compiler=ext.cuda_compiler if ext is not None else "",
        built_archs=_ffi.built_archs(),
        compiled_variants=tuple(sorted(_ffi.compiled_variant_names())),
        menu_variants=len(tables.load_menu()),
        device=dev.describe(),
        device_arch=dev.arch,
        sample_call="matmul(bf16[4096,4096], bf16[4096,4096])",
        sample_path=p.path,
        sample_reason=p.reason,
        command_buffers=_ffi.command_buffers_enabled(),
        record_stage=_ffi.record_stage_requested(),
        route=routing.default_route(),
    )
