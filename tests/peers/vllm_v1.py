"""vLLM 0.33.0's own v1 ``Scheduler``, run on CPU step by step beside pagesim.

Executed from vLLM's source (fetched by ``python -m tests.peers.fetch``): the scheduler
(``v1/core/sched/scheduler.py``, ``request_queue.py``, ``output.py``, ``utils.py``), the KV cache
manager, its coordinator, single-type managers and block pool (``v1/core/``), the request
(``v1/request.py``), ``ModelRunnerOutput`` (``v1/outputs.py``) and the KV cache specs
(``v1/kv_cache_interface.py``). Every other vLLM module they import is a stub (``STUBS``): the
names it must provide, most of them placeholders that raise if the run ever calls them, so a
stub can never decide anything silently. The engine's settings are ``Settings`` objects that
raise on any setting not given here: each one the scheduler reads is written below with
vLLM's default for it (config/scheduler.py, config/cache.py).

Each step: the requests that have arrived by the step's start (pagesim's clock) are added,
``schedule()`` runs, the step's record is taken, and a ``ModelRunnerOutput`` hands one token
to every request whose scheduled tokens reach the end of its sequence (a prompt's last chunk,
or a decode), as the GPU would; ``update_from_output`` then stops a request at its
``max_tokens`` (sched/utils.py:114-117, ``check_stop``).

With speculative decoding (a workload's ``num_speculative_tokens``) the scheduler gets a
``SpeculativeConfig`` whose rules are vLLM's own methods (``SpeculativeSettings``,
``EngineSettings``); a verification returns the drafts pagesim's run accepted and one token
more, and after each step the engine's drafter proposes K drafts for every request of the step
(``update_draft_token_ids``, as ``EngineCore.post_step`` does): ``drive``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import pickle
import types

from tests.peers.importing import Peer, functions, members, placeholders
from tests.peers.workloads import FULL, MAMBA, SLIDING, STEP_S, TOKEN, Step, Workload, sampled_token

# vLLM's modules executed as they are
REAL = (
    "vllm.utils.math_utils",
    "vllm.v1.kv_cache_layout", "vllm.v1.kv_cache_spec_registry", "vllm.v1.kv_cache_interface",
    "vllm.v1.request", "vllm.v1.outputs",
    "vllm.v1.core.kv_cache_metrics", "vllm.v1.core.kv_cache_utils", "vllm.v1.core.block_pool",
    "vllm.v1.core.kv_cache_config_builder", "vllm.v1.core.kv_cache_planning",
    "vllm.v1.core.single_type_kv_cache_manager", "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_manager", "vllm.v1.core.encoder_cache_manager",
    "vllm.v1.core.sched.output", "vllm.v1.core.sched.utils", "vllm.v1.core.sched.request_queue",
    "vllm.v1.core.sched.interface", "vllm.v1.core.sched.scheduler",
)


class Anything:
    """A record that takes any fields: the engine-core outputs and events the scheduler builds
    for the front end (``vllm/v1/engine``: msgspec structs), which the peer never reads."""

    def __init__(self, *args, **kwargs):
        self.__dict__.update(kwargs)

    @classmethod
    def new_event(cls, *args, **kwargs):
        return cls()


class Sink(Anything):
    """Statistics the scheduler keeps for the front end (``PrefillStats``): every call a no-op."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class ConstantList:
    """``vllm.v1.utils.ConstantList``: a read-only view of a list that grows under it."""

    def __init__(self, items):
        self.items = items

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def copy(self):
        return list(self.items)


class NoStructuredOutput:
    """``StructuredOutputRequest.from_sampling_params``: no grammar for these requests."""

    @staticmethod
    def from_sampling_params(sampling_params):
        return None


def no_mm_features(*args, **kwargs):
    return []  # multimodal features in a block's window: none (text-only requests)


def prompt_length(prompt_token_ids, prompt_embeds):
    return len(prompt_token_ids)


class OnceLogger(logging.LoggerAdapter):
    """vLLM's logger: a standard one with its ``*_once`` methods (vllm/logger.py), logging each."""

    def info_once(self, msg, *args, **kwargs):
        self.info(msg, *args)

    def warning_once(self, msg, *args, **kwargs):
        self.warning(msg, *args)

    def debug_once(self, msg, *args, **kwargs):
        self.debug(msg, *args)


