"""pagesim's HiCache (``--system sglang --kv-offload-gib N``, ``sim/core/kv/radix_cache.py``) beside SGLang
0.5.23's own ``UnifiedRadixCache`` with its host tier, call by call.

pagesim runs a workload; every call its scheduler makes into the tree is made at once, with the
same arguments, on SGLang's cache, built and attached as ``sglang_hicache.Probe`` builds it
(``init_hicache``'s state, ``write_through``, load-back threshold 10, the Python tree core),
and both trees are compared after it:

=============================================  ====================================================
pagesim                                         SGLang (``mem_cache/unified_radix_cache.py``)
=============================================  ====================================================
``radix_cache.match_prefix(s, r, limit)``       ``match_prefix`` of ``r``'s first ``limit`` tokens:
(then ``radix_cache.device_node``)                  ``device_prefix_len``, ``host_hit_length``
``radix_cache.checkpoint(s, r, n)``             ``checkpoint_into_tree``'s inserts (:1164-1292):
(``radix_cache.insert_writing_through``: write-through)             ``insert`` with the request's ``inserted_len``, each
                                                ``BackupKV`` executed (host eviction included),
                                                then the prompt's insert
``radix_cache.inc_lock_ref`` / ``dec_lock_ref``  ``lock`` / ``unlock`` (a request's, the scheduler's)
``radix_cache.evict(s, n)``                     ``evict(EvictParams(n))``: demotions and deletions
``radix_cache.load_back(s, device, best)``          ``load_back(best)`` (:1820-1937): threshold, device
                                                slots (evicting), commit, the lock
``radix_cache.acknowledge(s)``                      ``writing_check`` / ``loading_check`` (:3472-3583)
                                                of the copies pagesim acknowledges
=============================================  ====================================================

Calls made inside these (a write's lock, an acknowledgement's unlock, a load's eviction) are
SGLang's own inside its call, not replayed apart. An operation is identical when both results
agree and, after it, both trees are: every node by its depth and tokens, with its parent, lock
count, device and host residency and the operation that last stamped its access (the LRU
order: SGLang's tree core stamps a path deeper-newer within one call, ``unified_tree_core.py:
1031-1035``, pagesim's walk stamps it at once; an eviction takes leaves only, which no path
stamp orders against each other), the evictable and protected device tokens and the host
pool's tokens in use.

What stands for SGLang's machinery: the device allocator (``Slots``) counts slots but holds
none: before each call its free slots are set to pagesim's (``radix_cache.available``), so that
SGLang's own eviction before a load (``evict_for_alloc``) frees what pagesim's does; the host
pool is SGLang's slot allocator (``sglang_hicache.HostSlots``, sized as pagesim's pages); the
transfer engine (``Copies``) allocates and queues as ``HybridCacheController`` does, one
acknowledgement per node written or load made, acknowledged when pagesim's copy of it ends.

Run: ``python -m tests.peers.compare --sglang-hicache-side [WORKLOAD...]``.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tests.peers import sglang_hicache, sglang_radix
from tests.peers.sglang_radix import LLAMA_SLOT, Operation, Tokens, first_token, frame

from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.compile import jit
from pagesim.sim.core.kv import radix_cache
from pagesim.sim.run import run_simulation
from pagesim.sim.core.kv.radix_cache import (HICACHE_PENDING, HICACHE_PENDING_NODE, INSERTED_LEN, NODE_END,
                                             NODE_OWNER, NODE_PARENT, NODE_START, RADIX_ACCESS_CLOCK,
                                             RADIX_EVICTABLE, RADIX_NODES_USED, RADIX_TREE_TOKENS)

PEER = sglang_hicache.PEER
SGLANG = sglang_hicache.SGLANG
load = sglang_hicache.load  # (tests.peers.importing.driver_or_skip imports the peer's code with it)


# -- the workloads -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """A trace and the SGLang settings it runs with: the device pool and the host pool in tokens
    (pagesim: ``--kv-gib`` and ``--kv-offload-gib`` of llama-3.1-8b's 128 KiB a token), the page,
    the policy and the chunk."""

    name: str
    make: object
    pool_tokens: int
    host_tokens: int
    page_size: int = 1
    policy: str = "fcfs"
    chunk_budget: int = 512
    description: str = ""

    def config(self) -> SimConfig:
        return SimConfig.for_system("sglang", model="llama-3.1-8b", gpu="h100-80gb", cost_model="roofline",
                                    block_size=self.page_size, kv_gib=self.pool_tokens * LLAMA_SLOT / 2**30,
                                    kv_offload_gib=self.host_tokens * LLAMA_SLOT / 2**30,
                                    schedule_policy=self.policy, chunk_budget=self.chunk_budget,
                                    max_seq_len=self.pool_tokens)


def conversations(seed: int, requests: int, block: int, own_blocks: int = 3):
    """Conversations that come back: each request continues one of 12 conversations (its
    earlier turns its prefix) or starts one, between unrelated requests that push the earlier
    turns off the GPU: shared prefixes found on the host tier."""
    import random

    def make():
        rng = random.Random(seed)
        turns: dict = {}
        rows, now = [], 0.0
        for i in range(requests):
            if rng.random() < 0.6:
                c = rng.randrange(12)
                so_far = turns.get(c, ())
                hashes = so_far + tuple(("turn", c, len(so_far), k) for k in range(rng.randint(1, own_blocks)))
                turns[c] = hashes
            else:
                hashes = tuple(("own", i, k) for k in range(rng.randint(1, own_blocks)))
            prompt = len(hashes) * block - rng.randrange(block)
            rows.append((now, prompt, rng.randint(2, 60), hashes))
            now += rng.choice((0.0, 0.05, 0.3, 1.0))
        return frame(rows, block)
    return make


WORKLOADS = {w.name: w for w in (
    Workload("conversations-p1", conversations(5, 160, 32), pool_tokens=1200, host_tokens=2400,
             description="12 conversations that come back, blocks of 32, device 1200 tokens, host 2400, page 1"),
    Workload("conversations-p16-lpm", conversations(6, 160, 32), pool_tokens=1280, host_tokens=2560, page_size=16,
             policy="lpm", description="the same drawn again, page 16, lpm"),
    Workload("host-pressure", conversations(7, 200, 32), pool_tokens=1000, host_tokens=600,
             description="a host pool smaller than the device pool: host leaves evicted, writes dropped"),
    Workload("under-threshold", conversations(8, 160, 5, own_blocks=2), pool_tokens=250, host_tokens=2000,
             description="blocks of 5 tokens: host hits of 5, under the load-back threshold (10), and more"),
    Workload("chunks", conversations(9, 120, 200, own_blocks=4), pool_tokens=3000, host_tokens=6000,
             chunk_budget=256, description="blocks of 200, chunks of 256: checkpoints of unfinished requests"),
)}


# -- SGLang's side ---------------------------------------------------------------------------------
class Slots:
    """The device allocator SGLang's cache frees into and a load allocates from: its free slots
    are pagesim's at each call's start (``set``); a free adds to them, an allocation takes from
    them, with slot ids that are never reused (no KV is read)."""

    def __init__(self, size: int):
        import torch

        self.torch, self.free_slots, self.next_id, self.size = torch, 0, 1 << 40, size
        self.size_full = size
        self.page_size = 1
        self.device = "cpu"

    def available_size(self):
        return self.free_slots

    def alloc(self, n: int):
        if n > self.free_slots:
            return None
        self.free_slots -= n
        self.next_id += n
        return self.torch.arange(self.next_id - n, self.next_id, dtype=self.torch.int64)

    def free(self, indices):
        self.free_slots += len(indices)

    def free_segment(self, indices, start_pos=0):
        self.free(indices)

    def get_kvcache(self):
        return sglang_hicache.KVBuffers()

    def mamba_full_cache_donor(self):
        return None  # (allocator/base.py:192-194: a plain pool has none)


class Copies(sglang_hicache.Transfers):
    """``sglang_hicache.Transfers`` with one acknowledgement per node written and per load, so
    that each is acknowledged when pagesim's copy of it ends (``Ack``, its events done)."""

    def write(self, device_indices, priority=None, node_id=-1, extra_pools=None, flush=True, start_owner=None):
        host_indices = self.mem_pool_host.host_pool.alloc(len(device_indices))
        if host_indices is None:
            return None
        self.ack_write_queue.append(sglang_hicache.Ack([node_id], len(device_indices)))
        self.written += len(device_indices)
        return host_indices

    def start_writing(self):
        pass

    def load(self, host_indices, priority=None, node_id=-1, extra_pools=None, *, device_indices=None,
             anchor_indices=None):
        device_indices = self.device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        self.ack_load_queue.append(sglang_hicache.Ack([node_id], len(host_indices)))
        self.loaded += len(host_indices)
        return device_indices


class Cache:
    """SGLang's ``UnifiedRadixCache`` with its host tier (``sglang_hicache.Probe.attach``'s state)
    over ``Slots`` and a host pool of ``host_pages`` pages."""

    def __init__(self, device: int, host_pages: int, page: int):
        import torch

        sglang_hicache.load()
        self.slots = Slots(device)
        full = SGLANG.ct.ComponentType.FULL
        with PEER.active():
            params = SGLANG.params.CacheInitParams(
                disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.slots,
                page_size=page, chunked_prefill_size=64, tree_components=(full,), tree_core_backend="python")
            self.cache = SGLANG.UnifiedRadixCache(params)
            self.host = sglang_hicache.HostSlots.__new__(sglang_hicache.HostSlots)
            # pool_host/base.py:175-231: size tokens, then page_num = size // page + 1 (pagesim's pages)
            sglang_hicache.HostSlots.__init__(
                self.host, dtype=torch.bfloat16, device_capacity_tokens=(host_pages - 1) * page, size_per_token=1,
                start_layer=0, end_layer=0, host_to_device_ratio=1.0, host_size=0, page_size=page,
                layout="page_first", pin_memory=False, device="cpu", is_dummy=True)
        assert self.host.size == host_pages * page
        probe = sglang_hicache.Probe.__new__(sglang_hicache.Probe)
        probe.cache, probe.host, probe.allocator = self.cache, self.host, self.slots
        with PEER.active():
            probe.attach("write_through")
        self.cache.cache_controller = Copies(self.slots, self.cache.host_pool_group)
        self.full = full

    def nodes(self) -> dict:
        """``(depth, tokens) -> (parent's depth, parent's first token, lock, on device, on host,
        last access)``."""
        out = {}
        level = [(child, 0, (0, 0)) for child in self.cache.tree_core.root_node.children.values()]
        while level:
            below = []
            for node, depth, above in level:
                tokens = sglang_radix.sglang_key(node)
                data = node.component_data[self.full]
                out[(depth, tokens)] = (*above, data.lock_ref, data.value is not None, data.host_value is not None,
                                        node.last_access_time)
                below.extend((child, depth + len(node.key), (depth, first_token(tokens)))
                             for child in node.children.values())
            level = below
        return out

    def host_used(self) -> int:
        return self.host.size - self.host.available_size()


# -- pagesim's side --------------------------------------------------------------------------------
def pagesim_nodes(s, tokens: Tokens, keys: dict) -> dict:
    """pagesim's live nodes as :meth:`Cache.nodes`."""
    return sglang_radix.pagesim_nodes(s, tokens, keys, tiers=True)


@dataclass(frozen=True)
class Tree:
    nodes: dict
    evictable: int
    protected: int
    host_used: int

    def describe(self, other: "Tree", limit: int = 12) -> str:
        rows = [f"    depth {depth:>6} length {len(tokens) // 8:>5} first {first_token(tokens):>12} parent "
                f"{node[:2]} lock {node[2]} device {node[3]} host {node[4]} stamped by {node[5]}"
                for (depth, tokens), node in sorted(self.nodes.items()) if other.nodes.get((depth, tokens)) != node]
        more = [f"    ... {len(rows) - limit} more"] if len(rows) > limit else []
        return "\n".join([f"  {len(self.nodes)} nodes, evictable {self.evictable}, protected {self.protected}, "
                          f"host {self.host_used}; {len(rows)} not the other's:", *rows[:limit], *more])


@dataclass
class Run:
    workload: Workload
    operations: list = field(default_factory=list)
    first: tuple | None = None
    summary: dict = field(default_factory=dict)
    dropped_writes: int = 0  # writes that found no host room even after host eviction
    unloaded_hits: int = 0  # host hits not loaded back (under the threshold, or no device room)

    @property
    def identical(self) -> int:
        return sum(op.identical for op in self.operations)

    def kinds(self) -> dict:
        out: dict = {}
        for op in self.operations:
            done, total = out.get(op.kind, (0, 0))
            out[op.kind] = (done + op.identical, total + 1)
        return out

    def divergence(self) -> str:
        if self.first is None:
            return ""
        op, ours, theirs = self.first
        before = [o.describe() for o in self.operations[max(op.index - 4, 0):op.index]]
        return "\n".join(["first divergence: " + op.describe(), "  the operations before it:",
                          *("    " + line for line in before), "  pagesim's tree after it:", ours.describe(theirs),
                          "  SGLang's:", theirs.describe(ours)])


class Twin:
    """SGLang's cache beside pagesim's (module docstring)."""

    def __init__(self, workload: Workload, trace: pd.DataFrame, s):
        page = workload.page_size
        self.page = page
        self.side = Cache(radix_cache.capacity(s), int(s.config[state.HICACHE_HOST_PAGES]), page)
        self.cache = self.side.cache
        self.tokens = Tokens(trace)
        self.keys: dict = {}
        self.handles = {radix_cache.ROOT: self.cache.tree_core.root_node.id}  # pagesim's row -> SGLang's node id
        self.locks: dict = {}  # pagesim's row -> SGLang's TreeLocks on it (a request's, the scheduler's)
        self.kind: dict = {}  # a node row whose copy is pending -> "write" or "load"
        self.busy = 0  # inside a replayed call: the calls it makes are SGLang's own inside its call
        self.run = Run(workload)
        self.stamped: dict = {}  # raw stamp -> the operation that made it, per side
        self.ours_seen, self.theirs_seen = 0, self.counter()

    @staticmethod
    def counter() -> float:
        """SGLang's access clock (``components/base.py:161-165``) now."""
        import importlib

        with PEER.active():
            base = importlib.import_module("sglang.srt.mem_cache.unified_cache.components.base")
        return base._LAST_ACCESS_TIME_COUNTER_FLOAT

    def key(self, r: int, n: int):
        return SGLANG.radix.RadixKey(self.tokens.of(r)[:n], None)

    def tree(self, s, index: int) -> tuple[Tree, Tree]:
        """Both trees, stamps named by the operation that made them."""
        ours, theirs = pagesim_nodes(s, self.tokens, self.keys), self.side.nodes()
        clock, counter = int(s.count[RADIX_ACCESS_CLOCK]), self.counter()

        # pagesim's clock is the last tick given; SGLang's counter the next value, a path's
        # ancestors stamped a hundred-thousandth below it each (unified_tree_core.py:1031-1035)
        def name(raw, seen, side):
            if raw > seen:
                self.stamped[(side, raw)] = index
            return self.stamped.get((side, raw), ("before", raw))
        ours = {k: v[:5] + (name(v[5], self.ours_seen, 0),) for k, v in ours.items()}
        theirs = {k: v[:5] + (name(v[5], self.theirs_seen - 0.5, 1),) for k, v in theirs.items()}
        self.ours_seen, self.theirs_seen = clock, counter
        c = s.count
        return (Tree(ours, int(c[RADIX_EVICTABLE]), int(c[RADIX_TREE_TOKENS] - c[RADIX_EVICTABLE]),
                     int(c[state.HOST_USED]) * self.page),
                Tree(theirs, self.cache.evictable_size(), self.cache.protected_size(), self.side.host_used()))

    def settle(self, s, kind, request, argument, ours, theirs):
        index = len(self.run.operations)
        trees = self.tree(s, index)
        same = trees[0] == trees[1]
        op = Operation(index, float(s.clock[state.NOW]), kind, request, argument, ours, theirs, same)
        self.run.operations.append(op)
        if same:
            self.map_handles(s)
        elif self.run.first is None:
            self.run.first = (op, *trees)

    def map_handles(self, s):
        """Each pagesim row to SGLang's node of the same depth and tokens (trees alike)."""
        theirs = {}
        level = list(self.cache.tree_core.root_node.children.values())
        depth_of = {self.cache.tree_core.root_node.id: 0}
        while level:
            below = []
            for node in level:
                start = depth_of[node.parent.id]
                depth_of[node.id] = start + len(node.key)
                theirs[(start, sglang_radix.sglang_key(node))] = node.id
                below.extend(node.children.values())
            level = below
        table = s.radix_nodes
        for x in range(1, int(s.count[RADIX_NODES_USED])):
            if table[x, NODE_PARENT] != radix_cache.FREE_NODE:
                owner, start, end = (int(v) for v in table[x, [NODE_OWNER, NODE_START, NODE_END]])
                self.handles[x] = theirs[(start, self.tokens.of(owner)[start:end].tobytes())]

    def call(self, fn):
        """SGLang's side of a call; once the trees have differed, one that raises counts as different."""
        try:
            with PEER.active():
                return fn()
        except Exception as error:
            if self.run.first is None:
                raise
            return f"raised {type(error).__name__}: {error}"

    # the wrapped pagesim calls
    def match_prefix(self, original, s, r, limit):
        if self.busy:
            return original(s, r, limit)
        node, depth = original(s, r, limit)
        device = radix_cache.device_node(s, node)
        ours = (int(radix_cache.depth(s, device)), int(depth - radix_cache.depth(s, device)))
        result = self.call(lambda: self.cache.match_prefix(SGLANG.base.MatchPrefixParams(key=self.key(r, int(limit)))))
        theirs = result if isinstance(result, str) else (int(result.device_prefix_len), int(result.host_hit_length))
        self.settle(s, "match", int(r), int(limit), ours, theirs)
        return node, depth

    def checkpoint(self, original, s, r, n):
        inserted = int(s.radix_request[r, INSERTED_LEN])
        # checkpoint returns the node alone; its first insert's (the write-through's, or the
        # plain one's without a host tier) tokens held already are what SGLang's insert returns
        held = []
        inserts = {name: getattr(radix_cache, name) for name in ("insert", "insert_writing_through")}

        def recorded(insert):
            def call(s, r, n):
                node, depth = insert(s, r, n)
                held.append(depth)
                return node, depth
            return call
        self.busy += 1
        try:
            for name, insert in inserts.items():
                setattr(radix_cache, name, recorded(insert))
            node = original(s, r, n)
        finally:
            self.busy -= 1
            for name, insert in inserts.items():
                setattr(radix_cache, name, insert)
        depth = held[0]
        self.side.slots.free_slots = int(radix_cache.available(s))
        theirs = self.call(lambda: self.sglang_checkpoint(int(r), int(n), inserted))
        self.settle(s, "checkpoint", int(r), int(n), int(depth), theirs)
        return node

    def sglang_checkpoint(self, r: int, n: int, inserted: int) -> int:
        """``checkpoint_into_tree``'s tree calls (unified_radix_cache.py:1164-1292): the insert
        (fresh device slots for its value), then the prompt's, which splits at the prompt's end."""
        import torch

        slots = self.side.slots  # the request's own slots (fresh ids: no KV is read)
        values = torch.arange(slots.next_id, slots.next_id + n, dtype=torch.int64)
        slots.next_id += n
        result = self.cache.insert(SGLANG.base.InsertParams(key=self.key(r, n), value=values, prev_prefix_len=0,
                                                            inserted_len=inserted))
        prompt = int(self.tokens.prompt[r]) // self.page * self.page
        if 0 < prompt < n:
            self.cache.insert(SGLANG.base.InsertParams(key=self.key(r, prompt), value=values[:prompt],
                                                       prev_prefix_len=prompt, inserted_len=prompt, priority=1))
        return int(result.prefix_len)

    def lock(self, original, kind, s, x):
        if self.busy:
            return original(s, x)
        evictable = int(s.count[RADIX_EVICTABLE])
        original(s, x)
        ours = int(s.count[RADIX_EVICTABLE]) - evictable
        before = self.cache.evictable_size()
        if kind == "inc_lock_ref":
            result = self.call(lambda: self.locks.setdefault(int(x), []).append(self.cache.lock(self.handles[int(x)])))
        else:
            result = self.call(lambda: self.cache.unlock(self.locks[int(x)].pop()))
        theirs = result if isinstance(result, str) else self.cache.evictable_size() - before
        self.settle(s, kind, -1, int(s.radix_nodes[x, NODE_END]), ours, theirs)

    def evict(self, original, s, n):
        if self.busy:
            return original(s, n)
        freed = original(s, n)
        result = self.call(lambda: self.cache.evict(SGLANG.base.EvictParams(num_tokens=int(n))))
        theirs = result if isinstance(result, str) else int(result.num_tokens_evicted)
        self.settle(s, "evict", -1, int(n), int(freed), theirs)
        return freed

    def load_back(self, original, s, device, best):
        self.side.slots.free_slots = int(radix_cache.available(s))
        self.busy += 1
        try:
            loaded = original(s, device, best)
        finally:
            self.busy -= 1
        if loaded:
            self.kind[int(best)] = "load"
        else:
            self.run.unloaded_hits += 1
        result = self.call(lambda: self.cache.load_back(self.handles[int(best)]))
        host_hit = int(radix_cache.depth(s, best) - radix_cache.depth(s, device))
        self.settle(s, "load_back", -1, host_hit, bool(loaded), result)
        return loaded

    def write_one(self, original, s, x):
        written = original(s, x)
        if written:
            self.kind[int(x)] = "write"
        else:
            self.run.dropped_writes += 1
        return written

    def acknowledge(self, original, s):
        pending = s.host_work[HICACHE_PENDING_NODE, :int(s.count[HICACHE_PENDING])].tolist()
        done = [x for x in pending if s.host_ready_s[x] <= s.clock[state.NOW]]
        writes = sum(self.kind.pop(x) == "write" for x in done)
        loads = len(done) - writes
        self.busy += 1
        try:
            original(s)
        finally:
            self.busy -= 1
        result = self.call(lambda: (self.cache.writing_check(finish_count=writes),
                                    self.cache.loading_check(finish_count=loads)))
        self.settle(s, "acknowledge", -1, len(done), (writes, loads),
                    result if isinstance(result, str) else (writes, loads))


WRAPPED = ((radix_cache, "match_prefix"), (radix_cache, "checkpoint"), (radix_cache, "inc_lock_ref"),
           (radix_cache, "dec_lock_ref"), (radix_cache, "evict"), (radix_cache, "load_back"),
           (radix_cache, "write_one"), (radix_cache, "acknowledge"))


def run(workload: Workload) -> Run:
    """pagesim's ``--system sglang --kv-offload-gib`` over the workload, each tree call made on
    SGLang's cache too (module docstring)."""
    if jit.COMPILED:  # compiled, the core's functions call each other directly: nothing could be wrapped
        return run_interpreted(workload)
    sglang_hicache.load()
    trace = workload.make()
    originals = {(module, name): getattr(module, name) for module, name in WRAPPED}
    from pagesim.sim import run as sim_run
    from pagesim.sim.core import build

    made = {}
    build_original = sim_run.build

    def build_and_pair(*args, **kwargs):  # the state, then SGLang's cache sized as its pools
        s = build_original(*args, **kwargs)
        made["twin"] = Twin(workload, trace, s)
        return s
    twin = lambda: made["twin"]  # noqa: E731
    wrapped = {
        (radix_cache, "match_prefix"): lambda s, r, limit: twin().match_prefix(
            originals[(radix_cache, "match_prefix")], s, r, limit),
        (radix_cache, "checkpoint"): lambda s, r, n: twin().checkpoint(originals[(radix_cache, "checkpoint")], s, r, n),
        (radix_cache, "inc_lock_ref"): lambda s, x: twin().lock(
            originals[(radix_cache, "inc_lock_ref")], "inc_lock_ref", s, x),
        (radix_cache, "dec_lock_ref"): lambda s, x: twin().lock(
            originals[(radix_cache, "dec_lock_ref")], "dec_lock_ref", s, x),
        (radix_cache, "evict"): lambda s, n: twin().evict(originals[(radix_cache, "evict")], s, n),
        (radix_cache, "load_back"): lambda s, d, b: twin().load_back(originals[(radix_cache, "load_back")], s, d, b),
        (radix_cache, "write_one"): lambda s, x: twin().write_one(originals[(radix_cache, "write_one")], s, x),
        (radix_cache, "acknowledge"): lambda s: twin().acknowledge(originals[(radix_cache, "acknowledge")], s),
    }
    assert build is not None
    try:
        sim_run.build = build_and_pair
        for (module, name), function in wrapped.items():
            setattr(module, name, function)
        summary = run_simulation(workload.config(), trace).summary
    finally:
        sim_run.build = build_original
        for (module, name), function in originals.items():
            setattr(module, name, function)
    done = made["twin"].run
    done.summary = summary
    return done


CHILD = """import pickle, sys
from tests.peers import sglang_hicache_side
done = sglang_hicache_side.run(sglang_hicache_side.WORKLOADS[sys.argv[1]])
done.workload = None  # its trace's maker is a closure: the parent puts its own workload back
with open(sys.argv[2], "wb") as out:
    pickle.dump(done, out)
"""


def run_interpreted(workload: Workload) -> Run:
    """``run`` made by a child Python with the interpreted core (the suite loads pagesim compiled)."""
    if WORKLOADS.get(workload.name) is not workload:
        raise ValueError(f"{workload.name}: only WORKLOADS' own workloads run in a child (the core here is compiled)")
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "run.pickle"
        subprocess.run([sys.executable, "-c", CHILD, workload.name, str(result)],
                       env={**os.environ, "PAGESIM_JIT": "0"}, check=True, cwd=Path(__file__).resolve().parents[2])
        with result.open("rb") as handle:
            done = pickle.load(handle)
    done.workload = workload
    return done


def report(names=None, say=print) -> list[Run]:
    """Each workload's operations identical / total, per kind, and the first divergence (lines
    of at most 100 columns)."""
    import textwrap

    runs = []
    for name in names or WORKLOADS:
        workload = WORKLOADS[name]
        done = run(workload)
        runs.append(done)
        s = done.summary
        lines = [f"{name}: {done.identical} / {len(done.operations)} operations identical",
                 f"  {workload.description}",
                 "  " + ", ".join(f"{kind} {a}/{b}" for kind, (a, b) in sorted(done.kinds().items())),
                 f"  host hit {s.get('host_prefix_hit_rate', 0):.1%} of prompt tokens, GPU hit "
                 f"{s.get('gpu_prefix_hit_rate', 0):.1%}; stored {s.get('host_stored_gib', 0):.3f} GiB, loaded "
                 f"{s.get('host_loaded_gib', 0):.3f} GiB; {s.get('host_evicted_blocks', 0)} host pages evicted, "
                 f"{done.dropped_writes} writes dropped, {done.unloaded_hits} host hits not loaded"]
        if done.first is not None:
            lines += done.divergence().splitlines()
        for line in lines:
            indent = " " * (len(line) - len(line.lstrip()) + 4)
            for part in textwrap.wrap(line, 100, subsequent_indent=indent, break_long_words=False) or [""]:
                say(part)
    return runs


if __name__ == "__main__":
    report(sys.argv[1:] or None)
