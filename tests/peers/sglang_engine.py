"""SGLang 0.5.23's own ``Scheduler`` (``managers/scheduler.py``) on a CPU, its model a fake: the
peer of pagesim's ``--system sglang`` through the engine's own scheduling loop, with burst
workloads that fill the KV pool (issue 81 item 3). Beside ``sglang_scheduler`` (SGLang's policy
modules under a transcribed loop), this one runs the loop itself; the record and pagesim's side
are ``sglang_scheduler``'s (``SglangStep``, ``run_pagesim``, ``Comparison``).

**SGLang's code that runs**, every step: ``Scheduler.get_next_batch_to_run`` (scheduler.py:3894):
the merge of the last prefill into the running batch, ``_get_new_batch_prefill_raw`` (:4079, the
``PrefillAdder``, the chunked request, ``ScheduleBatch.init_new`` and ``prepare_for_extend`` with
``mem_cache/allocation.py``'s ``alloc_for_extend``, ``SamplingBatchInfo.from_schedule_batch``),
and ``update_running_batch`` (:4459: ``check_decode_mem``, ``retract_decode``, the ratio's decay,
``prepare_for_decode`` and ``alloc_for_decode``); then ``Scheduler.process_batch_result``
(:5074) with ``SchedulerBatchResultProcessor.process_batch_result_prefill`` / ``_decode``
(scheduler_components/batch_result_processor.py:258, :952): the sampled token appended,
``Req.update_finish_state`` (finish at ``max_new_tokens``), ``release_kv_cache`` and
``checkpoint_kv_cache`` into the ``RadixCache``, a middle chunk left unfinished; and
``is_fully_idle``. The pools are SGLang's (``ReqToTokenPool``, ``TokenToKVPoolAllocator`` at page
1, ``PagedTokenToKVPoolAllocator`` with its torch paths above), the requests its ``Req`` with
``SamplingParams`` (``normalize``d as the tokenizer manager does), each given
``init_req_max_new_tokens`` and ``_add_request_to_queue`` as ``handle_generate_request`` does.

**What the driver writes itself.**

* The loop (``drive``): ``event_loop_normal`` (:2026-2058) without ``ingest_requests`` (the
  workload's arrivals join with ``_add_request_to_queue`` before a step). An idle pass runs
  ``on_idle``'s one scheduling effect, the ratio's reset where the scheduler is fully idle
  (:5254, :5318); the rest of ``on_idle`` is health checks, leak checks, metrics and sleep. The
  first idle pass after a batch still sees it as ``last_batch`` (not fully idle, no reset); the
  driver runs a second pass, as the engine spins, before it waits for the next arrival.
* ``run_batch`` (:4614) is ``Forward``: its bookkeeping (``forward_ct``, ``forward_iter``,
  :4621-4629) and the model's result, a ``GenerationBatchResult`` (managers/utils.py, its class
  compiled from source) of one next token per request: the request's own (``OWN_TOKENS``), as
  ``sglang_scheduler.Engine.complete`` samples it. Not run: the overlap relay
  (``resolve_forward_inputs``, ``_relay_forward_payload``: the model's inputs) and the forward.
* ``Scheduler.__init__`` does not run (below): the driver sets its attributes.

**Why not ``Scheduler.__init__``.** Its start-up needs what a CPU test may not install (CI has
torch, msgspec and pydantic alone): ``init_model_config`` (scheduler.py:531) builds
``ModelConfig.from_server_args``, whose module imports ``transformers`` (configs/model_config.py:26);
``bootstrap.init_parallel_runtime`` (:536) makes torch.distributed groups; ``init_ipc_channels``
(:547) opens zmq sockets (scheduler_components/ipc_channels.py:4); ``init_model_worker`` (:568)
loads the model (managers/tp_worker.py). So the driver makes the real class with
``Scheduler.__new__`` and sets what ``__init__`` sets: the parsed arguments (:483-529), the pools
as ``kv_cache_builder`` makes them for a full-attention model, the worker's report
(:1207-1220), the counters ``init_load_inquirer`` sets (:2580-2590), then runs SGLang's own init
helpers (``init_running_status``, ``init_chunked_prefill``, ``maybe_init_dynamic_chunk_sizer``,
``init_schedule_policy``, ``init_batch_result_processor``). The components that only observe
(metrics reporter and collector, output streamer, load publisher and inquirer, logprob processor)
or are not used (grammar, dLLM, beams, sessions) are ``inert``: their no-op calls named, any
other use raises.

**Imports.** ``scheduler.py`` and the modules in ``REAL`` run from source; every other module they
import is a placeholder per imported name, derived from their import statements (``stubs``), that
raises if called; ``OVERRIDES`` give the few values read while importing or on the driven path
(platform flags: SGLang's CPU device, ``is_cpu``, no triton; observability no-ops; mixins without
methods), a few functions are compiled from SGLang's source (``functions``). torch.compile's
backend is resolved before the ``triton`` placeholder is in ``sys.modules`` (``load``). The
server's settings are SGLang's declared defaults, read from ``arg_groups/fields/*.py``
(``declared_defaults``), with ``RESOLVED``'s start-up values and the workload's; a setting read
that neither gives raises ``NotGiven``.

**Time, tokens, the record** as in ``sglang_scheduler`` (its docstring): every step lasts
``STEP_S``, arrivals at whole steps join before a step; a step's record is taken once it is
scheduled (its ratio, free and evictable tokens) and its finishes after its result.
"""

