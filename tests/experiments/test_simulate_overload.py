"""``pagesim simulate`` says when a run's arrivals outran its service (sim.metrics.overload_summary):
README's own priority example (12 req/s of ShareGPT into Llama-2-13B on an A100-40GB) is one."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pagesim.sim.cli import main
from pagesim.sim.terminal import WIDTH

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_command(needle: str) -> list[str]:
    """The README's ``pagesim`` command whose text holds ``needle``, its continuation lines joined."""
    text = README.read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.startswith("pagesim ") and needle in line]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[1:]


def test_readme_priority_example_says_it_is_overloaded(capsys):
    argv = readme_command("--scheduling-policy priority")
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= WIDTH for line in out.splitlines())
    row = re.search(r"^overloaded +(.*?)\n(?=\S)", out, re.S | re.M)
    assert row, out
    words = " ".join(row.group(1).split())
    m = re.fullmatch(r"requests arrived at ([\d.]+) req/s and finished at ([\d.]+) req/s while arriving; "
                     r"([\d,]+) waited for a first token at the last arrival; latency percentiles describe a "
                     r"queue that grows with the run's length", words)
    assert m, words
    arrived, finished, waiting = float(m[1]), float(m[2]), int(m[3].replace(",", ""))
    assert 11 < arrived < 13 and finished < arrived / 2 and waiting > 500


def test_a_run_that_keeps_up_says_nothing(capsys):
    """2 req/s of ShareGPT for 5 s (10 requests) on OPT-13B: the queue never holds 10."""
    assert main(["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "5", "--no-progress"]) == 0
    assert "overloaded" not in capsys.readouterr().out
