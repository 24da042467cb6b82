"""benchmarks/validation_schedule_replay.py on a validation the fake backend ran: the replay, fed the
run's own step times, takes the same decisions at every step and adds the longest decode context;
given other options it refuses, naming the difference."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from pagesim.sim.cli import main as cli

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import validation_schedule_replay as replay  # noqa: E402

ARGS = ["--workload", "sharegpt", "--rate", "4", "--num-requests", "12", "--model", "llama-2-7b", "--gpu", "h100",
        "--system", "vllm", "--kv-gib", "1", "--max-seq-len", "1024", "--max-len-policy", "truncate",
        "--no-progress", "--seed", "3"]


def test_the_replay_takes_the_runs_decisions_and_adds_the_longest_context(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PAGESIM_JIT", "0")
    assert cli(["validate", *ARGS, "--backend", "fake", "--out", str(tmp_path / "run")]) == 0
    run = pd.read_csv(tmp_path / "run" / "steps.csv")
    steps = replay.replay(run.drop(columns=["max_decode_context"]), tmp_path / "again", ARGS)
    assert (steps["max_decode_context"] == run["max_decode_context"]).all()
    assert (steps["max_decode_context"] <= steps["sum_decode_context"]).all()
    capsys.readouterr()
    assert replay.main([str(tmp_path / "run" / "steps.csv"), "--out", str(tmp_path / "third"), "--", *ARGS]) == 0
    out = capsys.readouterr().out
    assert "decode steps with their launches hidden" in out and out.count("measured a=") == 3
    other = [a if a != "4" else "40" for a in ARGS]  # another rate: other arrivals per step
    with pytest.raises(SystemExit, match="the replay's schedule differs"):
        replay.replay(run, tmp_path / "fourth", other)
