"""SGLang 0.5.23's hybrid sliding-window KV pool and its radix cache, driven on CPU through a
worked example (``docs/notes/sglang-swa.md``).

A probe, not a comparison: pagesim's ``--system sglang`` has no SWA pool yet. It runs SGLang's
own code for a model with full and sliding-window layers (gpt-oss's kind: SGLang keeps Gemma-2
and Gemma-3 off this pool, ``arg_groups/model_overrides/gemma2_gemma3.py:13-26``) and prints,
after each call, each pool's free slots, each request's row and the tree, so that the rules the
note states can be read off SGLang's behaviour:

* the allocator ``SWATokenToKVPoolAllocator`` (``mem_cache/allocator/swa.py``: a full pool and an
  SWA pool of its own size, a full -> SWA index mapping), over a KV buffer that holds no KV
  (``KVBuffers``: SGLang's ``SWAKVPool.register_mapping`` and ``translate_loc_from_full_to_swa``
  compiled onto it from ``mem_cache/swa_memory_pool.py``);
* the radix cache SGLang's server builds for it, ``UnifiedRadixCache`` with its Full and SWA
  components (``mem_cache/registry.py:146, 165-167``), on its Python tree core
  (``unified_cache/tree_core_registry.py``: the Rust one is the default where it is built; the
  Python one is its fallback, and the one run here);
* the request-level calls the scheduler makes, each SGLang's own function: the prefix match and
  lock (``schedule_policy.py:1690``), the eviction before an allocation
  (``allocation.py:152-159``: ``evict_from_tree_cache``, then ``alloc``), the admission budget
  (``mem_cache/prefill_budget.py``: ``SWAPrefillBudget``), a chunk's checkpoint
  (``common.py:271-281``), a decode step's window eviction (``schedule_batch.py:4068-4129``:
  ``evict_sliding_windows``, at ``SGLANG_SWA_EVICTION_INTERVAL``) and a finished request's
  release (``common.py:400-444``: ``release_kv_cache``, its insert, frees and unlock).

The request record is the driver's (``Request``) with SGLang's ``ReqKvInfo`` compiled from
``managers/schedule_batch.py`` and the ``Req`` methods those calls read (``owned_kv_len``,
``finished``, ``get_fill_ids``, ``refresh_fill_ids``). Every other SGLang module the real ones
import is a stub (``STUBS``): kernels, host and storage tiers, metrics, KV events, the
multi-rank checks' transport. The server settings they read are ``SETTINGS``, SGLang's defaults;
reading one not there raises.

Run: ``python -m tests.peers.compare --sglang-swa`` (or ``python -m tests.peers.sglang_swa``).
Needs torch and msgspec (``pip install msgspec``) and SGLang fetched (``tests/peers/fetch.py``).
"""

from __future__ import annotations

import array as array_module
import ast
import dataclasses
import importlib
import types
from typing import Optional

from tests.peers import fetch
from tests.peers.importing import Peer, members, placeholders

VERSION = "0.5.23"

# SGLang's modules executed as they are
REAL = (
    "sglang.srt.environ", "sglang.srt.utils.invariants", "sglang.srt.utils.rank_consensus_checker",
    "sglang.srt.mem_cache.unified_radix_cache", "sglang.srt.mem_cache.unified_cache.unified_tree_core",
    "sglang.srt.mem_cache.unified_cache.components", "sglang.srt.mem_cache.unified_cache.components.base",
    "sglang.srt.mem_cache.unified_cache.components.full", "sglang.srt.mem_cache.unified_cache.components.swa",
    "sglang.srt.mem_cache.unified_cache.cache_action", "sglang.srt.mem_cache.unified_cache.component_type",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core_interface",
    "sglang.srt.mem_cache.unified_cache.tree_core_registry",
    "sglang.srt.mem_cache.unified_cache.session_ref_tracker", "sglang.srt.session.streaming_session",
    "sglang.srt.mem_cache.buffer_mode.storage_existence_cache", "sglang.srt.mem_cache.hicache_storage",
    "sglang.srt.mem_cache.base_prefix_cache", "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.evict_policy", "sglang.srt.mem_cache.utils", "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.events", "sglang.srt.mem_cache.common", "sglang.srt.mem_cache.prefill_budget",
    "sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.allocator.base",
    "sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.allocator.token",
    "sglang.srt.mem_cache.allocator.swa", "sglang.srt.mem_cache.allocator.page_interleave",
    "sglang.srt.mem_cache.storage_prefetch",
)


