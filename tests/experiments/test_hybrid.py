"""The hybrid models' figure: its arithmetic by hand with a stand-in engine, its long-context
workload's lengths, the state reserved outside the pool in the summary, and its quick grid run
through the engine (what each run's memory must show, worked out from the models' shapes)."""

import math

import numpy as np
import pandas as pd
import pytest

from pagesim.experiments import figures as X
from pagesim.experiments.figures import hybrid
from pagesim.experiments.run_cache import RunOutput
from pagesim.experiments.run_spec import RunSpec, expand_grid, load_experiment, spec_workload, within_context
from pagesim.sim.errors import ConfigError, TraceError
from pagesim.sim.specs import get_gpu, get_model
from pagesim.sim.specs.capacity import kv_capacity
from pagesim.traces import long_context

GiB = 1 << 30
#: Jamba-1.5-Mini's Mamba state per sequence on one GPU at TP 2: 28 layers x d_inner 8,192 / 2 x
#: (d_conv 4 - 1 + d_state 16) x 2 bytes
JAMBA_STATE_TP2 = 28 * 4096 * 19 * 2
#: Gemma-2-27B's bytes per token of all 46 attention layers (16 KV heads of 128, K and V, 2 B)
GEMMA_TOKEN = 46 * 2 * 16 * 128 * 2


def test_long_context_lengths_follow_the_stated_shape():
    df = long_context.make_workload("long-context", rate=1.0, num_requests=20000, seed=0)
    prompt, output = df["prompt_tokens"], df["output_tokens"]
    # lognormal of mean 12,035, sigma 1.05: median 12,035 x exp(-1.05^2 / 2) = 6,935
    assert prompt.mean() == pytest.approx(12035, rel=0.03)
    assert prompt.median() == pytest.approx(6935, rel=0.03)
    assert (prompt > 4096).mean() == pytest.approx(0.69, abs=0.02)  # P(z > ln(4096 / 6935) / 1.05)
    # uniform on 1..686: mean 343.5
    assert output.min() >= 1 and output.max() <= 686 and output.mean() == pytest.approx(343.5, rel=0.02)
    assert df.attrs["source"] == "builtin:long-context" and df.attrs["workload"]["workload"] == "long-context"
    # an experiment names it as any built-in workload, and the same seed gives the same requests
    again = spec_workload("long-context", 1.0, None, 20000, 0, 1, 1)
    assert again["prompt_tokens"].equals(prompt)
    with pytest.raises(ConfigError, match="unknown long-context workload"):
        long_context.make_workload("longer", rate=1.0, num_requests=3)


def test_a_run_applies_its_max_len_policy_to_the_models_context():
    trace = spec_workload("long-context", 1.0, None, 200, 0, 1, 1)
    spec = RunSpec(system="vllm", sim={"model": "gemma-2-27b", "max_len_policy": "clip-prompt"})
    cut = within_context(trace, spec)  # Gemma-2's 8,192 tokens: long prompts keep their end
    over = trace["prompt_tokens"] + trace["output_tokens"] > 8192
    assert over.sum() > 50 and (cut["prompt_tokens"] + cut["output_tokens"]).max() == 8192
    assert cut["output_tokens"].equals(trace["output_tokens"])
    assert cut.loc[~over, "prompt_tokens"].equals(trace.loc[~over, "prompt_tokens"])
    spec.sim["max_len_policy"] = "drop"
    assert len(within_context(trace, spec)) == (~over).sum()
    spec.sim.pop("max_len_policy")  # the default, error: refused, naming the first such request
    with pytest.raises(TraceError, match="max_seq_len 8192"):
        within_context(trace, spec)


def test_state_reserved_outside_the_pool_is_what_the_pool_lost():
    jamba, h100 = get_model("jamba-1.5-mini"), get_gpu("h100-80gb")
    v0 = kv_capacity(jamba, h100, tensor_parallel=2, max_num_seqs=256)
    v1 = kv_capacity(jamba, h100, tensor_parallel=2, max_num_seqs=1024)
    assert v0.state_bytes == 256 * JAMBA_STATE_TP2 == 1_115_684_864  # 1.04 GiB
    assert v1.state_bytes == 1024 * JAMBA_STATE_TP2
    assert v0.kv_bytes + v0.state_bytes == v1.kv_bytes + v1.state_bytes  # the same memory, split
    assert kv_capacity(jamba, h100, tensor_parallel=2, kv_bytes=10 * GiB, max_num_seqs=256).state_bytes == 0
    assert kv_capacity(get_model("gemma-2-27b"), h100, max_num_seqs=256).state_bytes == 0


