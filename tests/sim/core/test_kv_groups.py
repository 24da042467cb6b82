"""vLLM v1's KV cache groups (sim/specs/kv_groups.py, sim/core/kv/kv_cache.py ``remove_skipped``):
the groups a model's layers form, the blocks the KV memory gives, and a sliding-window group
freeing its blocks as they leave the window, worked by hand on a tiny model."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state, prepare, run_simulation
from pagesim.sim.specs import presets
from pagesim.sim.specs.kv_groups import KVCacheGroups, kv_cache_groups, window_cap_blocks
from pagesim.sim.specs.model import FULL_ATTENTION, SLIDING_ATTENTION, ModelSpec, interleaved_sliding

from tests.sim.helpers import ConstExecutor
from pagesim.sim.core.kv.kv_cache import WINDOW_CAP_BLOCKS

GiB = 2**30
# a 2-layer model, layer 0 sliding (window 6), layer 1 full; one KV head of 4 at 2 bytes:
# 2 * 1 * 4 * 2 = 16 bytes per token and layer
TINY = ModelSpec("tiny-swa", 2, 64, 1, 1, 4, 64, 100, 64, layer_kinds=(SLIDING_ATTENTION, FULL_ATTENTION),
                 sliding_window=6)
LAYER_TOKEN = 16


@pytest.fixture(autouse=True)
def tiny_preset(monkeypatch):
    monkeypatch.setitem(presets.MODELS, TINY.name, TINY)


def layers(full: int, sliding: int) -> ModelSpec:
    return dataclasses.replace(TINY, num_layers=full + sliding,
                               layer_kinds=(FULL_ATTENTION,) * full + (SLIDING_ATTENTION,) * sliding)


def test_layers_group_as_vllm_groups_them():
    """kv_cache_planning.py:522-556: group size = the smaller bucket's layers, or the larger's when
    under 1.5 x the smaller; each bucket split into ceil(layers / size) groups.
    Gemma-2-27B: 23 full, 23 sliding -> 2 groups of 23. Gemma-3-27B: 10 full, 52 sliding -> size
    10: 1 full group, ceil(52 / 10) = 6 sliding ones, 70 - 62 = 8 padding layers. gpt-oss-20b +
    EAGLE style 13 full, 12 sliding: 13 < 1.5 x 12 -> size 13, 1 + 1 groups. All sliding
    (Mistral-7B): one sliding group of 32. No sliding layer: one full group. vLLM orders the
    groups by their kind's first layer (kv_cache_planning.py:484-507): Gemma's layer 0 slides, so
    its sliding groups come first; full layers first, the full group."""
    assert kv_cache_groups(presets.MODELS["gemma-2-27b"]) == KVCacheGroups(1, 1, 23, 4096, sliding_first=True)
    gemma3 = dataclasses.replace(TINY, num_layers=62, layer_kinds=interleaved_sliding(62, 6), sliding_window=1024)
    assert kv_cache_groups(gemma3) == KVCacheGroups(1, 6, 10, 1024, sliding_first=True)
    assert kv_cache_groups(gemma3).padding_layers(gemma3) == 8
    assert kv_cache_groups(layers(13, 12)) == KVCacheGroups(1, 1, 13, 6)
    assert kv_cache_groups(presets.MODELS["mistral-7b"]) == KVCacheGroups(0, 1, 32, 4096)
    assert kv_cache_groups(presets.MODELS["llama-3-8b"]) == KVCacheGroups(1, 0, 32, 0)


def test_window_cap_is_the_window_and_the_tokens_in_flight_plus_one_block():
    """kv_cache_interface.py:937-944: cdiv(min(window - 1 + in flight, max_model_len), bs) + 1.
    window 6, 16 in flight, max 32, blocks of 4: cdiv(21, 4) + 1 = 7; max 12: cdiv(12, 4) + 1 = 4."""
    assert window_cap_blocks(6, 4, 16, 32) == 7
    assert window_cap_blocks(6, 4, 16, 12) == 4


def v1(slots: int, system: str = "vllm-v1", **settings) -> SimConfig:
    """``slots`` slots of one group-layer (16 bytes each) of KV, blocks of 4, every step checked."""
    settings.setdefault("async_scheduling", False)
    settings.setdefault("prefix_caching", False)
    settings.setdefault("max_num_batched_tokens", 16)
    settings.setdefault("max_seq_len", 32)
    if system == "vllm":  # v0: neither setting; a whole prompt in one step
        settings.pop("async_scheduling")
        settings.pop("prefix_caching")
        settings["max_num_batched_tokens"] = 32
    return SimConfig.for_system(system, model=TINY.name, gpu="a100-40gb", kv_gib=slots * LAYER_TOKEN / GiB,
                                block_size=4, max_num_seqs=4,
                                cost_model="roofline", check=True, **settings)


def trace(*rows) -> pd.DataFrame:
    arrival, prompt, output = zip(*rows)
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": list(map(float, arrival)),
                         "prompt_tokens": list(prompt), "output_tokens": list(output)})


def test_the_pool_gives_blocks_of_one_group_and_v0_and_sglang_size_every_layer_as_full():
    """64 slots of 16 bytes = 1024 bytes. vllm-v1: a block is 4 tokens x 1 layer (the group
    size) x 16 = 64 bytes: 16 blocks, shared by the 2 groups. vllm (v0): a token is 2 layers x 16
    = 32 bytes: 32 slots, 8 blocks of 4. SGLang 0.5.23 too: its sliding-window pool serves none of
    the models pagesim reads (docs/notes/sglang-swa.md, section 1)."""
    s = initial_state(v1(64), trace((0, 4, 1)))
    assert (s.config[state.NUM_BLOCKS], s.config[state.FULL_GROUPS], s.config[state.SLIDING_GROUPS]) == (16, 1, 1)
    assert s.block_table.shape[1] == 2 * 2  # two groups' tables of ceil(5 / 4) = 2 blocks
    v0 = initial_state(v1(64, system="vllm"), trace((0, 4, 1)))
    assert (v0.config[state.NUM_BLOCKS], v0.config[state.SLIDING_GROUPS]) == (8, 0)
    sglang = initial_state(v1(64, system="sglang"), trace((0, 4, 1)))
    assert (sglang.config[state.NUM_BLOCKS], sglang.config[state.SLIDING_GROUPS]) == (8, 0)


def memory(result):
    steps = result.steps
    return (steps["mem_token_states"].tolist(),
            (steps["mem_token_states"] + steps["mem_reservation"] + steps["mem_internal_frag"]).tolist())


def test_a_sliding_group_frees_the_blocks_that_left_its_window_at_the_next_allocation():
    """Window 6, blocks of 4, one request: prompt 10, output 6 (final length 16), synchronous
    scheduling (processed = computed). At each step, before its blocks grow, the sliding group
    frees floor(max(0, processed - 6 + 1) / 4) leading blocks (single_type_kv_cache_manager.py:1148),
    i.e. (p - 5) // 4 for p >= 5."""
    # step 0: admit, prefill 10: 3 blocks per group, 6 held; tokens 10 + 10 = 20
    # step 1: processed 10 -> skip 1 block; computed 11, 3 blocks: held 3 + 2 = 5; tokens 11 + 7 = 18
    # step 2: processed 11 -> skip 1; computed 12: held 5; tokens 12 + 8 = 20
    # step 3: processed 12 -> skip 1; computed 13 needs a 4th block per group: held 4 + 3 = 7;
    #         tokens 13 + 9 = 22
    # step 4: processed 13 -> skip 2; computed 14: held 4 + 2 = 6; tokens 14 + 6 = 20
    # step 5: processed 14 -> skip 2; computed 15 (its 6th token: done): held 6; tokens 15 + 7 = 22
    result = run_simulation(v1(64), trace((0, 10, 6)))
    tokens, held_slots = memory(result)
    assert tokens == [20, 18, 20, 22, 20, 22]
    assert held_slots == [4 * 6, 4 * 5, 4 * 5, 4 * 7, 4 * 6, 4 * 6]


