"""vLLM's scheduling policy (sim/core/sched/scheduler_vllm.py), pinned by tiny
runs worked out by hand (``simulate``, conftest.py).

Most cases use a pool of 3 blocks of 4 slots (OPT-13B, no watermark) and two requests that
arrive together: A (prompt 4, output 3) and B (prompt 6, output 3). Step by step::

    step 0  admit A (1 block) and B (2 blocks), FCFS; no block left. Prefill 4 + 6 tokens:
            each has its first token (A holds 4 tokens, B 6)
    step 1  decode: A's 5th token needs a new block (4 = 1 x 4), B's 7th does not (6 of 8):
            one crossing and no free block, so the latest-admitted request, B, is preempted;
            A takes one of B's 2 blocks (5 tokens, its 2nd token)
              recompute: B's blocks are freed, it goes back to the queue's head, and its one
                         generated token becomes prompt (7 tokens to prefill)
              swap:      B's 6 tokens go to the CPU (6 x 819,200 B over PCIe in this step)
    step 2  B needs 2 blocks, 1 is free: it stays out. A decodes (6 tokens, 3rd token) and
            finishes: 3 blocks free
    step 3    recompute: B prefills 7 tokens again, sampling its 2nd token
              swap:      B's 6 tokens come back over PCIe and B decodes (context 7), its 2nd
    step 4  B decodes (context 8), its 3rd token: finished
"""

from __future__ import annotations

import pytest

from pagesim.sim.run import run_simulation
from tests.sim.helpers import ConstExecutor, cfg_for, trace_of

TIGHT_POOL = dict(kv_slots=12, max_seq_len=12, block_size=4)


@pytest.fixture
def tight_pool(opt13b_config):
    """tight_pool(**settings) -> the 3-block pool's SimConfig."""
    return lambda **settings: opt13b_config(**TIGHT_POOL, **settings)


@pytest.fixture
def a_and_b(tiny_trace):
    return tiny_trace((0.0, 4, 3), (0.0, 6, 3))


def column(result, name):
    return result.steps[name].tolist()


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_preempts_the_latest_admitted_request(simulate, tight_pool, a_and_b, preemption):
    result = simulate(tight_pool(preemption=preemption), a_and_b)
    assert result.requests["preemptions"].tolist() == [0, 1]  # B, not A
    assert result.summary["num_preemptions"] == 1
    assert column(result, "num_running")[1] == 1  # A ran step 1 alone
    assert column(result, "num_waiting")[1] == 1  # B waited (queued or swapped)
    a, b = result.requests["finish_s"]
    assert a < b


def test_recompute_prefills_prompt_and_generated_tokens_again(simulate, tight_pool, a_and_b, opt13b_a100):
    result = simulate(tight_pool(preemption="recompute"), a_and_b)
    assert column(result, "num_prefill_tokens") == [10, 0, 0, 7, 0]  # 7 = B's prompt 6 + 1 generated
    assert column(result, "num_decode_tokens") == [0, 1, 1, 0, 1]
    assert column(result, "num_waiting") == [0, 1, 1, 0, 0]
    assert result.steps["dt_s"][3] == pytest.approx(opt13b_a100.step(prefills=[(7, 0)]), rel=1e-12)
    b = result.requests.iloc[1]
    assert b["first_token_s"] == result.steps["dt_s"][0]  # its first token stays the first
    assert b["status"] == "finished"