# module -> {name: value, or None for a Placeholder}: what the real modules import
STUBS = {
    "vllm.logger": {"init_logger": lambda name: OnceLogger(logging.getLogger(name))},
    "vllm.envs": {},
    # no current engine config: kv_cache_spec_registry.py:49-56 then registers vLLM's built-in specs
    "vllm.config": {**placeholders("VllmConfig", "KVEventsConfig", "SpeculativeConfig"),
                    "get_current_vllm_config_or_none": lambda: None},
    "vllm.config.ec_manager_config": placeholders("EncoderCacheManagerMetadata"),
    "vllm.compilation.cuda_graph": placeholders("CUDAGraphStat"),
    "vllm.distributed.aux_output_connector.connector": placeholders("AuxOutputSchedulerConnector"),
    "vllm.distributed.ec_transfer.ec_connector.base": placeholders(
        "ECConnectorBase", "ECConnectorMetadata", "ECConnectorRole"),
    "vllm.distributed.ec_transfer.ec_connector.factory": placeholders("ECConnectorFactory"),
    "vllm.distributed.ec_transfer.ec_connector.metrics": placeholders("ECConnectorStats"),
    # no KV events are configured: the publisher is a no-op (EventPublisherFactory.create)
    "vllm.distributed.kv_events": {**placeholders(
        "AllBlocksCleared", "BlockRemoved", "BlockStored", "KVCacheEvent", "KVEventBatch"),
        "MEDIUM_GPU": "GPU", "MEDIUM_CPU": "CPU",
        "EventPublisherFactory": type("EventPublisherFactory", (), {"create": staticmethod(
            lambda *args, **kwargs: types.SimpleNamespace(publish=lambda *a: None, shutdown=lambda: None))})},
    "vllm.distributed.kv_transfer.kv_connector.factory": placeholders("KVConnectorFactory"),
    "vllm.distributed.kv_transfer.kv_connector.v1": placeholders(
        "KVConnectorBase_V1", "KVConnectorRole", "SupportsHMA"),
    "vllm.distributed.kv_transfer.kv_connector.v1.base": placeholders("KVConnectorMetadata"),
    "vllm.distributed.kv_transfer.kv_connector.v1.metrics": placeholders("KVConnectorStats"),
    "vllm.multimodal": placeholders("MultiModalRegistry", "MULTIMODAL_REGISTRY"),
    "vllm.multimodal.encoder_budget": placeholders("MultiModalBudget"),
    "vllm.multimodal.inputs": placeholders("MultiModalKwargsItem", "MultiModalFeatureSpec"),
    "vllm.multimodal.utils": {"get_mm_features_in_window": no_mm_features,
                              "strip_covered_mm_data": no_mm_features},
    "vllm.outputs": placeholders("RequestError"),
    # CUDA platform detection, skipped: a platform may add its own KV cache specs
    # (single_type_kv_cache_manager.py:2728-2730); none here
    "vllm.platforms": {"current_platform": types.SimpleNamespace(register_custom_kv_cache_specs=lambda config: None)},
    "vllm.utils": {"length_from_prompt_token_ids_or_embeds": prompt_length},
    "vllm.utils.hashing": placeholders("xxhash", "xxhash_cbor"),  # the peer's own block_hash is used
    # get_dtype_size: compiled from torch_utils.py below (the module registers custom ops)
    "vllm.utils.torch_utils": {"PIN_MEMORY": False},
    "vllm.utils.mem_utils": {},  # format_gib (a refusal's message): compiled from mem_utils.py below
    "vllm.utils.import_utils": placeholders("resolve_obj_by_qualname"),  # a platform's config builder: none
    # HiSparse (sparse MLA offload): its grouping, compiled from layout.py below, finds no MLA
    # layer and returns None; the rest is never reached (no hisparse_config)
    "vllm.v1.hisparse.layout": placeholders("get_hisparse_host_pool_bytes", "get_hisparse_kv_cache_config"),
    # a backend's kernel block size (MultipleOf): none is given, a spec's stride alignment is 1
    "vllm.v1.attention.backend": placeholders("MultipleOf"),
    "vllm.v1.attention.backends.registry": placeholders("MambaAttentionBackendEnum"),
    "vllm.v1.engine": {"EngineCoreOutput": Anything, "EngineCoreOutputs": Anything, "EngineCoreEvent": Anything,
                       **placeholders("EngineCoreEventType", "EngineCoreRequest", "FinishReason")},
    "vllm.v1.hisparse.block_pool": placeholders("SharedEventQueueBlockPool"),
    "vllm.v1.kv_hints": placeholders("KvHintsEnvelope"),
    "vllm.v1.metrics.perf": placeholders("ModelMetrics", "PerfStats"),
    # no KV connector: no async KV fetch stages to count (scheduler.py:500)
    "vllm.v1.metrics.stats": {
        "PrefillStats": Sink, "KV_FETCH_STAGES": (), "KV_FETCH_COMPLETED_WAITING": "done",
        "KV_FETCH_IN_PROGRESS": "loading", "KV_FETCH_WAITING_TO_START": "queued",
        **placeholders("KVCacheEvictionEvent", "PrefixCacheStats", "SchedulerStats", "RequestSpecDecodeMetrics")},
    "vllm.v1.spec_decode.dynamic.utils": placeholders("build_dynamic_sd_schedule_lookup"),
    "vllm.v1.spec_decode.metrics": placeholders("SpecDecodingStats"),
    "vllm.v1.structured_output": placeholders("StructuredOutputManager"),
    "vllm.v1.structured_output.request": {"StructuredOutputRequest": NoStructuredOutput},
    "vllm.v1.structured_output.utils": placeholders("strip_speculative_padding"),
    "vllm.v1.utils": {"record_function_or_nullcontext": lambda name: contextlib.nullcontext(),
                      **placeholders("tensor_data"), "ConstantList": ConstantList},
    "vllm.pooling_params": placeholders("PoolingParams"),
    "vllm.sampling_params": placeholders("SamplingParams", "RepetitionDetectionParams"),
}
PEER = Peer("0.33.0", REAL, STUBS, "tests/peers/vllm_v1.py")