from __future__ import annotations

import __future__
import ast
import collections
import enum
import time
import dataclasses
import importlib
import logging
import sys
import types
from dataclasses import dataclass

from tests.peers import sglang_radix, sglang_scheduler, suite
from tests.peers.importing import Peer, constants, functions, installed, placeholders
from tests.peers.workloads import STEP_S
from tests.peers.sglang_scheduler import NotGiven, Settings

VERSION = sglang_scheduler.VERSION
FOLDER = sglang_scheduler.FOLDER

REAL = sglang_scheduler.REAL + (
    "sglang.srt.environ",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.scheduler_components.batch_result_processor",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.allocator.token", "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.utils.torch_memory_saver_adapter",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.dllm.mixin.req",
    "sglang.srt.managers.prefill_delayer",
    "sglang.srt.sampling.sampling_batch_info",
    "sglang.srt.sampling.penaltylib", "sglang.srt.sampling.penaltylib.orchestrator",
    "sglang.srt.sampling.penaltylib.frequency_penalty", "sglang.srt.sampling.penaltylib.min_new_tokens",
    "sglang.srt.sampling.penaltylib.presence_penalty", "sglang.srt.sampling.penaltylib.repetition_penalty",
)


def source_path(module: str):
    path = FOLDER.joinpath(*module.split(".")).with_suffix(".py")
    return path if path.exists() else FOLDER.joinpath(*module.split("."), "__init__.py")


def imported(module: str) -> dict:
    """``module``'s imports run at import time: ``{module: names}`` (not under ``TYPE_CHECKING``,
    nor in a ``try``: an optional import finds its module absent, as SGLang's code expects where
    it is not installed)."""
    out: dict = {}

    def visit(body):
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                out.setdefault(node.module, set()).update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    out.setdefault(alias.name, set())
            elif isinstance(node, ast.If):
                if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                    visit(node.orelse)
                else:
                    visit(node.body)
                    visit(node.orelse)

    visit(ast.parse(source_path(module).read_text()).body)
    return out


class Identity:
    """A decorator factory that leaves what it decorates as it is (``DynamicGradMode()``: torch's
    grad mode; ``scheduler_stage_method(...)``: stage timing for metrics)."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, function):
        return function


def mixin(name: str) -> type:
    """A mixin base of ``Scheduler`` that is not run (disaggregation, PP, multiplexing, dLLM): no
    method; one the driver's path calls would be an AttributeError, not a silent answer."""
    return type(name, (), {})