def test_swap_out_and_back_in(simulate, tight_pool, a_and_b, swap_gib_for, opt13b_a100):
    # the CPU swap space holds exactly B's 6 tokens
    result = simulate(tight_pool(preemption="swap", swap_gib=swap_gib_for(6)), a_and_b)
    assert result.summary["num_preemptions"] == 1
    assert result.summary["num_swap_fallbacks"] == 0
    # B keeps its progress: no prefill after step 0, it decodes on from its 7th token
    assert column(result, "num_prefill_tokens") == [10, 0, 0, 0, 0]
    assert column(result, "num_decode_tokens") == [0, 1, 1, 1, 1]
    assert column(result, "num_waiting") == [0, 1, 1, 0, 0]
    # out: B's 2 blocks are free in step 1 (A holds 2: its prompt block and the new one);
    # in: step 3 holds B's 2 blocks with its 6 tokens back plus this step's one
    assert column(result, "used_blocks")[1] == 2
    assert column(result, "mem_token_states")[1] == 5  # A's alone
    assert column(result, "used_blocks")[3] == 2
    assert column(result, "mem_token_states")[3] == 6 + 1
    # PCIe time: 6 tokens out in step 1, 6 back in step 3
    hand = [opt13b_a100.step(prefills=[(4, 0), (6, 0)]),
            opt13b_a100.step(decode_contexts=[5], swapped_tokens=6, block_size=4, kernel_block=4),
            opt13b_a100.step(decode_contexts=[6], kernel_block=4),
            opt13b_a100.step(decode_contexts=[7], swapped_tokens=6, block_size=4, kernel_block=4),
            opt13b_a100.step(decode_contexts=[8], kernel_block=4)]
    assert result.steps["dt_s"].to_numpy() == pytest.approx(hand, rel=1e-12)
    b = result.requests.iloc[1]
    assert b["first_token_s"] == pytest.approx(hand[0], rel=1e-12)
    assert b["finish_s"] == pytest.approx(sum(hand), rel=1e-12)


def test_swap_falls_back_to_recompute_without_swap_space(simulate, tight_pool, a_and_b, swap_gib_for):
    # one token short of B's 6: B is recomputed, as in the recompute run
    result = simulate(tight_pool(preemption="swap", swap_gib=swap_gib_for(5)), a_and_b)
    assert result.summary["num_swap_fallbacks"] == 1
    assert column(result, "num_prefill_tokens") == [10, 0, 0, 7, 0]


@pytest.mark.parametrize("preemption,prefill_tokens,preemptions", [
    # C (prompt 3, output 2) arrives at 1 ms and waits behind the full pool. In step 2 one
    # block is free, enough for C, but B is still out (needs 2): nobody new is admitted.
    # Recompute: step 3 admits B (7, at the queue's head) and C (3) together; step 4 decodes
    # B and C with no block free and none crossing: vLLM's one free block per sequence
    # preempts C, the latest arrival; step 5 prefills its 3 + 1 tokens and it finishes.
    # Swap: while B is out nobody is admitted, and B comes back only after the decodes of a
    # step that preempted nobody (vLLM 0.4.2): step 3 (nothing runs) swaps B in, and it
    # decodes; step 4 admits C, its prefill running alone; step 5 preempts C as above (B
    # finishes); step 6 swaps C in (its block and one for its next token are free) and it
    # decodes its last token
    ("recompute", [10, 0, 0, 7 + 3, 0, 3 + 1], [0, 1, 1]),
    ("swap", [10, 0, 0, 0, 3, 0, 0], [0, 1, 1]),
], ids=["recompute", "swap"])
def test_no_admission_while_a_preempted_request_waits(simulate, tight_pool, tiny_trace, preemption,
                                                      prefill_tokens, preemptions):
    trace = tiny_trace((0.0, 4, 3), (0.0, 6, 3), (0.001, 3, 2))
    result = simulate(tight_pool(preemption=preemption), trace)
    assert column(result, "num_prefill_tokens") == prefill_tokens
    assert result.requests["preemptions"].tolist() == preemptions


