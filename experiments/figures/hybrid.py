"""Where the KV memory goes in hybrid models (no paper has this figure): a sliding-window model
and a Mamba hybrid, each on a ShareGPT-like and a long-context workload, served by vLLM v0's
full-attention sizing (``vllm``: 0.4.2, every attention layer keeps every token) and by vLLM
v1's hybrid manager (``vllm-v1 --no-prefix-caching``: 0.33.0's KV cache groups, a
sliding-window group freeing the blocks its window has left).

Inputs (``experiments/configs/hybrid.toml``; all chosen here, none from a paper):

* models: ``gemma-2-27b`` (23 sliding-window layers of 4,096 tokens and 23 full ones, context
  8,192; one GPU) and ``jamba-1.5-mini`` (4 attention and 28 Mamba layers, MoE; TP 2), their
  ``config.json`` values (``sim/specs/presets.py``), on H100-80GB at 90 % of its memory;
* workloads: the built-in ``sharegpt`` (the vLLM paper's lengths, prompt + output <= 2,048:
  no sequence reaches the window) and ``long-context`` (``traces/long_context.py``: lengths
  shaped like the Mooncake conversation trace, prompts mean 12,035 and median ~6,900 tokens,
  outputs 1-686); prompts past a model's context keep their end (``clip-prompt``);
* 1,000 Poisson requests per run at a rate about twice what the faster system serves, so that
  memory (or ``max_num_seqs``) bounds the batch for most of the run; each engine's own
  defaults otherwise; the roofline cost model for both.

Everything is read from each run's summary: the pool's categories (``mem_*``, time-weighted
over the whole run, ramp-up and drain included), the groups' split of the slots in use
(``kv_groups``: one entry per kind of group), the recurrent state reserved outside the pool
(``state_reserved_bytes``), throughput, and from the step table the most requests running at
once. A category's GiB is its share times the pool (``kv_capacity_tokens`` slots of
``kv_bytes_per_token`` bytes: a token of every attention layer under v0, of one group's layers
under v1), per GPU. A run whose engine keeps recurrent states inside the pool shows them as
its ``kv_groups`` kind, with nothing reserved outside.

Cost: 8 runs of 1,000 requests, 3.0 s of wall time on two workers once the core is compiled
(2026-11-25; ``--quick``: 8 runs of 40).
"""

from __future__ import annotations

import math

import pandas as pd

from pagesim.experiments.figures.common import SweepOptions, number, run_figure

#: what the figure shows, in ``reproduce all``'s closing table
TITLE = "hybrid models' memory"
#: no paper: no table compared (the closing table says so)
COMPARED: tuple[str, ...] = ()
#: the experiment configs whose runs ``reproduce all`` runs up front
EXPERIMENTS = ("hybrid",)
GiB = float(1 << 30)
#: the pool's categories beside the slots in use, as the summary's ``mem_*`` keys name them
POOL_REST = {"reservation": ("reservation",), "internal fragmentation": ("internal_frag",),
             "free and other": ("allocator_slack", "external_frag", "free_idle", "speculative_slack")}
#: the category of the recurrent state reserved outside the pool
OUTSIDE = "state reserved outside the pool"
#: the columns of hybrid.csv
COLUMNS = ("model", "workload", "system", "rate", "num_requests", "kv_pool_gib", "state_outside_gib",
           "in_use_gib", "in_use_pct", "mean_running", "max_running", "request_throughput",
           "output_throughput", "mean_ttft_ms", "mean_tpot_ms", "completed", "num_preemptions", "groups")


def in_use_kinds(summary: dict) -> dict[str, float]:
    """The pool's slots in use (shares of the pool) by kind of KV cache group: the summary's
    ``kv_groups`` (vLLM v1 with groups), else one kind, every layer (``mem_token_states``)."""
    groups = summary.get("kv_groups") or {}
    kinds = {k: number(v, "token_states") for k, v in groups.items() if isinstance(v, dict) and v.get("groups")}
    return {f"in use: {k} groups": v for k, v in kinds.items()} or {
        "in use: all layers": number(summary, "mem_token_states")}


