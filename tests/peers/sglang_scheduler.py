"""SGLang 0.5.23's own scheduling policy, run step by step beside pagesim's ``--system sglang``.

Executed from SGLang's source (fetched by ``python -m tests.peers.fetch``), as it is:

* ``managers/schedule_policy.py``: ``SchedulePolicy.calc_priority`` (fcfs, lpm) orders the waiting
  queue; ``PrefillAdder`` (``add_chunked_req``, ``add_one_req``, ``budget_state``) decides who is
  admitted, each extend length, the truncation to a chunk and every budget;
* ``mem_cache/prefill_budget.py`` (``PrefillBudget``: ``rem_total_tokens`` and
  ``cur_rem_tokens``), made by ``mem_cache/allocator/base.py``'s ``create_prefill_budget``, whose
  ``check_decode_capacity`` and ``evict_to_free_tokens`` also run;
* ``managers/schedule_batch.py``: ``ScheduleBatch.check_decode_mem``, ``retract_decode`` (the
  victims' order, ``_get_decode_retraction_order``, and their release, ``release_req``) and
  ``Req``'s own methods (``init_next_round_input``, ``reset_for_retract``, ...);
* ``managers/scheduler_components/new_token_ratio_tracker.py``: the ratio, its decay and its
  estimate after a retraction;
* ``mem_cache/common.py`` (``match_kv_cache``, ``checkpoint_kv_cache``, ``release_kv_cache``,
  ``evict_from_tree_cache``) and the radix cache with what it runs (``sglang_radix.REAL``), on
  real KV indices: a finished request's tokens, a chunk's and a prefill's go into the tree as
  SGLang puts them there;
* ``beam_search/batch_tail.py`` and ``mem_cache/allocator/page_interleave.py``: the no-beam and
  no-sharding answers the code above asks for.

Every other SGLang module they import is a stub (``STUBS``): a placeholder that raises if called,
or, for what is read while importing or running, an explicit setting (``SETTINGS``, ``ENVIRONMENT``,
``PLATFORM``): a setting SGLang reads that is not given raises ``NotGiven``.

**What the driver writes itself.** ``Scheduler`` (``managers/scheduler.py``) does not import on a
CPU; its per-iteration control flow is transcribed in ``Engine``, every line citing SGLang's, with
no decision of its own: which requests are admitted and how far, the budgets, who is retracted and
the ratio all come from the code above. The rest is the forward pass's bookkeeping, transcribed:
the KV slots a batch allocates (``mem_cache/allocation.py``, ``Engine.allocate_extend``,
``allocate_decode``), a generated token and the finish at ``max_new_tokens`` (``Engine.complete``).
A request is a light class (``Request``): the attributes SGLang's code reads, with ``Req``'s own
methods bound to it (``REQUEST_METHODS``); ``Batch`` likewise (``BATCH_METHODS``). The pools are
fakes: ``Allocator`` (SGLang's ``BaseTokenToKVPoolAllocator`` with a page free list) and ``Rows``
(the ``req_to_token`` rows).

**Settings.** Without overlap scheduling, mixed chunks, priorities, speculative decoding, LoRA,
HiCache or disaggregation; a request ends at its ``max_new_tokens``, the trace's output, and
carries ``ignore_eos`` as its workload says (``Workload.ignore_eos``: with it the adder charges a
running request's remaining output whole, schedule_policy.py:785-794; ``add_one_req``'s
ratio-free path, :1354, is for ``ignore_eos`` without a tree cache, which SGLang always has here); ``schedule_policy``, ``chunked_prefill_size``, ``max_prefill_tokens``,
``max_running_requests`` and the page size from the workload, as pagesim is given them.

**Time** as pagesim's executor keeps it (``pagesim_steps``): every step lasts ``STEP_S``; the
requests that have arrived by a step's start join the queue first; an idle engine waits for the
next arrival. The workloads' arrivals are whole steps, so an arrival never lands inside a step
(where pagesim's event order, not the time, would decide whether it is in).

**Tokens and the clock** as ``sglang_radix`` gives them (its docstring): a prompt's tokens agree
with another's where their prefix-hash chains do, and every token a request generates is its own
(``Engine.complete``), as pagesim's tree assumes (``radix_cache.same_tokens``); the radix cache's
access stamps come from a counter (``sglang_radix.Counter``), not ``time.monotonic``.

**The record** (``SglangStep``), per step that runs a batch: prefill or decode, the tokens each
request computes (a prefill's extend length, 1 for a decode), the retracted requests, the
``new_token_ratio`` after the step is scheduled, the free (``available_size``) and evictable tokens
once its slots are allocated, and the requests that finish with it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import math
import time
import types
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from tests.peers import fetch, pagesim_steps, sglang_radix
from tests.peers.importing import Peer, placeholders
from tests.peers.workloads import STEP_S

from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.kv import radix_cache
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.run import run_simulation
from pagesim.sim.core.sched.scheduler_sglang import NEW_TOKEN_RATIO
from pagesim.sim.core.kv.radix_cache import RADIX_EVICTABLE

VERSION = sglang_radix.VERSION
FOLDER = fetch.source_folder(VERSION, "sglang")

REAL = sglang_radix.REAL + (
    "sglang.srt.managers.schedule_policy", "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.scheduler_components.new_token_ratio_tracker", "sglang.srt.mem_cache.prefill_budget",
    "sglang.srt.mem_cache.allocator.base", "sglang.srt.mem_cache.allocator.page_interleave",
    "sglang.srt.mem_cache.common", "sglang.srt.beam_search.batch_tail",
)


class NotGiven(RuntimeError):
    """SGLang read a setting the driver does not give."""


class Settings:
    """A settings object SGLang reads (``get_schedule()``, ...): the values given, and
    ``NotGiven`` for any other (not an AttributeError: ``getattr(x, name, default)`` would hide it)."""

    def __init__(self, name: str, **values):
        self.__dict__.update(values)
        self._name = name

    def __getattr__(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise NotGiven(f"SGLang read {self._name}.{attribute}, which tests/peers/sglang_scheduler.py does not give")


class Environment(Settings):
    """``sglang.srt.environ.envs``: ``envs.NAME.get()`` of the values given."""

    def __getattr__(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise NotGiven(f"SGLang read envs.{attribute}, which tests/peers/sglang_scheduler.py does not give")


def variable(value):
    return types.SimpleNamespace(get=lambda: value, is_set=lambda: False)


# environ.py's defaults (0.5.23): the ones these modules read
ENVIRONMENT = Environment("envs", **{name: variable(value) for name, value in dict(
    SGLANG_ENABLE_WAITING_PREFIX_REFRESH=True,  # environ.py:645
    SGLANG_INIT_NEW_TOKEN_RATIO=0.7,  # :646
    SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR=0.14,  # :647
    SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS=600,  # :648
    SGLANG_RETRACT_DECODE_STEPS=20,  # :649
    SGLANG_PREFILL_TILE_BUDGET=0,  # :661 (AMD only)
    SGLANG_PREFILL_TILE_BUDGET_MODE="compact",  # :665
    SGLANG_EXACT_CHUNK_FILL=True,  # :670 (gfx95 only: is_gfx95_supported is False here)
    SGLANG_RADIX_FORCE_MISS=False,  # :722
).items()})

# the platform: an NVIDIA GPU (no HIP, no gfx95); get_bool_env_var of the unset variables read
PLATFORM = dict(is_hip=lambda: False, is_gfx95_supported=lambda: False)
BOOL_ENVIRONMENT = {"SGLANG_ROUTING_KEY_POLICY_DEBUG_LOG": False}


def get_bool_env_var(name: str, default: str = "false") -> bool:
    if name not in BOOL_ENVIRONMENT:
        raise NotGiven(f"SGLang read the environment variable {name}, which the driver does not give")
    return BOOL_ENVIRONMENT[name]


class Schedule(Settings):
    """``get_schedule()``: arg_groups/fields/schedule.py's defaults, and the workload's policy."""


def runtime(policy: str) -> dict:
    """``sglang.srt.runtime_context``'s getters (the server's arguments, by group)."""
    schedule = Settings("get_schedule()", schedule_policy=policy,
                        retraction_policy="length",  # arg_groups/fields/schedule.py:138
                        schedule_conservativeness=1.0,  # :142
                        prefill_max_requests=None,  # :85
                        schedule_low_priority_values_first=False)  # :121
    context = Settings("get_context()", is_config_namespace_published=lambda name: False)
    groups = dict(
        get_schedule=schedule,
        get_disagg=Settings("get_disagg()", disaggregation_mode="null"),
        get_memory=Settings("get_memory()", radix_eviction_policy="lru", enable_hisparse=False),
        get_spec=Settings("get_spec()", speculative_algorithm=None),
        get_serving=Settings("get_serving()", strip_thinking_cache=False),
        get_exec=Settings("get_exec()", features=Settings("get_exec().features",
                                                          enable_encoder_swa_bounded_replay=False)),
        get_context=context,
    )
    return {name: (lambda value=value: value) for name, value in groups.items()}


def lifted(relative: str, *names: str) -> dict:
    """Functions of an SGLang module that does not import here, executed from its source alone:
    each ``def`` named (``Class.method`` for a method) compiled by itself, in a namespace holding
    the others. SGLang's own code, not a copy."""
    tree = ast.parse((FOLDER / "sglang" / relative).read_text())
    wanted = {name.split(".")[-1]: name for name in names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and wanted.get(item.name) == f"{node.name}.{item.name}":
                    found.append(item)
        elif isinstance(node, ast.FunctionDef) and wanted.get(node.name) == node.name:
            found.append(node)
    assert len(found) == len(names), f"{relative}: found {[f.name for f in found]} of {names}"
    namespace: dict = {}
    for function in found:
        function.decorator_list = []
        module = ast.Module(body=[function], type_ignores=[])
        exec(compile(module, str(FOLDER / "sglang" / relative), "exec"), namespace)
    return {name: namespace[name.split(".")[-1]] for name in names}


class StructMeta(type):
    """``msgspec.Struct`` (msgspec is not installed): a base class taking msgspec's class
    keywords, for the structs schedule_batch.py defines and never builds here."""

    def __new__(mcls, name, bases, namespace, **keywords):
        return super().__new__(mcls, name, bases, namespace)

    def __init__(cls, name, bases, namespace, **keywords):
        super().__init__(name, bases, namespace)

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"the peer built the msgspec stub {cls.__name__}")