def test_prefill_first_fcfs_within_the_token_budget(simulate, opt13b_config, tiny_trace):
    # A (prompt 40, output 3) is running when B and C (prompts 40, one output token each)
    # arrive during its prefill. Prefill-first: while prompts wait, an iteration runs only
    # prompts, FCFS, as many as max_num_batched_tokens = 64 holds: B alone (40 + 40 > 64),
    # then C; A decodes only after them (vLLM refuses a budget below max_seq_len = 64)
    cfg = opt13b_config(1024, max_seq_len=64, max_num_batched_tokens=64)
    result = simulate(cfg, tiny_trace((0.0, 40, 3), (0.001, 40, 1), (0.002, 40, 1)))
    assert column(result, "num_prefill_tokens") == [40, 40, 40, 0, 0]
    assert column(result, "num_decode_tokens") == [0, 0, 0, 1, 1]
    assert column(result, "batch_size") == [1, 1, 1, 1, 1]
    first = result.requests["first_token_s"].tolist()
    assert first[0] < first[1] < first[2]


def test_max_num_seqs_bounds_admission(simulate, opt13b_config, tiny_trace):
    # three one-token requests at once, at most two running: two prefills, then the third
    cfg = opt13b_config(1024, max_seq_len=64, max_num_seqs=2)
    result = simulate(cfg, tiny_trace((0.0, 6, 1), (0.0, 6, 1), (0.0, 6, 1)))
    assert column(result, "num_prefill_tokens") == [12, 6]


def test_queue_head_blocks_those_behind_it(simulate, tight_pool, tiny_trace):
    # A (prompt 8, output 2) holds 2 of the 3 blocks. B (prompt 8) needs 2 and C (prompt 4)
    # 1: C would fit in step 1, but B is ahead of it and does not: nobody is admitted and A
    # decodes (taking the free block for its 9th token) and finishes. Step 2 admits B and C
    trace = tiny_trace((0.0, 8, 2), (0.001, 8, 1), (0.002, 4, 1))
    result = simulate(tight_pool(), trace)
    assert column(result, "num_prefill_tokens") == [8, 0, 12]
    assert column(result, "num_decode_tokens") == [0, 1, 0]


@pytest.mark.parametrize("append_rule,prefill_tokens,decode_tokens,b_preemptions", [
    # A (prompt 4, output 3) then B (prompt 3, output 3) in the 3-block pool: step 0 prefills
    # both (1 block each, 1 free). Step 1 decodes: A's 5th token crosses into a new block,
    # B's 4th fits in its block.
    #   free-block-per-seq (vLLM v0's can_append_slots, member by member): A's turn finds 1
    #     free block and takes it; B's turn finds 0, so B, the latest, is preempted (its
    #     generated token becomes prompt: 4 to prefill). Step 2 re-admits B (1 block, the last
    #     one) and prefills 4 tokens. Step 3: A's 6th token fits its block, B's 5th crosses;
    #     A's turn finds no free block, so B is preempted again and A decodes its 3rd token,
    #     finishing. Step 4 prefills B's 3 + 2 tokens: its 3rd token.
    #   exact: step 1's one crossing fits the one free block: both decode (0 free). Step 2:
    #     B's 5th token crosses with nothing free: B is preempted and A finishes. Step 3
    #     prefills B's 3 + 2 tokens: its 3rd token.
    ("free-block-per-seq", [7, 0, 4, 0, 5], [0, 1, 0, 1, 0], 2),
    ("exact", [7, 0, 0, 5], [0, 2, 1, 0], 1),
])
def test_a_decode_step_needs_a_free_block_per_sequence(simulate, tight_pool, tiny_trace, append_rule,
                                                       prefill_tokens, decode_tokens, b_preemptions):
    result = simulate(tight_pool(append_rule=append_rule), tiny_trace((0.0, 4, 3), (0.0, 3, 3)))
    assert column(result, "num_prefill_tokens") == prefill_tokens
    assert column(result, "num_decode_tokens") == decode_tokens
    assert result.requests["preemptions"].tolist() == [0, b_preemptions]
    assert result.requests["status"].tolist() == ["finished", "finished"]


