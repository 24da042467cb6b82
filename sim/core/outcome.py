"""What a run left in the core's arrays, in the words and numbers its records carry: why each
rejected request was turned away (the core keeps a code, ``state.REJECT_*``), and the memory
manager's event counters (the summary's ``mgr_*`` keys)."""

from __future__ import annotations

import numpy as np

from pagesim.sim.core import state
from pagesim.sim.core.kv import extent, placement
from pagesim.sim.core.build import Limits, Pool


def reject_reasons(s: state.Core, pool: Pool, limits: Limits, cfg) -> np.ndarray:
    """One line per request (empty where it was not rejected)."""
    reasons = np.full(len(s.reject_code), "", dtype=object)
    for i in np.flatnonzero(s.reject_code).tolist():
        reasons[i] = reject_reason(s, int(s.reject_code[i]), i, pool, limits, cfg)
    return reasons


def reject_reason(s: state.Core, code: int, i: int, pool: Pool, limits: Limits, cfg) -> str:
    width = int(s.width[i])
    if code == state.REJECT_CLIENT_TIMEOUT:
        return f"its client gave up after {cfg.client_timeout_s:g} s (--client-timeout)"
    if code == state.REJECT_TOO_WIDE and width > limits.max_num_seqs:  # its sequences run together: never admitted
        return f"its {width} sequences (n / beam_width) exceed max_num_seqs={limits.max_num_seqs}"
    if code == state.REJECT_TOO_WIDE:  # swapped out, it could never come back (scheduler_vllm.resume_swapped)
        budget, name = ((cfg.chunk_budget, "chunk_budget") if cfg.chunked_prefill
                        else (limits.max_batched_tokens, "max_num_batched_tokens"))
        return f"its {width} sequences decode together, beyond {name}={budget}: swapped out, never back in"
    if code == state.REJECT_WIDTH_UNSHARED:
        if pool.kind == "static":
            return "static batching runs one sequence per request (n = beam_width = 1)"
        if cfg.capabilities.one_sequence_per_request:
            return cfg.capabilities.one_sequence_per_request
        return (f"parallel sampling / beam search (width {width}) needs a manager that shares "
                "blocks (paged); this one would copy whole reservations")
    prompt = int(s.prompt_target[i])  # what this admission would hold: prompt (+ regenerated)
    if code == state.REJECT_OVER_BATCHED_TOKENS:
        return f"prompt of {prompt} tokens exceeds max_num_batched_tokens={limits.max_batched_tokens}"
    return never_fits_reason(s, i, prompt, pool, cfg)


def never_fits_reason(s: state.Core, i: int, prompt: int, pool: Pool, cfg) -> str:
    """Why request ``i``, to hold ``prompt`` tokens at admission, can never fit."""
    final, longest = int(s.final_len[i]), pool.max_seq_len
    within = final <= longest and prompt <= longest
    if within and pool.has_blocks:
        prompt_blocks = -(-prompt // pool.block_size)
        watermark = pool.watermark_blocks
        if s.num_generated[i] > 0:  # resumed: the watermark may delay it, never turn it away
            watermark = max(min(watermark, pool.num_blocks - prompt_blocks), 0)
        return (f"sequence {i}: its prompt needs {prompt_blocks} blocks, more than the {pool.num_blocks} blocks "
                f"less the {watermark}-block watermark")
    if within and pool.kind == "contiguous":
        reserved = int(extent.request_size(s, i, prompt))
        placed = int(placement.placed_size(s, reserved))
        return (f"sequence {i}: its {cfg.reservation} reservation of {reserved} slots ({placed} placed) exceeds "
                f"the largest {cfg.placement} extent {pool.largest_extent}")
    if final > longest:
        return f"sequence {i}: final length {final} exceeds max_seq_len {longest}"
    return f"sequence {i}: can never fit in a {pool.capacity}-slot pool"


def manager_counters(s: state.Core, pool: Pool) -> dict[str, int]:
    """The memory manager's event counters at the end of the run (the summary's ``mgr_*``)."""
    c = s.count
    if not pool.has_blocks:
        return {"allocations": int(c[state.NUM_ALLOCATIONS]), "frees": int(c[state.NUM_FREES]),
                "fork_copies": 0,  # forks are refused where they would copy (REJECT_WIDTH_UNSHARED)
                "overflows": int(c[state.NUM_OVERFLOWS]), "moves": int(c[state.NUM_MOVES]),
                "grows_in_place": int(c[state.NUM_GROWS_IN_PLACE]), "num_seqs": int(c[state.NUM_RUNNING_SEQS])}
    free, cached = int(c[state.NUM_FREE_BLOCK_IDS]), int(c[state.NUM_LRU])
    keyed = int(np.count_nonzero(s.block_info[:, state.KEY_END])) if c[state.NUM_CACHED_KEYS] else 0
    return {"cow_copies": int(c[state.NUM_COW_COPIES]), "evictions": int(c[state.NUM_EVICTIONS]),
            "prefix_hit_tokens": int(c[state.PREFIX_HIT_TOKENS]),
            "prefix_lookup_tokens": int(c[state.PREFIX_LOOKUP_TOKENS]),
            "allocations": int(c[state.NUM_ALLOCATIONS]), "frees": int(c[state.NUM_FREES]),
            "forks": int(c[state.NUM_FORKS]), "fork_copies": 0,
            "cached_tokens": cached * pool.block_size, "cached_blocks": keyed, "free_blocks": free,
            "used_blocks": pool.num_blocks - free - cached, "num_seqs": int(c[state.NUM_RUNNING_SEQS])}
