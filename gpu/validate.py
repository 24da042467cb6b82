"""Validate the simulator against real execution: ``validate(cfg, trace, backend, profile=None)``.

Three runs of the same trace with the same scheduler and paged manager code:

    real        run_simulation(..., executor=GPUExecutor(backend)): the core schedules, every
                iteration runs on the device and the clock advances by measured step times
                (idle gaps jump, see gpu/executor.py). At every step the same batch is also
                *priced* by the roofline model (and by the table model when a profile is given)
                and the real pool's occupied blocks are counted; the memory categories are the
                run's own step records.
    sim         run_simulation with the roofline cost model
    sim_table   run_simulation with the table cost model (only with a profile)

Outputs (``ValidationResult.save(dir)``)::

    step_errors.csv  errors by step type and batch size (see below)
    steps.csv        one row per real iteration: step, start_s, num_prefill_seqs,
                     num_prefill_tokens, num_decode_seqs, sum_decode_context,
                     max_decode_context (the longest: it sizes the attention kernel's grid), num_copies,
                     swap_in_tokens, swap_out_tokens, measured_s, predicted_roofline_s,
                     predicted_table_s, rel_error_roofline, rel_error_table, mem_<category>
                     (slots), pool_occupied_blocks, pool_occupied_bytes, sim_occupied_bytes,
                     num_waiting, num_running, step_type, batch_size, measured_gpu_s,
                     measured_host_s, predicted_roofline_gpu_s, predicted_table_gpu_s,
                     rel_error_roofline_gpu, rel_error_table_gpu
    validation.json  step errors, throughput / TTFT / TPOT of sim vs real, model, GPU, workload, date
    report.html      predicted vs measured, error histogram, timelines, memory (self-contained)
    real/, sim_roofline/, sim_table/   each run's summary.json, requests.csv, steps.csv

Measured step time = the executor's host preparation (tables, slot mappings) + the device
step, synchronized; the simulator's own Python (scheduler, records) is not counted, and idle
gaps between arrivals are jumped, not slept (see gpu/executor.py). So a validation run takes
about the trace's busy time on the GPU.

Host and device shares: a backend that reports ``last_timing = {"gpu_s", ...}`` splits each
measured step into its device share (``measured_gpu_s``; TorchCupyBackend: CUDA events around the
step's device work, scaled like the step) and the rest (``measured_host_s``: the executor's
preparation and the runner's host time not hidden behind the device). The GPU-only error
compares the device share with the model's price less its host term (``cpu_term``: the fixed and
per-sequence overheads); the whole-step error compares whole steps. ``step_errors.csv`` /
``errors_by_step`` break both down by step type (prefill, mixed, decode) and batch size;
``host_fit`` is a least-squares host term (intercept + per sequence) fitted on this run, and
``*_host_fitted_in_sample`` the whole-step errors with it in place of the model's own host
term: in-sample, so a bound on what pricing the host time can do, not a prediction.

Step error: ``|predicted - measured| / measured`` per iteration; ``median_step_error`` and
``p90_step_error`` are the calibrated table model's when a profile is given, else the
roofline's (``step_error_model`` says which); ``roofline_*`` are always the roofline's.
End-to-end errors (``throughput_error``, ``ttft_error``, ``tpot_error``) are
``|sim - real| / real`` of output throughput and mean TTFT/TPOT, the sim being the table-model
run when a profile is given, else the roofline run (``roofline_*`` versions always present).

K/V check (``check_kv``, default on; gpu/kv_check.py): after every copy-on-write and swap the
destination blocks are read back and compared byte for byte with their sources as they were
before the step (``kv_checked_blocks`` in validation.json).

Memory check: at every step the pool's occupied blocks, counted from the live block tables the
kernels read (distinct blocks of the running sequences), must equal the blocks the core's
allocator counts as used (the pool less its free and cached-idle blocks); a mismatch raises
:class:`sim.errors.InvariantError`. ``pool_occupied_bytes`` (those blocks x block_size x
kv_bytes_per_token) is then compared in the step table with ``sim_occupied_bytes``, (token_states
+ reservation + internal_frag + allocator_slack) x kv_bytes_per_token from the step records.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.gpu.executor import GPUExecutor
from pagesim.gpu.kv_check import KVContentCheck
from pagesim.gpu.validate_report import write_report
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.cost.models import make_cost_model, swap_block_tokens
from pagesim.sim.errors import ConfigError, InvariantError
from pagesim.sim.metrics import MEMORY_CATEGORIES
from pagesim.sim.run import SimResult, jsonable, resolve_budget, run_simulation

STEP_COLUMNS = (["step", "start_s", "num_prefill_seqs", "num_prefill_tokens", "num_decode_seqs",
                 "sum_decode_context", "max_decode_context", "num_copies", "swap_in_tokens", "swap_out_tokens",
                 "measured_s",
                 "predicted_roofline_s", "predicted_table_s", "rel_error_roofline", "rel_error_table"]
                + [f"mem_{c}" for c in MEMORY_CATEGORIES]
                + ["pool_occupied_blocks", "pool_occupied_bytes", "sim_occupied_bytes", "num_waiting", "num_running",
                   "step_type", "batch_size", "measured_gpu_s", "measured_host_s", "predicted_roofline_gpu_s",
                   "predicted_table_gpu_s", "rel_error_roofline_gpu", "rel_error_table_gpu", "measured_launch_s",
                   "gaps_hidden", "graph_size"])
#: batch-size buckets of the error breakdown (sequences in the step)
BATCH_BUCKETS = ((1, 1), (2, 4), (5, 16), (17, 64), (65, 256), (257, 1 << 30))

#: keys validation.json always has
REQUIRED_KEYS = ("median_step_error", "p90_step_error", "roofline_median_step_error", "roofline_p90_step_error",
                 "sim_output_throughput", "real_output_throughput", "throughput_error", "sim_mean_ttft_ms",
                 "real_mean_ttft_ms", "ttft_error", "sim_mean_tpot_ms", "real_mean_tpot_ms", "tpot_error",
                 "model", "gpu", "gpu_name", "workload", "date")


@dataclass
class ValidationResult:
    steps: pd.DataFrame
    metrics: dict
    real: SimResult
    sim_roofline: SimResult
    sim_table: SimResult | None = None
    extra: dict = field(default_factory=dict)

    def save(self, out_dir: str | Path, report: bool = True) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.steps.to_csv(out / "steps.csv", index=False)
        pd.DataFrame(self.metrics.get("errors_by_step", [])).to_csv(out / "step_errors.csv", index=False)
        (out / "validation.json").write_text(json.dumps(jsonable(self.metrics), indent=2, default=str) + "\n")
        self.real.save(out / "real")
        self.sim_roofline.save(out / "sim_roofline")
        if self.sim_table is not None:
            self.sim_table.save(out / "sim_table")
        if report:
            write_report(self, out / "report.html")
        return out


def rel_errors(predicted, measured) -> np.ndarray:
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(p - m) / m


def _q(x: np.ndarray, q: float) -> float:
    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else float("nan")


def _rel(sim: float, real: float) -> float:
    if real is None or sim is None or not math.isfinite(real) or not math.isfinite(sim) or real == 0:
        return float("nan")
    return abs(sim - real) / abs(real)


class _StepLog:
    """on_step hook of the executor: prices the batch, counts the pool's occupied blocks from the
    core's live tables (``core()``: the core's state as the step was scheduled) and checks them
    against the allocator's count."""

    def __init__(self, roof, table, kv_bytes_per_token: float, check_memory: bool, timing=None, core=None):
        self.roof, self.table = roof, table
        self.timing = timing or (lambda: None)  # the backend's last step split {gpu_s, host_s}, if any
        self.core = core
        self.kvb = float(kv_bytes_per_token)
        self.check_memory = check_memory
        self.rows: list[tuple] = []

    def __call__(self, batch, plan, measured: float) -> None:
        core = self.core()
        c = core.count
        running = core.running[:c[state.NUM_RUNNING]]
        width = core.num_seqs[running]
        requests = np.repeat(running, width)
        rows = core.seq_slot[requests, np.arange(len(requests)) - np.repeat(np.cumsum(width) - width, width)]
        held = np.arange(core.block_table.shape[1])[None, :] < core.num_blocks[requests][:, None]
        occ_blocks = len(np.unique(core.block_table[rows][held]))
        used = int(core.config[state.NUM_BLOCKS] - c[state.NUM_FREE_BLOCK_IDS] - c[state.NUM_LRU])
        if self.check_memory and occ_blocks != used:
            raise InvariantError(f"step {plan.step}: the block tables hold {occ_blocks} blocks, the allocator "
                                 f"counts {used} in use")
        pr = self.roof.step_time(batch)
        pt = self.table.step_time(batch) if self.table is not None else float("nan")
        n_seqs = len(batch.prefill_seq_ids) + len(batch.decode_seq_ids)
        # the device's share of the measured step (the backend's own split; the executor's host
        # preparation is in the rest); a backend that does not split counts all as device time
        timing = self.timing() or {}
        gpu = float(timing.get("gpu_s", measured))
        pr_gpu = pr - cpu_term(self.roof, n_seqs)
        pt_gpu = pt - cpu_term(self.table, n_seqs) if self.table is not None else float("nan")
        kind = "mixed" if len(batch.prefill_seq_ids) and len(batch.decode_seq_ids) else \
            "prefill" if len(batch.prefill_seq_ids) else "decode"
        self.rows.append((plan.step, len(batch.prefill_seq_ids), batch.num_prefill_tokens, len(batch.decode_seq_ids),
                          int(batch.decode_context_sum), plan.decode_max_context, len(plan.copies),
                          int(batch.swap_in_tokens), int(batch.swap_out_tokens), measured, pr, pt, occ_blocks,
                          occ_blocks * plan.block_size * self.kvb, kind, n_seqs, gpu, measured - gpu,
                          pr_gpu, pt_gpu, float(timing.get("launch_s", np.nan)), timing.get("gaps_hidden"),
                          timing.get("graph_size")))


