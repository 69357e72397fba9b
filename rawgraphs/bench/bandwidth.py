"""The physical floor of a decode step: measured device-to-device copy bandwidth and bytes a step must move."""

from __future__ import annotations

from cuda.bindings import driver

from ..context import Stream
from ..errors import check
from ..memory import DeviceBuffer
from .stats import summarize
from .timing import time_gpu

__all__ = ["copy_bandwidth_gbs", "step_bytes", "floor_ms"]


def copy_bandwidth_gbs(stream: Stream, nbytes: int = 1 << 30) -> float:
    """Median HBM bandwidth of a large device-to-device copy, counting bytes read plus bytes written (GB/s)."""
    with DeviceBuffer(nbytes) as src, DeviceBuffer(nbytes) as dst:
        src.fill_bytes(0x5A)

        def copy():
            check(driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, stream.handle), "cuMemcpyDtoDAsync")

        us = summarize(time_gpu(copy, stream, warmup=3, iters=5, repeats=9)).median
    return 2 * nbytes / (us * 1e-6) / 1e9


def step_bytes(cfg, contexts) -> int:
    """Bytes one decode step must read at least: every weight once, plus each active row's K and V."""
    return cfg.weight_bytes() + cfg.kv_bytes_per_token() * int(sum(max(0, c) for c in contexts))


def floor_ms(cfg, contexts, gbs: float) -> float:
    """The bandwidth floor of one step in milliseconds at ``gbs`` GB/s."""
    return step_bytes(cfg, contexts) / (gbs * 1e9) * 1e3
