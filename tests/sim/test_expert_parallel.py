"""Expert parallel as a setting (``SimConfig.expert_parallel``, ``--expert-parallel``): the
replicas of a cluster become one group's data-parallel ranks, and what it cannot be is refused in
one line. Its price is worked by hand in tests/sim/test_cost_moe.py."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pagesim.sim.cli import main
from pagesim.sim.cluster import replica_groups
from pagesim.sim.core.price import cost as C
from pagesim.sim.config import SimConfig
from pagesim.sim.cost.models import make_cost_model
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import prepare
from pagesim.sim.specs import get_gpu, get_model


def test_replicas_become_the_ranks_of_one_group():
    cfg = SimConfig.for_system("vllm-v1", model="mixtral-8x7b", gpu="h100-80gb", tensor_parallel=2,
                               expert_parallel=True)
    [(rank, count)] = replica_groups(cfg, 4)
    assert count == 4 and rank.data_parallel == 4 and rank.expert_group == 8  # TP 2 x 4 ranks
    assert cfg.expert_group == 2  # one engine: its TP group
    plain = SimConfig.for_system("vllm-v1", model="mixtral-8x7b", gpu="h100-80gb", tensor_parallel=2)
    assert replica_groups(plain, 4)[0][0].data_parallel == 1 and plain.expert_group == 1


def test_data_parallel_ranks_need_expert_parallel():
    with pytest.raises(ConfigError, match="give --expert-parallel with --replicas K"):
        SimConfig.for_system("vllm-v1", model="mixtral-8x7b", data_parallel=2)


def test_cost_models_that_do_not_price_it_refuse_it():
    with pytest.raises(ConfigError, match="not by --cost-model calibrated"):
        make_cost_model(get_model("mixtral-8x7b"), get_gpu("h100-80gb"), 2, cost_model="calibrated",
                        expert_group=2)
    with pytest.raises(ConfigError, match="not by a --profile table"):
        make_cost_model(get_model("mixtral-8x7b"), get_gpu("h100-80gb"), 2, profile="any.csv", expert_group=2)


def test_each_rank_is_priced_for_the_group():
    """The replicas' cost models carry the group: 2 ranks of TP 2, the experts over 4 GPUs."""
    cfg = SimConfig.for_system("vllm-v1", model="mixtral-8x7b", gpu="h100-80gb", tensor_parallel=2,
                               expert_parallel=True)
    [(rank, _)] = replica_groups(cfg, 2)
    trace = pd.DataFrame({"request_id": ["r0"], "arrival_s": [0.0], "prompt_tokens": [8], "output_tokens": [2]})
    c = prepare(rank, trace).cost_model.constants()
    assert (c[C.DATA_PARALLEL], c[C.EXPERT_GROUPS]) == (2.0, 4.0) and c[C.ALL_TO_ALL_FIXED_S] > 0