def inert(name: str, **methods) -> type:
    """A component the scheduler builds but the driven path never uses (cache flushes, sessions,
    metrics): made as SGLang makes it; ``methods`` the no-op calls the path makes (observability
    alone); any other attribute raises."""

    def refuse(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise NotGiven(f"SGLang used {name}.{attribute}, a component tests/peers/sglang_engine.py leaves inert")

    return type(name, (), {"__init__": lambda self, *args, **kwargs: None, "__getattr__": refuse, **methods})


class TimeStats:
    """``observability/req_time_stats.py``'s per-request timestamps: every call records nothing
    and returns None (they feed metrics and logs, never a scheduling decision)."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return lambda *args, **kwargs: None


def unset_variable(name: str, default: str = "false") -> bool:
    """``utils.get_bool_env_var`` with every variable unset (its default), whatever this
    machine's environment holds."""
    return default.lower() in ("true", "1")


def platform_flags() -> dict:
    """SGLang's CPU device (``is_cpu``), no GPU of any vendor."""
    return dict(is_cpu=lambda: True, is_cuda=lambda: False, is_hip=lambda: False, is_npu=lambda: False,
                is_xpu=lambda: False, is_mps=lambda: False, cpu_has_amx_support=lambda: False)


def kernel(function=None, **options):
    """``triton.jit``: the kernel's Python function, never launched (a launch, ``kernel[grid]``,
    raises TypeError): the paths the driver runs are SGLang's torch ones (``support_triton`` False)."""
    return function if function is not None else kernel


class Unrecorded:
    """``PrefillStats`` (metrics_reporter.py:119): a prefill's log line; none is made (the
    processor skips its report where a batch has none, batch_result_processor.py:509)."""

    @classmethod
    def from_adder(cls, *args, **kwargs):
        return None


def no_op(self, *args, **kwargs):
    return None


#: the observability components the driven path calls: each call records nothing
METRICS_REPORTER = dict(enable_metrics=False, num_generated_tokens=0, forward_ct_decode=0, num_retracted_reqs=0,
                        record_scheduler_active=no_op, record_scheduler_idle=no_op, log_batch_result_stats=no_op,
                        report_decode_stats=no_op, report_prefill_stats=no_op, update_device_timer=no_op)

OVERRIDES = {
    "sglang.srt.managers.scheduler_components.metrics_reporter": dict(PrefillStats=Unrecorded),
    # SGLang's CPU platform: no triton, so the paged allocator runs its torch paths
    # (alloc_extend_naive, alloc_decode_naive: allocator/paged.py:155, :245-264, :303-320)
    "sglang.srt.platforms": dict(current_platform=Settings(
        "current_platform", capabilities=Settings("current_platform.capabilities", supports_triton=False))),
    # no capturer is set up (a model's routed experts and DeepSeek's indexer: neither here)
    "sglang.srt.state_capturer.indexer_topk": dict(get_global_indexer_capturer=lambda: None),
    "sglang.srt.state_capturer.routed_experts": dict(get_global_experts_capturer=lambda: None),
    "sglang.srt.managers.scheduler_components.logprob_result_processor": dict(
        SchedulerLogprobResultProcessor=inert("SchedulerLogprobResultProcessor")),
    "sglang.srt.beam_search.coordinator": dict(
        BeamCoordinator=inert("BeamCoordinator", pending_member_rows=lambda self, batch: 0,
                              request_beam_width=staticmethod(lambda request: 1))),
    "sglang.srt.observability.req_time_stats": dict(SchedulerReqTimeStats=TimeStats, APIServerReqTimeStats=TimeStats,
                                                    flush_trace_batch=lambda *args, **kwargs: None,
                                                    DPControllerReqTimeStats=TimeStats,
                                                    set_time_batch=lambda *args, **kwargs: None,
                                                    set_schedule_time_batch=lambda *args, **kwargs: None),
    "sglang.srt.managers.scheduler_components.flush_wrapper": dict(
        SchedulerFlushWrapper=inert("SchedulerFlushWrapper")),
    "sglang.srt.session.session_controller": dict(SessionController=inert("SessionController")),
    "triton": dict(jit=kernel, autotune=lambda *args, **kwargs: kernel, heuristics=lambda *args, **kwargs: kernel,
                   Config=None, cdiv=None),
    "triton.language": dict(constexpr=None),
    "sglang.srt.utils": dict(DynamicGradMode=Identity, get_compiler_backend=lambda mode=None: "eager",
                             support_triton=lambda backend: False, get_bool_env_var=unset_variable,
                             **platform_flags()),
    "sglang.srt.utils.common": dict(suppress_noisy_warnings=lambda: None, is_pin_memory_available=lambda *args: False,
                                    is_confidential_compute=lambda: False,
                                    **platform_flags()),
    "sglang.kernels.ops.quantization.fp8_kernel": dict(is_fp8_fnuz=lambda: False),  # fp8 of AMD: not used
    "sglang.srt.observability.scheduler_stage_metrics": dict(scheduler_stage_method=Identity),
    "sglang.srt.disaggregation.decode": dict(
        SchedulerDisaggregationDecodeMixin=mixin("SchedulerDisaggregationDecodeMixin")),
    "sglang.srt.disaggregation.prefill": dict(
        SchedulerDisaggregationPrefillMixin=mixin("SchedulerDisaggregationPrefillMixin")),
    "sglang.srt.multiplex.multiplexing_mixin": dict(SchedulerMultiplexMixin=mixin("SchedulerMultiplexMixin")),
    "sglang.srt.managers.scheduler_pp_mixin": dict(SchedulerPPMixin=mixin("SchedulerPPMixin")),
    "sglang.srt.disaggregation.decode_schedule_batch_mixin": dict(
        ScheduleBatchDisaggregationDecodeMixin=mixin("ScheduleBatchDisaggregationDecodeMixin")),
    "sglang.srt.dllm.mixin.scheduler": dict(SchedulerDllmMixin=mixin("SchedulerDllmMixin")),
}


def classes(module: str, *names: str, namespace: dict | None = None) -> dict:
    """Classes of an SGLang module that does not import here, compiled from its source alone
    (SGLang's own code, not a copy), over ``namespace`` (the globals they read):
    ``DisaggregationMode``, an ``Enum`` every module compares against, which a placeholder could
    not stand for (its members would never be equal); ``GenerationBatchResult`` (managers/utils.py
    imports io_struct, msgspec's)."""
    path = source_path(module)
    namespace = {"Enum": enum.Enum, **(namespace or {})}
    tree = ast.parse(path.read_text())
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in names]
    assert len(found) == len(names), f"{module}: found {[node.name for node in found]} of {names}"
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec",
                 flags=__future__.annotations.compiler_flag), namespace)
    return {name: namespace[name] for name in names}


