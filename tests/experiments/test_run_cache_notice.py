"""A command says when the run cache answered: the cache (``~/.cache/pagesim/runs``) is shared by
every checkout and environment, so a "first" run may be a read of runs made elsewhere. One
notice on stderr says how many runs came from it, where, and that ``--no-cache`` reruns them;
a command that computed every run (the first, or any with ``--no-cache``) says nothing."""

from __future__ import annotations

import logging

import pytest

from pagesim.experiments import run_cache
from pagesim.experiments.run_spec import RunSpec
from pagesim.experiments.sweep import run_sweep
from pagesim.sim.cli import main
from tests.experiments.fakes import fake_run


@pytest.fixture
def fake_engine(monkeypatch):
    import pagesim.experiments.sweep as S
    monkeypatch.setattr(S, "simulate_spec", fake_run)
    monkeypatch.setenv("COLUMNS", "100")


def cache_lines(err: str) -> list[str]:
    """The cache notices in ``err``, each joined from the lines it wraps into (none past 100)."""
    assert max(map(len, err.splitlines()), default=0) <= 100
    notices = " ".join(err.splitlines()).replace("   ", " ").split("pagesim: ")
    return ["pagesim: " + n.strip() for n in notices if "from the run cache" in n]


def test_reproduce_twice_the_second_says_the_cache_answered(fake_engine, tmp_path, capsys):
    argv = ["reproduce", "fig2", "--out", str(tmp_path / "out"), "--quick", "--workers", "1", "--no-progress",
            "--cache-dir", str(tmp_path / "c")]
    assert main(argv) == 0
    assert cache_lines(capsys.readouterr().err) == []  # every run computed
    assert main(argv) == 0
    (line,) = cache_lines(capsys.readouterr().err)
    runs = len({p.parent for p in (tmp_path / "c").rglob("summary.json")})
    assert line == f"pagesim: {runs} of {runs} runs came from the run cache {tmp_path / 'c'}: --no-cache reruns them"
    assert main(argv + ["--no-cache"]) == 0
    assert cache_lines(capsys.readouterr().err) == []


def test_the_line_names_the_home_folder_as_tilde_and_fits_100_columns(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    tally = run_cache.CommandTally(recompute=False, computed={"k1"})
    tally.answered[tmp_path / ".cache" / "pagesim" / "runs"] = {"k1", "k2", "k3"}
    line = tally.line()
    assert line == "2 of 3 runs came from the run cache ~/.cache/pagesim/runs: --no-cache reruns them"
    assert len("pagesim: " + line) <= 100


def test_no_cache_reruns_each_run_once_whatever_a_later_sweep_asks(tmp_path, caplog):
    """A figure's later sweeps ask for the cache (they reuse what its first computed): under
    --no-cache they reuse only what this command computed, never an entry found there."""
    calls = []

    def counting(spec):
        calls.append(spec.label())
        return fake_run(spec)

    a, b = RunSpec(system="vllm", rate=1.0, num_requests=20), RunSpec(system="vllm", rate=2.0, num_requests=20)
    run_sweep([a], workers=1, cache_dir=tmp_path, progress=False, run_fn=counting)  # an earlier command's
    assert len(calls) == 1
    with caplog.at_level(logging.INFO, logger="pagesim"):
        with run_cache.telling_cache_answers(recompute=True):
            run_sweep([b], workers=1, cache_dir=tmp_path, progress=False, run_fn=counting, use_cache=False)
            run_sweep([a, b], workers=1, cache_dir=tmp_path, progress=False, run_fn=counting)
        assert len(calls) == 3  # a rerun, b once
        assert not [r for r in caplog.records if "run cache" in r.getMessage()]
        with run_cache.telling_cache_answers(recompute=False):
            run_sweep([a, b], workers=1, cache_dir=tmp_path, progress=False, run_fn=counting)
        assert len(calls) == 3
        (record,) = [r for r in caplog.records if "run cache" in r.getMessage()]
        assert record.getMessage().startswith("2 of 2 runs came from the run cache")
    assert run_cache.command_tally() is None  # a library caller's sweeps are not tallied
