"""The memory a run's tables will take, checked before anything is allocated.

A run holds per-request tables (the trace, the request table, the step table, the output frames)
and the memory manager's per-unit tables (one entry per paged block or vAttention page, one per
static slot). A configuration whose tables cannot fit in this machine's memory is refused in one
line that says what is too large, instead of a MemoryError (or the kernel's OOM killer) after
minutes of work.

A request's bytes are computed from the tables a run of the configuration actually allocates
(``sim.run_memory.bytes_per_request``, which refuses a workload too large:
``check_synthetic_workload``): the core's state (``sim/core/build.py``: the per-request arrays the
options call for, the step table only when steps are recorded) and the request table beside
the trace's frame, for two sample traces; what grows between them is per request.

The per-unit sizes of the pools were measured (tracemalloc of a fresh manager, peak RSS):

* :data:`BYTES_PER_BLOCK`: a paged manager of 2M blocks took 64 bytes per block (three int64
  arrays and the free list), and the core adds its int32 free-block stack;
* :data:`BYTES_PER_STATIC_SLOT`: a static manager of 1M slots took 40 bytes per slot;
* :data:`BYTES_PER_REPLICA`: a cluster of 1,600 Llama-2-7B replicas on an A100-80GB took 82 KiB
  per replica above a single engine's peak (its state, queues and clocks; its pool's tables,
  counted apart, lie mostly untouched).

The contiguous manager keeps one entry per sequence, not per slot, so its pool size costs nothing.
"""

from __future__ import annotations

import os

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.capacity import GiB, vattention_page_tokens

BYTES_PER_BLOCK = 68
BYTES_PER_STATIC_SLOT = 40
BYTES_PER_REPLICA = 82 * 1024


def physical_memory_bytes() -> int:
    """This machine's physical memory (a large stand-in where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover (not POSIX)
        return 1 << 40


def _gib(n: float) -> str:
    return f"{n / (1 << 30):,.1f} GiB" if n < 1 << 40 else f"{n / (1 << 40):,.3g} TiB"


def check_fits_in_memory(need_bytes: float, what: str, advice: str) -> None:
    """Refuse (ConfigError) when ``need_bytes`` exceed this machine's memory; ``what`` says which
    tables and why they are that large, ``advice`` which setting to change."""
    have = physical_memory_bytes()
    if need_bytes > have:
        raise ConfigError(f"{what} would need about {_gib(need_bytes)} of memory, more than this machine's "
                          f"{_gib(have)}: {advice}")


def pool_tables(cfg, model, capacity_tokens: int) -> tuple[int, str, int]:
    """A KV pool's manager tables (see the module doc): its units, their name, bytes per unit
    (no units for the contiguous manager)."""
    if cfg.manager == "paged":
        return capacity_tokens // cfg.block_size, f"blocks of {cfg.block_size}", BYTES_PER_BLOCK
    if cfg.manager == "vattention":
        page = vattention_page_tokens(model, cfg.vattention_page_kib * 1024, cfg.tensor_parallel)
        return capacity_tokens // page, f"pages of {page} tokens", BYTES_PER_BLOCK
    if cfg.manager == "static":
        return capacity_tokens // model.max_seq_len, "static slots", BYTES_PER_STATIC_SLOT
    return 0, "", 0


def check_pool(cfg, model, capacity_tokens: int, how: str) -> None:
    """Refuse a KV pool whose manager tables do not fit in memory; ``cfg`` is the run's
    SimConfig, ``model`` its ModelSpec, ``how`` names what sized the pool. A host tier
    (``kv_offload_gib``) has a table row per block of its own."""
    units, name, per_unit = pool_tables(cfg, model, capacity_tokens)
    if units:
        check_fits_in_memory(units * per_unit, f"a KV pool of {capacity_tokens:.3g} tokens ({how}) in {units:.3g} "
                             f"{name}, whose tables", "use a smaller --kv-gib")
    if cfg.kv_offload_gib:
        blocks = host_tier_blocks(cfg, model)
        check_fits_in_memory(blocks * BYTES_PER_BLOCK, f"--kv-offload-gib {cfg.kv_offload_gib:g} ({blocks:.3g} "
                             f"blocks of {cfg.block_size}), whose tables", "use a smaller --kv-offload-gib")


def host_tier_blocks(cfg, model) -> float:
    """The blocks of a ``kv_offload_gib`` host tier: its bytes over the tensor-parallel GPUs, per
    block of the model's bytes per token (as ``sim.core.build.host_tier_size`` sizes it)."""
    return cfg.kv_offload_gib * GiB / cfg.tensor_parallel / (model.kv_bytes_per_token(cfg.tensor_parallel)
                                                              * cfg.block_size)


