"""Fig. 19: recompute vs swap as vLLM's recovery from preemption, against the block size (§7.3).

(a) ``fig19_micro``: what the cost model charges to bring back ``MICRO_TOKENS`` tokens of
OPT-13B's KV on an A100-40GB, per block size (no simulation): recompute (the step grows by a
prefill of those tokens), swap-out, swap-in and both. The paper's text does not state how much
KV its microbenchmark moves; every quantity here is linear in it (recompute's attention term
aside), so the ratios the paper states do not depend on the choice. Swapping pays its bytes over
PCIe plus one copy latency per block, layer and K/V (``sim.core.cost.PCIE_COPY_LATENCY_S``):
vLLM copies block by block, which is what makes small blocks expensive to swap.

(b) ``fig19``: vLLM's normalized latency on ShareGPT at one rate (Fig. 18b's, near the knee),
block sizes 1-256, recompute vs swap (``configs/fig19.toml``), 400 requests per run.

Cost: 18 runs, 3.6 s on 2 cores once the core is compiled (the quick grid: 6 runs of 40
requests, 0.3 s).
"""

from __future__ import annotations

import pandas as pd

from pagesim.experiments import paper
from pagesim.experiments.figures.common import SweepOptions, run_figure
from pagesim.experiments.run_spec import results_frame
from pagesim.sim.batch import StepBatch
from pagesim.sim.config import default_cost_model
from pagesim.sim.cost.models import make_cost_model
from pagesim.sim.core.price.cost import PCIE_COPY_LATENCY_S, swap_copy_seconds_per_token
from pagesim.sim.specs import get_gpu, get_model

#: what the figure shows, in ``reproduce all``'s closing table
TITLE = "recompute vs swap"
#: the tables that hold its rows compared with the paper's (``note``: where we miss); default its own
COMPARED = ("fig19", "fig19_micro")

#: the experiment configs (experiments/configs/<name>.toml) whose runs ``reproduce all`` runs
#: up front, in one sweep with the other figures' (see figures/__init__.py)
EXPERIMENTS = ("fig19",)

#: the amount of KV the microbenchmark moves (one long ShareGPT conversation)
MICRO_TOKENS = 1024
MICRO_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Fig. 19a's y axis ends here (ms): every swap and recompute the paper plots lies under it
PAPER_AXIS_MS = 140.0
#: swap and recompute within this of each other count as "comparable" end to end
COMPARABLE = 0.10


def microbenchmark(model: str = "opt-13b", gpu: str = "a100-40gb", tokens: int = MICRO_TOKENS,
                   block_sizes=MICRO_BLOCK_SIZES, cost_model: str = "roofline") -> pd.DataFrame:
    """Fig. 19a: ms to recompute, swap out, swap in and swap both ways ``tokens`` tokens' KV.

    Each is what the step that does it grows by under the cost model the runs use
    (``make_cost_model`` with the block size as the swap's copy size; ``cost_model``, as
    ``reproduce --cost-model`` names it); recompute is one prefill of ``tokens`` (its K/V are
    rebuilt by running the prompt and the generated tokens again)."""
    import numpy as np

    m, g = get_model(model), get_gpu(gpu)
    rows = []
    for bs in block_sizes:
        cm = make_cost_model(m, g, cost_model=cost_model, swap_block_tokens=int(bs))
        idle = cm.step_time(StepBatch())
        recompute = cm.step_time(StepBatch(prefill_seq_ids=np.array([0]), prefill_tokens=np.array([tokens]),
                                           prefill_context=np.array([tokens]))) - idle
        swap_out = cm.step_time(StepBatch(swap_out_tokens=tokens)) - idle
        swap_in = cm.step_time(StepBatch(swap_in_tokens=tokens)) - idle
        copies = tokens * swap_copy_seconds_per_token(m.num_attention_layers, int(bs))  # each way
        rows.append({"block_size": int(bs), "tokens": tokens, "cost_model": cost_model,
                     "recompute_ms": 1e3 * recompute,
                     "swap_in_ms": 1e3 * swap_in, "swap_out_ms": 1e3 * swap_out,
                     "swap_in_out_ms": 1e3 * (swap_in + swap_out), "swap_copies_ms": 2e3 * copies,
                     "pcie_gb_per_s": g.pcie_bw / 1e9})
    df = pd.DataFrame(rows)
    df["recompute_over_swap"] = df["recompute_ms"] / df["swap_in_out_ms"]
    limit = paper.paper_value("fig19", "recompute_over_swap_max")
    df["paper_recompute_over_swap_max"] = limit
    df["within_paper_limit"] = df["recompute_over_swap"] <= limit
    df["note"] = [None if within else f"recompute {ratio:.2f}x swap (paper at most {limit:g}x)"
                  for ratio, within in zip(df["recompute_over_swap"], df["within_paper_limit"])]
    return df


