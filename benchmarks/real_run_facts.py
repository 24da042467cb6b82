"""Write the fact table of real serving runs that ``benchmarks/real_run_accuracy.py`` replays.

Reads run folders (inference-perf or LLMServingSim, ``traces.real_runs``) and writes their engine settings,
workload and measured figures as rows ``run, section, key, value`` with a header naming where they
came from. Only figures are taken (facts), none of the runs' files.

    git clone https://github.com/inference-sim/training && \\
    python benchmarks/real_run_facts.py training/default_args/* \\
        --source "inference-sim/training@ed5c1d2 default_args/ (16 vLLM runs, H100 SXM)" \\
        --gpu h100-80gb --out experiments/data/real_runs_h100.csv

LLMServingSim's four vLLM runs (their files name the GPU), with each request's arrival and
lengths beside them in ``llmservingsim_runs_requests.csv`` (``--requests``: the per-request table
``traces.real_runs.read_real_runs`` attaches, so that the runs replay from the shipped tables):

    git clone https://github.com/casys-kaist/LLMServingSim && \\
    python benchmarks/real_run_facts.py LLMServingSim/bench/examples/*/*/vllm \\
        --source "casys-kaist/LLMServingSim@5daddb2 bench/examples/<GPU>/<run>/vllm/ (MIT license; ...)" \\
        --out experiments/data/llmservingsim_runs.csv --requests
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from _import_path import import_path

import_path()

from pagesim.traces.real_runs import read_real_run, request_facts, requests_table_of  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (inference-perf, LLMServingSim)")
    p.add_argument("--source", required=True, help="where the runs came from (repository, commit, folder)")
    p.add_argument("--gpu", help="the GPU preset the runs were served on, where their files do not say")
    p.add_argument("--out", required=True)
    p.add_argument("--requests", action="store_true",
                   help="also write each run's requests beside the table (<out>_requests.csv)")
    args = p.parse_args(argv)
    rows, runs = [], []
    for folder in sorted(args.runs):
        run = read_real_run(folder)
        if args.gpu:
            run.info["gpu"] = args.gpu
        run.info["source"] = args.source
        rows += run.facts()
        runs.append(run)
    out = Path(args.out)
    with out.open("w", newline="") as f:
        f.write(f"# real serving runs' figures, taken from {args.source} by benchmarks/real_run_facts.py\n")
        w = csv.writer(f)
        w.writerow(["run", "section", "key", "value"])
        w.writerows(rows)
    print(f"wrote {out}: {len(args.runs)} runs, {len(rows)} facts")
    if args.requests:
        table = request_facts(runs)
        with requests_table_of(out).open("w", newline="") as f:
            f.write(f"# real serving runs' requests, taken from {args.source} by benchmarks/real_run_facts.py\n")
            table.to_csv(f, index=False)
        print(f"wrote {requests_table_of(out)}: {len(table)} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
