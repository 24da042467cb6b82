"""Validate the simulator against real execution: ``validate(cfg, trace, backend, profile=None)``.

Three runs of the same trace with the same scheduler and paged manager code:

    real        engine + GPUExecutor(backend): every iteration runs on the device; the clock
                advances by measured step times (idle gaps jump, see gpu/executor.py). At every
                step the same batch is also *priced* by the roofline model (and by the table
                model when a profile is given), and the manager's memory categories and the
                real pool's occupied bytes are recorded.
    sim         run_simulation with the roofline cost model
    sim_table   run_simulation with the table cost model (only with a profile)

Outputs (``ValidationResult.save(dir)``)::

    steps.csv        one row per real iteration: step, start_s, num_prefill_seqs,
                     num_prefill_tokens, num_decode_seqs, sum_decode_context, num_copies,
                     swap_in_tokens, swap_out_tokens, measured_s, predicted_roofline_s,
                     predicted_table_s, rel_error_roofline, rel_error_table, mem_<category>
                     (slots), pool_occupied_blocks, pool_occupied_bytes, sim_occupied_bytes
    validation.json  step errors, throughput / TTFT / TPOT of sim vs real, model, GPU, workload, date
    report.html      predicted vs measured, error histogram, timelines, memory (self-contained)
    real/, sim_roofline/, sim_table/   each run's summary.json, requests.csv, steps.csv

Measured step time = the executor's host preparation (tables, slot mappings) + the device
step, synchronized; the simulator's own Python (scheduler, records) is not counted, and idle
gaps between arrivals are jumped, not slept (see gpu/executor.py). So a validation run takes
about the trace's busy time on the GPU.

Step error: ``|predicted - measured| / measured`` per iteration; ``median_step_error`` and
``p90_step_error`` are the calibrated table model's when a profile is given, else the
roofline's (``step_error_model`` says which); ``roofline_*`` are always the roofline's.
End-to-end errors (``throughput_error``, ``ttft_error``, ``tpot_error``) are
``|sim - real| / real`` of output throughput and mean TTFT/TPOT, the sim being the table-model
run when a profile is given, else the roofline run (``roofline_*`` versions always present).

K/V check (``check_kv``, default on; gpu/kv_check.py): after every copy-on-write and swap the
destination blocks are read back and compared byte for byte with their sources as they were
before the step (``kv_checked_blocks`` in validation.json).

Memory check: at every step the pool's occupied bytes, counted from the manager's live block
tables (distinct blocks x block_size x kv_bytes_per_token), must equal (token_states +
reservation + internal_frag + allocator_slack) x kv_bytes_per_token, i.e. the simulator's
occupancy; a mismatch raises :class:`sim.engine.InvariantError`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config import SimConfig
from sim.cost import make_cost_model
from sim.engine import Engine, InvariantError
from sim.memory.base import MemoryUsage
from sim.metrics import request_frame, summarize
from sim.run import SimResult, _jsonable, build, run_simulation

STEP_COLUMNS = (["step", "start_s", "num_prefill_seqs", "num_prefill_tokens", "num_decode_seqs",
                 "sum_decode_context", "num_copies", "swap_in_tokens", "swap_out_tokens", "measured_s",
                 "predicted_roofline_s", "predicted_table_s", "rel_error_roofline", "rel_error_table"]
                + [f"mem_{c}" for c in MemoryUsage.CATEGORIES]
                + ["pool_occupied_blocks", "pool_occupied_bytes", "sim_occupied_bytes", "num_waiting", "num_running"])

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
        (out / "validation.json").write_text(json.dumps(_jsonable(self.metrics), indent=2, default=str) + "\n")
        self.real.save(out / "real")
        self.sim_roofline.save(out / "sim_roofline")
        if self.sim_table is not None:
            self.sim_table.save(out / "sim_table")
        if report:
            from gpu.validate_report import write_report
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
    """on_step hook of the executor: prices the batch, records memory, checks the pool occupancy."""

    def __init__(self, mgr, sched, roof, table, kv_bytes_per_token: float, check_memory: bool):
        self.mgr, self.sched, self.roof, self.table = mgr, sched, roof, table
        self.kvb = float(kv_bytes_per_token)
        self.check_memory = check_memory
        self.rows: list[tuple] = []

    def __call__(self, batch, plan, measured: float) -> None:
        mgr = self.mgr
        usage = mgr.usage(self.sched.demand_waiting)
        snap = mgr.export()
        blocks = set()
        for t in snap.tables.values():
            blocks.update(t)
        occ_blocks = len(blocks)
        held = usage.token_states + usage.reservation + usage.internal_frag + usage.allocator_slack
        if self.check_memory and occ_blocks * snap.block_size != held:
            raise InvariantError(
                f"step {plan.step}: the pool holds {occ_blocks} blocks x {snap.block_size} = "
                f"{occ_blocks * snap.block_size} slots, the manager's categories say {held}")
        pr = self.roof.step_time(batch)
        pt = self.table.step_time(batch) if self.table is not None else float("nan")
        self.rows.append((plan.step, len(batch.prefill_seq_ids), batch.num_prefill_tokens, len(batch.decode_seq_ids),
                          int(batch.decode_context_sum), len(plan.copies), int(batch.swap_in_tokens),
                          int(batch.swap_out_tokens), measured, pr, pt, *usage.as_tuple(), occ_blocks,
                          occ_blocks * snap.block_size * self.kvb, held * self.kvb,
                          self.sched.num_waiting, self.sched.num_running))


def _steps_frame(log: _StepLog, engine_steps: pd.DataFrame) -> pd.DataFrame:
    cols = ["step", "num_prefill_seqs", "num_prefill_tokens", "num_decode_seqs", "sum_decode_context",
            "num_copies", "swap_in_tokens", "swap_out_tokens", "measured_s", "predicted_roofline_s",
            "predicted_table_s"] + [f"mem_{c}" for c in MemoryUsage.CATEGORIES] + \
           ["pool_occupied_blocks", "pool_occupied_bytes", "sim_occupied_bytes", "num_waiting", "num_running"]
    df = pd.DataFrame(log.rows, columns=cols)
    df.insert(1, "start_s", engine_steps["start_s"].to_numpy()[:len(df)] if len(engine_steps) else np.nan)
    df["rel_error_roofline"] = rel_errors(df["predicted_roofline_s"], df["measured_s"])
    df["rel_error_table"] = rel_errors(df["predicted_table_s"], df["measured_s"])
    return df[STEP_COLUMNS]


def run_real(cfg: SimConfig, trace: pd.DataFrame, backend, profile: str | None = None, *,
             progress: bool = False, check_memory: bool = True, host_blocks: int | None = None,
             check_kv: bool = True):
    """The real run: (SimResult, steps DataFrame, executor)."""
    from gpu.executor import GPUExecutor

    cfg = cfg.replace(profile=None, record_steps=True)
    model, gpu, budget, table, mgr, sched, _ = build(cfg, trace, executor=object())
    if check_kv and hasattr(backend, "read_blocks"):
        from gpu.kv_check import KVContentCheck
        backend = KVContentCheck(backend)
    roof = make_cost_model(model, gpu, cfg.tensor_parallel, None, cfg.step_overhead_ms)
    tab = make_cost_model(model, gpu, cfg.tensor_parallel, profile, cfg.step_overhead_ms) if profile else None
    log = _StepLog(mgr, sched, roof, tab, budget.kv_bytes_per_token, check_memory)
    ex = GPUExecutor(model, mgr, backend, scheduler=sched, on_step=log, host_blocks=host_blocks)
    bar = None
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience: no tqdm, no bar
        progress = False
    if progress:
        bar = tqdm(total=len(trace), unit="req", desc=f"validate ({getattr(backend, 'name', 'backend')})",
                   delay=2.0, leave=False)
    engine = Engine(sched, mgr, ex, table.arrival_s, check=cfg.check, record_steps=True, progress=bar)
    try:
        engine.run()
    finally:
        ex.close()
        if bar is not None:
            bar.close()
    extra = {"system": cfg.system, "model": model.name, "gpu": gpu.name, "tensor_parallel": cfg.tensor_parallel,
             "kv_bytes_per_token": budget.kv_bytes_per_token, "kv_budget": budget.how,
             "block_size": cfg.block_size, "num_swap_fallbacks": sched.num_swap_fallbacks, "seed": cfg.seed,
             "executor": getattr(backend, "name", type(backend).__name__), "executor_copies": ex.total_copies,
             "executor_swap_out_blocks": ex.total_swap_out_blocks, "executor_swap_in_blocks": ex.total_swap_in_blocks}
    for k, v in mgr.stats().items():
        extra[f"mgr_{k}"] = v
    summary = summarize(table, engine.rec, sched, duration_s=engine.end_s, wall_time_s=engine.wall_time_s,
                        extra=extra)
    rec_steps = engine.rec.frame()
    result = SimResult(summary, request_frame(table), rec_steps, cfg)
    return result, _steps_frame(log, rec_steps), ex


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