def run(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0) -> pd.DataFrame:
    """Fig. 19b: one row per block size. Columns ``workload, rate, block_size``,
    ``recompute_latency_s_per_token, swap_latency_s_per_token`` (normalized latency),
    ``swap_over_recompute``, ``recompute_preemptions, swap_preemptions``, ``comparable``
    (within 10 %), ``paper_comparable_low/_high, in_paper_range, note``."""
    opts, specs, summaries = run_figure("fig19", opts, quick, scale)
    df = results_frame(specs, summaries)
    out = []
    for (wl, rate), g in df.groupby(["workload", "rate"], sort=False):
        by = {mode: gm.set_index("block_size") for mode, gm in g.groupby("preemption")}
        rec, swp = by["recompute"], by["swap"]
        t = pd.DataFrame({"workload": wl, "rate": rate, "block_size": sorted(rec.index)})
        t["recompute_latency_s_per_token"] = rec.loc[t["block_size"], "normalized_latency_s_per_token"].to_numpy()
        t["swap_latency_s_per_token"] = swp.loc[t["block_size"], "normalized_latency_s_per_token"].to_numpy()
        t["swap_over_recompute"] = t["swap_latency_s_per_token"] / t["recompute_latency_s_per_token"]
        t["recompute_preemptions"] = rec.loc[t["block_size"], "num_preemptions"].to_numpy()
        t["swap_preemptions"] = swp.loc[t["block_size"], "num_preemptions"].to_numpy()
        t["comparable"] = (t["swap_over_recompute"] - 1).abs() <= COMPARABLE
        low, high = paper.fig19_paper_comparable(wl)
        t["paper_comparable_low"], t["paper_comparable_high"] = low, high
        t["in_paper_range"] = (t["block_size"] >= low) & (t["block_size"] <= high)
        t["note"] = [f"paper: comparable at {low:g}-{high:g}; here swap is {r:.2f}x recompute"
                     if inside and not ok else "" for inside, ok, r in
                     zip(t["in_paper_range"], t["comparable"], t["swap_over_recompute"])]
        out.append(t)
    return pd.concat(out, ignore_index=True)


def swap_sensitivity(micro: pd.DataFrame) -> str:
    """What the swap's two constants would have to be for the paper's Fig. 19a, from the
    microbenchmark's own parts (a swap is its bytes over PCIe plus one copy latency per block,
    layer and K/V, ``swap_copies_ms``): the PCIe rate at which recompute stays within the
    paper's limit of swap at the largest block, and the copy latency at which the smallest
    block's swap in+out fits the paper's axis (:data:`PAPER_AXIS_MS`)."""
    small, large = micro.iloc[0], micro.iloc[-1]
    limit, rate = large.paper_recompute_over_swap_max, large.pcie_gb_per_s
    bytes_ms = large.swap_in_out_ms - large.swap_copies_ms  # (the same at every block size)
    needed = large.recompute_ms / limit - large.swap_copies_ms  # the bytes' ms that would bring it within the limit
    text = (f"The swap's constants, from the microbenchmark's parts: recompute stays within {limit:g}x swap at "
            f"block size {int(large.block_size)} with PCIe at {rate * bytes_ms / needed:.1f} GB/s or less (here "
            f"{rate:g} GB/s, {bytes_ms:.0f} ms of bytes in and out). At block size {int(small.block_size)} swap in+out "
            f"takes {small.swap_in_out_ms:.0f} ms, {small.swap_in_out_ms / PAPER_AXIS_MS:.1f}x the paper's whole axis "
            f"({PAPER_AXIS_MS:g} ms), {small.swap_copies_ms:.0f} ms of it the copies' latency "
            f"({PCIE_COPY_LATENCY_S * 1e6:g} us a copy: sim/core/price/cost.py): ")
    room = PAPER_AXIS_MS - bytes_ms
    if room <= 0:
        return text + "the bytes alone exceed the axis."
    per_copy = PCIE_COPY_LATENCY_S * 1e6 * room / small.swap_copies_ms
    return text + f"the axis holds it with {per_copy:.2f} us a copy or less. Neither constant is measured on the paper's machine."


