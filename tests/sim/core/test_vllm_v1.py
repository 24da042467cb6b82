"""vLLM v1's scheduler (``--system vllm-v1``, sim/core/sched/scheduler_v1.py, as of vLLM 0.33.0),
pinned by tiny runs worked out by hand.

The pools are a few blocks of 4 slots (OPT-13B); prompts with prefix hashes have one hash per
4 tokens, so a block's key is the chain of the hashes up to it. Each test says, step by step,
what the scheduler does; the records (``steps``: one row per iteration) must say the same.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pagesim.sim.cli import main
from pagesim.sim.config import SimConfig
from pagesim.sim.systems import v1_batch_defaults
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.sched import lifecycle, scheduler_v1
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state, run_simulation

from tests.sim.helpers import OPT13B_SLOT, cfg_for, rand_trace

# the scheduler's steps run by CPython: the same source, and no compile of each on its own for
# these few calls (a standalone schedule() is ~20 s of numba; the loop's compiled copy runs elsewhere)


def complete_step(s, now):
    """The step's end, by the loop's function for the state's family (sim/core/kv/memory.py)."""
    interpreted(lifecycle.complete_step)(s, now, s.config[state.FAMILY_TRAITS])


admit_waiting_v1 = interpreted(scheduler_v1.admit_waiting)
schedule_running_v1 = interpreted(scheduler_v1.schedule_running)

BS = 4


def v1(slots: int, **settings) -> SimConfig:
    """vllm-v1 for OPT-13B on an A100-40GB with a pool of exactly ``slots`` token slots in blocks
    of 4, every iteration's state checked (``--check``). Without async scheduling unless asked:
    these tests work ``Scheduler.schedule``'s rules step by step, each step seeing every arrival
    before it (the engine core's async scheduling, which delays arrivals a step, is tested apart),
    priced by the roofline (the rules hold whatever a step costs; the fitted models' constants
    are tested apart)."""
    settings.setdefault("async_scheduling", False)
    settings.setdefault("cost_model", "roofline")
    settings.setdefault("max_seq_len", slots)
    settings.setdefault("max_num_seqs", 4)
    settings.setdefault("check", True)
    return SimConfig.for_system("vllm-v1", model="opt-13b", gpu="a100-40gb", kv_gib=slots * OPT13B_SLOT / 2**30,
                                block_size=BS, **settings)


def trace(*rows, hashes=None) -> pd.DataFrame:
    """rows: (arrival_s, prompt_tokens, output_tokens); hashes: one tuple per row (4 tokens each)."""
    arrival, prompt, output = zip(*rows)
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": [float(a) for a in arrival],
                       "prompt_tokens": list(prompt), "output_tokens": list(output)})
    if hashes is not None:
        df["prefix_hashes"] = list(hashes)
        df.attrs["hash_block_tokens"] = BS
    return df


def column(result, name):
    return result.steps[name].tolist()


def step_ends(result):
    return (result.steps["start_s"] + result.steps["dt_s"]).tolist()


def test_one_budget_goes_to_the_running_list_first_then_to_waiting_requests():
    """A budget of 8 tokens, a large pool. A (prompt 10) and B (prompt 8) arrive together.

    step 0  running: none. waiting: A gets min(10, 8) = 8 tokens (a chunk: no token yet);
            the budget is spent, B waits
    step 1  running: A gets its last 2 prompt tokens (its first token). waiting: B gets the
            6 left of the budget (a chunk)
    step 2  running: A decodes 1 (its 2nd token), B gets its last 2 (its first token)
    step 3  A and B decode (A's 3rd token: done; B's 2nd: done)
    """
    result = run_simulation(v1(256, max_num_batched_tokens=8), trace((0, 10, 3), (0, 8, 2)))
    assert column(result, "num_prefill_tokens") == [8, 2 + 6, 2, 0]
    assert column(result, "num_decode_tokens") == [0, 0, 1, 2]
    assert column(result, "num_waiting") == [1, 0, 0, 0]
    assert column(result, "num_running") == [1, 2, 2, 2]
    ends = step_ends(result)
    first = result.requests["first_token_s"].tolist()
    assert first == [ends[1], ends[2]]  # a chunk that completes the prompt produces the first token
    assert result.requests["finish_s"].tolist() == [ends[3], ends[3]]
    assert result.requests["status"].tolist() == ["finished", "finished"]