def pool_gib(summary: dict) -> float:
    """The KV pool of one GPU: ``kv_capacity_tokens`` slots of ``kv_bytes_per_token`` bytes."""
    return number(summary, "kv_capacity_tokens") * number(summary, "kv_bytes_per_token") / GiB


def memory_gib(summary: dict) -> dict[str, float]:
    """GiB per GPU in each category: the slots in use by kind, the rest of the pool, and the
    state reserved outside it (where some is). The engine's shares make them sum to the pool
    plus that state."""
    pool = pool_gib(summary)
    out = {name: share * pool for name, share in in_use_kinds(summary).items()}
    for name, keys in POOL_REST.items():
        out[name] = sum(0.0 if math.isnan(v) else v for v in (number(summary, f"mem_{k}") for k in keys)) * pool
    state = number(summary, "state_reserved_bytes")
    if state > 0:  # NaN (no such key) and 0: nothing outside
        out[OUTSIDE] = state / GiB
    return out


def groups_words(summary: dict) -> str:
    """``1 full + 1 sliding x 23 layers``, or ``one table`` (every layer sized full)."""
    groups = summary.get("kv_groups") or {}
    kinds = [f"{v['groups']} {k}" for k, v in groups.items() if isinstance(v, dict) and v.get("groups")]
    return f"{' + '.join(kinds)} x {groups.get('layers_per_group', '?')} layers" if kinds else "one table"


def max_running(opts: SweepOptions, spec) -> float:
    """The most requests running at once (its step table's ``num_running``; NaN without it)."""
    out = opts.load(spec)
    steps = out.steps if out is not None else None
    return float(steps["num_running"].max()) if steps is not None and "num_running" in steps else math.nan


def runs(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0):
    """(the main table, the memory table): one row per run (:data:`COLUMNS`), and one per run and
    category (``model, workload, system, category, gib, pct``: GiB per GPU and percent of the pool
    plus the state outside it)."""
    opts, specs, summaries = run_figure("hybrid", opts, quick, scale)
    rows, memory = [], []
    for spec, s in zip(specs, summaries):
        key = {"model": spec.sim.get("model"), "workload": spec.workload, "system": spec.system}
        gib = memory_gib(s)
        total = pool_gib(s) + gib.get(OUTSIDE, 0.0)
        in_use = sum(v for k, v in gib.items() if k.startswith("in use"))
        rows.append({**key, "rate": spec.rate, "num_requests": spec.num_requests,
                     "kv_pool_gib": pool_gib(s), "state_outside_gib": gib.get(OUTSIDE, 0.0),
                     "in_use_gib": in_use, "in_use_pct": 100 * in_use / total if total else math.nan,
                     "mean_running": number(s, "avg_batch_size"), "max_running": max_running(opts, spec),
                     **{c: number(s, c) for c in ("request_throughput", "output_throughput", "mean_ttft_ms",
                                                  "mean_tpot_ms", "completed", "num_preemptions")},
                     "groups": groups_words(s)})
        memory += [{**key, "category": name, "gib": v, "pct": 100 * v / total if total else math.nan}
                   for name, v in gib.items()]
    return pd.DataFrame(rows, columns=list(COLUMNS)), pd.DataFrame(memory)


def run(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0) -> pd.DataFrame:
    """The main table (``hybrid.csv``)."""
    return runs(opts, quick=quick, scale=scale)[0]


