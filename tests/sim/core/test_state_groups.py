"""vLLM v1's Mamba / linear-attention KV cache groups (sim/specs/kv_groups.py, sim/core/kv/kv_cache.py
``take_group_blocks``, ``free_groups``): the groups a hybrid model's layers form, the attention
block size vLLM raises so a page holds a state, the states kept inside the pool (v0 reserved them
outside), and a request holding one block per state group from its first allocation to its end,
worked by hand on a tiny model."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state, resolve_budget, run_simulation
from pagesim.sim.specs import presets
from pagesim.sim.specs.kv_groups import KVCacheGroups, kv_cache_groups, state_block_size
from pagesim.sim.specs.model import FULL_ATTENTION, MAMBA, MambaMixer, ModelSpec
from tests.sim.helpers import trace_of

GiB = 2**30
# 3 layers: 1 full attention, 2 Mamba. One KV head of 4 at 2 bytes: 2 * 1 * 4 * 2 = 16 bytes per
# token and layer. A Mamba layer's state: d_inner 8 x (d_conv - 1 + d_state = 3 + 9) x 2 B = 192 B
TINY = ModelSpec("tiny-mamba", 3, 64, 1, 1, 4, 64, 100, 64, layer_kinds=(FULL_ATTENTION, MAMBA, MAMBA),
                 mamba=MambaMixer(d_inner=8, d_state=9, d_conv=4, dt_rank=4))
LAYER_TOKEN = 16


@pytest.fixture(autouse=True)
def tiny_preset(monkeypatch):
    monkeypatch.setitem(presets.MODELS, TINY.name, TINY)


def v1(slots: int, system: str = "vllm-v1", **settings) -> SimConfig:
    """``slots`` slots of one group-layer (16 bytes each) of KV, block size 4 configured, every
    step checked."""
    settings.setdefault("max_num_batched_tokens", 16 if system == "vllm-v1" else 32)
    if system == "vllm-v1":
        settings.setdefault("async_scheduling", False)
        settings.setdefault("prefix_caching", False)
    return SimConfig.for_system(system, model=TINY.name, gpu="a100-40gb", kv_gib=slots * LAYER_TOKEN / GiB,
                                block_size=4, max_seq_len=32, max_num_seqs=4,
                                cost_model="roofline", check=True, **settings)


def trace(*rows) -> pd.DataFrame:
    return trace_of(rows)


def test_state_layers_group_by_the_same_rule_and_raise_the_block_size():
    """kv_cache_planning.py:522-556 over buckets [full, mamba]; platforms/interface.py:1066-1109.
    Tiny: buckets [1, 2]: 2 >= 1.5 x 1 -> size 1: 1 full group, 2 state groups. A page must hold
    192 B at 16 B per token: alignment max(16, 4) = 16, 16 x cdiv(192, 16 x 16) = 16 tokens;
    the state fills 192 / 16 = 12 of them.
    Jamba-1.5-Mini: buckets [4, 28] -> size 4: 1 + 7 groups. TP 1: 311,296 B per Mamba layer,
    4,096 B per token of one layer: 16 x cdiv(311,296, 65,536) = 80 tokens, 76 of them state;
    TP 2 halves both: 80 again. A configured 32: alignment 32, 32 x cdiv(311,296, 131,072) = 96;
    a configured 128 holds it already: 128. 4 full and 5 Mamba layers: 5 < 1.5 x 4 -> size 5, 1 + 1
    groups (the full one padded by a layer). Jamba's layer 0 is a Mamba layer: in vLLM's order its
    state groups come first (``state_first``); the others' full layer comes first."""
    assert kv_cache_groups(TINY, 4) == KVCacheGroups(1, 0, 1, 0, 2, 16, 12)
    four_five = dataclasses.replace(TINY, num_layers=9, layer_kinds=(FULL_ATTENTION,) * 4 + (MAMBA,) * 5)
    assert kv_cache_groups(four_five, 4) == KVCacheGroups(1, 0, 5, 0, 1, 16, 12)
    jamba = presets.MODELS["jamba-1.5-mini"]
    assert kv_cache_groups(jamba) == KVCacheGroups(1, 0, 4, 0, 7, 80, 76, state_first=True)
    assert kv_cache_groups(jamba, 16, 2) == KVCacheGroups(1, 0, 4, 0, 7, 80, 76, state_first=True)
    assert state_block_size(jamba, 311_296, 32, 1) == 96
    assert state_block_size(jamba, 311_296, 128, 1) == 128
    assert kv_cache_groups(jamba).words() == "1 full + 7 state x 4 layers, blocks of 80 tokens"