def test_waiting_requests_stop_at_max_num_seqs():
    """max_num_seqs 2 (budget 8): A, B and C (prompts 2) arrive together; A and B are admitted
    (4 of the 8 tokens), C waits with budget to spare until one of them finishes."""
    result = run_simulation(v1(256, max_num_batched_tokens=8, max_num_seqs=2),
                            trace((0, 2, 2), (0, 2, 2), (0, 2, 1)))
    assert column(result, "num_prefill_tokens") == [4, 0, 2]
    assert column(result, "num_decode_tokens") == [0, 2, 0]
    assert column(result, "num_waiting") == [1, 1, 0]


def test_the_last_running_request_is_preempted_and_a_request_that_would_preempt_itself_stops():
    """3 blocks of 4, no prefix hashes. A, B, C (prompts 4, outputs 3) arrive together.

    step 0  A, B, C admitted, one block each (4 tokens, their first tokens); no block left
    step 1  A's 5th token needs a block: none free, so the *last* running request, C, is
            preempted (its block freed, cached under its own key, back to the waiting queue's
            front) and A takes its block (evicting C's key). B's 5th token needs a block: none
            free; B is now the last running request: it preempts itself (its block cached) and
            the pass ends. Only A decodes; waiting: B, C
    step 2  A decodes (6 tokens in 2 blocks, its 3rd token: done). B (prompt 4 + 1
            generated = 5 tokens, 2 blocks) does not fit the 1 free block: nobody is admitted
    step 3  all 3 blocks free: B is admitted and finds its first block cached (vLLM caches
            every full block): 1 token to recompute, its 5th (its 2nd token); C (5 tokens, 2
            blocks, its block evicted in step 1) does not fit the one left
    """
    result = run_simulation(v1(12), trace((0, 4, 3), (0, 4, 3), (0, 4, 3)))
    assert result.requests["preemptions"].tolist() == [0, 1, 1]
    assert column(result, "num_decode_tokens")[:4] == [0, 1, 1, 0]
    assert column(result, "num_prefill_tokens")[:4] == [12, 0, 0, 1]
    assert column(result, "num_waiting")[:4] == [0, 2, 2, 1]
    assert result.summary["completed"] == 3


def test_a_request_that_preempts_itself_preempts_nobody_before_it():
    """Worked on the core's state (scheduler_v1.schedule_running): 4 blocks of 4, a budget of
    8. A holds 3 blocks (11 prompt tokens, its first token out: it decodes); Z, after it in the
    running list, holds 1 block (4 of its 12 prompt tokens). A's 12th token needs no block.
    Z's next 7 tokens need 2 more blocks, none is free: Z, the last request, preempts itself,
    and the pass ends there (scheduler.py:978-994): its block comes free, and A, before it,
    keeps running, although Z's 7 tokens would still not fit the 1 free block."""
    s = initial_state(v1(16, max_num_batched_tokens=8), trace((0, 11, 4), (0, 12, 1)))
    A, Z = 0, 1
    for i in (A, Z):
        lifecycle.add_arrival(s, i)
    admit_waiting_v1(s, 11)
    s.step_prefill_ids[0], s.count[state.STEP_PREFILL_SEQS] = A, 1
    complete_step(s, 1.0)  # A's prompt is done: its first token
    lifecycle.pop_waiting(s)  # Z, as though admitted before A took its 3 blocks
    kv_cache.allocate(s, Z, 0, 0)
    kv_cache.grow(s, Z, 4)
    lifecycle.start_running(s, Z)
    kv_cache.compute_tokens(s, Z, 4, s.config[state.FAMILY_TRAITS])
    s.num_prompt_computed[Z] = 4
    assert kv_cache.num_free_blocks(s) == 0 and s.in_decode[A] == 1
    budget, preempted, _, reached = schedule_running_v1(s)
    assert preempted and s.num_preemptions.tolist() == [0, 1]
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [A] and s.status[Z] == state.WAITING
    assert s.count[state.STEP_DECODE_SEQS] == 1 and budget == 7 and reached == 1  # A decoded; Z took nothing
    assert kv_cache.num_free_blocks(s) == 1


