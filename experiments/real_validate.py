"""A real serving run replayed: the same workload on the same engine settings, simulated, and
the client's measurements beside the simulator's (``pagesim validate --against``).

The run's files (``traces.real_runs``) give the engine's settings (model, TP, ``max_model_len``,
``max_num_batched_tokens``, ``max_num_seqs``; an LLMServingSim run also its block size and the
number of KV blocks vLLM allocated, which then sets the pool) and the workload; the caller gives
what the files do not (the GPU; the system, ``vllm-v1`` with prefix caching by default, as vLLM
serves today) and may override any setting. An LLMServingSim run was timed on the engine's clock
from its queue, so its replay's TTFT and E2E leave out the cost model's front end. Per scope (each stage, and the whole run) the comparison reads
what the client reported, by its own definitions (inference-perf's ``reportgen/base.py``
``summarize_requests``; vLLM's ``calculate_metrics``): TTFT, TPOT = (last token - first token) /
(tokens - 1) per request, ITL = all of a scope's token gaps pooled (their mean: summed decode
time over summed gaps), E2E, and requests per second = requests / (last finish - first send).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pagesim.sim.cluster import run_cluster
from pagesim.sim.config import SYSTEMS, SimConfig
from pagesim.sim.systems import SCHEDULERS
from pagesim.sim.errors import ConfigError, InvariantError
from pagesim.sim.run import SimResult, run_simulation
from pagesim.sim.specs.gpus import GiB
from pagesim.sim.specs.model import with_kv_cache_dtype
from pagesim.sim.specs.presets import get_model
from pagesim.traces import sharegpt_sample
from pagesim.traces.inference_perf import inference_perf_trace, stage_starts
from pagesim.traces.real_runs import LATENCY_STATS, RealRun, send_times

#: the engine settings a run's files state (vLLM's names) -> SimConfig's
ENGINE_SETTINGS = {"tensor_parallelism": "tensor_parallel", "max_model_len": "max_seq_len",
                   "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
                   "block_size": "block_size", "gpu_memory_utilization": "gpu_memory_utilization",
                   "enable_prefix_caching": "prefix_caching", "enable_expert_parallel": "expert_parallel"}
#: what a run served with that the replay does not model: (engine setting, refused where, why)
UNMODELLED = (("dtype", lambda v: v in ("float32", "float"), "32-bit weights are not modelled (2-byte presets)"),)
#: how a run of data-parallel engine ranks (vLLM's --data-parallel-size) is replayed: one replica
#: each, behind the router nearest vLLM's: its front end sends a request to the rank with the
#: fewest waiting + running requests (``DPLBAsyncMPClient.get_core_engine_for_request``,
#: vllm/v1/engine/core_client.py of vLLM 0.33.0, lines 1762-1806). Not modelled: vLLM breaks ties
#: round-robin (its first rank moves on at every request), here the lowest rank takes them; and
#: its penalty on a rank whose requests wait while its KV pool is over half full
DATA_PARALLEL_ROUTER = "least-outstanding-requests"
#: the metrics compared, in the table's order: (key prefix, label)
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))
#: the system a run replays on unless the caller names another: vLLM as it serves today
DEFAULT_SYSTEM = "vllm-v1"


@dataclass
class Validation:
    """A replay's outcome: per scope, the measured and simulated figures (``measured[scope][key]``,
    ``simulated[scope][key]``, seconds and requests per second); the config that ran; the
    simulation's own result; requests the simulation did not finish."""

    run: RealRun
    config: SimConfig
    measured: dict
    simulated: dict
    result: SimResult
    unfinished: int  # requests the replay neither finished nor rejected
    rejected: int = 0  # requests the replay rejected, each with its reason (a client's timeout: --client-timeout)

    def errors(self) -> pd.DataFrame:
        """One row per scope and figure both sides have: real, sim, and sim / real - 1."""
        rows = []
        for scope, real in self.measured.items():
            sim = self.simulated.get(scope, {})
            for key, value in real.items():
                if key in sim and key not in ("count", "failures") and value > 0:
                    rows.append({"scope": scope, "metric": key, "real": value, "sim": sim[key],
                                 "error": sim[key] / value - 1.0})
        return pd.DataFrame(rows, columns=["scope", "metric", "real", "sim", "error"])