def compile_stubs() -> None:
    """The stubs that are vLLM's own functions, compiled from their modules' source (which a
    CPU run cannot import): the bytes of a KV element (torch_utils.py:347-349: a page's size,
    ``AttentionSpec.page_size_bytes``), HiSparse's grouping (hisparse/layout.py:48-57), and the
    GiB a refusal to start prints (mem_utils.py:30-31)."""
    import torch

    STUBS["vllm.utils.torch_utils"].update(functions(PEER, "vllm.utils.torch_utils", ("get_dtype_size",),
                                                     {"torch": torch}))
    STUBS["vllm.v1.hisparse.layout"].update(functions(PEER, "vllm.v1.hisparse.layout",
                                                      ("get_hisparse_kv_cache_groups",), {}))
    STUBS["vllm.utils.mem_utils"].update(functions(PEER, "vllm.utils.mem_utils", ("format_gib",),
                                                   {"GiB_bytes": 1 << 30}))  # mem_constants.py


def load(peer: Peer | None = None) -> types.SimpleNamespace:
    """vLLM 0.33.0's scheduler and what drives it, imported from the cache folder (``peer``: a
    driver's larger set of vLLM's modules around the same scheduler, vllm_offload.py)."""
    if PEER.fetched() and "get_dtype_size" not in STUBS["vllm.utils.torch_utils"]:
        compile_stubs()
    with (peer or PEER).active():
        import torch
        from vllm.v1.core.kv_cache_planning import (_get_kv_cache_bytes_per_block, check_enough_kv_cache_memory,
                                                    get_kv_cache_config_from_groups, get_kv_cache_groups)
        from vllm.v1.core.kv_cache_utils import (get_group_id, get_request_block_hasher, init_none_hash,
                                                 resolve_kv_cache_block_sizes)
        from vllm.v1.kv_cache_interface import MambaSpec, SlidingWindowSpec
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
        from vllm.v1.request import Request
    return types.SimpleNamespace(Scheduler=Scheduler, FullAttentionSpec=FullAttentionSpec,
                                 KVCacheConfig=KVCacheConfig, KVCacheGroupSpec=KVCacheGroupSpec,
                                 ModelRunnerOutput=ModelRunnerOutput, DraftTokenIds=DraftTokenIds, Request=Request,
                                 init_none_hash=init_none_hash, get_request_block_hasher=get_request_block_hasher,
                                 float16=torch.float16, SlidingWindowSpec=SlidingWindowSpec, MambaSpec=MambaSpec,
                                 get_kv_cache_groups=get_kv_cache_groups,
                                 check_enough_kv_cache_memory=check_enough_kv_cache_memory,
                                 get_kv_cache_config_from_groups=get_kv_cache_config_from_groups,
                                 bytes_per_block=_get_kv_cache_bytes_per_block, KVCacheLayout=KVCacheLayout,
                                 resolve_kv_cache_block_sizes=resolve_kv_cache_block_sizes, get_group_id=get_group_id)


