"""What one engine iteration computes, as handed from the scheduler to an executor.

The simulated executor turns a :class:`StepBatch` into a duration with a cost model; the GPU
executor (``gpu/executor.py``) runs the same batch for real over the manager's live block
tables. Both implement :class:`Executor`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class StepBatch:
    """One iteration's work. Arrays are int64, aligned per sequence.

    prefill_*: sequences computing prompt tokens this step (a whole prompt, or a chunk
    under chunked prefill); ``prefill_context`` is each one's length after the chunk.
    decode_*: sequences generating one token; ``decode_context`` includes that token.
    """

    prefill_seq_ids: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_tokens: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_context: np.ndarray = field(default_factory=lambda: _EMPTY)
    decode_seq_ids: np.ndarray = field(default_factory=lambda: _EMPTY)
    decode_context: np.ndarray = field(default_factory=lambda: _EMPTY)
    swap_in_tokens: int = 0  # KV tokens copied host -> device before this step
    swap_out_tokens: int = 0  # KV tokens copied device -> host before this step
    copy_blocks: int = 0  # copy-on-write block copies this step

    @property
    def num_prefill_tokens(self) -> int:
        return int(self.prefill_tokens.sum()) if len(self.prefill_tokens) else 0

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decode_seq_ids)

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_seq_ids) + len(self.decode_seq_ids)

    @property
    def is_empty(self) -> bool:
        return self.num_seqs == 0 and self.swap_in_tokens == 0 and self.swap_out_tokens == 0


class Executor(Protocol):
    """Runs (or prices) one iteration and returns how long it took, in seconds."""

    def run_step(self, batch: StepBatch, manager) -> float: ...
