"""SGLang 0.5.23's hierarchical cache (HiCache: GPU tier L1, host tier L2, no storage) driven on
CPU through a worked example (``docs/notes/sglang-hicache.md``).

A probe, not a comparison (``sglang_hicache_side.py`` compares pagesim's host tier with this one,
call by call). In 0.5.23 there is
no ``HiRadixCache`` class any more: ``--enable-hierarchical-cache`` builds the same
``UnifiedRadixCache`` as without it and calls its ``init_hicache`` (``mem_cache/registry.py:
232-238``), which attaches a host pool group and a ``HybridCacheController`` and flags the tree
core (``unified_radix_cache.py:455-601``). This probe runs SGLang's own code for every decision:

* the radix cache ``UnifiedRadixCache`` with its Full component on the Python tree core
  (``unified_cache/unified_tree_core.py``): the match across tiers (``_match_prefix_helper``,
  ``components/full.py:123-145``: ``host_hit_length``), the write-through on insert
  (``_inc_hit_count_and_check``, ``write_through_threshold``), the device eviction that demotes a
  backed-up leaf and deletes an unbacked one (``evict_device_leaf``), the host eviction of host
  leaves (``drive_host_eviction``), ``init_load_back`` / ``load_back`` (``load_back_threshold``)
  and the write and load acknowledgements (``writing_check``, ``loading_check``);
* the device allocator ``TokenToKVPoolAllocator`` (page 1) and the host pool's slot allocator
  (``pool_host/base.py``: ``HostKVCache``'s sizing, ``alloc``, ``free``, compiled onto
  ``HostSlots``, which holds no KV);
* the request-level calls: the match (``mem_cache/common.py:240-261``), the load-back at
  admission (``schedule_policy.py:1465-1530``), the eviction before an allocation
  (``common.evict_from_tree_cache``) and a finished request's release
  (``common.release_kv_cache``).

What is not SGLang's: the transfer engine. ``Transfers`` stands for ``HybridCacheController``
(``hybrid_cache/hybrid_cache_controller.py``): its ``write`` allocates host slots and queues the
copy (``:555-582``), its ``load`` allocates device slots and queues the copy (``:1008-1068``),
``start_writing`` / ``start_loading`` submit them (``managers/cache_controller.py:885-920,
1028-1069``); here no byte moves and each submitted copy is complete at once (its ack's event is
already done), so the driver's ``events`` (the scheduler's per-step ``check_hicache_events``,
``unified_radix_cache.py:3651-3688``) acknowledges everything submitted. That is the only
timing this probe does not show: on a GPU the write is acknowledged a step or more later, and
until then the written node stays locked on the device.

Run: ``python -m tests.peers.compare --sglang-hicache`` (or ``python -m tests.peers.sglang_hicache``).
Needs torch and msgspec and SGLang fetched (``tests/peers/fetch.py``), like ``sglang_swa.py``.
"""

from __future__ import annotations

import threading
import types

from tests.peers import sglang_swa
from tests.peers.importing import members

VERSION = "0.5.23"
# the SWA probe's import of the unified radix cache (its REAL modules and STUBS, its request
# record): the same modules run here, with a full-attention pool alone
PEER = sglang_swa.PEER
SGLANG = types.SimpleNamespace()


class KVBuffers:
    """Stands for SGLang's ``MHATokenToKVPool`` (the device KV buffer): no tensors; the layer
    counter ``init_hicache`` registers on it is never waited on (no forward runs)."""

    layer_transfer_counter = None


class HostSlots:
    """SGLang's host KV pool (``MHATokenToKVPoolHost``) without its buffers: the slot allocator
    and the sizing of ``pool_host/base.py``'s ``HostKVCache`` (``__init__``, ``clear``,
    ``available_size``, ``alloc``, ``free``; set by ``load``)."""

    dcp_size = 1
    dcp_rank = 0
    shared_allocation_domain = None
    stores_page_envelope = False

    def _allocate_host_buffer(self):
        pass  # no KV bytes on this host: only the slots