@pytest.mark.parametrize("argv, fragment", [
    (["--model", "llama-3.1-8b"], "llama-3.1-8b has none"),
    (["--model", "mixtral-8x7b", "--tp", "2", "--replica-gpus", "h100-80gb:2"], "not --replica-gpus"),
    (["--model", "mixtral-8x7b", "--tp", "4", "--replicas", "4"], "would leave GPUs without an expert"),
    # 4 of the 8 experts (45 GiB) and the rest on each of 2 A40s: more than its 41.4 usable GiB
    (["--model", "mixtral-8x7b", "--gpu", "a40", "--replicas", "2"], "try --tp 4 or more --replicas"),
    (["--model", "mixtral-8x7b", "--tp", "2", "--system", "vllm"], "expert_parallel=True applies to"),
    (["--model", "mixtral-8x7b", "--tp", "2", "--prefill-replicas", "1", "--decode-replicas", "1"],
     "not modelled with --prefill-replicas"),
])
def test_refused_in_one_line(capsys, argv, fragment):
    system = [] if "--system" in argv else ["--system", "vllm-v1"]
    gpu = [] if "--replica-gpus" in argv or "--gpu" in argv else ["--gpu", "h100-80gb"]
    rc = main(["simulate", "--workload", "sharegpt", "--rate", "1", "--num-requests", "5", *gpu,
               "--expert-parallel", *system, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and fragment in err[0]


def test_plan_searches_one_engine_and_sizes_a_group_behind_a_router(capsys, monkeypatch, tmp_path):
    """One engine's experts over its TP GPUs: plan max-rate searches it. plan resources sizes the
    group by cluster runs of its ranks behind the router, each priced as one of K ranks
    (``replica_groups``: data_parallel K), and refuses in one line without a router: one rank at
    rate / k would be priced as if alone."""
    from pagesim.experiments.probe import Runner

    common = ["--systems", "vllm-v1", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--tp", "2",
              "--expert-parallel", "--workload", "sharegpt", "--duration", "60", "--no-progress",
              "--cache-dir", str(tmp_path)]
    assert main(["plan", "max-rate", *common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["config"]["expert_parallel"] is True
    rc = main(["plan", "resources", "--rate", "5", *common])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "sizes an expert-parallel group by running it whole" in err[0]
    seen = []
    evaluate = Runner.evaluate
    monkeypatch.setattr(Runner, "evaluate", lambda self, specs, *a, **k: seen.extend(specs) or evaluate(
        self, specs, *a, **k))
    rc = main(["plan", "resources", "--rate", "60", "--tp-options", "2", "--what-if", "none", "--router",
               "least-outstanding-requests", "--slo-ttft-p99", "1", "--slo-tpot-p99", "0.05", "--no-steady-check",
               *common, "--json"])
    [row] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["replicas"]
    groups = [s for s in seen if s.router is not None]
    assert rc == 0 and row["verified"] and row["replicas"] >= 2 and row["gpus"] == 2 * row["replicas"]
    assert row["replicas"] in {s.replicas for s in groups}
    for s in groups:  # each cluster probe: K ranks of one group, the experts over its TP x K GPUs
        [(rank, count)] = replica_groups(s.sim_config(), s.replicas)
        assert count == s.replicas and rank.data_parallel == s.replicas and rank.expert_group == 2 * s.replicas


def test_a_group_that_fits_only_with_its_experts_split_runs(capsys):
    """Mixtral-8x7B (87 GiB) on 8 A100-80GBs at TP 1: it fits only with its 8 experts split over
    the 8 ranks (one each, about 13 GiB a GPU), and each rank serves; the summary names the
    group's 8 GPUs."""
    rc = main(["simulate", "--model", "mixtral-8x7b", "--gpu", "a100-80gb", "--system", "vllm-v1",
               "--expert-parallel", "--replicas", "8", "--router", "least-outstanding-requests",
               "--workload", "sharegpt", "--rate", "40", "--num-requests", "80", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["completed"] == 80 and summary["expert_group"] == 8
    assert len(summary["routed_per_replica"]) == 8 and min(summary["routed_per_replica"]) > 0


def test_data_parallel_is_not_a_users_setting(tmp_path, capsys):
    """The ranks are the replicas: a config file or an experiment grid that sets them is refused."""
    config = tmp_path / "ep.toml"
    config.write_text('model = "mixtral-8x7b"\nexpert_parallel = true\ndata_parallel = 4\n')
    rc = main(["simulate", "--config", str(config), "--workload", "sharegpt", "--num-requests", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "data_parallel is the replicas of an expert-parallel group" in err[0]
    from pagesim.experiments.run_spec import spec_from_settings

    with pytest.raises(ConfigError, match="data_parallel is the replicas"):
        spec_from_settings({"model": "mixtral-8x7b", "expert_parallel": True, "data_parallel": 2})


def test_the_band_names_the_split_runs_once_the_experts_are_split():
    """At TP 1 without replicas nothing is split (vLLM's EP is off too): no expert-parallel line;
    at TP 2 the band takes the expert-parallel run, counted once though two sets hold it."""
    from pagesim.sim.cost.calibration import run_error_band

    def band(tp, gpu):
        cfg = SimConfig.for_system("vllm-v1", model="mixtral-8x7b", gpu=gpu, tensor_parallel=tp, expert_parallel=True)
        return run_error_band(cfg)["cost_error"]

    assert not any("expert parallel" in line for line in band(1, "h100-80gb")["regime"])
    split = band(2, "h100-80gb")
    assert "expert_parallel" in split["regime_sets"] and split["runs"] == 5  # 4 MoE runs and the split one
    held = band(2, "a100-80gb")  # the split run is a held-out GPU's too: 4 MoE + 4 held out, not 9
    assert held["regime_sets"] == ["moe", "held_out_gpu", "expert_parallel"] and held["runs"] == 8


def test_plan_resources_caps_a_group_at_one_expert_a_gpu(capsys):
    """Mixtral's 8 experts at TP 2: at most 4 ranks. A rate no 4 meet is answered so, not by
    walking to 256 replicas whose every cluster the run refuses (more GPUs than experts)."""
    seen = []
    from pagesim.experiments.probe import Runner

    evaluate = Runner.evaluate
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Runner, "evaluate", lambda self, specs, *a, **k: seen.extend(specs) or evaluate(self, specs, *a, **k))
        rc = main(["plan", "resources", "--rate", "600", "--systems", "vllm-v1", "--model", "mixtral-8x7b", "--gpu",
                   "h100-80gb", "--tp", "2", "--tp-options", "2", "--what-if", "none", "--expert-parallel", "--router",
                   "least-outstanding-requests", "--workload", "sharegpt", "--duration", "20", "--slo-ttft-p99", "1",
                   "--slo-tpot-p99", "0.05", "--no-steady-check", "--no-progress", "--json"])
    [row] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["replicas"]
    assert rc == 2 and row["replicas"] is None and "(4: as many as the group's GPUs have experts)" in row["note"]
    assert max(s.replicas for s in seen if s.router is not None) == 4


def test_a_refused_cluster_ends_the_routed_search():
    """routed_replicas: a cluster the run refuses (an error, not a missed SLO) ends the walk up;
    the refusal is kept for the note, and no larger cluster is run."""
    from types import SimpleNamespace

    from pagesim.experiments.plan import routed_replicas

    asked = []

    class Refusing:
        def evaluate(self, specs):
            k = specs[0].replicas
            asked.append(k)
            return [{"passed": False, "error": "too many" if k >= 4 else None}]

    refused = {}
    k, point = routed_replicas(Refusing(), lambda k: SimpleNamespace(replicas=k), 2, 256, refused)
    assert (k, point) == (None, None) and asked == [2, 3, 4] and refused == {4: "too many"}
