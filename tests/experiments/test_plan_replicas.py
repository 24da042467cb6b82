"""`plan resources --router`: replicas searched behind the real router, beside rate/k."""

from __future__ import annotations

import json

from pagesim.experiments import plan as P
from pagesim.experiments.run_spec import RunSpec
from pagesim.sim.cli import main


class PassFrom:
    """A runner whose cluster passes the SLO from ``k`` replicas on; it keeps the replicas asked."""

    def __init__(self, k: int):
        self.k = k
        self.asked: list[int] = []

    def evaluate(self, specs):
        self.asked += [s.replicas for s in specs]
        return [{"passed": s.replicas >= self.k, "output_throughput": 10.0 * s.replicas} for s in specs]


def spec_of(k: int) -> RunSpec:
    return RunSpec(system="vllm", rate=8.0, replicas=k, router="least-outstanding-requests")


def test_routed_replicas_goes_up_from_a_low_estimate():
    runner = PassFrom(3)
    k, point = P.routed_replicas(runner, spec_of, 1, 10)
    assert (k, runner.asked) == (3, [1, 2, 3])
    assert point["output_throughput"] == 30.0


def test_routed_replicas_goes_down_from_a_high_estimate():
    runner = PassFrom(3)
    assert P.routed_replicas(runner, spec_of, 5, 10)[0] == 3
    assert runner.asked == [5, 4, 3, 2]  # 2 fails: 3 is the fewest


def test_routed_replicas_gives_up_at_the_cap():
    runner = PassFrom(9)
    assert P.routed_replicas(runner, spec_of, 2, 4) == (None, None)
    assert runner.asked == [2, 3, 4]


CLI = ["plan", "resources", "--workload", "sharegpt", "--model", "opt-13b", "--gpu", "a100-40gb", "--duration",
       "30", "--max-seq-len", "1024", "--max-len-policy", "truncate", "--rtol", "0.3", "--workers", "1",
       "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1", "--systems", "vllm", "--tp-options", "1",
       "--what-if", "none", "--no-steady-check"]


def test_cli_resources_with_a_router(tmp_path, capsys):
    rc = main(CLI + ["--rate", "4", "--router", "least-outstanding-requests", "--cache-dir", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    row = json.loads(out)["replicas"][0]
    assert row["router"] == "least-outstanding-requests" and row["verified"]
    assert row["replicas"] >= 1 and row["replicas_rate_over_k"] >= 1
    assert row["rate_over_k_off_by"] == row["replicas_rate_over_k"] - row["replicas"]
    assert row["gpus"] == row["replicas"]


def test_cli_refuses_an_unknown_router(tmp_path, capsys):
    assert main(CLI + ["--rate", "4", "--router", "random", "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown router 'random'" in err and len(err.strip().splitlines()) == 1



def test_the_kv_search_stays_within_what_the_gpu_holds_beside_the_weights(tmp_path, capsys):
    # OPT-13B's 23.9 GiB of weights leave 16.08 GiB of an A100-40GB's 40 GiB for KV: the search
    # probes no more (a larger --kv-gib is refused) and says so when even that misses the SLO
    rc = main(CLI + ["--rate", "20", "--cache-dir", str(tmp_path), "--json"])
    result = json.loads(capsys.readouterr().out)
    kv = [p["kv_gib"] for p in result["points"] if p["search"] == "kv/vllm"]
    assert rc == 0 and kv and max(kv) <= 16.09
    assert result["kv"][0]["note"] == ("no KV size up to 16.08 GiB (all a100-40gb holds beside the weights) meets "
                                       "the SLO at 20 req/s")
