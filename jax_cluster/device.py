"""What the planner knows about a device: queried from the GPU, or given."""
from __future__ import annotations

import dataclasses
import functools

import jax

from jax_cluster import _ffi


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """Facts about one device. `source` says whether they were queried or given."""
    platform: str                                # "cuda", "cpu", "rocm", ...
    name: str = ""
    compute_capability: tuple[int, int] | None = None
    sm_count: int | None = None
    smem_per_block: int | None = None
    l2_bytes: int | None = None
    device_id: int = 0
    source: str = "given"                        # "queried" | "given"

    @property
    def arch(self) -> str | None:
        """The kernel architecture this device runs, or None for the fallback."""
        if self.platform != "cuda" or self.compute_capability is None:
            return None
        return arch_for_compute_capability(self.compute_capability)


def arch_for_compute_capability(cc: tuple[int, int]) -> str | None:
    """9.0 runs sm90a; 10.0 and 10.3 run sm100a; all else (Ampere, Ada,
    consumer Blackwell 12.x, which lacks tcgen05 and CLC) falls back."""
    if cc == (9, 0):
        return "sm90a"
    if cc in ((10, 0), (10, 3)):
        return "sm100a"
    return None


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
    return _describe_present(jax.devices()[0] if device is None else device)


@functools.cache  # every trace plans; the facts of a present device do not change
def _describe_present(device) -> DeviceInfo:
    if not _is_cuda(device):
        return DeviceInfo(platform=device.platform, name=getattr(device, "device_kind", ""),
                          source="queried")
    device_id = getattr(device, "local_hardware_id", None) or 0
    ext = _ffi.extension()
    facts = ext.query_device(device_id) if _ffi.with_kernels() else None
    if facts is not None:
        return DeviceInfo("cuda", facts["name"], tuple(facts["compute_capability"]),
                          facts["sm_count"], facts["smem_per_block_optin"], facts["l2_bytes"],
                          device_id, "queried")
    cc = tuple(int(x) for x in str(getattr(device, "compute_capability", "0.0")).split("."))
    return DeviceInfo("cuda", device.device_kind, cc, getattr(device, "core_count", None),
                      device_id=device_id, source="queried")
