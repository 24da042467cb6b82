"""One call runs a simulation: ``run_simulation(cfg, trace) -> SimResult``.

Data flows one way: trace DataFrame -> request table -> the core's state (``sim/core/build.py``)
-> the core's loop (``sim/core/events/replay.py``) -> records (DataFrames) -> summary dict. ``SimResult.save(dir)`` writes
``summary.json``, ``requests.csv``, ``steps.csv`` and ``config.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd

from pagesim.sim.config import SimConfig
from pagesim.sim.systems import DEFAULT_POLICY, SCHEDULING_POLICIES
from pagesim.sim.core.events import replay
from pagesim.sim.core import state as core_state
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.sched import speculative
from pagesim.sim.core.build import Limits, Pool, build, draft_cost, in_flight_tokens, limits_for, pool_for
from pagesim.sim.core.outcome import manager_counters, reject_reasons
from pagesim.sim.cost.models import (NO_COST, core_cost, cpu_overhead_note, frontend_seconds, make_cost_model,
                                     swap_block_tokens)
from pagesim.sim.csv_writer import write_csv
from pagesim.sim.executor import is_external, only_times
from pagesim.sim.errors import ConfigError, warn
from pagesim.sim.limits import check_pool, check_pool_holds_a_unit, check_speculative_tokens
from pagesim.sim.metrics import (InterTokenLatencies, StepRecords, SummaryOptions, prefix_cache_hit_rate,
                                 frame_of, request_columns, speculative_summary, summarize)
from pagesim.sim.metrics import host_tier_summary
from pagesim.sim.outdir import naming
from pagesim.sim.requests import RequestTable
from pagesim.sim.specs import GiB, KVBudget, get_gpu, get_model, kv_capacity, with_kv_cache_dtype, with_max_seq_len
from pagesim.sim.specs.kv_groups import kv_cache_groups, vllm_kv_cache_size
from pagesim.sim.specs.model import GATED_DELTA_NET
from pagesim.sim.terminal import bar_columns


@dataclass
class SimResult:
    """A run's summary, request table and step table. The request table may be given as the
    function that builds its columns (``request_table``, :func:`sim.metrics.request_columns`):
    :attr:`requests` builds the DataFrame on first use, since building it costs a sweep that
    never reads it (``reproduce``'s figures) a sixth of each run, and :meth:`save` writes the
    columns without one."""

    summary: dict
    request_table: pd.DataFrame | Callable[[], dict]
    steps: pd.DataFrame
    config: SimConfig | None = None
    extra: dict = field(default_factory=dict)

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request (:func:`sim.metrics.request_frame`)."""
        if callable(self.request_table):
            self.request_table = frame_of(self.request_table())
        return self.request_table

    def save(self, out_dir: str | Path, requests_format: str = "csv") -> Path:
        """Write the run's files into ``out_dir``; a write error names its file (``pagesim
        simulate --out`` saves into a staged folder: :func:`sim.outdir.staged_folder`)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with naming(out / "summary.json"):
            (out / "summary.json").write_text(json.dumps(jsonable(self.summary), indent=2, sort_keys=False) + "\n")
        if self.config is not None:
            with naming(out / "config.json"):
                (out / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")
        requests = self.request_table() if callable(self.request_table) else self.request_table
        if requests_format == "parquet":
            with naming(out / "requests.parquet"):
                frame_of(requests).to_parquet(out / "requests.parquet", index=False)
        else:
            with naming(out / "requests.csv"):
                write_csv(requests, out / "requests.csv")
        with naming(out / "steps.csv"):
            write_csv(self.steps, out / "steps.csv")
        return out

    @classmethod
    def load(cls, out_dir: str | Path) -> "SimResult":
        out = Path(out_dir)
        summary = json.loads((out / "summary.json").read_text())
        if (out / "requests.parquet").exists():
            requests = pd.read_parquet(out / "requests.parquet")
        else:
            requests = pd.read_csv(out / "requests.csv", keep_default_na=False, na_values=[""])
        steps = pd.read_csv(out / "steps.csv") if (out / "steps.csv").exists() else pd.DataFrame()
        cfg = None
        if (out / "config.json").exists():
            cfg = SimConfig(**json.loads((out / "config.json").read_text()))
        return cls(summary, requests, steps, cfg)


def jsonable(d: dict) -> dict:
    """``d`` as JSON writes it: numpy scalars as Python numbers, NaN and infinities as null."""
    def fix(v):
        if isinstance(v, (np.integer,)):
            return int(v)
        if isinstance(v, (np.floating, float)):
            v = float(v)
            return None if math.isnan(v) or math.isinf(v) else v
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return v
    return {k: fix(v) for k, v in d.items()}




def resolve_budget(cfg: SimConfig):
    model = with_kv_cache_dtype(with_max_seq_len(get_model(cfg.model), cfg.max_seq_len), cfg.kv_cache_dtype)
    gpu = get_gpu(cfg.gpu)
    if cfg.expert_parallel and model.moe is None:
        raise ConfigError(f"--expert-parallel splits a mixture of experts' routed experts; {model.name} has none")
    if cfg.expert_parallel and cfg.expert_group > model.moe.num_experts:
        raise ConfigError(f"--expert-parallel over {cfg.expert_group} GPUs (TP {cfg.tensor_parallel} x "
                          f"{cfg.data_parallel} replicas) would leave GPUs without an expert: {model.name} has "
                          f"{model.moe.num_experts}")
    groups = hybrid_groups(cfg, model)
    budget: KVBudget = kv_capacity(
        model, gpu, kv_bytes=cfg.kv_gib * GiB if cfg.kv_gib else None, tensor_parallel=cfg.tensor_parallel,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        activation_reserve_bytes=cfg.activation_reserve_gib * GiB, max_num_seqs=cfg.max_num_seqs,
        states_in_pool=groups is not None and groups.state_groups > 0, expert_group=cfg.expert_group)
    if groups is not None:  # a slot of the pool is one token of one group's layers
        per_slot = groups.layers_per_group * model.kv_bytes_per_layer_token(cfg.tensor_parallel)
        budget = replace(budget, capacity_tokens=int(budget.kv_bytes // per_slot), kv_bytes_per_token=per_slot,
                         how=f"{budget.how}; vLLM v1 groups: {groups.words()}")
    check_pool_holds_a_unit(cfg, model, budget, groups)
    if groups is None and budget.capacity_tokens < model.max_seq_len:  # (groups: build.check_groups_hold_a_request)
        raise ConfigError(
            f"the KV pool holds {budget.capacity_tokens} tokens, less than one max_seq_len={model.max_seq_len} "
            "request; use " + (f"--max-seq-len {budget.capacity_tokens} or " if budget.capacity_tokens >= 2 else "")
            + "more KV memory "
            f"(--kv-gib {model.max_seq_len * budget.kv_bytes_per_token / GiB:.2f})")
    cfg.check_batched_tokens(model.max_seq_len)
    cfg.check_token_pairs(model.max_seq_len, budget.capacity_tokens)
    check_pool(cfg, model, budget.capacity_tokens, budget.how)
    check_speculative_tokens(cfg, model)
    return model, gpu, budget


def hybrid_groups(cfg: SimConfig, model):
    """vLLM v1's KV cache groups for ``model`` when some slide or keep a state
    (``sim.specs.kv_groups``), else None: one group, every layer sized as full attention (vLLM
    v0 always: it has no groups; its states are reserved outside the pool)."""
    if not cfg.capabilities.kv_groups:
        return None
    groups = kv_cache_groups(model, int(cfg.block_size), cfg.tensor_parallel)
    if not groups.hybrid:
        return None
    # with prefix caching, state groups are vLLM's "align" mode (docs/notes/mamba-align.md), but not its
    # speculative paths (single_type_kv_cache_manager.py:1861-1872) nor the CPU tier's state offloads
    if cfg.prefix_caching and GATED_DELTA_NET in model.kinds:
        # (FlashInfer's gated-delta-net prefill, Hopper's and Blackwell's default, exports the prompt's boundary
        # state into a checkpoint block instead of cutting the chunk there: qwen_gdn_linear_attn.py:690-750)
        raise ConfigError(f"{model.name}: gated-delta-net prefill checkpoints not modelled; add --no-prefix-caching")
    if cfg.prefix_caching and (cfg.num_speculative_tokens or cfg.kv_offload_gib):
        # (EAGLE's hit drops a block, kv_cache_coordinator.py:870-880; the tier's keys are one group's)
        kind = "Mamba-state groups (align mode)" if groups.state_groups else "sliding-window groups"
        raise ConfigError(f"{model.name}: prefix caching over {kind} is not modelled with speculative decoding or "
                          "--kv-offload-gib; add --no-prefix-caching")
    return groups


class Prepared(NamedTuple):
    """A run before its first event: the resolved model, GPU and KV budget, how the manager
    divides the pool, the scheduler's limits, the request table and the core's state over it."""

    model: object
    gpu: object
    budget: KVBudget
    pool: Pool
    limits: Limits
    table: RequestTable
    state: core_state.Core
    cost_model: object | None  # None: an executor outside the core times the steps


def config_cost_model(cfg: SimConfig, model=None, gpu=None):
    """The cost model ``cfg`` names (its profile read, its constants loaded: ConfigError where they
    cannot be); ``model`` and ``gpu`` where the caller resolved them already."""
    if model is None or gpu is None:
        model, gpu, _ = resolve_budget(cfg)
    return make_cost_model(
        model, gpu, cfg.tensor_parallel, cfg.profile, cfg.step_overhead_ms, cfg.per_seq_overhead_ms,
        cfg.cost_model, cost_scale=cfg.cost_scale, swap_block_tokens=swap_block_tokens(cfg),
        kernel_block_tokens=cfg.kernel_block_tokens, expert_group=cfg.expert_group,
        data_parallel=cfg.data_parallel)


def prepare(cfg: SimConfig, trace: "pd.DataFrame | RequestTable", executor=None, cost_model=None) -> Prepared:
    """Everything a run of ``cfg`` over ``trace`` (a frame, or its request table already made)
    needs before its first event; ConfigError for a configuration that cannot run, TraceError
    for a request that cannot be one. ``cost_model``: a built cost model instead of the
    configuration's (a fit prices its candidates so)."""
    model, gpu, budget = resolve_budget(cfg)
    pool = pool_for(cfg, budget.capacity_tokens, model, hybrid_groups(cfg, model))
    limits = limits_for(cfg, pool, budget.kv_bytes_per_token, model.num_layers)
    table = trace if isinstance(trace, RequestTable) else RequestTable(trace)
    by_priority = [name for name, policy in SCHEDULING_POLICIES.items() if policy.orders_by == "priority"]
    if cfg.scheduling_policy not in by_priority and table.priority.any():
        order = ("first come first served" if cfg.scheduling_policy == DEFAULT_POLICY
                 else f"by --scheduling-policy {cfg.scheduling_policy}")
        warn(f"{cfg.label} serves the trace's requests {order}, whatever their priority (--system vllm-v1 "
             f"--scheduling-policy {' or '.join(by_priority)} orders them by it); the summary groups them by it")
    if cfg.scheduling_policy in by_priority and len(table.priority) and (table.priority == table.priority[0]).all():
        warn(f"--scheduling-policy {cfg.scheduling_policy}: every priority is {table.priority[0]}: "
             "first come first served")
    external = executor is not None
    if external and cfg.capabilities.host_tier_pages and cfg.kv_offload_gib:
        raise ConfigError("sglang's --kv-offload-gib (HiCache's host tier) is not modelled in the GPU mode")
    if external and not is_external(executor):
        raise ConfigError("an executor must run the core's steps (start, step, finish: sim.executor.is_external)")
    if cost_model is None and not external:
        cost_model = config_cost_model(cfg, model, gpu)
    cost = NO_COST if external else core_cost(cost_model)
    table.frontend_s = frontend_seconds(cost_model)
    if cfg.num_speculative_tokens:
        check_speculative_run(table, executor)
    if pool.groups is not None and external and not only_times(executor):
        raise ConfigError("hybrid KV cache groups (sliding-window, Mamba state) are not modelled in the GPU mode")
    s = build(cfg, pool, limits, table, cost, external=external, draft_cost=draft_cost(cfg, model))
    return Prepared(model, gpu, budget, pool, limits, table, s, cost_model)


def check_speculative_run(table: RequestTable, executor) -> None:
    """What speculative decoding is not modelled with (sim/core/sched/speculative.py), in one line.
    An executor outside the core must only time the steps (``sim.executor.only_times``)."""
    if executor is not None and not only_times(executor):
        raise ConfigError("--num-speculative-tokens is not run on the GPU (its executor verifies no drafts); "
                          "drop it with validate")
    if table.size and int(table.width.max()) > 1:
        raise ConfigError("--num-speculative-tokens with the trace's n / beam_width > 1 (parallel sampling, beam "
                          "search) is not modelled; drop one of them")


def initial_state(cfg: SimConfig, trace: pd.DataFrame, executor=None) -> core_state.Core:
    """The core's arrays (``sim.core.state.Core``) for ``cfg`` over ``trace`` before the run
    starts: tests work the core's rules by hand on them."""
    return prepare(cfg, trace, executor).state


def run_simulation(cfg: SimConfig, trace: pd.DataFrame, progress: bool = False, executor=None,
                   summary_options: SummaryOptions = SummaryOptions(), cost_model=None) -> SimResult:
    """Run ``cfg`` over ``trace`` on the core (``sim/core/``). ``executor``: None prices steps
    with the configuration's cost model; an executor outside the core
    (``sim.executor.is_external``: the GPU mode's ``gpu.executor.GPUExecutor``) runs every
    iteration the core schedules and times it. ``summary_options``: which percentiles and
    goodput the summary reports."""
    return run_prepared(cfg, prepare(cfg, trace, executor, cost_model), progress, executor, summary_options)


def run_prepared(cfg: SimConfig, run: Prepared, progress: bool = False, executor=None,
                 summary_options: SummaryOptions = SummaryOptions()) -> SimResult:
    """:func:`run_simulation` of ``run``, prepared (:func:`prepare`). The request table holds
    what the run reads: a caller that makes it (``RequestTable``) and lets its trace go before
    :func:`prepare` keeps no second copy of its columns (ten million requests: 0.4 GB)."""
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=run.table.size, unit="req", desc=f"simulate {cfg.system}", delay=2.0, leave=False,
                   ncols=bar_columns())
    try:
        s, wall_time_s = replay.run(run.state, executor, bar)
    finally:
        if bar is not None:
            bar.close()
    return result(cfg, run._replace(state=s), wall_time_s, summary_options)