def test_under_async_scheduling_the_last_step_is_in_flight_and_frees_a_step_later():
    """The same request, async scheduling: processed = computed - the tokens scheduled in the
    step before (kv_cache_manager.py:557-567). Step 1: 10 - 10 = 0 (nothing skipped); step 2:
    11 - 1 = 10 -> 1 block; step 3: 11 -> 1; step 4: 12 -> 1 (2 when synchronous); step 5: 13 -> 2.
    held: 6, 6, 5, 4 + 3 = 7, 4 + 3 = 7, 4 + 2 = 6. (17 blocks: with 32 tokens in flight one
    request of 32 needs 8 + cdiv(min(5 + 32, 32), 4) + 1 = 17, the test below.)"""
    result = run_simulation(v1(68, async_scheduling=True), trace((0, 10, 6)))
    assert memory(result)[1] == [4 * 6, 4 * 6, 4 * 5, 4 * 7, 4 * 7, 4 * 6]


def test_categories_per_group_and_summed_in_the_summary():
    """The synchronous run above: the summary's split gives each kind of group its share and the
    pool's keys stay the sums (sim/metrics)."""
    result = run_simulation(v1(64), trace((0, 10, 6)))
    split = result.summary["kv_groups"]
    assert split["full"]["groups"] == 1 and split["sliding"]["groups"] == 1 and split["sliding"]["window"] == 6
    for category in ("token_states", "reservation", "internal_frag"):
        total = split["full"][category] + split["sliding"][category]
        assert total == pytest.approx(result.summary[f"mem_{category}"])
    # token states per step: the full group 10, 11, 12, 13, 14, 15; the sliding one 10, 7, 8, 9,
    # 6, 7 (the test above), each held for its step's duration
    dt = result.steps["dt_s"].to_numpy()
    full, sliding = dt @ [10, 11, 12, 13, 14, 15], dt @ [10, 7, 8, 9, 6, 7]
    assert split["sliding"]["token_states"] / split["full"]["token_states"] == pytest.approx(sliding / full)


