"""The max-length policy has one source, SimConfig.max_len_policy: --max-len-policy or a --config file."""

from __future__ import annotations

import json

import pytest

from pagesim.sim.cli import main

# two requests: 3000 + 10 tokens does not fit max_seq_len 2048, 100 + 10 does
TRACE = "t,p,o\n0,3000,10\n1,100,10\n"


def _simulate(write, capsys, *extra):
    path = write("long.csv", TRACE)
    rc = main(["simulate", "--trace", str(path), "--columns", "prompt=p,output=o,arrival=t", "--max-seq-len", "2048",
               "--json", "--no-progress", *extra])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_toml_max_len_policy_is_applied(write, capsys, tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('max_len_policy = "drop"\n')
    rc, summary, _ = _simulate(write, capsys, "--config", str(toml))
    assert rc == 0 and summary["workload"]["max_len"]["dropped"] == 1 and summary["completed"] == 1
    # without the file: the default policy, error (one line, exit 2)
    rc, _, err = _simulate(write, capsys)
    assert rc == 2 and "max_seq_len 2048" in err and err.count("\n") == 1


def test_flag_wins_over_toml(write, capsys, tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('max_len_policy = "drop"\n')
    rc, summary, _ = _simulate(write, capsys, "--config", str(toml), "--max-len-policy", "clip-prompt")
    assert rc == 0 and summary["workload"]["max_len"]["policy"] == "clip-prompt"
    assert summary["completed"] == 2  # 3000 + 10 clipped to 2038 + 10


def test_plan_probes_take_the_toml_policy(tmp_path):
    from pagesim.experiments.plan_cli import setup_from_args
    from pagesim.sim.cli import build_parser
    from pagesim.experiments.probe import decode_workload
    toml = tmp_path / "c.toml"
    toml.write_text('max_len_policy = "truncate"\n')
    args = build_parser().parse_args(["plan", "--config", str(toml), "--slo-ttft-p99", "2"])
    setup, *_ = setup_from_args(args)
    assert setup.sim["max_len_policy"] == "truncate"
    assert decode_workload(setup.workload)["max_len_policy"] == "truncate"


def test_unknown_toml_policy_is_refused(write, capsys, tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text('max_len_policy = "clip"\n')
    rc, _, err = _simulate(write, capsys, "--config", str(toml))
    assert rc == 2 and "unknown max_len_policy 'clip'" in err and "clip-prompt" in err


@pytest.mark.parametrize("policy", ["error", "drop", "truncate", "clip-prompt"])
def test_config_and_cli_offer_the_same_policies(policy):
    from pagesim.sim.config import SimConfig
    assert SimConfig(max_len_policy=policy).max_len_policy == policy
