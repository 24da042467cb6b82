"""Fig. 14: normalized latency against request rate with parallel sampling and beam search
(Alpaca, OPT-13B, A100-40GB), and vLLM's sustainable-rate ratio over each Orca variant per width.

Orca's forks cannot share KV blocks (the core rejects n / beam_width > 1 on it, with a reason),
and the paper's Orca baselines reserve memory for every sequence separately: each Orca run
therefore replays the same trace with every sample / beam as its own request (``unshare``, as
Fig. 15's no-sharing baseline; :func:`orca_unshared`). vLLM keeps the requests whole and shares
the prompt's blocks between forks.

The sustainable rate and the 0.25 s/token threshold are Fig. 12's (:func:`fig12.sustainable_rate`),
each checked against its system's capacity; where one reads above it, the ratio is by capacity
(:func:`fig12.capacity_reading`, :func:`fig12.rate_ratio`).
Cost: 284 points (7 widths x 4 systems x 9-11 rates), 197 distinct runs because Orca's beam
points reuse their parallel twins, and two of :func:`binding_runs`; 1,200 requests per run (2,400
at width 1), 1,200-7,200 sequences. 48 s on 2 workers of the shared 2-core machine with a warm numba cache, empty run
cache (``--quick``: 16 points, 10 runs, about a second with the fake engine).
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from pagesim.experiments import paper
from pagesim.experiments.figures.fig12 import ABOVE_CAPACITY, LATENCY_THRESHOLD_S, capacity_reading, rate_ratio
from pagesim.experiments.figures.common import SweepOptions, figure_specs, rate_curves_section, ratio_miss
from pagesim.experiments.run_spec import RunSpec, canonical_json, results_frame
from pagesim.sim.config import SimConfig

#: what the figure shows, in ``reproduce all``'s closing table
TITLE = "sampling, beam search"
#: the tables that hold its rows compared with the paper's (``note``: where we miss); default its own
COMPARED = ("fig14_ratios",)

#: the experiment configs (experiments/configs/<name>.toml) whose runs ``reproduce all`` runs
#: up front, in one sweep with the other figures' (see figures/__init__.py): none as they are,
#: since its Orca points run as their unshared parallel twins (orca_unshared): figures/__init__.py
#: sweeps :func:`distinct_runs` instead
EXPERIMENTS = ()
#: the columns of fig14.csv after mode, width, system, rate, num_requests
FIG14_COLS = ("normalized_latency_s_per_token", "mean_ttft_ms", "mean_e2el_ms", "request_throughput",
              "avg_batch_size", "num_preemptions", "completed", "rejected")


def orca_unshared(spec: RunSpec) -> RunSpec:
    """The run a figure point stands for: Orca variants see every sequence as its own request.
    Unshared, ``beam_width=w`` and ``n=w`` are the same trace (w independent copies of each
    request, :func:`experiments.run_spec.unshare_trace`), so an Orca beam point runs (and is cached)
    as its parallel twin."""
    if spec.system == "vllm":
        return spec
    width = max(spec.n, spec.beam_width)
    return dataclasses.replace(spec, n=width, beam_width=1, unshare=True)


#: vLLM's max_num_seqs in the runs that test whether it binds beam search's capacity (the grid's
#: is every system's default, ``SimConfig.max_num_seqs``)
TESTED_MAX_NUM_SEQS = (512, 1024)


def binding_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """vLLM at the widest beam search's highest probed rate, its max_num_seqs raised to each of
    :data:`TESTED_MAX_NUM_SEQS`: the runs that test whether that limit binds its capacity."""
    beams = [s for s in figure_specs("fig14", quick, scale, **base) if s.system == "vllm" and s.beam_width > 1]
    if not beams:
        return []
    top = max(beams, key=lambda s: (s.beam_width, s.rate))
    return [dataclasses.replace(top, sim={**top.sim, "max_num_seqs": m}) for m in TESTED_MAX_NUM_SEQS]


def distinct_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """The runs behind the figure's points, each once, and :func:`binding_runs` (``reproduce all``
    sweeps them with the other figures' runs: figures/__init__.py)."""
    specs = [orca_unshared(s) for s in figure_specs("fig14", quick, scale, **base)] + binding_runs(quick, scale, base)
    return list({canonical_json(s.canonical()): s for s in specs}.values())