class Entry:
    """The host pool group's anchor entry (``pool_host/group.py``'s ``PoolEntry``): the KV pool,
    no shared allocation domain, no eviction callback."""

    def __init__(self, host_pool):
        self.host_pool, self.host_evict_fn = host_pool, None


class HostGroup:
    """Stands for ``HostPoolGroup`` (``pool_host/group.py``) with its KV pool alone: what the
    cache asks of it (``available_size``, ``free``, ``anchor_entry``, ``get_pool``)."""

    def __init__(self, host_pool):
        self.host_pool = host_pool
        self.anchor_entry = Entry(host_pool)
        self.entry_map = {}

    def available_size(self):
        return self.host_pool.available_size()

    def free(self, indices, pool=None):
        return self.host_pool.free(indices)

    def get_pool(self, name):
        return None  # no SWA or Mamba host pool


class Done:
    """A copy's completion event, already recorded (the copy is synchronous here)."""

    def synchronize(self):
        pass

    def query(self):
        return True


class Ack:
    """``HiCacheAck`` (``managers/cache_controller.py:188``): the nodes a merged copy carried."""

    def __init__(self, node_ids, tokens):
        self.node_ids, self.num_tokens = node_ids, tokens
        self.start_event = self.finish_event = Done()
        self.timing_enabled, self.num_tokens_by_pool, self.num_bytes = False, {}, 0


class Transfers:
    """Stands for ``HybridCacheController``: its queues, its allocations, its acks; no byte moves.
    Counts the tokens written and loaded (SGLang's ``hicache_backup_tokens_total`` and
    ``load_back_tokens_total``, ``observability/metrics_collector.py:2552-2600``)."""

    write_policy = "write_through"
    enable_storage = False
    pp_prefetch_command_group = None  # no pipeline parallelism

    def __init__(self, device_allocator, host_group):
        self.device_allocator, self.mem_pool_host = device_allocator, host_group
        self.write_queue, self.load_queue = [], []
        self.ack_write_queue, self.ack_load_queue = [], []
        self.written = self.loaded = 0

    def write(self, device_indices, priority=None, node_id=-1, extra_pools=None, flush=True,
              start_owner=None):
        assert not extra_pools
        host_indices = self.mem_pool_host.host_pool.alloc(len(device_indices))
        if host_indices is None:
            return None
        self.write_queue.append((node_id, len(device_indices)))
        if flush:
            self.start_writing()
        return host_indices

    def start_writing(self):
        if self.write_queue:  # merged into one copy, one ack (cache_controller.py:164-183)
            tokens = sum(n for _, n in self.write_queue)
            self.ack_write_queue.append(Ack([node for node, _ in self.write_queue], tokens))
            self.written += tokens
            self.write_queue = []

    def load(self, host_indices, priority=None, node_id=-1, extra_pools=None, *,
             device_indices=None, anchor_indices=None):
        assert not extra_pools and device_indices is None
        device_indices = self.device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        self.load_queue.append((node_id, len(host_indices)))
        return device_indices

    def start_loading(self):
        if not self.load_queue:
            return -1
        tokens = sum(n for _, n in self.load_queue)
        self.ack_load_queue.append(Ack([node for node, _ in self.load_queue], tokens))
        self.loaded += tokens
        self.load_queue = []
        return 0

    def reset(self):
        pass