class KVBuffers:
    """Stands for SGLang's ``SWAKVPool`` (the ``BaseSWAKVPool`` the allocator asserts): no KV
    tensors, only the full -> SWA mapping the allocator registers on it, with SGLang's own
    ``register_mapping`` and ``translate_loc_from_full_to_swa`` (set by ``load``)."""

    swa_req_ring_size = None  # base_swa_memory_pool.py: a paged SWA pool, not a per-request ring
    request_window = None
    swa_uses_full_indices = False
    full_kv_pool = None  # the allocator passes these to its sub-allocators, which keep them only
    swa_kv_pool = None
    full_to_swa_index_mapping = None


def _not_npu():
    """``utils.is_npu`` and ``is_hip``: a CPU host is neither an Ascend NPU nor an AMD GPU
    (SGLang checks the platform)."""
    return False


# module -> {name: value, or None for a Placeholder}: what the real modules import
STUBS = {
    "sglang.srt.utils": {"is_npu": _not_npu, "is_hip": _not_npu, **placeholders(
        "get_bool_env_var", "get_num_new_pages", "next_power_of_2")},
    "sglang.srt.utils.common": {"is_npu": _not_npu, **placeholders(
        "async_h2d", "ceil_align", "get_num_new_pages")},
    "sglang.srt.utils.poll_timer": placeholders("PollTimer"),
    "sglang.srt.platforms": placeholders("current_platform"),
    "sglang.srt.debug_utils.cuda_coredump": {},
    "sglang.srt.distributed.communication_tags": placeholders("P2PTag"),
    "sglang.srt.hardware_backend.npu.allocator_npu": placeholders("NPUPagedTokenToKVPoolAllocator"),
    "sglang.srt.managers.cache_controller": placeholders("CacheOperation"),
    "sglang.srt.managers.schedule_batch": placeholders("FINISH_ABORT"),  # ReqKvInfo: load()
    "sglang.srt.mem_cache.base_swa_memory_pool": {"BaseSWAKVPool": KVBuffers},
    "sglang.srt.mem_cache.swa_memory_pool": placeholders("SWAKVPool"),
    "sglang.srt.mem_cache.memory_pool": placeholders("MHATokenToKVPool", "ReqToTokenPool"),
    "sglang.srt.mem_cache.buffer_mode.pipeline": placeholders("BufferModePipeline", "validate_buffer_only_stack"),
    "sglang.srt.mem_cache.cpp_utils.native_hash": placeholders("get_native_hash"),
    "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller": placeholders(
        "HybridCacheController", "PPPrefetchDecision", "PrefetchOperation"),
    "sglang.srt.mem_cache.allocator.hisparse": placeholders("DeepSeekV4HiSparseTokenToKVPoolAllocator"),
    "sglang.srt.mem_cache.unified_cache.components.mamba": placeholders("MambaComponent"),
    "sglang.srt.mem_cache.unified_cache.storage_attachment": placeholders("StorageAttachment"),
    "sglang.srt.mem_cache.unified_cache.unified_cache_linker": placeholders(
        "UnifiedCacheLinker", "UnifiedCacheLinkerWrapper"),
    "sglang.srt.observability.metrics_collector": placeholders(
        "RadixCacheMetricsCollector", "STAT_LOGGER_ROLE_RADIX_CACHE", "StorageMetrics",
        "StorageMetricsCollector", "radix_cache_metric_labels", "resolve_collector_class"),
    "sglang.srt.disaggregation.kv_events": placeholders(
        "AllBlocksCleared", "BlockRemoved", "BlockStored", "StorageMedium", "kv_event_namespace_seed",
        "namespaced_block_hash"),
    "sglang.kernels.ops.kvcache.mla_buffer": placeholders(
        "get_mla_kv_buffer_kernel", "get_mla_kv_buffer_triton", "set_mla_kv_buffer_dcp_sharded_triton",
        "set_mla_kv_buffer_fp8_quant_kernel", "set_mla_kv_buffer_kernel", "set_mla_kv_buffer_triton",
        "set_mla_kv_buffer_triton_fp8_quant", "set_mla_kv_scale_buffer_kernel", "set_mla_kv_scale_buffer_triton"),
    "sglang.kernels.ops.memory.allocator": placeholders(
        "alloc_decode_kernel", "alloc_extend_kernel", "get_and_clear_swa_pages"),
    "sglang.kernels.ops.memory.common": placeholders("_get_last_loc_safe_kernel", "get_last_loc_kernel"),
    "sglang.srt.runtime_context": placeholders(
        "get_disagg", "get_memory", "get_model", "get_observability", "get_parallel", "get_serving", "get_spec"),
}

