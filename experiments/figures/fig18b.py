"""Fig. 18b: normalized latency against block size."""

from __future__ import annotations


import pandas as pd

from pagesim.experiments import paper
from pagesim.experiments.figures.common import SweepOptions, run_figure
from pagesim.experiments.run_spec import results_frame

#: what the figure shows, in ``reproduce all``'s closing table
TITLE = "block size"

#: the experiment configs (experiments/configs/<name>.toml) whose runs it reads
EXPERIMENTS = ("fig18b",)
#: block sizes within this of the best latency count as "near best"
FIG18B_NEAR_BEST = 0.10


def run(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0) -> pd.DataFrame:
    """Fig. 18b: vLLM's normalized latency vs block size (1-256) on ShareGPT and Alpaca.

    Columns: ``workload, rate, block_size, normalized_latency_s_per_token, mean_tpot_ms,
    avg_batch_size, num_preemptions, rel_to_best`` (latency / best latency of the workload),
    ``near_best`` (within 10% of the best), ``paper_best_low, paper_best_high, in_paper_range, note``.
    """
    opts, specs, summaries = run_figure("fig18b", opts, quick, scale)
    df = results_frame(specs, summaries)
    keep = ["workload", "rate", "block_size", "normalized_latency_s_per_token", "mean_tpot_ms", "avg_batch_size",
            "num_preemptions"]
    df = df[[c for c in keep if c in df]].copy()
    out = []
    for wl, g in df.groupby("workload", sort=False):
        g = g.sort_values("block_size").copy()
        lat = g["normalized_latency_s_per_token"]
        best = lat.min()
        g["rel_to_best"] = lat / best
        g["near_best"] = g["rel_to_best"] <= 1 + FIG18B_NEAR_BEST
        low, high = paper.fig18b_paper_best(wl)
        g["paper_best_low"], g["paper_best_high"] = low, high
        g["in_paper_range"] = (g["block_size"] >= low) & (g["block_size"] <= high)
        notes = []
        paper_ok = bool(g.loc[g["in_paper_range"], "near_best"].any())  # a paper-best size is near our best
        for r in g.itertuples():
            n = ""
            if r.rel_to_best == 1 and not r.in_paper_range and not paper_ok:
                n = f"best block size {r.block_size} is outside the paper's {low:g}-{high:g}"
            elif r.in_paper_range and not r.near_best:
                n = f"paper finds {low:g}-{high:g} best; ours is {100 * (r.rel_to_best - 1):.0f}% slower than best"
            notes.append(n)
        g["note"] = notes
        out.append(g)
    return pd.concat(out, ignore_index=True) if out else df


def explain(df: pd.DataFrame) -> str:
    if df is None or df.empty:
        return "No Fig. 18b results."
    lines = []
    for wl, g in df.groupby("workload", sort=False):
        best = g.loc[g["normalized_latency_s_per_token"].idxmin(), "block_size"]
        near = ", ".join(str(int(b)) for b in g.loc[g["near_best"], "block_size"])
        paper_rng = f"{g['paper_best_low'].iloc[0]:g}-{g['paper_best_high'].iloc[0]:g}"
        spread = 100 * (g["rel_to_best"].max() - 1)
        if g["near_best"].all():
            lines.append(f"{wl}: flat - every block size is within {spread:.1f}% of the best ({int(best)}), so the "
                         f"paper's best range {paper_rng} is not contradicted but not singled out either: at this "
                         "load block size barely changes latency in our cost model.")
        else:
            lines.append(f"{wl}: best block size {int(best)}; within 10% of it: {near} (paper: {paper_rng}; worst is "
                         f"{spread:.0f}% slower).")
    # the smallest block within reach of the best: small blocks cost (almost) nothing
    small_cheap = any(bool(g.sort_values("block_size")["near_best"].iloc[0])
                      for _, g in df.groupby("workload", sort=False))
    big_costly = any(g.sort_values("block_size")["rel_to_best"].iloc[-1] > 1 + FIG18B_NEAR_BEST
                     for _, g in df.groupby("workload", sort=False))
    if small_cheap:
        lines.append("Unlike the paper, blocks smaller than 16 cost (almost) nothing here: the paper's slowdown for "
                     "small blocks comes from the attention kernel reading many tiny blocks (poor parallelism and "
                     "memory-access efficiency), which our cost model charges little or nothing for.")
    else:
        lines.append("Small blocks lose to the paged kernel's work per block, as in the paper: the cost model "
                     "charges each block of vLLM's kernel the paper's Fig. 18a overhead (23 % of a 16-token "
                     "block's K/V reads, so 3.7x the reads at block size 1, sim/core/price/cost.py), and reads a "
                     "sequence's last block whole.")
    if big_costly:
        lines.append("Large blocks lose to internal fragmentation (fewer sequences fit, smaller batches, more "
                     "preemption), which hurts Alpaca's short sequences first - as in the paper.")
    return " ".join(lines)


def tables(opts: SweepOptions, *, quick: bool = False, scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """What ``reproduce fig18b`` writes."""
    return {"fig18b": run(opts, quick=quick, scale=scale)}


def section(rep, df: pd.DataFrame, read) -> None:
    """Fig. 18b's part of the reproduce report (see :func:`figures.fig2.section`)."""
    from pagesim.experiments import paper_plots as P  # plotly: only the report draws (see figures/__init__.py)

    rep.heading("Fig. 18b: block size")
    rep.figure(P.block_size_sweep(df))
    rep.table(df)
    rep.reading(explain(df))
