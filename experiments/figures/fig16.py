"""Fig. 16: a shared prefix (§6.4). LLaMA-13B on an A100-40GB translates WMT16 English to
German behind the paper's 1-shot (80 tokens) or 5-shot (341 tokens) prefix
(``traces/shared_prefix.py``: the prefix's full blocks are named alike in every request, so
vLLM's prefix caching computes and stores them once); vLLM with prefix caching against
Orca-Oracle, normalized latency against request rate (``configs/fig16.toml``).

The paper states vLLM's throughput as 1.67x (1-shot) and 3.58x (5-shot) Orca-Oracle's. We take
each system's throughput at the highest probed rate (256 req/s, 1,000 requests: both are
overloaded there, so it is their capacity) and compare the ratio. Figs. 12, 14 and 17 compare
the highest rate whose normalized latency stays under a threshold instead (Fig. 12's
:func:`fig12.sustainable_rate`); that rate is computed here too and printed beside, with the reason
it cannot be read where it cannot (:func:`fig12.capacity_reading`, :func:`threshold_reading`).

Cost: 32 runs, two of :func:`placement_runs` and four of :func:`length_runs`, 4.2 s on 2 cores once
the core is compiled before those six (the quick grid: 8 runs of 100 requests and six, 0.3 s).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from pagesim.experiments import paper
from pagesim.experiments.figures.common import SweepOptions, figure_specs, moves, ratio_miss, run_figure
from pagesim.experiments.figures.fig12 import ABOVE_CAPACITY, LATENCY_THRESHOLD_S, capacity_reading
from pagesim.experiments.run_spec import RunSpec, results_frame
from pagesim.traces.shared_prefix import TESTED_LENGTH_SCALE

#: what the figure shows, in ``reproduce all``'s closing table
TITLE = "shared prefix"
#: the tables that hold its rows compared with the paper's (``note``: where we miss); default its own
COMPARED = ("fig16_ratios",)

#: the experiment configs (experiments/configs/<name>.toml) whose runs ``reproduce all`` runs
#: up front, in one sweep with the other figures' (see figures/__init__.py)
EXPERIMENTS = ("fig16",)

BASELINE = "orca-oracle"
CURVE_COLS = ("normalized_latency_s_per_token", "request_throughput", "mean_ttft_ms", "avg_batch_size",
              "num_preemptions", "completed")


#: the extents a run tests the reading's cause with: Orca-Oracle's, placed without the buddy
#: allocator's rounding to powers of two (the paper's Orca uses the buddy allocator, §6.1)
TESTED_PLACEMENT = "first-fit"


def placement_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """Orca-Oracle at each workload's highest probed rate, its extents placed first-fit
    (:data:`TESTED_PLACEMENT`): the run that tests how much of vLLM's ratio the buddy
    allocator's rounding makes (``reproduce all`` sweeps them with the other figures' runs)."""
    specs = figure_specs("fig16", quick, scale, **base)
    top = max(spec.rate for spec in specs)
    return [replace(spec, sim={**spec.sim, "placement": TESTED_PLACEMENT})
            for spec in specs if spec.system == BASELINE and spec.rate == top]


#: the workloads' suffix whose sentences are TESTED_LENGTH_SCALE times the derived lengths
#: (traces/shared_prefix.py's WORKLOADS)
LONG = "-long"


def length_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """vLLM and Orca-Oracle at each workload's highest probed rate, its sentences
    ``TESTED_LENGTH_SCALE`` times the derived lengths (the ``-long`` workloads): the runs that test
    how much the ratios owe to those lengths, which the paper does not give."""
    specs = figure_specs("fig16", quick, scale, **base)
    top = max(spec.rate for spec in specs)
    return [replace(spec, workload=spec.workload + LONG) for spec in specs
            if spec.system in ("vllm", BASELINE) and spec.rate == top]


def extra_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """The runs beyond the grid (``reproduce all`` sweeps them with the other figures' runs)."""
    return placement_runs(quick, scale, base) + length_runs(quick, scale, base)


def run(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0) -> pd.DataFrame:
    """Fig. 16's curves: ``workload, system, placement, rate`` and :data:`CURVE_COLS`, one row per
    run: the grid's (``placement`` buddy: every system's default) and :func:`extra_runs`'."""
    opts, specs, summaries = run_figure("fig16", opts, quick, scale)
    tested = extra_runs(quick, scale, opts.base)
    specs, summaries = specs + tested, summaries + opts.run(tested)
    df = results_frame(specs, summaries)
    df["placement"] = [spec.sim.get("placement", "buddy") for spec in specs]
    cols = ["workload", "system", "placement", "rate"] + [c for c in CURVE_COLS if c in df]
    return df[cols].sort_values(["workload", "system", "placement", "rate"], kind="stable").reset_index(drop=True)


def grid_runs(curves: pd.DataFrame) -> pd.DataFrame:
    """The curves' runs of the grid (the systems' own placement, the derived sentence lengths),
    without :func:`extra_runs`."""
    keep = ~curves["workload"].astype(str).str.endswith(LONG) if "workload" in curves else curves.index == curves.index
    if "placement" in curves:
        keep &= curves["placement"] == "buddy"
    return curves[keep]


def ratios(curves: pd.DataFrame, threshold: float = LATENCY_THRESHOLD_S) -> pd.DataFrame:
    """Per workload: each system's throughput at the highest probed rate, vLLM's over
    Orca-Oracle's and the paper's; beside it, each system's sustainable rate by Figs. 12, 14 and
    17's measure (``threshold`` s/token) and how it was read. Columns ``workload, rate,
    vllm_throughput, orca_oracle_throughput, throughput_ratio, paper_ratio, delta_ratio, note,
    threshold_s_per_token, vllm_sustainable_rate, vllm_how, orca_oracle_sustainable_rate,
    orca_oracle_how, orca_oracle_first_fit_throughput, first_fit_ratio, long_sentences_ratio,
    sustainable_ratio`` (``first_fit``: Orca-Oracle's :func:`placement_runs`; ``long_sentences``:
    the throughputs' ratio of :func:`length_runs`; NaN without them)."""
    rows = []
    tested = curves[curves["placement"] == TESTED_PLACEMENT] if "placement" in curves else curves.iloc[:0]
    for wl, g in grid_runs(curves).groupby("workload", sort=False):
        top = g[g["rate"] == g["rate"].max()].set_index("system")
        v = float(top.loc["vllm", "request_throughput"]) if "vllm" in top.index else math.nan
        o = float(top.loc[BASELINE, "request_throughput"]) if BASELINE in top.index else math.nan
        ratio = v / o if o else math.nan
        want = paper.paper_value("fig16", f"throughput_ratio_vs_{BASELINE}", workload=wl)
        note = ratio_miss(ratio, want)
        row = {"workload": wl, "rate": float(g["rate"].max()), "vllm_throughput": v,
               "orca_oracle_throughput": o, "throughput_ratio": ratio, "paper_ratio": want,
               "delta_ratio": ratio - want, "note": note, "threshold_s_per_token": threshold}
        for system, name in (("vllm", "vllm"), (BASELINE, "orca_oracle")):
            h = g[g["system"] == system]
            rate, how, _ = (capacity_reading(h["rate"], h["normalized_latency_s_per_token"], h["request_throughput"],
                                             threshold)
                            if len(h) and "normalized_latency_s_per_token" in h else (math.nan, "no probes", math.nan))
            row[f"{name}_sustainable_rate"], row[f"{name}_how"] = rate, how
        placed = tested[(tested["workload"] == wl) & (tested["rate"] == row["rate"])]["request_throughput"]
        row["orca_oracle_first_fit_throughput"] = float(placed.iloc[0]) if len(placed) else math.nan
        row["first_fit_ratio"] = v / row["orca_oracle_first_fit_throughput"]
        long = curves[(curves["workload"] == wl + LONG) & (curves["rate"] == row["rate"])].set_index("system")
        long_v, long_o = (float(long.loc[s, "request_throughput"]) if s in long.index else math.nan
                          for s in ("vllm", BASELINE))
        row["long_sentences_ratio"] = long_v / long_o if long_o else math.nan
        read = row["vllm_how"] == row["orca_oracle_how"] == "interpolated"
        row["sustainable_ratio"] = row["vllm_sustainable_rate"] / row["orca_oracle_sustainable_rate"] if read else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def length_reading(r: pd.DataFrame) -> str:
    """What :func:`length_runs` say: vLLM's throughput ratio with sentences ``TESTED_LENGTH_SCALE``
    times the derived lengths, against the derived lengths' (``r``: :func:`ratios`)."""
    tested = r.dropna(subset=["long_sentences_ratio"]) if "long_sentences_ratio" in r else r.iloc[:0]
    if tested.empty:
        return ("Untested: our sentence lengths are derived estimates (traces/shared_prefix.py), not the paper's "
                "samples.")
    moved = [moves(x.long_sentences_ratio, x.throughput_ratio) for x in tested.itertuples()]
    text = (f"Our sentence lengths are derived estimates (traces/shared_prefix.py), not the paper's samples. Tested: "
            f"with sentences {TESTED_LENGTH_SCALE:g}x as long, vLLM's ratio is " + " and ".join(
                f"{x.long_sentences_ratio:.2f}x ({x.workload}; {x.throughput_ratio:.2f}x at the derived lengths)"
                for x in tested.itertuples()) + ": ")
    if not any(moved):
        return text + "the sentences' lengths do not explain the miss."
    ways = []
    for x in tested.itertuples():
        if not math.isnan(x.paper_ratio):
            closer = abs(x.long_sentences_ratio - x.paper_ratio) < abs(x.throughput_ratio - x.paper_ratio)
            ways.append(f"{x.workload} {'toward' if closer else 'away from'} the paper's {x.paper_ratio:g}x")
    return text + "the lengths move it (" + ", ".join(ways) + "): they are a cause as far as they are off."


def threshold_reading(row) -> str:
    """One workload's sustainable rates by Figs. 12, 14 and 17's measure (``row``: its
    :func:`ratios` row), and why the ratio is taken by capacity where one cannot be read
    (``fig12.capacity_reading``)."""
    head = (f"By Figs. 12, 14 and 17's measure (the highest rate whose normalized latency stays <= "
            f"{row.threshold_s_per_token:g} s/token), {row.workload}: ")
    parts = []
    for name, label in (("vllm", "vLLM"), ("orca_oracle", "Orca-Oracle")):
        rate, how = getattr(row, f"{name}_sustainable_rate"), getattr(row, f"{name}_how")
        parts.append(f"{label} {rate:.1f} req/s" + ("" if how == "interpolated" else f" ({how})"))
    if not math.isnan(row.sustainable_ratio):
        return head + ", ".join(parts) + f": {row.sustainable_ratio:.2f}x."
    why = ""
    if "above its capacity" in row.vllm_how + row.orca_oracle_how:
        why = ", " + ABOVE_CAPACITY
    return head + ", ".join(parts) + f": not read{why}. The ratio is taken by capacity, the throughput when both are overloaded."


def explain(curves: pd.DataFrame, ratio_table: pd.DataFrame | None = None) -> str:
    if curves is None or curves.empty:
        return "No Fig. 16 results."
    r = ratios(curves) if ratio_table is None else ratio_table
    lines = [f"{row.workload}: vLLM with prefix caching serves {row.vllm_throughput:.1f} req/s against Orca-Oracle's "
             f"{row.orca_oracle_throughput:.1f} when both are overloaded, {row.throughput_ratio:.2f}x (paper "
             f"{row.paper_ratio:g}x)." for row in r.itertuples()]
    lines.append("The gain grows with the prefix, as in the paper: Orca-Oracle holds and computes the prefix once "
                 "per request, vLLM once for all, so its batch is bounded by the requests' own tokens.")
    placed = r.dropna(subset=["first_fit_ratio"]) if "first_fit_ratio" in r else r.iloc[:0]
    if len(placed):
        lines.append(
            "Orca-Oracle's buddy extents (each rounded up to a power of two) waste part of its pool: placed "
            f"{TESTED_PLACEMENT} instead, it serves " + " and ".join(
                f"{x.orca_oracle_first_fit_throughput:.1f} req/s ({x.workload}: vLLM's ratio {x.first_fit_ratio:.2f}x)"
                for x in placed.itertuples()) + ". The paper's Orca uses the buddy allocator too (§6.1), so that "
            "waste is in its ratios as well.")
    lines.append(length_reading(r))
    if "normalized_latency_s_per_token" in curves:
        lines.extend(threshold_reading(row) for row in r.itertuples())
    return " ".join(lines)


def tables(opts: SweepOptions, *, quick: bool = False, scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """What ``reproduce fig16`` writes: the curves and the throughput ratios."""
    curves = run(opts, quick=quick, scale=scale)
    return {"fig16": curves, "fig16_ratios": ratios(curves)}


def section(rep, curves: pd.DataFrame, read) -> None:
    """Fig. 16's part of the reproduce report (see :func:`figures.fig2.section`): the curves, the
    throughput ratios where ``read`` finds them, every run and the reading."""
    from pagesim.experiments import paper_plots as P  # plotly: only the report draws (see figures/__init__.py)

    ratio_table = read("fig16_ratios")
    rep.heading("Fig. 16: shared prefix")
    rep.figure(P.latency_vs_rate(grid_runs(curves), title="Fig. 16: normalized latency vs request rate, shared prefix"))
    if ratio_table is not None:
        rep.figure(P.ratio_dots(ratio_table.assign(system=BASELINE, vllm_ratio=ratio_table["throughput_ratio"]),
                                "workload", "Fig. 16: vLLM's throughput over Orca-Oracle's, both overloaded",
                                y_title="vLLM's throughput / Orca-Oracle's"))
        rep.table(ratio_table)
    rep.table(curves)
    rep.reading(explain(curves, ratio_table))
