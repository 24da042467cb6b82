"""A cluster run: ``run_cluster(cfg, trace, replicas=K, router=NAME) -> ClusterResult``.

K replicas of one configuration (each its own KV pool, prefix cache, scheduler and cost model),
or replicas on different GPUs (``replicas`` as (configuration, count) groups, one configuration
per GPU: ``--replica-gpus h100-80gb:2,a100-80gb:6``), behind a global router, simulated as one
discrete-event run by the compiled cluster loop (``sim/core/events/cluster.py``, whose docstring states
the design and the routers' rules). This file builds the replicas' states, runs the loop to its
end (growing what Python grows) and writes the records: the request table with a ``replica``
column, the step table with one, a summary per replica (the keys of a single run's summary,
naming its GPU and KV capacity) and the cluster's summary (throughput and latency over all
requests, load balance, prefix hit rate, the replicas' GPUs).
"""

from __future__ import annotations

import json
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.sim.config import SimConfig
from pagesim.sim.core.events import cluster as core_cluster
from pagesim.sim.core import state
from pagesim.sim.core.sched import speculative
from pagesim.sim.core.events import loop, replay
from pagesim.sim.core.build import UNLIMITED
from pagesim.sim.core.outcome import reject_reasons
from pagesim.sim.errors import ConfigError
from pagesim.sim.metrics import (InterTokenLatencies, StepRecords, SummaryOptions, prefix_cache_hit_rate,
                                 request_frame, speculative_summary, summarize)
from pagesim.sim.outdir import naming
from pagesim.sim.run import SimResult, engine_summary, jsonable, prepare, resolve_budget
from pagesim.sim.specs import get_gpu

ROUTERS = tuple(core_cluster.ROUTERS)
DEFAULT_SLACK = 0.5  # prefix-affinity's load bound: (1 + slack) x the mean outstanding requests
FIRST_RING = 1024  # a replica's queues' first capacity (grown as its outstanding requests need)

# Every array of a replica's state is one of four kinds (a test checks they cover state.Core):
# its own copy of its GPU's state's (the pool, its block tables and bookkeeping, step scratch)
OWN = ("free_block_ids", "free_slots", "block_table", "step_memory", "itl_hist", "buddy_bits", "buddy_orders",
       "holes", "block_info", "key_entries", "placement_saved", "step_copies", "step_swap_out", "step_swap_in",
       "radix_nodes", "host_entries", "host_blocks", "host_work", "host_ready_s")
# made here for it (its config/count/clock rows of the cluster's 2-D arrays, queues sized to its
# outstanding requests, step table, random stream)
MADE = ("config", "count", "clock", "waiting", "swapped", "running", "running_group", "step_prefill_ids",
        "step_prefill_tokens", "step_finished", "step_prefill_context", "row_floats", "row_ints", "rng",
        "exchange")
# its GPU's, read only, shared by the replicas on that GPU (the cost model's constants and data;
# beam search's lineage records and each request's first row in them, for the widths its
# max_num_seqs lets run)
PER_GPU = ("cost", "cost_data", "itl_edges", "spec_acceptance", "beam_parents", "beam_row")
# the request columns, ONE set for the whole cluster (the first GPU's state's, over the request
# table the records read): each request is written by the replica it was routed to
REQUEST_COLUMNS = ("arrival_s", "priority", "prompt_tokens", "output_tokens", "status", "reject_code", "num_generated",
                   "num_prompt_computed", "prompt_target", "num_preemptions", "first_token_s", "finish_s",
                   "last_token_s", "num_computed_tokens", "num_blocks", "final_len", "in_decode", "swapped_tokens",
                   "extent", "chain_start", "last_scheduled_step", "chains", "width", "num_seqs", "seq_slot", "beam",
                   "predictor_draw", "radix_request", "speculative", "offload", "host_seen", "load_ready_s",
                   "window", "admitted_s")

# the settings a replica group may set for itself: its GPU and what follows from it (the KV pool,
# vLLM v1's batch limits and SGLang's chunked prefill size, which default per GPU:
# sim.systems.v1_batch_defaults, sglang_defaults); every other setting (model, system, policies,
# seed) is the cluster's, the same on every replica
PER_REPLICA_SETTINGS = ("gpu", "kv_gib", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
                        "chunk_budget")