def load():
    """Import SGLang's unified radix cache and compile the host pool's allocator."""
    if hasattr(SGLANG, "UnifiedRadixCache"):
        return
    import torch

    sglang_swa.load()  # the modules, and the request record with SGLang's ReqKvInfo
    for name, method in members(PEER, "sglang.srt.mem_cache.pool_host.base", "HostKVCache",
                                ("__init__", "clear", "available_size", "_merge_release_slots",
                                 "logical_size", "logical_page_size", "alloc", "free"),
                                {"torch": torch, "threading": threading, "Optional": None,
                                 "get_allocator_from_storage": lambda kind: None,
                                 "sync_fixed_hicache_size": lambda size, host_size: size,
                                 "logger": None}).items():
        setattr(HostSlots, name, method)
    with PEER.active():
        import importlib

        SGLANG.urc = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache")
        SGLANG.token = importlib.import_module("sglang.srt.mem_cache.allocator.token")
        SGLANG.base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
        SGLANG.params = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
        SGLANG.radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        SGLANG.common = importlib.import_module("sglang.srt.mem_cache.common")
        SGLANG.ct = importlib.import_module("sglang.srt.mem_cache.unified_cache.component_type")
    SGLANG.UnifiedRadixCache = SGLANG.urc.UnifiedRadixCache


# -- the probe ----------------------------------------------------------------------------------
spans = sglang_swa.spans