def test_the_watermark_holds_back_admissions_only_while_something_runs():
    """4 blocks of 4, ``--watermark 0.25``: 1 block kept free at an admission while something
    runs (kv_cache_manager.py:518-525). A (prompt 2) runs alone in its block; B (prompt 12, 3
    blocks) arrives during A's first step: 3 blocks free, 3 + 1 needed: it waits until A is
    done (3 tokens), then comes in with nothing running: 3 <= 4. C (prompt 15: the whole pool)
    arrives later, with nothing running: admitted."""
    result = run_simulation(v1(16, watermark=0.25), trace((0, 2, 3), (0.001, 12, 1), (5, 15, 1)))
    assert column(result, "num_prefill_tokens") == [2, 0, 0, 12, 15]
    assert column(result, "num_waiting") == [0, 1, 1, 0, 0]


def test_requests_holding_kv_go_first_once_it_has_arrived():
    """The rule every connector that loads KV asynchronously shares (``lifecycle.hold_waiting``:
    vLLM's ``kv_holding_waiting``, WAITING_FOR_REMOTE_KVS, sched/scheduler.py:1062-1067,
    3519-3535). Worked on the core's state: 8 blocks of 4, a budget of 16. H1, H2, H3 (prompts 8)
    each hold 2 blocks with 7 tokens computed into them, as a load leaves a prompt (its last
    token to compute), and join the holding part in that order, their KV there at 0.5 s, 2 s and
    0.5 s. W (prompt 4), back from a preemption, joins the queue's front: behind them.
    At 0.6 s H1 is admitted (1 token), H2 skipped (its KV not there), H3 admitted (1 token), then
    W (4 tokens, a fresh block); H2 waits alone. At 2 s H2 is admitted (1 token)."""
    s = initial_state(v1(32, max_num_batched_tokens=16), trace((0, 8, 2), (0, 8, 2), (0, 8, 2), (0, 4, 2)))
    s = s._replace(load_ready_s=np.zeros(4))  # (a connector's column: a run without one has a single entry)
    H1, H2, H3, W = 0, 1, 2, 3
    for i, ready in ((H1, 0.5), (H2, 2.0), (H3, 0.5)):
        s.status[i] = state.WAITING
        interpreted(kv_cache.allocate)(s, i, 0, 0)
        interpreted(kv_cache.grow)(s, i, 8)
        interpreted(kv_cache.compute_tokens)(s, i, 7, s.config[state.FAMILY_TRAITS])
        s.load_ready_s[i] = ready
        interpreted(lifecycle.hold_waiting)(s, i)
    s.status[W] = state.WAITING
    interpreted(lifecycle.push_waiting)(s, W, True)
    waiting = interpreted(lifecycle.waiting_at)
    assert [waiting(s, p) for p in range(s.count[state.WAITING_LEN])] == [H1, H2, H3, W]
    s.clock[state.NOW] = 0.6
    assert admit_waiting_v1(s, 16) == 16 - 1 - 1 - 4
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [H1, H3, W]
    assert s.step_prefill_tokens[:3].tolist() == [1, 1, 4]
    assert (s.count[state.WAITING_LEN], s.count[state.KV_HOLDING_WAITING], waiting(s, 0)) == (1, 1, H2)
    s.clock[state.NOW] = 2.0
    admit_waiting_v1(s, 16)
    assert s.running[:s.count[state.NUM_RUNNING]].tolist() == [H1, H3, W, H2]
    assert s.count[state.KV_HOLDING_WAITING] == 0 and s.num_prompt_computed[H2] == 8


