"""The paper's figures as experiments: one module per figure, registered in :data:`FIGURES`.

Each figure module builds its runs from ``experiments/configs/<fig>.toml``, runs them through
:func:`experiments.sweep.run_sweep` (``common.run_figure``) and offers

    EXPERIMENTS                   the configs its runs come from (``reproduce all`` runs them
                                  all in one sweep, the longest first, then builds each figure)
    run(opts, quick=, scale=)     its main table, in the CSV layout of ``<fig>.csv``, with the
                                  paper's numbers and the differences beside ours
    tables(opts, quick=, scale=)  every table ``reproduce <fig>`` writes, by file name
    explain(table)                a written reading of the differences from the paper

``opts`` is a :class:`~experiments.figures.common.SweepOptions` (executor, workers, cache, an
injectable run function), ``quick`` tiny grids and traces (tests and smoke runs) and ``scale``
multiplies every trace duration. Settings are the same for every system (never tuned per
system): OPT-13B, A100-40GB, ``kv_gib=12`` (15,728 slots), ``max_seq_len=2048``, block size 16
for vLLM, buddy placement for Orca. A new figure is a module with these names, its TOML, and a
line in :data:`FIGURES`. ``distserve`` is another paper's figure (DistServe, OSDI '24: disaggregated
against colocated serving, ``vllm-v1`` on OPT-13B, A100-80GB), built the same way; ``hybrid`` is
in no paper (where the KV memory goes in a sliding-window and a Mamba hybrid model, vLLM v0 vs
v1 on H100-80GB): its ``COMPARED`` is empty, and it states its own inputs.

Default cost: fig2, its rate sensitivity, fig13 and fig12 replay 1-hour traces (fig12's
overloaded Alpaca probes are most of the work); the other figures use shorter traces or a fixed
request count, so ``pagesim reproduce all`` takes about 25 s of CPU, ~13 s on two workers
(docs/performance.md). Runs shared between figures (fig2's four runs in fig2_sensitivity) are
simulated once.
"""

from __future__ import annotations

from functools import partial
from importlib import import_module
from pathlib import Path
from types import ModuleType

import pandas as pd

from pagesim.experiments.figure_names import FIGURE_NAMES
from pagesim.experiments.figures.common import SweepOptions, expected_requests, figure_specs
from pagesim.experiments.sweep import map_local
from pagesim.sim.errors import ConfigError

#: the figures ``pagesim reproduce`` knows, in the order ``all`` runs them (their names stated once,
#: in ``experiments/figure_names.py``, which the command line's parser reads)
FIGURES: dict[str, ModuleType] = {name: import_module(f"pagesim.experiments.figures.{name}") for name in FIGURE_NAMES}
#: runs a figure makes beyond its EXPERIMENTS' grids, which ``reproduce all`` sweeps with the rest
EXTRA_RUNS = {"fig14": FIGURES["fig14"].distinct_runs, "fig16": FIGURES["fig16"].extra_runs,
              "fig17": FIGURES["fig17"].extra_runs}
#: the figures that probe again where their runs' results say (``common.refine_knees``): ``reproduce
#: all`` runs them once its sweep is done, so that their tables then find every run in the cache
PROBES_AGAIN = ("fig12",)
#: each figure's written reading of its main table
EXPLAIN = {name: module.explain for name, module in FIGURES.items()}
#: what each figure shows, in a few words (``reproduce all``'s closing table)
TITLES = {name: module.TITLE for name, module in FIGURES.items()}
#: the columns that name a compared row (in this order), and how each is written
ROW_KEYS = {"workload": "{}", "mode": "{}", "width": "width {}", "system": "{}", "block_size": "block {}",
            "cost_scale": "GPU time x{}", "design": "{}"}
#: the order of the figures' sections in the reproduce report (each module's ``section(rep, table, read)``
#: writes its own; they import the plots, and with them plotly, only when called, so that this
#: registry, which ``pagesim reproduce`` (and so ``pagesim --help``) loads, does not)
REPORT_ORDER = ("fig2", "fig13", "fig15", "fig12", "fig18b", "fig14", "fig17", "fig16", "fig19",
                "distserve", "hybrid")


def figure_tables(fig: str, opts: SweepOptions, quick: bool, scale: float) -> dict[str, pd.DataFrame]:
    """Figure ``fig``'s tables (``map_local`` runs it in a worker: a module-level function)."""
    return FIGURES[fig].tables(opts, quick=quick, scale=scale)


def reproduce(fig: str, out_dir: str | Path, opts: SweepOptions | None = None, *, quick: bool = False,
              scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """Run figure ``fig`` (or ``"all"``), write ``out_dir/<name>.csv`` per table, return the tables."""
    figs = list(FIGURES) if fig == "all" else [fig]
    for f in figs:
        if f not in FIGURES:
            raise ConfigError(f"unknown figure '{f}'; valid: {', '.join(FIGURES)}, all")
    opts = opts or SweepOptions()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if len(figs) > 1:
        # every figure's runs in one sweep, the longest first: the workers stay busy across the
        # figures (no pool draining at the end of each), then each figure reads its runs back
        specs = [s for f in figs for name in FIGURES[f].EXPERIMENTS
                 for s in figure_specs(name, quick, scale, **opts.base)]
        specs += [s for f in figs if f in EXTRA_RUNS for s in EXTRA_RUNS[f](quick, scale, opts.base)]
        opts.run(sorted(specs, key=expected_requests, reverse=True))
        opts.after_first_sweep()
        for f in figs:  # the probes a figure adds from its own runs' results, on the pool too
            if f in PROBES_AGAIN:
                FIGURES[f].run(opts, quick=quick, scale=scale)
    tables: dict[str, pd.DataFrame] = {}
    # every figure's tables from the run cache, side by side on the sweep's local workers
    build = partial(figure_tables, opts=opts, quick=quick, scale=scale)
    for t in (map_local(build, figs, opts.workers) if opts.executor == "local" else map(build, figs)):
        tables.update(t)
    for name, t in tables.items():
        t.to_csv(out / f"{name}.csv", index=False)
    return tables


def misses(fig: str, tables: dict[str, pd.DataFrame]) -> tuple[int, list[str]]:
    """How figure ``fig`` compares with the paper: the rows compared, and what each row that
    misses by more than the figure's own tolerance says (its ``note``), named by its keys
    (``sharegpt vllm: -22% vs paper (> 10%)``). A figure's compared tables are its
    ``COMPARED`` (default: its main table); a table's rows whose ``compared`` column is False (a
    run that tests a reading's cause) are not."""
    compared, found = 0, []
    for name in getattr(FIGURES[fig], "COMPARED", (fig,)):
        table = tables[name]
        if "compared" in table:
            table = table[table["compared"].astype(bool)]
        compared += len(table)
        if "note" not in table:
            continue
        for _, row in table[table["note"].map(lambda note: isinstance(note, str) and note != "")].iterrows():
            label = " ".join(form.format(f"{row[key]:g}" if isinstance(row[key], float) else row[key])
                             for key, form in ROW_KEYS.items() if key in table and pd.notna(row[key]))
            found.append(f"{label}: {row['note']}" if label else row["note"])
    return compared, found

