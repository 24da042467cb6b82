"""RunSpec's cluster fields (experiments/run_spec.py): a single engine's key unchanged; a
grid over replicas and routers."""

from __future__ import annotations

from pagesim.experiments.run_spec import RunSpec


def test_a_single_engine_spec_keeps_its_key():
    """1 replica and no router: the key and params a spec had before clusters existed."""
    plain = RunSpec(system="vllm", rate=2.0)
    assert "replicas" not in plain.canonical() and "router" not in plain.params()
    assert plain.key(salt="s") == RunSpec(system="vllm", rate=2.0, replicas=1).key(salt="s")
    assert plain.key(salt="s") != RunSpec(system="vllm", rate=2.0, replicas=2).key(salt="s")


def test_a_sweep_grid_crosses_routers_and_replicas(tmp_path):
    """``replicas`` and ``router`` in an experiment's grid make each run a cluster of that size
    behind that router (run by the default run function, on the sweep's executors)."""
    from pagesim.experiments.run_spec import expand_grid, simulate_spec

    specs = expand_grid({"base": {"model": "opt-13b", "kv_gib": 2, "num_requests": 30, "rate": 4.0},
                         "grid": {"replicas": [1, 2], "router": ["round-robin", "least-kv-usage"]}})
    assert sorted((s.replicas, s.router) for s in specs) == [(1, "least-kv-usage"), (1, "round-robin"),
                                                             (2, "least-kv-usage"), (2, "round-robin")]
    two = [s for s in specs if s.replicas == 2 and s.router == "least-kv-usage"][0]
    res = simulate_spec(two)
    assert res.summary["replicas"] == 2 and res.summary["router"] == "least-kv-usage"
    assert set(res.requests["replica"]) <= {0, 1} and res.summary["completed"] == 30