MSGSPEC = dict(Struct=StructMeta("Struct", (), {}),
               field=lambda **kwargs: None)  # a struct field's default, read at class definition only


def stubs(policy: str) -> dict:
    utils_common = lifted("srt/utils/common.py", "ceil_div", "ceil_align")
    return {
        **{name: names for name, names in sglang_radix.STUBS.items()
           if name not in ("sglang.srt.environ", "sglang.srt.utils.common", "sglang.srt.runtime_context")},
        "msgspec": MSGSPEC,
        "sglang.srt.environ": dict(envs=ENVIRONMENT),
        "sglang.srt.runtime_context": {**placeholders("get_parallel", "get_platform", "get_observability",
                                                      "mamba_cache_chunk_size", "mamba_checkpoint_grid",
                                                      "mamba_track_grid"), **runtime(policy)},
        "sglang.srt.utils": dict(flatten_nested_list=None, get_bool_env_var=get_bool_env_var, **PLATFORM),
        "sglang.srt.utils.common": {**placeholders("async_h2d", "flatten_arrays_to_pinned_cpu",
                                                   "is_pin_memory_available"),
                                    "is_hip": PLATFORM["is_hip"], "ceil_align": utils_common["ceil_align"]},
        "sglang.kernels.ops.memory.common": placeholders("_get_last_loc_safe_kernel", "get_last_loc_kernel"),
        "sglang.srt.beam_search.fork": placeholders("free_member_rows"),
        "sglang.srt.constrained.base_grammar_backend": placeholders("BaseGrammarObject"),
        "sglang.srt.disaggregation.base": placeholders("BaseKVSender"),
        "sglang.srt.disaggregation.decode_schedule_batch_mixin": placeholders("ScheduleBatchDisaggregationDecodeMixin"),
        "sglang.srt.disaggregation.utils": placeholders("DisaggregationMode", "FAKE_BOOTSTRAP_HOST"),
        "sglang.srt.dllm.config": placeholders("DllmConfig"),
        "sglang.srt.dllm.mixin.req": placeholders("ReqDllmMixin"),
        "sglang.srt.managers.embed_types": placeholders("PositionalEmbeds"),
        "sglang.srt.managers.kv_hints": placeholders("KvHintsEnvelope"),
        "sglang.srt.managers.prefill_delayer": placeholders("PrefillDelayerSinglePassExecutor"),
        "sglang.srt.mem_cache.allocation": placeholders("alloc_for_decode", "alloc_for_extend"),
        "sglang.srt.mem_cache.allocation_sizing": placeholders("get_alloc_reserve_per_decode"),
        "sglang.srt.mem_cache.allocator": placeholders("BaseTokenToKVPoolAllocator"),
        "sglang.srt.mem_cache.allocator.paged": placeholders("PagedTokenToKVPoolAllocator"),
        "sglang.srt.mem_cache.allocator.hisparse": placeholders("DeepSeekV4HiSparseTokenToKVPoolAllocator"),
        "sglang.srt.mem_cache.allocator.swa": placeholders("SWATokenToKVPoolAllocator", "is_swa_req_ring"),
        "sglang.srt.mem_cache.allocator.unified_hybrid_swa": placeholders("UnifiedMambaSWATokenToKVPoolAllocator"),
        "sglang.srt.mem_cache.allocator.unified_mamba": placeholders("UnifiedMambaTokenToKVPoolAllocator"),
        "sglang.srt.mem_cache.hicache_storage": placeholders("PoolTransfer"),
        "sglang.srt.mem_cache.memory_pool": placeholders("HybridReqToTokenPool", "ReqToTokenPool"),
        "sglang.srt.mem_cache.unified_cache.components": placeholders("CacheTransferPhase", "ComponentType"),
        "sglang.srt.mem_cache.unified_radix_cache": placeholders("UnifiedRadixCache"),
        "sglang.srt.model_executor.encoder_swa_replay": placeholders("resets_swa_window"),
        "sglang.srt.model_executor.forward_batch_info": placeholders("CaptureHiddenMode", "ForwardBatch",
                                                                      "ForwardMode"),
        "sglang.srt.multimodal.modality": placeholders("Modality", "MultimodalInputFormat"),
        "sglang.srt.multimodal.transport.cuda_ipc": placeholders(
            "CUDA_IPC_FEATURE_COPY_EVENT_KEY", "CudaIpcTensorTransportProxy",
            "DEFER_CUDA_IPC_FEATURE_RECONSTRUCTION_KEY", "RETAINED_CUDA_IPC_FEATURE_PROXY_KEY"),
        "sglang.srt.observability.metrics_collector": placeholders(
            "DPBalanceStats", "DPCooperationInfo", "RadixCacheMetricsCollector", "STAT_LOGGER_ROLE_RADIX_CACHE",
            "SchedulerMetricsCollector", "radix_cache_metric_labels", "resolve_collector_class"),
        "sglang.srt.observability.req_time_stats": placeholders("APIServerReqTimeStats", "DPControllerReqTimeStats",
                                                                "SchedulerReqTimeStats"),
        "sglang.srt.sampling.sampling_batch_info": placeholders("SamplingBatchInfo"),
        "sglang.srt.sampling.sampling_mask": placeholders("SamplingMaskRows"),
        "sglang.srt.sampling.sampling_params": placeholders("SamplingParams"),
        "sglang.srt.utils.token_sequence_matcher": placeholders("TokenSequenceMatcher"),
        "sglang.srt.utils.weight_versions": placeholders("WeightVersionEvent", "truncate_weight_version_events"),
    }