def cpu_term(model, num_seqs: int) -> float:
    """The cost model's host (CPU) share of a step: its fixed and per-sequence overheads, the part
    ``sim.cost.models.ScaledCostModel`` leaves unscaled; the rest of its price is device time."""
    return float(getattr(model, "overhead_s", 0.0)) + float(getattr(model, "per_seq_overhead_s", 0.0)) * num_seqs


#: the step table's columns the run's own step records give (memory categories, queues)
RECORD_COLUMNS = [f"mem_{c}" for c in MEMORY_CATEGORIES] + ["num_waiting", "num_running"]


def _steps_frame(log: _StepLog, records: pd.DataFrame) -> pd.DataFrame:
    """The executor's rows beside the run's step records (one each per iteration, in order)."""
    cols = [c for c in STEP_COLUMNS if c not in ["start_s", "rel_error_roofline", "rel_error_table",
                                                 "rel_error_roofline_gpu", "rel_error_table_gpu",
                                                 "sim_occupied_bytes", *RECORD_COLUMNS]]
    df = pd.DataFrame(log.rows, columns=cols)
    if len(records) != len(df):
        raise InvariantError(f"the executor ran {len(df)} steps, the run recorded {len(records)}")
    for c in ["start_s", *RECORD_COLUMNS]:
        df[c] = records[c].to_numpy() if len(df) else np.zeros(0)
    held = sum(df[f"mem_{c}"] for c in MEMORY_CATEGORIES[:4])  # token states .. allocator slack
    df["sim_occupied_bytes"] = held * log.kvb
    df["rel_error_roofline"] = rel_errors(df["predicted_roofline_s"], df["measured_s"])
    df["rel_error_table"] = rel_errors(df["predicted_table_s"], df["measured_s"])
    df["rel_error_roofline_gpu"] = rel_errors(df["predicted_roofline_gpu_s"], df["measured_gpu_s"])
    df["rel_error_table_gpu"] = rel_errors(df["predicted_table_gpu_s"], df["measured_gpu_s"])
    return df[STEP_COLUMNS]