def test_swapped_requests_come_back_by_arrival_after_the_decodes():
    # Pool: 7 blocks of 4, swap preemption, steps of 1 s. A (prompt 4, output 12) and B (4, 5)
    # at 0, C (6, 12) at 0.5 s, D (4, 12) at 0.6 s. Running order is arrival order (vLLM 0.4.2
    # sorts its queues by arrival every step), and each request at its turn needs a free block
    # per sequence:
    #   step 0  A, B prefill (1 block each): 5 free
    #   step 1  C (2 blocks), D (1) prefill: 2 free
    #   step 2  A and B cross and take the 2 free blocks; C then finds none: the last, D, is
    #           swapped out (1 block back) and C decodes: 1 free
    #   step 5  A, at its turn, finds no free block (C crossed in step 4): C is swapped out
    #           (3 blocks), A and B decode; B finishes
    #   step 6  A takes a block (4 free left); after the decodes, with nobody preempted, the
    #           swapped come back by arrival: C first (its 3 blocks and 1 for its next token),
    #           which leaves 1, too few for D (swapped out first, but arrived later)
    #   step 10 A crosses with no block free: C, the later arrival, goes out again (4 blocks)
    #   steps 11-12: C, the swapped queue's head, needs 5 of the 3 free: D, behind it, waits
    #           too, though it would fit; A finishes in step 12
    #   step 13 C and D come back (5 + 2 of 7) and decode
    #   step 16 C crosses into the last free block; D finds none and, the last, goes out
    cfg = cfg_for("vllm", slots=28, block_size=4, max_seq_len=28, watermark=0.0, preemption="swap",
                  max_num_batched_tokens=64, check=True)
    executor = ConstExecutor(1.0)
    result = run_simulation(cfg, trace_of([(0.0, 4, 12), (0.0, 4, 5), (0.5, 6, 12), (0.6, 4, 12)]),
                            executor=executor)
    decoding = [batch[2] for batch in executor.batches]
    A, B, C, D = range(4)
    assert decoding[2:7] == [[A, B, C]] * 3 + [[A, B], [A, C]]
    assert decoding[10:14] == [[A]] * 3 + [[C, D]]
    assert decoding[16:18] == [[C], [D]]
    assert result.requests["preemptions"].tolist() == [0, 0, 2, 2]


def test_chunked_prefill_admits_while_a_request_is_swapped_out():
    # Chunked prefill (budget 16), swap preemption, the pool of 3 blocks of 4, steps of 1 s;
    # A (4, 3) and B (6, 3) at 0, C (3, 2) at 0.5 s:
    #   step 0  A (1 block) and B (2) prefill: no block free
    #   step 1  A crosses with no block free: B, the last, is swapped out (2 blocks back) and A
    #           takes one. A preemption: nobody swaps in; but new prompts are still scheduled
    #           (vLLM 0.4.2's chunked pass does not hold them back for a swapped request,
    #           scheduler.py:848-850): C (1 block) prefills
    #   step 2  A and C decode with no block free: C, the last, is swapped out and A decodes
    #           its last token
    #   step 3  B (arrived first) comes back with 2 blocks and 1 for its next token, and
    #           decodes; C's block and 1 more do not fit the 1 left
    #   step 4  B decodes its last token; step 5: C comes back and decodes its last
    cfg = cfg_for("vllm", slots=12, block_size=4, max_seq_len=12, watermark=0.0, preemption="swap",
                  chunked_prefill=True, chunk_budget=16, check=True)
    executor = ConstExecutor(1.0)
    result = run_simulation(cfg, trace_of([(0.0, 4, 3), (0.0, 6, 3), (0.5, 3, 2)]), executor=executor)
    A, B, C = range(3)
    assert [batch[0] for batch in executor.batches] == [[A, B], [C], [], [], [], []]  # prompts
    assert [batch[2] for batch in executor.batches] == [[], [A], [A], [B], [B], [C]]  # decodes
    assert result.requests["preemptions"].tolist() == [0, 1, 1]


