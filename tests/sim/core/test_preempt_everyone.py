"""A decode step that preempts every running request (sim/core/sched/scheduler_vllm.py, ``schedule``): vLLM's iteration is then empty and the next one, at the
same instant, admits or swaps in again into the emptied pool. Here both are one iteration;
before, the engine slept with the pool empty and a request waiting, and ``--check`` (or the
core) stopped with "waits for memory in an empty pool". And a swapped request comes back only
with a free block per sequence left after it (vLLM's ``can_swap_in``); one that cannot even
with nothing else running is recomputed: before, it came back, was preempted before any
decode step and went out again, forever.

The pool: 3 blocks of 4 slots (OPT-13B, no watermark, max_seq_len 12). A (prompt 8, output 4)
runs alone, vLLM's one free block per sequence::

    step 0  A prefills 8 tokens (2 blocks, 1 free) and samples its 1st token
    step 1  A's 9th token crosses into the 3rd block (it takes the free one): 2nd token
    step 2  A's 10th token needs a free block at its turn and there is none: A, the only
            running request, is preempted. The same iteration brings it back into the empty
            pool: recompute: it prefills 8 + 2 = 10 tokens (3 blocks) and samples its 3rd;
            swap: its 9 tokens go out, but coming back (3 blocks) would leave no block for
            its next token and nothing else runs, so it is recomputed as well
    step 3  the same with 11 tokens: its 4th and last token
"""

from __future__ import annotations

import pytest

from pagesim.sim.run import run_simulation
from tests.sim.helpers import ends_within

POOL = dict(kv_slots=12, max_seq_len=12, block_size=4)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preempting_every_request_admits_again_in_the_same_iteration(simulate, opt13b_config, tiny_trace,
                                                                     swap_gib_for, opt13b_a100, preemption):
    cfg = opt13b_config(**POOL, preemption=preemption, swap_gib=swap_gib_for(100))
    with ends_within(120):
        result = simulate(cfg, tiny_trace((0.0, 8, 4)))
    assert result.requests["status"].tolist() == ["finished"]
    assert result.requests["preemptions"].tolist() == [2]
    steps = result.steps
    assert steps["num_prefill_tokens"].tolist() == [8, 0, 10, 11]
    assert steps["num_decode_tokens"].tolist() == [0, 1, 0, 0]
    assert steps["batch_size"].tolist() == [1, 1, 1, 1]  # no step without a sequence
    swapped = [0, 0, 9, 10] if preemption == "swap" else [0, 0, 0, 0]  # out, then recomputed
    assert result.summary["num_swap_fallbacks"] == (2 if preemption == "swap" else 0)
    hand = [opt13b_a100.step(prefills=[(8, 0)]), opt13b_a100.step(decode_contexts=[9], kernel_block=4),
            opt13b_a100.step(prefills=[(10, 0)], swapped_tokens=swapped[2], block_size=4),
            opt13b_a100.step(prefills=[(11, 0)], swapped_tokens=swapped[3], block_size=4)]
    assert steps["dt_s"].to_numpy() == pytest.approx(hand, rel=1e-12)


def test_parallel_samples_that_cannot_all_write_are_recomputed_until_done(opt13b_config, tiny_trace):
    # (repro r_fork_cow.py) n = 8 samples of a 7-token prompt in a pool of 2 blocks of 16: the
    # prompt's block is shared by the 8 after the prefill, and the first decode step would copy
    # it 7 times (copy-on-write) with 1 block free: the request is preempted, recomputed with its
    # sampled token as prompt, and samples one more token each time; 6 preemptions, 7 prefills
    trace = tiny_trace((0.0, 7, 7))
    trace["n"] = [8]
    cfg = opt13b_config(32, max_seq_len=17, block_size=16, check=True)
    with ends_within(120):
        result = run_simulation(cfg, trace)
    assert result.requests["status"].tolist() == ["finished"]
    assert result.requests["preemptions"].tolist() == [6]
    assert result.steps["num_prefill_tokens"].tolist() == [7, 8, 9, 10, 11, 12, 13]
    assert result.steps["num_decode_tokens"].tolist() == [0] * 7


def test_orca_predicted_decode_step_preempting_everyone_is_no_invariant_error(capsys):
    # the command: Orca with predicted reservations in 2 GiB of KV preempts every
    # running request when their extents overflow at once; it ended in exit 2
    from pagesim.sim.cli import main

    with ends_within(300):
        rc = main(["simulate", "--workload", "sharegpt", "--rate", "8", "--duration", "60", "--system", "orca-max",
                   "--reservation", "predicted", "--kv-gib", "2", "--no-progress", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    import json

    summary = json.loads(out)
    assert summary["completed"] + summary["rejected"] == summary["workload"]["rows"]
    assert summary["unfinished"] == 0 and summary["num_preemptions"] > 0


@pytest.mark.parametrize("check", [False, True])
def test_swapped_parallel_samples_never_live_lock(opt13b_config, tiny_trace, swap_gib_for, check):
    # (repro r_swap_livelock.py) n = 2 samples growing to 68 tokens each in 4 blocks of 32:
    # both cannot finish side by side (6 blocks). Swapped out at 33 tokens each, they could
    # come back (4 blocks) only with no block left for their next tokens, so they are
    # recomputed (their shared prompt then grows); before, they came back and went out again
    # forever, simulated time growing without bound
    trace = tiny_trace((0.0, 23, 45))
    trace["n"] = [2]
    cfg = opt13b_config(128, max_seq_len=100, block_size=32, preemption="swap", swap_gib=swap_gib_for(1000),
                        check=check)
    with ends_within(120):
        result = run_simulation(cfg, trace)
    assert result.requests["status"].tolist() == ["finished"]
    assert result.summary["num_swap_fallbacks"] >= 1
    assert result.summary["total_output_tokens"] == 2 * 45


def test_a_long_chunked_prefill_is_no_live_lock(opt13b_config, tiny_trace):
    # the guard's bound (sim/core/sched/scheduler_vllm.py, steps_without_token_limit): a prompt of 1,500
    # tokens in 1-token chunks goes 1,500 iterations without a token, and that is no live lock
    cfg = opt13b_config(2048, max_seq_len=2048, chunked_prefill=True, chunk_budget=1)
    result = run_simulation(cfg, tiny_trace((0.0, 1500, 2)))
    assert result.requests["status"].tolist() == ["finished"]
    assert len(result.steps) == 1500 + 1
