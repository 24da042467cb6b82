"""pagesim's vllm-v1 against vLLM 0.33.0's own scheduler, step by step (tests/peers/README.md).

Skipped unless ``python -m tests.peers.fetch`` has put vLLM 0.33.0 in the cache folder and its
scheduler imports here (torch is needed: ``vllm/v1/request.py`` imports it). Each workload
(workloads.py) runs on both sides; every step's record must be the same. With speculative
decoding (``SPECULATIVE_WORKLOADS``) vLLM is given the drafts pagesim's run accepted at each
step (``compare.peer_steps``, ``vllm_v1.drive``). Models with sliding-window layers
(``GROUP_WORKLOADS``) run vLLM's own KV cache groups beside pagesim's, and with prefix caching
(``GROUP_PREFIX_WORKLOADS``: each admission's hit and the blocks cached per group compared too),
and Mamba hybrids with prefix caching, vLLM's "align" mode (``MAMBA_PREFIX_WORKLOADS``,
docs/notes/mamba-align.md: the state blocks held and cached per group too).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.peers import suite
from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
vllm_v1 = driver_or_skip("0.33.0", "tests.peers.vllm_v1")

from pagesim.sim.core import state  # noqa: E402
from pagesim.sim.errors import ConfigError  # noqa: E402
from pagesim.sim.specs.kv_groups import kv_cache_groups  # noqa: E402

from tests.peers import pagesim_steps  # noqa: E402
from tests.peers.compare import assert_same_steps, first_divergence, peer_steps  # noqa: E402
from tests.peers.workloads import (FULL, GROUP_PREFIX_WORKLOADS, GROUP_WORKLOADS, MAMBA,  # noqa: E402
                                   MAMBA_PREFIX_WORKLOADS, SLIDING, SPECULATIVE_WORKLOADS, WORKLOADS, random_grouped,
                                   random_grouped_prefix, random_grouped_speculative, random_speculative,
                                   random_speculative_prefix)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_step_is_vllms(name):
    workload = WORKLOADS[name]
    theirs = vllm_v1.run(workload)
    ours = pagesim_steps.run(workload)
    assert_same_steps(name, workload, ours, theirs)


@pytest.mark.parametrize("name", list(SPECULATIVE_WORKLOADS))
def test_every_speculative_step_is_vllms(name):
    workload = SPECULATIVE_WORKLOADS[name]
    ours = pagesim_steps.run(workload)
    assert_same_steps(name, workload, ours, peer_steps(vllm_v1.run, workload, ours))


def test_the_resumed_request_is_padded():
    """spec-prefix-resume reaches the padding: request 8, preempted, resumes at step 25 with one
    token left and is scheduled as 1 + 3 query tokens, 3 placeholder drafts (scheduler.py:
    1308-1330; speculative.pads), on both sides; with vLLM's padding turned off
    (``vllm_v1.run(pad_resumed=False)``) the two part there."""
    workload = SPECULATIVE_WORKLOADS["spec-prefix-resume"]
    ours = pagesim_steps.run(workload)
    assert (ours[25].scheduled[8], ours[25].drafts[8], ours[25].kept[8]) == (4, 3, 0)
    assert first_divergence(ours, vllm_v1.run(workload, replay=ours, pad_resumed=False)) == 25


def test_the_speculative_workloads_reach_what_they_test():
    """On vLLM's side: drafts cut by max_model_len and by the budget, a draft model's slot
    binding the budget, EAGLE's lookahead slots holding blocks n-gram's drafts do not, and
    preemptions; on pagesim's, verifications that accept none, some and all of their drafts (a
    workload that never reaches a rule compares nothing of it)."""
    runs = {name: vllm_v1.run(SPECULATIVE_WORKLOADS[name]) for name in (
        "spec-max-len", "spec-budget", "spec-draft-model", "spec-eagle", "spec-k3", "spec-pressure")}
    k = {name: SPECULATIVE_WORKLOADS[name].num_speculative_tokens for name in runs}
    assert any(n < k["spec-max-len"] for step in runs["spec-max-len"] for n in step.drafts.values())
    budget = SPECULATIVE_WORKLOADS["spec-budget"].max_num_batched_tokens
    assert any(sum(step.scheduled.values()) == budget and min(step.drafts.values(), default=k["spec-budget"])
               < k["spec-budget"] for step in runs["spec-budget"])
    # a draft model: each scheduled request takes a slot more, so a full step schedules fewer
    # tokens than the budget by its requests
    budget = SPECULATIVE_WORKLOADS["spec-draft-model"].max_num_batched_tokens
    assert any(sum(step.scheduled.values()) + len(step.scheduled) == budget for step in runs["spec-draft-model"])
    # the same requests and K, every draft rejected (nothing replayed): the same tokens each
    # step, more blocks under EAGLE
    eagle, ngram = runs["spec-eagle"], runs["spec-k3"]
    assert [step.scheduled for step in eagle] == [step.scheduled for step in ngram]
    assert any(sum(a.blocks.values()) > sum(b.blocks.values()) for a, b in zip(eagle, ngram))
    assert sum(len(step.preempted) for step in runs["spec-pressure"]) > 5
    kept = {n for step in pagesim_steps.run(SPECULATIVE_WORKLOADS["spec-k3"]) for n in step.kept.values()}
    assert kept == {0, 1, 2, 3}


@pytest.mark.parametrize("name", list(GROUP_WORKLOADS))
def test_every_group_step_is_vllms(name):
    """KV cache groups of sliding-window, Mamba-state and full-attention layers: each step's tokens,
    preemptions, free blocks and every running request's blocks in each group (with speculative
    decoding, each step's drafts too)."""
    workload = GROUP_WORKLOADS[name]
    ours = pagesim_steps.run(workload)
    assert_same_steps(name, workload, ours, peer_steps(vllm_v1.run, workload, ours))


