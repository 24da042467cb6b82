"""`pagesim simulate --prefill-replicas P --decode-replicas D`: the files, the summary's keys and
printed rows, and bad values refused in one line with exit code 2."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.cli import main
from pagesim.sim.disagg import PHASES

BASE = ("simulate", "--workload", "sharegpt", "--rate", "8", "--num-requests", "40", "--kv-gib", "2",
        "--seed", "3", "--no-progress")
COMMON = BASE + ("--system", "vllm-v1")


def run_cli(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as exit:  # a flag's value refused by the parser (its type)
        rc = exit.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_disaggregated_run_writes_pools_and_phases(tmp_path, capsys):
    out = tmp_path / "disagg"
    # 12 requests (argparse keeps the last --num-requests): --check returns to Python after every
    # iteration, where typing the three replicas' states costs ~20 ms a call
    rc, stdout, err = run_cli(capsys, *COMMON, "--num-requests", "12", "--prefill-replicas", "1", "--decode-replicas", "2",
                              "--decode-gpu", "h100-80gb", "--kv-link", "roce-200", "--goodput", "ttft:2000",
                              "--check", "--out", str(out))
    assert rc == 0, err
    summary = json.loads((out / "summary.json").read_text())
    replicas = json.loads((out / "replicas.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    steps = pd.read_csv(out / "steps.csv")
    assert [r["pool"] for r in replicas] == ["prefill", "decode", "decode"]
    assert [r["gpu"] for r in replicas] == ["a100-40gb", "h100-80gb", "h100-80gb"]
    assert summary["gpu"] == "a100-40gb:1,h100-80gb:2" and summary["gpus"] == 3
    assert summary["kv_link"] == "roce-200" and summary["kv_link_gbytes_per_s"] == 25.0
    assert summary["request_goodput_per_gpu"] == pytest.approx(summary["request_goodput"] / 3)
    assert (req["status"] == "finished").all() and set(req["decode_replica"]) <= {1, 2}
    engine_ttft = req["first_token_s"] - req["arrival_s"]
    np.testing.assert_allclose(sum(req[p] for p in PHASES), engine_ttft, rtol=1e-9)
    assert "mem_in_transfer" in steps and set(steps["pool"]) == {"prefill", "decode"}
    assert summary["transfers"] == 12 and summary["transfer_bytes_total"] == req["transfer_bytes"].sum()
    for row in ("prefill pool", "decode pool", "KV link / transfers", "mean TTFT in phases", "goodput per GPU"):
        assert row in stdout
    assert max(len(line) for line in stdout.splitlines()) <= 100


@pytest.mark.parametrize("flags, message", [
    (("--system", "vllm", "--prefill-replicas", "1", "--decode-replicas", "1"), "--system vllm-v1 only"),
    (("--prefill-replicas", "1"), "give both --prefill-replicas and --decode-replicas"),
    (("--kv-link", "ib-ndr"), "--kv-link is for a disaggregated run"),
    (("--prefill-replicas", "0", "--decode-replicas", "1"), "--prefill-replicas must be a whole number >= 1"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "wifi"), "--kv-link: unknown link 'wifi'"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--replicas", "2"), "--replicas is not available"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--router", "prefix-affinity"),
     "is not offered with disaggregation"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link-gbps", "0"), "--kv-link-gbps: must be > 0"),
    (("--first-token", "prefill"), "--first-token is for a disaggregated run"),
    (("--prefill-replicas", "1", "--decode-replicas", "1", "--client-timeout", "5"),
     "--client-timeout is not modelled with disaggregation yet"),
])
def test_bad_disaggregated_settings_are_refused_in_one_line(capsys, flags, message):
    argv = list(BASE) + (list(flags) if "--system" in flags else ["--system", "vllm-v1", *flags])
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], err