def batch_bucket(n: int) -> str:
    for lo, hi in BATCH_BUCKETS:
        if lo <= n <= hi:
            return f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi < 1 << 30 else f">={lo}")
    return "0"


def error_breakdown(steps: pd.DataFrame, model: str) -> pd.DataFrame:
    """Step errors of ``model`` ('table' or 'roofline') by step type and batch size (pure): per group
    the number of steps, median / p90 of the whole-step error and of the GPU-only error (device
    share measured vs the model's price without its host term), and the median measured device
    and host milliseconds."""
    cols = ["step_type", "batch_size", "steps", "median_step_error", "p90_step_error", "median_gpu_error",
            "p90_gpu_error", "median_measured_gpu_ms", "median_measured_host_ms"]
    if not len(steps):
        return pd.DataFrame(columns=cols)
    s = steps.assign(bucket=[batch_bucket(int(n)) for n in steps["batch_size"]])
    order = {b: i for i, b in enumerate(batch_bucket(lo) for lo, _ in BATCH_BUCKETS)}
    rows = []
    for (kind, bucket), g in s.groupby(["step_type", "bucket"], sort=False):
        whole, gpu = g[f"rel_error_{model}"].to_numpy(float), g[f"rel_error_{model}_gpu"].to_numpy(float)
        rows.append((kind, bucket, len(g), _q(whole, 50), _q(whole, 90), _q(gpu, 50), _q(gpu, 90),
                     1e3 * float(g["measured_gpu_s"].median()), 1e3 * float(g["measured_host_s"].median())))
    df = pd.DataFrame(rows, columns=cols)
    kinds = {"prefill": 0, "mixed": 1, "decode": 2}
    return df.sort_values(by=["step_type", "batch_size"], key=lambda c: c.map(kinds) if c.name == "step_type"
                          else c.map(order)).reset_index(drop=True)