@pytest.mark.parametrize("name", list(GROUP_PREFIX_WORKLOADS))
def test_every_group_prefix_step_is_vllms(name):
    """Prefix caching over sliding-window groups (docs/notes/swa-prefix-caching.md): each step's
    record as above, each admission's hit tokens and the blocks cached in each group."""
    workload = GROUP_PREFIX_WORKLOADS[name]
    assert_same_steps(name, workload, pagesim_steps.run(workload), vllm_v1.run(workload))


@pytest.mark.parametrize("name", [name for name in MAMBA_PREFIX_WORKLOADS if not name.startswith("gdn")])
def test_every_mamba_prefix_step_is_vllms(name):
    """Mamba hybrids with prefix caching, vLLM's "align" mode (docs/notes/mamba-align.md): each step's
    record, each admission's hit tokens, the state blocks each request holds per Mamba group (1, or 2
    the step after it crosses a block) and the blocks cached in each group."""
    workload = MAMBA_PREFIX_WORKLOADS[name]
    assert_same_steps(name, workload, pagesim_steps.run(workload), vllm_v1.run(workload))


def test_the_gated_delta_net_checkpoint_variant_is_refused():
    """``gdn-prefix-sibling``: on FlashInfer a gated-delta-net prompt's final chunk runs past its
    last block boundary, the backend exporting the boundary state into a reserved checkpoint block
    (``use_internal_checkpoint``, sched/scheduler.py:593-611): vLLM schedules A's 52 tokens at once,
    holding 2 state blocks a group (the checkpoint's and the state's). Not modelled: pagesim refuses
    a gated-delta-net model with prefix caching (sim/run.py ``hybrid_groups``), in one line."""
    workload = MAMBA_PREFIX_WORKLOADS["gdn-prefix-sibling"]
    theirs = vllm_v1.run(workload)
    assert (theirs[0].scheduled, theirs[0].group_blocks) == ({0: 52}, {0: (4, 2, 2, 2)})
    with pytest.raises(ConfigError, match="gated-delta-net"):
        pagesim_steps.run(workload)


def test_the_group_prefix_workloads_reach_what_they_test():
    """On vLLM's side: a sliding hit found after a full one (a junction at work: example's r2), an
    identical prompt's hit (r3, r4), a preempted request re-admitted past its prompt with a hit
    (gemma2-pressure), and one re-admitted with none (its sliding blocks gone)."""
    steps = vllm_v1.run(GROUP_PREFIX_WORKLOADS["example"])
    assert [hit for step in steps for hit in step.hits.values()] == [0, 0, 20, 20, 20]
    pressure = GROUP_PREFIX_WORKLOADS["gemma2-pressure"]
    steps, preempted, resumed = vllm_v1.run(pressure), set(), []
    for step in steps:
        resumed += [(i, hit) for i, hit in step.hits.items() if i in preempted]
        preempted |= step.preempted
    assert preempted and any(hit > pressure.requests[i].prompt - pressure.block_size for i, hit in resumed)
    assert any(hit == 0 for _, hit in resumed)