# -- chunked prefill: vLLM 0.4.2's one pass over the running requests (scheduler_vllm.run_in_order)
def chunked_run(rows, budget, blocks=None, n=None, **settings):
    """``--system vllm`` with chunked prefill over ``rows`` (arrival, prompt, output; ``n``: each
    row's sequences), steps of 1 s, ``--check``, on ``blocks`` blocks of 4 and 2 leftover slots
    (no watermark) or a big pool: the result, and per step the prompts run, their tokens and the
    decoding requests."""
    pool = {} if blocks is None else dict(slots=blocks * 4 + 2, block_size=4, max_seq_len=blocks * 4, watermark=0.0)
    cfg = cfg_for("vllm", chunked_prefill=True, chunk_budget=budget, check=True, **pool, **settings)
    trace = trace_of(rows)
    if n is not None:
        trace["n"] = n
    executor = ConstExecutor(1.0)
    result = run_simulation(cfg, trace, executor=executor)
    steps = executor.batches
    return result, [b[0] for b in steps], [b[1] for b in steps], [b[2] for b in steps]


def test_chunked_pass_runs_by_arrival_and_the_request_that_finds_the_budget_spent_ends_it():
    # Budget 16, a big pool. A (prompt 16, output 4) and C (prompt 31, output 1) arrive together:
    #   step 0  A's prompt takes the whole budget; C waits for budget
    #   step 1  A decodes (1), C is admitted with the 15 left
    #   step 2  the running list as vLLM leaves it, new prompts before decodes among equal
    #           arrivals (scheduler.py:860-870, then its stable sort by arrival): C's chunk comes
    #           first and takes all 16, the rest of its prompt (its token: C finishes); A, at its
    #           turn, finds no budget and the pass ends: A does not decode this step
    #   steps 3 and 4  A decodes
    result, prompts, tokens, decoding = chunked_run([(0.0, 16, 4), (0.0, 31, 1)], 16)
    A, C = range(2)
    assert prompts == [[A], [C], [C], [], []]
    assert tokens == [[16], [15], [16], [], []]
    assert decoding == [[], [A], [], [A], [A]]


def test_chunked_step_does_not_readmit_whom_it_preempted_but_admits_who_waits_behind():
    # 3 blocks of 4 and 2 leftover slots, budget 16. A (3, 3) and B (6, 3) at 0, C (3, 1) at 0.5:
    #   step 0  A (1 block) and B (2) prefill: no block free
    #   step 1  A's turn needs a free block: B, the last, is preempted (2 free). B would fit
    #           again, but vLLM puts the step's preempted back in its queue after the step's
    #           admissions (scheduler.py:857-858): C (1 block) is admitted and prefills (and
    #           finishes: its one token)
    #   step 2  A's 3rd token takes a block and A finishes; B (7 tokens, 2 blocks) does not fit
    #           the 1 block left before that
    #   step 3  B prefills 6 + 1 tokens; step 4 it decodes its last
    result, prompts, tokens, decoding = chunked_run([(0.0, 3, 3), (0.0, 6, 3), (0.5, 3, 1)], 16, blocks=3)
    A, B, C = range(3)
    assert prompts == [[A, B], [C], [], [B], []]
    assert decoding == [[], [A], [A], [], [B]]
    assert result.requests["preemptions"].tolist() == [0, 1, 0]