def declared_defaults() -> dict:
    """The server's arguments as SGLang declares them (``arg_groups/fields/*.py``): each
    namespace's (``_NS_PATH``: ``schedule``, ``exec.features``, ...) fields with their literal
    defaults, read from the source."""
    out: dict = {}
    for path in sorted((FOLDER / "sglang" / "srt" / "arg_groups" / "fields").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            namespace, fields = None, {}
            for item in node.body:
                if isinstance(item, ast.Assign) and [getattr(t, "id", None) for t in item.targets] == ["_NS_PATH"]:
                    namespace = ast.literal_eval(item.value)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    try:
                        fields[item.target.id] = ast.literal_eval(item.value)
                    except ValueError:
                        pass  # a computed default: not given (read, it raises NotGiven)
            if namespace:
                out.setdefault(namespace, {}).update(fields)
    return out


#: what differs from the declared defaults, or is resolved at start-up where the default is None
#: (build() sets the workload's: chunked_prefill_size, max_prefill_tokens, max_running_requests,
#: page_size, and the parallel pp_max_micro_batch_size)
RESOLVED = {
    "schedule": dict(disable_overlap_schedule=True,  # pagesim models no overlap (schedule.py:193)
                     prefill_decode_interval=0),  # resolvable (:56): 0 but for Qwen3-VL on Hopper
    "spec": dict(speculative_algorithm=None),
    "exec.mamba": dict(enable_mamba_extra_buffer=False, enable_mamba_extra_buffer_lazy=False),  # derived: no Mamba
    # one rank, no parallelism of any kind (runtime_context.py's derived widths)
    "parallel": dict(tp_rank=0, pp_rank=0, attn_tp_rank=0, attn_cp_rank=0, attn_tp_size=1, attn_cp_size=1,
                     attn_dp_enabled=False, dcp_enabled=False, attn_dcp_size=1, dp_rank=None, num_dp_ranks=1),
}


def runtime() -> dict:
    """``sglang.srt.runtime_context``'s getters over ``declared_defaults`` and ``RESOLVED``; a
    name neither gives raises ``NotGiven``."""
    declared = declared_defaults()
    declared.setdefault("exec", {})  # only its sub-namespaces declare fields
    bags: dict = {}
    for namespace in sorted(declared, key=lambda name: name.count(".")):
        values = {**declared[namespace], **RESOLVED.get(namespace, {})}
        top, _, rest = namespace.partition(".")
        bag = Settings(f"get_{top}()" + (f".{rest}" if rest else ""), **values)
        if "." in namespace:
            parent, _, child = namespace.rpartition(".")
            setattr(bags[parent], child, bag)
        bags[namespace] = bag
    context = Settings("get_context()", is_config_namespace_published=lambda name: False)
    getters = {f"get_{name}": (lambda bag=bag: bag) for name, bag in bags.items() if "." not in name}
    getters["get_context"] = lambda: context
    # SGLang's CPU device: the torch-native attention backend for prefill and decode (its
    # allocation paths without triton kernels, mem_cache/allocation.py:72, :114-136)
    getters["attention_backends"] = lambda: ("torch_native", "torch_native")
    return getters


def stubs(policy: str) -> dict:
    import numpy
    import torch

    """Every module the real ones import that is not run: each name it gives a placeholder,
    raising if called (``importing.Placeholder``), unless ``OVERRIDES`` or sglang_scheduler's
    stubs (its settings) give it."""
    out: dict = {}
    for module in REAL:
        for name, names in imported(module).items():
            top = name.split(".")[0]
            if name in REAL or (top != "sglang" and (top in sys.stdlib_module_names or installed(top))):
                continue
            out.setdefault(name, {}).update(placeholders(*names))
    getters = runtime()
    lifted = {"sglang.srt.runtime_context": getters,
              "sglang.srt.disaggregation.utils": classes("sglang.srt.disaggregation.utils", "DisaggregationMode"),
              # a request without a watermark (its None path), SGLang's function from its source
              "sglang.srt.sampling.watermarking.core": functions(
                  PEER, "sglang.srt.sampling.watermarking.core", ("normalize_watermark_request",),
                  {"WatermarkRequestConfig": None, "Any": object, "Optional": None}),
              # its host-to-device helpers, from its source (on a CPU: copies within memory)
              "sglang.srt.utils.common": functions(
                  PEER, "sglang.srt.utils.common",
                  ("flatten_arrays_to_pinned_cpu", "flatten_arrays_to_int64_tensor", "async_h2d", "async_h2d_stack"),
                  {"np": numpy, "torch": torch, "is_pin_memory_available": lambda *args: False}),
              # the paged allocator's page counts, from their source (utils/common.py)
              "sglang.srt.utils": functions(PEER, "sglang.srt.utils.common", ("get_num_new_pages", "next_power_of_2"),
                                            {"torch": torch, "Optional": None}),
              # a health check's request is told by its rid, from its source
              "sglang.srt.managers.utils": functions(
                  PEER, "sglang.srt.managers.utils", ("is_health_check_generate_req",),
                  constants(PEER, "sglang.srt.constants", ("HEALTH_CHECK_RID_PREFIX",), {})),
              # the model's implementation is SGLang's own (not the transformers backend)
              "sglang.srt.model_loader.utils": dict(get_resolved_model_impl=lambda model_config: "sglang")}
    for given in (sglang_scheduler.stubs(policy), OVERRIDES, lifted):
        for name, names in given.items():
            if name not in REAL:
                out.setdefault(name, {}).update(names)
    return out


PEER = Peer(VERSION, REAL, {}, "tests/peers/sglang_engine.py", package="sglang", folder=FOLDER,
            name=f"SGLang {VERSION}")
SGLANG: dict = {}


def load(policy: str = "fcfs") -> types.SimpleNamespace:
    if policy in SGLANG:
        return SGLANG[policy]
    # torch.compile's backend resolved before the triton placeholder is in sys.modules (while a
    # peer is active): resolving it imports inductor, which would take the placeholder for triton
    # (the penalizers' @torch.compile, sampling/penaltylib/repetition_penalty.py:10, resolves
    # get_compiler_backend()'s "eager" while importing)
    from torch._dynamo.backends.registry import lookup_backend

    lookup_backend("eager")

    peer = Peer(VERSION, REAL, stubs(policy), "tests/peers/sglang_engine.py", package="sglang", folder=FOLDER,
                name=f"SGLang {VERSION}")
    with peer.active():
        modules = {name: importlib.import_module(name) for name in REAL}
    getters = peer.stubs["sglang.srt.runtime_context"]
    getters["get_schedule"]().schedule_policy = policy
    import torch

    result_class = classes("sglang.srt.managers.utils", "GenerationBatchResult",
                           namespace={"dataclasses": dataclasses, "torch": torch})["GenerationBatchResult"]
    SGLANG[policy] = types.SimpleNamespace(peer=peer, modules=modules, schedule=getters["get_schedule"](),
                                           parallel=getters["get_parallel"](), result_class=result_class)
    return SGLANG[policy]


def context_len(workload) -> int:
    """The model's context: ``Workload.config``'s max_seq_len (pagesim is given the same)."""
    return min(32768, workload.pool_tokens)


# -- the fakes -------------------------------------------------------------------------------------
def ModelConfig(context_len: int) -> Settings:
    """``configs/model_config.py``'s ``ModelConfig`` as the scheduling code reads it: a text-only
    generation model (Llama-3.1-8B's shapes do not enter scheduling)."""
    return Settings("model_config", context_len=context_len, is_multimodal=False, is_generation=True,
                    is_encoder_decoder=False, vocab_size=128256, hf_eos_token_id=None, think_end_ids=None,
                    self_opened_think_start_ids=None)  # not a reasoning model (model_config.py:900)


class Worker:
    """The model worker (``TpModelWorker``) and its runner, as the scheduler reads them: no
    attention backend with a tile size (``prefill_tile_block_m`` 64, scheduler.py:4144-4148), no
    SWA. Its forward is the driver's (``forward``)."""

    def __init__(self, scheduler):
        self.model_runner = Settings("model_runner", attn_backend=types.SimpleNamespace(), prefill_aware_swa=False)


# -- the scheduler --------------------------------------------------------------------------------
def build(sglang, workload):
    """``Scheduler`` made without its ``__init__`` (module docstring: why), its attributes set as
    ``__init__`` sets them, by its own init helpers where they run here."""
    import torch

    m = sglang.modules
    Scheduler = m["sglang.srt.managers.scheduler"].Scheduler
    s = Scheduler.__new__(Scheduler)
    sglang.schedule.__dict__.update(chunked_prefill_size=workload.chunk_budget, page_size=workload.page_size,
                                    max_prefill_tokens=workload.max_prefill_tokens,
                                    max_running_requests=workload.max_running_requests)
    # init_model_worker's default (scheduler.py:1229-1235): max_running_requests // pp_size
    sglang.parallel.__dict__.update(pp_max_micro_batch_size=workload.max_running_requests)
    page = workload.page_size
    # __init__'s "Parse args" (scheduler.py:483-529), the settings as runtime() gives them
    s.forward_ct = 0
    s.processed_tokens_counter = 0
    s.cur_batch_for_debug = None
    s.schedule_policy = workload.policy
    s.enable_priority_scheduling = False
    s.abort_on_priority_when_disabled = False
    s.schedule_low_priority_values_first = False
    s.priority_scheduling_preemption_threshold = 10
    s.enable_lora = s.enable_lora_overlap_loading = False
    s.enable_overlap = s.enable_overlap_mlx = False  # disable_overlap_schedule: pagesim models no overlap
    s.enable_pdmux = False
    s.skip_tokenizer_init = True
    s.spec_algorithm = m["sglang.srt.speculative.spec_info"].SpeculativeAlgorithm.NONE \
        if "sglang.srt.speculative.spec_info" in m else None
    s.page_size = page
    s.enable_hierarchical_cache = s.enable_lmcache = s.enable_session_radix_cache = False
    s.enable_hicache_storage = s.enable_unified_cache_external_linker = s.enable_decode_hicache = False
    s.enable_hisparse = s.enable_unified_memory = False
    s.attn_dp_enabled = False
    # the pools (kv_cache_configurator.py: ReqToTokenPool of max_running_requests rows, :3126-3129;
    # TokenToKVPoolAllocator at page 1, PagedTokenToKVPoolAllocator else, :2914-2936)
    memory_pool = m["sglang.srt.mem_cache.memory_pool"]
    allocator = m["sglang.srt.mem_cache.allocator"]
    context = context_len(workload)
    s.req_to_token_pool = memory_pool.ReqToTokenPool(size=workload.max_running_requests, max_context_len=context + 4,
                                                     device="cpu", enable_memory_saver=False)
    if page == 1:
        s.token_to_kv_pool_allocator = allocator.TokenToKVPoolAllocator(
            workload.pool_tokens, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    else:
        s.token_to_kv_pool_allocator = allocator.PagedTokenToKVPoolAllocator(
            workload.pool_tokens, page_size=page, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False)
    # the prefix cache (kv_cache_builder: RadixCache over the pools), its access stamps from a
    # counter (sglang_scheduler.Engine: LRU's order without ties at the timer's resolution)
    radix = m["sglang.srt.mem_cache.radix_cache"]
    radix.time = types.SimpleNamespace(monotonic=sglang_radix.Counter(), perf_counter=time.perf_counter)
    params = m["sglang.srt.mem_cache.cache_init_params"].CacheInitParams(
        disable=False, req_to_token_pool=s.req_to_token_pool, token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        page_size=page)
    s.tree_cache = radix.RadixCache(params)
    s.disable_radix_cache = False
    s.is_hybrid_swa = s.is_hybrid_ssm = False
    s.sliding_window_size = None  # build_kv_cache's result for a full-attention model
    s.kv_shard_widening = 1
    s.hisparse_coordinator = None
    s.decode_offload_manager = None
    s.draft_worker = None
    s.dllm_config = None
    s.require_mlp_sync = False
    s.model_config = ModelConfig(context_len=context_len(workload))
    s.is_generation = True
    s.disaggregation_mode = sys.modules["sglang.srt.disaggregation.utils"].DisaggregationMode.NULL
    # the model worker's report (init_model_worker, scheduler.py:1207-1220; tp_worker.py:550-584)
    s.max_total_num_tokens = workload.pool_tokens
    s.max_prefill_tokens = workload.max_prefill_tokens
    s.max_running_requests = workload.max_running_requests
    s.max_queued_requests = None
    s.max_req_len = min(context_len(workload) - 1, workload.pool_tokens - 1)
    s.max_req_input_len = s.max_req_len - 5
    s.device = "cpu"
    s.min_free_slots_delayer = None
    s.max_new_tokens_limit = None  # envs.SGLANG_MAX_NEW_TOKENS_LIMIT's default
    s.tp_worker = s.model_worker = Worker(s)
    # components left inert: no grammar (no constrained request), no load reporting, no beams
    s.grammar_manager = inert("GrammarManager", has_waiting_grammars=lambda self: False, grammar_queue=())()
    s.dllm_manager = inert("DllmManager", any_staging_reqs=lambda self: False)()
    s.load_inquirer = inert("SchedulerLoadInquirer", _get_num_pending_tokens=lambda self, **kwargs: 0,
                            get_loads=no_op)()
    s.ngram_embedding_manager = inert("NgramEmbeddingManager",
                                      prepare_for_forward=lambda self, batch, **kwargs: batch)()
    s.dp_attn_adapter = inert("SchedulerDPAttnAdapter",
                              maybe_prepare_mlp_sync_batch=lambda self, batch, need_sync=False: batch,
                              maybe_convert_decode_to_extend=lambda self, batch: batch)()
    s.truncation_align_size = None
    # observability, inert: metrics, the output to the tokenizer, load reports
    s.metrics_collector = None
    s.metrics_reporter = inert("SchedulerMetricsReporter", **METRICS_REPORTER)()
    s.output_streamer = inert("SchedulerOutputStreamer", stream_output=no_op)()
    s.load_publisher = inert("SchedulerLoadPublisher", publish_load_stat=no_op)()
    s.load_snapshot_writer = None
    s.enable_fpm = False
    s.future_map = None  # the overlap relay's (init_overlap, :1681): none without overlap
    s.return_health_check_ipcs = collections.deque()
    # init_load_inquirer's step counters (:2580-2590), which process_batch_result keeps for load
    # reports (_record_step_counters)
    s.total_prefill_uncached_tokens = s.total_prefill_busy_us = 0
    s.decode_moment_totals = [0.0] * 6
    s._prev_step = s._prev_prefill_end_ts = s._pause_started_at = None
    s._sched_idled = False
    s._pause_intervals = collections.deque()
    # SGLang's own init helpers
    s.init_running_status()
    s.init_chunked_prefill()
    s.maybe_init_dynamic_chunk_sizer()
    s.init_schedule_policy()
    s.init_batch_result_processor()
    return s


def request(sglang, index: int, prompt, max_new_tokens: int, ignore_eos: bool):
    """SGLang's own ``Req`` with its ``SamplingParams``, as ``handle_generate_request`` makes it
    from a tokenized request (scheduler.py:2943): ``max_new_tokens`` the trace's output."""
    m = sglang.modules
    params = m["sglang.srt.sampling.sampling_params"].SamplingParams(max_new_tokens=max_new_tokens,
                                                                     ignore_eos=ignore_eos)
    params.normalize(None)  # as the tokenizer manager does (tokenizer_manager.py:1566), tokenizer skipped
    req = m["sglang.srt.managers.schedule_batch"].Req(f"r{index:06d}", "", prompt, params)
    req.index = index
    return req


#: a sampled token's id: the request's own token (negative in ``sglang_radix.Tokens``) made
#: non-negative, above every named token's, as ``Req.update_finish_state`` takes a negative id
#: for a NaN (schedule_batch.py:1977-1991); the requests carry no ``vocab_size`` (unbounded)
OWN_TOKENS = 1 << 62


class Forward:
    """The model's forward pass (``run_batch``'s place, scheduler.py:4614): one next token per
    request that completes its prompt or decodes, the request's own (``sglang_radix.Tokens``:
    a generated token is nobody else's, as in pagesim's tree, as ``sglang_scheduler.Engine``
    samples it), as the ``GenerationBatchResult`` the processor reads; a middle chunk's token is
    sampled and dropped (process_batch_result_prefill, batch_result_processor.py:426-431)."""

    def __init__(self, sglang, tokens):
        self.result_class = sglang.result_class
        self.tokens = tokens

    def __call__(self, s, batch):
        import torch

        s.forward_ct += 1  # run_batch :4621-4629
        batch.forward_iter = s.forward_ct
        batch.launch_ts = time.monotonic()
        batch.after_idle_gap = s._sched_idled
        s._sched_idled = False
        ids = []
        for req in batch.reqs:
            sequence = self.tokens.of(req.index)
            position = min(len(req.origin_input_ids) + len(req.output_ids), len(sequence) - 1)
            ids.append(OWN_TOKENS - int(sequence[position]))  # an own token is negative (Tokens)
        return self.result_class(next_token_ids=torch.tensor(ids, dtype=torch.int64), can_run_cuda_graph=False)


def drive(sglang, workload, trace, max_steps: int = 200_000) -> list:
    """``event_loop_normal`` (scheduler.py:2026-2058) over ``trace``: the arrivals join the queue
    (``_add_request_to_queue``) before a step, ``get_next_batch_to_run`` plans it, the fake
    ``Forward`` runs it and SGLang's ``process_batch_result`` takes its result; an idle step
    resets the ratio where the scheduler is fully idle (``on_idle``, :5254, :5318)."""
    s = build(sglang, workload)
    tokens = sglang_radix.Tokens(trace)
    forward = Forward(sglang, tokens)
    requests = [request(sglang, i, tokens.of(i)[:int(tokens.prompt[i])], int(tokens.output[i]), workload.ignore_eos)
                for i in range(len(trace))]
    for req in requests:
        s.init_req_max_new_tokens(req)
    arrivals = trace["arrival_s"].tolist()
    pending = sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i))
    steps: list = []
    now, idle = 0.0, 0
    while True:  # until nothing runs, waits or is to arrive
        if len(steps) >= max_steps:
            raise RuntimeError(f"{workload.name}: SGLang's side ran past {max_steps} steps")
        while pending and arrivals[pending[0]] <= now:
            s._add_request_to_queue(requests[pending.pop(0)])
        # who may be retracted: the running batch and the last prefill's requests, merged into it
        candidates = s.running_batch.reqs + (s.last_batch.reqs if s.last_batch is not None else [])
        retractions = {req.index: req.retraction_count for req in candidates}
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if not batch:
            if s.is_fully_idle():  # on_idle: not fully idle returns before the reset (:5254-5272)
                s.new_token_ratio_tracker.reset()  # :5318
            s.last_batch = None  # :2057
            idle += 1
            if idle < 2:
                continue  # the loop spins on (the first idle pass still saw the last batch)
            if not pending:
                if s.waiting_queue:
                    raise RuntimeError(f"{workload.name}: SGLang scheduled nothing at {now} with "
                                       f"{len(s.waiting_queue)} waiting and nothing to arrive")
                leaked(s, workload)
                break
            now = arrivals[pending[0]]  # an idle engine spins until the next arrival
            continue
        idle = 0
        prefill = batch.forward_mode.is_extend()
        scheduled = {req.index: (length if prefill else 1)
                     for req, length in zip(batch.reqs, batch.extend_lens if prefill else batch.reqs)}
        retracted = frozenset(index for index, count in retractions.items()
                              if requests[index].retraction_count > count)
        ratio = s.new_token_ratio_tracker.current
        free = s.token_to_kv_pool_allocator.available_size()
        evictable = s.tree_cache.evictable_size()
        done = {req.index for req in batch.reqs if req.finished()}
        result = forward(s, batch)
        s.process_batch_result(batch, result)
        finished = frozenset(req.index for req in batch.reqs if req.finished() and req.index not in done)
        steps.append(sglang_scheduler.SglangStep(now, "prefill" if prefill else "decode", scheduled, retracted,
                                                 ratio, free, evictable, finished))
        s.last_batch = batch
        now += STEP_S
    return steps