def stand_in(spec: RunSpec) -> RunOutput:
    """A 10 GiB pool (1,000 slots of GiB / 100 bytes) for every run. vllm: 60 %
    of it in use, 10 % reserved, 5 % fragmented, 25 % free, 2 GiB of state outside; vllm-v1:
    30 % in full groups and 20 % in sliding ones, 10 / 5 / 35 %, no state outside. 8 requests
    running on average, 12 at most under vllm; 10 and 15 under vllm-v1; 4 and 5 req/s."""
    v0 = spec.system == "vllm"
    s = {"kv_capacity_tokens": 1000, "kv_bytes_per_token": GiB / 100,
         "mem_token_states": 0.6 if v0 else 0.5, "mem_reservation": 0.1, "mem_internal_frag": 0.05,
         "mem_allocator_slack": 0.0, "mem_external_frag": 0.0, "mem_free_idle": 0.25 if v0 else 0.35,
         "avg_batch_size": 8.0 if v0 else 10.0, "request_throughput": 4.0 if v0 else 5.0}
    if v0:
        s["state_reserved_bytes"] = 2 * GiB
    else:
        s["kv_groups"] = {"full": {"groups": 1, "token_states": 0.3}, "sliding": {"groups": 1, "token_states": 0.2,
                                                                                   "window": 4096},
                          "layers_per_group": 23}
    steps = pd.DataFrame({"num_running": [1, 12 if v0 else 15, 3]})
    return RunOutput(summary=s, steps=steps)


def test_memory_by_hand_with_a_stand_in_engine(tmp_path):
    opts = X.SweepOptions(workers=1, cache_dir=tmp_path / "cache", progress=False, run_fn=stand_in)
    tables = X.reproduce("hybrid", tmp_path, opts, quick=True)
    main, memory = pd.read_csv(tmp_path / "hybrid.csv"), pd.read_csv(tmp_path / "hybrid_memory.csv")
    assert list(main.columns) == list(hybrid.COLUMNS) and len(main) == 8  # 2 models x 2 workloads x 2
    v0 = main[main["system"] == "vllm"].iloc[0]
    v1 = main[main["system"] == "vllm-v1"].iloc[0]
    # pool 1,000 x GiB / 100 = 10 GiB; v0: 6 GiB in use of 10 + 2 outside = 50 %; v1: 5 of 10
    assert (v0["kv_pool_gib"], v0["state_outside_gib"], v0["in_use_gib"]) == pytest.approx((10, 2, 6))
    assert (v0["in_use_pct"], v1["in_use_pct"]) == pytest.approx((50, 50))
    assert (v0["max_running"], v1["max_running"], v1["groups"]) == (12, 15, "1 full + 1 sliding x 23 layers")
    assert v0["groups"] == "one table"
    first = memory[(memory["model"] == v1["model"]) & (memory["workload"] == v1["workload"])]
    got = {(r.system, r.category): r.gib for r in first.itertuples()}
    assert got == pytest.approx({
        ("vllm", "in use: all layers"): 6.0, ("vllm", "reservation"): 1.0, ("vllm", "internal fragmentation"): 0.5,
        ("vllm", "free and other"): 2.5, ("vllm", hybrid.OUTSIDE): 2.0,
        ("vllm-v1", "in use: full groups"): 3.0, ("vllm-v1", "in use: sliding groups"): 2.0,
        ("vllm-v1", "reservation"): 1.0, ("vllm-v1", "internal fragmentation"): 0.5,
        ("vllm-v1", "free and other"): 3.5})
    text = hybrid.explain(main, tables["hybrid_memory"])
    assert "v0 holds 6.0 of 10.0 GiB in use, v1 5.0 of 10.0 (full groups 3.0, sliding groups 2.0)" in text
    assert "8.0 against 10.0 requests running on average (1.25x), at most 12 against 15" in text
    assert "4.00 against 5.00 req/s (1.25x)" in text
    assert "2.00 GiB outside the pool under v0 (a slot per max_num_seqs, used or not); v1 keeps" in text