def max_num_seqs_of(spec: RunSpec) -> int:
    return int(spec.sim.get("max_num_seqs", SimConfig.max_num_seqs))


def grid_runs(curves: pd.DataFrame) -> pd.DataFrame:
    """The curves' runs of the grid (every system's own max_num_seqs), without :func:`binding_runs`."""
    return curves[curves["max_num_seqs"] == SimConfig.max_num_seqs] if "max_num_seqs" in curves else curves


def _mode_width(spec: RunSpec) -> tuple[str, int]:
    return ("beam", spec.beam_width) if spec.beam_width > 1 else ("parallel", spec.n)


def run(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0) -> pd.DataFrame:
    """Fig. 14's curves. Columns: ``mode`` (parallel / beam), ``width`` (n or beam width; 1 is
    basic sampling), ``system, rate, num_requests, unshare, max_num_seqs`` then :data:`FIG14_COLS`,
    a row per point and one per :func:`binding_runs`. For an unshared (Orca) run ``completed``
    counts sequences and the normalized latency is the mean over sequences (each sequence's
    latency over its own output length)."""
    opts = opts or SweepOptions()
    points = figure_specs("fig14", quick, scale, **opts.base)
    points += binding_runs(quick, scale, opts.base)
    specs = [orca_unshared(s) for s in points]
    distinct = distinct_runs(quick, scale, opts.base)
    done = dict(zip((canonical_json(s.canonical()) for s in distinct), opts.run(distinct)))
    df = results_frame(specs, [done[canonical_json(s.canonical())] for s in specs])
    opts.after_first_sweep()
    mw = [_mode_width(s) for s in points]
    df.insert(0, "mode", [m for m, _ in mw])
    df.insert(1, "width", [w for _, w in mw])
    df["max_num_seqs"] = [max_num_seqs_of(s) for s in points]
    cols = (["mode", "width", "system", "rate", "num_requests", "unshare", "max_num_seqs"]
            + [c for c in FIG14_COLS if c in df])
    return df[cols].sort_values(["mode", "width", "system", "max_num_seqs", "rate"],
                                kind="stable").reset_index(drop=True)


def ratios(curves: pd.DataFrame, threshold: float = LATENCY_THRESHOLD_S) -> pd.DataFrame:
    """Sustainable rate per (mode, width, system) and vLLM's ratio over each Orca variant, with
    the paper's ratio where §6.3 gives one (Orca-Oracle at basic sampling and at beam width 6).
    Each rate is checked against the system's capacity, in requests of the trace (an unshared
    Orca run serves ``width`` sequences a request), and where either system's reads above it the
    ratio is by capacity (``fig12.capacity_reading``, ``fig12.rate_ratio``: ``measure``).
    Columns: ``mode, width, system, sustainable_rate, how, capacity, threshold_s_per_token,
    vllm_ratio, measure, paper_ratio, delta, note``; ``delta`` = ours - paper."""
    rows = []
    for (mode, width), g in grid_runs(curves).groupby(["mode", "width"], sort=False):
        readings = {}
        for system, h in g.groupby("system", sort=False):
            per_request = h["request_throughput"] / h["unshare"].map({True: width, False: 1}).fillna(1)
            readings[system] = capacity_reading(h["rate"], h["normalized_latency_s_per_token"], per_request, threshold)
        vllm = readings.get("vllm", (math.nan, "", math.nan))
        for system, (rate, how, capacity) in readings.items():
            ratio, measure = rate_ratio(vllm, (rate, how, capacity)) if system != "vllm" else (math.nan, "")
            point = paper.fig14_paper_ratio(system, mode, int(width)) if system != "vllm" else math.nan
            delta = ratio - point
            notes = []
            if "censored" in how or "lowest" in how:
                notes.append(how)
            if "censored" in vllm[1] and system != "vllm" and measure != "capacity":
                notes.append("vLLM censored: ratio is a lower bound")
            notes.append(ratio_miss(ratio, point))
            rows.append({"mode": mode, "width": int(width), "system": system, "sustainable_rate": rate, "how": how,
                         "capacity": capacity, "threshold_s_per_token": threshold, "vllm_ratio": ratio,
                         "measure": measure, "paper_ratio": point, "delta": delta,
                         "note": "; ".join(filter(None, notes))})
    return pd.DataFrame(rows)


#: a larger max_num_seqs that raises vLLM's throughput by more than this share binds it
BINDS = 0.02