@pytest.mark.parametrize("layers", sorted({w.layers for w in GROUP_WORKLOADS.values()}, key=lambda l: l.name),
                         ids=lambda layers: layers.name)
def test_the_groups_are_vllms(layers):
    """vLLM's own grouping of the layers (kv_cache_planning.py:1113-1200) against pagesim's
    (sim/specs/kv_groups.py): the full and sliding groups, the layers a group holds (padding
    included) and the bytes of a block of the pool."""
    workload = next(w for w in GROUP_WORKLOADS.values() if w.layers == layers)
    theirs, per_block = vllm_v1.groups_of(vllm_v1.load(), workload)
    model = pagesim_steps.model_of(layers)
    ours = kv_cache_groups(model)
    kinds = [kind for kind, _ in theirs]
    assert ((kinds.count(FULL), kinds.count(SLIDING), kinds.count(MAMBA))
            == (ours.full_groups, ours.sliding_groups, ours.state_groups))
    assert max(count for _, count in theirs) == ours.layers_per_group
    assert per_block == ours.bytes_per_block(model, workload.block_size)


@pytest.mark.parametrize("draw, seed", [(random_grouped, seed) for seed in range(suite.sample(12, 160))]
                         + [(random_grouped_prefix, seed) for seed in range(suite.sample(12, 200))])
def test_random_group_workloads_are_vllms_or_refused_by_both(draw, seed):
    """Workloads drawn from ``seed`` (workloads.random_grouped; random_grouped_prefix: with prefix
    caching over 3 system prompts): every step identical, or both refuse to start (vLLM's
    check_enough_kv_cache_memory, pagesim's check_groups_hold_a_request)."""
    workload = draw(seed)
    try:
        ours = pagesim_steps.run(workload)
    except ConfigError:
        with pytest.raises(ValueError, match="To serve at least one request"):
            vllm_v1.run(workload)
        return
    assert_same_steps(workload.name, workload, ours, vllm_v1.run(workload))


@pytest.mark.parametrize("seed, mamba", [(seed, False) for seed in range(suite.sample(12, 200))]
                         + [(seed, True) for seed in range(suite.sample(6, 120))])
def test_random_speculative_group_workloads_are_vllms_or_refused_by_both(seed, mamba):
    """:func:`test_random_group_workloads_are_vllms_or_refused_by_both`'s workloads, and the
    Mamba hybrids, with drafts (workloads.random_grouped_speculative), vLLM given pagesim's
    acceptance."""
    workload = random_grouped_speculative(seed, mamba=mamba)
    try:
        ours = pagesim_steps.run(workload)
    except ConfigError:
        with pytest.raises(ValueError, match="To serve at least one request"):
            vllm_v1.run(workload, replay=[])
        return
    assert_same_steps(workload.name, workload, ours, peer_steps(vllm_v1.run, workload, ours))


def test_a_copy_of_a_cached_block_keeps_the_key_as_vllms():
    """Drawn seed 163 (workloads.random_speculative: a draft model, K = 7, prefix caching, the
    priority policy): request 0, preempted at step 186, was recomputed earlier with its last
    block (which cannot be a hit) into a copy of a cached block; vLLM v1 caches both
    (block_pool.py:36-110), and once the first was evicted the copy kept the key. pagesim kept
    one block a key and parted at step 187 (41 hits against 54) until prefix_cache.register
    cached the copy too."""
    workload = random_speculative(163)
    ours = pagesim_steps.run(workload)
    assert_same_steps(workload.name, workload, ours, peer_steps(vllm_v1.run, workload, ours))


@pytest.mark.parametrize("seed", range(suite.sample(8, 40)))
def test_random_eagle_prefix_workloads_are_vllms(seed):
    """EAGLE and MTP over shared prefixes with prefix caching (workloads.random_speculative_prefix):
    every step identical, vLLM's block hashes covering the token after each block as its engine
    core's hasher makes them (``num_hash_lookahead_tokens``, vllm_v1.make_request)."""
    workload = random_speculative_prefix(seed)
    ours = pagesim_steps.run(workload)
    assert_same_steps(workload.name, workload, ours, peer_steps(vllm_v1.run, workload, ours))


