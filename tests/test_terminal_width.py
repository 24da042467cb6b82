"""Every command prints for a person within a terminal of 100 columns (``COLUMNS=100``):
tables in blocks of columns, sentences wrapped, warnings wrapped under their first line
(``sim.terminal``). ``--help`` is checked in tests/sim/test_cli_registry.py and ``reproduce``
in tests/experiments/test_reproduce_output.py; data for programs (``--json``) is exempt. One
example of each other command, small enough to run in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.sim.cli import main

MEASURED = Path(__file__).resolve().parents[2] / "shared" / "measured"
PLAN = ["--duration", "60", "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1", "--no-progress"]
COMMANDS = {
    "trace stats": ["trace", "stats", "{dir}/t.csv", "--columns", "prompt=p,output=o,arrival=t"],
    "trace synth": ["trace", "synth", "--workload", "sharegpt", "--rate", "2", "--duration", "60",
                    "-o", "{dir}/synth.csv"],
    "simulate, a cluster": ["simulate", "--workload", "sharegpt", "--rate", "20", "--duration", "60",
                            "--replicas", "2", "--no-progress"],
    "simulate, a long cost-model band": ["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "60",
                                         "--gpu", "h200", "--cost-model", "calibrated", "--no-progress"],
    "plan": ["plan", "--workload", "sharegpt", "--systems", "vllm,orca-pow2", *PLAN],
    "plan resources": ["plan", "resources", "--rate", "2", "--workload", "sharegpt", "--tp-options", "1",
                       "--what-if", "block_size=32", *PLAN],
    "plan compare-gpus": ["plan", "compare-gpus", "--gpus", "a100-40gb,h100-80gb", "--model", "llama-2-13b", *PLAN],
    "plan disaggregation": ["plan", "disaggregation", "--rate", "4", "--gpus", "2", "--workload", "sharegpt",
                            "--model", "llama-2-7b", "--gpu", "a100-80gb", "--slo-tpot-p99", "0.001", "--quick",
                            "--max-gpus", "3", *PLAN[2:]],
    "validate one real run": ["validate", "--against", "real_runs_h100", "--run", "llama-2-7b-tp1-general"],
    "cost error": ["cost", "error", "--measured", str(MEASURED), "--model", "llama-2-7b", "--gpu", "a100-80gb"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_line_fits_100_columns(name, tmp_path, monkeypatch, capsys):
    if name == "cost error" and not MEASURED.is_dir():
        pytest.skip("../shared/measured not here")
    monkeypatch.setenv("COLUMNS", "100")
    (tmp_path / "t.csv").write_text("t,p,o\n0,10,5\n1.5,20,5\n3,30,8\n")
    argv = [word.format(dir=tmp_path) for word in COMMANDS[name]]
    assert main(argv) == 0
    printed = capsys.readouterr()
    lines = (printed.out + printed.err).splitlines()
    assert lines
    assert max(map(len, lines)) <= 100, max(lines, key=len)
