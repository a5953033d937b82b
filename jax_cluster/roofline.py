"""Arithmetic intensity against the ridge point: is a GEMM compute- or memory-bound?

The peaks are modelled, not queried (CUDA reports neither): dense bf16 tensor
throughput per SM at the boost clock, and HBM bandwidth by product name, else
by architecture. `Plan.explain()` labels them so.
"""
from __future__ import annotations

# dense bf16/f16 tensor-core FLOP/s per SM (H100/H200 SXM: ~989 TFLOP/s on 132
# SMs; B200: ~2250 TFLOP/s on 148 SMs)
_FLOPS_PER_SM = {"sm90a": 989e12 / 132, "sm100a": 2250e12 / 148}
# HBM bytes/s by the device name CUDA reports; the arch default is the
# smallest of its family, so "memory-bound" is never claimed too late.
_BANDWIDTH_BY_NAME = {"H200": 4.8e12, "H100": 3.35e12, "B200": 8.0e12, "GB200": 8.0e12}
_BANDWIDTH_BY_ARCH = {"sm90a": 3.35e12, "sm100a": 8.0e12}


def bytes_moved(m: int, n: int, k: int, batch: int, in_bytes: int, out_bytes: int) -> int:
    """The HBM bytes no schedule avoids: A and B read once, D written once."""
    return batch * ((m * k + k * n) * in_bytes + m * n * out_bytes)


def intensity(m: int, n: int, k: int, batch: int, in_bytes: int, out_bytes: int) -> float:
    """FLOP per byte if A and B are read once and D written once."""
    moved = bytes_moved(m, n, k, batch, in_bytes, out_bytes)
    return 2 * batch * m * n * k / moved if moved else 0.0


def ridge(device) -> tuple[float, float, float] | None:
    """(FLOP/byte, peak FLOP/s, bandwidth bytes/s) of the device, modelled;
    None for a device without a kernel family or an SM count."""
    arch = device.arch
    if arch is None or not device.sm_count:
        return None
    peak = _FLOPS_PER_SM[arch] * device.sm_count
    name = (device.name or "").upper()
    bandwidth = next((bw for key, bw in _BANDWIDTH_BY_NAME.items() if key in name.split()),
                     _BANDWIDTH_BY_ARCH[arch])
    return peak / bandwidth, peak, bandwidth