@pytest.mark.parametrize("rule, seed, step", [("key", 0, 2), ("sampled", 4, 43)])
def test_the_eagle_prefix_workloads_catch_each_rule_put_back(monkeypatch, request, rule, seed, step):
    """EAGLE's hashes (sim/core/kv/prefix_cache.py, ``hash_lookahead``), each put back at run time
    (interpreted core): keys that do not cover the token after their block (nor wait for it:
    config/vllm.py:677-692) part drawn seed 0 at step 2; a block cached at the request's next pass
    only, not right after the step that sampled the token its hash covers (scheduler.py:
    2401-2415), drawn seed 4 at step 43, where a preempted request comes back."""
    if in_a_child_if_compiled(request):
        return
    from pagesim.sim.core.kv import prefix_cache

    workload = random_speculative_prefix(seed)
    ours = pagesim_steps.run(workload)
    theirs = peer_steps(vllm_v1.run, workload, ours)
    assert rule == "key" or any(step.preempted for step in theirs)
    monkeypatch.setattr(prefix_cache, "hash_lookahead" if rule == "key" else "sampled",
                        (lambda s: 0) if rule == "key" else (lambda s, i, emitted: None))
    assert first_divergence(pagesim_steps.run(workload), theirs) == step


@pytest.mark.parametrize("seed", range(suite.sample(8, 80)))
def test_random_mamba_workloads_are_vllms(seed):
    """Mamba hybrids drawn from ``seed`` (workloads.random_grouped with ``mamba``): every step
    identical, each request's state blocks included."""
    workload = random_grouped(seed, mamba=True)
    assert_same_steps(workload.name, workload, pagesim_steps.run(workload), vllm_v1.run(workload))


def in_a_child_if_compiled(request) -> bool:
    """A rule put back at run time only takes in the interpreted core: in a process whose core is
    compiled (the whole test suite), the test runs again in a child Python with
    ``PAGESIM_JIT=0``, which must pass; True when it did (the caller returns)."""
    from pagesim.sim.core.compile.jit import COMPILED

    if not COMPILED:
        return False
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "peers", "-p", "no:cacheprovider",
                            request.node.nodeid], env={**os.environ, "PAGESIM_JIT": "0"},
                           cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True)
    assert child.returncode == 0, child.stdout[-2000:]
    return True


def window_edge_late(remove_skipped):
    """remove_skipped as if the window kept one token more (``processed - window`` skipped)."""
    return lambda s, i, processed: remove_skipped(s, i, processed - 1)


def no_admission_cap(kv_cache):
    """blocks_for_sequence with every sliding group counting the whole sequence."""
    return lambda s, num_tokens: (s.config[state.FULL_GROUPS] + s.config[state.SLIDING_GROUPS]) * \
        kv_cache.blocks_for(s, num_tokens)


def growth_in_one_group(kv_cache):
    """can_grow that counts the blocks a request lacks in one group only."""
    return lambda s, i, num_tokens: kv_cache.blocks_for(s, num_tokens) - s.num_blocks[i] <= kv_cache.num_free_blocks(s)


@pytest.mark.parametrize("rule, name, step", [("remove_skipped", "gemma2-preemption", 6),
                                              ("blocks_for_sequence", "gemma2-arrivals", 18),
                                              ("can_grow", "gemma3-pressure", 253)])
def test_the_group_workloads_catch_each_rule_put_back(monkeypatch, request, rule, name, step):
    """pagesim's group rules, each broken at run time (interpreted core), diverge from vLLM at
    a known step: a window one token longer (single_type_kv_cache_manager.py:1148-1183's + 1),
    no admission cap (kv_cache_interface.py:918-944), a running request's growth counted in one
    group instead of all (kv_cache_coordinator.py:194-263)."""
    if in_a_child_if_compiled(request):
        return
    from pagesim.sim.core.kv import kv_cache

    broken = {"remove_skipped": window_edge_late(kv_cache.remove_skipped),
              "blocks_for_sequence": no_admission_cap(kv_cache), "can_grow": growth_in_one_group(kv_cache)}
    workload = GROUP_WORKLOADS[name]
    theirs = vllm_v1.run(workload)
    monkeypatch.setattr(kv_cache, rule, broken[rule])
    assert first_divergence(pagesim_steps.run(workload), theirs) == step


