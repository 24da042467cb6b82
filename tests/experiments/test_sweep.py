import json
import os
import sys
import time

import pandas as pd
import pytest

from pagesim.experiments import run_cache, sweep
from pagesim.experiments.run_spec import (CODE_SALT, RunSpec, apply_overrides, canonical_json, expand_grid, load_experiment,
                                          results_frame, unshare_trace)
from pagesim.experiments.sweep import run_sweep
from pagesim.sim.errors import ConfigError
from tests.experiments import fakes
from tests.experiments.fakes import fake_run, fake_summary_only


def small_specs(k=6):
    return [RunSpec(system=s, workload="sharegpt", rate=r, duration_s=60, sim={"kv_gib": 12})
            for s in ("orca-max", "vllm") for r in (0.5, 1.0, 2.0)][:k]


def test_expand_grid_product_and_order():
    cfg = {"base": {"model": "opt-13b", "kv_gib": 12, "workload": "sharegpt", "duration_s": 60},
           "grid": {"system": ["orca-max", "vllm"], "rate": [1.0, 2.0, 3.0]}}
    specs = expand_grid(cfg)
    assert len(specs) == 6
    assert [(s.system, s.rate) for s in specs[:4]] == [("orca-max", 1.0), ("orca-max", 2.0), ("orca-max", 3.0),
                                                       ("vllm", 1.0)]
    assert specs[0].sim == {"model": "opt-13b", "kv_gib": 12}
    assert specs[0].duration_s == 60 and specs[0].workload == "sharegpt"
    assert specs[0].sim_config().kv_gib == 12


def test_expand_grid_cases_with_list_values_and_precedence():
    cfg = {"base": {"system": "vllm", "rate": 9.0},
           "cases": [{"workload": "alpaca", "rate": 2.0, "n": [2, 4]}, {"workload": "sharegpt", "beam_width": [2]}],
           "grid": {"unshare": [False, True]}}
    specs = expand_grid(cfg)
    assert [(s.workload, s.rate, s.n, s.beam_width, s.unshare) for s in specs] == [
        ("alpaca", 2.0, 2, 1, False), ("alpaca", 2.0, 2, 1, True), ("alpaca", 2.0, 4, 1, False),
        ("alpaca", 2.0, 4, 1, True), ("sharegpt", 9.0, 1, 2, False), ("sharegpt", 9.0, 1, 2, True)]


def test_expand_grid_default_leaves_a_setting_unset():
    cfg = {"base": {"per_seq_overhead_ms": 0.1}, "grid": {"per_seq_overhead_ms": ["default", 0.3]}}
    unset, set_ = expand_grid(cfg)
    assert "per_seq_overhead_ms" not in unset.sim and set_.sim["per_seq_overhead_ms"] == 0.3


def test_expand_grid_errors():
    with pytest.raises(ConfigError, match="unknown setting"):
        expand_grid({"base": {"bogus": 1}})
    with pytest.raises(ConfigError, match="non-empty list"):
        expand_grid({"grid": {"rate": 2.0}})


def test_seed_goes_to_workload_and_sim():
    (s,) = expand_grid({"base": {"seed": 7}})
    assert s.seed == 7 and s.workload_kwargs()["seed"] == 7 and s.sim_config().seed == 7


def test_apply_overrides_quick_and_scale():
    cfg = {"base": {"duration_s": 600}, "grid": {"rate": [1.0, 2.0]}, "cases": [{"num_requests": 100}],
           "quick": {"duration_s": 60, "grid": {"rate": [1.0]}}}
    q = apply_overrides(cfg, quick=True, scale=0.5, rate=None)
    assert q["base"]["duration_s"] == 30.0 and q["grid"]["rate"] == [1.0] and q["cases"][0]["num_requests"] == 50
    assert cfg["base"]["duration_s"] == 600  # not mutated
    assert apply_overrides(cfg, duration_s=5)["base"]["duration_s"] == 5