def parse_replica_gpus(text: str) -> list[tuple[str, int]]:
    """``--replica-gpus GPU:COUNT,...`` as (the GPU's preset name, count) pairs, in replica
    order; ConfigError naming the bad pair."""
    out: list[tuple[str, int]] = []
    for part in text.split(","):
        name, sep, count = part.strip().partition(":")
        if not sep or not (count.isascii() and count.isdigit()) or int(count) < 1:
            raise ConfigError(f"--replica-gpus takes GPU:COUNT pairs, each count a whole number >= 1 "
                              f"(e.g. h100-80gb:2,a100-80gb:6), got '{part}'")
        try:
            gpu = get_gpu(name.strip()).name
        except ConfigError as e:
            raise ConfigError(f"--replica-gpus: {e}") from None
        if any(gpu == seen for seen, _ in out):
            raise ConfigError(f"--replica-gpus names {gpu} twice; give each GPU once, with its count")
        out.append((gpu, int(count)))
    return out


def replica_groups(cfg: SimConfig, replicas) -> list[tuple[SimConfig, int]]:
    """The replicas as (configuration, count) groups in replica order: ``replicas`` copies of
    ``cfg`` (a whole number), or the groups given (checked: counts >= 1, and each configuration
    the same as ``cfg`` but in PER_REPLICA_SETTINGS)."""
    if by_gpu(replicas):
        if not replicas:
            raise ConfigError("replica groups: give at least one (configuration, count)")
        for group_cfg, count in replicas:
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
                raise ConfigError(f"--replica-gpus: the count of {group_cfg.gpu} must be a whole number >= 1, "
                                  f"got {count!r}")
            differ = [f.name for f in fields(SimConfig)
                      if f.name not in PER_REPLICA_SETTINGS and getattr(group_cfg, f.name) != getattr(cfg, f.name)]
            if differ:
                raise ConfigError(f"--replica-gpus {group_cfg.gpu}: {differ[0]} differs from the cluster's "
                                  f"({getattr(group_cfg, differ[0])!r}, not {getattr(cfg, differ[0])!r}); "
                                  "replicas differ only in " + ", ".join(PER_REPLICA_SETTINGS))
        if cfg.expert_parallel:
            raise ConfigError("--expert-parallel: the replicas are the ranks of one expert-parallel group, on one "
                              "GPU type; give --replicas K, not --replica-gpus")
        return [(group_cfg, int(count)) for group_cfg, count in replicas]
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise ConfigError(f"--replicas must be a whole number >= 1, got {replicas!r}")
    if cfg.expert_parallel:  # the replicas are one group's data-parallel ranks (vLLM's --data-parallel-size)
        return [(replace(cfg, data_parallel=int(replicas)), int(replicas))]
    return [(cfg, int(replicas))]


def by_gpu(replicas) -> bool:
    """The replicas were given as (configuration, count) groups, one per GPU (not K copies)."""
    return isinstance(replicas, (list, tuple))


@contextmanager
def naming_gpu(group_cfg: SimConfig, named: bool):
    """A configuration error of one GPU's replicas (a model that does not fit it, a pool too
    small), named by that GPU when ``named`` (the replicas were given by GPU)."""
    try:
        yield
    except ConfigError as e:
        if named:
            raise ConfigError(f"--replica-gpus {group_cfg.gpu}: {e}") from None
        raise


def check_cluster(replicas, router: str, slack: float, cfg: SimConfig) -> list[tuple[SimConfig, int]]:
    """Bad cluster settings, refused in one line (ConfigError); returns the replica groups
    (:func:`replica_groups`), each GPU's KV budget checked."""
    groups = replica_groups(cfg, replicas)
    total = sum(count for _, count in groups)
    if router not in core_cluster.ROUTERS:
        raise ConfigError(f"--router: unknown router {router!r}; valid: {', '.join(ROUTERS)}")
    if not (slack >= 0 and np.isfinite(slack)):
        raise ConfigError(f"--router-slack must be a finite number >= 0, got {slack!r}")
    caches = (cfg.prefix_caching and cfg.manager == "paged") or cfg.capabilities.radix_cache
    if router == "prefix-affinity" and not caches:
        raise ConfigError("--router prefix-affinity routes by the replicas' prefix caches: it needs "
                          "--prefix-caching on a paged system (vllm), or sglang's radix cache")
    if cfg.capabilities.host_tier_pages and cfg.kv_offload_gib and total > 1:  # (its router reads one tier)
        raise ConfigError("sglang's --kv-offload-gib (HiCache's host tier) is not modelled with --replicas > 1")
    if cfg.check and total > 1:
        raise ConfigError("--check checks one engine's state; it is not available with --replicas > 1")
    if by_gpu(replicas):
        for group_cfg, _ in groups:
            with naming_gpu(group_cfg, True):
                resolve_budget(group_cfg)
    return groups