class Settings:
    """One of vLLM's config objects, holding only the settings given: reading any other raises,
    so every setting the scheduler reads is one written in ``build`` (with vLLM's default)."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def __getattr__(self, name):
        raise AttributeError(f"vLLM read the setting {name!r}, which the peer does not give (vllm_v1.build)")


class EngineSettings(Settings):
    """``VllmConfig``: the settings given, and the properties the scheduler reads that vLLM
    derives from the speculative configuration, compiled from vLLM's own source
    (config/vllm.py:612-693: the drafts per step, the lookahead slots, the prefill lookahead,
    the block hashes' lookahead)."""


class SpeculativeSettings(Settings):
    """``SpeculativeConfig`` (config/speculative.py): its fields as given, and its methods the
    scheduler and ``EngineSettings`` call, compiled from vLLM's source: ``use_eagle`` (EAGLE and
    MTP: the lookahead slots), the draft model's input slots (``max_num_new_slots_for_drafting``,
    :2057-2098), the trailing-block drop of EAGLE and MTP under prefix caching."""


for settings, module, name, names in (
        (EngineSettings, "vllm.config.vllm", "VllmConfig", (
            "num_speculative_tokens", "num_lookahead_tokens", "num_prefill_lookahead_tokens",
            "num_hash_lookahead_tokens")),
        (SpeculativeSettings, "vllm.config.speculative", "SpeculativeConfig", (
            "max_num_new_slots_for_drafting", "use_eagle", "needs_eagle_block_drop", "use_eagle_block_drop",
            "use_dflash", "use_dspark", "uses_draft_model", "use_multi_module_mtp"))):
    # not fetched: nothing to compile, and driver_or_skip skips the peer's tests
    for member_name, member in (members(PEER, module, name, names) if PEER.fetched() else {}).items():
        setattr(settings, member_name, member)


#: pagesim's --speculative-method -> vLLM's ``SpeculativeConfig.method``
METHODS = {"ngram": "ngram", "eagle": "eagle", "mtp": "mtp", "draft-model": "draft_model"}


def speculative_config(workload: Workload) -> SpeculativeSettings | None:
    """vLLM's ``SpeculativeConfig`` for ``workload``'s drafts (None: no speculation), with its
    defaults (config/speculative.py) for the fields the rules read: no dynamic K, no parallel
    drafting, EAGLE's block drop and lookahead hashes as configured by default. No draft model
    configuration: a multi-module MTP drafter is not driven (``use_multi_module_mtp`` False)."""
    if not workload.num_speculative_tokens:
        return None
    return SpeculativeSettings(method=METHODS[workload.speculative_method],
                               num_speculative_tokens=workload.num_speculative_tokens,
                               num_speculative_tokens_per_batch_size=None, parallel_drafting=False,
                               disable_eagle_block_drop=False, disable_lookahead_block_hashes=False,
                               draft_model_config=None)


def block_hash(obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj)).digest()


def mamba_cache_mode(workload: Workload) -> str:
    """vLLM's Mamba cache mode for ``workload``: "align" for a Mamba hybrid with prefix caching
    on (models/config.py:760-775 turns it on with prefix caching), else "none"."""
    has_mamba = workload.layers is not None and MAMBA in workload.layers.kinds
    return "align" if has_mamba and workload.prefix_caching else "none"