def test_v1_keeps_the_states_in_the_pool_and_v0_reserves_them_outside():
    """Jamba-1.5-Mini on an H100-80GB at TP 2, max_num_seqs 256: v0 (test_model_configs) takes
    256 x 4,358,144 B of states out first: 22,476,881,920 B of KV. v1 keeps them in the pool:
    22,476,881,920 + 1,115,684,864 = 23,592,566,784 B, in slots of one group's 4 layers x 2,048 B
    = 8,192 B: 2,879,952 slots, blocks of 80."""
    def settings(system):
        extra = {"prefix_caching": False} if system == "vllm-v1" else {}
        return SimConfig.for_system(system, model="jamba-1.5-mini", gpu="h100-80gb", tensor_parallel=2,
                                    max_num_seqs=256, max_seq_len=4096, **extra)
    _, _, v0 = resolve_budget(settings("vllm"))
    _, _, v1_budget = resolve_budget(settings("vllm-v1"))
    assert v0.kv_bytes == 22_476_881_920
    assert (v1_budget.kv_bytes, v1_budget.capacity_tokens) == (23_592_566_784, 2_879_952)


def held(result):
    steps = result.steps
    return (steps["mem_token_states"].tolist(),
            (steps["mem_token_states"] + steps["mem_reservation"] + steps["mem_internal_frag"]).tolist())


def test_a_request_holds_one_block_per_state_group_from_its_first_allocation_to_its_end():
    """64 slots: 4 blocks of 16 (one layer per group). Prompt 10, output 3 (final 13): it takes 1
    full-attention block and 1 block in each of the 2 state groups at its first allocation, and
    no more as it grows: 3 blocks, 48 slots held at each of its 3 steps. Token states: its tokens
    10, 11, 12 and 2 x 12 slots of state; the rest of the state blocks (2 x 4) is padding, in
    internal fragmentation with the full block's 16 - 13 = 3."""
    result = run_simulation(v1(64), trace((0, 10, 3)))
    tokens, held_slots = held(result)
    assert tokens == [10 + 24, 11 + 24, 12 + 24]
    assert held_slots == [48, 48, 48]
    assert result.steps["mem_internal_frag"].tolist() == [3 + 8] * 3
    split = result.summary["kv_groups"]
    assert split["state"]["groups"] == 2 and result.summary["block_size"] == 16  # raised from 4
    # each step: 24 of the 64 slots state, 8 padding, for the same time
    assert (split["state"]["token_states"], split["state"]["internal_frag"]) == pytest.approx((24 / 64, 8 / 64))
    for category in ("token_states", "reservation", "internal_frag"):
        assert split["full"][category] + split["state"][category] == pytest.approx(result.summary[f"mem_{category}"])


def test_a_request_waits_for_its_state_blocks_where_v0_runs_both():
    """Two requests of 10 + 3 in 4 blocks: each needs 1 + 2 = 3 (kv_cache_coordinator.py sums the
    groups), so the second waits for the first to finish. v0 (--system vllm), the same 64 slots:
    its states live outside the pool; blocks of 4 hold 13 tokens in 4 of its 16: both run at once."""
    result = run_simulation(v1(64), trace((0, 10, 3), (0, 10, 3)))
    first, second = result.requests["first_token_s"], result.requests["finish_s"]
    assert first[1] >= second[0]
    v0 = run_simulation(v1(64, "vllm"), trace((0, 10, 3), (0, 10, 3)))
    assert v0.requests["first_token_s"][0] == v0.requests["first_token_s"][1]