def result(cfg: SimConfig, run: Prepared, wall_time_s: float, summary_options: SummaryOptions = SummaryOptions(),
           duration_s: float | None = None) -> SimResult:
    """The records and summary of ``run`` as its state stands (at its end, or where a progress
    hook stopped it: ``duration_s`` then says up to when)."""
    s, pool = run.state, run.pool
    records = StepRecords(s, pool.capacity, blocks=pool.has_blocks)
    end_s = float(s.clock[core_state.END_S]) if duration_s is None else duration_s
    summary = engine_summary(cfg, run, run.table, records, wall_time_s, end_s, summary_options)
    reasons = reject_reasons(s, pool, run.limits, cfg)
    return SimResult(summary, lambda: request_columns(run.table, reasons), records.frame(), cfg)


def engine_summary(cfg: SimConfig, run: Prepared, table, records: StepRecords, wall_time_s: float, end_s: float,
                   summary_options: SummaryOptions) -> dict:
    """The summary of one engine (``run.state``) over the requests of ``table`` (all of the
    run's, or a cluster replica's own: sim/cluster.py)."""
    s, pool = run.state, run.pool
    extra = {"system": cfg.label, "model": run.model.name, "gpu": run.gpu.name, "tensor_parallel": cfg.tensor_parallel,
             "expert_group": cfg.expert_group,  # the GPUs a mixture of experts' experts are split over (1: none)
             "kv_bytes_per_token": run.budget.kv_bytes_per_token, "kv_cache_dtype": cfg.kv_cache_dtype,
             "kv_budget": run.budget.how, "state_reserved_bytes": run.budget.state_bytes,
             "block_size": pool.block_size if cfg.manager == "paged" else None,  # (raised for a Mamba state)
             "num_swap_fallbacks": int(s.count[core_state.NUM_SWAP_FALLBACKS]), "seed": cfg.seed,
             "engine": replay.engine_name(),
             "cpu_overhead": cpu_overhead_note(run.cost_model) if run.cost_model is not None else None}
    counters = manager_counters(s, pool)
    for k, v in counters.items():
        extra[f"mgr_{k}"] = v
    summary = summarize(table, records, InterTokenLatencies.of(s), int(s.count[core_state.NUM_PREEMPTIONS]),
                        duration_s=end_s, wall_time_s=wall_time_s, extra=extra, options=summary_options,
                        client_timeout_s=cfg.client_timeout_s)
    if pool.kind == "paged" and (cfg.prefix_caching or cfg.capabilities.radix_cache):
        summary["prefix_cache_hit_rate"] = prefix_cache_hit_rate(counters["prefix_hit_tokens"],
                                                                 counters["prefix_lookup_tokens"])
    summary.update(records.sharing())
    if cfg.num_speculative_tokens:
        summary.update(speculative_summary(*speculative.totals(s.count)))
    if cfg.kv_offload_gib:
        c = s.count
        summary.update(host_tier_summary(
            int(c[core_state.PREFIX_HIT_TOKENS]), int(c[core_state.HOST_HIT_TOKENS]),
            int(c[core_state.PREFIX_LOOKUP_TOKENS]), int(c[core_state.HOST_LOADED_BLOCKS]),
            int(c[core_state.HOST_STORED_BLOCKS]), int(c[core_state.HOST_EVICTIONS]), int(c[core_state.HOST_USED]),
            # (sglang's host tier: its pages, the same bytes as a device page; sim/core/kv/radix_cache.py)
            int(s.config[core_state.HOST_BLOCKS] or s.config[core_state.HICACHE_HOST_PAGES]),
            pool.block_size * run.budget.kv_bytes_per_token))
    if pool.groups is not None:
        summary["kv_groups"] = group_split(s, pool.groups, records)
        # the capacity vLLM logs at start, a token in every group (kv_capacity_tokens: slots of one group)
        tokens, concurrency = vllm_kv_cache_size(
            pool.groups, pool.num_blocks, pool.block_size, in_flight_tokens(cfg, pool.max_seq_len), pool.max_seq_len,
            int(cfg.num_speculative_tokens), bool(cfg.prefix_caching and pool.groups.state_groups))
        summary.update(vllm_kv_cache_size_tokens=tokens, vllm_max_concurrency=concurrency)
    return summary


