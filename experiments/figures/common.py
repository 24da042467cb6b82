"""What every figure shares: how its runs execute (:class:`SweepOptions`), building and running
its grid from ``experiments/configs/<fig>.toml``, and the step-table statistics ("steady" window).

Measurement window ("steady"): statistics that describe a loaded server (memory breakdown,
batch size) are averaged over the steps between ``WARMUP_FRAC`` of the trace and its last arrival,
which leaves out the ramp-up from an empty server and the drain after arrivals stop (both inflate
free memory and shrink batches). When a run has no step table the whole-run summary is used and
``measured_over`` says ``run``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from pagesim.experiments.run_cache import RunOutput, load_cached
from pagesim.experiments.run_spec import RunSpec, apply_overrides, expand_grid, load_experiment
from pagesim.experiments.sweep import run_sweep
from pagesim.sim.run_memory import check_synthetic_workload

#: fraction of the trace's arrival window skipped as warm-up by the "steady" window
WARMUP_FRAC = 0.1

@dataclass
class SweepOptions:
    """How runs execute (passed through to :func:`run_sweep`)."""

    executor: str = "local"
    workers: int | None = None
    cache_dir: str | Path | None = None
    use_cache: bool = True
    progress: bool = True
    address: str | None = None
    run_fn: Callable | None = None
    base: dict[str, Any] = field(default_factory=dict)  # settings every run takes (``--cost-model``)
    # the figures read summaries and step tables (:meth:`load`), never a run's request table
    tables: tuple[str, ...] = ("steps",)

    def run(self, specs: list[RunSpec]) -> list[dict[str, Any]]:
        return run_sweep(specs, executor=self.executor, workers=self.workers, cache_dir=self.cache_dir,
                         progress=self.progress, address=self.address, run_fn=self.run_fn,
                         use_cache=True if self.use_cache else False, tables=self.tables)

    def load(self, spec: RunSpec, what=("steps",)) -> RunOutput | None:
        return load_cached(spec, self.cache_dir, run_fn=self.run_fn, what=what)

    def after_first_sweep(self) -> "SweepOptions":
        """``use_cache=False`` means "recompute once": later sweeps of the same invocation reuse."""
        self.use_cache = True
        return self


def number(summ: dict[str, Any] | None, key: str) -> float:
    """A summary value as float (missing, None or non-numeric: NaN; saved summaries write NaN as null)."""
    v = (summ or {}).get(key)
    try:
        return float(v) if v is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def figure_specs(name: str, quick: bool, scale: float, **base) -> list[RunSpec]:
    specs = expand_grid(apply_overrides(load_experiment(name), quick=quick, scale=scale, **base))
    for spec in specs:
        check_synthetic_workload(spec.rate, spec.duration_s, spec.num_requests, what=f"{name}'s run {spec.label()}",
                                 advice=f"use a smaller --scale than {scale:g}")
    return specs


def run_figure(name: str, opts: SweepOptions | None, quick: bool, scale: float, **base):
    opts = opts or SweepOptions()
    specs = figure_specs(name, quick, scale, **opts.base, **base)
    summaries = opts.run(specs)
    opts.after_first_sweep()
    return opts, specs, summaries



#: a knee is probed again while the probes around it (the last under the latency threshold, the
#: first over it) are more than this ratio of rates apart: past a system's capacity its latency
#: blows up within a few percent of the rate, so a straight line across a wider bracket puts the
#: crossing well before it
KNEE_BRACKET = 1.1
#: the probes each refinement adds between those two, evenly spaced in the rate's logarithm
KNEE_PROBES = 2
#: refinements at most (each splits the bracket in three: two take a bracket of 2.36x under 1.1x)
KNEE_ROUNDS = 2


def refine_knees(opts: SweepOptions, specs: list[RunSpec], summaries: list[dict[str, Any]], group: Callable,
                 threshold: float, latency: str = "normalized_latency_s_per_token",
                 rounds: int = KNEE_ROUNDS) -> tuple[list[RunSpec], list[dict[str, Any]]]:
    """The grid's runs and more probes around each knee: per group of runs (``group``: a spec's
    key, the curve it is a point of), where the ``latency`` of its probes first goes over
    ``threshold``, :data:`KNEE_PROBES` probes are added between the last probe under it and that
    one while they are more than :data:`KNEE_BRACKET` apart, each a copy of the probe under it at
    its new rate (the same trace length, or the same request count, and seed). A latency near a
    system's capacity rises steeply, so a sustainable rate interpolated across a wide bracket
    (``fig12.sustainable_rate``) reads the knee too low: the paper reads it off its curves."""
    specs, summaries = list(specs), list(summaries)
    for _ in range(rounds):
        curves: dict[Any, list[tuple[float, float, RunSpec]]] = {}
        for spec, summary in zip(specs, summaries):
            curves.setdefault(group(spec), []).append((spec.rate, number(summary, latency), spec))
        added = []
        for probes in curves.values():
            probes.sort(key=lambda probe: probe[0])
            over = next((k for k, (_, value, _) in enumerate(probes) if not value <= threshold), None)
            if not over:  # (none over it, or the lowest already: no bracket)
                continue
            (low, _, under), (high, _, _) = probes[over - 1], probes[over]
            if high <= KNEE_BRACKET * low:
                continue
            added += [replace(under, rate=round(low * (high / low) ** (k / (KNEE_PROBES + 1)), 6))
                      for k in range(1, KNEE_PROBES + 1)]
        if not added:
            break
        specs += added
        summaries += opts.run(added)
    return specs, summaries


#: a run that changes a reading's cause and moves the figure's number by more than this share of it
#: shows that cause at work (the readings of Figs. 16 and 17 that test their causes: :func:`moves`)
MOVES = 0.05


def moves(tested: float, own: float) -> bool:
    """Whether a test run's number (``tested``) moved the figure's own (``own``): by more than
    :data:`MOVES` of it, either way."""
    return abs(tested / own - 1) > MOVES


MEM_COLS = ("mem_token_states", "mem_reservation", "mem_internal_frag", "mem_allocator_slack",
            "mem_external_frag", "mem_free_idle")


def arrival_window(spec: RunSpec, warmup_frac: float = WARMUP_FRAC) -> tuple[float, float]:
    """(start, end) of the steady window: skip ``warmup_frac`` of the arrivals, stop at the last."""
    if spec.duration_s is not None:
        end = float(spec.duration_s)
    elif spec.num_requests is not None and spec.rate > 0:
        end = spec.num_requests / spec.rate
    else:
        end = math.inf
    return (warmup_frac * end if math.isfinite(end) else 0.0), end


def window_mean(steps: pd.DataFrame, cols, t0: float, t1: float, *, weight: str = "time") -> dict[str, float] | None:
    """Mean of ``cols`` over steps overlapping [t0, t1): time-weighted (overlap of each step's
    [start_s, start_s + dt_s] with the window) or per step (``weight="step"``: steps starting in it)."""
    if steps is None or len(steps) == 0:
        return None
    start = steps["start_s"].to_numpy(float)
    if weight == "time":
        end = start + steps["dt_s"].to_numpy(float)
        w = np.clip(np.minimum(end, t1) - np.maximum(start, t0), 0.0, None)
    else:
        w = ((start >= t0) & (start < t1)).astype(float)
    total = w.sum()
    if total <= 0:
        return None
    return {c: float(np.dot(w, steps[c].to_numpy(float)) / total) for c in cols}


def memory_breakdown_pct(steps: pd.DataFrame | None, summary: dict[str, Any], t0: float = 0.0,
                         t1: float = math.inf) -> tuple[dict[str, float], str]:
    """Fig. 2's four categories in percent of KV capacity, and where they were measured."""
    if steps is not None and all(c in steps for c in MEM_COLS) and len(steps):
        m = window_mean(steps, MEM_COLS, t0, t1)
        if m is not None:
            cap = sum(m.values()) or float(summary.get("kv_capacity_tokens") or 1)
            f = {k[4:]: v / cap for k, v in m.items()}
            return categories(f), "steady"
    f = {c[4:]: number(summary, c) for c in MEM_COLS}
    return categories(f), "run"