def test_shipped_configs_expand():
    for name in ("fig2", "fig2_sensitivity", "fig13", "fig15", "fig12", "fig18b"):
        cfg = load_experiment(name)
        full, quick = expand_grid(apply_overrides(cfg)), expand_grid(apply_overrides(cfg, quick=True))
        assert 0 < len(quick) <= len(full)
        for s in full:
            s.sim_config()  # every setting is a valid SimConfig
            assert s.sim["kv_gib"] == 12 and s.sim["max_seq_len"] == 2048 and s.sim["model"] == "opt-13b"
    with pytest.raises(ConfigError, match="not found"):
        load_experiment("nope")


def test_key_is_stable_and_sensitive(monkeypatch):
    a, b = RunSpec(rate=1.0, sim={"kv_gib": 12, "model": "opt-13b"}), RunSpec(rate=1, sim={"model": "opt-13b", "kv_gib": 12})
    assert a.key() == b.key() and len(a.key()) == 64
    assert a.key() != RunSpec(rate=1.5, sim=a.sim).key()
    assert a.key() != a.key(runner="x:y")
    before = a.key()
    monkeypatch.setenv("PAGESIM_CACHE_SALT", "other-code-version")
    assert CODE_SALT() == "other-code-version" and a.key() != before


def test_cache_resume_zero_new_runs(tmp_path):
    calls = []

    def counting(spec):
        calls.append(spec.label())
        return fake_summary_only(spec)

    specs = small_specs()
    first = run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=counting)
    assert len(calls) == 6
    again = run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=counting)
    assert len(calls) == 6  # nothing rerun
    assert canonical_json(first) == canonical_json(again)
    run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=counting, use_cache=False)
    assert len(calls) == 12


def test_a_sweep_stores_only_the_tables_it_is_asked_for(tmp_path, monkeypatch):
    """Figures store no request table; a later sweep that needs one reruns the run and replaces
    the entry; a sweep that needs fewer tables than an entry has reuses it."""
    from pagesim.experiments import sweep

    calls = []

    def counting(spec):
        calls.append(spec.label())
        return fake_run(spec)

    counting.__qualname__ = "counting_tables"
    specs = small_specs(2)
    run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=counting, tables=("steps",))
    out = run_cache.load_cached(specs[0], tmp_path, run_fn=counting)
    assert len(calls) == 2 and out.steps is not None and out.requests is None
    run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=counting, tables=("steps",))
    assert len(calls) == 2  # what it stored is what it needs
    run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=counting)  # every table
    out = run_cache.load_cached(specs[0], tmp_path, run_fn=counting)
    assert len(calls) == 4 and out.requests is not None and out.steps is not None
    run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=counting, tables=("steps",))
    assert len(calls) == 4
    assert sweep.ALL_TABLES == ("steps", "requests")


def test_killed_sweep_resumes_where_it_stopped(tmp_path):
    calls = []

    def dies_after_3(spec):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(spec.label())
        return fake_summary_only(spec)

    specs = small_specs()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=dies_after_3)
    done = list(calls)
    calls.clear()
    calls_after = []

    def counting(spec):
        calls_after.append(spec.label())
        return fake_summary_only(spec)

    # same runner identity is part of the key, so reuse the same function object's name
    counting.__qualname__ = dies_after_3.__qualname__
    res = run_sweep(specs, workers=1, cache_dir=tmp_path, progress=False, run_fn=counting)
    assert len(done) == 3 and len(calls_after) == 3
    assert set(calls_after).isdisjoint(done)
    assert all(r is not None for r in res)
    assert not list(tmp_path.rglob("*.tmp-*"))


def test_deterministic_across_worker_counts(tmp_path):
    specs = small_specs()
    one = run_sweep(specs, workers=1, cache_dir=tmp_path / "a", progress=False, run_fn=fake_run)
    two = run_sweep(specs, workers=2, cache_dir=tmp_path / "b", progress=False, run_fn=fake_run)
    assert canonical_json(one) == canonical_json(two)
    assert [r["system"] for r in two] == [s.system for s in specs]
    assert [r["request_throughput"] for r in two] == [s.rate for s in specs]  # spec order
    assert all("wall_time_s" not in r for r in one)
    # the cached summaries are byte-identical files too
    fa = sorted(p.read_bytes() for p in (tmp_path / "a").rglob("summary.json"))
    fb = sorted(p.read_bytes() for p in (tmp_path / "b").rglob("summary.json"))
    assert fa == fb
    meta = json.loads(next((tmp_path / "b").rglob("meta.json")).read_text())
    assert "wall_time_s" in meta
    # the pool's workers store their entries themselves: the same tables as stored in-process
    from pagesim.experiments.run_cache import load_cached
    for spec in specs:
        a, b = (load_cached(spec, tmp_path / d, run_fn=fake_run) for d in "ab")
        pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
        pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)