PEER = Peer(VERSION, REAL, STUBS, "tests/peers/sglang_swa.py", package="sglang",
            folder=fetch.source_folder(VERSION, "sglang"), name=f"SGLang {VERSION}")
SGLANG = types.SimpleNamespace()  # its modules' names the driver uses, once loaded


def peer_class(module: str, class_name: str, namespace: dict):
    """Class ``class_name`` of SGLang's ``module``, compiled from its source alone (decorators
    and all) over ``namespace``: for ``ReqKvInfo``, whose module (``schedule_batch.py``) imports
    the whole scheduler."""
    path = PEER.folder.joinpath(*module.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text(), str(path))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    scope = dict(namespace)
    exec(compile(ast.Module([node], []), str(path), "exec",  # noqa: S102 - SGLang's own source, fetched
                 flags=__import__("__future__").annotations.compiler_flag), scope)
    return scope[class_name]


def load():
    """Import SGLang's SWA allocator and unified radix cache (raises where they do not import)."""
    if hasattr(SGLANG, "UnifiedRadixCache"):
        return
    import torch

    with PEER.active():
        component_type = importlib.import_module("sglang.srt.mem_cache.unified_cache.component_type")
    ceil_div = peer_function("sglang.srt.utils.common", "ceil_div", {})
    ceil_align = peer_function("sglang.srt.utils.common", "ceil_align", {"ceil_div": ceil_div})
    record = peer_class("sglang.srt.managers.schedule_batch", "ReqKvInfo", {
        "dataclasses": dataclasses, "Optional": Optional, "torch": torch,
        "ComponentType": component_type.ComponentType, "ceil_align": ceil_align})
    PEER.stubs["sglang.srt.managers.schedule_batch"]["ReqKvInfo"] = record
    PEER.stubs["sglang.srt.utils.common"]["ceil_align"] = ceil_align
    PEER.stubs["sglang.srt.runtime_context"].update(
        {name: (lambda settings=settings: settings) for name, settings in SETTINGS.items()})
    for name, method in members(PEER, "sglang.srt.mem_cache.swa_memory_pool", "SWAKVPool",
                                ("register_mapping", "translate_loc_from_full_to_swa"), {}).items():
        setattr(KVBuffers, name, method)
    for name, method in members(PEER, "sglang.srt.mem_cache.memory_pool", "ReqToTokenPool",
                                ("write", "available_size", "alloc", "alloc_rows", "free_rows", "free"),
                                {}).items():
        setattr(RequestRows, name, method)
    for name, method in members(PEER, "sglang.srt.managers.schedule_batch", "Req",
                                ("owned_kv_len", "finished", "get_fill_ids", "refresh_fill_ids"),
                                {"get_serving": lambda: SETTINGS["get_serving"]}).items():
        setattr(Request, name, method)
    with PEER.active():
        SGLANG.urc = importlib.import_module("sglang.srt.mem_cache.unified_radix_cache")
        SGLANG.swa = importlib.import_module("sglang.srt.mem_cache.allocator.swa")
        SGLANG.base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
        SGLANG.params = importlib.import_module("sglang.srt.mem_cache.cache_init_params")
        SGLANG.radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        SGLANG.common = importlib.import_module("sglang.srt.mem_cache.common")
        SGLANG.components = importlib.import_module("sglang.srt.mem_cache.unified_cache.components")
    SGLANG.ComponentType = component_type.ComponentType
    SGLANG.ReqKvInfo = record
    SGLANG.UnifiedRadixCache = SGLANG.urc.UnifiedRadixCache


def peer_function(module: str, name: str, namespace: dict):
    from tests.peers.importing import functions

    return functions(PEER, module, (name,), namespace)[name]



# -- the server settings SGLang's code reads here: its defaults ---------------------------------
class Settings:
    """One of SGLang's runtime-context groups (``runtime_context.get_serving()``, ...) with the
    defaults of the settings the driven code reads; any other raises, naming it."""

    def __init__(self, group: str, **values):
        self._group, self._values = group, values

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._values:
            raise AttributeError(f"the driver gives no {self._group}.{name} (tests/peers/sglang_swa.py SETTINGS)")
        return self._values[name]