def host_term_from(run: str | Path) -> dict:
    """The host term fitted on another validation's steps (``run``: its folder; its
    validation.json's ``host_fit``, intercept and per sequence in ms), to price this one's with:
    held out, where the run's own fit is in-sample. ConfigError naming the file when absent."""
    path = Path(run) / "validation.json"
    try:
        fit = json.loads(path.read_text())["host_fit"]
        term = {"intercept_ms": float(fit["intercept_ms"]), "per_seq_ms": float(fit["per_seq_ms"])}
    except FileNotFoundError:
        raise ConfigError(f"--host-from {run}: {path} not found (a folder pagesim validate wrote)") from None
    except (KeyError, TypeError, ValueError, json.JSONDecodeError):
        raise ConfigError(f"--host-from {run}: {path} has no host_fit (intercept_ms, per_seq_ms): a run "
                          "whose steps measured their host time apart") from None
    if not all(math.isfinite(v) and v >= 0 for v in term.values()):
        raise ConfigError(f"--host-from {run}: {path} field host_fit must be finite and >= 0, got {term}")
    return {"run": str(run), **term}


def host_fit(steps: pd.DataFrame) -> dict:
    """Least squares of the measured host share: host_s = intercept + per_seq * sequences (pure),
    both terms >= 0, as the cost model takes them (--step-overhead-ms, --per-seq-overhead-ms): where
    the free fit makes one negative (host time that falls with the batch, as on the H200 of
    2026-11-28), that term is 0 and the other is fitted alone. Fitted on the run it then prices, so
    the errors it gives are in-sample (a bound on what a host term can do), labelled as such in
    validation.json."""
    host = steps["measured_host_s"].to_numpy(float)
    n = steps["batch_size"].to_numpy(float)
    if len(steps) < 2 or steps["batch_size"].nunique() < 2:
        return {"intercept_ms": 1e3 * max(float(host.mean()), 0.0) if len(steps) else 0.0, "per_seq_ms": 0.0}
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones(len(n)), n], axis=1), host, rcond=None)
    if b < 0:  # the best line with no per-sequence term: the mean
        a, b = max(float(host.mean()), 0.0), 0.0
    elif a < 0:  # the best line through the origin
        a, b = 0.0, max(float(n @ host / (n @ n)), 0.0)
    return {"intercept_ms": 1e3 * float(a), "per_seq_ms": 1e3 * float(b)}