def explain(df: pd.DataFrame, micro: pd.DataFrame | None = None) -> str:
    micro = microbenchmark() if micro is None else micro
    lines = []
    rec = micro["recompute_ms"]
    spread = rec.max() / rec.min()
    lines.append(f"Fig. 19a ({int(micro['tokens'].iloc[0])} tokens of KV): recompute costs {rec.iloc[0]:.1f} ms at "
                 f"every block size (spread {spread:.2f}x; paper: constant), as recompute never touches the blocks.")
    small, large = micro.iloc[0], micro.iloc[-1]
    lines.append(f"Swap in+out falls from {small.swap_in_out_ms:.0f} ms at block size {small.block_size} to "
                 f"{large.swap_in_out_ms:.0f} ms at {large.block_size}: one copy latency per block, layer and K/V "
                 "dominates small blocks, the PCIe bytes large ones, as the paper explains.")
    cheaper = micro.loc[micro["recompute_over_swap"] > 1, "block_size"]
    if len(cheaper):
        lines.append(f"Swap is the cheaper from block size {int(cheaper.min())} up and recompute below it "
                     "(the paper's crossing).")
    else:
        lines.append("Recompute is the cheaper at every block size, unlike the paper (swap wins at large blocks).")
    worst = micro["recompute_over_swap"].max()
    limit = micro["paper_recompute_over_swap_max"].iloc[0]
    if worst > limit:
        lines.append(f"Recompute reaches {worst:.2f}x swap in+out at the largest blocks, above the paper's 'never "
                     f"more than 20 %' ({limit:g}x): the {micro['cost_model'].iloc[0]} cost model prices a "
                     f"{int(micro['tokens'].iloc[0])}-token prefill at the GEMMs' compute bound, so either the "
                     "paper's prefill ran nearer the GPU's peak or its swaps moved slower than ours.")
    else:
        lines.append(f"Recompute stays within {worst:.2f}x of swap in+out (paper: at most {limit:g}x).")
    lines.append(swap_sensitivity(micro))
    if df is not None and not df.empty:
        for wl, g in df.groupby("workload", sort=False):
            comp = ", ".join(str(int(b)) for b in g.loc[g["comparable"], "block_size"]) or "none"
            rng = f"{g['paper_comparable_low'].iloc[0]:g}-{g['paper_comparable_high'].iloc[0]:g}"
            worst_small = g.iloc[0]
            lines.append(f"Fig. 19b ({wl}, {g['rate'].iloc[0]:g} req/s): swap and recompute within 10 % at block "
                         f"sizes {comp} (paper: {rng}); at block size {int(worst_small.block_size)} swap is "
                         f"{worst_small.swap_over_recompute:.2f}x recompute.")
            if (g["swap_preemptions"] + g["recompute_preemptions"]).sum() == 0:
                lines.append("No request was preempted at this load, so the recovery mechanism cannot show.")
    return " ".join(lines)


def tables(opts: SweepOptions, *, quick: bool = False, scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """What ``reproduce fig19`` writes: the end-to-end table and the microbenchmark."""
    cost_model = opts.base.get("cost_model") or default_cost_model("vllm")
    return {"fig19": run(opts, quick=quick, scale=scale), "fig19_micro": microbenchmark(cost_model=cost_model)}


def section(rep, df: pd.DataFrame, read) -> None:
    """Fig. 19's part of the reproduce report (see :func:`figures.fig2.section`): the latencies
    beside the microbenchmark where ``read`` finds it, its table, the runs and the reading."""
    from pagesim.experiments import paper_plots as P  # plotly: only the report draws (see figures/__init__.py)

    micro = read("fig19_micro")
    rep.heading("Fig. 19: recompute vs swap")
    rep.figure(P.recompute_vs_swap(df, micro))
    if micro is not None:
        rep.table(micro)
    rep.table(df)
    rep.reading(explain(df, micro))