SETTINGS = {
    # arg_groups/fields: strip_thinking_cache False, no speculative algorithm, no disaggregation,
    # no LMCache/FlexKV/linker, no hierarchical cache
    "get_serving": Settings("serving", strip_thinking_cache=False),
    "get_spec": Settings("spec", speculative_algorithm=None),
    "get_disagg": Settings("disagg", disaggregation_mode="null", disaggregation_decode_retraction_backup=None),
    "get_memory": Settings("memory", enable_hierarchical_cache=False, enable_lmcache=False,
                           enable_unified_cache_external_linker=False, enable_hisparse=False,
                           enable_unified_memory=False),
}


# -- the driver's records -----------------------------------------------------------------------
class RequestRows:
    """Stands for SGLang's ``ReqToTokenPool`` (``mem_cache/memory_pool.py``): the same fields,
    its own methods (set by ``load``); no memory saver on CPU."""

    _on_alloc_rows = None
    pre_alloc_size = 0

    def __init__(self, size: int, max_context_len: int):
        import torch

        self.size, self._alloc_size, self.max_context_len, self.device = size, size + 1, max_context_len, "cpu"
        self.req_to_token = torch.zeros((self._alloc_size, max_context_len), dtype=torch.int32)
        self.free_slots = list(range(1, self._alloc_size))
        self.req_generation = torch.zeros(self._alloc_size, dtype=torch.int64)
        self._aux_cache = None


class Request:
    """A request's fields the driven calls read, as ``Req.__init__`` sets them
    (``managers/schedule_batch.py``), with its record ``kv`` (SGLang's ``ReqKvInfo``) and its
    methods ``owned_kv_len``, ``finished``, ``get_fill_ids``, ``refresh_fill_ids`` (set by
    ``load``)."""

    def __init__(self, rid: str, prompt: list[int], outputs: list[int]):
        self.rid = rid
        self.origin_input_ids = array_module.array("q", prompt)
        self.output_ids = array_module.array("q")
        self.full_untruncated_fill_ids = array_module.array("q", prompt)
        self.outputs = outputs  # the tokens it will sample, in order (the driver's)
        self.kv = SGLANG.ReqKvInfo()
        self.prefix_len = self.extend_end = 0
        self.lock = self.last_node = None
        self.swa_branching_seqlen = None
        self.session = self.session_id = self.extra_key = self.cache_salt = self.priority = None
        self.kv_rotation_base = None
        self.finished_reason = self.finished_len = None
        self.reasoning_tokens = 0
        self.skip_radix_cache_insert = False
        self.output_ids_through_stop = self.output_ids

# -- the probe ----------------------------------------------------------------------------------
def spans(slots) -> str:
    """Pool slots as runs: ``3-9 12``."""
    out, run = [], []
    for slot in [int(x) for x in slots]:
        if run and slot == run[-1] + 1:
            run.append(slot)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
        run = [slot]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
    return " ".join(out) or "-"