def build(vllm, workload: Workload, configure=None):
    """A ``Scheduler`` over ``workload``'s pool of ``num_blocks`` blocks (plus vLLM's null block,
    which BlockPool keeps out of use: block_pool.py:191, ``null_block``): one full-attention
    group, or with ``workload.layers`` the groups vLLM makes of them (``kv_cache_config``).
    ``configure(vllm_config)``: a driver's settings added before the scheduler is built (a KV
    connector's: vllm_offload.py)."""
    scheduler_config = Settings(  # config/scheduler.py:48-216's defaults, but the workload's limits and policy
        max_num_seqs=workload.max_num_seqs, max_num_batched_tokens=workload.max_num_batched_tokens,
        policy=workload.policy, max_num_active_seqs=None, max_num_scheduled_tokens=None,
        long_prefill_token_threshold=0, long_prefill_token_threshold_adaptive=False,
        enable_chunked_prefill=True, scheduler_reserve_full_isl=True, watermark=0.0,
        prefill_schedule_interval=1, async_scheduling=False,
        # as config/vllm.py:2228-2280 resolves it on a GPU without a KV connector: hybrid manager on
        disable_hybrid_kv_cache_manager=False)
    # the options sched/scheduler.py:98-497 reads to decide mamba, LoRA, spec decode, connectors: all off;
    # the layout: FlashAttention's NHD (config/cache.py:26-29), as the engine core resolves it
    cache_config = Settings(num_gpu_blocks=workload.num_blocks + 1, enable_prefix_caching=workload.prefix_caching,
                            enable_mamba_shared_prefix_checkpoint=False,
                            mamba_cache_mode=mamba_cache_mode(workload),
                            num_gpu_blocks_override=None, prefix_cache_retention_interval=0,
                            block_size=workload.block_size, prefix_match_unit=None,
                            get_resolved_kv_cache_layout=lambda: vllm.KVCacheLayout.LBNHC)
    model_config = Settings(max_model_len=workload.max_model_len, uses_mrope=False, is_encoder_decoder=False,
                            runner_type="generate", is_diffusion=False, supports_multimodal_inputs=False,
                            return_sampling_mask=False)
    vllm_config = EngineSettings(
        scheduler_config=scheduler_config, cache_config=cache_config, model_config=model_config,
        lora_config=None, kv_events_config=None, kv_transfer_config=None, ec_transfer_config=None,
        speculative_config=speculative_config(workload), diffusion_config=None, is_mm_encoder_only=False,
        use_v2_model_runner=False,
        parallel_config=Settings(data_parallel_index=0, data_parallel_size=1, pipeline_parallel_size=1,
                                 decode_context_parallel_size=1, prefill_context_parallel_size=1),
        observability_config=Settings(per_request_spec_decode_metrics="none", kv_cache_metrics=False),
        ec_manager_config=Settings(get_encoder_cache_manager_obj=lambda: None),
        aux_output_config=Settings(enabled=False),
        max_concurrent_batches=1,
        max_in_flight_tokens=workload.max_num_batched_tokens,  # config/vllm.py:601-609, one batch in flight
        attention_config=Settings(hisparse_config=None))
    if configure is not None:
        configure(vllm_config)
    kv_cache_config = kv_cache_config_of(vllm, vllm_config, workload)
    vllm.init_none_hash(block_hash)
    # no grammars: every token is accepted (scheduler.py:2432), every draft kept as proposed
    # (structured_output/__init__.py:362-365: a request without a grammar gets its drafts back)
    no_grammar = types.SimpleNamespace(accept_tokens=lambda request, token_ids: True,
                                       validate_tokens=lambda request, spec_tokens: spec_tokens)
    # the engine core's scheduler block size: the groups' LCM (a Mamba group's is max_model_len;
    # kv_cache_utils.py:816-873, v1/engine/core.py:176-186)
    block_size, _ = vllm.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    return vllm.Scheduler(vllm_config, kv_cache_config, structured_output_manager=no_grammar,
                          block_size=block_size, log_stats=False)


def layer_specs(vllm, workload: Workload) -> dict:
    """Each attention layer's KV cache spec, as the model runner reports them
    (``get_kv_cache_spec``): a full-attention or sliding-window layer of the workload's heads,
    head size and window, at 2 bytes an element; one full-attention layer without ``layers``."""
    layers = workload.layers
    if layers is None:
        return {"layer": vllm.FullAttentionSpec(block_size=workload.block_size, num_kv_heads=1, head_size=1,
                                                dtype=vllm.float16)}
    shape = dict(block_size=workload.block_size, num_kv_heads=layers.num_kv_heads, head_size=layers.head_size,
                 dtype=vllm.float16)
    # a Mamba layer (mamba/abstract.py:72-90): without prefix caching one block of max_model_len
    # tokens; in "align" mode (prefix caching on) blocks of the attention block size
    # (models/config.py:775-777, platforms/interface.py:1114-1115); its page padded to the
    # attention page (platforms/interface.py:1117-1128). A Mamba-1 layer exports no prefill
    # checkpoints (abstract.py:65-70); a gated-delta-net one on FlashInfer one a chunk
    # (Layers.prefill_checkpoint_alignment; qwen_gdn_linear_attn.py:739-750).
    page = vllm.FullAttentionSpec(**shape).page_size_bytes
    mode = mamba_cache_mode(workload)
    state = dict(shapes=((layers.mamba_inner, 3), (layers.mamba_inner, layers.mamba_state)),
                 dtypes=(vllm.float16, vllm.float16),
                 block_size=workload.block_size if mode == "align" else workload.max_model_len,
                 page_size_padded=page, mamba_cache_mode=mode,
                 num_speculative_blocks=workload.num_speculative_tokens)
    if mode == "align" and layers.prefill_checkpoint_alignment:
        state.update(num_prefill_checkpoint_blocks=1,
                     prefill_checkpoint_alignment=layers.prefill_checkpoint_alignment)
    return {f"model.layers.{k}.self_attn.attn": vllm.SlidingWindowSpec(**shape, sliding_window=layers.window)
            if kind == SLIDING else vllm.MambaSpec(**state) if kind == MAMBA else vllm.FullAttentionSpec(**shape)
            for k, kind in enumerate(layers.kinds)}


