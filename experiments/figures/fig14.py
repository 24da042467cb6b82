"""Fig. 14: normalized latency against request rate with parallel sampling and beam search
(Alpaca, OPT-13B, A100-40GB), and vLLM's sustainable-rate ratio over each Orca variant per width.

Orca's forks cannot share KV blocks (the core rejects n / beam_width > 1 on it, with a reason),
and the paper's Orca baselines reserve memory for every sequence separately: each Orca run
therefore replays the same trace with every sample / beam as its own request (``unshare``, as
Fig. 15's no-sharing baseline; :func:`orca_unshared`). vLLM keeps the requests whole and shares
the prompt's blocks between forks.

The sustainable rate and the 0.25 s/token threshold are Fig. 12's (:func:`fig12.sustainable_rate`).
Cost: 284 points (7 widths x 4 systems x 9-11 rates), 197 distinct runs because Orca's beam
points reuse their parallel twins; 1,200 requests per run (2,400 at width 1), 1,200-7,200
sequences. 48 s on 2 workers of the shared 2-core machine with a warm numba cache, empty run
cache (``--quick``: 16 points, 10 runs, about a second with the fake engine).
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from pagesim.experiments import paper
from pagesim.experiments.figures.fig12 import LATENCY_THRESHOLD_S, sustainable_rate
from pagesim.experiments.figures.common import SweepOptions, figure_specs, rate_curves_section, ratio_miss
from pagesim.experiments.run_spec import RunSpec, canonical_json, results_frame

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


def distinct_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """The runs behind the figure's points, each once (``reproduce all`` sweeps them with the
    other figures' runs: figures/__init__.py)."""
    specs = [orca_unshared(s) for s in figure_specs("fig14", quick, scale, **base)]
    return list({canonical_json(s.canonical()): s for s in specs}.values())


def _mode_width(spec: RunSpec) -> tuple[str, int]:
    return ("beam", spec.beam_width) if spec.beam_width > 1 else ("parallel", spec.n)


def run(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0) -> pd.DataFrame:
    """Fig. 14's curves. Columns: ``mode`` (parallel / beam), ``width`` (n or beam width; 1 is
    basic sampling), ``system, rate, num_requests, unshare`` then :data:`FIG14_COLS`. For an
    unshared (Orca) run ``completed`` counts sequences and the normalized latency is the mean
    over sequences (each sequence's latency over its own output length)."""
    opts = opts or SweepOptions()
    points = figure_specs("fig14", quick, scale, **opts.base)
    specs = [orca_unshared(s) for s in points]
    distinct = distinct_runs(quick, scale, opts.base)
    done = dict(zip((canonical_json(s.canonical()) for s in distinct), opts.run(distinct)))
    df = results_frame(specs, [done[canonical_json(s.canonical())] for s in specs])
    opts.after_first_sweep()
    mw = [_mode_width(s) for s in points]
    df.insert(0, "mode", [m for m, _ in mw])
    df.insert(1, "width", [w for _, w in mw])
    cols = ["mode", "width", "system", "rate", "num_requests", "unshare"] + [c for c in FIG14_COLS if c in df]
    return df[cols].sort_values(["mode", "width", "system", "rate"], kind="stable").reset_index(drop=True)


def ratios(curves: pd.DataFrame, threshold: float = LATENCY_THRESHOLD_S) -> pd.DataFrame:
    """Sustainable rate per (mode, width, system) and vLLM's ratio over each Orca variant, with
    the paper's ratio where §6.3 gives one (Orca-Oracle at basic sampling and at beam width 6).
    Columns: ``mode, width, system, sustainable_rate, how, vllm_ratio, paper_ratio, delta, note``;
    ``delta`` = ours - paper."""
    rows = []
    for (mode, width), g in curves.groupby(["mode", "width"], sort=False):
        sus = {s: sustainable_rate(h["rate"], h["normalized_latency_s_per_token"], threshold)
               for s, h in g.groupby("system", sort=False)}
        v = sus.get("vllm", (math.nan, ""))[0]
        for system, (rate, how) in sus.items():
            ratio = v / rate if system != "vllm" and rate and not math.isnan(rate) else math.nan
            point = paper.fig14_paper_ratio(system, mode, int(width)) if system != "vllm" else math.nan
            delta = ratio - point
            notes = []
            if "censored" in how or "lowest" in how:
                notes.append(how)
            if "censored" in sus.get("vllm", (0, ""))[1] and system != "vllm":
                notes.append("vLLM censored: ratio is a lower bound")
            notes.append(ratio_miss(ratio, point))
            rows.append({"mode": mode, "width": int(width), "system": system, "sustainable_rate": rate, "how": how,
                         "threshold_s_per_token": threshold, "vllm_ratio": ratio, "paper_ratio": point,
                         "delta": delta, "note": "; ".join(filter(None, notes))})
    return pd.DataFrame(rows)