def replica_states(groups: list[tuple[state.Core, int]], seed: int, rows: int) -> list[state.Core]:
    """The replicas, ``count`` of each GPU's state (``groups``: the states before their first
    event, in replica order): each with its own pool, queues, step arrays, counters (rows of
    shared 2-D arrays) and random stream (replica 0's is its state's); the request columns the
    first state's, shared by all; the cost model its GPU's."""
    def rows_of(name):
        return np.concatenate([np.repeat(getattr(s, name)[None, :], count, axis=0) for s, count in groups])

    configs, counts, clocks = rows_of("config"), rows_of("count"), rows_of("clock")
    configs[:, state.ROUTED] = 1
    shared = {name: getattr(groups[0][0], name) for name in REQUEST_COLUMNS}
    i64 = np.int64
    out = []
    for s0, count in groups:
        n = int(s0.config[state.NUM_REQUESTS])
        bound, ring = len(s0.running), max(min(n, FIRST_RING), 1)  # (sim.core.build: the running bound)
        for _ in range(count):
            r = len(out)
            own = {name: getattr(s0, name).copy() for name in OWN}
            out.append(s0._replace(
                config=configs[r], count=counts[r], clock=clocks[r], **own, **shared,
                waiting=np.zeros(ring, i64), swapped=np.zeros(ring, i64), running=np.zeros(bound, i64),
                running_group=np.zeros(bound, np.int8),
                step_prefill_ids=np.zeros(bound, i64), step_prefill_tokens=np.zeros(bound, i64),
                step_finished=np.zeros(bound, i64), step_prefill_context=np.zeros(bound, i64),
                row_floats=np.zeros((rows, state.ROW_FLOATS)), row_ints=np.zeros((rows, state.ROW_INTS), i64),
                rng=s0.rng if r == 0 else np.random.default_rng([seed, r]), exchange=np.zeros(1, i64)))
    return out


def grow_rings(s: state.Core, need: int) -> state.Core:
    """``s`` with queues (the waiting and swapped rings) of at least ``need`` places, their
    requests in order from place 0."""
    size = max(need, 2 * len(s.waiting))
    c = s.count

    def grown(ring, head, length):
        order = ring[(c[head] + np.arange(c[length])) % len(ring)]
        out = np.zeros(size, np.int64)
        out[:len(order)] = order
        c[head] = 0
        return out

    return s._replace(waiting=grown(s.waiting, state.WAITING_HEAD, state.WAITING_LEN),
                      swapped=grown(s.swapped, state.SWAPPED_HEAD, state.SWAPPED_LEN))


class Cluster:
    """The cluster's arrays: the replicas' states (a Python list: numba's reflected list in the
    loop, which only reads it), their config/count/clock rows, the requests routed to each,
    each request's replica, and the loop's own counters."""

    def __init__(self, states: list[state.Core], router: str, slack: float, arrival_s: np.ndarray):
        self.replicas = states
        self.configs = states[0].config.base
        self.counts = states[0].count.base
        self.clocks = states[0].clock.base
        k = len(states)
        self.routed = np.zeros(k, np.int64)
        self.replica_of = np.full(len(arrival_s), -1, np.int64)
        self.cc = np.zeros(core_cluster.NUM_CLUSTER_COUNTS, np.int64)
        self.cc[core_cluster.C_ROUTER] = core_cluster.ROUTERS[router]
        self.ck = np.zeros(core_cluster.NUM_CLUSTER_CLOCK)
        self.ck[core_cluster.K_SLACK] = slack
        self.arrival_s = arrival_s

    def run(self) -> float:
        """Run to the end; returns the wall time of the loop (the load of the cluster's machine
        code, or its first compile, comes before, with the log's notice when it compiles)."""
        args = (self.replicas, self.configs, self.counts, self.clocks, self.routed, self.replica_of, self.cc, self.ck,
                self.arrival_s)
        with warnings.catch_warnings():  # numba's pending deprecation of reflected lists (since its 0.44)
            warnings.filterwarnings("ignore", message=r"(?s).*type .reflected list. found")
            run = replay.compiled_entry(core_cluster.run_for(self.replicas[0].config[state.SCHEDULER_KIND]), *args)
        t0 = time.perf_counter()
        while True:
            code = run(*args)
            if code == loop.DONE:
                break
            r = int(self.cc[core_cluster.C_STOPPED_REPLICA])
            if code == core_cluster.RINGS_FULL:
                self.replicas[r] = grow_rings(self.replicas[r], int(self.cc[core_cluster.C_RING_CAPACITY_NEEDED]))
            elif code == loop.ROWS_FULL:
                self.replicas[r] = replay.grow_rows(self.replicas[r])
            else:
                replay.raise_for(code, self.replicas[r], f"replica {r}: ")
                raise AssertionError(f"replica {r}: the loop returned {code}")  # not reached
        wall_time_s = time.perf_counter() - t0
        replay.require_every_request_ended(self.replicas)
        return wall_time_s


