"""Replay every real serving run it is given and print the simulator's error against each.

Runs come from fact tables (default: ``experiments/data/real_runs_h100.csv``, 16 vLLM runs on
H100 from the public inference-sim/training repository) or from run folders / vllm bench JSON
files (``--runs``). Each run replays with each cost model named (``--cost-models``) on the
``vllm-v1`` system with prefix caching, as ``pagesim validate --against`` replays it; errors are
sim / real - 1 of the client's means over the whole run (``overall``) and per stage.

Prints, per cost model: a row per run (E2E, TTFT, ITL and requests/s errors of the whole run),
then the median |error| over runs and over stages; ``--csv`` writes every figure. The time it
takes to validate one run (``pagesim validate --against`` as a whole process) is measured with
a bare ``import numpy, pandas`` as the baseline in the same run (``--time``).

    python benchmarks/real_run_accuracy.py
    python benchmarks/real_run_accuracy.py --cost-models roofline calibrated --csv out/real.csv
    python benchmarks/real_run_accuracy.py --cost-models serving --time 231439-llama-2-7b-tp1-general
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from _import_path import ROOT, child_env, import_path

import_path()

from pagesim.experiments.real_validate import replay_config, runs_table_lines, validate_run  # noqa: E402
from pagesim.sim.errors import PagesimError  # noqa: E402
from pagesim.traces.real_runs import read_real_runs  # noqa: E402

DEFAULT_FACTS = ROOT / "experiments" / "data" / "real_runs_h100.csv"


def load_runs(facts: list[str], paths: list[str]):
    return [run for path in [*facts, *paths] for run in read_real_runs(path)]


def model_of(run) -> str:
    return str(run.engine.get("model", "?")).rsplit("/", 1)[-1]


def replay_all(runs, cost_models: list[str], gpu: str | None, settings: dict | None = None) -> pd.DataFrame:
    rows = []
    for cost_model in cost_models:
        for run in runs:
            try:
                cfg = replay_config(run, gpu, {**(settings or {}), "cost_model": cost_model})
                v = validate_run(run, cfg)
            except PagesimError as e:  # a model the cost model refuses: said, not hidden
                print(f"  {cost_model} {run.name}: {e}")
                continue
            err = v.errors()
            err["cost_model"], err["run"], err["model"] = cost_model, run.name, model_of(run)
            err["unfinished"] = v.unfinished
            rows.append(err)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def print_tables(df: pd.DataFrame) -> None:
    for cost_model, d in df.groupby("cost_model", sort=False):
        print(f"\n== {cost_model}: sim / real - 1, the whole run's means ==")
        print("\n".join(runs_table_lines(d)))


def time_validate(against: list[str], repeats: int) -> None:
    """One ``pagesim validate --against ...`` as a whole process, against ``import numpy, pandas``."""
    env = child_env()
    cmd = [sys.executable, "-m", "pagesim.sim.cli", "validate", "--against", *against, "--no-progress"]
    base = [sys.executable, "-c", "import numpy, pandas"]
    times = {"validate --against": [], "import numpy, pandas": []}
    for _ in range(repeats):
        for name, c in (("validate --against", cmd), ("import numpy, pandas", base)):
            t = time.perf_counter()
            subprocess.run(c, env=env, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t)
    v, b = min(times["validate --against"]), min(times["import numpy, pandas"])
    print(f"\nvalidate --against one run: {v:.2f} s (best of {repeats}); import numpy, pandas {b:.2f} s "
          f"in the same run: x{v / b:.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--facts", nargs="*", default=[str(DEFAULT_FACTS)], help="fact tables of real runs")
    p.add_argument("--runs", nargs="*", default=[], help="run folders or vllm bench JSON files")
    p.add_argument("--gpu", default=None, help="the GPU of --runs (a fact table names its own)")
    p.add_argument("--cost-models", nargs="+", default=["serving", "roofline", "calibrated"])
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="replay with vllm-v1's async scheduling off (what it changes: docs/accuracy.md)")
    p.add_argument("--csv", help="write every figure here")
    p.add_argument("--time", metavar="RUN", help="also time pagesim validate --against on one run as a whole process: "
                                                "a run folder or JSON, or the name of a run of the first fact table")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    runs = load_runs(args.facts, args.runs)
    print(f"{len(runs)} real runs: {', '.join(sorted({model_of(r) for r in runs}))}")
    started = time.perf_counter()
    df = replay_all(runs, args.cost_models, args.gpu,
                    {"async_scheduling": False} if args.no_async_scheduling else None)
    print_tables(df)
    print(f"\nreplayed {len(runs)} runs x {len(args.cost_models)} cost models in "
          f"{time.perf_counter() - started:.1f} s")
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.csv, index=False)
    if args.time:
        against = [args.time] if Path(args.time).exists() else [args.facts[0], "--run", args.time]
        time_validate(against, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