# One peer per policy: get_schedule().schedule_policy is read while running (schedule_policy.py:1447),
# and each peer's modules hold their own getters.
PEERS: dict = {}
PEER = Peer(VERSION, REAL, {}, "tests/peers/sglang_scheduler.py", package="sglang", folder=FOLDER,
            name=f"SGLang {VERSION}")  # for driver_or_skip: its version and folder (load() builds the real ones)
SGLANG: dict = {}  # policy -> its modules' names the driver uses


def peer(policy: str) -> Peer:
    if policy not in PEERS:
        PEERS[policy] = Peer(VERSION, REAL, stubs(policy), "tests/peers/sglang_scheduler.py", package="sglang",
                             folder=FOLDER, name=f"SGLang {VERSION}")
    return PEERS[policy]


def load(policy: str = "fcfs") -> types.SimpleNamespace:
    """Import SGLang's scheduling modules for ``policy`` (raises where they do not import here)."""
    if policy in SGLANG:
        return SGLANG[policy]
    this = peer(policy)
    with this.active():
        modules = {name.rsplit(".", 1)[-1]: importlib.import_module(name) for name in REAL}
    sglang = types.SimpleNamespace(peer=this, **modules)
    sglang.Allocator = allocator_class(modules["base"].BaseTokenToKVPoolAllocator)
    SGLANG[policy] = sglang
    return sglang