def group_split(s, groups, records: StepRecords) -> dict:
    """The token states, reservation and internal fragmentation of the full-attention, the
    sliding-window and the state groups (each kind's groups together), as shares of the pool like
    the summary's ``mem_*`` (their sums). Per attention group, the reservation and fragmentation
    are the same (a block a sliding group freed was full and computed); its token states lack
    what it freed; the full groups keep every token. With prefix caching a block several requests
    hold counts once: each kind's tokens lack its shared slots (such a block is full). A state
    block holds ``STATE_SLOTS`` slots of state, the rest padding (``kv_cache.group_sums``)."""
    total = (records.busy_s + records.idle_s) * records.capacity
    g_full, g_sliding = groups.full_groups, groups.sliding_groups
    n = g_full + g_sliding  # the attention groups
    tokens, reservation, fragmentation = (float(v) for v in records.mem_weighted[:3])
    skipped, state_blocks, full_shared, sliding_shared = kv_cache.group_sums(s)
    bs = int(s.config[core_state.BLOCK_SIZE])
    state_slots = int(s.config[core_state.STATE_SLOTS])
    state_tokens, state_padding = state_slots * state_blocks, (bs - state_slots) * state_blocks
    tokens, fragmentation = tokens - state_tokens, fragmentation - state_padding
    per_group_tokens = (tokens + g_sliding * skipped + full_shared + sliding_shared) / n  # a group's, unshared
    # kind: its groups, token states, reservation, internal fragmentation (slot-seconds)
    shares = {"full": (g_full, g_full * per_group_tokens - full_shared, g_full / n * reservation,
                       g_full / n * fragmentation),
              "sliding": (g_sliding, g_sliding * (per_group_tokens - skipped) - sliding_shared,
                          g_sliding / n * reservation, g_sliding / n * fragmentation),
              "state": (groups.state_groups, state_tokens, 0.0, state_padding)}
    out = {}
    for kind, (count, kind_tokens, kind_reserved, kind_fragmented) in shares.items():
        out[kind] = {"groups": count, "token_states": kind_tokens / total if total > 0 else 0.0,
                     "reservation": kind_reserved / total if total > 0 else 0.0,
                     "internal_frag": kind_fragmented / total if total > 0 else 0.0}
    out["sliding"]["window"] = groups.window
    out["layers_per_group"] = groups.layers_per_group
    return out
