"""SGLang 0.5.23's own ``RadixCache``, driven operation by operation beside pagesim's radix cache.

Executed from SGLang's source (fetched by ``python -m tests.peers.fetch``): ``srt/mem_cache/
radix_cache.py`` and what it runs: ``base_prefix_cache.py`` (its base class, parameters and
results), ``cache_init_params.py``, ``events.py`` (its event recorder, off), ``evict_policy.py``
and ``utils.py`` (``get_eviction_strategy``: LRU) and ``unified_cache/component_type.py`` (an
enum). Every other SGLang module they import is a stub (``STUBS``): kernels, the memory pools'
classes, metrics, KV events and environment settings, each a placeholder that raises if called.

**What is driven, and why this way.** pagesim's ``--system sglang`` runs a workload: its
scheduler (``sim/core/sched/scheduler_sglang.py``) makes every admission, chunk, retraction and finish
decision, and each call it makes into its radix cache (``sim/core/kv/radix_cache.py``) is replayed
at once, with the same arguments, on SGLang's ``RadixCache``:

=============================================  ====================================================
pagesim (``sim/core/kv/radix_cache.py``)           SGLang (``srt/mem_cache/radix_cache.py``)
=============================================  ====================================================
``match_prefix(s, r, limit)``: node, depth      ``match_prefix`` of ``r``'s first ``limit`` tokens:
                                                ``device_prefix_len``, ``last_device_node`` (:364)
``insert(s, r, n)``: node, tokens held before   ``insert`` of ``r``'s first ``n`` tokens:
                                                ``prefix_len``, ``last_device_node`` (:428)
``inc_lock_ref`` / ``dec_lock_ref(s, node)``    the same on its node: the evictable tokens it
                                                moves, ``delta`` (:582, :597)
``evict(s, n)``: tokens freed                   ``evict(EvictParams(n))``: ``num_tokens_evicted``
                                                and which leaves (:552)
=============================================  ====================================================

The calls are pagesim's, so this compares the tree alone: how a match is cut to whole pages and
splits a node, which node a walk ends at, the lock counts and the evictable and protected sizes,
the last-access order and what an eviction frees. It is the cleanest log because every tree
change pagesim makes is one of these five calls (``cache_finished_req``, ``cache_unfinished_req``
and ``release`` are made of them; ``sim/core/kv/memory.py`` and the scheduler call nothing else), so
nothing is inferred from the state between steps. Whether the scheduler calls them where SGLang's
would (which tokens a finished request inserts, which requests are admitted) is the scheduler's
question, not this driver's. An operation is identical when both results agree and, after it,
both trees are the same (``Tree``): every node's depth, tokens, parent and lock count, its last
access (``Stamps``: the LRU order), and the evictable and protected sizes; after a match that
made no node, the matched path alone (``Twin``). A node handle pagesim passes (its row) is the
node SGLang's same call returned: both walks end at the same node when they agree, and a split
keeps the lower half in the old node on both sides (``_split_node``, :677). Once the trees
differ the calls go on (each is counted), an SGLang call that raises counting as different.

**Checkpoints** (``run(..., checkpoint=True)``). SGLang 0.5.23 inserts a finished request's
tokens, and a chunk's, through ``RadixCache.checkpoint`` (``mem_cache/common.py:431``, ``:278``),
whose ``_insert_cache(split_prompt=True)`` inserts the prompt's key again when the insert goes
past it (``radix_cache.py:485-502``): the leaf is split at the prompt's end. pagesim's
``radix_cache.checkpoint`` is the same two inserts, and by default each is replayed as the
``insert`` it is. With ``checkpoint`` the driver wraps pagesim's ``checkpoint`` instead and makes
it on SGLang's side as SGLang makes it: its own ``_insert_cache`` (a request's row of token ids
for its pool row), the node found without stamping it; checkpoint then matches the key (:524),
which stamps the new leaf with its path (a new leaf against its own ancestors only, an order no
eviction reads: left out).

Not compared: SGLang 0.5.23's server builds a ``UnifiedRadixCache`` by default
(``mem_cache/registry.py:146``), whose tree core stamps differently
(``unified_cache/unified_tree_core.py:1030-1033``, ``:1524``); ``RadixCache`` is the tree pagesim
follows (and the one of SGLang's FlexKV cache and of lpm's waiting-queue check,
``managers/schedule_policy.py:211``).

**Tokens.** Request ``r``'s token ``t`` is named by its chain of prefix hashes up to block
``t // H`` (the trace's ``hash_block_tokens``), where the trace names it (``t`` below ``min(prompt,
hashes * H)``), and is its own otherwise (the rest of its prompt, every generated token): two
requests' tokens agree exactly where their hash chains do, which is what pagesim's tree assumes
(``radix_cache.same_tokens``). The tokens come from the trace, not from pagesim's arrays.

**The clock.** SGLang stamps a node's last access with ``time.monotonic()`` (a new node
``TreeNode.__init__``, :259; a match ``_match_prefix_helper``, :652; an insert ``_insert_helper``,
:716). Its module is given a counter for ``monotonic`` instead: strictly increasing, it orders the
stamps as the real clock does without ties at the timer's resolution, and the LRU order compared
does not depend on the machine's speed (``Counter``).
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
import types
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from tests.peers import fetch, suite
from tests.peers.importing import Peer, placeholders

from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.compile import jit
from pagesim.sim.core.kv import radix_cache
from pagesim.sim.run import run_simulation
from pagesim.sim.core.kv.radix_cache import (NODE_END, NODE_EVICTED, NODE_LAST_ACCESS, NODE_LOCK_REF, NODE_ON_HOST,
                                             NODE_OWNER, NODE_PARENT, NODE_START, RADIX_ACCESS_CLOCK,
                                             RADIX_EVICTABLE, RADIX_FREE_NODE, RADIX_NODES_USED, RADIX_TREE_TOKENS)

VERSION = "0.5.23"

# SGLang's modules executed as they are
REAL = (
    "sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.cache_init_params", "sglang.srt.mem_cache.events", "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.mem_cache.utils", "sglang.srt.mem_cache.unified_cache.component_type",
)

# module -> {name: value, or None for a Placeholder}: what the real modules import
STUBS = {
    # the pools' classes: named in annotations; the cache is made without pools (create_simulated)
    "sglang.srt.mem_cache.allocator": placeholders("BaseTokenToKVPoolAllocator"),
    "sglang.srt.mem_cache.memory_pool": placeholders("ReqToTokenPool"),
    # metrics are off (enable_metrics False: init_metrics_collector is never called)
    "sglang.srt.observability.metrics_collector": placeholders(
        "STAT_LOGGER_ROLE_RADIX_CACHE", "RadixCacheMetricsCollector", "radix_cache_metric_labels",
        "resolve_collector_class"),
    "sglang.srt.runtime_context": placeholders("get_observability", "get_parallel"),
    # KV events are off (enable_kv_cache_events False: every record_* returns first)
    "sglang.srt.disaggregation.kv_events": placeholders(
        "AllBlocksCleared", "BlockRemoved", "BlockStored", "StorageMedium", "kv_event_namespace_seed",
        "namespaced_block_hash"),
    # utils.py's kernels, environment and native hash: for KV buffers and storage hashes, not the tree
    "sglang.kernels.ops.kvcache.mla_buffer": placeholders(
        "get_mla_kv_buffer_kernel", "get_mla_kv_buffer_triton", "set_mla_kv_buffer_dcp_sharded_triton",
        "set_mla_kv_buffer_fp8_quant_kernel", "set_mla_kv_buffer_kernel", "set_mla_kv_buffer_triton",
        "set_mla_kv_buffer_triton_fp8_quant", "set_mla_kv_scale_buffer_kernel", "set_mla_kv_scale_buffer_triton"),
    "sglang.srt.environ": placeholders("envs"),
    "sglang.srt.mem_cache.cpp_utils.native_hash": placeholders("get_native_hash"),
    "sglang.srt.utils.common": placeholders("ceil_align"),  # checkpoint's, a request-level call not made here
}

PEER = Peer(VERSION, REAL, STUBS, "tests/peers/sglang_radix.py", package="sglang",
            folder=fetch.source_folder(VERSION, "sglang"), name=f"SGLang {VERSION}")
SGLANG = types.SimpleNamespace()  # its modules' names the driver uses, once loaded


def load():
    """Import SGLang's radix cache (raises where it does not import here: see importing.py)."""
    if hasattr(SGLANG, "RadixCache"):
        return
    with PEER.active():
        radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    SGLANG.module = radix
    SGLANG.RadixCache, SGLANG.RadixKey = radix.RadixCache, radix.RadixKey
    SGLANG.MatchPrefixParams, SGLANG.InsertParams = base.MatchPrefixParams, base.InsertParams
    SGLANG.EvictParams = base.EvictParams


