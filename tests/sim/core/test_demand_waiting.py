"""External fragmentation is free memory while a request waits for it (docs/design.md, "Where every
slot goes"). Under chunked prefill a request preempted in a step is not admitted again in that
step, even where it would fit (vLLM 0.4.2 puts the step's preempted back in its waiting queue
after the step's admissions, ``vllm/core/scheduler.py:857-858``): the memory its preemption
freed is free while it waits, so it is external fragmentation for that step."""

from __future__ import annotations


def test_a_request_preempted_in_a_chunked_step_waits_that_step_and_its_room_is_external(
        simulate, opt13b_config, tiny_trace):
    # 14 slots: 3 blocks of 4 and 2 leftover slots (always free). Chunked prefill, budget 16.
    # A (prompt 3, output 3), B (prompt 6, output 3):
    # step 0  both prompts (1 + 2 blocks, none free): first tokens
    # step 1  A's turn needs a free block (vLLM's one per sequence): none, so B, the latest, is
    #         preempted (2 blocks free) and A decodes its 2nd token in its own block. B (6 + 1
    #         tokens, 2 blocks) would fit, but is not admitted in the step that preempted it: it
    #         waits, and the 2 free blocks and the 2 leftover slots are external fragmentation
    # step 2  A's 3rd token takes a new block and A finishes; B does not fit the 1 block left
    #         before that and waits: 1 block and the 2 leftover slots are external
    # step 3  B prefills its 7 tokens (its 2nd token); step 4 it decodes its 3rd and finishes
    cfg = opt13b_config(14, max_seq_len=12, block_size=4, chunked_prefill=True, chunk_budget=16)
    steps = simulate(cfg, tiny_trace((0.0, 3, 3), (0.0, 6, 3))).steps
    assert steps["num_prefill_tokens"].tolist() == [9, 0, 0, 7, 0]
    assert steps["num_decode_tokens"].tolist() == [0, 1, 1, 0, 1]
    assert steps["num_waiting"].tolist() == [0, 1, 1, 0, 0]
    assert steps["mem_external_frag"].tolist() == [0, 8 + 2, 4 + 2, 0, 0]
    assert steps["mem_free_idle"].tolist() == [2, 0, 0, 4 + 2, 4 + 2]  # step 3: A's blocks are back