def test_config_crosses_two_systems_with_four_model_workload_cases():
    specs = expand_grid(load_experiment("hybrid"))
    cases = {(s.sim["model"], s.workload, s.sim["tensor_parallel"]) for s in specs}
    assert cases == {("gemma-2-27b", "sharegpt", 1), ("gemma-2-27b", "long-context", 1),
                     ("jamba-1.5-mini", "sharegpt", 2), ("jamba-1.5-mini", "long-context", 2)}
    assert sorted(s.system for s in specs) == ["vllm"] * 4 + ["vllm-v1"] * 4
    assert all(s.sim["prefix_caching"] is False and s.sim["gpu"] == "h100-80gb" for s in specs)


def test_quick_grid_through_the_engine(tmp_path):
    """The figure's quick grid (40 requests a run) on the engine: what the models' shapes fix."""
    opts = X.SweepOptions(workers=1, cache_dir=tmp_path / "cache", progress=False)
    tables = X.reproduce("hybrid", tmp_path, opts, quick=True)
    main, memory = tables["hybrid"], tables["hybrid_memory"]
    assert (main["completed"] == 40).all()
    # every run's categories sum to its pool plus the state outside it (the groups' slots in use
    # summing to the pool's, the pool's categories to 1)
    for (model, workload, system), g in memory.groupby(["model", "workload", "system"]):
        row = main[(main["model"] == model) & (main["workload"] == workload) & (main["system"] == system)].iloc[0]
        assert g["gib"].sum() == pytest.approx(row["kv_pool_gib"] + row["state_outside_gib"], rel=1e-9)
        assert g["pct"].sum() == pytest.approx(100)
        assert 1 <= row["mean_running"] <= row["max_running"]
    by = {(r.model, r.workload, r.system): r for r in main.itertuples()}
    use = memory.set_index(["model", "workload", "system", "category"])["gib"]
    # Gemma-2: one pool for both (a v1 slot is 23 of the 46 layers: half a v0 slot)
    g0, g1 = by["gemma-2-27b", "sharegpt", "vllm"], by["gemma-2-27b", "sharegpt", "vllm-v1"]
    assert abs(g0.kv_pool_gib - g1.kv_pool_gib) * GiB < GEMMA_TOKEN
    assert g0.state_outside_gib == 0 and g1.groups == "1 full + 1 sliding x 23 layers"
    # ShareGPT's sequences (<= 2,048 tokens) never leave the 4,096-token window: the sliding
    # groups hold what the full ones hold; the long prompts leave it: less
    assert use["gemma-2-27b", "sharegpt", "vllm-v1", "in use: sliding groups"] == pytest.approx(
        use["gemma-2-27b", "sharegpt", "vllm-v1", "in use: full groups"], rel=1e-12)
    long_full = use["gemma-2-27b", "long-context", "vllm-v1", "in use: full groups"]
    assert use["gemma-2-27b", "long-context", "vllm-v1", "in use: sliding groups"] < 0.95 * long_full
    # Jamba: vLLM 0.4.2 reserves max_num_seqs (256) Mamba states outside the pool; whatever v1
    # does with its states, the two hold the same memory, to within a block's rounding (16 MiB:
    # an attention slot is 4 layers x 8 KV heads / 2 x 128 x 2 x 2 B = 8 KiB)
    j0, j1 = by["jamba-1.5-mini", "long-context", "vllm"], by["jamba-1.5-mini", "long-context", "vllm-v1"]
    assert j0.state_outside_gib * GiB == 256 * JAMBA_STATE_TP2
    assert abs((j0.kv_pool_gib + j0.state_outside_gib) - (j1.kv_pool_gib + j1.state_outside_gib)) * GiB < 16 << 20
    text = hybrid.explain(main, memory)
    assert "gemma-2-27b, long-context: v0 holds" in text and "Mamba states take 1.04 GiB outside" in text
    assert not any(math.isnan(v) for v in main["max_running"])
    assert np.isfinite(main["request_throughput"]).all()