def replay_config(run: RealRun, gpu: str | None, settings: dict | None = None) -> SimConfig:
    """The SimConfig that replays ``run``: its engine's stated settings, then ``settings`` (the
    caller's, which win), on ``gpu``."""
    settings = dict(settings or {})
    for key, refused, why in UNMODELLED:
        if key in run.engine and refused(run.engine[key]):
            raise ConfigError(f"{run.source}: {key} = {run.engine[key]}: {why}")
    gpu = gpu or run.info.get("gpu")
    if not (gpu or settings.get("gpu")):
        raise ConfigError(f"{run.source}: the run's files do not name its GPU; give --gpu (e.g. h100-80gb)")
    stated = {ours: run.engine[theirs] for theirs, ours in ENGINE_SETTINGS.items() if theirs in run.engine}
    if "model" in run.engine:
        stated["model"] = run.engine["model"]
    if "model" not in stated and "model" not in settings:
        raise ConfigError(f"{run.source}: the run's files do not name its model; give --model")
    if str(run.engine.get("kv_cache_dtype", "auto")).startswith("fp8"):  # fp8, fp8_e4m3, fp8_e5m2: 1 byte
        stated["kv_cache_dtype"] = "fp8"
    merged = {**stated, **{k: v for k, v in settings.items() if v is not None}}
    if "num_gpu_blocks" in run.engine and "kv_gib" not in merged:
        merged["kv_gib"] = pool_gib(run.engine["num_gpu_blocks"], merged, run.source)
    if gpu:
        merged["gpu"] = gpu
    # a fact table may name the system and cost model that replay its run (a published engine's
    # nearest: traces.sharegpt_sample's runs); the caller's win: a system, a cost model or a
    # profile of the caller's leaves the table's cost model out (the system's own default stands)
    chosen = merged.pop("system", None)
    system = chosen or run.info.get("system") or DEFAULT_SYSTEM
    if "cost_model" in run.info and not (chosen or merged.get("cost_model") or merged.get("profile")):
        merged["cost_model"] = run.info["cost_model"]
    moe = get_model(merged["model"]).moe is not None
    if not moe and settings.get("expert_parallel") is None:  # vLLM's expert parallel splits MoE layers
        merged.pop("expert_parallel", None)  # alone: a dense model ignores the run's flag (not the caller's)
    ranks = data_parallel_ranks(run)
    if ranks > 1 and not merged.get("expert_parallel") and moe:
        # vLLM shards each expert over the ranks' GPUs and gathers their tokens at every MoE layer
        # without expert parallel too (FusedMoEParallelConfig.make, fused_moe/config.py of vLLM
        # 0.33.0, lines 1198-1230: the TP size flattened over the data-parallel ranks)
        raise ConfigError(f"{run.source}: data_parallel_size = {ranks} of a mixture of experts without expert "
                          "parallel (its experts sharded over every rank's GPUs) is not modelled")
    scheduler = merged.get("scheduler") or SYSTEMS.get(system, {}).get("scheduler")
    takes_timeout = scheduler in SCHEDULERS and "client_timeout_s" in SCHEDULERS[scheduler].owned
    if "client_timeout_s" in run.workload and takes_timeout:
        merged.setdefault("client_timeout_s", float(run.workload["client_timeout_s"]))  # the client's patience
    return SimConfig.for_system(system, **merged)


def data_parallel_ranks(run: RealRun) -> int:
    """The data-parallel engine ranks ``run`` served with (vLLM's --data-parallel-size)."""
    return int(run.engine.get("data_parallel_size", 1))


def parallel_layout(run: RealRun, cfg: SimConfig) -> str:
    """How the replay spreads ``run`` over GPUs, in words: "TP 2", "TP 1, DP 2, EP"."""
    ranks = data_parallel_ranks(run)
    return (f"TP {cfg.tensor_parallel}" + (f", DP {ranks}" if ranks > 1 else "")
            + (", EP" if cfg.expert_parallel else ""))