def leaked(s, workload):
    """``on_idle``'s leak checks (scheduler.py:5290-5296), transcribed for the full-attention pool
    (scheduler_components/invariant_checker.py:97-150, :428-450): once all is done, the pool holds
    the tree's tokens alone, none of them locked, and every request row is free."""
    free = s.token_to_kv_pool_allocator.available_size()
    evictable, protected = s.tree_cache.evictable_size(), s.tree_cache.protected_size()
    rows = s.req_to_token_pool
    if free + evictable != workload.pool_tokens or protected or len(rows.free_slots) != rows.size:
        raise RuntimeError(f"{workload.name}: SGLang's pools leak once all is done: {free} free, {evictable} "
                           f"evictable, {protected} protected of {workload.pool_tokens} tokens; "
                           f"{len(rows.free_slots)} of {rows.size} rows free")


def run_sglang(workload) -> list:
    """SGLang's side over ``workload``: its steps (``drive``)."""
    import torch

    sglang = load(workload.policy)
    quiet = logging.getLogger("sglang")  # a retraction's warning (scheduler.py:4537), once per retraction
    level, threads = quiet.level, torch.get_num_threads()
    quiet.setLevel(logging.ERROR)
    torch.set_num_threads(1)  # the tensors are a batch's few hundred ids: threads only cost
    try:
        with sglang.peer.active():
            return drive(sglang, workload, workload.trace())
    finally:
        quiet.setLevel(level)
        torch.set_num_threads(threads)