def test_the_pool_must_hold_one_request_with_its_sliding_layers_at_their_cap():
    """vLLM's start check (kv_cache_planning.py:151-184), per layer: the full layer cdiv(L, 4),
    the sliding one its cap cdiv(min(6 - 1 + 16, L), 4) + 1. L = 32: 8 + 7 = 15 blocks of one
    layer (a group is one layer): 60 slots (15 blocks) run, 56 (14) are refused, though both
    hold under 32 tokens of both layers (30, 28). L = 12: 3 + 4 = 7 blocks: 24 slots (6 blocks,
    12 tokens of both layers) are refused, 28 (7) run. Under async scheduling 32 tokens are in
    flight: L = 32 needs 8 + 9 = 17 blocks."""
    def starts(slots, max_seq_len, **settings):
        try:
            initial_state(v1(slots, max_seq_len=max_seq_len, **settings), trace((0, 4, 1)))
        except ConfigError as error:
            assert "cannot hold one max_seq_len" in str(error) and len(str(error)) <= 100
            return False
        return True
    assert [starts(60, 32), starts(56, 32), starts(24, 12), starts(28, 12)] == [True, False, False, True]
    assert [starts(64, 32, async_scheduling=True), starts(68, 32, async_scheduling=True)] == [False, True]


def test_prefix_caching_over_sliding_groups_runs_but_not_with_speculation():
    """Modelled (tests/sim/core/test_sliding_prefix_cache.py), except with drafts (EAGLE's hit
    drops a block) or the CPU tier: refused in one line."""
    assert run_simulation(v1(64, prefix_caching=True), trace((0, 10, 6))).summary["completed"] == 1
    with pytest.raises(ConfigError, match="--no-prefix-caching"):
        run_simulation(v1(64, prefix_caching=True, num_speculative_tokens=2), trace((0, 10, 6)))


