"""`pagesim simulate --replicas K --router NAME`: the cluster's files and summaries, and bad
values refused in one line with exit code 2."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pagesim.sim.cli import main


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


COMMON = ("simulate", "--workload", "sharegpt", "--rate", "8", "--duration", "20", "--model", "opt-13b", "--kv-gib", "2",
          "--seed", "3", "--no-progress")


def test_cluster_writes_replica_and_cluster_summaries(tmp_path, capsys):
    out = tmp_path / "cluster"
    rc, stdout, err = run_cli(capsys, *COMMON, "--replicas", "3", "--router", "least-outstanding-requests",
                              "--out", str(out))
    assert rc == 0, err
    summary = json.loads((out / "summary.json").read_text())
    replicas = json.loads((out / "replicas.json").read_text())
    req = pd.read_csv(out / "requests.csv")
    steps = pd.read_csv(out / "steps.csv")
    assert summary["replicas"] == 3 and summary["router"] == "least-outstanding-requests"
    assert [r["replica"] for r in replicas] == [0, 1, 2]
    assert req["replica"].value_counts().sort_index().tolist() == summary["routed_per_replica"]
    assert sum(r["completed"] for r in replicas) == summary["completed"] == (req["status"] == "finished").sum()
    assert set(steps["replica"]) == {0, 1, 2}
    assert [len(steps[steps["replica"] == r]) for r in range(3)] == [r["num_steps"] for r in replicas]
    single = set(json.loads(json.dumps(replicas[0])))  # a replica's summary has a single run's keys
    rc, stdout_single, _ = run_cli(capsys, *COMMON, "--json")
    assert set(json.loads(stdout_single)) - {"workload", "cost_model", "cost_error"} <= single
    assert "replicas / router" in stdout


def test_one_replica_with_a_router_is_the_single_run(capsys):
    rc, one, err = run_cli(capsys, *COMMON, "--replicas", "1", "--router", "round-robin", "--json")
    assert rc == 0, err
    rc, single, _ = run_cli(capsys, *COMMON, "--json")
    one, single = json.loads(one), json.loads(single)
    for key in ("completed", "duration_s", "mean_ttft_ms", "p99_e2el_ms", "mean_itl_ms", "mem_token_states"):
        assert one[key] == single[key], key


@pytest.mark.parametrize("argv, words", [
    (("--replicas", "0"), "--replicas must be a whole number >= 1"),
    (("--replicas", "two"), "--replicas"),
    (("--replicas", "2", "--router", "random"), "unknown router 'random'"),
    (("--replicas", "2", "--router-slack", "-1"), "--router-slack"),
    (("--replicas", "2", "--router", "prefix-affinity"), "needs --prefix-caching"),
    (("--replicas", "2", "--check"), "--check"),
])
def test_bad_cluster_values_are_one_line_and_exit_2(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        rc = main([*COMMON, *argv])
        raise SystemExit(rc)
    _, err = capsys.readouterr()
    assert e.value.code == 2
    assert words in err and len(err.strip().splitlines()) == 1, err


GPUS = ("simulate", "--workload", "sharegpt", "--rate", "8", "--num-requests", "40", "--model", "opt-13b", "--seed", "3",
        "--no-progress")


def test_replica_gpus_give_each_replica_its_gpus_pool(tmp_path, capsys):
    """OPT-13B's KV pool is what is left of 90 % of the GPU after the weights: the H100-80GB
    replica's is larger than the A100-40GB replicas'; the summaries name each replica's GPU and
    pool, the cluster's the mix and their sum."""
    out = tmp_path / "mixed"
    rc, stdout, err = run_cli(capsys, *GPUS, "--replica-gpus", "h100-80gb:1,a100-40gb:2", "--replicas", "3",
                              "--router", "least-kv-usage", "--out", str(out))
    assert rc == 0, err
    summary = json.loads((out / "summary.json").read_text())
    replicas = json.loads((out / "replicas.json").read_text())
    assert [r["gpu"] for r in replicas] == ["h100-80gb", "a100-40gb", "a100-40gb"]
    pools = [r["kv_capacity_tokens"] for r in replicas]
    assert pools[0] > pools[1] == pools[2]
    assert summary["kv_capacity_tokens_per_replica"] == pools and summary["kv_capacity_tokens"] == sum(pools)
    assert summary["gpu"] == summary["replica_gpus"] == "h100-80gb:1,a100-40gb:2"
    # each replica's cost error is its own GPU's (the A100-40GB's measured on its sibling, the 80 GB)
    assert [r["cost_error"]["measured_on"] for r in replicas] == ["h100-80gb", "a100-80gb", "a100-80gb"]
    assert f"h100-80gb ({pools[0]}) a100-40gb ({pools[1]})" in stdout


@pytest.mark.parametrize("argv, words", [
    (("--replica-gpus", "b100:2"), "--replica-gpus: unknown GPU 'b100'"),
    (("--replica-gpus", "h100-80gb:0"), "GPU:COUNT pairs, each count a whole number >= 1"),
    (("--replica-gpus", "h100-80gb:two"), "got 'h100-80gb:two'"),
    (("--replica-gpus", "h100-80gb"), "got 'h100-80gb'"),
    (("--replica-gpus", "h100:1,h100-80gb:1"), "names h100-80gb twice"),
    (("--replica-gpus", "h100-80gb:2,a100-80gb:1", "--replicas", "4"), "makes 3 replicas, but --replicas is 4"),
    (("--replica-gpus", "h100-80gb:2", "--gpu", "a100-80gb"), "give --gpu or --replica-gpus, not both"),
    (("--replica-gpus", "h200-141gb:1,a100-80gb:1", "--model", "mixtral-8x7b"),
     "--replica-gpus a100-80gb: mixtral-8x7b needs 89.0 GiB of a100-80gb"),
])
def test_bad_replica_gpus_are_one_line_and_exit_2(capsys, argv, words):
    rc, _, err = run_cli(capsys, *GPUS, *argv)
    assert rc == 2
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_sglang_runs_in_a_cluster(capsys):
    """SGLang's replicas are routed by their radix trees (tests/sim/core/test_cluster.py)."""
    rc = main(["simulate", "--workload", "sharegpt", "--rate", "4", "--num-requests", "20", "--system", "sglang",
               "--replicas", "2", "--router", "prefix-affinity", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "2 / prefix-affinity" in out