@dataclass
class ClusterResult(SimResult):
    replica_summaries: list = field(default_factory=list)

    def save(self, out_dir, requests_format: str = "csv") -> Path:
        out = super().save(out_dir, requests_format)
        with naming(out / "replicas.json"):
            (out / "replicas.json").write_text(
                json.dumps([jsonable(s) for s in self.replica_summaries], indent=2) + "\n")
        return out


class RequestSubset:
    """The columns of a request table the summary reads, for the rows of ``mask``."""

    def __init__(self, t, mask: np.ndarray):
        for name in ("status", "reject_code", "output", "width", "prompt", "first_token_s", "finish_s", "arrival_s"):
            setattr(self, name, getattr(t, name)[mask])
        self.arrival_offset_s, self.frontend_s = t.arrival_offset_s, t.frontend_s


class ClusterRecords:
    """The replicas' step records together, as the summary reads them: memory as the share of
    all replicas' slot-seconds (each replica over its own run), batch size over the replicas'
    busy time, steps and busy / idle seconds summed (replica-seconds)."""

    def __init__(self, records: list[StepRecords]):
        self.records = records
        self.capacity = sum(r.capacity for r in records)
        self.num_steps = sum(r.num_steps for r in records)
        self.busy_s = sum(r.busy_s for r in records)
        self.idle_s = sum(r.idle_s for r in records)
        self.running_weighted = sum(r.running_weighted for r in records)

    def memory_fractions(self) -> dict[str, float]:
        total = sum((r.busy_s + r.idle_s) * r.capacity for r in self.records)
        weighted = sum(r.mem_weighted for r in self.records)
        keys = self.records[0].memory_fractions().keys()
        return {k: float(v / total) if total > 0 else 0.0 for k, v in zip(keys, weighted)}