# -- the fakes -----------------------------------------------------------------------------------
def allocator_class(base):
    class Allocator(base):
        """SGLang's ``BaseTokenToKVPoolAllocator`` (its ``available_size``, ``create_prefill_budget``,
        ``check_decode_capacity``, ``evict_to_free_tokens``, ``free_segment`` run as they are) over a
        free list of pages: page ``p`` holds slots ``p * page .. p * page + page - 1``, page 0 is
        never handed out (SGLang's padding slot). ``alloc_pages`` is the driver's: the paged
        allocator's kernels do not run on a CPU."""

        def __init__(self, size: int, page_size: int):
            import torch

            self.size, self.page_size, self.device, self.need_sort = size, page_size, "cpu", False
            self._kvcache, self.free_group = None, None
            self.free_pages = torch.arange(1, size // page_size + 1, dtype=torch.int64)
            self.release_pages = torch.empty((0,), dtype=torch.int64)

        def clear(self):
            raise RuntimeError("the driver never clears the pool")

        def alloc(self, need_size: int):
            raise RuntimeError("the driver allocates pages (alloc_pages)")

        def alloc_pages(self, count: int):
            if count > len(self.free_pages):
                raise RuntimeError(f"out of memory: {count} pages wanted, {len(self.free_pages)} free")
            pages, self.free_pages = self.free_pages[:count], self.free_pages[count:]
            return pages.tolist()

        def free(self, free_index):
            import torch

            if free_index.numel() == 0:
                return
            pages = torch.unique(free_index // self.page_size)
            self.free_pages = torch.cat((self.free_pages, pages))

    return Allocator


class Rows:
    """``ReqToTokenPool``: a request's row of KV slots (``req_to_token[row, columns]``), a row per
    running request from ``free_rows``."""

    def __init__(self, count: int):
        self.rows: dict = {}
        self.free_rows = list(range(count))
        self.req_to_token = self

    def __getitem__(self, index):
        if isinstance(index, tuple):
            row, columns = index
            return self.rows[row][columns]
        return self.rows[index]

    def available_size(self) -> int:
        return len(self.free_rows)

    def alloc(self, length: int) -> int:
        import torch

        row = self.free_rows.pop(0)
        self.rows[row] = torch.zeros(length, dtype=torch.int64)
        return row

    def write(self, index, values):
        row, columns = index
        self.rows[row][columns] = values

    def free(self, req):
        row = req.kv.req_pool_idx
        del self.rows[row]
        self.free_rows.append(row)
        req.kv.req_pool_idx = None


#: ``Req``'s methods (schedule_batch.py) bound to ``Request``: the ones SGLang's code calls
REQUEST_METHODS = ("init_next_round_input", "refresh_fill_ids", "_compute_max_prefix_len", "finished", "extend_len",
                   "seqlen", "owned_kv_len", "output_ids_through_stop", "reset_for_retract", "needs_host_load_back",
                   "auxiliary_swa_host_hit_length", "materialized_host_hit_len", "fulfilled_storage_hit_len")
#: ``ScheduleBatch``'s (schedule_batch.py) bound to ``Batch``
BATCH_METHODS = ("batch_size", "is_empty", "new_tokens_required_next_decode", "check_decode_mem", "retract_decode",
                 "_get_decode_retraction_order", "release_req")


def request_class(sglang):
    Req = sglang.schedule_batch.Req
    mixin = lifted("srt/dllm/mixin/req.py", "ReqDllmMixin.is_dllm")  # Req's base class: a stub here

    class Request:
        """A request as SGLang's scheduling code reads it (``Req.__init__`` sets these: the
        defaults of a plain generation request), ``Req``'s own methods bound (REQUEST_METHODS)."""

        def __init__(self, index: int, prompt, max_new_tokens: int, ignore_eos: bool):
            self.rid = f"r{index:06d}"
            self.index = index
            self.origin_input_ids = prompt
            self.output_ids = array("q")
            self.full_untruncated_fill_ids = array("q")
            self.sampling_params = types.SimpleNamespace(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
            self.kv = sglang.schedule_batch.ReqKvInfo()
            self.prefix_len = 0
            self.extend_end = None
            self.last_node = self.last_host_node = self.best_match_node = None
            self.lock = None
            self.finished_reason = self.finished_len = self.to_finish = None
            self.extra_key = self.cache_salt = self.priority = None
            self.return_logprob, self.logprob_start_len = False, -1
            self.session = self.positional_embed_overrides = self.dllm_config = None
            self.multimodal_inputs = self.input_embeds = None
            self.is_retracted = self.retracted_stain = False
            self.retraction_count = 0
            self.host_hit_length = self.swa_host_hit_length = self.mamba_host_hit_length = 0
            self.host_loaded_length = 0
            self.storage_hit_length, self.storage_hit_start, self.host_hit_is_storage = 0, None, False
            self.cache_request_handle = self.staged_prefetch_plan = None
            self.beam_group = None
            self.skip_radix_cache_insert = False
            self.num_matched_prefix_tokens = 0
            self.inflight_middle_chunks = 0
            self.reasoning_tokens = 0
            self.swa_branching_seqlen = self.mamba_branching_seqlen = None

        is_dllm = mixin["ReqDllmMixin.is_dllm"]

        def __repr__(self):
            return self.rid

    for name in REQUEST_METHODS:
        setattr(Request, name, Req.__dict__[name])
    return Request


def batch_class(sglang):
    ScheduleBatch = sglang.schedule_batch.ScheduleBatch

    class Batch:
        """A running batch as ``retract_decode`` and ``check_decode_mem`` read it,
        ``ScheduleBatch``'s own methods bound (BATCH_METHODS)."""

        spec_algorithm = types.SimpleNamespace(is_none=lambda: True)
        hisparse_coordinator = None

        def __init__(self, engine, reqs):
            self.reqs = list(reqs)
            self.tree_cache = engine.tree_cache
            self.token_to_kv_pool_allocator = engine.allocator
            self.req_to_token_pool = engine.rows
            self.batch_is_full = False

        def filter_batch(self, reqs_to_exclude=None, keep_indices=None):
            """schedule_batch.py:3840-3873: the kept requests, in ``keep_indices``' order (the
            batch's tensors: none here)."""
            if keep_indices is None:
                exclude = [reqs_to_exclude] if isinstance(reqs_to_exclude, Request) else (reqs_to_exclude or [])
                keep_indices = [i for i in range(len(self.reqs))
                                if not self.reqs[i].finished() and self.reqs[i] not in exclude]
            self.reqs = [self.reqs[i] for i in keep_indices]

    Request = sglang.Request
    for name in BATCH_METHODS:
        setattr(Batch, name, ScheduleBatch.__dict__[name])
    return Batch


# -- the record -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SglangStep:
    """One step: its start, ``prefill`` or ``decode``, the tokens each request computes (trace
    index: its extend length, or 1), the requests retracted while scheduling it, the
    ``new_token_ratio`` after it is scheduled, the free and evictable tokens once its slots are
    allocated, and the requests that finish with it."""

    start_s: float
    kind: str
    scheduled: dict = field(default_factory=dict)
    retracted: frozenset = frozenset()
    new_token_ratio: float = 0.0
    free_tokens: int = 0
    evictable_tokens: int = 0
    finished: frozenset = frozenset()

    def describe(self, limit: int = 12) -> str:
        scheduled = sorted(self.scheduled.items())
        shown = dict(scheduled[:limit])
        more = f" and {len(scheduled) - limit} more" if len(scheduled) > limit else ""
        return (f"t={self.start_s} {self.kind} {shown}{more} retracted {sorted(self.retracted)} ratio "
                f"{self.new_token_ratio!r} free {self.free_tokens} evictable {self.evictable_tokens} finished "
                f"{sorted(self.finished)}")


# -- the workloads --------------------------------------------------------------------------------
LLAMA_SLOT = sglang_radix.LLAMA_SLOT


@dataclass(frozen=True)
class Workload(sglang_radix.Workload):
    """``sglang_radix.Workload`` with SGLang's ``max_prefill_tokens`` and ``max_running_requests``,
    and whether the requests carry ``ignore_eos`` (pagesim's ``--ignore-eos``)."""

    max_prefill_tokens: int = 16384
    max_running_requests: int = 4096
    ignore_eos: bool = False

    def config(self) -> SimConfig:
        return SimConfig.for_system("sglang", model="llama-3.1-8b", gpu="h100-80gb", cost_model="roofline",
                                    block_size=self.page_size, kv_gib=self.pool_tokens * LLAMA_SLOT / 2**30,
                                    schedule_policy=self.policy, chunk_budget=self.chunk_budget,
                                    max_num_batched_tokens=self.max_prefill_tokens,
                                    max_num_seqs=self.max_running_requests,
                                    max_seq_len=min(32768, self.pool_tokens), ignore_eos=self.ignore_eos)

    def trace(self) -> pd.DataFrame:
        """The trace at whole steps (module docstring, Time): each arrival rounded to a step,
        the first at 0."""
        df = self.make()
        arrivals = (df["arrival_s"] - df["arrival_s"].iloc[0]).round() * STEP_S
        out = df.assign(arrival_s=arrivals.to_numpy())
        out.attrs.update(df.attrs)
        return out


def admitted_before_the_first_finish(steps: list[SglangStep]) -> int:
    """The requests admitted (a prefill step's) before any request finishes."""
    admitted = set()
    for step in steps:
        if step.finished:
            break
        if step.kind == "prefill":
            admitted |= set(step.scheduled)
    return len(admitted)


def hand(rows: list, block: int = 4) -> Callable[[], pd.DataFrame]:
    """``rows``: (arrival step, prompt, output, hashes)."""
    return lambda: sglang_radix.frame(rows, block)


def fitting(make: Callable[[], pd.DataFrame], pool_tokens: int) -> Callable[[], pd.DataFrame]:
    """The trace without the requests longer than the context (``Workload.config``'s max_seq_len):
    pagesim rejects them, SGLang's tokenizer would (``validate_input_length``); neither scheduler
    sees them."""
    def make_fitting():
        df = make()
        fits = df["prompt_tokens"] + df["output_tokens"] <= min(32768, pool_tokens)
        out = df[fits].reset_index(drop=True)
        out.attrs.update(df.attrs)
        return out
    return make_fitting


def burst(seed: int, requests: int) -> Callable[[], pd.DataFrame]:
    """``requests`` distinct prompts arriving at once, ShareGPT-like lengths: prompts and outputs
    log-normal around 150 tokens (4 to 1,000), no shared prefix."""
    def make():
        rng = np.random.default_rng(seed)
        prompt = np.clip(rng.lognormal(5.0, 0.8, requests), 4, 1000).astype(int)
        output = np.clip(rng.lognormal(5.0, 0.8, requests), 4, 1000).astype(int)
        return sglang_radix.frame([(0.0, int(p), int(o), ()) for p, o in zip(prompt, output)], 16)
    return make


def workloads(mooncake_requests: int = 200) -> dict[str, Workload]:
    out = [
        Workload("admit-all", hand([(0, 10, 3, ()), (0, 8, 2, ()), (0, 30, 4, ()), (2, 5, 6, ())]), pool_tokens=4096,
                 description="4 requests, a big pool: every budget holds"),
        Workload("max-prefill", hand([(0, 40, 3, ()), (0, 30, 2, ()), (0, 20, 4, ()), (0, 25, 2, ())]),
                 pool_tokens=4096, max_prefill_tokens=64, chunk_budget=128,
                 description="max_prefill_tokens 64: a request after the first that reaches it waits"),
        Workload("chunked", hand([(0, 300, 4, ()), (1, 20, 3, ()), (3, 150, 5, ())]), pool_tokens=4096,
                 chunk_budget=64, description="a prompt of 300 in chunks of 64, others arriving behind it"),
        Workload("chunked-p16", hand([(0, 300, 4, ()), (1, 20, 3, ()), (3, 150, 5, ())]), pool_tokens=4096,
                 page_size=16, chunk_budget=64, description="the chunked workload with pages of 16"),
        Workload("retract", hand([(0, 20, 100, ()), (1, 20, 100, ()), (2, 20, 100, ()), (3, 20, 100, ())]),
                 pool_tokens=300, description="requests of 20 + 100 a step apart in 300 tokens: three admitted "
                                              "on the ratio, then retracted"),
        Workload("shared-prefix", hand([(0, 18, 4, (1, 2, 3, 4)), (2, 18, 4, (1, 2, 3, 4)),
                                        (2, 14, 3, (1, 2, 5)), (9, 18, 2, (1, 2, 3, 4))]),
                 pool_tokens=4096, policy="lpm", description="shared prefixes, lpm: the tree's hits"),
    ]
    for page in (1, 16):
        for policy in ("lpm", "fcfs"):
            out.append(Workload(f"three-levels-p{page}-{policy}", sglang_radix.three_levels(11, 300, 40),
                                pool_tokens=200_000, page_size=page, policy=policy, chunk_budget=256,
                                description=f"3-level shared prefixes (sglang_radix), page {page}, {policy}, "
                                            f"chunks of 256"))
    for page in (1, 16):
        out.append(Workload(f"pressure-p{page}", sglang_radix.random_pressure(12, 300, 32), pool_tokens=6_000,
                            page_size=page, policy="lpm", chunk_budget=512,
                            description=f"random prompts over shared prefixes (sglang_radix), a pool of 6000, page "
                                        f"{page}, lpm, chunks of 512: evictions and retractions"))
    out.append(Workload("retract-ignore-eos", hand([(0, 20, 100, ()), (1, 20, 100, ()), (2, 20, 100, ()),
                                                    (3, 20, 100, ())]), pool_tokens=300, ignore_eos=True,
                        description="the retract workload with ignore_eos: running requests' outputs charged "
                                    "whole, so two run at a time and none is retracted"))
    for page in (1, 16):
        for ignore_eos in (False, True):
            out.append(Workload(f"burst-p{page}{'-ignore-eos' * ignore_eos}", burst(7, 160), pool_tokens=12_000,
                                page_size=page, chunk_budget=512, ignore_eos=ignore_eos,
                                description=f"160 requests at once, prompts and outputs of tens to hundreds, "
                                            f"a pool of 12000: the admission budget binds; page {page}, "
                                            f"{'with' if ignore_eos else 'without'} ignore_eos"))
        out.append(Workload(f"pressure-p{page}-ignore-eos", sglang_radix.random_pressure(12, 300, 32),
                            pool_tokens=6_000, page_size=page, policy="lpm", chunk_budget=512, ignore_eos=True,
                            description=f"pressure-p{page} with ignore_eos"))
    pool = min(800 * mooncake_requests, 400_000)
    for page in (1, 16):
        for policy in ("fcfs", "lpm"):
            out.append(Workload(f"mooncake-p{page}-{policy}", fitting(sglang_radix.mooncake(mooncake_requests), pool),
                                pool_tokens=pool, page_size=page, policy=policy,
                                description=f"Mooncake conversation trace, first {mooncake_requests} requests, "
                                            f"pool {pool // 1000}k, page {page}, {policy}",
                                needs=sglang_radix.MOONCAKE))
    return {w.name: w for w in out}


WORKLOADS = workloads(sglang_radix.TEST_MOONCAKE_REQUESTS)  # the tests' (sglang_radix.TEST_MOONCAKE_REQUESTS)


# -- SGLang's side ---------------------------------------------------------------------------------
class Engine:
    """SGLang's ``Scheduler`` loop, transcribed (module docstring), over SGLang's own policy code."""

    def __init__(self, sglang, workload: Workload, trace: pd.DataFrame):
        self.sglang, self.workload, self.trace = sglang, workload, trace
        self.page = workload.page_size
        self.allocator = sglang.Allocator(workload.pool_tokens, workload.page_size)
        self.rows = Rows(workload.max_running_requests + 1)
        params = sglang.cache_init_params.CacheInitParams(
            disable=False, req_to_token_pool=self.rows, token_to_kv_pool_allocator=self.allocator,
            page_size=workload.page_size)
        # a node's access stamps from a counter, as sglang_radix gives them (its docstring, The
        # clock): LRU's order without ties at the timer's resolution, whatever the machine's speed
        sglang.radix_cache.time = types.SimpleNamespace(monotonic=sglang_radix.Counter(),
                                                        perf_counter=time.perf_counter)
        self.tree_cache = sglang.radix_cache.RadixCache(params)
        self.policy = sglang.schedule_policy.SchedulePolicy(workload.policy, self.tree_cache, False, False, False)
        self.ratio = sglang.new_token_ratio_tracker.NewTokenRatioTracker.from_config()
        self.tokens = sglang_radix.Tokens(trace)
        self.requests = [sglang.Request(i, self.tokens.of(i)[:int(self.tokens.prompt[i])],
                                        int(self.tokens.output[i]), workload.ignore_eos) for i in range(len(trace))]
        self.waiting_queue: list = []
        self.running_batch = sglang.Batch(self, [])
        self.last_batch = None  # (kind, requests) of the step before
        self.chunked_req = None

    # scheduler.py:3894 get_next_batch_to_run, without overlap, hisparse, dllm, mlp sync
    def next_batch(self):
        a = self.sglang.schedule_policy.AddReqResult
        running = self.running_batch
        exclude = []
        if self.chunked_req is not None:  # :3911-3920
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                self.sglang.common.checkpoint_kv_cache(self.chunked_req, self.tree_cache)  # stash_chunked_request :3776
        if self.last_batch is not None and self.last_batch[0] == "prefill":  # :3933-3959
            kept = [r for r in self.last_batch[1] if not r.finished() and r not in exclude]
            if len(kept) < len(self.last_batch[1]):
                running.batch_is_full = False
            if kept and running.is_empty():  # the prefill batch becomes the running one, unflagged (:3957-3958)
                running.batch_is_full = False
            running.reqs = running.reqs + kept  # merge_batch :3977
        before = running.batch_size()  # :3963-3966
        running.filter_batch()
        if running.batch_size() < before:
            running.batch_is_full = False
        batch = self.prefill_batch(a)  # :3973-3975
        if batch is not None:
            return "prefill", batch, frozenset()
        if running.is_empty():  # :3990-3999
            return None, None, frozenset()
        retracted = self.update_running_batch()
        return ("decode", running.reqs, retracted) if not running.is_empty() else (None, None, retracted)

    def allocatable(self, running_bs: int, held: int = 0) -> int:
        """get_num_allocatable_reqs, scheduler.py:4027-4050 (pp_max_micro_batch_size is
        max_running_requests, no beams)."""
        return min(self.workload.max_running_requests - running_bs, max(self.rows.available_size() + held, 0))

    # scheduler.py:4079 _get_new_batch_prefill_raw, without grammar, priority, LoRA, HiCache, mixed chunks
    def prefill_batch(self, a):
        running = self.running_batch
        if running.is_empty():  # :4093-4096
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting_queue) and self.chunked_req is None:  # :4098-4101
            return None
        running_bs = len(running.reqs)
        if self.allocatable(running_bs) <= 0 and self.chunked_req is None:  # :4119-4126
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting_queue, running, processed_tokens=0)  # :4129-4133
        adder = self.sglang.schedule_policy.PrefillAdder(  # :4154-4172
            self.page, self.tree_cache, self.allocator, running, self.ratio.current, self.workload.max_prefill_tokens,
            self.workload.chunk_budget, 0, 0, max_prefill_bs=0, max_running_requests=self.workload.max_running_requests,
            prefill_max_requests=None, prefill_delayer_single_pass=None, dllm_config=None,
            waiting_queue_len=len(self.waiting_queue), prefill_tile_block_m=64)
        if self.chunked_req is not None:  # :4174-4182
            self.chunked_req.init_next_round_input()
            adder.chunked_req_limit = self.policy.shortest_prefill_chunk_limit(
                self.chunked_req, self.waiting_queue, adder.rem_chunk_tokens or 0, self.page)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting_queue:  # :4199-4296
            if adder.budget_state() == a.OTHER:
                break
            running_bs = len(running.reqs)
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self.allocatable(running_bs, held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(self.tree_cache)
            result = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if result != a.CONTINUE:
                if result == a.NO_TOKEN:
                    running.batch_is_full = len(adder.can_run_list) > 0 or not running.is_empty()
                break
        can_run = adder.can_run_list
        if not can_run:  # :4302-4307
            return None
        admitted = set(can_run)
        self.waiting_queue = [r for r in self.waiting_queue if r not in admitted]  # :4313
        if adder.new_chunked_req is not None:  # :4318-4321
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:  # :4323-4324
            self.chunked_req.inflight_middle_chunks += 1
        self.allocate_extend(can_run)  # ScheduleBatch.init_new + prepare_for_extend :4329-4346
        return can_run

    def allocate_extend(self, reqs):
        """prepare_for_extend's allocation (mem_cache/allocation.py alloc_for_extend :374-489): a
        row for each request without one (alloc_req_slots), its prefix's slots from the tree
        (_prefix_kv_indices :363-371), evicting first what the batch may take (alloc_token_slots
        :157: its extend tokens; alloc_paged_token_slots_extend :190-201: and a page per request),
        then the new slots, a page at a time (the paged allocator continues a request's last page)."""
        extend = sum(r.extend_len for r in reqs)
        self.sglang.common.evict_from_tree_cache(self.tree_cache, extend + (len(reqs) * self.page if self.page > 1
                                                                          else 0))
        for r in reqs:
            if not r.kv.holds_kv:
                r.kv.req_pool_idx = self.rows.alloc(len(r.origin_input_ids) + r.sampling_params.max_new_tokens + 1)
                if r.prefix_len:
                    self.rows.rows[r.kv.req_pool_idx][:r.prefix_len] = self.tree_cache.prefix_device_indices(r)
            self.place(r, r.prefix_len, r.extend_end)
            r.kv.kv_allocated_len = r.kv.kv_committed_len = r.extend_end  # :483-485

    def place(self, r, start: int, end: int):
        row = self.rows.rows[r.kv.req_pool_idx]
        fresh = sum(1 for p in range(start, end) if p % self.page == 0)
        pages = iter(self.allocator.alloc_pages(fresh))
        for p in range(start, end):
            row[p] = next(pages) * self.page if p % self.page == 0 else row[p - 1] + 1

    # scheduler.py:4459 update_running_batch, without overlap (no in-flight finishes) or offload
    def update_running_batch(self) -> frozenset:
        batch = self.running_batch
        initial = batch.batch_size()
        retracted = frozenset()
        if not batch.check_decode_mem():  # :4469
            retracted_reqs, ratio, aborted = batch.retract_decode()  # :4493
            if aborted:
                raise RuntimeError(f"SGLang aborted {aborted} (out of memory after retracting)")
            self.ratio.current = ratio  # :4513
            for req in retracted_reqs:  # :4538-4539 (_add_request_to_queue :3493)
                self.waiting_queue.append(req)
            retracted = frozenset(r.index for r in retracted_reqs)
        else:
            self.ratio.decay_step()  # :4542
        if batch.batch_size() < initial:  # :4544-4545
            batch.batch_is_full = False
        if not batch.is_empty():
            self.allocate_decode(batch.reqs)  # prepare_for_decode :4552
        return retracted

    def allocate_decode(self, reqs):
        """prepare_for_decode's allocation (allocation.py alloc_for_decode_default :625-689): evict
        for a slot per request (alloc_token_slots :157) or a page per request
        (alloc_paged_token_slots_decode :582-585), then a slot each."""
        self.sglang.common.evict_from_tree_cache(self.tree_cache, len(reqs) * self.page)
        for r in reqs:
            self.place(r, r.kv.kv_committed_len, r.kv.kv_committed_len + 1)
            r.kv.kv_allocated_len += 1  # :686-688
            r.kv.kv_committed_len += 1

    def complete(self, kind: str, reqs) -> frozenset:
        """The forward pass's result (managers/scheduler_components/batch_result_processor.py):
        a prefill's requests whose prompt is done and every decode sample a token (:363, :~1020),
        finished at max_new_tokens (Req.update_finish_state, schedule_batch.py:2035-2040), and a
        finished request's tokens go into the tree (release_kv_cache, checkpoint: :387-391); a
        prefill's unfinished one is checkpointed (:394); a middle chunk samples nothing (:424-427).
        The token sampled is the request's own next one (``sglang_radix.Tokens``: a generated
        token is nobody else's, as in pagesim's tree), so two requests with the same prompt do
        not share their outputs in the tree (``_insert_cache`` would free one's as duplicates)."""
        finished = set()
        common = self.sglang.common
        for r in reqs:
            if kind == "prefill" and r.inflight_middle_chunks > 0:
                r.inflight_middle_chunks -= 1
                continue
            r.output_ids.append(self.tokens.of(r.index)[len(r.origin_input_ids) + len(r.output_ids)])
            if len(r.output_ids) >= r.sampling_params.max_new_tokens:
                r.finished_reason = self.sglang.schedule_batch.FINISH_LENGTH(length=r.sampling_params.max_new_tokens)
                r.finished_len = r.sampling_params.max_new_tokens
                common.release_kv_cache(r, self.tree_cache, checkpoint=True)
                finished.add(r.index)
            elif kind == "prefill":
                common.checkpoint_kv_cache(r, self.tree_cache)
        return frozenset(finished)


def drive(sglang, workload: Workload, trace: pd.DataFrame, max_steps: int = 200_000) -> list[SglangStep]:
    engine = Engine(sglang, workload, trace)
    arrivals = trace["arrival_s"].tolist()
    pending = sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i))
    steps: list[SglangStep] = []
    now = 0.0
    while True:  # until nothing runs, waits or is to arrive
        if len(steps) >= max_steps:
            raise RuntimeError(f"{workload.name}: SGLang's side ran past {max_steps} steps")
        while pending and arrivals[pending[0]] <= now:
            engine.waiting_queue.append(engine.requests[pending.pop(0)])  # _add_request_to_queue :3493
        kind, reqs, retracted = engine.next_batch()
        if kind is None:
            engine.ratio.reset()  # idle: self_check_during_idle, scheduler.py:5318
            engine.last_batch = None
            if not pending:
                if engine.waiting_queue:
                    raise RuntimeError(f"{workload.name}: SGLang scheduled nothing at {now} with "
                                       f"{len(engine.waiting_queue)} waiting and nothing to arrive")
                break
            now = arrivals[pending[0]]
            continue
        scheduled = {r.index: (r.extend_len if kind == "prefill" else 1) for r in reqs}
        free, evictable = engine.allocator.available_size(), engine.tree_cache.evictable_size()
        ratio = engine.ratio.current
        finished = engine.complete(kind, reqs)
        engine.last_batch = (kind, list(reqs))
        steps.append(SglangStep(now, kind, scheduled, retracted, ratio, free, evictable, finished))
        now += STEP_S
    return steps