def test_nobody_is_admitted_in_a_step_that_preempted():
    """4 blocks of 4; A and C have the same 8-token prompt (hashes 1, 2), outputs 5.

    step 0  A: no hit, 2 blocks, 8 tokens, both blocks cached. C: at most 7 tokens may hit,
            so 1 block (A's first, shared); it computes 4 tokens into a fresh block (its key
            is A's already: not cached twice). 1 block left. Both get their first token
    step 1  A's 9th token takes the last block; C's 9th needs one: C, the last running
            request, preempts itself (its own block freed, A's first block still held by A).
            C (9 tokens now) would fit: 2 hits held by A, 1 block needed, 1 free; but a step
            that preempted admits nobody: A decodes alone
    step 2  A decodes; C is admitted with 2 hits and computes 1 token (its 2nd token)
    """
    result = run_simulation(v1(16), trace((0, 8, 5), (0, 8, 5), hashes=[(1, 2), (1, 2)]))
    assert result.requests["preemptions"].tolist() == [0, 1]
    assert column(result, "num_prefill_tokens")[:3] == [8 + 4, 0, 1]
    assert column(result, "num_decode_tokens")[:3] == [0, 1, 1]
    assert column(result, "num_waiting")[:3] == [0, 1, 0]


def test_a_prompt_found_whole_recomputes_its_last_block():
    """A (8 tokens, hashes 1, 2) runs alone and leaves its 2 blocks cached. B (the same 8
    tokens) may hit at most 8 - 1 = 7 tokens: whole blocks only, so 1 block (4 tokens), and
    computes 4. C (9 tokens, hashes 1, 2, 3) may hit 8 tokens: 2 blocks, and computes 1."""
    rows = ((0, 8, 1), (1, 8, 1), (2, 9, 1))
    result = run_simulation(v1(64), trace(*rows, hashes=[(1, 2), (1, 2), (1, 2, 3)]))
    assert column(result, "num_prefill_tokens") == [8, 4, 1]
    assert result.summary["prefix_cache_hit_rate"] == pytest.approx((0 + 4 + 8) / (8 + 8 + 9))


def test_a_block_past_the_prompt_is_the_requests_own_whatever_its_hash_names():
    """A (5 tokens, hashes 1, 2: its second hash names token 4 alone) generates 7: its block 1
    holds token 4 and three generated tokens; full, it is cached, keyed by A's own tokens, not by
    hash 2 (generated tokens no other prompt shares). B (12 tokens, hashes 1, 2, 3) hits block 0
    alone (4 tokens) and computes 8; C (the same as B) after it hits B's 2 blocks and computes 4."""
    rows = ((0, 5, 7), (1, 12, 1), (2, 12, 1))
    result = run_simulation(v1(64), trace(*rows, hashes=[(1, 2), (1, 2, 3), (1, 2, 3)]))
    assert [n for n in column(result, "num_prefill_tokens") if n] == [5, 8, 4]


def test_freed_blocks_are_evicted_tail_first_from_the_free_queue_head():
    """4 blocks of 4. A (12 tokens, hashes 1, 2, 3) runs and leaves: its 3 cached blocks join
    the free queue tail first (A's block 2, 1, 0: the tail is evicted first). D (8 tokens, no
    hashes) takes the never-used block, then evicts the queue's head: A's block 2. E (12
    tokens, hashes 1, 2, 3) then still hits A's blocks 0 and 1 (8 tokens; at most 11 could)
    and computes 4."""
    rows = ((0, 12, 1), (1, 8, 1), (2, 12, 1))
    result = run_simulation(v1(16), trace(*rows, hashes=[(1, 2, 3), (), (1, 2, 3)]))
    assert column(result, "num_prefill_tokens") == [12, 8, 4]
    assert result.summary["prefix_cache_hit_rate"] == pytest.approx(8 / (12 + 8 + 12))


