"""`pagesim reproduce`: rerun the vLLM paper's figures and compare with its numbers.

Writes DIR/<fig>.csv (plus fig2_sensitivity.csv, fig2_timeline.csv, fig12_ratios.csv) and
DIR/report.html. One figure prints its tables and its reading; `all` prints one line per
figure (matches the paper or differs, and where), the details being in the report and the
CSVs. Runs are cached on disk (see --cache-dir), so an interrupted reproduction resumes where
it stopped and figures sharing runs compute them once.
"""

from __future__ import annotations

import math
from pathlib import Path

from pagesim.experiments.figure_names import FIGURE_NAMES
from pagesim.sim.cli import HelpFormatter, example
from pagesim.sim.config import SimConfig, default_cost_model
from pagesim.sim.cost.calibration import band_line, error_band, load_calibration
from pagesim.sim.errors import ConfigError, EmptyWorkload
from pagesim.sim.specs import get_gpu
from pagesim.sim.terminal import WIDTH, fill


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="Reproduce the vLLM paper's figures", formatter_class=HelpFormatter,
                       description=__doc__,
                       epilog=example("pagesim reproduce fig2 --out out/fig2",
                                      "pagesim reproduce all --out out/paper --workers 8",
                                      "pagesim reproduce fig12 --out out/fig12 --executor ray --address auto",
                                      "pagesim reproduce all --out out/smoke --quick"))
    p.add_argument("figure", choices=[*FIGURE_NAMES, "all"], metavar="FIGURE",
                   help=f"which figure: {', '.join(FIGURE_NAMES)}, or all")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local processes, or Ray (pip install 'pagesim[dist]')")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="parallel runs (default: CPU count)")
    p.add_argument("--quick", action="store_true", help="tiny grids and traces (a smoke test, not the paper)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every trace's duration (or request count)")
    p.add_argument("--no-cache", action="store_true", help="recompute every run (and refresh the cache)")
    p.add_argument("--cache-dir", default=None, metavar="D",
                   help="run cache (default: $PAGESIM_CACHE_DIR or ~/.cache/pagesim/runs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--cost-model", choices=("roofline", "calibrated"), default=None,
                   help="cost model of every run (default: the roofline); calibrated needs the figures' GPU "
                        "among the calibrated ones (sim/data/calibration)")
    p.set_defaults(func=run)


def run(args) -> int:
    # here, not at the top: the figures and their sweeps (pandas) and the report (plotly), which
    # `pagesim --help` and `pagesim reproduce --help` need not load
    from pagesim.experiments.figures import FIGURES, SweepOptions, reproduce
    from pagesim.experiments.report_pages import reproduce_report
    from pagesim.experiments.run_cache import telling_cache_answers
    from pagesim.experiments.run_spec import load_experiment
    from pagesim.experiments import engine_era

    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {args.workers}")
    if not (math.isfinite(args.scale) and args.scale > 0):
        raise ConfigError(f"--scale must be a finite number > 0, got {args.scale}")

    base = {"cost_model": args.cost_model} if args.cost_model else {}
    gpus = sorted({get_gpu(load_experiment(f).get("base", {}).get("gpu") or SimConfig.gpu).name
                   for f in (list(FIGURES) if args.figure == "all" else [args.figure])})
    cost_model = args.cost_model or default_cost_model("vllm")  # the paper's engines (vLLM v0, Orca, static)
    if cost_model == "calibrated":
        for g in gpus:
            load_calibration(g)  # no constants for the figures' GPU: one line and exit 2, before any run
    opts = SweepOptions(executor=args.executor, workers=args.workers, cache_dir=args.cache_dir,
                        use_cache=not args.no_cache, progress=not args.no_progress, address=args.address, base=base)
    out = Path(args.out)
    with telling_cache_answers(recompute=args.no_cache):
        try:
            tables = reproduce(args.figure, out, opts, quick=args.quick, scale=args.scale)
        except EmptyWorkload as e:  # the figures' rates and durations are theirs: --scale set them
            raise ConfigError(f"--scale {args.scale:g} leaves a trace with no requests ({e.what}); "
                              "raise --scale") from None
    figures = list(FIGURES) if args.figure == "all" else [args.figure]
    if args.figure != "all":
        print_tables(tables)
    print()
    print("\n".join(closing_table(tables, figures)))
    for g in gpus:
        print("\n" + band_line(error_band(cost_model, g), g))
    # (a figure's runs come from its EXPERIMENTS' configs and its own: fig14 names none, sweeping its own)
    era = [f for f in figures if any(load_experiment(e).get("base", {}).get("cost_scale") == engine_era.ENGINE_ERA
                                     for e in {f, *FIGURES[f].EXPERIMENTS})]
    if era:
        print("\n" + fill(f"{', '.join(era)}: every step's GPU time x{engine_era.gpu_time_scale(cost_model):g}, the "
                          "2023 engines' speed, fitted on the DistServe artifact's measured vLLM 0.1.7 "
                          "(experiments/engine_era.py), no number of the vLLM paper read to fit it (a figure's "
                          "test of a reading's cause at x1 aside)"))
    path = reproduce_report(out, out / "report.html")
    print(f"\nwrote {path}")
    if args.figure == "all":
        print("  every figure's tables, charts and reading; the rows in <figure>.csv beside it")
    return 0


def print_tables(tables: dict) -> None:
    """A figure's tables, each wrapped into blocks of columns within :data:`WIDTH` (long text
    cells cut; the CSV has them whole), and its reading wrapped."""
    import pandas as pd  # here: the command's --help need not load it

    from pagesim.experiments.figures import EXPLAIN

    with pd.option_context("display.max_rows", 200, "display.float_format", "{:.4g}".format):
        for name, table in tables.items():
            if name.endswith("_timeline"):
                continue
            print(f"\n== {name} ({name}.csv, beside the report)")
            print(table.to_string(index=False, line_width=WIDTH, max_colwidth=40, na_rep="-"))  # (no value: "-")
            fig = name.split("_")[0]
            if fig == name and fig in EXPLAIN:
                # a second table it reads
                companion = {"fig12": "fig12_ratios", "fig19": "fig19_micro", "hybrid": "hybrid_memory"}.get(fig)
                text = EXPLAIN[fig](table, tables.get(companion)) if companion else EXPLAIN[fig](table)
                print()
                print(fill(text, first="reading: "))


def closing_table(tables: dict, figures: list[str]) -> list[str]:
    """One line per figure: what it shows, whether it matches the paper within its tolerance
    (``figures.misses``; ``none``: a figure no paper has, comparing no row) and how many compared
    rows miss; its first miss under it, wrapped within :data:`WIDTH` and never cut."""
    from pagesim.experiments.figures import TITLES, misses

    rows = [("figure", "shows", "paper", "misses")]
    first_misses = [""]
    for fig in figures:
        compared, found = misses(fig, tables)
        verdict = "differs" if found else ("matches" if compared else "none")
        rows.append((fig, TITLES[fig], verdict, f"{len(found)} of {compared}"))
        first_misses.append(found[0] if found else "")
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for row, miss in zip(rows, first_misses):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if miss:
            lines.extend(fill(miss, first="    first miss: ", rest="      ").splitlines())
    lines.append("(every miss: the report)")
    return lines
