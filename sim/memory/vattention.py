"""vAttention: virtually contiguous KV per sequence, physical pages committed on demand.

Each sequence reserves a virtual range of ``max_seq_len`` tokens (free: it is only address
space); physical pages of ``page_tokens`` tokens are mapped into it as the sequence grows::

    virtual (per seq)  [p0][p1][p2][  ...  unmapped up to max_seq_len  ...  ]
                         |   |   |
    physical pool      [  ][p1][  ][p0][  ][p2][  ]   page_tokens per page (per layer: page_bytes)

Memory-wise this is paging with block = page (so it reuses :class:`PagedManager` accounting:
the last page's unfilled slots are reservation up to F, the rest internal_frag; pages are
exported as blocks), with three differences: the page size comes from bytes (64 KiB or 2 MiB
per layer, so it may exceed 256 tokens), there is no prefix caching, and ``fork`` copies the
parent's pages eagerly (no copy-on-write sharing; ``fork_copies`` counts copied pages).

Page size in tokens (the brief's formula; one page holds K and V of one layer)::

    page_tokens = floor(page_bytes / kv_bytes_per_layer_token(tp)),  >= 1
                  (2 * kv_heads_per_gpu * head_dim * dtype_bytes: ``sim/specs/model.py``)
    OPT-13B fp16, tp 1: 64 KiB -> 3 tokens, 2 MiB -> 102 tokens
"""

from __future__ import annotations

from pagesim.sim.errors import ConfigError, OutOfMemory
from pagesim.sim.memory.base import settle_lane_before
from pagesim.sim.memory.paged import PagedManager


def vattention_page_tokens(model, page_bytes: int, tp: int = 1) -> int:
    """Tokens per physical page of ``page_bytes`` per layer for ``model`` at tensor parallel ``tp``."""
    if page_bytes <= 0:
        raise ConfigError(f"vattention page size must be > 0 bytes, got {page_bytes} (e.g. 64 KiB)")
    return max(1, int(page_bytes // model.kv_bytes_per_layer_token(tp)))


@settle_lane_before
class VAttentionManager(PagedManager):
    kind = "vattention"
    MAX_BLOCK_SIZE = None

    def __init__(self, capacity: int, max_seq_len: int, page_tokens: int, watermark: float = 0.01,
                 append_rule: str = "free-block-per-seq"):
        if page_tokens < 1:
            raise ConfigError(f"page_tokens must be >= 1, got {page_tokens} (e.g. vattention_page_kib=64)")
        super().__init__(capacity, max_seq_len, block_size=page_tokens, watermark=watermark,
                         prefix_caching=False, append_rule=append_rule)
        self.page_tokens = int(page_tokens)

    def can_fork(self, parent_id: int, child_final_len: int | None = None) -> bool:
        self._check_seq(parent_id)
        return int(self._nb[parent_id]) <= self.num_free_blocks()

    def _share(self, p: int, c: int, table: list[int], Fp: int, Fc: int) -> None:
        """Copy the parent's pages into fresh ones (no sharing in vAttention)."""
        if len(table) > self.num_free_blocks():
            raise OutOfMemory(f"no room to copy sequence {p}'s {len(table)} pages")
        for i, b in enumerate(table):
            n = self._take()
            f = int(self._filled[b])
            self._filled[n] = f
            self._token_states += f
            d = self._d(Fc, i)
            self._dem[n] = d
            self._demand += d
            table[i] = n
            self._counters["fork_copies"] += 1
