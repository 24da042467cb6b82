"""What one engine iteration computes, as handed from the scheduler to an executor.

The simulated executor turns a :class:`StepBatch` into a duration with a cost model; the GPU
executor (``gpu/executor.py``) runs the same batch for real over the manager's live block
tables. Both implement :class:`Executor`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class StepBatch:
    """One iteration's work. Arrays are int64, aligned per sequence.

    prefill_*: sequences computing prompt tokens this step (a whole prompt, or a chunk
    under chunked prefill); ``prefill_context`` is each one's length after the chunk.
    decode_*: sequences generating one token; ``decode_context`` includes that token.
    ``decode_context_sum`` is kept separately so cost models never need the array (the
    scheduler materializes ``decode_context`` lazily, only for executors that read it).
    """

    __slots__ = ("prefill_seq_ids", "_prefill_tokens", "_num_prefill", "prefill_context", "decode_seq_ids",
                 "_decode_context", "_decode_context_fn", "decode_context_sum", "swap_in_tokens",
                 "swap_out_tokens", "copy_blocks", "copy_tokens")

    def __init__(self, prefill_seq_ids=_EMPTY, prefill_tokens=_EMPTY, prefill_context=_EMPTY,
                 decode_seq_ids=_EMPTY, decode_context=None, swap_in_tokens: int = 0,
                 swap_out_tokens: int = 0, copy_blocks: int = 0):
        self.prefill_seq_ids = prefill_seq_ids
        self.prefill_tokens = prefill_tokens
        self.prefill_context = prefill_context
        self.decode_seq_ids = decode_seq_ids
        self._decode_context = None
        self._decode_context_fn = None
        self.decode_context_sum = 0
        self.swap_in_tokens = swap_in_tokens  # KV tokens copied host -> device before this step
        self.swap_out_tokens = swap_out_tokens  # KV tokens copied device -> host before this step
        self.copy_blocks = copy_blocks  # copy-on-write block copies this step
        self.copy_tokens = 0  # KV token slots those copies move (copy_blocks x block_size)
        if decode_context is not None:
            self.decode_context = decode_context

    @property
    def decode_context(self) -> np.ndarray:
        if self._decode_context is None:
            self._decode_context = self._decode_context_fn() if self._decode_context_fn else _EMPTY
        return self._decode_context

    @decode_context.setter
    def decode_context(self, ctx: np.ndarray) -> None:
        self._decode_context = ctx
        self.decode_context_sum = int(ctx.sum()) if len(ctx) else 0

    def set_decode_context_lazy(self, total: int, fn) -> None:
        """Context lengths known by their sum now; the array is built only if asked for."""
        self._decode_context = None
        self._decode_context_fn = fn
        self.decode_context_sum = int(total)

    @property
    def prefill_tokens(self) -> np.ndarray:
        return self._prefill_tokens

    @prefill_tokens.setter
    def prefill_tokens(self, tokens: np.ndarray) -> None:
        self._prefill_tokens = tokens
        self._num_prefill = None

    def set_prefill(self, seq_ids: np.ndarray, tokens: list[int], context: np.ndarray) -> None:
        """The prefilling sequences, their new tokens (a list, summed here once) and their
        context after this step."""
        self.prefill_seq_ids = seq_ids
        self._prefill_tokens = np.array(tokens, dtype=np.int64)
        self._num_prefill = sum(tokens)
        self.prefill_context = context

    @property
    def num_prefill_tokens(self) -> int:
        if self._num_prefill is None:  # summed once: the cost model and the recorder both ask
            p = self._prefill_tokens
            self._num_prefill = int(p.sum()) if len(p) else 0
        return self._num_prefill

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decode_seq_ids)

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_seq_ids) + len(self.decode_seq_ids)

    @property
    def is_empty(self) -> bool:
        return (len(self.prefill_seq_ids) == 0 and len(self.decode_seq_ids) == 0
                and self.swap_in_tokens == 0 and self.swap_out_tokens == 0)


class Executor(Protocol):
    """Runs (or prices) one iteration and returns how long it took, in seconds."""

    def run_step(self, batch: StepBatch, manager) -> float: ...