def test_a_hit_takes_its_block_out_of_the_free_queue():
    """4 blocks of 4. A (12 tokens, hashes 1, 2, 3) leaves: its blocks wait in the free queue,
    A2, A1, A0, behind the never-used block. B (9 tokens, hashes 1, 2, 9; 7 outputs) hits A0
    and A1, which leave the queue, and takes the never-used block for its 9th token: 1 block
    free, A2. D (8 tokens, no hashes) arrives while B runs and needs 2: it waits (a hit left
    in the queue would count as free and be handed to D while B holds it: ``--check``
    fails). B's 13th token evicts A2; B finishes after 6 decode steps, its own blocks go to
    the free stack and A1, A0 back to the queue; D takes the 2 free-stack blocks. F (8
    tokens, hashes 1, 2) then hits A0 (at most 7 tokens: 1 block) and computes 4."""
    rows = ((0, 12, 1), (1, 9, 7), (1.01, 8, 1), (10, 8, 1))
    result = run_simulation(v1(16), trace(*rows, hashes=[(1, 2, 3), (1, 2, 9), (), (1, 2)]))
    assert column(result, "num_prefill_tokens") == [12, 1] + [0] * 6 + [8, 4]
    assert column(result, "num_waiting")[1:8] == [0] + [1] * 6  # D waits while B decodes
    assert result.summary["completed"] == 4


def test_whole_sequence_must_fit_at_admission():
    """4 blocks of 4, a budget of 4 tokens. A (prompt 4, output 5) is admitted alone; B
    (prompt 8) and C (prompt 12) arrive during its first step.

    step 1  A decodes (its 5th token takes a 2nd block: 2 free). B's whole 8 tokens fit the 2
            free blocks: admitted, a chunk of 3 (1 block)
    step 2  A decodes; B's next 3 (a 2nd block: none free)
    step 3  A decodes; B's last 2 (its first token: done). C would take the 1 token left of
            the budget; its whole 12 tokens (3 blocks) do not fit the 0 free: it waits
    step 4  A decodes (its 5th token: done). C's first chunk (3 tokens, 1 block) would fit
            the 2 blocks B freed, its whole prompt does not (vLLM 0.33.0's
            ``scheduler_reserve_full_isl``): it waits
    step 5  4 blocks free: C is admitted, its 12 tokens in chunks of 4
    """
    result = run_simulation(v1(16, max_num_batched_tokens=4),
                            trace((0, 4, 5), (0.001, 8, 1), (0.001, 12, 1)))
    assert column(result, "num_prefill_tokens") == [4, 3, 3, 2, 0, 4, 4, 4]
    assert column(result, "num_decode_tokens") == [0, 1, 1, 1, 1, 0, 0, 0]
    assert column(result, "num_waiting")[1:6] == [1, 1, 1, 1, 0]
    assert result.summary["completed"] == 3


# -- defaults and settings --------------------------------------------------------------------
@pytest.mark.parametrize("gpu,expected", [
    ("a100-40gb", (2048, 256)), ("a100-80gb", (2048, 256)),  # an A100, whatever its memory
    ("l40s", (2048, 256)), ("h100-80gb", (8192, 1024)), ("h200-141gb", (8192, 1024)),
    ("h20-96gb", (8192, 1024)), ("b200-180gb", (16384, 1024)), ("mi300x-192gb", (16384, 1024)),
])
def test_batch_defaults_of_the_openai_server_by_gpu(gpu, expected):
    assert v1_batch_defaults(gpu) == dict(max_num_batched_tokens=expected[0], max_num_seqs=expected[1])
    cfg = SimConfig.for_system("vllm-v1", gpu=gpu)
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == expected


def test_preset():
    cfg = SimConfig.for_system("vllm-v1")
    assert (cfg.manager, cfg.scheduler, cfg.block_size, cfg.prefix_caching, cfg.watermark, cfg.preemption) == \
        ("paged", "vllm-v1", 16, True, 0.0, "recompute")
    mine = SimConfig.for_system("vllm-v1", gpu="h100-80gb", max_num_seqs=64)
    assert (mine.max_num_batched_tokens, mine.max_num_seqs) == (8192, 64)  # what the user sets stays
    assert SimConfig.for_system("vllm").scheduler == "vllm"  # v0 is untouched
    assert SimConfig.for_system("vllm").max_num_batched_tokens is None


@pytest.mark.parametrize("settings,needle", [
    (dict(preemption="swap"), "recompute only"),
    (dict(manager="contiguous"), "needs manager 'paged'"),
    (dict(waiting_served_ratio=1.0), "waiting_served_ratio"),
    (dict(max_num_batched_tokens=100), "must be >= max_num_seqs"),
])
def test_settings_v1_has_not_are_refused(settings, needle):
    with pytest.raises(ConfigError, match=needle):
        SimConfig.for_system("vllm-v1", **settings)