def test_identical_specs_run_once_and_tables_are_cached(tmp_path):
    fakes.CALLS.clear()
    spec = small_specs(1)[0]
    res = run_sweep([spec, spec], workers=1, cache_dir=tmp_path, progress=False, run_fn=fake_run)
    assert len(fakes.CALLS) == 1 and res[0] == res[1]
    out = run_cache.load_cached(spec, tmp_path, run_fn=fake_run)
    assert isinstance(out.steps, pd.DataFrame) and len(out.steps) == 200
    assert isinstance(out.requests, pd.DataFrame) and "ttft_s" in out.requests
    assert run_cache.load_cached(RunSpec(rate=99.0), tmp_path, run_fn=fake_run) is None


def test_arrow_tables_without_pyarrow_are_a_cache_miss(tmp_path, monkeypatch):
    """A cache shared by two environments: an entry whose tables were written as Arrow files where
    pyarrow was installed is a miss where it is not (rerun and rewritten as csv.gz), never an
    ImportError and never a summary without its tables."""
    pytest.importorskip("pyarrow")
    spec = small_specs(1)[0]
    run_sweep([spec], workers=1, cache_dir=tmp_path, progress=False, run_fn=fake_run)
    assert list(tmp_path.rglob("steps.feather"))
    monkeypatch.setattr(run_cache, "_has_arrow", lambda: False)
    assert run_cache.load_cached(spec, tmp_path, run_fn=fake_run) is None
    fakes.CALLS.clear()
    run_sweep([spec], workers=1, cache_dir=tmp_path, progress=False, run_fn=fake_run)
    assert len(fakes.CALLS) == 1  # redone
    assert not list(tmp_path.rglob("*.feather")) and list(tmp_path.rglob("steps.csv.gz"))
    out = run_cache.load_cached(spec, tmp_path, run_fn=fake_run)
    assert isinstance(out.steps, pd.DataFrame) and len(out.steps) == 200


def test_results_frame():
    specs = small_specs(2)
    df = results_frame(specs, [fake_summary_only(s) for s in specs])
    assert list(df["rate"]) == [0.5, 1.0] and "normalized_latency_s_per_token" in df and df["kv_gib"].iloc[0] == 12


def test_bad_executor_and_workers(tmp_path):
    with pytest.raises(ConfigError, match="executor"):
        run_sweep(small_specs(1), executor="dask", cache_dir=tmp_path, progress=False)
    with pytest.raises(ConfigError, match="workers"):
        run_sweep(small_specs(1), workers=0, cache_dir=tmp_path, progress=False)


def test_ray_missing_is_a_clear_error(tmp_path):
    try:
        import ray  # noqa: F401
        pytest.skip("ray is installed")
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="needs Ray"):
        run_sweep(small_specs(2), executor="ray", cache_dir=tmp_path, progress=False, run_fn=fake_run)


@pytest.mark.slow
def test_ray_local_mode(tmp_path):
    """Ray on this machine: local mode where the installed Ray still has it, else a local
    2-CPU Ray started by run_sweep itself (the no-address path). Same results as local."""
    ray = pytest.importorskip("ray")
    try:
        ray.init(local_mode=True, include_dashboard=False, ignore_reinit_error=True)
    except RuntimeError:  # Ray >= 2.4x removed local mode
        pass
    try:
        specs = small_specs(4)
        res = run_sweep(specs, executor="ray", workers=2, cache_dir=tmp_path / "r", progress=False, run_fn=fake_run)
        ref = run_sweep(specs, workers=1, cache_dir=tmp_path / "l", progress=False, run_fn=fake_run)
        assert canonical_json(res) == canonical_json(ref)
        assert len(list((tmp_path / "r").rglob("summary.json"))) == 4
    finally:
        ray.shutdown()