def run_sglang(workload: Workload) -> list[SglangStep]:
    sglang = load(workload.policy)
    with sglang.peer.active():
        if not hasattr(sglang, "Request"):
            sglang.Request = request_class(sglang)
            sglang.Batch = batch_class(sglang)
        return drive(sglang, workload, workload.trace())


# -- pagesim's side ---------------------------------------------------------------------------------
class Recorder(pagesim_steps.Recorder):
    """The executor (``sim/executor.py``): one ``SglangStep`` per iteration pagesim's core
    scheduled (the finishes as ``pagesim_steps.Recorder`` finds them)."""

    def __init__(self, workload: Workload):
        super().__init__(workload)
        self.steps: list[SglangStep] = []
        self.available = interpreted(radix_cache.available)

    def start(self, core):
        capacity = int(interpreted(radix_cache.capacity)(core))
        assert capacity == self.workload.pool_tokens, f"pagesim's pool holds {capacity} tokens"
        self.preemptions = core.num_preemptions.copy()
        self.finished = set()

    def step(self, core):
        import numpy as np

        if self.steps:
            self.steps[-1] = dataclasses.replace(self.steps[-1], finished=self.newly_finished(core))
        c = core.count
        prefill = c[state.STEP_PREFILL_SEQS] > 0
        if prefill:
            scheduled = {int(core.step_prefill_ids[k]): int(core.step_prefill_tokens[k])
                         for k in range(c[state.STEP_PREFILL_SEQS])}
        else:
            scheduled = {int(i): 1 for i in core.running[:c[state.NUM_RUNNING]] if core.in_decode[i]}
        retracted = frozenset(np.flatnonzero(core.num_preemptions > self.preemptions).tolist())
        self.preemptions = core.num_preemptions.copy()
        self.steps.append(SglangStep(float(core.clock[state.NOW]), "prefill" if prefill else "decode", scheduled,
                                     retracted, float(core.clock[NEW_TOKEN_RATIO]), int(self.available(core)),
                                     int(c[RADIX_EVICTABLE])))
        return STEP_S