def test_cli_refuses_in_one_line_with_exit_2(capsys):
    rc = main(["simulate", "--system", "vllm-v1", "--preemption", "swap", "--duration", "5", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "recompute only" in err


def test_cli_runs_vllm_v1(capsys):
    rc = main(["simulate", "--system", "vllm-v1", "--duration", "5", "--rate", "2", "--kv-gib", "2", "--json",
               "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and '"vllm-v1"' in out


def test_v0_defaults_are_not_v1s():
    """The same trace under vllm (v0: prefill-first, no chunks) and vllm-v1 (chunks of the
    budget): v0 prefills A's 10 tokens whole in one step, v1 in chunks of 8."""
    rows = ((0, 10, 2),)
    v0 = run_simulation(SimConfig.for_system("vllm", model="opt-13b", gpu="a100-40gb",
                                             kv_gib=256 * OPT13B_SLOT / 2**30, block_size=BS, max_seq_len=256,
                                             watermark=0.0), trace(*rows))
    one = run_simulation(v1(256, max_num_batched_tokens=8), trace(*rows))
    assert column(v0, "num_prefill_tokens") == [10, 0]
    assert column(one, "num_prefill_tokens") == [8, 2, 0]


# -- every invariant over random runs (as tests/sim/core/test_core.py's CASES) ------------------
CASES = [
    ({}, {}),
    (dict(slots=1200), dict(rate=200.0)),  # heavy preemption
    (dict(slots=600, max_num_batched_tokens=64, max_num_seqs=8), dict(rate=200.0)),  # chunks, preemption mid-prefill
    (dict(max_num_seqs=4, max_num_batched_tokens=16), {}),
    (dict(slots=1200), dict(rate=200.0, prefix=True)),  # hits, revivals, evictions under preemption
    (dict(slots=600, max_num_batched_tokens=32, max_num_seqs=8), dict(rate=200.0, prefix=True)),
    (dict(block_size=1), dict(prefix=True)),
    (dict(prefix_caching=False, slots=1200), dict(rate=200.0)),
    (dict(watermark=0.05, slots=1200), dict(rate=200.0, prefix=True)),
    (dict(record_steps=False, slots=1200), dict(rate=200.0, prefix=True)),
]


@pytest.mark.parametrize("kw,tkw", CASES, ids=[str(i) for i in range(len(CASES))])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_runs_keep_every_invariant(kw, tkw, seed):
    kw = dict(kw)
    slots = kw.pop("slots", 3000)
    kw.setdefault("max_num_batched_tokens", 256)
    kw.setdefault("max_num_seqs", 32)
    result = run_simulation(cfg_for("vllm-v1", slots, seed=seed, check=True, **kw), rand_trace(seed, **tkw))
    assert result.summary["completed"] + result.summary["rejected"] == 160
    assert result.summary["system"] == "vllm-v1"


def test_parallel_sampling_is_rejected_with_a_reason():
    df = rand_trace(0, n=20, width={"n": [1, 2]})
    result = run_simulation(cfg_for("vllm-v1", 3000, max_num_batched_tokens=256, max_num_seqs=32), df)
    wide = result.requests[np.asarray(df["n"]) > 1]
    assert len(wide) and (wide["status"] == "rejected").all()
    assert wide["reject_reason"].str.contains("one sequence per request").all()
    assert result.summary["completed"] + result.summary["rejected"] == 20


def test_async_scheduling_delays_an_arrival_during_a_step_by_one_step():
    """Async scheduling (vLLM's default; v1/engine/core.py step_with_batch_queue): step N+1 is
    scheduled as step N starts, so a request that arrives while step N runs is first scheduled
    in step N+2. A (prompt 4, output 4) arrives at 0 into an idle engine: scheduled at once
    (step 1). B (prompt 4) arrives during step 1. Synchronously B joins step 2; with async
    scheduling step 2 was scheduled when step 1 started (A's decode alone) and B joins step 3."""
    rows = ((0, 4, 4), (0.001, 4, 2))
    sync = run_simulation(v1(32, async_scheduling=False), trace(*rows))
    both = run_simulation(v1(32, async_scheduling=True), trace(*rows))
    assert column(sync, "num_prefill_tokens")[:3] == [4, 4, 0]
    assert column(both, "num_prefill_tokens")[:3] == [4, 0, 4]
    assert column(both, "num_decode_tokens")[:3] == [0, 1, 1]
    ends = step_ends(both)
    assert both.requests["first_token_s"].tolist()[1] == pytest.approx(ends[2])  # B's prompt: step 3


def test_async_scheduling_admits_at_once_into_an_idle_engine():
    """With nothing in flight there is no scheduled step to wait behind: a request arriving
    while the engine is idle is scheduled at once, async or not. A finishes (prompt 4,
    output 1: one step); B arrives long after: its TTFT is one step in both."""
    rows = ((0, 4, 1), (5.0, 4, 1))
    for flag in (False, True):
        result = run_simulation(v1(32, async_scheduling=flag), trace(*rows))
        assert column(result, "num_prefill_tokens") == [4, 4]
        assert result.requests["ttft_s"].tolist()[1] == pytest.approx(result.steps["dt_s"].tolist()[1])


def test_async_scheduling_is_vllm_v1s_alone():
    """--async-scheduling on another scheduler would change nothing: refused in one line."""
    with pytest.raises(ConfigError, match="async_scheduling=True applies to the vllm-v1 scheduler"):
        SimConfig.for_system("vllm", async_scheduling=True)
    assert SimConfig.for_system("vllm", async_scheduling=False).async_scheduling is False


def test_client_timeout_aborts_a_waiting_request():
    """--client-timeout 0.05: max_num_seqs 1, so B (sent with A at 0) waits while A (prompt 4,
    output 400) runs. Both clients give up at 0.05 s: the first step that starts at or after it
    aborts A where it runs and B where it waits (rejected, with the reason, B without a single
    token), and nothing is left to run: that step is the run's last."""
    rows = ((0, 4, 400), (0, 4, 2))
    result = run_simulation(v1(2048, max_num_seqs=1, client_timeout_s=0.05), trace(*rows))
    r = result.requests.set_index("request_id")
    assert (r["status"] == "rejected").all()
    assert r["reject_reason"].str.contains("client gave up after 0.05 s").all()
    assert np.isnan(r.loc["r1", "first_token_s"]) and not np.isnan(r.loc["r0", "first_token_s"])
    ends = step_ends(result)
    assert ends[-2] < 0.05 <= ends[-1]
    assert (result.steps["num_waiting"] == 1).all()  # B waited from the first step to the last


def test_client_timeout_aborts_a_running_request_and_frees_its_blocks():
    """A (prompt 4, output 400) runs alone; its client gives up after 0.05 s: the first step
    at or after it aborts A, its blocks come free (the pool's used blocks drop to 0), and the
    run ends with A rejected, not finished."""
    result = run_simulation(v1(1024, client_timeout_s=0.05), trace((0, 4, 400)))
    r = result.requests.iloc[0]
    assert r["status"] == "rejected" and np.isnan(r["finish_s"]) and not np.isnan(r["first_token_s"])
    ends = step_ends(result)
    assert ends[-2] < 0.05 <= ends[-1]  # the last step ran across the deadline; nothing after it
    assert result.summary["completed"] == 0
    # its blocks come free, its full ones cached (its prompt's block at least: vLLM caches every full block)
    summary = result.summary
    assert (summary["mgr_frees"], summary["mgr_used_blocks"]) == (1, 0)
    assert summary["mgr_free_blocks"] + summary["mgr_cached_blocks"] == 256 and summary["mgr_cached_blocks"] >= 1


def test_client_timeout_is_vllm_v1s_alone():
    """On another scheduler --client-timeout would change nothing: refused in one line."""
    with pytest.raises(ConfigError, match="client_timeout_s=.* applies to the vllm-v1 scheduler"):
        SimConfig.for_system("vllm", client_timeout_s=300.0)
