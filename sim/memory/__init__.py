"""KV-cache memory managers with exact waste accounting (the vLLM paper's Fig. 2 categories).

    base.py        the protocol (can_allocate/allocate, can_append/append, fork, free, usage ...)
    static.py      StaticManager       B fixed max_seq_len slots (FasterTransformer)
    contiguous.py  ContiguousManager   one extent per sequence, max/pow2/oracle/predicted (Orca)
    placement.py   buddy / first-fit / best-fit placement of those extents
    paged.py       PagedManager        blocks + tables + CoW + prefix cache (vLLM);
                   TokenManager        paged with block_size 1 (TokenAttention / LightLLM)
    vattention.py  VAttentionManager   on-demand physical pages behind virtual contiguity

``make_manager(cfg, capacity_tokens, model)`` builds the one a :class:`SimConfig` names::

    cfg.manager   static       -> StaticManager(capacity, max_seq_len, static_batch_size)
                  contiguous   -> ContiguousManager(..., reservation, placement, predictor_error, seed)
                  paged        -> PagedManager(..., block_size, watermark, prefix_caching, append_rule)
                                  (TokenManager when block_size == 1)
                  vattention   -> VAttentionManager(..., page_tokens from vattention_page_kib, watermark)
"""

from __future__ import annotations

from pagesim.sim.errors import ConfigError
from pagesim.sim.memory.base import (Admit, BlockTableSnapshot, ExtentSnapshot, KVCacheManager, MemoryUsage,
                             SeqSpec)
from pagesim.sim.memory.contiguous import ContiguousManager
from pagesim.sim.memory.paged import PagedManager, TokenManager
from pagesim.sim.memory.placement import BuddyPlacement, FitPlacement, make_placement, next_pow2
from pagesim.sim.memory.static import StaticManager
from pagesim.sim.memory.vattention import VAttentionManager, vattention_page_tokens

__all__ = ["Admit", "BlockTableSnapshot", "ExtentSnapshot", "KVCacheManager", "MemoryUsage", "SeqSpec",
           "StaticManager", "ContiguousManager", "PagedManager", "TokenManager", "VAttentionManager",
           "BuddyPlacement", "FitPlacement", "make_placement", "next_pow2", "vattention_page_tokens",
           "make_manager"]


def make_manager(cfg, capacity_tokens: int, model=None) -> KVCacheManager:
    """The manager ``cfg`` (a :class:`sim.config.SimConfig`) names, over ``capacity_tokens`` slots."""
    max_seq_len = cfg.max_seq_len
    if max_seq_len is None:
        if model is None:
            raise ConfigError("max_seq_len is not set and no model is given to take it from; "
                              "set max_seq_len (e.g. 2048)")
        max_seq_len = model.max_seq_len
    cap = int(capacity_tokens)
    if cfg.manager == "static":
        return StaticManager(cap, max_seq_len, cfg.static_batch_size)
    if cfg.manager == "contiguous":
        return ContiguousManager(cap, max_seq_len, cfg.reservation, cfg.placement, cfg.predictor_error,
                                 cfg.seed)
    if cfg.manager == "paged":
        if cfg.block_size == 1:
            return TokenManager(cap, max_seq_len, cfg.watermark, cfg.prefix_caching, cfg.append_rule)
        return PagedManager(cap, max_seq_len, cfg.block_size, cfg.watermark, cfg.prefix_caching, cfg.append_rule)
    if cfg.manager == "vattention":
        if model is None:
            raise ConfigError("the vattention manager needs the model to size its pages; "
                              "pass model= to make_manager")
        if cfg.vattention_page_kib <= 0:
            raise ConfigError(f"vattention_page_kib must be > 0, got {cfg.vattention_page_kib} (e.g. 64)")
        pt = vattention_page_tokens(model, cfg.vattention_page_kib * 1024, cfg.tensor_parallel)
        return VAttentionManager(cap, max_seq_len, pt, cfg.watermark, cfg.append_rule)
    raise ConfigError(f"unknown manager '{cfg.manager}'; valid: static, contiguous, paged, vattention")
