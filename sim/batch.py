"""What one iteration computes, as a cost model's ``step_time`` prices it outside a run: the GPU
executor's step plan carries one (``gpu/executor.py``), the cost-error tables and Fig. 19's
microbenchmark build them. Inside a run the core's loop prices its own arrays
(``sim.core.loop.step_time``), with the same functions.
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class StepBatch:
    """One iteration's work. Arrays are int64, aligned per sequence.

    prefill_*: sequences computing prompt tokens this step (a whole prompt, or a chunk under
    chunked prefill); ``prefill_context`` is each one's length after the chunk. decode_*:
    sequences generating one token; ``decode_context`` includes that token, and
    ``decode_context_sum`` is what the cost models read (it may be given without the array).
    """

    def __init__(self, prefill_seq_ids=_EMPTY, prefill_tokens=_EMPTY, prefill_context=_EMPTY,
                 decode_seq_ids=_EMPTY, decode_context=_EMPTY, swap_in_tokens: int = 0,
                 swap_out_tokens: int = 0, copy_blocks: int = 0, decode_context_sum: int | None = None,
                 copy_tokens: int = 0):
        self.prefill_seq_ids = prefill_seq_ids
        self.prefill_tokens = prefill_tokens
        self.prefill_context = prefill_context
        self.decode_seq_ids = decode_seq_ids
        self.decode_context = decode_context
        self.decode_context_sum = int(decode_context.sum()) if decode_context_sum is None else int(decode_context_sum)
        self.swap_in_tokens = swap_in_tokens  # KV tokens copied host -> device before this step
        self.swap_out_tokens = swap_out_tokens  # KV tokens copied device -> host before this step
        self.copy_blocks = copy_blocks  # copy-on-write block copies this step
        self.copy_tokens = copy_tokens  # KV token slots those copies move (copy_blocks x block_size)

    @property
    def num_prefill_tokens(self) -> int:
        return int(self.prefill_tokens.sum())

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decode_seq_ids)

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_seq_ids) + len(self.decode_seq_ids)