def kv_cache_config_of(vllm, vllm_config, workload: Workload):
    """vLLM's ``KVCacheConfig`` for the workload's layers: grouped by its own
    ``get_kv_cache_groups`` (kv_cache_planning.py:1113-1200), the pool sized by
    ``get_kv_cache_config_from_groups`` (:642-741) from the memory of ``num_blocks`` + 1 blocks
    of its own size (``_get_kv_cache_bytes_per_block``, :574-605), once its start check passes:
    the pool, less the null block, holds one ``max_model_len`` request, a sliding-window layer
    counting its admission cap (``check_enough_kv_cache_memory``, :151-184: ValueError if not,
    as the engine refuses to start)."""
    specs = layer_specs(vllm, workload)
    groups = vllm.get_kv_cache_groups(vllm_config, dict(specs))
    layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    memory = (workload.num_blocks + 1) * vllm.bytes_per_block(groups, layout)
    vllm.check_enough_kv_cache_memory(vllm_config, specs, memory)
    config = vllm.get_kv_cache_config_from_groups(vllm_config, groups, memory)
    assert config.num_blocks == workload.num_blocks + 1, (config.num_blocks, workload.num_blocks)
    return config


def groups_of(vllm, workload: Workload) -> tuple[list, int]:
    """vLLM's KV cache groups for ``workload.layers`` ((kind, layers) per group, in its order)
    and the bytes of one block of its pool."""
    vllm_config = Settings(scheduler_config=Settings(disable_hybrid_kv_cache_manager=False),
                           attention_config=Settings(hisparse_config=None),
                           cache_config=Settings(get_resolved_kv_cache_layout=lambda: vllm.KVCacheLayout.LBNHC))
    with PEER.active():
        groups = vllm.get_kv_cache_groups(vllm_config, layer_specs(vllm, workload))
        per_block = vllm.bytes_per_block(groups, vllm_config.cache_config.get_resolved_kv_cache_layout())
    return [(SLIDING if isinstance(g.kv_cache_spec, vllm.SlidingWindowSpec)
             else MAMBA if isinstance(g.kv_cache_spec, vllm.MambaSpec) else FULL, len(g.layer_names))
            for g in groups], per_block


def make_request(vllm, workload: Workload, index: int, hash_lookahead: int = 0):
    """Request ``index`` as the engine core makes it, its block hasher with the scheduler's
    ``num_hash_lookahead_tokens`` (``hash_lookahead``: engine/core.py:219-230; EAGLE's and MTP's
    hashes cover the token after each block, config/vllm.py:677-692)."""
    row = workload.requests[index]
    sampling = Settings(max_tokens=row.output, ignore_eos=True, eos_token_id=None, stop_token_ids=[],
                        min_tokens=0, repetition_detection=None, extra_args=None,
                        skip_reading_prefix_cache=None, num_logprobs=None)
    hasher = vllm.get_request_block_hasher(workload.block_size, block_hash, hash_lookahead) \
        if workload.prefix_caching else None
    return vllm.Request(request_id=request_id(index), prompt_token_ids=workload.prompt_token_ids(index),
                        sampling_params=sampling, pooling_params=None, arrival_time=row.arrival_s,
                        priority=row.priority, block_hasher=hasher)


def request_id(index: int) -> str:
    return f"r{index:06d}"  # zero-padded: vLLM's tie-break on request_id (request.py:357-368) is trace order


def run(workload: Workload, max_steps: int = 100_000, replay: list | None = None,
        pad_resumed: bool = True, observe=None) -> list[Step]:
    """vLLM's scheduler over ``workload``, one ``Step`` record per step that scheduled tokens. Time
    as pagesim's executor keeps it: each step lasts ``STEP_S``; an idle engine waits for the next
    arrival. With speculative decoding, ``replay``: pagesim's steps, whose drafts kept are the
    drafts vLLM's verifications accept (``drive``): both sides see the same acceptance.
    ``pad_resumed=False`` (a diagnosis: pagesim does not model the padding) turns off vLLM's
    padding of a resumed request's one token to 1 + K (scheduler.py:1308-1330, only without a
    dynamic-K lookup): its lookup is set to K at every batch size, which changes nothing else
    (the drafts the step asks for, :1710-1714, stay K). ``observe(step, scheduler, vllm)``: called
    with each step's record once it is scheduled, before its output (``compare --tables``)."""
    vllm = load()
    with PEER.active():
        return drive(vllm, workload, max_steps, replay or [], pad_resumed, observe)