def test_admission_counts_the_state_blocks_once():
    """blocks_for_sequence: 32 tokens take 2 full blocks of 16 and 2 state blocks: 4. can_grow from
    nothing to 8 tokens lacks 1 + 2 = 3 blocks (3 free: yes, 2: no); a holder growing to 20 lacks
    just 1."""
    s = initial_state(v1(64), trace((0, 8, 1)))
    can_grow, blocks_for_sequence = interpreted(kv_cache.can_grow), interpreted(kv_cache.blocks_for_sequence)
    assert blocks_for_sequence(s, 32) == 4
    s.count[state.NUM_FREE_BLOCK_IDS] = 2
    assert not can_grow(s, 0, 8)
    s.count[state.NUM_FREE_BLOCK_IDS] = 3
    assert can_grow(s, 0, 8)
    s.num_blocks[0] = 1
    s.count[state.NUM_FREE_BLOCK_IDS] = 1
    assert can_grow(s, 0, 20)


def test_a_preempted_request_gives_its_states_back():
    """Recompute preemption frees every group's blocks, the states too (``--check`` verifies the
    pool after each step): two requests of 12 + 12 in 7 blocks of 16 are both admitted (the second
    needs 2 + 2 of the 4 left), then both cross into a second full block: 3 + 3 + 2 > 7, one is
    preempted, and both finish."""
    result = run_simulation(v1(112), trace((0, 12, 12), (0, 12, 12)))
    assert result.summary["completed"] == 2 and result.summary["num_preemptions"] > 0


def test_the_pool_must_hold_one_request_with_a_page_per_state_layer():
    """vLLM starts only if its pool holds one max_model_len request, layer by layer
    (kv_cache_planning.py:151-184): the full layer cdiv(32, 16) = 2 blocks, each Mamba layer one
    page (MambaSpec.max_memory_usage_bytes): 2 + 2 = 4 blocks of one layer. 64 slots (4 blocks)
    start; 48 (3 blocks) are refused in one line."""
    assert run_simulation(v1(64), trace((0, 10, 3))).summary["completed"] == 1
    with pytest.raises(ConfigError, match="cannot hold one max_seq_len=32 request"):
        run_simulation(v1(48), trace((0, 10, 3)))


def test_speculation_gives_each_state_group_a_block_per_draft_counted_as_speculative_slack():
    """vLLM gives a Mamba group K more blocks per request for the drafts' states
    (``num_speculative_blocks``, mamba/abstract.py:86-90; single_type_kv_cache_manager.py:1713-1719)
    and counts them at start (kv_cache_interface.py:1141). K = 2 n-gram drafts, all accepted, 128
    slots: 8 blocks of 16. The start check: 2 full blocks + 2 x (1 + 2) state ones for 32 tokens:
    8, which the pool holds. Prompt 10, output 3: 1 full block + 2 x 3 state blocks = 7 held, 112
    slots, at both steps. Step 0: tokens 10 + 24 of state, reservation 3 (13 - 10), fragmentation
    3 + 8 of state padding, slack 2 x 2 x 16 = 64 (the drafts' state blocks). Step 1 (1 + 2 query
    tokens, grown to 13): tokens 11 + 24, slack 64 + 2 (the drafts' slots past 11). Its 3 outputs
    come from the step's accepted drafts: 2 steps."""
    result = run_simulation(v1(128, num_speculative_tokens=2, speculative_method="ngram", spec_acceptance_rate=1.0),
                            trace((0, 10, 3)))
    steps = result.steps
    assert steps["mem_token_states"].tolist() == [34, 35]
    assert steps["mem_reservation"].tolist() == [3, 0]
    assert steps["mem_internal_frag"].tolist() == [11, 11]
    assert steps["mem_speculative_slack"].tolist() == [64, 66]
    s = initial_state(v1(128, num_speculative_tokens=2, speculative_method="ngram"), trace((0, 8, 1)))
    can_grow, blocks_for_sequence = interpreted(kv_cache.can_grow), interpreted(kv_cache.blocks_for_sequence)
    assert blocks_for_sequence(s, 32) == 2 + 2 * 3
    s.count[state.NUM_FREE_BLOCK_IDS] = 6
    assert not can_grow(s, 0, 8)
    s.count[state.NUM_FREE_BLOCK_IDS] = 7
    assert can_grow(s, 0, 8)
    with pytest.raises(ConfigError, match="cannot hold one max_seq_len"):
        initial_state(v1(112, num_speculative_tokens=2, speculative_method="ngram"), trace((0, 8, 1)))