def pool_gib(num_gpu_blocks: int, settings: dict, source: str) -> float:
    """The KV pool, in GiB per GPU, of the ``num_gpu_blocks`` blocks vLLM allocated (its profile of
    the memory left after weights, activations and CUDA graphs), so that the replay's pool is the
    run's own rather than pagesim's estimate of it: blocks x block size x bytes per token on one
    GPU of the TP group. Exact: bytes per token are whole and GiB a power of two."""
    model = with_kv_cache_dtype(get_model(settings["model"]), settings.get("kv_cache_dtype"))
    if model.layer_kinds and any(kind != model.kinds[0] for kind in model.kinds):
        raise ConfigError(f"{source}: num_gpu_blocks of a model with hybrid layers is not replayed here; give --kv-gib")
    per_token = model.kv_bytes_per_token(settings.get("tensor_parallel", 1))
    return num_gpu_blocks * settings.get("block_size", 16) * per_token / GiB


def scope_figures(frame: pd.DataFrame) -> dict:
    """A scope's figures by the clients' definitions (module docstring) over its finished rows of
    a request table (``ttft_s``, ``tpot_s``, ``e2el_s``, ``arrival_s``, ``finish_s``,
    ``first_token_s``, ``output_tokens``)."""
    done = frame[np.isfinite(frame["finish_s"].to_numpy(dtype=np.float64))]
    out = {"count": len(done)}
    if not len(done):
        return out
    gaps = done["output_tokens"].to_numpy() - 1
    decode = (done["finish_s"] - done["first_token_s"]).to_numpy()
    values = {"ttft": done["ttft_s"].to_numpy(), "tpot": done["tpot_s"].dropna().to_numpy(),
              "e2e": done["e2el_s"].to_numpy()}
    for name, v in values.items():
        if len(v):
            out.update({f"{name}_mean": float(np.mean(v)), f"{name}_median": float(np.median(v)),
                        f"{name}_p90": float(np.percentile(v, 90)), f"{name}_p99": float(np.percentile(v, 99))})
    if gaps.sum() > 0:
        out["itl_mean"] = float(decode.sum() / gaps.sum())
    span = float((done["arrival_s"] + done["e2el_s"]).max() - frame["arrival_s"].min())  # as the client saw
    if span > 0:
        out["requests_per_s"] = len(done) / span
    return out


def validate_run(run: RealRun, cfg: SimConfig, seed: int = 0, progress: bool = False,
                 cost_model=None) -> Validation:
    """Replay ``run`` on ``cfg`` and compare (module docstring); ``cost_model``: a built one
    instead of ``cfg``'s (``benchmarks/fit_serving_time.py`` prices its candidates so)."""
    if run.requests is not None:
        trace = run.requests.copy()
        if "send.rate" in run.workload:  # an older vllm bench file: the client's sends drawn again
            trace["arrival_s"] = send_times(len(trace), run.workload["send.rate"], run.workload["send.burstiness"], seed)
        trace = trace[trace["succeeded"]].drop(columns="succeeded").reset_index(drop=True)
        trace["stage"] = 0
    elif run.fmt == "inference-perf":
        trace = inference_perf_trace(run, seed)
    elif run.fmt == sharegpt_sample.FORMAT:
        trace = sharegpt_sample.sharegpt_sample_trace(run, seed)
    else:
        raise ConfigError(f"{run.source}: run {run.name} ({run.fmt}) keeps its summary only, not its requests: "
                          "replay its own files")
    ranks = data_parallel_ranks(run)
    if ranks > 1:  # a replica per rank; with expert_parallel, one expert-parallel group (sim.cluster)
        if cost_model is not None:
            raise ConfigError(f"{run.source}: run {run.name} ran {ranks} data-parallel ranks: its replay prices each "
                              "by its configuration's cost model, not a given one")
        result = run_cluster(cfg, trace.drop(columns="stage"), ranks, DATA_PARALLEL_ROUTER)
    else:
        result = run_simulation(cfg, trace.drop(columns="stage"), progress=progress, cost_model=cost_model)
    table = result.requests.copy()
    if run.workload.get("clock") == "engine":  # measured from the engine's queue: no front end
        table["ttft_s"] = table["first_token_s"] - table["arrival_s"]
        table["e2el_s"] = table["finish_s"] - table["arrival_s"]
    table["stage"] = table["request_id"].map(dict(zip(trace["request_id"].astype(str), trace["stage"])))
    finished = np.isfinite(table["finish_s"].to_numpy(dtype=np.float64))
    simulated = {}
    if run.num_stages > 1:
        # the stages as the client ran them: each after the previous one drained
        # the request table counts from the first arrival (sim.requests.RequestTable): so do these
        offset = float(trace["arrival_s"].min())
        clock = [start - offset for start in trace.attrs["stage_starts"]]
        seen = table["arrival_s"] + table["e2el_s"]  # each finish as the client saw it (the front end's too)
        last = [float(seen[(table["stage"] == s) & finished].max()) for s in range(run.num_stages)]
        for s in range(1, run.num_stages):  # the replay's idle gap must outlast each stage's drain
            if last[s - 1] >= clock[s]:
                raise InvariantError(f"{run.source}: stage {s - 1}'s replay ran into stage {s}'s "
                                     "(traces.inference_perf's idle gap is too short for this run)")
        starts = stage_starts(run, last, clock)
        shift = table["stage"].map({s: starts[s] - clock[s] for s in range(run.num_stages)})
        for col in ("arrival_s", "finish_s", "first_token_s"):
            table[col] = table[col] + shift
    if run.fmt == "inference-perf":  # its client reports each stage, a run of one stage too
        for s in range(run.num_stages):
            simulated[f"stage {s}"] = scope_figures(table[table["stage"] == s])
    simulated["overall"] = scope_figures(table)
    rejected = (table["status"] == "rejected").to_numpy()
    return Validation(run, cfg, run.measured, simulated, result, int((~finished & ~rejected).sum()),
                      int(rejected.sum()))