class Probe:
    """SGLang's allocator and unified radix cache for one pool split (``full``, ``swa`` slots,
    ``window``, page 1), driven request by request; ``say`` prints a line (at most 100
    columns)."""

    def __init__(self, full: int, swa: int, window: int, *, radix: bool = True, chunk: int = 16,
                 interval: int = 128, say=print):
        import torch

        load()
        self.full, self.swa, self.window, self.radix, self.chunk = full, swa, window, radix, chunk
        self.interval, self.say, self.running = interval, say, []
        self.rows = RequestRows(8, 256)
        FULL, SWA = SGLANG.ComponentType.FULL, SGLANG.ComponentType.SWA
        with PEER.active():
            self.allocator = SGLANG.swa.SWATokenToKVPoolAllocator(
                full, swa, page_size=1, dtype=torch.bfloat16, device="cpu", kvcache=KVBuffers(),
                need_sort=False, req_to_token_pool=self.rows)
            params = SGLANG.params.CacheInitParams(
                disable=not radix, req_to_token_pool=self.rows, token_to_kv_pool_allocator=self.allocator,
                page_size=1, chunked_prefill_size=chunk, sliding_window_size=window,
                tree_components=(FULL, SWA), tree_core_backend="python")
            self.cache = SGLANG.UnifiedRadixCache(params)

    # what is printed
    def pools(self) -> str:
        a, c = self.allocator, self.cache
        text = (f"full free {a.full_available_size():2d}/{self.full}  "
                f"swa free {a.swa_available_size():2d}/{self.swa}")
        if self.radix:
            text += f"  evictable full {c.full_evictable_size():2d} swa {c.swa_evictable_size():2d}"
        return text

    def show(self, what: str):
        self.say(f"{what}")
        self.say(f"    pools: {self.pools()}")
        for req in self.running:
            kv = req.kv
            row = self.rows.req_to_token[kv.req_pool_idx, :kv.kv_allocated_len]
            swa_cursor = kv.get_evicted_seqlen(SGLANG.ComponentType.SWA)
            mapping = self.allocator.full_to_swa_index_mapping
            live = [int(mapping[x]) for x in row[kv.cache_protected_len:]]
            self.say(f"    {req.rid}: row of {kv.kv_allocated_len}, the tree's [0,{kv.cache_protected_len}),"
                     f" SWA cursor {swa_cursor}, its own SWA slots {sum(1 for x in live if x > 0)}")
        if self.radix:
            for line in self.tree_lines():
                self.say(f"    {line}")

    def tree_lines(self) -> list[str]:
        FULL, SWA = SGLANG.ComponentType.FULL, SGLANG.ComponentType.SWA
        lines = []

        def walk(node, start, depth):
            for child in node.children.values():
                end = start + len(child.key)
                full, swa = child.component_data[FULL], child.component_data[SWA]
                f = "evicted" if full.value is None else f"slots {spans(full.value)}"
                w = "tombstone" if swa.value is None else f"slots {spans(swa.value)}"
                ids = child.key.token_ids
                lines.append(f"{'  ' * depth}[{start},{end}) ids {ids[0]}..{ids[-1]}: full {f}"
                             f" lock {full.lock_ref}; swa {w} lock {swa.lock_ref}")
                walk(child, end, depth + 1)
        walk(self.cache.tree_core.root_node, 0, 0)
        return lines or ["(empty tree)"]

    # the scheduler's calls
    def admit(self, req: Request, max_new: int):
        """The waiting request's prefix match (``schedule_batch.py:1734``), the admission check
        (``schedule_policy.py:1412-1440``: ``SWAPrefillBudget.check_prefill``) and the lock
        (``schedule_policy.py:1690``)."""
        with PEER.active():
            key = SGLANG.radix.RadixKey(req.origin_input_ids, None, limit=len(req.origin_input_ids) - 1)
            match = self.cache.match_prefix(SGLANG.base.MatchPrefixParams(key=key, req=req))
            req.prefix_len, req.last_node = match.device_prefix_len, match.last_device_node
            req.swa_branching_seqlen = match.swa_branching_seqlen
            req.kv.cache_protected_len = req.prefix_len
            extend = len(req.origin_input_ids) - req.prefix_len
            budget = self.allocator.create_prefill_budget(self.cache)
            with_lock = self.cache.lock(req.last_node)
            needed = budget.swa_tokens(extend, max_new, chunk_limit=self.chunk)
            fits, _ = budget.check_prefill(
                extend_input_len=extend, total_tokens=extend + max_new, max_new_tokens=max_new,
                input_tokens=len(req.origin_input_ids), swa_host_hit_length=0, chunk_limit=self.chunk)
            self.say(f"{req.rid} admitted? {fits}: hit {req.prefix_len} of {len(req.origin_input_ids)}"
                     f" (full KV matched {match.full_kv_hit_length}); SWA needs {needed} of"
                     f" {budget.remaining_swa:.0f}, full {extend + max_new} of {budget.remaining_total:.0f}")
            req.lock = with_lock
            self.running.append(req)

    def prefill(self, req: Request, tokens: int):
        """One chunk: the row, the prefix's slots, the eviction and allocation
        (``allocation.py:152-159``, ``:373-385``), then the checkpoint (``common.py:271-281``)."""
        with PEER.active():
            common = SGLANG.common
            if not req.kv.holds_kv:
                self.rows.alloc([req])
                if req.prefix_len:
                    self.rows.req_to_token[req.kv.req_pool_idx, :req.prefix_len] = \
                        self.cache.prefix_device_indices(req)
            if not self.radix:  # schedule_batch.py:4106-4121 (overlap off: the chunk's own prefix)
                self.cache.evict_sliding_windows(req, req.prefix_len)
            common.evict_from_tree_cache(self.cache, tokens)
            slots = self.allocator.alloc(tokens)
            assert slots is not None, f"{req.rid}: no {tokens} slots"
            start = req.prefix_len
            self.rows.req_to_token[req.kv.req_pool_idx, start:start + tokens] = slots
            req.kv.kv_allocated_len = req.kv.kv_committed_len = start + tokens
            req.extend_end = start + tokens
            common.checkpoint_kv_cache(req, self.cache)
            self.show(f"{req.rid} prefilled tokens [{start},{start + tokens})")

    def prefill_prompt(self, req: Request):
        """The prompt's uncached tokens in chunks of ``chunk``."""
        while req.prefix_len < len(req.origin_input_ids):
            self.prefill(req, min(self.chunk, len(req.origin_input_ids) - req.prefix_len))

    def decode(self, req: Request):
        """A decode step for ``req``: the retraction check (``schedule_batch.py:3432``), the
        window eviction (``schedule_batch.py:4068-4099``: due once ``interval`` tokens are past
        the window, ``:4063-4066``, the same test as ``common.py:97-99`` makes with that
        interval, which is how it is passed here; without overlap scheduling's wait for the
        first decode batch), the slot for the token sampled last (``allocation.py:625-640``)."""
        with PEER.active():
            req.output_ids.append(req.outputs[len(req.output_ids)])
            ok = self.allocator.check_decode_capacity(num_tokens=1, tree_cache=self.cache)
            assert ok, f"{req.rid}: would be retracted"
            seqlen = len(req.origin_input_ids) + len(req.output_ids)
            self.cache.evict_sliding_windows(req, seqlen - 1, eviction_interval=self.interval)
            SGLANG.common.evict_from_tree_cache(self.cache, 1)
            slot = self.allocator.alloc(1)
            self.rows.req_to_token[req.kv.req_pool_idx, seqlen - 1] = slot
            req.kv.kv_allocated_len = req.kv.kv_committed_len = seqlen
            self.show(f"{req.rid} decoded: token {seqlen - 1} has a slot")

    def finish(self, req: Request):
        """The finished request's release (``common.py:400-444``): its tokens inserted, its own
        slots freed, the lock dropped."""
        with PEER.active():
            req.finished_reason = "length"
            SGLANG.common.release_kv_cache(req, self.cache, checkpoint=True)
            self.running.remove(req)
            self.show(f"{req.rid} finished")

    def evict(self, full: int = 0, swa: int = 0):
        with PEER.active():
            result = self.cache.evict(SGLANG.base.EvictParams(num_tokens=full, swa_num_tokens=swa))
            self.show(f"evict(full {full}, swa {swa}): freed full {result.num_tokens_evicted},"
                      f" swa {result.swa_num_tokens_evicted}")