def binding_reading(curves: pd.DataFrame, ratio_table: pd.DataFrame) -> str:
    """What :func:`binding_runs` say of beam search's miss: whether vLLM's capacity at the widest
    beams moves with a larger max_num_seqs, and its ratio over Orca-Oracle's capacity then."""
    tested = curves[curves["max_num_seqs"] != SimConfig.max_num_seqs] if "max_num_seqs" in curves else curves.iloc[:0]
    if tested.empty:
        return "Untested: which of vLLM's limits binds beam search's capacity (no run with another max_num_seqs)."
    width, rate = int(tested["width"].iloc[0]), tested["rate"].iloc[0]
    own = grid_runs(curves)
    own = own[(own["system"] == "vllm") & (own["mode"] == "beam") & (own["width"] == width) & (own["rate"] == rate)]
    oracle = ratio_table[(ratio_table["system"] == "orca-oracle") & (ratio_table["mode"] == "beam")
                         & (ratio_table["width"] == width)]
    if own.empty:
        return ""
    base = own.iloc[0]
    capacity = oracle["capacity"].iloc[0] if len(oracle) else math.nan
    gains = tested["request_throughput"] / base.request_throughput - 1
    runs = "; ".join(f"{int(x.max_num_seqs)}: {x.request_throughput:.2f} req/s ({100 * gain:+.0f} %), "
                     f"{int(x.num_preemptions)} preemptions"
                     + (f", {x.request_throughput / capacity:.2f}x Orca-Oracle's capacity" if capacity > 0 else "")
                     for x, gain in zip(tested.itertuples(), gains))
    text = (f"Tested: vLLM at beam {width} and {rate:g} req/s, its max_num_seqs {SimConfig.max_num_seqs}, runs "
            f"{base.avg_batch_size:.0f} requests a step ({width} sequences each; {int(base.num_preemptions)} "
            f"preemptions); with a larger max_num_seqs: {runs}. ")
    if not (gains > BINDS).any():
        return text + "max_num_seqs does not bind its capacity here."
    text += "max_num_seqs binds it"
    paper_ratio = oracle["paper_ratio"].iloc[0] if len(oracle) else math.nan
    ratio = oracle["vllm_ratio"].iloc[0] if len(oracle) else math.nan
    if capacity > 0 and paper_ratio > ratio:
        best = tested["request_throughput"].max() / capacity
        closed = (best - ratio) / (paper_ratio - ratio)
        text += f"; lifting it closes {100 * closed:.0f} % of the gap to the paper's {paper_ratio:g}x"
    if (tested["num_preemptions"] > 0).any():
        text += " (memory binds next: preemptions)"
    return text + "; what binds the rest is untested."


def beam_against_parallel(oracle: pd.DataFrame) -> str:
    """How vLLM's advantage over Orca-Oracle with beams compares with parallel sampling's at the
    widths both were run at (``oracle``: the :func:`ratios` rows of Orca-Oracle), the most they
    differ by: beams share more of their blocks (Fig. 15), so a like advantage says vLLM's
    capacity is not bound by memory alone."""
    by = oracle.set_index(["mode", "width"])["vllm_ratio"]
    widths = [w for w in sorted(oracle["width"].unique()) if ("beam", w) in by and ("parallel", w) in by]
    if not widths:
        return ""
    apart = max(abs(by[("beam", w)] / by[("parallel", w)] - 1) for w in widths)
    return (f"Beam search shares more of its blocks than parallel sampling (Fig. 15), yet vLLM's advantage with "
            f"beams is within {100 * apart:.0f} % of parallel sampling's at each width both ran "
            f"({', '.join(str(int(w)) for w in widths)}): its capacity here is not bound by memory alone. ")