def run(workload) -> sglang_scheduler.Comparison:
    """Both sides over ``workload``: pagesim's as ``sglang_scheduler`` records it."""
    return sglang_scheduler.Comparison(workload, sglang_scheduler.run_pagesim(workload), run_sglang(workload))


# -- the workloads ---------------------------------------------------------------------------------
#: the test's sample (tests/peers/test_sglang_engine_peer.py): the stub peer's hand workloads, its
#: bursts that fill the admission budget and its pool pressure, and two of the issue's shape
#: (large()); under PAGESIM_PEERS_FULL (suite.py) the test runs every workload
SAMPLE = ("admit-all", "max-prefill", "chunked", "chunked-p16", "retract", "retract-ignore-eos", "shared-prefix",
          "burst-p1", "burst-p1-ignore-eos", "burst-p16", "burst-p16-ignore-eos", "pressure-p1",
          "burst-1000-p1-ignore-eos", "burst-1000-p16", "refill-after-empty")


def large() -> dict:
    """Bursts of the issue's shape (issue 81): 1,000 ShareGPT-like requests at once
    (``sglang_scheduler.burst``: about 394,000 prompt and output tokens) into a pool of 200,000
    tokens, about half of them; chunks of 4,096, pages of 1 and 16, with and without
    ``ignore_eos``: 1,388 to 1,517 steps, up to 597 requests decoding at once."""
    out = [sglang_scheduler.Workload(f"burst-1000-p{page}{'-ignore-eos' * ignore_eos}",
                                     sglang_scheduler.burst(81, 1000), pool_tokens=200_000, page_size=page,
                                     chunk_budget=4096, ignore_eos=ignore_eos,
                                     description=f"1,000 requests at once into a pool of 200,000 tokens, page "
                                                 f"{page}, {'with' if ignore_eos else 'without'} ignore_eos")
           for page in (1, 16) for ignore_eos in (False, True)]
    return {w.name: w for w in out}


