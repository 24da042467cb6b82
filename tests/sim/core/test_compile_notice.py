"""numba's first compile of the core takes minutes: the log says so while it happens, and how long
it took; a load from numba's cache (well under COMPILE_NOTICE_S) says nothing."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from pagesim.sim.core import replay


class SlowDispatcher:
    """Stands for numba's dispatcher: ``compile`` takes ``seconds``."""

    def __init__(self, seconds):
        self.seconds = seconds

    def typeof_pyval(self, s):
        return "state type"

    def compile(self, signature):
        time.sleep(self.seconds)
        return "machine code"


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.setattr(replay, "COMPILED", True)
    monkeypatch.setattr(replay, "COMPILE_NOTICE_S", 0.05)


def test_a_slow_compile_is_announced_while_it_runs_and_timed(compiled, caplog):
    caplog.set_level(logging.INFO, logger="pagesim")
    assert replay.compiled_entry(SlowDispatcher(0.3), (np.zeros(2),)).args[0] == "machine code"  # (its set-up wraps it)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("compiling the simulator's core with numba")
    assert lines[1].startswith("compiled the simulator's core in 0 s")


def test_a_load_from_numbas_cache_says_nothing(compiled, caplog):
    caplog.set_level(logging.INFO, logger="pagesim")
    assert replay.compiled_entry(SlowDispatcher(0.0), (np.zeros(2),)).args[0] == "machine code"
    time.sleep(0.1)  # past the notice's delay: it was cancelled
    assert caplog.records == []