# -- the workloads -------------------------------------------------------------------------------
LLAMA_SLOT = 131072  # KV bytes per token of llama-3.1-8b (32 layers, 8 KV heads of 128, fp16): 2**17
SHARED_TRACES = Path(os.environ.get("PAGESIM_SHARED_TRACES")
                     or Path(__file__).resolve().parents[2].parent / "shared" / "traces")
MOONCAKE = SHARED_TRACES / "mooncake_conversation_trace.jsonl"


@dataclass(frozen=True)
class Workload:
    """A trace (``make``: a DataFrame of request_id, arrival_s, prompt_tokens, output_tokens,
    prefix_hashes; ``attrs['hash_block_tokens']``) and the SGLang settings it runs with: the
    pool in tokens, the page, ``schedule_policy``, ``chunked_prefill_size``."""

    name: str
    make: Callable[[], pd.DataFrame]
    pool_tokens: int
    page_size: int = 1
    policy: str = "fcfs"
    chunk_budget: int = 2048
    description: str = ""
    needs: Path | None = None  # a file outside the repository it reads (skipped when absent)

    def config(self) -> SimConfig:
        # without ignore_eos: the running requests' outputs charged at the ratio, so that the
        # pressure workloads admit enough to evict and retract
        return SimConfig.for_system("sglang", model="llama-3.1-8b", gpu="h100-80gb", cost_model="roofline",
                                    block_size=self.page_size, kv_gib=self.pool_tokens * LLAMA_SLOT / 2**30,
                                    schedule_policy=self.policy, chunk_budget=self.chunk_budget,
                                    max_seq_len=min(32768, self.pool_tokens), ignore_eos=False)