def test_a_request_needs_its_blocks_in_every_group_and_a_sliding_one_at_most_its_cap():
    """16 blocks of 4 (64 slots), 2 groups. Growing a request from 0 to 8 tokens lacks 2 blocks
    in each group: 4 (kv_cache_coordinator.py:199-262 sums the groups), so 3 free blocks are too
    few and 4 enough. Admitting a whole sequence of 32 tokens: 8 full-attention blocks and
    min(8, cap) sliding ones, cap = cdiv(min(6 - 1 + 16, 32), 4) + 1 = 7: 15 blocks."""
    s = initial_state(v1(64), trace((0, 8, 1)))
    can_grow, blocks_for_sequence = interpreted(kv_cache.can_grow), interpreted(kv_cache.blocks_for_sequence)
    s.count[state.NUM_FREE_BLOCK_IDS] = 3
    assert not can_grow(s, 0, 8)
    s.count[state.NUM_FREE_BLOCK_IDS] = 4
    assert can_grow(s, 0, 8)
    assert s.config[WINDOW_CAP_BLOCKS] == 7
    assert blocks_for_sequence(s, 32) == 8 + 7
    assert blocks_for_sequence(s, 12) == 3 + 3


@pytest.mark.parametrize("method, slack, reservation, internal", [
    ("ngram", [0, 6, 6], [4, 4, 0], [0, 0, 4]),
    ("eagle", [6, 12, 12], [6, 0, 0], [0, 6, 6]),
])
def test_speculation_holds_its_slots_in_every_group_and_the_window_frees_below_them(method, slack, reservation,
                                                                                    internal):
    """The first test's request with 7 output tokens (final length 17), K = 3 drafts, every draft
    accepted, synchronous scheduling. A decode schedules 1 + 3 tokens, its blocks grown to hold
    them past its computed ones (+ 3 lookahead slots for EAGLE, none for n-gram: speculative.py)
    in both groups; first the sliding group frees (processed - 5) // 4 blocks, processed = the
    computed tokens, the drafts about to be verified not among them.
    n-gram: step 0 prefills 10 (3 blocks per group, demand 12 each: reservation 2 + 2). Step 1
    frees 1 sliding block, grows to 14 (4 blocks per group: 4 + 3 held), computes 1 (11; the
    sliding group holds 11 - 4 = 7): slack 14 - 11 = 3 per group, reservation 16 - 11 - 3 = 2
    per group. Step 2 (14 computed: the drafts and a bonus accepted) frees a 2nd block (with the
    drafts counted as processed it would have freed it at step 1), grows to 18 (5 + 3 held),
    computes 1 (15; sliding 15 - 8 = 7): slack 3 + 3, of which 1 each past the final length 17:
    fragmentation 20 - 17 - 1 = 2 per group. EAGLE, 3 slots more: step 0 holds 13 (slack 3 + 3,
    reservation 16 - 10 - 3 = 3 each); step 1 17 (slack 6 + 6, fragmentation 20 - 17 = 3 each);
    step 2 21 (6 + 4 held; slack 6 + 6, fragmentation 24 - 17 - 4 = 3 each)."""
    result = run_simulation(v1(64, num_speculative_tokens=3, speculative_method=method, spec_acceptance_rate=1.0),
                            trace((0, 10, 7)))
    steps = result.steps
    assert steps["mem_token_states"].tolist() == [20, 18, 22]
    assert steps["mem_speculative_slack"].tolist() == slack
    assert steps["mem_reservation"].tolist() == reservation
    assert steps["mem_internal_frag"].tolist() == internal
    assert result.requests["status"].tolist() == ["finished"]


def test_the_gpu_mode_refuses_sliding_window_groups_in_one_line():
    """An executor outside the core that runs the steps would read one block table per sequence:
    refused; one that only times them (sim.executor.only_times: the peer tests' recorder) runs
    them as the core does: prompt 4 (one block in each of the 2 groups), output 1: one step."""
    with pytest.raises(ConfigError, match="not modelled in the GPU mode"):
        prepare(v1(64), trace((0, 4, 1)), executor=ConstExecutor())
    timer = ConstExecutor()
    timer.only_times = True
    assert prepare(v1(64), trace((0, 4, 1)), executor=timer).pool.groups.num_groups == 2
    run_simulation(v1(64), trace((0, 4, 1)), executor=timer)
    assert len(timer.batches) == 1