def run_real(cfg: SimConfig, trace: pd.DataFrame, backend, profile: str | None = None, *,
             progress: bool = False, check_memory: bool = True, host_blocks: int | None = None,
             check_kv: bool = True):
    """The real run: run_simulation with the GPU executor; (SimResult, steps DataFrame, executor)."""
    cfg = cfg.replace(profile=None, record_steps=True)
    model, gpu, budget = resolve_budget(cfg)
    if check_kv and hasattr(backend, "read_blocks"):
        backend = KVContentCheck(backend)
    # each step priced as the simulations price theirs: the same host term (--step-overhead-ms,
    # --per-seq-overhead-ms, or --host-from's) on top of each model's device time
    roof = make_cost_model(model, gpu, cfg.tensor_parallel, None, cfg.step_overhead_ms, cfg.per_seq_overhead_ms,
                           swap_block_tokens=swap_block_tokens(cfg), kernel_block_tokens=cfg.kernel_block_tokens)
    tab = (make_cost_model(model, gpu, cfg.tensor_parallel, profile, cfg.step_overhead_ms, cfg.per_seq_overhead_ms,
                           swap_block_tokens=swap_block_tokens(cfg)) if profile else None)
    log = _StepLog(roof, tab, budget.kv_bytes_per_token, check_memory,
                   timing=lambda: getattr(backend, "last_timing", None), core=lambda: ex.core)
    ex = GPUExecutor(model, backend, on_step=log, host_blocks=host_blocks)
    try:
        import tqdm  # noqa: F401  (the bar is a convenience: no tqdm, no bar)
    except ImportError:
        progress = False
    result = run_simulation(cfg, trace, progress=progress, executor=ex)
    result.summary.update({"executor": getattr(backend, "name", type(backend).__name__),
                           "executor_copies": ex.total_copies, "executor_swap_out_blocks": ex.total_swap_out_blocks,
                           "executor_swap_in_blocks": ex.total_swap_in_blocks})
    return result, _steps_frame(log, result.steps), ex


def validate(cfg: SimConfig, trace: pd.DataFrame, backend, profile: str | None = None, *,
             workload: dict | None = None, progress: bool = False, check_memory: bool = True,
             check_kv: bool = True) -> ValidationResult:
    """Run ``trace`` for real on ``backend`` and simulated; compare (see module docstring)."""
    profile = profile or cfg.profile
    real, steps, ex = run_real(cfg, trace, backend, profile, progress=progress, check_memory=check_memory,
                               check_kv=check_kv)
    sim_roof = run_simulation(cfg.replace(profile=None), trace)
    sim_tab = run_simulation(cfg.replace(profile=profile), trace) if profile else None
    metrics = compare(real, sim_roof, sim_tab, steps)
    metrics.update({
        "model": real.summary["model"], "gpu": real.summary["gpu"],
        "gpu_name": getattr(backend, "device_name", None) or getattr(backend, "name", "unknown"),
        "backend": getattr(backend, "name", type(backend).__name__),
        "dtype": getattr(backend, "dtype_name", None),
        "layers_run": getattr(backend, "L_run", None),
        "timing": getattr(backend, "timing", None),
        "ops": getattr(backend, "ops", None),
        "cuda_graphs": bool(getattr(backend, "cuda_graphs", None) or getattr(backend, "graph_sizes", None)),
        "graph_error": getattr(backend, "graph_error", None),
        "system": cfg.system, "block_size": cfg.block_size, "profile": str(profile) if profile else None,
        "workload": workload if workload is not None else {"rows": len(trace)},
        "num_requests": int(len(trace)),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "memory_check": "passed" if check_memory else "skipped",
        "kv_bytes_per_token": real.summary["kv_bytes_per_token"],
        "pool_block_bytes": real.summary["kv_bytes_per_token"] * cfg.block_size,
        "max_pool_occupied_bytes": float(steps["pool_occupied_bytes"].max()) if len(steps) else 0.0,
        "cow_copies": int(real.summary.get("mgr_cow_copies", 0)),
        "executor_copies": int(ex.total_copies),
        "kv_checked_blocks": int(getattr(ex.backend, "checked_blocks", 0)),
        "kv_check": "passed" if hasattr(ex.backend, "checked_blocks") else "skipped",
    })
    return ValidationResult(steps, metrics, real, sim_roof, sim_tab)


