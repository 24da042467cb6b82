"""One call runs a simulation: ``run_simulation(cfg, trace) -> SimResult``.

Data flows one way: trace DataFrame -> request table -> engine (scheduler + manager +
executor) -> records (DataFrames) -> summary dict. ``SimResult.save(dir)`` writes
``summary.json``, ``requests.csv``, ``steps.csv`` and ``config.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.sim.config import SimConfig
from pagesim.sim.core.replay import engine_name
from pagesim.sim.cost_models import cpu_overhead_note, make_cost_model, swap_block_tokens
from pagesim.sim.csv_writer import write_csv
from pagesim.sim.engine import Engine
from pagesim.sim.executor import SimulatedExecutor
from pagesim.sim.errors import ConfigError
from pagesim.sim.limits import check_pool
from pagesim.sim.memory import make_manager
from pagesim.sim.metrics import SummaryOptions, prefix_cache_hit_rate, request_frame, summarize
from pagesim.sim.outdir import naming
from pagesim.sim.sched.continuous import ContinuousScheduler
from pagesim.sim.sched.state import RequestTable
from pagesim.sim.sched.static import StaticScheduler
from pagesim.sim.specs import GiB, KVBudget, get_gpu, get_model, kv_capacity, with_max_seq_len


@dataclass
class SimResult:
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame
    config: SimConfig | None = None
    extra: dict = field(default_factory=dict)

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
        if requests_format == "parquet":
            with naming(out / "requests.parquet"):
                self.requests.to_parquet(out / "requests.parquet", index=False)
        else:
            with naming(out / "requests.csv"):
                write_csv(self.requests, out / "requests.csv")
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
    model = with_max_seq_len(get_model(cfg.model), cfg.max_seq_len)
    gpu = get_gpu(cfg.gpu)
    budget: KVBudget = kv_capacity(
        model, gpu, kv_bytes=cfg.kv_gib * GiB if cfg.kv_gib else None, tensor_parallel=cfg.tensor_parallel,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        activation_reserve_bytes=cfg.activation_reserve_gib * GiB, max_num_seqs=cfg.max_num_seqs)
    if budget.capacity_tokens < model.max_seq_len:
        raise ConfigError(
            f"the KV pool holds {budget.capacity_tokens} tokens, less than one max_seq_len={model.max_seq_len} "
            f"request; use --max-seq-len {budget.capacity_tokens} or more KV memory "
            f"(--kv-gib {model.max_seq_len * budget.kv_bytes_per_token / GiB:.2f})")
    cfg.check_batched_tokens(model.max_seq_len)
    cfg.check_token_pairs(model.max_seq_len, budget.capacity_tokens)
    check_pool(cfg, model, budget.capacity_tokens, budget.how)
    return model, gpu, budget


def build(cfg: SimConfig, trace: pd.DataFrame, executor=None):
    """Construct (model, gpu, budget, table, manager, scheduler, executor) for a run."""
    model, gpu, budget = resolve_budget(cfg)
    manager = make_manager(cfg, budget.capacity_tokens, model)
    table = RequestTable(trace)
    rng = np.random.default_rng(cfg.seed)
    cls = StaticScheduler if cfg.scheduler == "static" else ContinuousScheduler
    sched = cls(cfg, table, manager, max_seq_len=model.max_seq_len,
                kv_bytes_per_token=budget.kv_bytes_per_token, rng=rng)
    if executor is None:
        executor = SimulatedExecutor(make_cost_model(model, gpu, cfg.tensor_parallel, cfg.profile,
                                                     cfg.step_overhead_ms, cfg.per_seq_overhead_ms,
                                                     cfg.cost_model, cost_scale=cfg.cost_scale,
                                                     swap_block_tokens=swap_block_tokens(cfg)))
    return model, gpu, budget, table, manager, sched, executor


def initial_state(cfg: SimConfig, trace: pd.DataFrame, executor=None):
    """The core's arrays (``sim.core.state.Core``) for ``cfg`` over ``trace`` before the run
    starts: tests work the core's rules by hand on them."""
    from pagesim.sim.core import replay

    _, _, _, table, manager, sched, executor = build(cfg, trace, executor)
    return replay.build(Engine(sched, manager, executor, table.arrival_s, check=cfg.check,
                               record_steps=cfg.record_steps, engine="core"))


def run_simulation(cfg: SimConfig, trace: pd.DataFrame, progress: bool = False, executor=None,
                   macro_steps: bool = True, engine: str = "auto",
                   summary_options: SummaryOptions = SummaryOptions()) -> SimResult:
    """``macro_steps=False`` runs every iteration through the scheduler one by one (the
    reference path; ``cfg.check`` implies it); results are the same either way. ``engine``:
    ``auto`` takes the core where it covers the configuration, ``core`` insists, ``python``
    never takes it (``sim/core/replay.py``). ``summary_options``: which percentiles and goodput
    the summary reports. ``executor``: None prices steps with the configuration's cost model;
    an executor outside the core (``sim.executor.is_external``: the GPU mode's
    ``gpu.executor.GPUExecutor``) runs every iteration the core schedules and times it."""
    model, gpu, budget, table, manager, sched, executor = build(cfg, trace, executor)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(trace), unit="req", desc=f"simulate {cfg.system}", delay=2.0, leave=False)
    engine = Engine(sched, manager, executor, table.arrival_s, check=cfg.check,
                    record_steps=cfg.record_steps, progress=bar, macro_steps=macro_steps,
                    engine=engine)
    try:
        engine.run()
    finally:
        if bar is not None:
            bar.close()
    extra = {"system": cfg.label, "model": model.name, "gpu": gpu.name, "tensor_parallel": cfg.tensor_parallel,
             "kv_bytes_per_token": budget.kv_bytes_per_token, "kv_budget": budget.how,
             "block_size": cfg.block_size if cfg.manager == "paged" else None,
             "num_swap_fallbacks": sched.num_swap_fallbacks, "seed": cfg.seed,
             "engine": engine_name() if engine.on_core else "python",
             "cpu_overhead": cpu_overhead_note(executor.cost_model) if hasattr(executor, "cost_model") else None}
    mstats = manager.stats()
    for k, v in mstats.items():
        extra[f"mgr_{k}"] = v
    summary = summarize(table, engine.rec, sched, duration_s=engine.end_s, wall_time_s=engine.wall_time_s,
                        extra=extra, options=summary_options)
    if getattr(manager, "prefix_caching", False):  # paged managers only: others ignore the setting
        summary["prefix_cache_hit_rate"] = prefix_cache_hit_rate(mstats["prefix_hit_tokens"],
                                                                 mstats["prefix_lookup_tokens"])
    summary.update(engine.rec.sharing())  # after summarize: it finalizes the recorder's sums
    return SimResult(summary, request_frame(table), engine.rec.frame(), cfg)