def test_unshare_trace():
    t = pd.DataFrame({"request_id": ["a", "b"], "arrival_s": [0.0, 1.0], "prompt_tokens": [10, 20],
                      "output_tokens": [5, 6], "n": [3, 1], "beam_width": [1, 2]})
    u = unshare_trace(t)
    assert list(u["request_id"]) == ["a#0", "a#1", "a#2", "b#0", "b#1"]
    assert (u["n"] == 1).all() and (u["beam_width"] == 1).all()
    assert list(u["prompt_tokens"]) == [10, 10, 10, 20, 20]


def test_default_run_fn_with_real_engine(tmp_path):
    pytest.importorskip("pagesim.sim.run")
    pytest.importorskip("pagesim.traces.synth")
    spec = RunSpec(system="vllm", workload="sharegpt", rate=1.0, num_requests=5,
                   sim={"kv_gib": 12, "max_seq_len": 2048, "max_len_policy": "drop"})
    (res,) = run_sweep([spec], workers=1, cache_dir=tmp_path, progress=False)
    assert res["completed"] + res["rejected"] == 5


def test_shared_prefix_workloads_run_through_the_sweep():
    # Fig. 16's workloads are built by traces/shared_prefix.py: every prompt holds the 341-token
    # 5-shot prefix, whose 21 full blocks prefix caching computes once
    from pagesim.experiments.run_spec import RunSpec, simulate_spec
    spec = RunSpec(system="vllm", sim=dict(model="llama-13b", kv_gib=2, prefix_caching=True),
                   workload="wmt16-5shot", rate=0.01, num_requests=3)
    result = simulate_spec(spec)
    assert (result.requests["prompt_tokens"] >= 342).all()
    prefill = result.steps["num_prefill_tokens"]
    first, later = int(prefill[prefill > 0].iloc[0]), prefill[prefill > 0].iloc[1:]
    assert first == result.requests["prompt_tokens"].iloc[0]
    # 100 s apart: each later request finds the prefix cached and prefills only its own tokens
    assert (later.to_numpy() == result.requests["prompt_tokens"].iloc[1:].to_numpy() - 336).all()


def test_a_run_whose_request_table_is_not_stored_never_builds_it(monkeypatch):
    """``SimResult.requests`` is built on first read: a sweep that stores no request table (the
    figures') does not pay for it."""
    from pagesim.experiments import sweep
    from pagesim.experiments.run_spec import simulate_spec
    from pagesim.sim import run as sim_run

    built = []
    real = sim_run.request_columns
    monkeypatch.setattr(sim_run, "request_columns", lambda *a: built.append(1) or real(*a))
    spec = RunSpec(system="vllm", workload="sharegpt", rate=2.0, num_requests=20, sim={"kv_gib": 12})
    out = sweep._execute(spec, simulate_spec, ("steps",))
    assert built == [] and out.requests is None and out.meta["dropped_tables"] == ["requests"]
    out = sweep._execute(spec, simulate_spec)
    assert built == [1] and len(out.requests) == 20


def test_runs_share_a_synthesized_trace_and_leave_it_as_it_was():
    """Consecutive runs of one grid point read one synthesized trace (``spec_workload`` keeps
    it): a run must not write it, and the second run's result is the first's."""
    from pagesim.experiments.run_spec import simulate_spec, spec_workload
    from pagesim.traces.synth import make_workload

    spec = RunSpec(system="vllm", workload="sharegpt", rate=4.0, num_requests=50, sim={"kv_gib": 2})
    first = simulate_spec(spec)
    second = simulate_spec(spec)
    assert spec_workload.cache_info().hits >= 1
    fresh = make_workload("sharegpt", **spec.workload_kwargs())
    assert spec_workload(spec.workload, spec.rate, spec.duration_s, spec.num_requests, spec.seed, 1, 1).equals(fresh)
    assert first.requests.equals(second.requests) and first.steps.equals(second.steps)


PARENT = """
import os, sys, time
from pagesim.experiments import sweep
pool = sweep._shared_pool(2)
print(*sorted(pool.submit(os.getpid).result() for _ in range(4)), flush=True)
print(*sorted(p for p in pool._processes), flush=True)
time.sleep(60)  # killed before it wakes
"""