def compare(real: SimResult, sim_roof: SimResult, sim_tab: SimResult | None, steps: pd.DataFrame) -> dict:
    """The numbers of validation.json that compare runs (pure; see module docstring)."""
    r_err = steps["rel_error_roofline"].to_numpy(float)
    m: dict = {
        "num_steps": int(len(steps)),
        "roofline_median_step_error": _q(r_err, 50), "roofline_p90_step_error": _q(r_err, 90),
        "roofline_mean_step_bias": float(np.nanmean((steps["predicted_roofline_s"] - steps["measured_s"])
                                                    / steps["measured_s"])) if len(steps) else float("nan"),
        "measured_busy_s": float(steps["measured_s"].sum()),
    }
    if sim_tab is not None:
        t_err = steps["rel_error_table"].to_numpy(float)
        m.update({"table_median_step_error": _q(t_err, 50), "table_p90_step_error": _q(t_err, 90),
                  "median_step_error": _q(t_err, 50), "p90_step_error": _q(t_err, 90), "step_error_model": "table"})
    else:
        m.update({"median_step_error": m["roofline_median_step_error"],
                  "p90_step_error": m["roofline_p90_step_error"], "step_error_model": "roofline"})
    rs = real.summary
    main = sim_tab if sim_tab is not None else sim_roof
    m["sim_model"] = "table" if sim_tab is not None else "roofline"
    name = m["step_error_model"]
    g_err = steps[f"rel_error_{name}_gpu"].to_numpy(float) if f"rel_error_{name}_gpu" in steps else np.array([])
    m["median_gpu_step_error"], m["p90_gpu_step_error"] = _q(g_err, 50), _q(g_err, 90)
    hidden = steps["gaps_hidden"].dropna() if "gaps_hidden" in steps else pd.Series([], dtype=object)
    if len(hidden):  # device timing (model_runner.TIMINGS): steps whose hold ended before all was queued
        m["steps_with_launch_gaps"] = int((~hidden.astype(bool)).sum())
        m["median_launch_ms"] = 1e3 * float(steps["measured_launch_s"].median())
    if "measured_host_s" in steps and len(steps):
        m["measured_host_share"] = float(steps["measured_host_s"].sum() / steps["measured_s"].sum())
        # each step's host time (preparation, a graph's input copies) apart from its device time
        m["median_host_ms"] = 1e3 * float(steps["measured_host_s"].median())
        m["median_gpu_ms"] = 1e3 * float(steps["measured_gpu_s"].median())
        replayed = steps["graph_size"].notna() if "graph_size" in steps else pd.Series(False, index=steps.index)
        m["steps_replayed_from_graphs"] = int(replayed.sum())
        fit = host_fit(steps)
        m["host_fit"] = fit
        priced = steps[f"predicted_{name}_gpu_s"] + 1e-3 * (fit["intercept_ms"] + fit["per_seq_ms"] * steps["batch_size"])
        e = rel_errors(priced, steps["measured_s"])
        m["median_step_error_host_fitted_in_sample"], m["p90_step_error_host_fitted_in_sample"] = _q(e, 50), _q(e, 90)
        m["errors_by_step"] = error_breakdown(steps, name).to_dict(orient="records")
    for key, name, err in (("output_throughput", "output_throughput", "throughput_error"),
                           ("mean_ttft_ms", "mean_ttft_ms", "ttft_error"),
                           ("mean_tpot_ms", "mean_tpot_ms", "tpot_error")):
        m[f"real_{name}"] = rs[key]
        m[f"sim_{name}"] = main.summary[key]
        m[err] = _rel(main.summary[key], rs[key])
        m[f"roofline_sim_{name}"] = sim_roof.summary[key]
        m[f"roofline_{err}"] = _rel(sim_roof.summary[key], rs[key])
    for k in ("completed", "duration_s", "num_preemptions", "num_steps"):
        m[f"real_{k}"] = rs[k]
        m[f"sim_{k}"] = main.summary[k]
    return m