class Probe:
    """SGLang's radix cache over a device pool of ``device`` slots (page 1) and a host pool sized
    by ``ratio`` (``--hicache-ratio``), ``write_through`` policy unless ``policy`` says otherwise,
    driven request by request; ``say`` prints a line (at most 100 columns)."""

    def __init__(self, device: int, ratio: float = 2.0, *, policy: str = "write_through",
                 say=print):
        import torch

        load()
        self.device, self.say, self.running = device, say, []
        self.rows = sglang_swa.RequestRows(8, 256)
        full = SGLANG.ct.ComponentType.FULL
        with PEER.active():
            self.allocator = SGLANG.token.TokenToKVPoolAllocator(
                device, dtype=torch.bfloat16, device="cpu", kvcache=KVBuffers(), need_sort=False)
            params = SGLANG.params.CacheInitParams(
                disable=False, req_to_token_pool=self.rows, token_to_kv_pool_allocator=self.allocator,
                page_size=1, chunked_prefill_size=64, tree_components=(full,),
                tree_core_backend="python")
            self.cache = SGLANG.UnifiedRadixCache(params)
            self.host = HostSlots.__new__(HostSlots)
            HostSlots.__init__(  # pool_host/base.py:175-231, as build_kv_host_pool passes it
                self.host, dtype=torch.bfloat16, device_capacity_tokens=device, size_per_token=1,
                start_layer=0, end_layer=0, host_to_device_ratio=ratio, host_size=0, page_size=1,
                layout="page_first", pin_memory=False, device="cpu", is_dummy=True)
            self.attach(policy)

    def attach(self, policy: str):
        """What ``init_hicache`` leaves on the cache for a full-attention model
        (``unified_radix_cache.py:455-576``, ``hybrid_pool_assembler.py:2296-2324, 2488-2505``),
        with ``Transfers`` for the controller."""
        cache = self.cache
        group = HostGroup(self.host)
        cache.host_pool_group = group
        cache.cache_controller = Transfers(self.allocator, group)
        cache.cache_controller.write_policy = policy
        cache.full_kv_pool_host = self.host
        cache.components[SGLANG.ct.ComponentType.FULL]._full_kv_pool_host = self.host
        cache.load_cache_event = threading.Event()
        cache.tree_core.set_hicache_enabled()
        cache.write_through_threshold = 1 if policy == "write_through" else 2  # :558-560
        cache.is_write_back = policy == "write_back"  # :561-564
        cache.tree_core.is_write_back = cache.is_write_back
        cache.load_back_threshold = 10  # :576

    # what is printed
    def pools(self) -> str:
        c = self.cache
        return (f"device free {self.allocator.available_size():2d}/{self.device}"
                f"  host free {self.host.available_size():2d}/{self.host.size}"
                f"  evictable {c.evictable_size():2d}  protected {c.protected_size():2d}"
                f"  written {c.cache_controller.written}  loaded {c.cache_controller.loaded}")

    def show(self, what: str):
        self.say(what)
        self.say(f"    pools: {self.pools()}")
        for line in self.tree_lines():
            self.say(f"    {line}")

    def tree_lines(self) -> list[str]:
        full = SGLANG.ct.ComponentType.FULL
        lines = []

        def walk(node, start, depth):
            for child in node.children.values():
                end = start + len(child.key)
                data = child.component_data[full]
                where = {(True, True): "GPU+host", (True, False): "GPU only",
                         (False, True): "host only", (False, False): "gone"}[
                    data.value is not None, data.host_value is not None]
                ids = child.key.token_ids
                head = f"{'  ' * depth}[{start},{end}) ids {ids[0]}..{ids[-1]}: {where}"
                tail = f"lock {data.lock_ref} hits {child.hit_count}"
                if child.write_through_pending_id is not None:
                    tail += " writing"
                slots = []
                if data.value is not None:
                    slots.append(f"gpu {spans(data.value)}")
                if data.host_value is not None:
                    slots.append(f"host {spans(data.host_value)}")
                line = f"{head}, {', '.join(slots + [tail])}"
                if len(line) > 96:  # printed lines fit 100 columns
                    lines.extend([f"{head}, {tail}"] + [f"{'  ' * depth}  {s}" for s in slots])
                else:
                    lines.append(line)
                walk(child, end, depth + 1)
        walk(self.cache.tree_core.root_node, 0, 0)
        return lines or ["(empty tree)"]

    # the scheduler's calls
    def events(self):
        """The scheduler's per-step poll (``check_hicache_events``, ``unified_radix_cache.py:
        3651-3688``): submit the queued writes (``flush_pending_backups``), then acknowledge the
        finished writes and loads (``writing_check``, ``loading_check``); every submitted copy
        is finished here."""
        with PEER.active():
            controller = self.cache.cache_controller
            controller.start_writing()
            self.cache.writing_check(finish_count=len(controller.ack_write_queue))
            self.cache.loading_check(finish_count=len(controller.ack_load_queue))
            self.show("check_hicache_events: writes and loads acknowledged")

    def admit(self, req, max_new: int):
        """The match (``common.py:232-261``), then, with a host hit, the load-back at admission
        (``schedule_policy.py:1465-1530``: ``init_load_back``, its H2D queued) and the lock; the
        batch's ``ready_to_load_host_cache`` submits the load (``scheduler.py:4350-4355``)."""
        with PEER.active():
            key = SGLANG.radix.RadixKey(req.origin_input_ids, None, limit=len(req.origin_input_ids) - 1)
            match = self.cache.match_prefix(SGLANG.base.MatchPrefixParams(key=key, req=req))
            req.prefix_len, req.last_node = match.device_prefix_len, match.last_device_node
            req.best_match_node, req.host_hit_length = match.best_match_node, match.host_hit_length
            req.kv.cache_protected_len = req.prefix_len
            line = (f"{req.rid} matched: GPU {req.prefix_len}, host {req.host_hit_length}"
                    f" of {len(req.origin_input_ids)}")
            if req.host_hit_length > 0:
                loaded, req.last_node = self.cache.init_load_back(SGLANG.base.InitLoadBackParams(
                    best_match_node=req.best_match_node, host_hit_length=req.host_hit_length,
                    req=req))
                req.prefix_len += loaded
                req.kv.cache_protected_len = req.prefix_len
                consumer = self.cache.ready_to_load_host_cache()
                line += f"; init_load_back loaded {loaded} (load submitted: {consumer >= 0})"
            req.lock = self.cache.lock(req.last_node)
            self.running.append(req)
            self.show(line)

    def prefill(self, req):
        """The prompt's uncached tokens at once: the row, the prefix's slots, the eviction and
        allocation (``allocation.py:152-159``)."""
        with PEER.active():
            self.rows.alloc([req])
            start = req.prefix_len
            if start:
                self.rows.req_to_token[req.kv.req_pool_idx, :start] = self.cache.prefix_device_indices(req)
            tokens = len(req.origin_input_ids) - start
            SGLANG.common.evict_from_tree_cache(self.cache, tokens)
            slots = self.allocator.alloc(tokens)
            assert slots is not None, f"{req.rid}: no {tokens} slots"
            self.rows.req_to_token[req.kv.req_pool_idx, start:start + tokens] = slots
            req.kv.kv_allocated_len = req.kv.kv_committed_len = start + tokens
            req.extend_end = start + tokens
            self.show(f"{req.rid} prefilled tokens [{start},{start + tokens})")

    def decode(self, req):
        """A decode step: the slot of the token sampled last (``allocation.py:625-640``)."""
        with PEER.active():
            req.output_ids.append(req.outputs[len(req.output_ids)])
            seqlen = len(req.origin_input_ids) + len(req.output_ids)
            SGLANG.common.evict_from_tree_cache(self.cache, 1)
            slot = self.allocator.alloc(1)
            assert slot is not None, f"{req.rid}: no slot"
            self.rows.req_to_token[req.kv.req_pool_idx, seqlen - 1] = slot
            req.kv.kv_allocated_len = req.kv.kv_committed_len = seqlen

    def finish(self, req):
        """The finished request's release (``common.py:400-444``): its tokens inserted (a new
        leaf written through to the host), its own slots freed, the lock dropped."""
        with PEER.active():
            req.finished_reason = "length"
            SGLANG.common.release_kv_cache(req, self.cache, checkpoint=True)
            self.running.remove(req)
            self.show(f"{req.rid} finished")

    def evict(self, tokens: int):
        with PEER.active():
            result = self.cache.evict(SGLANG.base.EvictParams(num_tokens=tokens))
            self.show(f"evict({tokens}): freed {result.num_tokens_evicted} device slots")


