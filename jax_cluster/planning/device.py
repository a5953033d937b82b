"""What the planner knows about a device: queried from the GPU, or given."""

from __future__ import annotations

import dataclasses
import functools

import jax

from jax_cluster import _ffi
from jax_cluster.planning import tables


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """Facts about one device. `source` says whether they were queried or given."""

    platform: str  # "cuda", "cpu", "rocm", ...
    name: str = ""
    compute_capability: tuple[int, int] | None = None
    sm_count: int | None = None
    smem_per_block: int | None = None
    l2_bytes: int | None = None
    device_id: int = 0
    source: str = "given"  # "queried" | "given"

    @property
    def arch(self) -> str | None:
        """The kernel architecture this device runs, or None for the fallback."""
        if self.platform != "cuda" or self.compute_capability is None:
            return None
        return arch_for_compute_capability(self.compute_capability)

    def describe(self) -> str:
        """One line for messages: name, compute capability and SMs where known."""
        parts = [self.name if self.name and self.name != self.platform else self.platform.upper()]
        if self.compute_capability is not None:
            parts.append(f"compute capability {self.compute_capability[0]}.{self.compute_capability[1]}")
        if self.sm_count:
            parts.append(f"{self.sm_count} SMs")
        return ", ".join(parts)


def arch_for_compute_capability(cc: tuple[int, int]) -> str | None:
    """The arch whose machine code runs on `cc` (contract.json's "archs"), or
    None: arch-specific SASS runs on its exact capability only, so 10.3
    (B300), 12.x (consumer Blackwell, no tcgen05 or CLC), Ampere and Ada fall back."""
    return tables.arch_for_compute_capability(cc)


def _is_cuda(device) -> bool:
    if device.platform == "cuda":
        return True
    version = getattr(device.client, "platform_version", "") or ""
    return device.platform == "gpu" and "cuda" in version.lower()


def describe(device=None) -> DeviceInfo:
    """DeviceInfo for a jax Device (default: the default backend's first one).

    A DeviceInfo passes through unchanged, so tests and exports can describe a
    device that is not present.
    """
    if isinstance(device, DeviceInfo):
        return device
    if device is not None and not hasattr(device, "platform"):
        raise TypeError(
            "device must be a jax Device or a jax_cluster.DeviceInfo (for one that is not present), "
            f"got {type(device).__name__} {device!r}"
        )
    return _describe_present(jax.devices()[0] if device is None else device)


@functools.cache  # every trace plans; the facts of a present device do not change
def _describe_present(device) -> DeviceInfo:
    if not _is_cuda(device):
        return DeviceInfo(platform=device.platform, name=getattr(device, "device_kind", ""), source="queried")
    device_id = getattr(device, "local_hardware_id", None) or 0
    ext = _ffi.extension()
    facts = ext.query_device(device_id) if _ffi.with_kernels() else None
    if facts is not None:
        return DeviceInfo(
            "cuda",
            facts["name"],
            tuple(facts["compute_capability"]),
            facts["sm_count"],
            facts["smem_per_block_optin"],
            facts["l2_bytes"],
            device_id,
            "queried",
        )
    major, minor = (int(x) for x in str(getattr(device, "compute_capability", "0.0")).split(".")[:2])
    cc = (major, minor)
    return DeviceInfo(
        "cuda", device.device_kind, cc, getattr(device, "core_count", None), device_id=device_id, source="queried"
    )