NESTED = """
import sys
from functools import partial
from pagesim.experiments.sweep import map_local, run_sweep
from tests.experiments.fakes import fake_run
from tests.experiments.test_sweep import small_specs

def sweep_there(cache, i):
    return sum(r["request_throughput"] for r in run_sweep(small_specs(), workers=2, cache_dir=f"{cache}/{i}",
                                                          progress=False, run_fn=fake_run))

print(*map_local(partial(sweep_there, sys.argv[1]), [0, 1], 2), flush=True)
"""


def test_a_sweep_made_on_a_pool_worker_runs_there_and_ends(tmp_path):
    """``reproduce all`` builds its figures' tables on the pool's workers (``map_local``), and a
    figure that probes again (``common.refine_knees``) makes a sweep there. A worker's copy of its
    parent's pool is not a pool it can submit to (its manager thread is the parent's): its runs
    run in the worker itself (``sweep._IN_WORKER``), and the sweep ends: the fake serves each of
    small_specs' rates 0.5, 1 and 2 twice, 7 req/s in all, on each of the two workers."""
    import subprocess

    from tests.sim.helpers import TESTS_ROOT, subprocess_path

    env = dict(os.environ, PYTHONPATH=subprocess_path())
    done = subprocess.run([sys.executable, "-c", NESTED, str(tmp_path)], cwd=TESTS_ROOT, env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["7.0", "7.0"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sweeps_workers_end_when_their_parent_is_killed():
    """``reproduce`` killed outright mid-sweep (SIGKILL: no exit handler runs) leaves no worker
    behind: each watches its parent (``sweep.end_with_parent``) and ends within a second or two."""
    import signal
    import subprocess

    from tests.sim.helpers import TESTS_ROOT, subprocess_path

    env = dict(os.environ, PYTHONPATH=subprocess_path())
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=TESTS_ROOT, env=env, stdout=subprocess.PIPE,
                              text=True)
    parent.stdout.readline()  # the workers ran a task
    workers = [int(p) for p in parent.stdout.readline().split()]
    assert len(workers) == 2 and all(alive(w) for w in workers)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10 * sweep.PARENT_WATCH_S
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(w) for w in workers)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended (its new parent reaps it)
        return f.read().split(") ")[1][0] != "Z"


class _RecordingPool:
    """A pool that runs nothing: what was submitted to it."""

    def __init__(self):
        self.submitted = []

    def submit(self, fn, *args):
        import concurrent.futures as cf

        self.submitted.append((fn.__name__, *args))
        done = cf.Future()
        done.set_result(None)
        return done


def test_a_sweep_warms_each_family_it_runs_on_a_worker_of_its_own(monkeypatch):
    """vLLM v0's and Orca's scheduler over contiguous extents and over paged memory are two
    families, two compiled loops (sim/core/compile/families.py): a sweep of both has each compiled by a
    worker of its own, side by side, before its runs (a system of each: the registry's first),
    and a family warmed once is not warmed again; a spec that is no valid configuration is left
    to its run."""
    from pagesim.sim.core import state

    bad = RunSpec(system="sglang", sim={"max_num_seqs": 0})  # else SGLang's family
    assert sweep._families([*small_specs(), bad]) == [state.CONTINUOUS_CONTIGUOUS, state.CONTINUOUS]
    assert sweep._families([]) == [state.CONTINUOUS]  # the default system's
    monkeypatch.setattr(sweep, "_WARMED", set())
    pool = _RecordingPool()
    sweep.warm_up_core([state.CONTINUOUS_CONTIGUOUS, state.CONTINUOUS], pool)
    assert pool.submitted == [("_warm_up", "orca-max"), ("_warm_up", "vllm")]
    assert sweep._WARMED == {state.CONTINUOUS_CONTIGUOUS, state.CONTINUOUS}
    warmed = []
    monkeypatch.setattr(sweep, "warm_up_core", lambda families, pool=None: warmed.append((families, pool)))
    monkeypatch.setattr(sweep, "_POOL", [(2, pool)])
    monkeypatch.setattr(sweep, "_WARMED", {state.CONTINUOUS})
    assert sweep._shared_pool(2, small_specs()) is pool
    assert warmed == [([state.CONTINUOUS_CONTIGUOUS], pool)]