def frame(rows: list, hash_block_tokens: int) -> pd.DataFrame:
    """``rows``: (arrival_s, prompt, output, hashes), in arrival order, the first at 0."""
    df = pd.DataFrame({"request_id": [f"r{i:06d}" for i in range(len(rows))],
                       "arrival_s": [r[0] for r in rows], "prompt_tokens": [r[1] for r in rows],
                       "output_tokens": [r[2] for r in rows], "prefix_hashes": [tuple(r[3]) for r in rows]})
    df.attrs["hash_block_tokens"] = hash_block_tokens
    return df


def mooncake(requests: int) -> Callable[[], pd.DataFrame]:
    def make():
        from pagesim.traces.loaders import load_trace

        df = load_trace(MOONCAKE).head(requests).reset_index(drop=True)
        df.attrs["hash_block_tokens"] = 512  # the loader's own: Mooncake's blocks
        return df
    return make


def three_levels(seed: int, requests: int, block: int) -> Callable[[], pd.DataFrame]:
    """System prompts (level 1), documents under each (level 2), a conversation's turns under a
    document (level 3), then each request's own question: a prefix shared three levels deep.
    Hash blocks of ``block`` tokens; prompts end inside a block."""
    import random

    def make():
        rng = random.Random(seed)
        systems = [tuple(("system", s, k) for k in range(rng.randint(1, 4))) for s in range(3)]
        documents = [(s, tuple(("document", s, d, k) for k in range(rng.randint(1, 5)))) for s in range(3)
                     for d in range(3)]
        turns = {}  # document -> the conversation so far
        rows, now = [], 0.0
        for i in range(requests):
            d = rng.randrange(len(documents))
            s, document = documents[d]
            if rng.random() < 0.5:  # the conversation goes on: one more turn
                so_far = turns.get(d, ())
                turns[d] = so_far + tuple(("turn", d, len(so_far), k) for k in range(rng.randint(1, 2)))
            hashes = systems[s] + document + turns.get(d, ()) + tuple(("own", i, k) for k in range(rng.randint(0, 2)))
            prompt = (len(hashes) - 1) * block + rng.randint(1, block)
            rows.append((now, prompt, rng.randint(2, 40), hashes))
            now += rng.choice((0.0, 0.05, 0.5, 2.0))
        return frame(rows, block)
    return make


def random_pressure(seed: int, requests: int, block: int) -> Callable[[], pd.DataFrame]:
    """Prompts of 1-12 blocks over 6 shared prefixes of 1-5 blocks (or none), outputs of 4-800
    tokens, arriving in bursts: with a small pool, the tree is evicted and requests retracted."""
    import random

    def make():
        rng = random.Random(seed)
        prefixes = [tuple(("prefix", p, k) for k in range(rng.randint(1, 5))) for p in range(6)] + [()]
        rows, now = [], 0.0
        for i in range(requests):
            shared = rng.choice(prefixes)
            hashes = shared + tuple(("own", i, k) for k in range(rng.randint(0, 6)))
            prompt = max(len(hashes) * block - rng.randrange(block), 1) if hashes else rng.randint(1, 12 * block)
            rows.append((now, prompt, rng.randint(4, 800), hashes))
            now += rng.choice((0.0, 0.0, 0.1, 1.0))
        return frame(rows, block)
    return make