def error_lines(v: Validation, width: int = 100) -> list[str]:
    """The comparison as a table of at most ``width`` columns: per scope and metric, the real and
    simulated mean and the error of each statistic."""
    err = v.errors()
    lines = [f"{'scope':<8} {'metric':<6} {'real mean':>10} {'sim mean':>10} "
             + " ".join(f"{'err ' + s:>10}" for s in LATENCY_STATS)]
    for scope in v.measured:
        e = err[err["scope"] == scope].set_index("metric")
        for key, label in METRICS:
            if f"{key}_mean" not in e.index:
                continue
            cells = [f"{100 * e.loc[f'{key}_{s}', 'error']:+9.1f}%" if f"{key}_{s}" in e.index else f"{'':>10}"
                     for s in LATENCY_STATS]
            lines.append(f"{scope:<8} {label:<6} {1e3 * e.loc[f'{key}_mean', 'real']:>7.2f} ms "
                         f"{1e3 * e.loc[f'{key}_mean', 'sim']:>7.2f} ms " + " ".join(cells))
        if "requests_per_s" in e.index:
            lines.append(f"{scope:<8} {'req/s':<6} {e.loc['requests_per_s', 'real']:>10.3f} "
                         f"{e.loc['requests_per_s', 'sim']:>10.3f} {100 * e.loc['requests_per_s', 'error']:+9.1f}%")
    return [line[:width] for line in lines]


#: the whole-run figures a table of many runs shows, and their labels
HEADLINE = (("e2e_mean", "E2E"), ("ttft_mean", "TTFT"), ("tpot_mean", "TPOT"), ("requests_per_s", "req/s"))


def runs_table_lines(errors: pd.DataFrame, width: int = 100) -> list[str]:
    """Many runs' comparisons (:meth:`Validation.errors` rows with a ``run`` column) as a table of
    at most ``width`` columns: a row per run, sim / real - 1 of its whole-run means, then the
    median |error| over the runs and over their stages."""
    overall = errors[errors["scope"] == "overall"].pivot_table(index="run", columns="metric", values="error",
                                                             sort=False)
    cols = [(key, label) for key, label in HEADLINE if key in overall]
    name_width = width - 1 - 9 * len(cols)
    lines = [f"{'run':<{name_width}} " + "".join(f"{label:>9}" for _, label in cols)]
    for run, row in overall.iterrows():
        lines.append(f"{str(run)[-name_width:]:<{name_width}} " + "".join(f"{100 * row[k]:>+8.1f}%" for k, _ in cols))
    for label, scope in (("median |error| over the runs", errors["scope"] == "overall"),
                         ("median |error| over their stages", errors["scope"] != "overall")):
        med = errors[scope].groupby("metric")["error"].apply(lambda e: float(np.median(np.abs(e))))
        lines.append(f"{label:<{name_width}} " + "".join(f"{100 * med[k]:>8.1f}%" if k in med else f"{'':>9}"
                                                         for k, _ in cols))
    return lines