def run_cluster(cfg: SimConfig, trace: pd.DataFrame, replicas, router: str, slack: float = DEFAULT_SLACK,
                summary_options: SummaryOptions = SummaryOptions()) -> ClusterResult:
    """Run ``trace`` through the replicas behind ``router``: ``replicas`` copies of ``cfg`` (a
    whole number), or groups ``[(configuration, count), ...]`` in replica order, one per GPU,
    each the same as ``cfg`` but in PER_REPLICA_SETTINGS (:func:`replica_groups`)."""
    groups = check_cluster(replicas, router, slack, cfg)
    runs = []  # one prepared state per group: its pool, limits and cost model
    for group_cfg, _ in groups:
        with naming_gpu(group_cfg, by_gpu(replicas)):
            runs.append(prepare(group_cfg, trace))
    n, k = runs[0].table.size, sum(count for _, count in groups)
    rows = max(1024, 8 * n // k) if cfg.record_steps else 0
    states = replica_states([(run.state, count) for run, (_, count) in zip(runs, groups)], cfg.seed, rows)
    for s in states:
        s.config[state.PROGRESS_EVERY] = UNLIMITED
    c = Cluster(states, router, slack, runs[0].state.arrival_s)
    wall_time_s = c.run()
    replica_runs = [(group_cfg, run) for run, (group_cfg, count) in zip(runs, groups) for _ in range(count)]
    return cluster_result(cfg, runs[0].table, replica_runs, c, router, wall_time_s, summary_options)


def cluster_result(cfg, table, replica_runs: list, c: Cluster, router: str, wall_time_s: float,
                   options: SummaryOptions) -> ClusterResult:
    """The cluster's records: each replica's summary (a single engine's keys, over the requests
    routed to it and its own run, to its own end, naming its GPU and KV capacity) and step rows,
    the request table (``table``, the one every replica wrote) with each request's replica, and
    the cluster's summary. ``replica_runs``: each replica's (configuration, prepared run of its GPU)."""
    summaries, steps, records = [], [], []
    reasons = np.full(table.size, "", dtype=object)  # why a request was rejected, by its own replica's pool
    for r, (s, (replica_cfg, run)) in enumerate(zip(c.replicas, replica_runs)):
        mine = c.replica_of == r
        reasons[mine] = reject_reasons(s, run.pool, run.limits, replica_cfg)[mine]
        rec = StepRecords(s, run.pool.capacity, blocks=run.pool.has_blocks)
        summary = engine_summary(replica_cfg, run._replace(state=s), RequestSubset(table, mine), rec,
                                 wall_time_s, float(s.clock[state.END_S]), options)
        summary["replica"] = r
        summary["routed"] = int(c.routed[r])
        summaries.append(summary)
        frame = rec.frame()
        frame.insert(0, "replica", r)
        steps.append(frame)
        records.append(rec)
    requests = request_frame(table, reasons)
    requests.insert(1, "replica", c.replica_of)
    end_s = max(float(s.clock[state.END_S]) for s in c.replicas)
    extra = {k: summaries[0][k] for k in ("system", "model", "gpu", "tensor_parallel", "expert_group",
                                          "kv_bytes_per_token", "kv_cache_dtype", "kv_budget", "block_size", "seed",
                                          "engine", "cpu_overhead")}
    extra.update(gpu_mix(summaries))
    summary = summarize(table, ClusterRecords(records), merged_itl(c.replicas),
                        sum(int(s.count[state.NUM_PREEMPTIONS]) for s in c.replicas),
                        duration_s=end_s, wall_time_s=wall_time_s, extra=extra, options=options,
                        client_timeout_s=cfg.client_timeout_s)
    summary.update(balance(c, summaries, router))
    if replica_runs[0][1].pool.kind == "paged" and cfg.prefix_caching:
        hits = sum(s["mgr_prefix_hit_tokens"] for s in summaries)
        lookups = sum(s["mgr_prefix_lookup_tokens"] for s in summaries)
        summary["prefix_cache_hit_rate"] = prefix_cache_hit_rate(hits, lookups)
    if cfg.num_speculative_tokens:  # the replicas' counts summed (sim/core/sched/speculative.py)
        totals = [speculative.totals(s.count) for s in c.replicas]
        summary.update(speculative_summary(*(sum(column) for column in zip(*totals))))
    return ClusterResult(summary, requests, pd.concat(steps, ignore_index=True), cfg, replica_summaries=summaries)


def gpu_mix(summaries: list[dict]) -> dict:
    """The replicas' GPUs as the cluster's summary names them: ``replica_gpus`` (GPU:COUNT in
    replica order, as ``--replica-gpus`` takes them), each replica's GPU and KV capacity; where
    they differ, ``gpu`` is that mix and ``kv_budget`` each GPU's budget."""
    runs: list[list] = []  # [gpu, count] of each run of equal GPUs
    for s in summaries:
        if runs and runs[-1][0] == s["gpu"]:
            runs[-1][1] += 1
        else:
            runs.append([s["gpu"], 1])
    mix = ",".join(f"{gpu}:{count}" for gpu, count in runs)
    out = {"replica_gpus": mix, "gpu_per_replica": [s["gpu"] for s in summaries],
           "kv_capacity_tokens_per_replica": [s["kv_capacity_tokens"] for s in summaries]}
    if "vllm_kv_cache_size_tokens" in summaries[0]:  # vLLM v1's KV cache groups: the tokens vLLM logs
        out["vllm_kv_cache_size_tokens_per_replica"] = [s["vllm_kv_cache_size_tokens"] for s in summaries]
        out["vllm_kv_cache_size_tokens"] = sum(out["vllm_kv_cache_size_tokens_per_replica"])
        out["vllm_max_concurrency"] = sum(s["vllm_max_concurrency"] for s in summaries)
    if len(runs) > 1:
        out["gpu"] = mix
        out["kv_budget"] = "; ".join(dict.fromkeys(s["kv_budget"] for s in summaries))
    return out


def merged_itl(states: list[state.Core]) -> InterTokenLatencies:
    first = InterTokenLatencies.of(states[0])
    return InterTokenLatencies(sum(float(s.clock[state.ITL_SUM]) for s in states),
                               sum(int(s.count[state.ITL_COUNT]) for s in states),
                               sum(s.itl_hist for s in states), first.edges)


def balance(c: Cluster, summaries: list[dict], router: str) -> dict:
    """How evenly the router spread the load: requests routed to each replica, completed by
    each, and the largest over the mean (1.0: perfectly even)."""
    routed = c.routed.astype(float)
    busy = np.array([s["busy_s"] for s in summaries])
    return {"replicas": len(c.replicas), "router": router,
            "routed_per_replica": c.routed.tolist(),
            "completed_per_replica": [int(s["completed"]) for s in summaries],
            "busy_s_per_replica": busy.tolist(),
            "routed_max_over_mean": float(routed.max() / routed.mean()) if routed.mean() > 0 else float("nan"),
            "busy_max_over_mean": float(busy.max() / busy.mean()) if busy.mean() > 0 else float("nan")}
