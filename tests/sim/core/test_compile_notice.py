"""numba's first compile of the core takes a while: the log says so while it happens, and how long
it took, once a command however many loops and processes compile; a load from numba's cache (well
under COMPILE_NOTICE_S) says nothing."""

from __future__ import annotations

import collections
import logging
import os
import time
import types

import numpy as np
import pytest

from pagesim.sim.core.events import replay


class SlowDispatcher:
    """Stands for numba's dispatcher: ``compile`` takes ``seconds``, a miss of numba's cache
    (``Dispatcher.stats``)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.stats = types.SimpleNamespace(cache_misses=collections.Counter())

    def typeof_pyval(self, s):
        return "state type"

    def compile(self, signature):
        time.sleep(self.seconds)
        self.stats.cache_misses[signature] += 1
        return "machine code"


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.setattr(replay, "COMPILED", True)
    monkeypatch.setattr(replay, "COMPILE_NOTICE_S", 0.05)
    monkeypatch.setattr(replay, "_NOTICE", [])
    monkeypatch.setattr(replay, "_ENTRIES", {})
    monkeypatch.delenv(replay.NOTICE_KEY, raising=False)


def test_a_slow_compile_is_announced_while_it_runs_and_timed(compiled, caplog):
    caplog.set_level(logging.INFO, logger="pagesim")
    assert replay.compiled_entry(SlowDispatcher(0.3), (np.zeros(2),)).args[0] == "machine code"  # (its set-up wraps it)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("compiling the simulator's core with numba")
    assert f"about {replay.FAMILY_COMPILE_S} s of CPU for each scheduler family" in lines[0]
    assert lines[1].startswith("compiled the simulator's core in 0 s")


def test_a_second_compile_of_the_process_says_nothing(compiled, caplog):
    caplog.set_level(logging.INFO, logger="pagesim")
    replay.compiled_entry(SlowDispatcher(0.3), (np.zeros(2),))
    replay.compiled_entry(SlowDispatcher(0.3), (np.zeros((2, 2)),))  # another loop's types
    assert len(caplog.records) == 2


def test_one_notice_for_the_processes_of_a_command(compiled, caplog, tmp_path, monkeypatch):
    """A command's worker processes share its marker file: the first to create it says the
    notice, the others nothing."""
    caplog.set_level(logging.INFO, logger="pagesim")
    marker = tmp_path / "notice"
    monkeypatch.setenv(replay.NOTICE_KEY, str(marker))
    marker.touch()  # another process of the command said it
    replay.compiled_entry(SlowDispatcher(0.3), (np.zeros(2),))
    assert caplog.records == []
    marker.unlink()
    monkeypatch.setattr(replay, "_NOTICE", [])  # a new process of the command: it says it, and claims it
    replay.compiled_entry(SlowDispatcher(0.3), (np.zeros(3),))
    assert len(caplog.records) == 2 and marker.exists()


def test_the_command_names_its_marker_and_removes_it(monkeypatch, capsys):
    from pagesim.sim.cli import main

    monkeypatch.delenv(replay.NOTICE_KEY, raising=False)
    seen = []
    monkeypatch.setattr("pagesim.experiments.simulate_cli.run", lambda args: seen.append(os.environ[replay.NOTICE_KEY]))
    assert main(["simulate"]) == 0
    [marker] = seen
    assert replay.NOTICE_KEY not in os.environ and not os.path.exists(marker)


def test_a_load_from_numbas_cache_says_nothing(compiled, caplog):
    caplog.set_level(logging.INFO, logger="pagesim")
    assert replay.compiled_entry(SlowDispatcher(0.0), (np.zeros(2),)).args[0] == "machine code"
    time.sleep(0.1)  # past the notice's delay: it was cancelled
    assert caplog.records == []