def run_pagesim(workload: Workload) -> list[SglangStep]:
    recorder = Recorder(workload)
    run_simulation(workload.config(), workload.trace(), executor=recorder)
    return recorder.steps


# -- both -------------------------------------------------------------------------------------------
@dataclass
class Comparison:
    workload: Workload
    ours: list
    theirs: list

    @property
    def identical(self) -> int:
        return sum(a == b for a, b in zip(self.ours, self.theirs))

    @property
    def share(self) -> float:
        return self.identical / max(len(self.ours), len(self.theirs), 1)

    @property
    def first(self) -> int | None:
        for k, (a, b) in enumerate(zip(self.ours, self.theirs)):
            if a != b:
                return k
        return None if len(self.ours) == len(self.theirs) else min(len(self.ours), len(self.theirs))

    def describe(self) -> str:
        k = self.first
        if k is None:
            return ""
        lines = [f"first diverging step: {k}"]
        for label, steps in (("pagesim", self.ours), ("SGLang ", self.theirs)):
            for j in (k - 1, k):
                if 0 <= j < len(steps):
                    lines.append(f"  {label} step {j}: {steps[j].describe()}")
                elif j == k:
                    lines.append(f"  {label} step {j}: none (its run ended after {len(steps)} steps)")
        return "\n".join(lines)


def run(workload: Workload) -> Comparison:
    """Both sides over ``workload``."""
    return Comparison(workload, run_pagesim(workload), run_sglang(workload))