def mooncake_workloads(requests: int = 200) -> list:
    """The Mooncake trace's first ``requests`` at its own times, a pool of 800 tokens a request
    (160k for 200: its prompts average 7k tokens, so the tree is evicted; at most 400k, what an
    H100 holds beside llama-3.1-8b's weights), chunks of 2048."""
    pool = min(800 * requests, 400_000)
    return [Workload(f"mooncake-p{page}-{policy}", mooncake(requests), pool_tokens=pool, page_size=page, policy=policy,
                     description=f"Mooncake conversation trace, its first {requests} requests, a pool of "
                                 f"{pool // 1000}k tokens, page {page}, {policy}", needs=MOONCAKE)
            for page in (1, 16) for policy in ("fcfs", "lpm")]


def workloads(mooncake_requests: int = 200) -> dict[str, Workload]:
    out = mooncake_workloads(mooncake_requests)
    for page in (1, 16):
        for policy in ("lpm", "fcfs"):
            out.append(Workload(f"three-levels-p{page}-{policy}", three_levels(11, 300, 40), pool_tokens=200_000,
                                page_size=page, policy=policy, chunk_budget=256,
                                description=f"3-level shared prefixes (system, document, turns), blocks of 40, "
                                            f"page {page}, {policy}, chunks of 256"))
    for page in (1, 16):
        out.append(Workload(f"pressure-p{page}", random_pressure(12, 300, 32), pool_tokens=6_000, page_size=page,
                            policy="lpm", chunk_budget=512,
                            description=f"random prompts over 6 shared prefixes, outputs up to 800, a pool of 6000 "
                                        f"tokens, page {page}, lpm, chunks of 512: evictions and retractions"))
    return {w.name: w for w in out}


#: the Mooncake workloads' requests in the tests (``WORKLOADS``): half ``compare``'s default, to keep
#: the test command, which runs the peers where they are fetched, within its time (.ci/run); the
#: full suite (``suite.full``) runs ``compare``'s, README's tables'
TEST_MOONCAKE_REQUESTS = suite.sample(100, 200)
WORKLOADS = workloads(TEST_MOONCAKE_REQUESTS)


