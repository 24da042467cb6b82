"""A disaggregated run: ``run_disaggregated(prefill_cfg, decode_cfg, trace, P, D, link=NAME)``.

P prefill replicas of ``prefill_cfg`` and D decode replicas of ``decode_cfg`` (each pool its
own GPU, tensor parallelism and limits; the same model and system), a router per pool, and a
KV link per decode replica, simulated as one run by the compiled loop of ``sim/core/events/disagg.py``
(whose docstring states the design; ``sim/core/kv/remote_kv.py`` the blocks' rules). This file
builds the two pools' states (each pool's request columns its own: the prefill pool's ask for
one token), runs the loop and writes the records: the request table with each request's
replicas and the phases of its TTFT, the step table and a summary per replica, and the
cluster's summary (latency over the client's view of each request, each pool's use, the
transfers, goodput per GPU).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pandas as pd

from pagesim.sim.cluster import (REQUEST_COLUMNS, ClusterRecords, ClusterResult, RequestSubset,
                                 grow_rings, merged_itl, replica_states)
from pagesim.sim.config import SimConfig
from pagesim.sim.systems import DEFAULT_POLICY
from pagesim.sim.core.events import disagg as core_disagg
from pagesim.sim.core import state
from pagesim.sim.core.events import loop, replay
from pagesim.sim.core.build import UNLIMITED, offload_rows
from pagesim.sim.core.events.cluster import ROUTERS
from pagesim.sim.core.outcome import reject_reasons
from pagesim.sim.errors import ConfigError, InvariantError
from pagesim.sim.specs.kv_groups import kv_cache_groups
from pagesim.sim.specs.presets import get_model
from pagesim.sim.metrics import StepRecords, SummaryOptions, request_frame, summarize
from pagesim.sim.requests import Status
from pagesim.sim.run import engine_summary, prepare
from pagesim.sim.specs.links import LINKS, get_link

DISAGG_ROUTERS = ("round-robin", "least-outstanding-requests", "least-kv-usage")
# which side's token the client sees first. decode: vLLM's disaggregated proxy streams the decode
# side's tokens (it recomputes the prompt's last token to sample the first: remote_kv.py) and
# drops the prefill's one-token reply. prefill: DistServe's context stage streams the token it
# samples as its prefill ends, before the KV moves (LLMServe/DistServe 82831f1,
# distserve/single_stage_engine.py:373-385); the decode side's waits then fall in the TPOT.
FIRST_TOKEN_SOURCES = ("decode", "prefill")
# the per-request phases of the TTFT, in order (they sum to the engine's TTFT: requests.csv)
PHASES = ("prefill_queue_s", "prefill_s", "decode_admit_wait_s", "transfer_wait_s", "transfer_s",
          "decode_first_step_s")


def check_disagg(prefill_cfg: SimConfig, decode_cfg: SimConfig, prefill: int, decode: int,
                 router: str, link: str, first_token: str = "decode") -> None:
    """What a disaggregated run cannot take, refused in one line each (ConfigError)."""
    if first_token not in FIRST_TOKEN_SOURCES:
        raise ConfigError(f"--first-token {first_token!r} is unknown; valid: "
                          f"{', '.join(FIRST_TOKEN_SOURCES)}")
    for name, count in (("--prefill-replicas", prefill), ("--decode-replicas", decode)):
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ConfigError(f"{name} must be a whole number >= 1, got {count!r}")
    for cfg in (prefill_cfg, decode_cfg):
        if not cfg.capabilities.disaggregates or cfg.manager != "paged":
            raise ConfigError(f"--prefill-replicas/--decode-replicas model vLLM v1's KV connector: "
                              f"--system vllm-v1 only (got {cfg.label})")
        if cfg.scheduling_policy != DEFAULT_POLICY:
            raise ConfigError(f"--prefill-replicas: --scheduling-policy {cfg.scheduling_policy} is not modelled "
                              "with disaggregation yet")
        if cfg.client_timeout_s is not None:
            raise ConfigError("--prefill-replicas: --client-timeout is not modelled with "
                              "disaggregation yet")
        if cfg.num_speculative_tokens:
            raise ConfigError("--prefill-replicas: --num-speculative-tokens is not modelled with "
                              "disaggregation yet")
        if cfg.expert_parallel:  # each pool's replicas would be engines of their own, not one group
            raise ConfigError("--expert-parallel is not modelled with --prefill-replicas/--decode-replicas")
        if cfg.kv_offload_gib:  # both hold blocks while a connector loads (host_tier.py, remote_kv.py)
            raise ConfigError("--prefill-replicas: --kv-offload-gib is not modelled with "
                              "disaggregation yet")
        if kv_cache_groups(get_model(cfg.model)).hybrid:  # the transfer moves one group's blocks
            raise ConfigError(f"--prefill-replicas: {cfg.model}'s hybrid KV cache groups (sliding-window or "
                              "Mamba state) are not modelled with disaggregation yet")
    differ = [f for f in ("model", "system", "block_size", "kv_cache_dtype", "seed")
              if getattr(prefill_cfg, f) != getattr(decode_cfg, f)]
    if differ:
        raise ConfigError("--prefill-replicas/--decode-replicas: both pools run one model and "
                          f"system; {differ[0]} differs")
    if router not in DISAGG_ROUTERS:
        why = " is not offered with disaggregation" if router in ROUTERS else " is unknown"
        raise ConfigError(f"--router {router!r}{why}; valid: {', '.join(DISAGG_ROUTERS)}")
    if link not in LINKS:
        raise ConfigError(f"--kv-link: unknown link {link!r} (choose from {', '.join(LINKS)})")


class Disaggregated:
    """The loop's arrays: the replicas (prefill first), their config/count/clock rows, the
    requests routed to each, each request's prefill and decode replica, its timeline (the
    phases' ends), the in-flight transfers, each decode link's queue, each replica's TP."""

    def __init__(self, states: list, prefill: int, router: str, link, bytes_per_token: float,
                 tps: list[int], arrival_s: np.ndarray):
        n = len(arrival_s)
        self.replicas = states
        self.prefill = prefill
        self.configs, self.counts, self.clocks = (getattr(states[0], a).base
                                                  for a in ("config", "count", "clock"))
        self.routed = np.zeros(len(states), np.int64)
        self.replica_of = np.full(n, -1, np.int64)
        self.decode_of = np.full(n, -1, np.int64)
        self.timeline = np.full((max(n, 1), core_disagg.NUM_TIMELINE), np.nan)
        self.in_flight = np.zeros((max(n, 1), 2), np.int64)
        self.free_at = np.zeros(len(states) - prefill)
        self.tp = np.array(tps, np.int64)
        self.dc = np.zeros(core_disagg.NUM_DISAGG_COUNTS, np.int64)
        self.dc[core_disagg.D_ROUTER] = ROUTERS[router]
        self.dc[core_disagg.D_PREFILL] = prefill
        self.dk = np.zeros(core_disagg.NUM_DISAGG_CLOCK)
        self.dk[core_disagg.E_BANDWIDTH] = link.bandwidth
        self.dk[core_disagg.E_LATENCY] = link.latency
        self.dk[core_disagg.E_BYTES_PER_TOKEN] = bytes_per_token
        self.arrival_s = arrival_s
        self.checked_now = [0.0] * len(states)  # each replica's time at its last check

    def mine(self, r: int) -> np.ndarray:
        """The requests replica ``r`` owns (its pool's columns)."""
        if r < self.prefill:
            return self.replica_of == r
        return self.decode_of == r - self.prefill

    def run(self) -> float:
        """Run to the end; returns the loop's wall time."""
        def args():
            return (self.replicas, self.configs, self.counts, self.clocks, self.routed,
                    self.replica_of, self.decode_of, self.timeline, self.in_flight, self.free_at,
                    self.tp, self.dc, self.dk, self.arrival_s)

        with warnings.catch_warnings():  # numba's pending deprecation of reflected lists (its 0.44)
            warnings.filterwarnings("ignore", message=r"(?s).*type .reflected list. found")
            run = replay.compiled_entry(core_disagg.run_v1, *args())
        t0 = time.perf_counter()
        while True:
            code = run(*args())
            if code == loop.DONE:
                break
            r = int(self.dc[core_disagg.D_STOPPED_REPLICA])
            if code == loop.ROWS_FULL:
                self.replicas[r] = replay.grow_rows(self.replicas[r])
            elif code == loop.STEPPED:  # --check: this replica, over its own requests
                self.checked(r)
            else:
                replay.raise_for(code, self.replicas[r], f"replica {r}: ")
                raise AssertionError(f"replica {r}: the loop returned {code}")  # not reached
        wall_time_s = time.perf_counter() - t0
        replay.require_every_request_ended(self.replicas[:self.prefill])
        handed = self.decode_of >= 0
        ended = sum(int(s.count[state.NUM_FINISHED] + s.count[state.NUM_REJECTED])
                    for s in self.replicas[self.prefill:])
        if ended != int(handed.sum()):
            left = int(handed.sum()) - ended
            raise InvariantError(f"the run ended with {left} requests handed to the decode pool "
                                 "neither finished nor rejected there")
        return wall_time_s

    def checked(self, r: int) -> None:
        """``--check`` after replica ``r``'s step: its state over its own requests (check.py),
        and its time's order."""
        from pagesim.sim.core import check

        s = self.replicas[r]
        now = float(s.clock[state.NOW])
        if now < self.checked_now[r]:
            raise InvariantError(f"replica {r}: simulated time went backwards: {now} < "
                                 f"{self.checked_now[r]}")
        self.checked_now[r] = now
        try:
            check.check(s, self.mine(r))
        except AssertionError as e:
            raise InvariantError(f"t={now:.6f}: replica {r}: core state inconsistent: {e}") \
                from None