class Lookups:
    """The prefix-cache hit of each request the scheduler looks up in a step: vLLM's own
    ``KVCacheManager.get_computed_blocks`` (kv_cache_manager.py:266-328), called through, its hit
    tokens kept. The scheduler looks a request up at each try to admit it with nothing computed
    (scheduler.py:1110-1127), and not again once admitted: a request scheduled in a step in which
    it was looked up was admitted with that lookup's hit."""

    def __init__(self, manager):
        self.found = {}
        self.lookup = manager.get_computed_blocks
        manager.get_computed_blocks = self  # the scheduler calls the manager's attribute

    def __call__(self, request, max_cache_hit_length=None):
        result = self.lookup(request, max_cache_hit_length)
        self.found[request.request_id] = result[1]
        return result

    def take(self, scheduled: dict) -> dict:
        """The step's admissions (trace index) and their hit tokens; the lookups forgotten."""
        hits = {int(rid[1:]): n for rid, n in self.found.items() if int(rid[1:]) in scheduled}
        self.found.clear()
        return hits


def cached_per_group(vllm, pool, group_ids: list) -> tuple:
    """The blocks registered under a hash in each group (``group_ids``' order): the entries of the
    pool's hash map (``BlockHashToBlockMap``, block_pool.py:36-128: a key's value is a block, or
    a dict of the copies cached under it), each key naming its group (kv_cache_utils.py:60-79)."""
    count = dict.fromkeys(group_ids, 0)
    for key, blocks in pool.cached_block_hash_to_block._cache.items():
        count[vllm.get_group_id(key)] += len(blocks) if isinstance(blocks, dict) else 1
    return tuple(count[g] for g in group_ids)


def block_tables(vllm, scheduler) -> list[str]:
    """Each running request's block table in each group (full groups first), a block by its id,
    ``*`` where it is registered under a hash, ``-`` for a null block (a sliding window's),
    and the free queue's length and its cached blocks (evictable)."""
    managers = sorted(scheduler.kv_cache_manager.coordinator.single_type_managers,
                      key=lambda m: isinstance(m.kv_cache_spec, vllm.SlidingWindowSpec))
    pool = scheduler.kv_cache_manager.block_pool
    lines = []
    for request in scheduler.running:
        row = []
        for manager in managers:
            kind = "sliding" if isinstance(manager.kv_cache_spec, vllm.SlidingWindowSpec) else "full"
            blocks = manager.req_to_blocks.get(request.request_id, ())
            shown = " ".join("-" if b.is_null else f"{b.block_id}{'*' if b.block_hash is not None else ''}"
                             for b in blocks)
            row.append(f"{kind}{manager.kv_cache_group_id} [{shown}]")
        lines.append(f"    r{int(request.request_id[1:])}: " + " ".join(row))
    evictable = sum(b.block_hash is not None for b in pool.blocks if b.ref_cnt == 0 and not b.is_null)
    lines.append(f"    free queue {pool.get_num_free_blocks()}, of them cached {evictable}")
    return lines


def sample(output, requests: dict, drafts: dict, ours: Step) -> tuple[list, list]:
    """The step's request ids and the tokens the GPU samples for each. A token for each request
    whose scheduled tokens reach its end (a prompt's last chunk, or a decode); a partial prefill
    chunk's sample is discarded (the scheduler marks it is_prefill_chunk: scheduler.py:1863-1865).
    A verification gives its accepted drafts and one token more (the rejection sampler's
    correction or bonus token): as many as pagesim's request kept in that step (``ours``, its
    record), but all of them for a request pagesim's step finished (its draws past its output
    length are not kept: vLLM must trim them, scheduler.py:2744-2770); at most the drafts vLLM
    scheduled (``drafts``; the two may differ after a divergence). Each request samples its own
    token (``workloads.sampled_token``)."""
    accepted = {i: n if i in ours.finished else min(ours.kept.get(i, 0), n) for i, n in drafts.items()}
    ids = list(output.num_scheduled_tokens)
    sampled = [[] if requests[int(rid[1:])].is_prefill_chunk
               else [sampled_token(int(rid[1:]))] * (1 + accepted.get(int(rid[1:]), 0)) for rid in ids]
    return ids, sampled