PREFIX = list(range(1, 21))  # the shared 20-token prefix


def worked_example(say=print, *, radix: bool = True, interval: int = 128):
    """The note's example: window 8, page 1, 40 full and 32 SWA slots (ratio 0.8), chunks of 16;
    A and B share a 20-token prefix, D fills the SWA pool, C comes back to the prefix."""
    probe = Probe(40, 32, 8, radix=radix, interval=interval, say=say)
    say(f"window 8, page 1, chunks of 16, {'radix cache' if radix else '--disable-radix-cache'},"
        f" SGLANG_SWA_EVICTION_INTERVAL {interval}")
    say(f"pools: {probe.pools()}")
    a = Request("A", PREFIX + [101, 102, 103, 104], [201, 202, 203, 204])
    probe.admit(a, max_new=4)
    probe.prefill_prompt(a)
    for _ in range(3):
        probe.decode(a)
    probe.finish(a)
    b = Request("B", PREFIX + [111, 112, 113, 114], [211, 212])
    probe.admit(b, max_new=2)
    probe.prefill_prompt(b)
    probe.decode(b)
    probe.finish(b)
    if not radix:
        return probe
    d = Request("D", list(range(301, 329)), [401])
    probe.admit(d, max_new=1)
    probe.prefill_prompt(d)
    probe.finish(d)
    c = Request("C", PREFIX + [121, 122, 123, 124], [221])
    probe.admit(c, max_new=1)
    probe.prefill_prompt(c)
    probe.finish(c)
    return probe


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--disable-radix-cache", action="store_true")
    parser.add_argument("--interval", type=int, default=128, help="SGLANG_SWA_EVICTION_INTERVAL")
    args = parser.parse_args(argv)
    worked_example(radix=not args.disable_radix_cache, interval=args.interval)


if __name__ == "__main__":
    main()