#: a hand workload of the rule a random burst found (hunting beside the real Scheduler): a pass
#: that ran short of memory with nothing running flags the empty running batch full, and the
#: prefill batch that replaces it next step (scheduler.py:3957-3958) carries its own flag, unset
REFILL = sglang_scheduler.Workload(
    "refill-after-empty", sglang_scheduler.hand([(0, 10, 100, ())] * 4), pool_tokens=300,
    description="4 requests of 10 + 100 at once in 300 tokens: two admitted, charged their outputs "
                "whole; next step, charged at the ratio, they leave room for a third")

#: every workload: sglang_scheduler's, the large bursts and REFILL
WORKLOADS = {**sglang_scheduler.WORKLOADS, **large(), REFILL.name: REFILL}
TESTED = suite.sample(SAMPLE, tuple(WORKLOADS))


def main(argv=None) -> int:
    """``python -m tests.peers.sglang_engine [NAME ...] [--all]``: each workload on both sides,
    a line each; ``--all``: every ``sglang_scheduler`` workload and the large bursts; none named:
    the test's. Exit 1 where one diverges."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.peers.sglang_engine")
    parser.add_argument("names", nargs="*", help="workloads (sglang_engine.WORKLOADS)")
    parser.add_argument("--all", action="store_true", help="every workload, the large bursts too")
    args = parser.parse_args(argv)
    known = WORKLOADS
    unknown = [name for name in args.names if name not in known]
    if unknown:
        parser.exit(2, f"no workload named {', '.join(unknown)} (sglang_engine.WORKLOADS)\n")
    names = list(known) if args.all else (args.names or list(SAMPLE))
    diverged = 0
    for name in names:
        workload = known[name]
        if workload.needs is not None and not workload.needs.exists():
            print(f"{name}: skipped, {workload.needs.name} is not here")
            continue
        started = time.perf_counter()
        comparison = run(workload)
        seconds = time.perf_counter() - started
        same = comparison.first is None
        diverged += not same
        print(f"{name}: {comparison.identical} of {len(comparison.ours)} pagesim steps and "
              f"{len(comparison.theirs)} SGLang's identical{'' if same else ', DIVERGES'} ({seconds:.1f} s)")
        if not same:
            print(comparison.describe())
    return 1 if diverged else 0


if __name__ == "__main__":
    sys.exit(main())