def propose(vllm, scheduler, workload: Workload, ids: list, sampled: list, drafts: dict) -> dict:
    """After ``update_from_output``: the drafts each verifying request kept (it trims a stopped
    request's tokens in place, scheduler.py:2758-2764), and, with speculation, the drafts the
    drafter proposes for each request of the step handed to the scheduler (engine/core.py:699-706,
    post_step; gpu_model_runner.py:4593-4597): K each here; it keeps them for a request that
    sampled and is not mid-prompt, and drops the finished' (scheduler.py:2862-2881). n-gram's
    proposer may find fewer (not modelled, sim/core/sched/speculative.py); its cut at max_model_len
    (ngram_proposer.py:228) never binds below the scheduler's (scheduler.py:852-857)."""
    kept = {int(rid[1:]): len(tokens) - 1 for rid, tokens in zip(ids, sampled) if int(rid[1:]) in drafts}
    if workload.num_speculative_tokens:
        k = workload.num_speculative_tokens
        scheduler.update_draft_token_ids(vllm.DraftTokenIds(ids, [[TOKEN] * k for _ in ids]))
    return kept


def drive(vllm, workload: Workload, max_steps: int, replay: list, pad_resumed: bool = True,
          observe=None) -> list[Step]:
    scheduler = build(vllm, workload)
    if not pad_resumed:
        scheduler.dynamic_sd_lookup = [workload.num_speculative_tokens] * (workload.max_num_seqs + 1)
    speculating = bool(workload.num_speculative_tokens)
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    # with several groups, the blocks each group holds for a request (its table less the null
    # blocks a sliding window left), full-attention groups first, each kind in vLLM's order
    sliding_last = sorted(managers, key=lambda m: (isinstance(m.kv_cache_spec, vllm.SlidingWindowSpec),
                                                   isinstance(m.kv_cache_spec, vllm.MambaSpec)))
    tables = [m.req_to_blocks for m in sliding_last]
    blocks_of = tables[0]  # an attention group's table: pagesim's num_blocks (a Mamba group's holds states)
    # prefix caching over several groups: each admission's hit tokens, and the blocks cached in
    # each group (the same order as the tables)
    lookups = Lookups(scheduler.kv_cache_manager) if workload.prefix_caching and workload.layers else None
    group_ids = [m.kv_cache_group_id for m in sliding_last]
    pool = scheduler.kv_cache_manager.block_pool
    requests = {}
    steps: list[Step] = []
    pending = sorted(range(len(workload.requests)), key=lambda i: (workload.requests[i].arrival_s, i))
    now = 0.0
    while (pending or scheduler.get_num_unfinished_requests()) and len(steps) < max_steps:
        while pending and workload.requests[pending[0]].arrival_s <= now:
            index = pending.pop(0)
            requests[index] = make_request(vllm, workload, index, scheduler.num_hash_lookahead_tokens)
            scheduler.add_request(requests[index])
        output = scheduler.schedule()
        if not output.num_scheduled_tokens:
            if not pending:
                raise RuntimeError(f"vLLM scheduled nothing at {now} with nothing left to arrive")
            now = workload.requests[pending[0]].arrival_s
            continue
        scheduled = {int(rid[1:]): n for rid, n in output.num_scheduled_tokens.items()}
        preempted = frozenset(int(rid[1:]) for rid in output.preempted_req_ids)
        free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        drafts = {int(rid[1:]): len(ids) for rid, ids in output.scheduled_spec_decode_tokens.items()}
        blocks = {int(r.request_id[1:]): len(blocks_of.get(r.request_id, ())) for r in scheduler.running} \
            if speculating else {}
        held = {int(r.request_id[1:]): tuple(sum(not b.is_null for b in t.get(r.request_id, ())) for t in tables)
                for r in scheduler.running} if workload.layers else {}
        hits = lookups.take(scheduled) if lookups else {}
        cached = cached_per_group(vllm, pool, group_ids) if lookups else ()
        ours = replay[len(steps)] if len(steps) < len(replay) else Step(now)
        if observe is not None:
            observe(Step(now, scheduled, preempted, free, group_blocks=held, hits=hits, group_cached=cached),
                    scheduler, vllm)
        ids, sampled = sample(output, requests, drafts, ours)
        scheduler.update_from_output(output, vllm.ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)}, sampled_token_ids=sampled))
        kept = propose(vllm, scheduler, workload, ids, sampled, drafts)
        finished = frozenset(i for i in scheduled if requests[i].is_finished())
        steps.append(Step(now, scheduled, preempted, free, finished, drafts=drafts, blocks=blocks, kept=kept,
                          group_blocks=held, hits=hits, group_cached=cached))
        now += STEP_S
    return steps