def test_chunked_swap_out_mid_prompt_comes_back_to_prefill_the_rest():
    # 3 blocks of 4 and 2 leftover slots, budget 7, swap preemption. A (3, 3), B (6, 3) at 0:
    #   step 0  A prefills 3; B is admitted (2 blocks: its whole prompt's) and prefills 4
    #   step 1  A's turn needs a free block: B, mid-prompt, is swapped out (vLLM 0.4.2 swaps a
    #           group mid-prompt too, scheduler.py:564-567), its 4 tokens; A decodes
    #   step 2  A's 3rd token takes a block (1 left) and A finishes; B needs its whole
    #           prompt's 2 blocks back (1 would hold its 4 tokens) and 1 for its sequence: it
    #           stays out
    #   step 3  B comes back into 2 blocks with its 4 tokens and prefills the 2 left
    #           (unchunked, within the budget), its first token; steps 4 and 5 it decodes
    result, prompts, tokens, decoding = chunked_run([(0.0, 3, 3), (0.0, 6, 3)], 7, blocks=3, preemption="swap")
    A, B = range(2)
    assert prompts == [[A, B], [], [], [B], [], []]
    assert tokens == [[3, 4], [], [], [2], [], []]
    assert decoding == [[], [A], [A], [], [B], [B]]
    assert result.steps["used_blocks"].tolist()[3] == 2
    assert result.summary["num_swap_fallbacks"] == 0
    assert result.requests["preemptions"].tolist() == [0, 1]


def test_chunked_prompt_chunk_needs_a_free_block_at_its_turn():
    # 4 blocks of 4 and 2 leftover slots, budget 6. A (prompt 4, output 5), B (8, 2) at 0:
    #   step 0  A prefills 4 (1 block); B is admitted (2 blocks) and prefills 2: 1 block free
    #   step 1  A decodes: its 5th slot takes the free block. B's chunk at its turn asks a free
    #           block too (vLLM's can_append_slots, asked of every running group,
    #           block_manager_v1.py:308-318), though its blocks were all taken at admission:
    #           none, so the latest arrival, B itself, is preempted (recomputed)
    #   step 2  A decodes (2 blocks free); B, not admitted in the step that preempted it, is
    #           now: its 8 tokens' 2 blocks, a chunk of 5
    result, prompts, tokens, decoding = chunked_run([(0.0, 4, 5), (0.0, 8, 2)], 6, blocks=4)
    A, B = range(2)
    assert prompts[:3] == [[A, B], [], [B]]
    assert tokens[:3] == [[4, 2], [], [5]]
    assert decoding[:3] == [[], [A], [A]]
    assert result.requests["preemptions"].tolist()[1] >= 1


def test_chunked_step_leaves_decodes_before_prompt_chunks_among_equal_arrivals():
    # 7 blocks of 4 and 2 leftover slots, budget 8. A (prompt 8, output 8), B (9, 6) at 0:
    #   step 0  A prefills 8 (2 blocks); B waits for budget
    #   step 1  A decodes (its 9th slot, a 3rd block); B is admitted (3 blocks) with a chunk of
    #           7: 1 block free. vLLM leaves new prompts before decodes: [B, A]
    #   step 2  B's last 2 prompt tokens, then A's decode; vLLM leaves decodes before prompt
    #           chunks (scheduler.py:860-870): [A, B], and sorts by arrival, stable
    #   steps 3-4  both decode (slots 11, 12 of A; 10, 11 of B), no block taken
    #   step 5  A's 13th slot takes the free block; B, after A, finds none free and, the
    #           latest arrival, preempts itself. In the other order ([B, A]) both would fit
    result, prompts, tokens, decoding = chunked_run([(0.0, 8, 8), (0.0, 9, 6)], 8, blocks=7)
    A, B = range(2)
    assert prompts[:3] == [[A], [B], [B]]
    assert tokens[:3] == [[8], [7], [2]]
    assert decoding[:6] == [[], [A], [A], [A, B], [A, B], [A]]
    assert result.requests["preemptions"].tolist()[1] >= 1


def test_chunked_group_decodes_all_its_sequences_past_the_budget():
    # Budget 16, a big pool. A (prompt 16, output 4, n = 2) and C (prompt 30, output 1) at 0:
    #   step 0  A's prompt takes the budget; step 1 A forks and decodes 2, C prefills 14
    #   step 2  C's chunk comes first (a new prompt before decodes among equal arrivals) and
    #           takes all 16; A's turn: a group of several sequences is not chunked
    #           (_get_num_new_tokens, scheduler.py:1158-1162), so it decodes both, 18 tokens in
    #           all (vLLM 0.4.2 itself then fails its assertion, scheduler.py:852-853)
    result, prompts, tokens, decoding = chunked_run([(0.0, 16, 4), (0.0, 30, 1)], 16, n=[2, 1])
    A, C = range(2)
    assert tokens[:3] == [[16], [14], [16]]
    assert decoding[:3] == [[], [A], [A]]