# -- tokens ----------------------------------------------------------------------------------------
class Tokens:
    """Each request's token ids (module docstring, Tokens): a named token is ``chain * H +
    offset + 1`` (a chain's id is its order of first appearance), an own token negative."""

    def __init__(self, trace: pd.DataFrame):
        self.block = int(trace.attrs["hash_block_tokens"])
        self.prompt = trace["prompt_tokens"].to_numpy()
        self.output = trace["output_tokens"].to_numpy()
        self.hashes = trace["prefix_hashes"].tolist() if "prefix_hashes" in trace else [()] * len(trace)
        self.chains: dict = {}
        self.ids: dict[int, array] = {}

    def of(self, r: int) -> array:
        if r not in self.ids:
            chain, ids = -1, array("q")
            named = min(int(self.prompt[r]), len(self.hashes[r]) * self.block)
            for k, h in enumerate(self.hashes[r][:(named + self.block - 1) // self.block]):
                chain = self.chains.setdefault((chain, h), len(self.chains))
                ids.extend(chain * self.block + offset + 1 for offset in range(min(self.block, named - k * self.block)))
            total = int(self.prompt[r] + self.output[r])
            ids.extend(-(r << 24 | t) - 1 for t in range(named, total))
            self.ids[r] = ids
        return self.ids[r]


# -- the trees, side by side -----------------------------------------------------------------------
@dataclass(frozen=True)
class Tree:
    """A tree as compared: each node by its depth and tokens (which name it: a token is named by
    its chain or its request, so it has one place in the tree), with its parent (depth, first
    token), lock count and last access (``Stamps``: the operation that stamped it, and its order
    among that operation's stamps); and the evictable and protected tokens."""

    nodes: dict  # (depth, tokens' bytes) -> (parent's depth, parent's first token, lock_ref, stamp)
    evictable: int
    protected: int

    def describe(self, other: "Tree", limit: int = 12) -> str:
        """This tree's nodes that ``other`` has not, or has otherwise."""
        rows = [f"    depth {depth:>6} length {len(tokens) // 8:>6} first token {first_token(tokens):>12} parent "
                f"({parent}, {parent_token}) lock_ref {lock} last access {stamp}"
                for (depth, tokens), (parent, parent_token, lock, stamp) in sorted(self.nodes.items())
                if other.nodes.get((depth, tokens)) != (parent, parent_token, lock, stamp)]
        more = [f"    ... {len(rows) - limit} more"] if len(rows) > limit else []
        return "\n".join([f"  {len(self.nodes)} nodes, evictable {self.evictable}, protected {self.protected}; "
                          f"{len(rows)} of them not the other's:", *rows[:limit], *more])


def first_token(tokens: bytes) -> int:
    return array("q", tokens[:8])[0] if tokens else 0


class Stamps:
    """One side's last-access times named alike on both: (the operation that stamped it, its
    rank among that operation's stamps). pagesim ticks a clock, SGLang reads ``monotonic``, a
    different number of times per operation (a walk ticks once, ``TreeNode.__init__`` reads twice);
    what both must agree on is which nodes each operation stamps and in which order."""

    def __init__(self):
        self.names: dict = {}

    def register(self, operation: int, raw_times) -> None:
        for rank, raw in enumerate(sorted(set(raw_times))):
            self.names[raw] = (operation, rank)

    def name(self, raw) -> tuple:
        return self.names.get(raw, ("never registered", raw))

    def keep(self, raw_times) -> None:
        """Forget the times no node holds any more (the map stays the size of the tree)."""
        self.names = {raw: self.names[raw] for raw in raw_times if raw in self.names}


def pagesim_nodes(s, tokens: Tokens, keys: dict, rows=None, tiers: bool = False) -> dict:
    """pagesim's live nodes, ``(depth, tokens) -> (parent's depth, parent's first token,
    lock_ref, raw last access)``; ``rows``: only these (a path), else every live row of
    ``radix_nodes``. ``keys`` caches a node's tokens by (owner, start, end). ``tiers``: with a
    host tier, whether each is on the device and on the host before its last access
    (``sglang_hicache_side.py``)."""
    table = s.radix_nodes[:s.count[RADIX_NODES_USED]].tolist()

    def key(x):
        row = table[x]
        name = (row[NODE_OWNER], row[NODE_START], row[NODE_END])
        if name not in keys:
            keys[name] = tokens.of(name[0])[name[1]:name[2]].tobytes()
        return keys[name]

    out = {}
    for x in range(1, len(table)) if rows is None else rows:  # row 0: the root
        row = table[x]
        parent = row[NODE_PARENT]
        if parent == radix_cache.FREE_NODE:
            continue
        above = (0, 0) if parent == radix_cache.ROOT else (table[parent][NODE_START], first_token(key(parent)))
        where = (not row[NODE_EVICTED], bool(row[NODE_ON_HOST])) if tiers else ()
        out[(row[NODE_START], key(x))] = (*above, row[NODE_LOCK_REF], *where, row[NODE_LAST_ACCESS])
    return out


def pagesim_path(s, x) -> list:
    path = []
    while x != radix_cache.ROOT:
        path.append(int(x))
        x = s.radix_nodes[x, NODE_PARENT]
    return path


def sglang_key(node) -> bytes:
    """A node's tokens, kept on the node while its key is the same object (a split gives it a new one)."""
    if getattr(node, "peer_key", None) is not node.key:
        node.peer_key, node.peer_bytes = node.key, node.key.raw_token_ids().tobytes()
    return node.peer_bytes


def sglang_nodes(cache, path=None) -> dict:
    """SGLang's nodes as ``pagesim_nodes``; ``path``: a node whose path from the root alone."""
    out = {}
    if path is not None:
        chain = []
        while path is not cache.root_node:
            chain.append(path)
            path = path.parent
        depth = 0
        above = (0, 0)
        for node in reversed(chain):
            tokens = sglang_key(node)
            out[(depth, tokens)] = (*above, node.lock_ref, node.last_access_time)
            above = (depth, first_token(tokens))
            depth += len(node.key)
        return out
    level = [(child, 0, (0, 0)) for child in cache.root_node.children.values()]
    while level:
        below = []
        for node, depth, above in level:
            tokens = sglang_key(node)
            out[(depth, tokens)] = (*above, node.lock_ref, node.last_access_time)
            below.extend((child, depth + len(node.key), (depth, first_token(tokens)))
                         for child in node.children.values())
        level = below
    return out


def named(nodes: dict, stamps: Stamps) -> dict:
    return {name: node[:3] + (stamps.name(node[3]),) for name, node in nodes.items()}


class Counter:
    """``time.monotonic`` for SGLang's radix cache (module docstring, The clock)."""

    def __init__(self):
        self.now = 0

    def __call__(self) -> float:
        self.now += 1
        return float(self.now)


class Pool:
    """The token pool allocator an eviction frees into (``free_segment``, :569): the pool is
    pagesim's to count; the tree's values are its token ids (``insert`` without a value, :441-443)."""

    device = "cpu"

    def free_segment(self, values, start_pos: int = 0):
        pass


# -- one run ---------------------------------------------------------------------------------------
@dataclass
class Operation:
    """One radix call: its number, pagesim's clock, what it was (``kind``, the request for a match
    or an insert, its argument), both results, and whether both trees agreed after it."""

    index: int
    time_s: float
    kind: str
    request: int
    argument: int
    ours: object
    theirs: object
    same_tree: bool

    @property
    def identical(self) -> bool:
        return self.same_tree and self.ours == self.theirs

    def describe(self) -> str:
        who = f" request {self.request}" if self.request >= 0 else ""
        return (f"operation {self.index} at t={self.time_s:.3f}s: {self.kind}{who} ({self.argument}): "
                f"pagesim {self.ours}, SGLang {self.theirs}"
                + ("" if self.same_tree else ", the trees differ after it"))


@dataclass
class Run:
    workload: Workload
    operations: list = field(default_factory=list)
    first: tuple | None = None  # the first divergence: (operation, pagesim's tree, SGLang's)
    summary: dict = field(default_factory=dict)  # pagesim's run's (retractions: num_preemptions)
    path_only: int = 0  # operations whose trees were compared on the matched path alone (Twin.settle)

    @property
    def identical(self) -> int:
        return sum(op.identical for op in self.operations)

    @property
    def same_results(self) -> int:
        """The calls whose results agree, whatever the trees after them."""
        return sum(op.ours == op.theirs for op in self.operations)

    def divergence(self) -> str:
        if self.first is None:
            return ""
        op, ours, theirs = self.first
        before = [o.describe() for o in self.operations[max(op.index - 3, 0):op.index]]
        return "\n".join(["first divergence: " + op.describe(), "  the operations before it:",
                          *("    " + line for line in before), "  pagesim's tree after it:", ours.describe(theirs),
                          "  SGLang's:", theirs.describe(ours)])


def evicted(before: Tree, after: Tree) -> tuple:
    """The leaves an eviction freed: the nodes before it that are not after it (an eviction
    only removes leaves), each (depth, length)."""
    return tuple(sorted((depth, len(tokens) // 8) for depth, tokens in before.nodes.keys() - after.nodes.keys()))


class Raised(str):
    """SGLang's result where its call raised (after a divergence: ``Twin.theirs``)."""


class Rows:
    """``req_to_token_pool.req_to_token`` for ``_insert_cache``: request ``r``'s row holds its token
    ids (the values the tree keeps, as an insert without a value keeps them, :441-443)."""

    def __init__(self, tokens: Tokens):
        self.tokens = tokens

    def __getitem__(self, index):
        import torch  # SGLang's own dependency, loaded with its modules (load)

        r, columns = index
        return torch.tensor(self.tokens.of(r)[columns], dtype=torch.int64)


class Twin:
    """SGLang's cache beside pagesim's: each wrapped pagesim call is made on both, then compared.

    After each call both whole trees are compared, but for a match that made no node on either
    side (most calls: lpm matches the whole waiting queue at every prefill), whose trees were
    the same before it: there the nodes on the matched path are compared (depth, tokens, lock,
    last access), and pagesim's node array is checked to differ from before the call only in
    those nodes' last access. SGLang's side is its code: a match that makes no node (no
    ``_split_node``) changes the last access of the nodes on its path alone (radix_cache.py:651-675).
    """

    def __init__(self, workload: Workload, trace: pd.DataFrame, checkpoint: bool = False):
        self.checkpoint = checkpoint
        self.requests: dict = {}  # request -> what _insert_cache reads of it (checkpoint)
        self.clock = Counter()
        SGLANG.module.time = types.SimpleNamespace(monotonic=self.clock, perf_counter=time.perf_counter)
        self.pool = Pool()
        self.cache = SGLANG.RadixCache.create_simulated(mock_allocator=self.pool, page_size=workload.page_size)
        self.handles = {radix_cache.ROOT: self.cache.root_node}  # pagesim's node row -> SGLang's node
        self.tokens = Tokens(trace)
        self.cache.req_to_token_pool = types.SimpleNamespace(req_to_token=Rows(self.tokens))
        self.keys: dict = {}
        self.ours_stamps, self.theirs_stamps = Stamps(), Stamps()
        self.same = True  # the trees after the last call
        self.run = Run(workload)

    def key(self, r: int, n: int):
        return SGLANG.RadixKey(self.tokens.of(r)[:n])

    def before(self, s) -> tuple:
        """What a call's comparison needs from before it: pagesim's nodes and clock, SGLang's
        node count and clock."""
        used = s.count[RADIX_NODES_USED]
        return (s.radix_nodes[:used].copy(), int(s.count[RADIX_ACCESS_CLOCK]),
                int(s.count[RADIX_FREE_NODE]), SGLANG.module.TreeNode.counter, self.clock.now)

    def trees(self, s, before) -> tuple[Tree, Tree]:
        """Both whole trees, this call's stamps registered."""
        ours, theirs = pagesim_nodes(s, self.tokens, self.keys), sglang_nodes(self.cache)
        index = len(self.run.operations)
        self.ours_stamps.register(index, [node[3] for node in ours.values() if node[3] > before[1]])
        self.theirs_stamps.register(index, [node[3] for node in theirs.values() if node[3] > before[4]])
        self.ours_stamps.keep([node[3] for node in ours.values()])
        self.theirs_stamps.keep([node[3] for node in theirs.values()])
        c = s.count
        return (Tree(named(ours, self.ours_stamps), int(c[RADIX_EVICTABLE]),
                     int(c[RADIX_TREE_TOKENS] - c[RADIX_EVICTABLE])),
                Tree(named(theirs, self.theirs_stamps), self.cache.evictable_size(), self.cache.protected_size()))

    def only_stamped(self, s, before, path: list) -> bool:
        """pagesim made no node and changed nothing but its path's last access."""
        nodes, _, free, counter, _ = before
        c = s.count
        if (c[RADIX_NODES_USED] != len(nodes) or c[RADIX_FREE_NODE] != free
                or SGLANG.module.TreeNode.counter != counter):
            return False
        changed = s.radix_nodes[:len(nodes)] != nodes
        changed[path, NODE_LAST_ACCESS] = False
        return not changed.any()

    def settle(self, s, before, kind, request, argument, ours, theirs, ends=None, trees=None):
        """Record the call: its results and whether the trees agree after it (``ends``: a match's
        nodes, pagesim's row and SGLang's node, for the path-only comparison)."""
        index = len(self.run.operations)
        if (trees is None and ends is not None and self.same
                and self.only_stamped(s, before, pagesim_path(s, ends[0]))):
            path = pagesim_nodes(s, self.tokens, self.keys, pagesim_path(s, ends[0]))
            theirs_path = sglang_nodes(self.cache, ends[1])
            self.ours_stamps.register(index, [node[3] for node in path.values() if node[3] > before[1]])
            self.theirs_stamps.register(index, [node[3] for node in theirs_path.values() if node[3] > before[4]])
            c = s.count
            sizes = (int(c[RADIX_EVICTABLE]), int(c[RADIX_TREE_TOKENS] - c[RADIX_EVICTABLE]))
            same = (named(path, self.ours_stamps) == named(theirs_path, self.theirs_stamps)
                    and sizes == (self.cache.evictable_size(), self.cache.protected_size()))
            self.run.path_only += 1
            trees = None if same else self.trees(s, before)
        else:
            trees = trees or self.trees(s, before)
            same = trees[0] == trees[1]
        op = Operation(index, float(s.clock[state.NOW]), kind, request, argument, ours, theirs, same)
        self.run.operations.append(op)
        self.same = same
        if not op.identical and self.run.first is None:
            self.run.first = (op, *trees) if trees else (op, *self.trees(s, before))

    def theirs(self, call):
        """SGLang's side of a call. Once the trees have differed, pagesim's node handles may name
        nodes SGLang has evicted (a lock on one corrupts its tree, and its next eviction fails an
        assertion): the calls go on, one that raises counting as different."""
        try:
            return call()
        except Exception as error:
            if self.run.first is None:
                raise
            return Raised(f"{type(error).__name__}: {error}")

    # the wrapped pagesim calls: pagesim's result is returned to its caller as it is
    def match_prefix(self, original, s, r, limit):
        before = self.before(s)
        node, depth = original(s, r, limit)
        result = self.theirs(lambda: self.cache.match_prefix(SGLANG.MatchPrefixParams(key=self.key(r, int(limit)))))
        if isinstance(result, Raised):
            self.settle(s, before, "match", int(r), int(limit), int(depth), result)
            return node, depth
        self.handles[int(node)] = result.last_device_node
        self.settle(s, before, "match", int(r), int(limit), int(depth), int(result.device_prefix_len),
                    ends=(int(node), result.last_device_node))
        return node, depth

    def checkpointed(self, r: int, n: int):
        """``checkpoint``'s insert of request ``r``'s first ``n`` tokens (module docstring,
        Checkpoints): the tokens it held already, and the node the key ends at."""
        if r not in self.requests:
            self.requests[r] = types.SimpleNamespace(
                extra_key=None, cache_salt=None, priority=None,
                origin_input_ids=self.tokens.of(r)[:int(self.tokens.prompt[r])],
                kv=types.SimpleNamespace(req_pool_idx=r, cache_inserted_len=0, cache_protected_len=0))
        key, _, prefix = self.cache._insert_cache(self.requests[r], self.tokens.of(r)[:n], split_prompt=True)
        node, depth = self.cache.root_node, 0
        while depth < len(key):
            node = node.children[key.child_key_at(depth, self.cache.page_size)]
            depth += len(node.key)
        return types.SimpleNamespace(prefix_len=prefix, last_device_node=node)

    def insert(self, original, s, r, num_tokens):
        before = self.before(s)
        if self.checkpoint:  # it returns its insert's node; the tokens the tree held, read before it
            depth = radix_cache.cached_prefix(s, r, num_tokens)
            node = original(s, r, num_tokens)
            result = self.theirs(lambda: self.checkpointed(int(r), int(num_tokens)))
        else:
            node, depth = original(s, r, num_tokens)
            result = self.theirs(lambda: self.cache.insert(SGLANG.InsertParams(key=self.key(r, int(num_tokens)))))
        if not isinstance(result, Raised):
            self.handles[int(node)] = result.last_device_node
        self.settle(s, before, "insert", int(r), int(num_tokens), int(depth),
                    result if isinstance(result, Raised) else int(result.prefix_len))
        return node if self.checkpoint else (node, depth)

    def lock(self, original, kind, s, x):
        before = self.before(s)
        evictable = int(s.count[RADIX_EVICTABLE])
        original(s, x)
        result = self.theirs(lambda: getattr(self.cache, kind)(self.handles[int(x)]))
        self.settle(s, before, kind, -1, int(s.radix_nodes[x, NODE_END]),
                    int(s.count[RADIX_EVICTABLE]) - evictable,
                    result if isinstance(result, Raised) else int(result.delta))

    def evict(self, original, s, num_tokens):
        before = self.before(s)
        ours_before, theirs_before = self.trees(s, before)
        freed = original(s, num_tokens)
        result = self.theirs(lambda: self.cache.evict(SGLANG.EvictParams(num_tokens=int(num_tokens))))
        ours_after, theirs_after = self.trees(s, before)
        self.settle(s, before, "evict", -1, int(num_tokens), (int(freed), evicted(ours_before, ours_after)),
                    result if isinstance(result, Raised) else
                    (int(result.num_tokens_evicted), evicted(theirs_before, theirs_after)),
                    trees=(ours_after, theirs_after))
        return freed


WRAPPED = ("match_prefix", "insert", "checkpoint", "inc_lock_ref", "dec_lock_ref", "evict")


def run(workload: Workload, checkpoint: bool = False) -> Run:
    """pagesim's ``--system sglang`` over the workload, each radix call made on SGLang's cache too
    (``checkpoint``: its checkpoints as ``RadixCache.checkpoint`` makes them, module docstring)."""
    if jit.COMPILED:  # compiled, the core's functions call each other directly: nothing could be wrapped
        return run_interpreted(workload, checkpoint)
    load()
    trace = workload.make()
    originals = {name: getattr(radix_cache, name) for name in WRAPPED}
    with PEER.active():
        twin = Twin(workload, trace, checkpoint)
        wrapped = {
            "match_prefix": lambda s, r, limit: twin.match_prefix(originals["match_prefix"], s, r, limit),
            # a checkpoint is two inserts (replayed as they are), or with ``checkpoint`` one call,
            # replayed as SGLang's, its inserts inside it not replayed again
            "checkpoint" if checkpoint else "insert":
                lambda s, r, n: twin.insert(originals["checkpoint" if checkpoint else "insert"], s, r, n),
            "inc_lock_ref": lambda s, x: twin.lock(originals["inc_lock_ref"], "inc_lock_ref", s, x),
            "dec_lock_ref": lambda s, x: twin.lock(originals["dec_lock_ref"], "dec_lock_ref", s, x),
            "evict": lambda s, n: twin.evict(originals["evict"], s, n),
        }
        try:
            for name, function in wrapped.items():
                setattr(radix_cache, name, function)
            twin.run.summary = run_simulation(workload.config(), trace).summary
        finally:
            for name, function in originals.items():
                setattr(radix_cache, name, function)
    return twin.run


CHILD = """import pickle, sys
from tests.peers import sglang_radix
done = sglang_radix.run(sglang_radix.WORKLOADS[sys.argv[1]], sys.argv[2] == "checkpoint")
done.workload = None  # its trace's maker is a closure: the parent puts its own workload back
with open(sys.argv[3], "wb") as out:
    pickle.dump(done, out)
"""


def run_interpreted(workload: Workload, checkpoint: bool) -> Run:
    """``run`` made by a child Python with the interpreted core, for a process that loaded pagesim
    compiled (the whole test suite: other modules imported it before this one could set
    ``PAGESIM_JIT``). The child builds the workload by its name from ``WORKLOADS``."""
    if workload.name not in WORKLOADS or WORKLOADS[workload.name].description != workload.description:
        raise ValueError(f"{workload.name}: only WORKLOADS' own workloads run in a child (the core here is compiled)")
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "run.pickle"
        subprocess.run([sys.executable, "-c", CHILD, workload.name, "checkpoint" if checkpoint else "once",
                        str(result)], env={**os.environ, "PAGESIM_JIT": "0"}, check=True,
                       cwd=Path(__file__).resolve().parents[2])
        with result.open("rb") as handle:
            done = pickle.load(handle)
    done.workload = workload
    return done