def check_replicas(pools, flag: str) -> None:
    """Refuse replicas whose tables together do not fit in memory, before any is built.
    ``pools``: ``(cfg, model, capacity_tokens, count)`` per kind of replica; each replica has its
    own pool's tables (:func:`pool_tables`) and :data:`BYTES_PER_REPLICA`."""
    total = sum(count for *_x, count in pools)
    need = 0.0
    for cfg, model, capacity, count in pools:
        units, _name, per_unit = pool_tables(cfg, model, capacity)
        need += count * (units * per_unit + BYTES_PER_REPLICA)
    check_fits_in_memory(need, f"{total:,} replicas ({flag}), each with its own KV pool's and engine's tables,",
                         "use fewer replicas")


def check_speculative_tokens(cfg, model) -> None:
    """A draft never runs past a request's end: ``num_speculative_tokens`` must be below the
    model's ``max_seq_len`` (no request has that many tokens to draft; a bound on the per-step
    draft tables too)."""
    k = cfg.num_speculative_tokens
    if k and k >= model.max_seq_len:
        raise ConfigError(f"num_speculative_tokens={k} must be below max_seq_len={model.max_seq_len}: no request "
                          "has that many tokens to draft")


def check_drafter(cfg) -> None:
    """What an engine refuses of the drafter a command line names (a library caller may still
    price any drafter on any model): MTP on a model that ships no MTP module (vLLM 0.33.0 finds
    no MTP draft for its model type: "Unsupported speculative method", config/speculative.py:
    1497-1501); a draft model of another vocabulary (vLLM: "Target and draft model should have
    the same vocabulary size", config/speculative.py:2040-2055); a draft model larger than its
    target (it would draft slower than the target decodes; vLLM does not check this)."""
    if not cfg.num_speculative_tokens:
        return
    from pagesim.sim.specs import get_model  # (the presets import this module's neighbours)

    model = get_model(cfg.model)
    if cfg.speculative_method == "mtp" and not model.mtp_layers:
        raise ConfigError(f"--speculative-method mtp: {model.name} ships no multi-token-prediction module "
                          "(num_nextn_predict_layers); vLLM refuses it: use ngram, eagle or draft-model")
    if cfg.speculative_method == "draft-model" and cfg.draft_model is not None:
        draft = get_model(cfg.draft_model)
        if draft.vocab_size != model.vocab_size:
            raise ConfigError(f"--draft-model {cfg.draft_model}: its vocabulary ({draft.vocab_size:,} tokens) is not "
                              f"{model.name}'s ({model.vocab_size:,}); vLLM refuses a draft of another vocabulary")
        if draft.weight_bytes > model.weight_bytes:
            raise ConfigError(f"--draft-model {cfg.draft_model} ({draft.weight_bytes / GiB:.1f} GiB of weights) is "
                              f"larger than {model.name} ({model.weight_bytes / GiB:.1f} GiB): it would draft slower "
                              "than the target decodes")


def pool_unit_tokens(cfg, model, groups=None) -> int:
    """The slots one unit of ``cfg``'s pool holds: a paged block (a hybrid model's raised block,
    ``sim.specs.kv_groups``), a vAttention page, a static slot of ``max_seq_len``; 1 for the
    contiguous manager."""
    if cfg.manager == "vattention":
        return vattention_page_tokens(model, cfg.vattention_page_kib * 1024, cfg.tensor_parallel)
    if cfg.manager == "static":
        return int(model.max_seq_len)
    if cfg.manager == "contiguous":
        return 1
    return int(groups.block_size or cfg.block_size) if groups is not None else int(cfg.block_size)


def check_pool_holds_a_unit(cfg, model, budget, groups=None) -> None:
    """Refuse a KV pool smaller than one unit of its manager (:func:`pool_unit_tokens`): no
    request length fits it, so the advice is the pool's size (``budget``: its KVBudget)."""
    unit = pool_unit_tokens(cfg, model, groups)
    if cfg.manager in ("paged", "vattention") and budget.capacity_tokens < unit:
        name = "page" if cfg.manager == "vattention" else "block"
        need = unit * budget.kv_bytes_per_token / GiB
        raise ConfigError(f"the KV pool holds {budget.capacity_tokens} tokens, less than one {name} of {unit}: "
                          f"no request fits; use more KV memory (--kv-gib {need:.3g} or more)"
                          + (" or a smaller --block-size" if name == "block" and groups is None else ""))
