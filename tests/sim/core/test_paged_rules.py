"""The paged manager's rules (sim/core/kv/kv_cache.py), pinned by tiny runs worked out by hand
(``simulate``, conftest.py): where every KV slot goes (the six categories, read from the step
table), and vLLM's watermark. The same rules on the core's functions directly:
tests/sim/core/test_kv_cache.py."""

from __future__ import annotations


CATEGORIES = ["mem_token_states", "mem_reservation", "mem_internal_frag", "mem_allocator_slack",
              "mem_external_frag", "mem_free_idle"]


def test_memory_categories_in_a_hand_built_run(simulate, opt13b_config, tiny_trace):
    # 13 slots: 3 blocks of 4 and 1 leftover slot no block can use (it counts as free). With
    # swap preemption: A (prompt 4, output 3, final length F = 7) and B (6, 3, F = 9) at 0, C
    # (3, 2, F = 5) at 1 ms. Each row is taken after the step's memory operations. A block's
    # slots its request will fill (up to F) are token states if computed, else reservation;
    # the rest of the block is internal fragmentation. Free slots are external fragmentation
    # while a request waits for memory, else free and idle.
    #
    # step 0  A 1 block, 4 tokens (F = 7: the block fills);
    #         B 2 blocks, 6 tokens, 2 more to come in them (F = 9 > 8)    10, 2, 0, 0, 0, 1
    # step 1  C cannot be admitted (no block). B is swapped out (its slots count nowhere);
    #         A takes a block: 5 tokens in 8 slots, F = 7 -> 2 to come, 1 never filled;
    #         free: 1 block + the leftover slot = 5, C waits for memory  5, 2, 1, 0, 5, 0
    # step 2  B cannot come back (needs 2 blocks, 1 free); A 6 tokens      6, 1, 1, 0, 5, 0
    # step 3  A finished. B is swapped out, so nobody is admitted (vLLM 0.4.2); nothing
    #         decodes or is preempted, so B comes back (2 blocks and 1 for its next token
    #         fit the 3 free) and decodes: 7 tokens, F = 9 -> 1 more to come in them. C waits
    #         behind the swapped request, not for memory: free and idle    7, 1, 0, 0, 0, 5
    # step 4  nobody swapped out: C admitted (1 block, 3 tokens, F = 5 -> its 4th slot to
    #         come); a prompt step, B does not decode                        10, 2, 0, 0, 0, 1
    # step 5  B and C decode: 8 of 8 and 4 of 4; both finish with it        12, 0, 0, 0, 0, 1
    # (append_rule exact: step 5's decode takes no block; vLLM's one free block per sequence
    # would preempt C there, see tests/sim/core/test_vllm_policy.py)
    cfg = opt13b_config(13, max_seq_len=12, block_size=4, preemption="swap", append_rule="exact")
    result = simulate(cfg, tiny_trace((0.0, 4, 3), (0.0, 6, 3), (0.001, 3, 2)))
    rows = result.steps[CATEGORIES].to_numpy()
    assert rows.tolist() == [[10, 2, 0, 0, 0, 1],
                             [5, 2, 1, 0, 5, 0],
                             [6, 1, 1, 0, 5, 0],
                             [7, 1, 0, 0, 0, 5],
                             [10, 2, 0, 0, 0, 1],
                             [12, 0, 0, 0, 0, 1]]
    assert (rows.sum(axis=1) == 13).all()  # every slot in exactly one category
    assert result.steps["used_blocks"].tolist() == [3, 2, 2, 2, 3, 3]


def test_admission_leaves_the_watermark_free(simulate, opt13b_config, tiny_trace):
    # 4 blocks of 4, watermark 0.25: int(0.25 x 4) = 1 block must stay free at admission.
    # A (prompt 8) leaves 4 - 2 = 2; B (prompt 8) would leave 0: it waits for A to finish
    cfg = opt13b_config(16, max_seq_len=16, block_size=4, watermark=0.25)
    result = simulate(cfg, tiny_trace((0.0, 8, 1), (0.0, 8, 1)))
    assert result.steps["num_prefill_tokens"].tolist() == [8, 8]


def test_prompt_beyond_pool_less_watermark_is_rejected(simulate, opt13b_config, tiny_trace):
    # the same pool: a 13-token prompt needs 4 blocks, more than the 4 - 1 the watermark
    # leaves, so it can never be admitted: rejected, and B behind it runs at once
    cfg = opt13b_config(16, max_seq_len=16, block_size=4, watermark=0.25)
    result = simulate(cfg, tiny_trace((0.0, 13, 1), (0.0, 8, 1)))
    assert result.requests["status"].tolist() == ["rejected", "finished"]
    assert "watermark" in result.requests["reject_reason"][0]
    assert result.steps["num_prefill_tokens"].tolist() == [8]


def test_preempted_request_regrown_past_pool_less_watermark_comes_back_to_an_empty_pool(
        simulate, opt13b_config, tiny_trace):
    # 8 blocks of 2, watermark 0.25: 2 blocks. A (prompt 1, output 4), B (prompt 10, output 4),
    # exact append rule:
    # step 0  A 1 block, leaves 7 >= 2; B 5 blocks, leaves 2 >= 2: both prefill (1 + 10)
    # step 1  A 2 tokens (its block), B 11 (a new block): 1 free
    # step 2  A 3 (a new block), B 12: 0 free
    # step 3  B's 13th token needs a block: B, the latest, is preempted with 3 tokens out; its
    #         prompt regrows to 10 + 3 = 13 tokens, 7 blocks: more than 8 - 2. A decodes its
    #         4th token and finishes
    # step 4  the pool is empty: B has produced output, so the watermark only delays it (it
    #         would leave 1 block, not 2) and it does not reject it; B prefills its 13 tokens
    #         again and samples its 4th and last
    cfg = opt13b_config(16, max_seq_len=16, block_size=2, watermark=0.25, append_rule="exact")
    result = simulate(cfg, tiny_trace((0.0, 1, 4), (0.0, 10, 4)))
    assert result.requests["status"].tolist() == ["finished", "finished"]
    assert result.requests["preemptions"].tolist() == [0, 1]
    assert result.steps["num_prefill_tokens"].tolist() == [11, 0, 0, 0, 13]
    assert result.steps["num_decode_tokens"].tolist() == [0, 2, 2, 1, 0]