def categories(f: dict[str, float]) -> dict[str, float]:
    return {
        "token_states": 100 * f["token_states"],
        "reservation": 100 * f["reservation"],
        "internal_frag": 100 * f["internal_frag"],
        "external_frag_and_others": 100 * (f["allocator_slack"] + f["external_frag"] + f["free_idle"]),
    }


#: a ratio of vLLM over a baseline further than this (relative) from the paper's gets a note
RATIO_TOLERANCE = 0.10


def ratio_miss(ratio: float, paper_ratio: float) -> str:
    """The note of a ratio that misses the paper's by more than :data:`RATIO_TOLERANCE`, else ''."""
    if math.isnan(ratio) or math.isnan(paper_ratio) or abs(ratio - paper_ratio) <= RATIO_TOLERANCE * paper_ratio:
        return ""
    return f"{ratio:.2f}x against the paper's {paper_ratio:g}x"


def expected_requests(spec: RunSpec) -> float:
    """About how many sequences a run simulates (its cost, to start the longest runs first)."""
    n = spec.num_requests if spec.num_requests is not None else spec.rate * (spec.duration_s or 0.0)
    return n * max(spec.n, spec.beam_width)


def rate_curves_section(rep, name: str, curves: pd.DataFrame, read, ratios_of: Callable, explain: Callable,
                        heading: str, panels: pd.DataFrame | None = None, plot_title: str | None = None,
                        ratio_figure: Callable | None = None, grid: list[list[str]] | None = None) -> None:
    """The reproduce report's section of a figure of normalized latency against rate (fig12,
    fig14, fig17): its curves (one panel per ``workload`` of ``panels``, laid out as ``grid``),
    its sustainable-rate ratios (``read`` back from ``<name>_ratios.csv``, else
    ``ratios_of(curves)``; drawn beside the paper's by ``ratio_figure``), the reading
    (``explain``), and every probe."""
    from pagesim.experiments import paper_plots as P  # plotly: only the report draws (see figures/__init__.py)

    ratios = read(f"{name}_ratios")
    if ratios is None:
        ratios = ratios_of(curves)
    threshold = float(ratios["threshold_s_per_token"].iloc[0]) if len(ratios) else None
    rep.heading(heading)
    kw = {"title": plot_title} if plot_title else {}
    rep.figure(P.latency_vs_rate(curves if panels is None else panels, threshold=threshold, grid=grid, **kw))
    if ratio_figure is not None and len(ratios):
        rep.figure(ratio_figure(ratios))
    rep.table(ratios)
    rep.reading(explain(curves, ratios))
    rep.heading("All probes", level=3)
    rep.table(curves)