#: the reading of the basic-sampling miss and of the flat growth (measured 2026-11-24 by
#: benchmarks/paper_cpu_readings.py: fig14.toml's runs, default CPU cost and 0.3 ms per sequence)
CPU_READING = (
    "Basic sampling (n = 1) is Alpaca at Fig. 12's setting, and our 1.69x against the paper's 1.3x is Fig. 13's "
    "CPU cost again: with the roofline's default 0.02 ms of CPU per sequence per iteration vLLM's larger batches "
    "cost it almost nothing, so it sustains 70 req/s to Orca-Oracle's 41; with the 0.3 ms per sequence that the "
    "paper's own batch sizes imply (Fig. 13's reading), for both systems, they sustain 30.1 and 23.1 req/s: "
    "1.30x, the paper's 1.3x. The advantage then grows little with n because Alpaca's prompts are short: "
    "parallel samples share only their prompt, 5-9 % of the blocks (Fig. 15a), so vLLM's edge is 1.8-2.0x "
    "for n = 2 to 6. Beam search shares 40-67 % (Fig. 15b), yet its edge is 1.9x (1.94x at width 6 against the "
    "paper's 2.3x): vLLM 0.4.2's rules for a request of several sequences cost it here, each checked against "
    "vLLM's own code (tests/peers): the request takes its width of max_num_seqs from its admission, at its "
    "decode turn it needs a free block per sequence, and a preempted one is swapped out whole, never "
    "recomputed. The wiggle (beam 1.93 -> 1.91) is within the rate grid's resolution: the sustainable rate is "
    "interpolated between grid points 25-40 % apart.")


def explain(curves: pd.DataFrame, ratio_table: pd.DataFrame | None = None) -> str:
    if curves is None or curves.empty:
        return "No Fig. 14 results."
    r = ratios(curves) if ratio_table is None else ratio_table
    lines = [f"Sustainable rate = highest rate with normalized latency <= {r['threshold_s_per_token'].iloc[0]:g} "
             "s/token, as in Fig. 12. vLLM over Orca-Oracle:"]
    oracle = r[r["system"] == "orca-oracle"]
    parts = []
    for x in oracle.itertuples():
        s = f"{x.mode} {x.width}: {x.vllm_ratio:.2f}x"
        if not math.isnan(x.paper_ratio):
            s += f" (paper {x.paper_ratio:g}x, {x.delta:+.2f})"
        parts.append(s)
    lines.append("; ".join(parts) + ".")
    ordered = oracle.sort_values("width")
    for mode, g in ordered.groupby("mode", sort=False):
        vals = g["vllm_ratio"].tolist()
        grows = all(b >= a for a, b in zip(vals, vals[1:])) if len(vals) > 1 else None
        if grows is not None:
            lines.append(f"{mode}: the advantage {'grows' if grows else 'does not grow monotonically'} with the width "
                         "(the paper: it grows, more for beam search, which shares more).")
    lines.append(CPU_READING)
    lines.append("Where we miss the paper: each unshared Orca sequence is its own request, so its prompt is "
                 "prefilled and stored once per sequence and the n sequences may be admitted at different steps; "
                 "the paper's Orca also stores the prompt per sequence, but its exact admission of a request's "
                 "sequences is not stated. Orca's normalized latency is averaged over sequences (each finishes on "
                 "its own), vLLM's over requests (a request finishes with its last sequence), which favours Orca "
                 "slightly. Our traces are a few thousand sequences, not 1 hour, so latency past the knee grows more "
                 "slowly than in the paper; the knee is what the ratio measures. The paper gives per-width ratios "
                 "in the text only for basic sampling and beam width 6; the other widths have no paper number.")
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

    panels = curves.assign(workload=[panel_name(m, w) for m, w in zip(curves["mode"], curves["width"])])
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
