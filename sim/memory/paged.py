"""Paged KV cache (vLLM PagedAttention): fixed-size blocks, block tables, sharing, prefix cache.

The pool is ``num_blocks = capacity // block_size`` physical blocks; the ``capacity %
block_size`` leftover slots can never be used and count as free (idle or external).
Every physical block is in exactly one state::

    free list  --take-->  in use (ref >= 1)  --last ref dropped-->  free list
       ^                      |      ^                        (or, if its prefix key is
       |                      |      | prefix hit (ref 0->1)   cached, the LRU of
       +----evict (oldest)----+------+--- cached, ref 0 (LRU) <------ reclaimable blocks)

    seq 0 table: [ 7 ][ 3 ][ 9 ]        block 3 is shared (ref 2) after fork(0, 1)
    seq 1 table: [ 7 ][ 3 ]              its next write copies it first (copy-on-write)

Allocation is on demand: ``allocate`` takes blocks for the prompt (reused prefix-cache hits
first), ``append`` takes one more block only when a sequence crosses a block boundary, and a
write into a shared block (ref > 1) first copies it (``cow_copies`` counts each copy).

Accounting (exact, O(1) counters, base.py's categories)
-------------------------------------------------------
Each physical block in use counts once. ``filled(b)`` is how many of its slots hold computed
KV (the same for all sharers: shared blocks are never written). Its *demand* is how far it will
be filled: ``dem(b) = max over the sequences s referencing it, at table index i, of
clamp(F_s - i*block_size, 0, block_size)``. Then, summing over blocks in use::

    token_states = sum filled(b)
    reservation  = sum dem(b) - filled(b)     (prompt blocks not yet computed; the last
                                               block's slots its sequence(s) will still fill)
    internal_frag= sum block_size - dem(b)    (slots no sharer will ever fill)
    allocator_slack = 0
    free         = (free + cached-unreferenced blocks) * block_size + leftover slots

So a partially filled block shared after fork counts its unfilled slots as reservation up to
the largest remaining demand of its sharers. Full blocks have dem = block_size. The sums of
``filled`` and ``dem`` and the count of blocks in use are updated on every change; only
partially filled shared blocks keep a small ``{seq: demand}`` map to recompute the max when a
sharer leaves. A sequence that outgrows its final length F has F raised (never with a correct
trace).

Prefix caching (``prefix_caching=True`` and ``SeqSpec.prefix_hashes``)
-----------------------------------------------------------------------
Hash j covers prompt tokens [j*H, (j+1)*H) (H = ``hash_block_tokens``, e.g. Mooncake's 512).
A chain ``c_j = hash((c_{j-1}, h_j))`` names a prefix; paged block i (tokens [0, e), e =
(i+1)*block_size) is keyed ``(H, e, c_{ceil(e/H)-1})`` if e <= prompt_len and the hashes reach
e. A block's key is registered when it becomes full (computed); ``allocate`` reuses the longest
run of cached leading blocks, at most ``prompt_len - 1`` tokens (as vLLM, the last prompt token is
always computed). Unreferenced cached blocks wait in an LRU (a freed sequence's blocks tail
first, so tails are evicted first) and are evicted (``evictions``) only when the free list is
empty. Without hashes nothing is shared.

Watermark (vLLM): ``can_allocate`` is LATER if admitting would leave fewer than
``int(watermark * num_blocks)`` reclaimable blocks, and NEVER if the prompt alone needs more
than ``num_blocks - watermark_blocks``. A request back after a preemption
(``SeqSpec.resumed``) has produced output and must not be turned away: when its regrown
prompt needs more than ``num_blocks - watermark_blocks``, it is admitted once the whole pool
is reclaimable (the watermark keeps room for the others' growth, and there are none), and
NEVER only if it needs more than ``num_blocks``.

Hot path: ``append_batch`` / ``can_append_batch`` / ``blocks_needed_for_append_batch`` work on
numpy arrays indexed by seq_id; block-boundary crossings take their blocks in bulk; a Python
loop runs only over sequences that need copy-on-write or prefix-key registration, and over LRU
evictions. ``seq_ids`` within one batch must be distinct.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from itertools import chain
from typing import Iterable, Sequence

import numpy as np

from pagesim.sim.config import APPEND_RULES
from pagesim.sim.errors import ConfigError, OutOfMemory
from pagesim.sim.memory.base import (Admit, BlockTableSnapshot, KVCacheManager, MemoryUsage, SeqSpec,
                             grow_seq_arrays, settle_lane_before, settles_itself)

_OK, _LATER, _NEVER = Admit.OK, Admit.LATER, Admit.NEVER  # bound once: checked per admission


def prefix_chain(hashes, hash_block_tokens: int) -> list[int]:
    """The chain ``c_j = hash((c_{j-1}, h_j))`` over a request's prefix hashes: ``c_j`` names
    its prefix up to hash block ``j`` (the core, sim/core/prefix_cache.py, keys on the same)."""
    chain, c = [], hash(("pagesim-prefix", int(hash_block_tokens)))
    for h in hashes:
        c = hash((c, h))
        chain.append(c)
    return chain
# per-sequence arrays. priv: 1 while no block of the sequence was ever shared (no prefix hit,
# no fork): its blocks then hold exactly its L tokens and min(F, blocks x block_size) demand
# (free's fast path). lane_off: see the decode lane
_SEQ_FIELDS = ("L", "F", "nb", "tail", "klimit", "prompt", "priv", "lane_off")


@settle_lane_before
class PagedManager(KVCacheManager):
    kind = "paged"
    MAX_BLOCK_SIZE: int | None = 256

    def __init__(self, capacity: int, max_seq_len: int, block_size: int = 16, watermark: float = 0.01,
                 prefix_caching: bool = False, append_rule: str = "free-block-per-seq"):
        if self.MAX_BLOCK_SIZE is not None and not 1 <= block_size <= self.MAX_BLOCK_SIZE:
            raise ConfigError(f"block_size must be in 1..{self.MAX_BLOCK_SIZE}, got {block_size} "
                              "(vLLM uses 16)")
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size} (e.g. 16)")
        if max_seq_len < 1:
            raise ConfigError(f"max_seq_len must be >= 1, got {max_seq_len} (e.g. 2048)")
        if not 0 <= watermark < 1:
            raise ConfigError(f"watermark must be in [0, 1), got {watermark} (vLLM uses 0.01)")
        bs = int(block_size)
        num_blocks = int(capacity) // bs
        need = -(-int(max_seq_len) // bs)
        if capacity < max_seq_len or num_blocks < need:
            raise ConfigError(f"KV pool of {capacity} slots ({num_blocks} blocks of {bs}) cannot hold one "
                              f"max_seq_len={max_seq_len} request; use max_seq_len <= {num_blocks * bs} "
                              f"or a larger pool (kv_gib)")
        self.capacity = int(capacity)
        self.max_seq_len = int(max_seq_len)
        self.block_size = bs
        self.num_blocks = num_blocks
        self.leftover = self.capacity - num_blocks * bs
        self.watermark = float(watermark)
        self.watermark_blocks = int(watermark * num_blocks)
        self.prefix_caching = bool(prefix_caching)
        if append_rule not in APPEND_RULES:
            raise ConfigError(f"unknown append_rule '{append_rule}'; valid: {', '.join(APPEND_RULES)}")
        self.append_rule = append_rule

        self._ref = np.zeros(num_blocks, dtype=np.int64)
        self._filled = np.zeros(num_blocks, dtype=np.int64)
        self._dem = np.zeros(num_blocks, dtype=np.int64)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks with ref 0, oldest first
        self._cache: dict[tuple, int] = {}  # prefix key -> block
        self._block_key: dict[int, tuple] = {}  # block -> its registered key
        self._sharers: dict[int, dict[int, int]] = {}  # partially filled shared block -> {seq: demand}
        self._keys_memo: tuple = (None, [])

        n = 64
        for f in _SEQ_FIELDS:
            setattr(self, "_" + f, np.zeros(n, dtype=np.int64))
        self._active = np.zeros(n, dtype=bool)
        self._tables: dict[int, list[int]] = {}
        self._seq_keys: dict[int, list[tuple]] = {}

        # decode lane: see _lane_append
        self._lane_ids: np.ndarray | None = None  # the array the members were last synced to
        self._lane_mem: dict[int, int] = {}  # member -> its bucket, in join order
        self._lane_bk: list[dict[int, None]] = [{} for _ in range(bs)]
        self._lane_end: list[tuple[int, int, int]] = []  # heap of (G at which L reaches F, s, off)
        self._lane_G = 0
        self._lane_settled = 0
        self._lane_F: dict[int, int] = {}  # member -> its final length
        self._alloc_memo: tuple = (-1, None)  # (seq, its prompt blocks) of the last allocate

        self._logical = 0  # sum of table lengths: blocks that would be in use without sharing
        self._token_states = 0  # sum filled over blocks in use
        self._demand = 0  # sum dem over blocks in use
        self._used = 0  # blocks in use
        self._counters = {"cow_copies": 0, "evictions": 0, "prefix_hit_tokens": 0,
                          "prefix_lookup_tokens": 0, "allocations": 0,
                          "frees": 0, "forks": 0, "fork_copies": 0}

    # ---- helpers ----------------------------------------------------------------------
    def _ensure(self, seq_id: int) -> None:
        grow_seq_arrays(self, seq_id, _SEQ_FIELDS)

    def _d(self, F: int, i: int) -> int:
        return min(max(F - i * self.block_size, 0), self.block_size)

    def has_seq(self, seq_id: int) -> bool:
        return 0 <= seq_id < len(self._active) and bool(self._active[seq_id])

    def _check_seq(self, seq_id: int) -> None:
        if not self.has_seq(seq_id):
            raise KeyError(f"sequence {seq_id} is not allocated")

    def _take(self) -> int:
        """A block for new use (ref set by the caller): the free list first, else evict the LRU."""
        if self._free:
            b = self._free.pop()
        elif self._lru:
            b, _ = self._lru.popitem(last=False)
            del self._cache[self._block_key.pop(b)]
            self._counters["evictions"] += 1
        else:
            raise OutOfMemory("no free KV block (the scheduler must check can_* first)")
        self._ref[b] = 1
        self._filled[b] = 0
        self._dem[b] = 0
        self._used += 1
        return b

    def _take_many(self, k: int) -> list[int]:
        """``k`` blocks for new use, in the order ``k`` calls of ``_take`` would give them."""
        out = self._pop_blocks(k)
        if k <= 16:  # per-element stores beat building an index array for a few blocks
            ref, filled, dem = self._ref, self._filled, self._dem
            for b in out:
                ref[b] = 1
                filled[b] = 0
                dem[b] = 0
        else:
            arr = np.array(out, dtype=np.int64)
            self._ref[arr] = 1
            self._filled[arr] = 0
            self._dem[arr] = 0
        return out

    def _pop_blocks(self, k: int) -> list[int]:
        """``_take_many``'s blocks, counted as used; their ref/filled/dem are the caller's to set."""
        if k <= 0:
            return []
        if k > len(self._free) + len(self._lru):
            raise OutOfMemory("no free KV block (the scheduler must check can_* first)")
        nf = min(k, len(self._free))
        out = self._free[-nf:][::-1] if nf else []
        if nf:
            del self._free[-nf:]
        if k > nf:  # evict the least recently used cached blocks
            lru, cache, bkey = self._lru, self._cache, self._block_key
            for _ in range(k - nf):
                b, _ = lru.popitem(last=False)
                del cache[bkey.pop(b)]
                out.append(b)
            self._counters["evictions"] += k - nf
        self._used += k
        return out

    def _extend_tables(self, seqs, new: list[int], new_arr: np.ndarray, demands: np.ndarray) -> None:
        """Fresh blocks ``new`` (``new_arr`` as an array) become the next table entry of
        ``seqs`` (in the same order), with demands ``demands`` (the vectorized crossings)."""
        self._dem[new_arr] = demands
        self._demand += int(demands.sum())
        self._logical += len(new)
        tables = self._tables
        for s, b in zip(seqs, new):
            tables[s].append(b)

    def _unshare(self, b: int, seq_id: int) -> None:
        """``seq_id`` left partially filled shared block ``b``: its demand is the others' max."""
        sh = self._sharers.get(b)
        if sh is not None:
            del sh[seq_id]
            new = max(sh.values())
            if len(sh) == 1:
                del self._sharers[b]
            self._demand += new - int(self._dem[b])
            self._dem[b] = new

    def _release(self, b: int, seq_id: int) -> None:
        """Drop ``seq_id``'s reference to block ``b``."""
        self._ref[b] -= 1
        if self._ref[b] == 0:
            self._used -= 1
            self._token_states -= int(self._filled[b])
            self._demand -= int(self._dem[b])
            self._dem[b] = 0
            self._sharers.pop(b, None)
            if b in self._block_key:
                self._lru[b] = None  # filled stays block_size: revived as is on a hit
            else:
                self._filled[b] = 0
                self._free.append(b)
        else:
            self._unshare(b, seq_id)

    def _keys(self, spec: SeqSpec) -> list[tuple]:
        """Prefix-cache keys of the spec's keyable (full, hashed) prompt blocks."""
        if not self.prefix_caching or not spec.prefix_hashes:
            return []
        if self._keys_memo[0] is spec:  # the waiting head is asked about every step
            return self._keys_memo[1]
        keys = self._compute_keys(spec)
        self._keys_memo = (spec, keys)
        return keys

    def _compute_keys(self, spec: SeqSpec) -> list[tuple]:
        H, bs = int(spec.hash_block_tokens), self.block_size
        chain = prefix_chain(spec.prefix_hashes, H)
        keys = []
        reach = min(spec.prompt_len, len(spec.prefix_hashes) * H)
        e = bs
        while e <= reach:
            keys.append((H, e, chain[(e + H - 1) // H - 1]))
            e += bs
        return keys

    def _hits(self, spec: SeqSpec, keys: list[tuple]) -> list[int]:
        if not keys:
            return []
        limit = max(spec.prompt_len - 1, 0) // self.block_size  # at most prompt_len - 1 cached tokens
        out = []
        for k in keys[:limit]:
            b = self._cache.get(k)
            if b is None:
                break
            out.append(b)
        return out

    # ---- admission -----------------------------------------------------------------------
    def _prompt_blocks(self, spec: SeqSpec) -> int:
        return -(-spec.prompt_len // self.block_size)

    @settles_itself
    def blocks_needed_to_allocate(self, spec: SeqSpec) -> int:
        """Reclaimable blocks ``allocate(spec)`` would consume (new blocks + revived LRU hits)."""
        return self._needed_to_allocate(spec, self._hits(spec, self._keys(spec)))

    def _needed_to_allocate(self, spec: SeqSpec, hits: list[int]) -> int:
        need = -(-spec.prompt_len // self.block_size) - len(hits)
        if hits:
            ref = self._ref
            need += sum(1 for b in hits if ref[b] == 0)
        return need

    def _watermark(self, spec: SeqSpec) -> int:
        """Reclaimable blocks admitting ``spec`` must leave (see the module docstring)."""
        if spec.resumed:
            return max(min(self.watermark_blocks, self.num_blocks - self._prompt_blocks(spec)), 0)
        return self.watermark_blocks

    def _admit(self, spec: SeqSpec, hits: list[int] | None) -> Admit:
        """``can_allocate`` on settled state; ``hits`` as ``_hits`` gives them (None: look up)."""
        watermark = self._watermark(spec)
        if (spec.final_len > self.max_seq_len or spec.prompt_len > self.max_seq_len
                or self._prompt_blocks(spec) > self.num_blocks - watermark):
            return _NEVER
        if hits is None:
            hits = self._hits(spec, self._keys(spec))
        avail = len(self._free) + len(self._lru)
        return _OK if avail - self._needed_to_allocate(spec, hits) >= watermark else _LATER

    @settles_itself
    def can_allocate(self, spec: SeqSpec) -> Admit:
        return self._admit(spec, None)

    def explain_never(self, spec: SeqSpec) -> str:
        if spec.final_len <= self.max_seq_len and spec.prompt_len <= self.max_seq_len:
            return (f"sequence {spec.seq_id}: its prompt needs {self._prompt_blocks(spec)} blocks, more than "
                    f"the {self.num_blocks} blocks less the {self._watermark(spec)}-block watermark")
        return super().explain_never(spec)

    @settles_itself
    def allocate(self, spec: SeqSpec) -> int:
        s = spec.seq_id
        if self.has_seq(s):
            raise ValueError(f"sequence {s} is already allocated")
        keys = self._keys(spec)
        hits = self._hits(spec, keys)
        if self._admit(spec, hits) is not _OK:  # can_allocate's check, on the same lookup
            raise OutOfMemory(f"cannot admit sequence {s} now")
        bs = self.block_size
        F = max(spec.final_len, spec.prompt_len)
        table = []
        for b in hits:
            if self._ref[b] == 0:  # revive from the LRU
                del self._lru[b]
                self._used += 1
                self._token_states += bs
                self._demand += bs
                self._dem[b] = bs
            self._ref[b] += 1
            table.append(b)
        nh = len(hits)
        new = self._pop_blocks(self._prompt_blocks(spec) - nh)
        if new:
            arr = np.array(new, dtype=np.int64)
            self._alloc_memo = (s, arr) if not nh else (-1, None)
            self._ref[arr] = 1
            self._filled[arr] = 0
            # block i's demand is clamp(F - i*bs, 0, bs): full up to F's block, then F's rest
            dem = self._dem
            full = min(max(F // bs - nh, 0), len(new))
            dem[arr[:full]] = bs
            dsum = full * bs
            for j in range(full, len(new)):
                d = min(max(F - (nh + j) * bs, 0), bs)
                dem[new[j]] = d
                dsum += d
            self._demand += dsum
            table.extend(new)
        self._ensure(s)
        cached = nh * bs
        self._L[s], self._F[s], self._nb[s] = cached, F, len(table)
        self._logical += len(table)
        self._tail[s] = table[-1] if table else -1
        self._klimit[s], self._prompt[s] = len(keys) * bs, spec.prompt_len
        self._priv[s] = 0 if nh else 1
        self._active[s] = True
        self._tables[s] = table
        if keys:
            self._seq_keys[s] = keys
        self._counters["allocations"] += 1
        self._counters["prefix_hit_tokens"] += cached
        if self.prefix_caching:
            self._counters["prefix_lookup_tokens"] += spec.prompt_len
        return cached

    # ---- appends -------------------------------------------------------------------------
    def _needed(self, s: int, n: int) -> int:
        """Blocks ``append(s, n)`` would take: new blocks past the table plus copy-on-write copies."""
        L, bs, tbl = int(self._L[s]), self.block_size, self._tables[s]
        first, last = L // bs, (L + n - 1) // bs
        new = max(0, last + 1 - len(tbl))
        hi = min(last + 1, len(tbl))
        if hi - first > 4:
            cow = int(np.count_nonzero(self._ref[np.asarray(tbl[first:hi], dtype=np.int64)] > 1))
        else:
            cow = sum(1 for i in range(first, hi) if self._ref[tbl[i]] > 1)
        return new + cow

    def num_free_blocks(self) -> int:
        """Blocks available to new use: free plus unreferenced cached (evictable) blocks."""
        return len(self._free) + len(self._lru)

    @settles_itself
    def num_seq_blocks(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        self._settle_seq(seq_id)
        return int(self._nb[seq_id])

    @settles_itself
    def block_table(self, seq_id: int) -> list[int]:
        self._check_seq(seq_id)
        self._settle_seq(seq_id)
        return list(self._tables[seq_id])

    @settles_itself
    def can_append(self, seq_id: int, n: int = 1) -> bool:
        self._check_seq(seq_id)
        self._settle_seq(seq_id)
        return n <= 0 or self._needed(seq_id, n) <= self.num_free_blocks()

    @settles_itself
    def append(self, seq_id: int, n: int = 1) -> None:
        self._check_seq(seq_id)
        if n <= 0:
            return
        if seq_id in self._lane_mem:
            self._lane_leave(seq_id)
        s, bs = seq_id, self.block_size
        L, F = int(self._L[s]), int(self._F[s])
        newL = L + n
        tbl = self._tables[s]
        A = len(tbl) * bs
        if A - bs <= L and newL <= A and newL <= F and L >= self._klimit[s] and self._ref[tbl[-1]] == 1:
            # stays inside a private last block: count the tokens
            self._L[s] = newL
            self._filled[tbl[-1]] += n
            self._token_states += n
            return
        if newL <= A and newL <= F and s not in self._seq_keys:
            # a prompt written into blocks allocated for it: no new block, F unchanged (so every
            # block's demand stays), only copy-on-write could intervene
            first, last = L // bs, (newL - 1) // bs
            if last == first:
                b = tbl[first]
                if self._ref[b] == 1:
                    self._filled[b] = newL - first * bs
                    self._L[s] = newL
                    self._token_states += n
                    return
            else:
                memo = self._alloc_memo  # a whole fresh prompt: allocate's block array
                if first == 0 and memo[0] == s and len(memo[1]) == last + 1:
                    seg = memo[1]
                else:
                    seg = np.asarray(tbl[first:last + 1], dtype=np.int64)
                if self._priv[s] or not (self._ref[seg] != 1).any():
                    self._filled[seg] = bs
                    self._filled[tbl[last]] = newL - last * bs
                    self._L[s] = newL
                    self._token_states += n
                    return
        if self._needed(s, n) > self.num_free_blocks():
            raise OutOfMemory(f"sequence {s}: no free block for {n} more tokens")
        F = max(F, newL)
        first, last = L // bs, (newL - 1) // bs
        hi = min(last + 1, len(tbl))
        if hi > first:
            seg = np.asarray(tbl[first:hi], dtype=np.int64)
            for i in (np.flatnonzero(self._ref[seg] > 1) + first).tolist():  # copy-on-write
                b = tbl[i]
                c = self._take()
                self._filled[c] = self._filled[b]
                self._token_states += int(self._filled[b])
                self._release(b, s)
                tbl[i] = c
                self._counters["cow_copies"] += 1
        tbl.extend(self._take_many(last + 1 - len(tbl)))
        # write tokens [L, newL) into blocks first..last; their demand follows F
        blocks = np.asarray(tbl[first:last + 1], dtype=np.int64)
        idx = np.arange(first, last + 1, dtype=np.int64) * bs
        f = np.minimum(newL - idx, bs)
        d = np.minimum(np.maximum(F - idx, 0), bs)
        self._token_states += int(f.sum() - self._filled[blocks].sum())
        self._demand += int(d.sum() - self._dem[blocks].sum())
        self._filled[blocks] = f
        self._dem[blocks] = d
        keys = self._seq_keys.get(s)
        if keys is not None:
            for i in range(first, min(last + 1, len(keys))):
                if f[i - first] == bs and keys[i] not in self._cache:
                    self._cache[keys[i]] = tbl[i]
                    self._block_key[tbl[i]] = keys[i]
        self._logical += len(tbl) - int(self._nb[s])
        self._L[s], self._F[s], self._nb[s], self._tail[s] = newL, F, len(tbl), tbl[-1]

    # ---- the decode lane ---------------------------------------------------------------
    # Continuous batching appends one token to (nearly) the same set of sequences step after
    # step. The lane makes such a step O(1) plus O(k) for the k sequences crossing a block
    # boundary, and survives changes of the set:
    #
    #   G            lane steps taken so far (only grows while the lane lives)
    #   off[s]       member s has L = off[s] + G tokens (written back to _L lazily)
    #   buckets[r]   the members that cross a block boundary at the steps with G % bs == r:
    #                the tail is full when L % bs == 0, i.e. r = -off[s] mod bs
    #
    #   G:        ...  40    41    42    43  ...       (bs = 4)
    #   seq 3:    L = 17    18    19    20 -> crosses at G = 43 (bucket 3)
    #   seq 8:    L =  6     7     8 -> crosses at G = 42 (bucket 2)
    #
    # An ``append_batch(ids)`` with a new array syncs the members to ``ids`` (sequences that
    # left are dropped, new ones join in O(1) each) and remembers the array, so later steps with
    # the very same object skip the comparison. Lengths and tail fills are written back lazily:
    # a member that is freed, forked or appended to on its own leaves the lane first (writing its
    # own state), methods that read one sequence settle that one (``_settle_seq``), and those
    # that read them all (export, check) settle every member (``_settle``); admission never
    # needs to (the methods marked ``@settles_itself``). Members need a private tail, room
    # below F and no prefix-key registration pending; a batch with any other sequence runs the
    # full path. ``lane_steps`` / ``lane_advance`` take many lane steps at once (macro steps);
    # everything gives exactly what the full path's ``append_batch`` calls would, up to which
    # free block goes to which crossing sequence (the lane takes them in join order).
    decode_lane = True  # False: every append_batch runs the full path (the lane's reference)
    SCALAR_LANE_CROSSINGS = 96  # lane_advance: up to about this many crossings in scalars

    def _settle(self) -> None:
        """Write the members' lengths and tail fills back (the lane stays open)."""
        if self._lane_G != self._lane_settled:
            ids = self._lane_ids  # the members, unless some left since the last sync
            if ids is None:
                ids = np.fromiter(self._lane_mem, np.int64, len(self._lane_mem))
            L = self._lane_off[ids] + self._lane_G
            self._L[ids] = L
            self._filled[self._tail[ids]] = L - (self._nb[ids] - 1) * self.block_size
            self._lane_settled = self._lane_G

    def _settle_seq(self, s: int) -> None:
        """Write member ``s``'s length and tail fill back (no-op for non-members)."""
        if s in self._lane_mem:
            L = int(self._lane_off[s]) + self._lane_G
            self._L[s] = L
            self._filled[self._tail[s]] = L - (int(self._nb[s]) - 1) * self.block_size

    def _lane_leave(self, s: int) -> None:
        """Member ``s`` is about to be changed on its own: it leaves the lane, state written."""
        self._settle_seq(s)
        r = self._lane_mem.pop(s)
        del self._lane_bk[r][s]
        del self._lane_F[s]
        self._lane_ids = None

    def _lane_drop(self) -> None:
        self._settle()
        self._lane_mem.clear()
        self._lane_F.clear()
        for b in self._lane_bk:
            b.clear()
        self._lane_end.clear()
        self._lane_ids = None

    def _lane_sync(self, ids) -> bool:
        """Make the lane's members exactly ``ids`` (a new int64 array); False (lane dropped)
        when some sequence cannot be in it."""
        if not (self.decode_lane and isinstance(ids, np.ndarray) and ids.dtype == np.int64 and len(ids)):
            if self._lane_mem:
                self._lane_drop()
            return False
        new = ids.tolist()
        mem = self._lane_mem
        n = len(mem)
        joining = new[n:]
        # usually the members in join order (some freed since), then the joiners at the end
        if new[:n] != list(mem) or any(s in mem for s in joining) or len(set(joining)) != len(joining):
            keep = set(new)
            if len(keep) != len(new):
                self._lane_drop()  # duplicates: the full path reports them
                return False
            for s in mem.keys() - keep:
                self._lane_leave(s)
            joining = [s for s in new if s not in mem]
        if joining:
            G, bs = self._lane_G, self.block_size
            active, L_, F_, nb_, tail_, ref, klim = (self._active, self._L, self._F, self._nb, self._tail,
                                                     self._ref, self._klimit)
            keyed = self._seq_keys
            for s in joining:
                if not (0 <= s < len(active) and active[s]):
                    self._lane_drop()
                    return False
                L, F = int(L_[s]), int(F_[s])
                if (L >= F or not 0 <= int(nb_[s]) * bs - L < bs or ref[tail_[s]] != 1
                        or (s in keyed and L < klim[s])):
                    self._lane_drop()
                    return False
                off = L - G
                self._lane_off[s] = off
                r = -off % bs
                mem[s] = r
                self._lane_bk[r][s] = None
                self._lane_F[s] = F
                heapq.heappush(self._lane_end, (F - off, s, off))
        self._lane_ids = ids
        return True

    def _lane_room(self) -> int:
        """Lane steps left before some member would pass its final length."""
        h, mem, off = self._lane_end, self._lane_mem, self._lane_off
        while h and (h[0][1] not in mem or off[h[0][1]] != h[0][2]):
            heapq.heappop(h)  # a member that left (or rejoined since)
        return h[0][0] - self._lane_G if h else 0

    def _lane_next_size(self) -> int:
        """How many sequences cross a block boundary at the lane's next step."""
        return len(self._lane_bk[self._lane_G % self.block_size])

    def _lane_append(self) -> None:
        """One lane step: the sequences in this step's bucket cross into a new block each."""
        bs = self.block_size
        bucket = self._lane_bk[self._lane_G % bs]
        self._lane_G += 1
        self._token_states += len(self._lane_mem)
        k = len(bucket)
        if not k:
            return
        new = self._pop_blocks(k)
        if k > 32:  # many crossings (small blocks, wide batches): vectorized
            S = np.fromiter(bucket, np.int64, k)
            nb = np.array(new, dtype=np.int64)
            self._ref[nb] = 1
            self._filled[nb] = 0
            self._filled[self._tail[S]] = bs  # the old tails are full now
            idx = self._nb[S]  # table index of the new block
            self._extend_tables(bucket, new, nb, np.minimum(self._F[S] - idx * bs, bs))
            self._nb[S] = idx + 1
            self._tail[S] = nb
            return
        self._logical += k
        ref, filled, dem, tail, nbs, tables, F = (self._ref, self._filled, self._dem, self._tail, self._nb,
                                                  self._tables, self._lane_F)
        dsum = 0
        for s_, b in zip(bucket, new):
            tbl = tables[s_]
            filled[tbl[-1]] = bs  # the old tail is full now
            i = len(tbl)  # table index of the new block
            d = F[s_] - i * bs  # its demand: min(F - i * bs, bs)
            if d > bs:
                d = bs
            ref[b] = 1
            filled[b] = 0
            dem[b] = d
            dsum += d
            nbs[s_] = i + 1
            tail[s_] = b
            tbl.append(b)
        self._demand += dsum

    # ---- macro steps: m lane steps at once (the engine's decode-only stretches) ----------
    macro_steps_ok = True

    def lane_steps(self, seq_ids, limit: int) -> int:
        """How many further lockstep appends of ``seq_ids`` stay in the lane: within the
        members' room and without running out of free blocks (a new array syncs the lane
        first, as its first ``append_batch`` would)."""
        if limit <= 0:
            return 0
        if seq_ids is not self._lane_ids and not self._lane_sync(seq_ids):
            return 0
        lim = min(int(limit), self._lane_room())
        if lim <= 0:
            return 0
        bs = self.block_size
        # free-block-per-seq: a step's crossings plus one always fit (a lower bound: the steps
        # where the last member crosses and exactly the crossings fit are taken one by one)
        free = self.num_free_blocks() - (self.append_rule == "free-block-per-seq")
        if len(self._lane_mem) * (-(-lim // bs)) <= free:  # enough blocks for all of them
            return lim
        bk, G, tot = self._lane_bk, self._lane_G, 0
        for j in range(lim):
            tot += len(bk[(G + j) % bs])
            if tot > free:
                return j
        return lim

    def lane_advance(self, m: int, demand_waiting: bool):
        """Take ``m`` lane steps (``m <= lane_steps(...)``) as ``m`` calls of ``append_batch``
        would. Returns the per-step usage rows (m x 6, after each step's append, as
        ``usage(demand_waiting).as_tuple()``) and block usage rows (m x 2, ``block_usage()``)."""
        bs = self.block_size
        # few crossings (short stretches, big blocks): step by step in scalars, as tiny numpy
        # calls cost more; many (long stretches, small blocks, wide batches): vectorized
        if m * len(self._lane_mem) <= self.SCALAR_LANE_CROSSINGS * bs:
            mem, blk = [], []
            nb, lo = self.num_blocks, self.leftover
            for _ in range(m):
                self._lane_append()
                ts, dem, used = self._token_states, self._demand, self._used
                free = (nb - used) * bs + lo
                mem.append((ts, dem - ts, used * bs - dem, 0, free if demand_waiting else 0,
                            0 if demand_waiting else free))
                blk.append((used, self._logical))
            return mem, blk
        W = len(self._lane_mem)
        k0 = self._lane_G
        # the members in crossing order from this step on: buckets a, a+1, ... (mod bs)
        a = k0 % bs
        order = [self._lane_bk[(a + j) % bs] for j in range(bs)]
        rl = [len(b) for b in order[:min(m, bs)]]
        n1 = sum(rl)
        self._lane_G = k0 + m
        ts0, dem0, used0, log0 = self._token_states, self._demand, self._used, self._logical
        if n1:
            one = np.fromiter(chain.from_iterable(order[:min(m, bs)]), np.int64, n1)
            if m <= bs:  # every sequence crosses at most once
                S, K, steplens = one, n1, rl
                new = self._take_many(K)
                nbarr = np.asarray(new, dtype=np.int64)
                self._filled[self._tail[S]] = bs
                idx = self._nb[S]
                d = np.minimum(self._F[S] - idx * bs, bs)
                self._nb[S] = idx + 1
                self._tail[S] = nbarr
            else:  # full rounds of bs steps (each sequence crosses once a round), then a part
                full, rest = divmod(m, bs)
                k_rest = sum(rl[:rest])
                K = full * n1 + k_rest
                S = np.concatenate([one] * full + [one[:k_rest]])
                steplens = rl * full + rl[:rest]
                new = self._take_many(K)
                nbarr = np.asarray(new, dtype=np.int64)
                # a crossing's old tail: the round before's new block (the first round: the tail)
                self._filled[np.concatenate([self._tail[one], nbarr[:K - n1]])] = bs
                occ = np.repeat(np.arange(full + 1, dtype=np.int64), [n1] * full + [k_rest])
                d = np.minimum(self._F[S] - (self._nb[S] + occ) * bs, bs)
                self._nb[one] += full
                if k_rest:
                    self._nb[one[:k_rest]] += 1
                self._tail[S[K - n1:]] = nbarr[K - n1:]
            self._extend_tables(S.tolist(), new, nbarr, d)
            cnt = np.cumsum(steplens)
            dc = np.cumsum(d)
            dcum = np.where(cnt > 0, dc[np.maximum(cnt - 1, 0)], 0)
        else:
            cnt = dcum = np.zeros(m, np.int64)
        self._token_states += W * m
        ts = ts0 + W * np.arange(1, m + 1, dtype=np.int64)
        dem = dem0 + dcum
        used = used0 + cnt
        free = (self.num_blocks - used) * bs + self.leftover
        mem = np.empty((m, 6), np.int64)
        mem[:, 0] = ts
        mem[:, 1] = dem - ts
        mem[:, 2] = used * bs - dem
        mem[:, 3] = 0
        mem[:, 4] = free if demand_waiting else 0
        mem[:, 5] = 0 if demand_waiting else free
        blk = np.empty((m, 2), np.int64)
        blk[:, 0] = used
        blk[:, 1] = log0 + cnt
        return mem, blk

    def blocks_needed_for_append_batch(self, seq_ids: Sequence[int]) -> int:
        """Blocks one decode token for each of ``seq_ids`` would take (new + copy-on-write), exactly."""
        if (seq_ids is self._lane_ids or self._lane_sync(seq_ids)) and self._lane_room() > 0:
            return self._lane_next_size()
        self._settle()
        ids = np.asarray(seq_ids, dtype=np.int64)
        if not len(ids):
            return 0
        bs = self.block_size
        L, A = self._L[ids], self._nb[ids] * bs
        total = int(np.count_nonzero(L == A))
        written = self._tail[ids[(L < A) & (A - L <= bs)]]  # the block each token goes into
        inner = (L < A) & (A - L > bs)  # writes inside pre-allocated prompt blocks (rare)
        if inner.any():
            extra = [self._tables[s][int(self._L[s]) // bs] for s in ids[inner].tolist()]
            written = np.concatenate([written, np.asarray(extra, dtype=np.int64)])
        shared = written[self._ref[written] > 1]
        if len(shared):  # k writers into a block with r refs copy min(k, r - 1) times
            blocks, k = np.unique(shared, return_counts=True)
            total += int(np.minimum(k, self._ref[blocks] - 1).sum())
        return total

    def can_append_batch(self, seq_ids: Sequence[int], last: int | None = None) -> bool:
        """Whether one decode token for each of ``seq_ids`` fits, by the ``append_rule``:
        ``exact``, the blocks the step takes; ``free-block-per-seq``, vLLM v0's
        (``can_append_slots``, member by member in the running order): each sequence needs a
        free block at its turn, so the one whose turn is ``last`` (default ``seq_ids[-1]``)
        needs one more than those before it take."""
        needed = self.blocks_needed_for_append_batch(seq_ids)
        if self.append_rule == "free-block-per-seq" and len(seq_ids):
            last = int(seq_ids[-1]) if last is None else int(last)
            needed += not self._takes_block(seq_ids, last)
        return needed <= self.num_free_blocks()

    def _takes_block(self, seq_ids: Sequence[int], s: int) -> bool:
        """Whether sequence ``s`` of ``seq_ids`` takes a block for its next token (a fresh one
        at a block boundary, or a copy of a shared block); called right after
        ``blocks_needed_for_append_batch(seq_ids)``, which settled the state or kept the lane."""
        if seq_ids is self._lane_ids and self._lane_room() > 0:
            return s in self._lane_bk[self._lane_G % self.block_size]
        bs = self.block_size
        L, A = int(self._L[s]), int(self._nb[s]) * bs
        if L == A:
            return True
        written = int(self._tail[s]) if A - L <= bs else self._tables[s][L // bs]
        return bool(self._ref[written] > 1)

    def append_batch(self, seq_ids: Iterable[int]) -> None:
        if ((seq_ids is self._lane_ids or self._lane_sync(seq_ids)) and self._lane_room() > 0
                and self._lane_next_size() <= self.num_free_blocks()):
            self._lane_append()
            return
        if self._lane_mem:
            self._lane_drop()
        self._append_batch_full(seq_ids)
        self._lane_sync(seq_ids)  # the next step with this array can be a lane step

    def _append_batch_full(self, seq_ids: Iterable[int]) -> None:
        ids = np.asarray(seq_ids if isinstance(seq_ids, (np.ndarray, list, tuple)) else list(seq_ids),
                         dtype=np.int64)
        if not len(ids):
            return
        if not self._active[ids].all():
            raise KeyError(f"sequences {[int(s) for s in ids if not self.has_seq(int(s))]} are not allocated")
        bs = self.block_size
        L, F = self._L[ids], self._F[ids]
        A = self._nb[ids] * bs
        tails = self._tail[ids]
        ok = (L < F) & (L >= self._klimit[ids])
        # 1) room in a private last block: just count the token
        fast = ok & (L < A) & (A - L <= bs) & (self._ref[tails] == 1)
        f_ids, f_tails = ids[fast], tails[fast]
        self._L[f_ids] += 1
        self._filled[f_tails] += 1
        self._token_states += len(f_ids)
        # 2) at a block boundary: a fresh block each (free list first, then evicting cached blocks)
        bnd = ok & (L == A)
        k = int(np.count_nonzero(bnd))
        if k and k <= self.num_free_blocks():
            b_ids = ids[bnd]
            new = self._take_many(k)  # free list first, then LRU evictions
            nb = np.asarray(new, dtype=np.int64)
            self._filled[nb] = 1
            self._extend_tables(b_ids.tolist(), new, nb, np.minimum(F[bnd] - L[bnd], bs))
            self._token_states += k
            self._nb[b_ids] += 1
            self._tail[b_ids] = nb
            self._L[b_ids] += 1
            done = fast | bnd
        else:
            done = fast
        # 3) everything else one by one (copy-on-write, prefix-key registration, eviction ...)
        for s in ids[~done].tolist():
            self.append(s, 1)

    # ---- fork / free ---------------------------------------------------------------------
    @settles_itself
    def fork(self, parent_id: int, child_id: int, child_final_len: int | None = None) -> None:
        self._check_seq(parent_id)
        if self.has_seq(child_id):
            raise ValueError(f"sequence {child_id} is already allocated")
        p, c = parent_id, child_id
        if p in self._lane_mem:
            self._lane_leave(p)  # its tail becomes shared
        L, Fp = int(self._L[p]), int(self._F[p])
        Fc = max(Fp if child_final_len is None else int(child_final_len), L)
        table = list(self._tables[p])
        self._share(p, c, table, Fp, Fc)
        self._ensure(c)
        self._L[c], self._F[c], self._nb[c] = L, Fc, len(table)
        self._logical += len(table)
        self._tail[c] = table[-1] if table else -1
        self._klimit[c], self._prompt[c] = self._klimit[p], self._prompt[p]
        self._priv[p] = self._priv[c] = 0
        self._active[c] = True
        self._tables[c] = table
        if p in self._seq_keys:
            self._seq_keys[c] = self._seq_keys[p]
        self._counters["forks"] += 1

    def _share(self, p: int, c: int, table: list[int], Fp: int, Fc: int) -> None:
        bs = self.block_size
        for i, b in enumerate(table):
            self._ref[b] += 1
            if self._filled[b] < bs:  # partially filled: track sharers' demands
                sh = self._sharers.get(b)
                if sh is None:
                    sh = self._sharers[b] = {p: self._d(Fp, i)}
                sh[c] = self._d(Fc, i)
                new = max(sh.values())
                self._demand += new - int(self._dem[b])
                self._dem[b] = new

    @settles_itself
    def free(self, seq_id: int) -> None:
        self._check_seq(seq_id)
        if self._alloc_memo[0] == seq_id:
            self._alloc_memo = (-1, None)
        if seq_id in self._lane_mem:
            self._lane_leave(seq_id)
        tbl = self._tables.pop(seq_id)
        self._logical -= len(tbl)
        if tbl and self._priv[seq_id] and seq_id not in self._seq_keys:
            # never shared, no prefix key: its blocks hold L tokens, min(F, A) demand, ref 1
            s, nb = seq_id, len(tbl)
            arr = np.array(tbl, dtype=np.int64)
            self._ref[arr] = 0
            self._filled[arr] = 0
            self._dem[arr] = 0
            self._used -= nb
            self._token_states -= int(self._L[s])
            self._demand -= min(int(self._F[s]), nb * self.block_size)
            self._free.extend(reversed(tbl))
            self._active[s] = False
            self._counters["frees"] += 1
            return
        if tbl:  # in bulk; blocks go back tail first (so cached tails are evicted first)
            arr = np.array(tbl, dtype=np.int64)[::-1]
            ref = self._ref
            r = ref[arr]
            if (r == 1).all():  # no block was shared (the usual case): all of them go
                ref[arr] = 0
                left = None
                gone, plain = arr, None
            else:
                r -= 1
                ref[arr] = r
                left = r == 0
                gone = arr[left]
                plain = gone.tolist()
            self._used -= len(gone)
            self._token_states -= int(self._filled[gone].sum())
            self._demand -= int(self._dem[gone].sum())
            self._dem[gone] = 0
            if self._sharers:
                if plain is None:
                    plain = gone.tolist()
                for b in plain:
                    self._sharers.pop(b, None)
                if left is not None:
                    for b in arr[~left].tolist():
                        self._unshare(b, seq_id)
            if self._block_key:
                bkey, lru = self._block_key, self._lru
                if plain is None:
                    plain = gone.tolist()
                for b in plain:
                    if b in bkey:
                        lru[b] = None  # stays full: revived as is on a hit
                cached = len(plain)
                plain = [b for b in plain if b not in bkey]
                if len(plain) != cached:
                    gone = np.asarray(plain, dtype=np.int64)
            self._filled[gone] = 0
            self._free.extend(tbl[::-1] if plain is None else plain)
        self._active[seq_id] = False
        self._seq_keys.pop(seq_id, None)
        self._counters["frees"] += 1

    # ---- reports -------------------------------------------------------------------------
    @settles_itself
    def num_tokens(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        self._settle_seq(seq_id)
        return int(self._L[seq_id])

    def num_seqs(self) -> int:
        return len(self._tables)

    def num_cow_copies(self) -> int:
        return self._counters["cow_copies"]

    def add_counts(self, **counts: int) -> None:
        """Event counts made elsewhere (the core, sim/core/) join :meth:`stats`'s counters."""
        for k, v in counts.items():
            self._counters[k] += v

    def take_pool(self, free_block_ids: list[int], lru_block_ids: list[int], keys: dict[int, tuple]) -> None:
        """The pool as the core (sim/core/) left it, every sequence freed: the free list, the
        evictable cached blocks oldest first, and each cached block's prefix key."""
        assert not self._tables, "the core hands over an idle pool"
        self._free = list(free_block_ids)
        self._lru = OrderedDict.fromkeys(lru_block_ids)
        self._block_key = dict(keys)
        self._cache = {k: b for b, k in keys.items()}
        self._filled[:] = 0
        self._filled[np.asarray(list(keys), dtype=np.int64)] = self.block_size

    def block_usage(self) -> tuple[int, int]:
        """(physical blocks in use, blocks the tables would need without sharing): Fig. 15's
        saving is ``1 - physical / logical``."""
        return self._used, self._logical

    def usage(self, demand_waiting: bool = False) -> MemoryUsage:
        free = (self.num_blocks - self._used) * self.block_size + self.leftover
        return MemoryUsage(self._token_states, self._demand - self._token_states,
                           self._used * self.block_size - self._demand, 0,
                           free if demand_waiting else 0, 0 if demand_waiting else free)

    def stats(self) -> dict[str, int]:
        return dict(self._counters, cached_tokens=len(self._lru) * self.block_size,
                    cached_blocks=len(self._cache), free_blocks=len(self._free),
                    used_blocks=self._used, num_seqs=len(self._tables))

    def export(self) -> BlockTableSnapshot:
        return BlockTableSnapshot(self.block_size, self.num_blocks,
                                  {s: list(t) for s, t in self._tables.items()},
                                  {s: int(self._L[s]) for s in self._tables},
                                  {int(b): int(self._ref[b]) for b in np.flatnonzero(self._ref)})

    def check(self) -> None:
        bs, nb = self.block_size, self.num_blocks
        assert self._logical == sum(len(t) for t in self._tables.values()), "logical block count drifted"
        ref = np.zeros(nb, dtype=np.int64)
        dem = np.zeros(nb, dtype=np.int64)
        holders: dict[int, set[int]] = {}
        for s, tbl in self._tables.items():
            assert self._active[s], f"sequence {s} has a table but is inactive"
            L, F = int(self._L[s]), int(self._F[s])
            assert 0 <= L <= F and L <= len(tbl) * bs, f"sequence {s}: L={L} F={F} blocks={len(tbl)}"
            assert int(self._nb[s]) == len(tbl) and int(self._tail[s]) == (tbl[-1] if tbl else -1), \
                f"sequence {s}: block count / tail drifted"
            assert len(set(tbl)) == len(tbl), f"sequence {s} holds a block twice"
            for i, b in enumerate(tbl):
                ref[b] += 1
                dem[b] = max(dem[b], self._d(F, i))
                holders.setdefault(b, set()).add(s)
                assert self._filled[b] == min(max(L - i * bs, 0), bs), \
                    f"block {b} filled {self._filled[b]} != sequence {s}'s {L} tokens at index {i}"
        assert int(np.count_nonzero(self._active)) == len(self._tables), "active flags drifted"
        assert (self._ref >= 0).all(), "negative refcount"
        assert (ref == self._ref).all(), "refcounts differ from table references"
        used = set(np.flatnonzero(ref).tolist())
        free, lru = set(self._free), set(self._lru)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert not (used & free) and not (used & lru) and not (free & lru), "a block is in two states"
        assert len(used) + len(free) + len(lru) == nb, "free + used + cached != total blocks"
        assert len(used) == self._used, "used-block counter drifted"
        u = np.fromiter(used, dtype=np.int64, count=len(used))
        assert int(self._filled[u].sum()) == self._token_states, "token_states counter drifted"
        assert (dem[u] == self._dem[u]).all(), "block demand drifted"
        assert int(dem[u].sum()) == self._demand, "demand counter drifted"
        for b, sh in self._sharers.items():
            assert self._ref[b] > 1 and self._filled[b] < bs and set(sh) == holders[b], f"sharers of {b} drifted"
        for b in used:
            if self._ref[b] > 1 and self._filled[b] < bs:
                assert b in self._sharers, f"shared partial block {b} untracked"
        assert {v: k for k, v in self._cache.items()} == self._block_key, "prefix cache index drifted"
        for s, r in self._lane_mem.items():
            L = int(self._L[s])
            assert s in self._tables and s in self._lane_bk[r] and -int(self._lane_off[s]) % bs == r \
                and L == int(self._lane_off[s]) + self._lane_G and L <= int(self._F[s]) \
                and 0 <= int(self._nb[s]) * bs - L < bs and self._ref[self._tail[s]] == 1, \
                f"decode lane member {s} drifted"
        assert sum(len(b) for b in self._lane_bk) == len(self._lane_mem), "decode lane buckets drifted"
        for b in lru:
            assert b in self._block_key and self._filled[b] == bs, f"LRU block {b} is not a full cached block"
        for b in self._free:
            assert b not in self._block_key, f"free block {b} still cached"
        super().check()


@settle_lane_before
class TokenManager(PagedManager):
    """TokenAttention (LightLLM): token-level pages, i.e. exactly paged with ``block_size=1``."""

    kind = "token"

    def __init__(self, capacity: int, max_seq_len: int, watermark: float = 0.01, prefix_caching: bool = False,
                 append_rule: str = "free-block-per-seq"):
        super().__init__(capacity, max_seq_len, block_size=1, watermark=watermark,
                         prefix_caching=prefix_caching, append_rule=append_rule)