def request(rid: str, prompt: list[int], outputs: list[int]):
    req = sglang_swa.Request(rid, prompt, outputs)
    req.best_match_node, req.host_hit_length = None, 0
    return req


PREFIX = list(range(1, 13))  # the shared 12-token prefix


def worked_example(say=print, *, device: int = 24, ratio: float = 2.0,
                   policy: str = "write_through"):
    """The note's example: page 1, 24 device slots, host ratio 2 (the default), write-through;
    A and B share a 12-token prefix, D in between pushes A's tokens off the GPU; C shares 8
    tokens with D (a host hit under the load-back threshold); E fills the host pool."""
    probe = Probe(device, ratio, policy=policy, say=say)
    say(f"page 1, device {device} slots, --hicache-ratio {ratio}: host {probe.host.size} slots,"
        f" {policy}")
    say(f"pools: {probe.pools()}")
    a = request("A", PREFIX + [101, 102, 103, 104], [201, 202])
    probe.admit(a, max_new=2)
    probe.prefill(a)
    probe.decode(a)
    probe.finish(a)
    probe.events()
    d = request("D", list(range(301, 317)), [401])
    probe.admit(d, max_new=1)
    probe.prefill(d)
    probe.finish(d)
    probe.events()
    b = request("B", PREFIX + [111, 112, 113, 114], [211])
    probe.admit(b, max_new=1)
    probe.prefill(b)
    probe.events()
    probe.finish(b)
    probe.events()
    c = request("C", list(range(301, 309)) + [501, 502, 503, 504], [601])
    probe.admit(c, max_new=1)
    probe.prefill(c)
    probe.finish(c)
    probe.events()
    e = request("E", list(range(701, 721)), [801])
    probe.admit(e, max_new=1)
    probe.prefill(e)
    probe.finish(e)
    probe.events()
    return probe


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", type=int, default=24, help="device pool slots")
    parser.add_argument("--ratio", type=float, default=2.0, help="--hicache-ratio")
    parser.add_argument("--policy", default="write_through",
                        choices=("write_through", "write_through_selective", "write_back"),
                        help="--hicache-write-policy")
    args = parser.parse_args(argv)
    worked_example(device=args.device, ratio=args.ratio, policy=args.policy)


if __name__ == "__main__":
    main()
