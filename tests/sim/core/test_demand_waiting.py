"""External fragmentation is free memory while a request waits for it (docs/design.md, "Where every
slot goes"): a step after which nobody waits records its free slots as ``free_idle``, even when
its decode preempted a request for memory that the same iteration took back (chunked prefill
admits it again at once). It used to keep the preemption's "someone waits" for the step."""

from __future__ import annotations


def test_a_request_preempted_and_admitted_again_in_one_iteration_leaves_nobody_waiting(
        simulate, opt13b_config, tiny_trace):
    # 14 slots: 3 blocks of 4 and 2 leftover slots (always free). Chunked prefill, budget 16.
    # A (prompt 3, output 3), B (prompt 6, output 3):
    # step 0  both prompts (1 + 2 blocks, none free): first tokens
    # step 1  A's turn needs a free block (vLLM's one per sequence): none, so B, the latest, is
    #         preempted (2 blocks free) and A decodes its 4th token in its own block; with 15
    #         tokens of budget left, B (6 + 1 tokens, 2 blocks) is admitted again and prefills.
    #         Nobody waits: the 2 leftover slots are free_idle
    # step 2  A's 5th token needs a block: B is preempted again, A takes 1 of its 2 blocks and
    #         finishes; B (8 tokens, 2 blocks) does not fit the 1 left and waits: 1 block and
    #         the 2 leftover slots are external fragmentation
    # step 3  B prefills its 8 tokens (2 of the 3 blocks) and finishes
    cfg = opt13b_config(14, max_seq_len=12, block_size=4, chunked_prefill=True, chunk_budget=16)
    steps = simulate(cfg, tiny_trace((0.0, 3, 3), (0.0, 6, 3))).steps
    assert steps["num_prefill_tokens"].tolist() == [9, 7, 0, 8]
    assert steps["num_decode_tokens"].tolist() == [0, 1, 1, 0]
    assert steps["num_waiting"].tolist() == [0, 0, 1, 0]
    assert steps["mem_external_frag"].tolist() == [0, 0, 4 + 2, 0]
    assert steps["mem_free_idle"].tolist() == [2, 2, 0, 4 + 2]  # step 3: A's blocks are back
