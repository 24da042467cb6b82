"""gpu/hold_timing.device_time_us on a make-believe GPU: a host clock, one stream, kernels of known
length. Worked by hand: 4 kernels of 10 us each, launched 50 us apart by the host, take 40 us on
the device behind a hold and 210 us between events without one (the host's four launches of
50 us, the event passed only once the last kernel has run)."""

from __future__ import annotations

import types

import pytest

from pagesim.gpu import hold_timing


class FakeGPU:
    def __init__(self):
        self.now = 0.0  # host seconds
        self.free_at = 0.0  # when the stream has run everything queued
        self.holds: list[float] = []

    def queue(self, seconds: float) -> float:
        start = max(self.free_at, self.now)
        self.free_at = start + seconds
        return self.free_at

    def module(self):
        gpu = self

        class Event:
            def record(self):
                self.at = gpu.queue(0.0)

            @property
            def done(self):
                return self.at <= gpu.now

            def synchronize(self):
                gpu.now = max(gpu.now, self.at)

        stream = types.SimpleNamespace(synchronize=lambda: setattr(gpu, "now", max(gpu.now, gpu.free_at)))
        cuda = types.SimpleNamespace(Event=Event, get_current_stream=lambda: stream,
                                     get_elapsed_time=lambda s, e: (e.at - s.at) * 1e3)
        return types.SimpleNamespace(cuda=cuda)

    def launches(self, kernels: int, kernel_s: float, launch_s):
        """A launch function: ``kernels`` kernels, the host spending launch_s() before each."""
        def fn():
            for _ in range(kernels):
                self.now += launch_s()
                self.queue(kernel_s)
        return fn


@pytest.fixture
def gpu(monkeypatch):
    g = FakeGPU()
    monkeypatch.setattr(hold_timing.time, "perf_counter", lambda: g.now)

    def hold(seconds):
        g.holds.append(seconds)
        g.queue(hold_timing.HOLD_MARGIN * seconds)
    monkeypatch.setattr(hold_timing, "hold", hold)
    return g


def test_the_kernels_alone_are_timed_behind_the_hold(gpu, monkeypatch):
    monkeypatch.setattr(hold_timing, "_can_hold", lambda: True)
    fn = gpu.launches(4, 10e-6, lambda: 50e-6)
    assert hold_timing.device_time_us(gpu.module(), fn, reps=5, warmup=3) == pytest.approx(40.0)
    # sized from the warm-up launches: 200 us each, plus 20 us
    assert gpu.holds == pytest.approx([220e-6] * 5)


def test_without_a_hold_the_host_gaps_are_timed(gpu, monkeypatch):
    monkeypatch.setattr(hold_timing, "_can_hold", lambda: False)
    fn = gpu.launches(4, 10e-6, lambda: 50e-6)
    assert hold_timing.device_time_us(gpu.module(), fn, reps=5, warmup=3) == pytest.approx(210.0)
    assert gpu.holds == []


def test_a_hold_that_ends_early_is_doubled_and_the_repeat_run_again(gpu, monkeypatch):
    """Warm-up launches of 4 x 10 us size the hold at 2 x (40 + 20) us; the timed ones take 4 x 100 us,
    so the hold ends first and the launch expected doubles: 80, 160 (holds of 200 and 360 us, still
    short), 320 us (a hold of 680 us, which hides them); the second repeat starts there."""
    monkeypatch.setattr(hold_timing, "_can_hold", lambda: True)
    calls = {"n": 0}

    def launch_s():
        calls["n"] += 1
        return 10e-6 if calls["n"] <= 8 else 100e-6  # the 2 warm-up calls' launches are fast
    fn = gpu.launches(4, 10e-6, launch_s)
    assert hold_timing.device_time_us(gpu.module(), fn, reps=2, warmup=2) == pytest.approx(40.0)
    assert gpu.holds == pytest.approx([60e-6, 100e-6, 180e-6, 340e-6, 340e-6])