def explain(curves: pd.DataFrame, ratio_table: pd.DataFrame | None = None) -> str:
    if curves is None or curves.empty:
        return "No Fig. 14 results."
    r = ratios(curves) if ratio_table is None else ratio_table
    oracle = r[r["system"] == "orca-oracle"]
    parts = []
    for x in oracle.itertuples():
        s = f"{x.mode} {x.width}: {x.vllm_ratio:.2f}x by {x.measure}"
        if not math.isnan(x.paper_ratio):
            s += f" (paper {x.paper_ratio:g}x, {x.delta:+.2f})"
        parts.append(s)
    lines = ["vLLM over Orca-Oracle: " + "; ".join(parts) + "."]
    vllm = r[r["system"] == "vllm"]
    above = vllm[vllm["how"].str.startswith("above its capacity")]
    if len(above):
        x = above.iloc[0]
        lines.append(
            f"By the paper's measure, the highest rate whose normalized latency stays <= "
            f"{r['threshold_s_per_token'].iloc[0]:g} s/token (Fig. 12's), vLLM's rate reads above its capacity at "
            f"{len(above)} of {len(vllm)} widths ({panel_name(x['mode'], x['width'])}: {x['sustainable_rate']:.1f} "
            f"req/s read, {x['capacity']:.1f} served when overloaded): {ABOVE_CAPACITY} (1,200-2,400 requests "
            "here, not the paper's hour). Each such ratio is taken by capacity, the throughput (requests of the "
            "trace a second) when both are overloaded, which a longer trace's knee approaches.")
    ordered = oracle.sort_values("width")
    for mode, g in ordered.groupby("mode", sort=False):
        vals = g["vllm_ratio"].tolist()
        grows = all(b >= a for a, b in zip(vals, vals[1:])) if len(vals) > 1 else None
        if grows is not None:
            lines.append(f"{mode}: the advantage {'grows' if grows else 'does not grow monotonically'} with the width "
                         "(the paper: it grows, more for beam search, which shares more).")
    lines.append(beam_against_parallel(oracle) + binding_reading(curves, r))
    lines.append("Where we miss the paper: each unshared Orca sequence is its own request, so its prompt is "
                 "prefilled and stored once per sequence and the n sequences may be admitted at different steps; "
                 "the paper's Orca also stores the prompt per sequence, but its exact admission of a request's "
                 "sequences is not stated. Orca's normalized latency is averaged over sequences (each finishes on "
                 "its own), vLLM's over requests (a request finishes with its last sequence), which favours Orca "
                 "slightly. The paper gives per-width ratios in the text only for basic sampling and beam width 6; "
                 "the other widths have no paper number.")
    if r["note"].fillna("").str.contains("censored|lowest").any():
        lines.append("Some systems never (or always) crossed the threshold within the probed rates (see note): "
                     "widen the rate lists in fig14.toml for exact ratios.")
    return " ".join(lines)


def tables(opts: SweepOptions, *, quick: bool = False, scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """What ``reproduce fig14`` writes: the latency curves and the sustainable-rate ratios."""
    curves = run(opts, quick=quick, scale=scale)
    return {"fig14": curves, "fig14_ratios": ratios(curves)}


def panel_name(mode: str, width) -> str:
    """A panel's (and a ratio's) label: ``n = 2`` for parallel sampling, ``beam 4`` for beam search."""
    return f"n = {int(width)}" if mode == "parallel" else f"beam {int(width)}"


def section(rep, curves: pd.DataFrame, read) -> None:
    """Fig. 14's part of the reproduce report (:func:`figures.common.rate_curves_section`): as
    the paper lays it out, a row of parallel sampling (n = 1 is basic sampling, Fig. 12's Alpaca
    panel), then a row of beam search, narrowest first; vLLM's ratio per width beside the
    paper's two (§6.3)."""
    from pagesim.experiments import paper_plots as P  # plotly: only the report draws (see figures/__init__.py)

    grid_points = grid_runs(curves)  # (binding_runs: in the reading and the probes' table, not a curve)
    panels = grid_points.assign(workload=[panel_name(m, w) for m, w in zip(grid_points["mode"], grid_points["width"])])
    grid = [[panel_name(mode, w) for w in sorted(curves.loc[curves["mode"] == mode, "width"].unique())]
            for mode in ("parallel", "beam") if (curves["mode"] == mode).any()]

    def ratio_figure(r: pd.DataFrame):
        r = r.assign(order=(r["mode"] == "beam").astype(int)).sort_values(["order", "width"], kind="stable")
        return P.ratio_dots(r.assign(panel=[panel_name(m, w) for m, w in zip(r["mode"], r["width"])]), "panel",
                            "Fig. 14: vLLM's sustainable rate over each Orca variant, per width (Alpaca)")

    rate_curves_section(
        rep, "fig14", curves, read, ratios, explain,
        "Fig. 14: parallel sampling and beam search, normalized latency vs request rate (Alpaca)",
        panels=panels, grid=grid, plot_title="Fig. 14: normalized latency vs request rate, per mode and width",
        ratio_figure=ratio_figure)