def test_chunked_swap_in_waits_for_budget():
    # 5 blocks of 4 and 2 leftover slots, budget 3, swap. A (8, 2) at 0, B (7, 5) at 0.5, C (7, 3)
    # at 1.5:
    #   steps 0-2  A's prompt in chunks of 3, 3, 2 (2 blocks); step 2 admits B (2 blocks) with 1
    #   step 3  A decodes its 9th slot (a 3rd block: none free after); B's chunk at its turn finds
    #           no free block and B, the latest arrival, is swapped out mid-prompt (2 blocks
    #           free); C is admitted (2 blocks) with the 2 left. A finishes (3 blocks free)
    #   step 4  C's chunk takes the whole budget; B would fit in memory but has to wait for
    #           budget: its rest of prompt (6) is more than the budget (3), so it comes back a
    #           chunk at a time, and needs one token of budget left (vLLM asks its whole rest,
    #           scheduler.py:547-558, and would never bring it back)
    result, prompts, tokens, decoding = chunked_run([(0.0, 8, 2), (0.5, 7, 5), (1.5, 7, 3)], 3, blocks=5,
                                                    preemption="swap")
    A, B, C = range(3)
    assert prompts[:5] == [[A], [A], [A, B], [C], [C]]
    assert tokens[:5] == [[3], [3], [2, 1], [2], [3]]
    assert decoding[:5] == [[], [], [], [A], []]


def test_chunked_swap_ins_rejoin_decodes_before_prompts_among_equal_arrivals():
    # 3 blocks of 4 and 2 leftover slots, budget 9, swap. A (4, 3), B (4, 3), C (4, 4) at 0, D (9, 1)
    # at 0.5:
    #   step 0  A and B prefill 4 (1 block each), C 1 of its 4 (1 block): none free
    #   step 1  A's 5th slot needs a block: C, the last, is swapped out mid-prompt, and A takes its
    #           block; B then finds none free and swaps itself out. Swapped: [C, B] (equal
    #           arrivals, in the order they left)
    #   step 2  A decodes its last token; C's block and one more do not fit the 1 free
    #   step 3  C comes back and prefills its last 3; B comes back and decodes (a new block):
    #           none free. vLLM lists swapped-in decodes before swapped-in prompts
    #           (scheduler.py:866-869): [B, C]
    #   step 4  B's turn needs a free block: C, the last, is swapped out and B decodes its last
    result, prompts, tokens, decoding = chunked_run([(0.0, 4, 3), (0.0, 4, 3), (0.0, 4, 4), (0.5, 9, 1)], 9,
                                                    blocks=3, preemption="swap")
    A, B, C, D = range(4)
    assert prompts[:5] == [[A, B, C], [], [], [C], []]
    assert tokens[:5] == [[4, 4, 1], [], [], [3], []]
    assert decoding[:5] == [[], [A], [A], [B], [B]]


def test_chunked_prompt_alone_goes_on_though_its_blocks_fill_the_pool():
    # 3 blocks of 4 and 2 leftover slots, budget 4. A (prompt 11, output 1) takes all 3 blocks at
    # admission. vLLM 0.4.2 asks a free block for each later chunk, preempts A, admits it again,
    # and so on for ever; pagesim lets a prompt's chunk alone in the running list go on
    result, prompts, tokens, decoding = chunked_run([(0.0, 11, 1)], 4, blocks=3)
    assert tokens == [[4], [4], [3]]
    assert result.requests["status"].tolist() == ["finished"]
    assert result.requests["preemptions"].tolist() == [0]
