"""Swap preemption with prefix caching (sim/core/sched/scheduler_vllm.py, its swap-in): a
sequence swapped back in holds exactly the tokens it left with, its cached prefix counted once.

A pool of 3 blocks of 4 slots (OPT-13B, no watermark), 4-token hash blocks. A (prompt 4,
output 3) and B (prompt 6, output 3) arrive together and share their first block's hash::

    step 0  admit A (1 block, hash h) and B: h is a hit (A's block, shared), so B takes one
            new block, but computes all 6 tokens: vLLM 0.4.2 skips only blocks marked computed,
            which a step marks once scheduled (kv_cache.mark_computed). 2 blocks used, 1 free;
            4 + 2 tokens held
    step 1  decode. A needs a free block (its 5th token crosses), takes the last one; B, the
            latest, finds none (vLLM's one free block per sequence) and is swapped out: its
            6 tokens go to the CPU; its own block is freed, h stays with A. A holds 5 tokens
    step 2  B stays out: h is a hit again, so it would need 1 new block (1 is free), but then
            no block would be left for its next token (vLLM's can_swap_in: one free block per
            sequence after the swap-in; without it B would come back only to be preempted
            again). A decodes its 6th token and finishes
    step 3  B comes back (h is cached, unreferenced, and is reused, plus 1 new block; 1 of 3
            stays free) holding 6 tokens (4 cached + 2 swapped in; counting the 4 twice would
            need 3 blocks and leave none), decodes its 7th token
    step 4  B decodes its 8th token and finishes: preempted once, never recomputed
"""

from __future__ import annotations

import pandas as pd
import pytest

from pagesim.sim.run import run_simulation


@pytest.mark.parametrize("check", [False, True], ids=["plain", "checked"])
def test_swapped_in_sequence_counts_its_cached_prefix_once(opt13b_config, opt13b_a100, swap_gib_for, check):
    trace = pd.DataFrame({"request_id": ["A", "B"], "arrival_s": [0.0, 0.0], "prompt_tokens": [4, 6],
                          "output_tokens": [3, 3], "prefix_hashes": [(7,), (7,)]})
    trace.attrs["hash_block_tokens"] = 4
    cfg = opt13b_config(12, max_seq_len=12, block_size=4, prefix_caching=True, preemption="swap",
                        swap_gib=swap_gib_for(100), check=check)
    result = run_simulation(cfg, trace)
    steps = result.steps
    assert result.requests["status"].tolist() == ["finished", "finished"]
    assert result.requests["preemptions"].tolist() == [0, 1]
    assert steps["num_prefill_tokens"].tolist() == [4 + 6, 0, 0, 0, 0]
    assert steps["mem_token_states"].tolist() == [4 + 2, 5, 6, 6 + 1, 6 + 2]
    assert steps["used_blocks"].tolist() == [2, 2, 2, 2, 2]
    hand = [opt13b_a100.step(prefills=[(4, 0), (6, 0)]),
            opt13b_a100.step(decode_contexts=[5], swapped_tokens=6, block_size=4, kernel_block=4),
            opt13b_a100.step(decode_contexts=[6], kernel_block=4),
            opt13b_a100.step(decode_contexts=[7], swapped_tokens=6, block_size=4, kernel_block=4),
            opt13b_a100.step(decode_contexts=[8], kernel_block=4)]
    assert steps["dt_s"].to_numpy() == pytest.approx(hand, rel=1e-12)