def tables(opts: SweepOptions, *, quick: bool = False, scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """What ``reproduce hybrid`` writes: one row per run, and its memory per category."""
    main, memory = runs(opts, quick=quick, scale=scale)
    return {"hybrid": main, "hybrid_memory": memory}


def explain(table: pd.DataFrame, memory: pd.DataFrame | None = None) -> str:
    """The written reading: per model and workload, v1's memory, batch and throughput against
    v0's, where the recurrent state is accounted, and the inputs."""
    if table is None or table.empty:
        return "No hybrid-model results."
    lines = []
    for (model, workload), g in table.groupby(["model", "workload"], sort=False):
        by = g.set_index("system")
        if not {"vllm", "vllm-v1"} <= set(by.index):
            continue
        v0, v1 = by.loc["vllm"], by.loc["vllm-v1"]
        text = (f"{model}, {workload}: v0 holds {v0['in_use_gib']:.1f} of {v0['kv_pool_gib']:.1f} GiB in "
                f"use, v1 {v1['in_use_gib']:.1f} of {v1['kv_pool_gib']:.1f}")
        if memory is not None and not memory.empty:
            parts = memory[(memory["model"] == model) & (memory["workload"] == workload)
                           & (memory["system"] == "vllm-v1") & memory["category"].str.startswith("in use")]
            if len(parts) > 1:
                text += " (" + ", ".join(f"{r.category[8:]} {r.gib:.1f}" for r in parts.itertuples()) + ")"
        text += (f"; {v0['mean_running']:.1f} against {v1['mean_running']:.1f} requests running on "
                 f"average ({v1['mean_running'] / v0['mean_running']:.2f}x), at most {v0['max_running']:.0f} "
                 f"against {v1['max_running']:.0f}; {v0['request_throughput']:.2f} against "
                 f"{v1['request_throughput']:.2f} req/s ({v1['request_throughput'] / v0['request_throughput']:.2f}x).")
        if v0["state_outside_gib"] > 0 and v1["state_outside_gib"] > 0:
            text += (f" The Mamba states take {v0['state_outside_gib']:.2f} GiB outside the pool under v0 and "
                     f"{v1['state_outside_gib']:.2f} under v1 (each reserves a slot per max_num_seqs before "
                     "sizing the pool, used or not).")
        elif v0["state_outside_gib"] > 0:
            text += (f" The Mamba states take {v0['state_outside_gib']:.2f} GiB outside the pool under v0 (a "
                     "slot per max_num_seqs, used or not); v1 keeps them in its pool, as their own groups.")
        lines.append(text)
    lines.append(
        "Where the memory is accounted: the pool's categories are shares of its slots over the whole run; "
        "v1's slots in use split by kind of KV cache group (a sliding-window group holds at most its window "
        "of each request, a full one every token); a recurrent (Mamba) state is outside the pool where "
        "the engine reserves it up front (state_reserved_bytes, as vLLM 0.4.2 does: a slot per max_num_seqs), "
        "and inside it under v1, a block per request in each state group (its padding up to the page, "
        "which raises Jamba's blocks to 80 tokens, in the pool's fragmentation). The batch bound differs "
        "too: max_num_seqs is 256 under v0, 1,024 under v1 on "
        "an H100 (each engine's default), and v1 also schedules differently (chunked prefill, async "
        "scheduling), so throughput is not the memory's alone.")
    lines.append(
        "Inputs, none from a paper: Gemma-2-27B on one H100-80GB and Jamba-1.5-Mini at TP 2, 90 % of the "
        "memory, the roofline cost model; ShareGPT at the vLLM paper's lengths (no sequence reaches "
        "Gemma-2's 4,096-token window) and the long-context workload of traces/long_context.py "
        "(Mooncake-shaped: prompts mean 12,035, median ~6,900, outputs 1-686 tokens; Gemma-2's prompts cut "
        "to its 8,192-token context, so a sequence there holds at most 8,192 tokens of which v1 keeps "
        "4,096 in the sliding layers: at most 25 % less than full sizing); Poisson arrivals at about twice "
        "the faster system's throughput.")
    return " ".join(lines)


def section(rep, table: pd.DataFrame, read) -> None:
    """The figure's part of the reproduce report: the memory bars, the table, the reading."""
    from pagesim.experiments import paper_plots as P  # plotly: only the report draws

    memory = read("hybrid_memory")
    rep.heading("Hybrid models: where the KV memory goes, full-attention sizing vs vLLM v1's groups")
    if memory is not None and not memory.empty:
        rep.figure(P.hybrid_memory_bars(memory))
    rep.table(table)
    rep.reading(explain(table, memory))
    if memory is not None and not memory.empty:
        rep.heading("Memory per category (GiB per GPU)", level=3)
        rep.table(memory)