def test_the_mamba_workloads_catch_the_state_blocks_left_out_of_admission(monkeypatch, request):
    """Admission counting no block for the state groups (MambaManager's one block per request,
    single_type_kv_cache_manager.py:214 with a block of max_model_len tokens) admits too early:
    ``jamba-arrivals`` diverges from vLLM at step 26."""
    if in_a_child_if_compiled(request):
        return
    from pagesim.sim.core.kv import kv_cache

    workload, whole = GROUP_WORKLOADS["jamba-arrivals"], kv_cache.blocks_for_sequence
    theirs = vllm_v1.run(workload)
    monkeypatch.setattr(kv_cache, "blocks_for_sequence",
                        lambda s, num_tokens: whole(s, num_tokens) - s.config[state.STATE_GROUPS])
    assert first_divergence(pagesim_steps.run(workload), theirs) == 26


def without_junction(prefix_cache):
    """group_hits recording no shared-prefix junction (as if every model were unitary)."""
    hits = prefix_cache.group_hits
    return lambda s, i, num_tokens: (hits(s, i, num_tokens)[0], 0)


def leading_run_only(prefix_cache):
    """group_hits whose sliding groups hit only a leading run from block 0, as full ones do."""
    def hits(s, i, num_tokens):
        groups, limit, k = s.config[state.FULL_GROUPS] + s.config[state.SLIDING_GROUPS], \
            prefix_cache.hit_limit(s, i, num_tokens), 0
        while k < limit and prefix_cache.cached_in_groups(s, i, k, 0, groups):
            k += 1
        return k, 0
    return hits


def every_sliding_block_cached(prefix_cache):
    """register_group_blocks with no mask: a sliding group caches every block it fills."""
    def register(s, i, slot, old_len, new_len):
        bs, groups = s.config[state.BLOCK_SIZE], s.config[state.FULL_GROUPS] + s.config[state.SLIDING_GROUPS]
        width = s.block_table.shape[1] // groups
        for k in range(old_len // bs, new_len // bs):
            for g in range(groups):
                prefix_cache.register_in_group(s, s.block_table[slot, g * width + k], (k + 1) * bs,
                                               prefix_cache.key_chain(s, i, k), g)
    return register


@pytest.mark.parametrize("module, rule, name, step", [("prefix_cache", "group_hits", "example", 3),
                                                      ("prefix_cache", "leading_run", "mistral-system", 5),
                                                      ("prefix_cache", "register_group_blocks", "example", 0),
                                                      ("kv_cache", "vllm_group", "gemma2-pressure", 34)])
def test_the_group_prefix_workloads_catch_each_rule_put_back(monkeypatch, request, module, rule, name, step):
    """Prefix caching's group rules, each broken at run time (interpreted core), diverge from vLLM at
    a known step: no junction (kv_cache_manager.py:319-325: r1 of the note's example then caches no
    sliding block before it), a sliding group hitting a leading run only (single_type_kv_cache_
    manager.py:1015-1044's right-to-left search), a sliding group caching every block
    (``reachable_block_mask``, :1066-1146), and the groups let go in pagesim's order, full first,
    not vLLM's (kv_cache_coordinator.py:404-412 over kv_cache_planning.py:484-507's order: the LRU's
    order of cached blocks, and so which is evicted)."""
    if in_a_child_if_compiled(request):
        return
    from pagesim.sim.core.kv import kv_cache, prefix_cache

    modules = {"kv_cache": kv_cache, "prefix_cache": prefix_cache}
    broken = {"group_hits": ("group_hits", without_junction(prefix_cache)),
              "leading_run": ("group_hits", leading_run_only(prefix_cache)),
              "register_group_blocks": ("register_group_blocks", every_sliding_block_cached(prefix_cache)),
              "vllm_group": ("vllm_group", lambda s, n: n)}
    workload = GROUP_PREFIX_WORKLOADS[name]
    theirs = vllm_v1.run(workload)
    monkeypatch.setattr(modules[module], *broken[rule])
    assert first_divergence(pagesim_steps.run(workload), theirs) == step
