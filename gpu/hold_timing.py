"""Device time of a launch function: its kernels queued behind a hold kernel, then timed back to back.

Timed as launched, a function of many small kernels measures the host: on the H100 of 2026-11-26
one llama-2-7b layer's four matmuls and four fused element-wise kernels took 0.67-0.75 ms between
CUDA events at 1 to 1024 tokens (benchmarks/results/2026-11-26-h100-80gb-hbm3, phase1 calibration),
against 0.18 ms for the matmuls alone on 2026-11-23: the difference was the launches of the
CuPy kernels, the GPU idle between them. A hold kernel (``torch.cuda._sleep``) keeps the GPU busy
until every kernel is queued, so the events time the kernels alone, as a serving engine's CUDA
graphs run them. The validation's runner (gpu/model_runner.py) holds its steps by this rule too.
"""

from __future__ import annotations

import functools
import statistics
import time

#: the hold lasts this many times the launch time expected (measured over the warm-up calls)
HOLD_MARGIN = 2.0
#: a repeat whose hold ended before its last launch is run again with the hold doubled, this often
RETRIES = 4


@functools.lru_cache(maxsize=1)
def clock_hz() -> float:
    """The SM clock the hold kernel counts cycles of, at its nominal rate (a hold cut short by a
    faster actual clock shows as a launch not hidden)."""
    rate_khz = None
    try:
        import cupy as cp
        rate_khz = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["clockRate"]
    except Exception:  # no CuPy: H100/H200 boost clocks are about 2 GHz
        pass
    return 1e3 * float(rate_khz or 2.0e6)


def hold(seconds: float) -> None:
    """Queue a kernel that keeps torch's current stream busy for HOLD_MARGIN x ``seconds``."""
    import torch
    torch.cuda._sleep(int(HOLD_MARGIN * seconds * clock_hz()))


def _can_hold() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def device_time_us(cp, fn, reps: int = 20, warmup: int = 3, before=None) -> float:
    """Median microseconds between CUDA events around ``fn()``'s kernels, launched behind a hold.

    ``before`` (an L2 flush, say) runs ahead of the hold, outside the timed span. CuPy's events and
    torch's hold share the legacy default stream, where both libraries launch unless told otherwise.
    Without torch the launches are timed as they come (no hold), the host's gaps included."""
    stream = cp.cuda.get_current_stream()
    launch = []
    for _ in range(warmup):
        stream.synchronize()
        t0 = time.perf_counter()
        fn()
        launch.append(time.perf_counter() - t0)
    stream.synchronize()
    held = _can_hold()
    expect = statistics.median(launch) if launch else 1e-3
    ts = []
    for _ in range(reps):
        for _attempt in range(RETRIES + 1):
            if before is not None:
                before()
            s, e = cp.cuda.Event(), cp.cuda.Event()
            if held:
                hold(expect + 20e-6)
            s.record()
            fn()
            hidden = not s.done  # the hold still running once everything was queued
            e.record()
            e.synchronize()
            if hidden or not held:
                break
            expect *= 2
        ts.append(cp.cuda.get_elapsed_time(s, e) * 1e3)
    return float(statistics.median(ts))
