"""Fig. 17 (paper §6.5): a chatbot. Normalized latency against request rate for the four systems
on ShareGPT conversations whose prompt (history + last query) is cut to its last 1,024 tokens
and whose output is capped at 1,024 (``traces/chatbot.py``), OPT-13B, A100-40GB; and vLLM's
sustainable-rate ratio over each Orca variant (the paper: 2x over all three, which behave alike
because the buddy allocator rounds every reservation of a 1,024-token prompt to 1,024 output
slots, max_seq_len 2,048).

The sustainable rate and its 0.25 s/token threshold are Fig. 12's (:func:`fig12.sustainable_rate`).
Cost: 48 runs (4 systems x 12 rates) of 400 requests, 24 of :func:`output_runs` and 24 of
:func:`hour_runs`: 12 s on 2 workers of the shared 2-core machine with a warm numba cache, empty
run cache, before those (``--quick``: 16 runs of 30 requests or a minute, seconds).
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from pagesim.experiments import paper
from pagesim.experiments.figures.fig12 import LATENCY_THRESHOLD_S, capacity_reading, rate_ratio
from pagesim.experiments.figures.common import (SweepOptions, figure_specs, moves, rate_curves_section,
                                                ratio_miss, run_figure)
from pagesim.experiments.run_spec import RunSpec, results_frame
from pagesim.traces.chatbot import CHAT_TESTED_OUTPUT

#: what the figure shows, in ``reproduce all``'s closing table
TITLE = "chatbot"
#: the tables that hold its rows compared with the paper's (``note``: where we miss); default its own
COMPARED = ("fig17_ratios",)

#: the experiment configs (experiments/configs/<name>.toml) whose runs ``reproduce all`` runs
#: up front, in one sweep with the other figures' (see figures/__init__.py)
EXPERIMENTS = ("fig17",)
#: the columns of fig17.csv after system, rate, num_requests
FIG17_COLS = ("normalized_latency_s_per_token", "mean_ttft_ms", "mean_e2el_ms", "request_throughput",
              "avg_batch_size", "num_preemptions", "completed", "rejected")


#: the workload of :func:`output_runs`: the paper's rule, outputs capped at CHAT_TESTED_OUTPUT
TESTED_WORKLOAD = "chatbot-short-output"
#: the systems :func:`output_runs` runs: vLLM and the Orca variant the reading weighs it against
TESTED_SYSTEMS = ("vllm", "orca-oracle")
#: :func:`output_runs` probe at the grid's rates times this: shorter outputs are served faster, and
#: both knees must fall inside the probes
TESTED_RATE_SCALE = 3.0


def output_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """vLLM's and Orca-Oracle's curves again with outputs capped at ``CHAT_TESTED_OUTPUT``
    (:data:`TESTED_WORKLOAD`): the runs that test how much the ratio owes to the outputs' length
    (``reproduce all`` sweeps them with the other figures' runs: figures/__init__.py)."""
    return [dataclasses.replace(spec, workload=TESTED_WORKLOAD, rate=round(spec.rate * TESTED_RATE_SCALE, 6))
            for spec in figure_specs("fig17", quick, scale, **base) if spec.system in TESTED_SYSTEMS]


#: the traces of :func:`hour_runs`: the paper's hour (``--quick``: a minute), times ``scale``
HOUR_S, QUICK_HOUR_S = 3600.0, 60.0


def hour_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """vLLM's and Orca-Oracle's curves again on traces of an hour, as the paper's, not of 400
    requests: the runs that test how much the ratio owes to the traces' length."""
    duration = (QUICK_HOUR_S if quick else HOUR_S) * scale
    return [dataclasses.replace(spec, num_requests=None, duration_s=duration)
            for spec in figure_specs("fig17", quick, scale, **base) if spec.system in TESTED_SYSTEMS]


def extra_runs(quick: bool, scale: float, base: dict) -> list[RunSpec]:
    """The runs beyond the grid (``reproduce all`` sweeps them with the other figures' runs)."""
    return output_runs(quick, scale, base) + hour_runs(quick, scale, base)


def run(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0) -> pd.DataFrame:
    """Fig. 17's curves. Columns: ``workload, system, rate, num_requests, duration_s`` then
    :data:`FIG17_COLS`, a row per run: the grid's (``chatbot``, 400 requests) and :func:`extra_runs`'
    (``duration_s``: :func:`hour_runs`', NaN for the others)."""
    opts, specs, summaries = run_figure("fig17", opts, quick, scale)
    tested = extra_runs(quick, scale, opts.base)
    specs, summaries = specs + tested, summaries + opts.run(tested)
    df = results_frame(specs, summaries)
    df["workload"] = [spec.workload for spec in specs]
    df["duration_s"] = [math.nan if spec.duration_s is None else spec.duration_s for spec in specs]
    cols = ["workload", "system", "rate", "num_requests", "duration_s"] + [c for c in FIG17_COLS if c in df]
    return df[cols].sort_values(["workload", "duration_s", "system", "rate"], kind="stable",
                                na_position="first").reset_index(drop=True)


def hour_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """The curves' runs of :func:`hour_runs`."""
    return curves[curves["duration_s"].notna()] if "duration_s" in curves else curves.iloc[:0]


def grid_runs(curves: pd.DataFrame) -> pd.DataFrame:
    """The curves' runs of the grid (the paper's chatbot, 400 requests), without :func:`extra_runs`."""
    keep = curves["workload"] != TESTED_WORKLOAD if "workload" in curves else curves.index == curves.index
    if "duration_s" in curves:
        keep &= curves["duration_s"].isna()
    return curves[keep]


def ratios(curves: pd.DataFrame, threshold: float = LATENCY_THRESHOLD_S) -> pd.DataFrame:
    """Sustainable rate per system, checked against its capacity, and vLLM's ratio over each Orca
    variant against the paper's (by capacity where a rate reads above it: ``fig12.rate_ratio``).
    Columns: ``system, sustainable_rate, how, capacity, threshold_s_per_token, vllm_ratio,
    measure, paper_ratio, delta, note``; ``delta`` = ours - paper."""
    readings = {s: capacity_reading(h["rate"], h["normalized_latency_s_per_token"], h["request_throughput"], threshold)
                for s, h in grid_runs(curves).groupby("system", sort=False)}
    vllm = readings.get("vllm", (math.nan, "", math.nan))
    rows = []
    for system, (rate, how, capacity) in readings.items():
        ratio, measure = rate_ratio(vllm, (rate, how, capacity)) if system != "vllm" else (math.nan, "")
        point = paper.paper_value("fig17", f"rate_ratio_vs_{system}", workload="chatbot") if system != "vllm" else math.nan
        notes = [how] if ("censored" in how or "lowest" in how) else []
        if system != "vllm" and "censored" in vllm[1] and measure != "capacity":
            notes.append("vLLM censored: ratio is a lower bound")
        notes.append(ratio_miss(ratio, point))
        rows.append({"system": system, "sustainable_rate": rate, "how": how, "capacity": capacity,
                     "threshold_s_per_token": threshold, "vllm_ratio": ratio, "measure": measure, "paper_ratio": point,
                     "delta": ratio - point, "note": "; ".join(filter(None, notes))})
    return pd.DataFrame(rows)


def explain(curves: pd.DataFrame, ratio_table: pd.DataFrame | None = None) -> str:
    if curves is None or curves.empty:
        return "No Fig. 17 results."
    r = ratios(curves) if ratio_table is None else ratio_table
    orca = r[r["system"] != "vllm"]
    parts = [f"{x.vllm_ratio:.2f}x over {x.system}" + (f" (paper {x.paper_ratio:g}x)" if not math.isnan(x.paper_ratio) else "")
             for x in orca.itertuples()]
    lines = [f"Sustainable rate = highest rate with normalized latency <= {r['threshold_s_per_token'].iloc[0]:g} "
             "s/token, as in Fig. 12. vLLM sustains " + ", ".join(parts) + "."]
    rates = orca["sustainable_rate"].dropna()
    if len(rates) > 1 and rates.max() > 0:
        spread = (rates.max() - rates.min()) / rates.max()
        lines.append(f"The three Orca variants sustain {rates.min():.2f}-{rates.max():.2f} req/s ({100 * spread:.0f} % "
                     "apart): alike, as in the paper, because most prompts are cut to 1,024 tokens and the buddy "
                     "allocator rounds each reservation to 2,048 slots whatever output length is predicted.")
    lines.append("Below the paper's 2x: our conversations are the etalon ShareGPT length file (Llama-2 tokenizer, "
                 "history already concatenated) resampled, not the paper's synthesized histories (untested), and "
                 "the paper does not give its output lengths. " + output_reading(curves, r))
    lines.append(hour_reading(curves, r))
    if r["note"].fillna("").str.contains("censored|lowest").any():
        lines.append("Some systems never (or always) crossed the threshold within the probed rates (see note): "
                     "widen the rate list in fig17.toml.")
    return " ".join(lines)


def output_reading(curves: pd.DataFrame, ratio_table: pd.DataFrame) -> str:
    """What :func:`output_runs` say: vLLM's ratio over Orca-Oracle with outputs capped at
    ``CHAT_TESTED_OUTPUT``, read as the grid's is, against the grid's."""
    tested = curves[curves["workload"] == TESTED_WORKLOAD] if "workload" in curves else curves.iloc[:0]
    read = tested_ratio(tested, ratio_table)
    if read is None:
        return "Untested: how much the ratio owes to the outputs' lengths (no run with shorter outputs)."
    short, own, measure = read
    text = (f"Tested: with outputs capped at {CHAT_TESTED_OUTPUT} tokens, not 1,024, vLLM sustains "
            f"{short:.2f}x Orca-Oracle's rate by {measure} ({own:.2f}x at the paper's cap): ")
    if not moves(short, own):
        return text + "the outputs' length does not explain the gap."
    if short > own:
        return text + ("shorter outputs shrink vLLM's footprint, not Orca's buddy-rounded reservations, and move "
                       "the ratio toward the paper's: the outputs' length is a cause.")
    return text + "the outputs' length moves it away from the paper's 2x."


def tested_ratio(tested: pd.DataFrame, ratio_table: pd.DataFrame) -> tuple[float, float, str] | None:
    """vLLM's ratio over Orca-Oracle on runs beside the grid (``tested``), read as the grid's, the
    grid's (``ratio_table``), and the measure of the first; None without both."""
    plain = tested.drop(columns=["workload", "duration_s"], errors="ignore")
    short = ratios(plain).set_index("system") if len(tested) else tested
    own = ratio_table.set_index("system")
    if "orca-oracle" not in short.index or "orca-oracle" not in own.index:
        return None
    tested_row, own_row = short.loc["orca-oracle"], own.loc["orca-oracle"]
    return tested_row["vllm_ratio"], own_row["vllm_ratio"], tested_row["measure"]


def hour_reading(curves: pd.DataFrame, ratio_table: pd.DataFrame) -> str:
    """What :func:`hour_runs` say: vLLM's ratio over Orca-Oracle on traces of an hour, against the
    grid's 400 requests."""
    read = tested_ratio(hour_curves(curves), ratio_table)
    if read is None:
        return ("The traces are 400 requests, not 1 hour, so latency past the knee grows more slowly than in the "
                "paper (untested).")
    hour, own, measure = read
    text = (f"Tested: over traces of an hour, as the paper's, not 400 requests, vLLM sustains {hour:.2f}x "
            f"Orca-Oracle's rate by {measure} ({own:.2f}x over 400 requests): ")
    if moves(hour, own):
        return text + "the traces' length moves it " + ("toward" if hour > own else "away from") + " the paper's 2x."
    return text + "the traces' length does not explain the gap."


def tables(opts: SweepOptions, *, quick: bool = False, scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """What ``reproduce fig17`` writes: the latency curves and the sustainable-rate ratios."""
    curves = run(opts, quick=quick, scale=scale)
    return {"fig17": curves, "fig17_ratios": ratios(curves)}


def section(rep, curves: pd.DataFrame, read) -> None:
    """Fig. 17's part of the reproduce report (:func:`figures.common.rate_curves_section`)."""
    from pagesim.experiments import paper_plots as P  # plotly: only the report draws (see figures/__init__.py)

    rate_curves_section(rep, "fig17", curves, read, ratios, explain,
                        "Fig. 17: chatbot, normalized latency vs request rate",
                        panels=grid_runs(curves).assign(workload="chatbot (ShareGPT, last 1,024 prompt tokens)"),
                        plot_title="Fig. 17: chatbot, normalized latency vs request rate",
                        ratio_figure=lambda r: P.ratio_dots(
                            r, "system", "Fig. 17: vLLM's sustainable rate over each Orca variant (chatbot)"))