def disaggregated_columns(n: int) -> dict:
    """The per-request columns of a disaggregated run's states alone (one entry elsewhere:
    sim.core.build): when each request was first admitted (NaN before; remote_kv.py) and when
    its KV transfer ends (lifecycle.kv_arrived)."""
    return dict(admitted_s=np.full(max(n, 1), np.nan), load_ready_s=np.zeros(max(n, 1)))


def run_disaggregated(prefill_cfg: SimConfig, decode_cfg: SimConfig, trace: pd.DataFrame,
                      prefill: int, decode: int, router: str = "round-robin", link: str = "ib-ndr",
                      link_gbps: float | None = None,
                      summary_options: SummaryOptions = SummaryOptions(),
                      first_token: str = "decode") -> ClusterResult:
    """Run ``trace`` through ``prefill`` replicas of ``prefill_cfg`` and ``decode`` of
    ``decode_cfg`` behind ``router`` (one per pool), their KV over ``link`` (a preset of
    ``sim/specs/links.py``, the decode GPU's; ``link_gbps``: a measured rate instead);
    ``first_token``: the side whose token the client sees first (:data:`FIRST_TOKEN_SOURCES`)."""
    check_disagg(prefill_cfg, decode_cfg, prefill, decode, router, link, first_token)
    one_token = trace.copy()
    one_token["output_tokens"] = 1  # the proxy's prefill request: max_tokens=1
    one_token.attrs = dict(trace.attrs)
    n, k = len(trace), prefill + decode
    run_p, run_d = (run._replace(state=run.state._replace(**disaggregated_columns(n)))
                    for run in (prepare(prefill_cfg, one_token), prepare(decode_cfg, trace)))
    kv_link = get_link(link, run_d.gpu, link_gbps)
    rows = max(1024, 8 * n // k) if prefill_cfg.record_steps else 0
    states = replica_states([(run_p.state, prefill), (run_d.state, decode)], prefill_cfg.seed, rows)
    decode_columns = {name: getattr(run_d.state, name) for name in REQUEST_COLUMNS}
    decode_columns["arrival_s"] = run_d.state.arrival_s.copy()  # rewritten with each handoff's time
    for r, s in enumerate(states):
        if r >= prefill:
            s = s._replace(**decode_columns)
        # every request fits in its queues: no ring to grow
        s = grow_rings(s, max(n, 1)) if len(s.waiting) < n else s
        s = with_holding_rows(s, n)
        s = s._replace(exchange=np.zeros(max(n, 1), np.int64))
        s.config[state.PROGRESS_EVERY] = UNLIMITED
        s.config[state.DISAGG_ROLE] = state.PREFILL_SIDE if r < prefill else state.DECODE_SIDE
        if r >= prefill and len(s.offload) < n:  # its prefills in flight (host_tier.reserved_blocks)
            s = s._replace(offload=offload_rows(n))
        states[r] = s
    tps = [prefill_cfg.tensor_parallel] * prefill + [decode_cfg.tensor_parallel] * decode
    c = Disaggregated(states, prefill, router, kv_link, float(run_p.budget.kv_bytes_per_token), tps,
                      run_p.state.arrival_s)
    wall_time_s = c.run()
    return disagg_result(prefill_cfg, decode_cfg, run_p, run_d, c, router, kv_link, wall_time_s,
                         summary_options, first_token)


def with_holding_rows(s: state.Core, num_requests: int) -> state.Core:
    """``s`` with a block-table row for ``max_num_seqs`` requests holding KV beyond those running:
    a prefill replica's finished prompts until their transfers end, a decode replica's requests
    loading or loaded. vLLM keeps a request's blocks in a table of its own; pagesim keeps them in
    a row, so a replica with no row left admits no new request until a transfer frees one
    (``scheduler_v1.admit_waiting``): past ``max_num_seqs`` such requests a replica waits where
    vLLM would not."""
    rows = min(2 * int(s.config[state.MAX_NUM_SEQS]), max(num_requests, 1))
    if rows <= len(s.free_slots):
        return s
    s.count[state.NUM_FREE_SLOTS] = rows
    return s._replace(free_slots=np.arange(rows, dtype=np.int64),
                      block_table=np.zeros((rows, s.block_table.shape[1]), np.int32))


def client_table(run_p, run_d, c: Disaggregated, first_token: str = "decode"):
    """The requests as their clients see them: the trace's arrival, the first token of the side
    ``first_token`` names (:data:`FIRST_TOKEN_SOURCES`), the decode side's end; refused where
    either side refused them."""
    t = run_d.table
    view = RequestSubset(t, np.ones(t.size, bool))
    if first_token == "prefill":
        view.first_token_s = run_p.table.first_token_s.copy()
    view.status = t.status.copy()
    view.status[run_p.table.status == Status.REJECTED] = Status.REJECTED
    view.reject_code = np.where(run_p.table.status == Status.REJECTED, run_p.table.reject_code, t.reject_code)
    view.arrival_s = run_p.table.arrival_s
    view.request_id, view.n, view.beam, view.preemptions = t.request_id, t.n, t.beam, t.preemptions
    view.has_priority = False
    view.frontend_s = run_p.table.frontend_s
    return view


def phases(run_p, run_d, c: Disaggregated) -> dict[str, np.ndarray]:
    """Each request's TTFT in phases (seconds; NaN where it did not get there): they sum to its
    engine TTFT (the decode side's first token less the trace's arrival; the client's TTFT
    unless its first token is the prefill side's, ``first_token="prefill"``: the first two)."""
    tl = c.timeline[:run_p.table.size]
    arrival, prefill_admitted = run_p.table.arrival_s, run_p.state.admitted_s
    handoff, asked, flow, end = (tl[:, k] for k in (core_disagg.T_HANDOFF, core_disagg.T_ASKED,
                                                    core_disagg.T_FLOW, core_disagg.T_END))
    return {"prefill_queue_s": prefill_admitted - arrival, "prefill_s": handoff - prefill_admitted,
            "decode_admit_wait_s": asked - handoff, "transfer_wait_s": flow - asked,
            "transfer_s": end - flow, "decode_first_step_s": run_d.table.first_token_s - end}


def disagg_result(prefill_cfg, decode_cfg, run_p, run_d, c: Disaggregated, router: str, kv_link,
                  wall_time_s: float, options: SummaryOptions,
                  first_token: str = "decode") -> ClusterResult:
    """The records: each replica's summary and steps (its pool's requests), the request table
    (the client's view, each request's replicas, its TTFT's phases and transfer), the summary."""
    summaries, steps, records = [], [], []
    n = run_p.table.size
    reasons = np.full(n, "", dtype=object)
    for r, s in enumerate(c.replicas):
        prefill_side = r < c.prefill
        side, run, cfg = (("prefill", run_p, prefill_cfg) if prefill_side
                          else ("decode", run_d, decode_cfg))
        mine = c.mine(r)
        why = reject_reasons(s, run.pool, run.limits, cfg)[mine]  # by the side that refused it
        reasons[mine] = np.where(reasons[mine] == "", why, reasons[mine])
        rec = StepRecords(s, run.pool.capacity, blocks=True, in_transfer=True)
        summary = engine_summary(cfg, run._replace(state=s), RequestSubset(run.table, mine), rec,
                                 wall_time_s, float(s.clock[state.END_S]), options)
        summary.update(replica=r, pool=side, routed=int(c.routed[r]))
        summaries.append(summary)
        frame = rec.frame()
        frame.insert(0, "replica", r)
        frame.insert(1, "pool", side)
        steps.append(frame)
        records.append(rec)
    view = client_table(run_p, run_d, c, first_token)
    requests = request_frame(view, reasons)
    requests.insert(1, "prefill_replica", c.replica_of)
    requests.insert(2, "decode_replica", np.where(c.decode_of >= 0, c.decode_of + c.prefill, -1))
    parts = phases(run_p, run_d, c)
    for name in PHASES:
        requests[name] = parts[name]
    requests["transfer_bytes"] = c.timeline[:n, core_disagg.T_BYTES]
    end_s = max(float(s.clock[state.END_S]) for s in c.replicas)
    prefill_gpus = c.prefill * prefill_cfg.tensor_parallel
    decode_gpus = (len(c.replicas) - c.prefill) * decode_cfg.tensor_parallel
    extra = {k: summaries[c.prefill][k] for k in ("system", "model", "kv_bytes_per_token",
                                                   "kv_cache_dtype", "block_size", "seed", "engine",
                                                   "cpu_overhead")}
    gpus = (summaries[0]["gpu"], summaries[c.prefill]["gpu"])  # as --replica-gpus names a mix
    decode = len(c.replicas) - c.prefill
    extra["gpu"] = gpus[0] if gpus[0] == gpus[1] else f"{gpus[0]}:{c.prefill},{gpus[1]}:{decode}"
    decode_states = c.replicas[c.prefill:]
    summary = summarize(view, ClusterRecords(records), merged_itl(decode_states),
                        sum(int(s.count[state.NUM_PREEMPTIONS]) for s in c.replicas),
                        duration_s=end_s, wall_time_s=wall_time_s, extra=extra, options=options)
    num_gpus = prefill_gpus + decode_gpus
    summary.update(disagg_summary(c, summaries, requests, router, kv_link, num_gpus, end_s))
    summary["first_token"] = first_token
    if "request_goodput" in summary:
        summary["request_goodput_per_gpu"] = summary["request_goodput"] / num_gpus
    return ClusterResult(summary, requests, pd.concat(steps, ignore_index=True), decode_cfg,
                         replica_summaries=summaries)


def in_transfer_shares(c: Disaggregated, summaries: list[dict], requests: pd.DataFrame,
                       end_s: float) -> dict:
    """Each pool's share of its KV slots held by in-flight transfers over the whole run, from
    the requests' timelines: the prefill side holds a request's blocks from its handoff to its
    transfer's end, the decode side from its admission (the transfer's ask) to that end. (The
    replicas' ``mem_*`` keys weigh each step's categories by its duration and count idle time
    free, as any engine's: an idle replica's blocks in transfer are seen here only.)"""
    block = summaries[0]["block_size"]
    slots = np.ceil(requests["prompt_tokens"].to_numpy() / block) * block
    tl = c.timeline[:len(requests)]
    handoff, asked = tl[:, core_disagg.T_HANDOFF], tl[:, core_disagg.T_ASKED]
    end = tl[:, core_disagg.T_END]
    out = {}
    for side, start, group in (("prefill", handoff, summaries[:c.prefill]),
                               ("decode", asked, summaries[c.prefill:])):
        held = np.nansum(slots * (end - start))
        capacity = sum(s["kv_capacity_tokens"] for s in group)
        out[f"{side}_kv_in_transfer"] = float(held / (capacity * end_s)) if end_s > 0 else 0.0
    return out


def disagg_summary(c: Disaggregated, summaries: list[dict], requests: pd.DataFrame, router: str,
                   kv_link, num_gpus: int, end_s: float) -> dict:
    """The cluster's own keys: each pool's replicas, GPUs, use (busy share of the run), KV use
    (the in-use share of its slots over the run) and queueing; the transfers; the TTFT's
    phases (means, ms)."""
    out = {"disaggregated": True, "router": router, "kv_link": kv_link.name,
           "kv_link_gbytes_per_s": kv_link.bandwidth / 1e9,
           "kv_link_latency_us": kv_link.latency * 1e6, "gpus": num_gpus}
    finished = requests["status"] == "finished"
    for side, group in (("prefill", summaries[:c.prefill]), ("decode", summaries[c.prefill:])):
        free = [s["mem_free_idle"] + s["mem_external_frag"] for s in group]
        out[f"{side}_replicas"] = len(group)
        out[f"{side}_gpu"] = group[0]["gpu"]
        out[f"{side}_tensor_parallel"] = group[0]["tensor_parallel"]
        out[f"{side}_routed_per_replica"] = [s["routed"] for s in group]
        busy = float(np.mean([s["busy_s"] for s in group]))
        out[f"{side}_utilization"] = busy / end_s if end_s > 0 else 0.0
        out[f"{side}_kv_used"] = float(1.0 - np.mean(free))
        out[f"{side}_kv_capacity_tokens"] = group[0]["kv_capacity_tokens"]
    out.update(in_transfer_shares(c, summaries, requests, end_s))
    queue = {"prefill": "prefill_queue_s", "decode": "decode_admit_wait_s"}
    for side, column in queue.items():
        out[f"mean_{side}_queue_ms"] = float(requests.loc[finished, column].mean() * 1e3)
    for name in PHASES:
        out[f"mean_ttft_{name[:-2]}_ms"] = float(requests.loc[finished, name].mean() * 1e3)
    moved = requests["transfer_bytes"].dropna()
    out["transfers"] = int(len(moved))
    out["transfer_bytes_total"] = float(moved.sum())
    out["mean_transfer_bytes"] = float(moved.mean()) if len(moved) else float("nan")
    with_queue = (requests["transfer_wait_s"] + requests["transfer_s"]).dropna()
    out["mean_transfer_ms"] = float(with_queue.mean() * 1e3)
    return out
