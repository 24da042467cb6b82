"""Ten million requests through the command line (issue 85): CPU seconds and peak memory of
``pagesim simulate --workload sharegpt --rate 20 --num-requests N --no-steps`` for vllm and
vllm-v1 (OPT-13B on the A100-80GB, the growth figures' setting), each a fresh process measured by
``wait4`` (its user + system CPU, its peak RSS), beside a reference measured in the same run: numpy
sorting 10^7 float64 in a fresh process (the machine's speed that day) and a bare
``import numpy, pandas`` (the start every command pays).

Targets: < 60 s of CPU and < 2 GB peak at 10M, each system. With ``--write``, each system
again with ``--out`` (requests.csv written: 10M rows, about 1.6 GB). With ``--baseline-path
DIR`` (DIR holds a link ``pagesim`` to another checkout, e.g. the code before a change), each
run is made by that checkout too, right before this one's. Prints; asserts nothing.

    python benchmarks/ten_million.py [--requests 10000000] [--systems vllm vllm-v1] [--write]
                                     [--baseline-path DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _import_path import child_env
from _measure import measured as run_measured

REFERENCE = "import numpy as np; np.sort(np.random.default_rng(0).random(10**7))"


def measured(argv: list[str], path: str | None = None) -> tuple[float, float]:
    """The CPU seconds (user + system) and the peak RSS in GB of ``argv``, a fresh process
    importing the pagesim of import folder ``path`` (this checkout's by default)."""
    run = run_measured(argv, env=child_env(path))
    return run.cpu_s, run.peak_gb


def simulate(system: str, requests: int, out: str | None = None) -> list[str]:
    return [sys.executable, "-m", "pagesim.sim.cli", "simulate", "--workload", "sharegpt", "--rate", "20",
            "--num-requests", str(requests), "--system", system, "--model", "opt-13b", "--gpu", "a100-80gb",
            "--no-steps", "--no-progress", *(["--out", out] if out else [])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--systems", nargs="+", default=["vllm", "vllm-v1"])
    ap.add_argument("--write", action="store_true", help="each system again, writing its files (--out)")
    ap.add_argument("--baseline-path", default=None, metavar="DIR",
                    help="a folder holding a link pagesim to another checkout, run before this one each time")
    args = ap.parse_args()
    reference, _ = measured([sys.executable, "-c", REFERENCE])
    bare, bare_gb = measured([sys.executable, "-c", "import numpy, pandas"])
    print(f"reference: numpy sorts 10^7 float64 in {reference:.2f} s of CPU (a fresh process); "
          f"a bare `import numpy, pandas` {bare:.2f} s, {bare_gb:.2f} GB")
    checkouts = ([("baseline", str(Path(args.baseline_path).resolve()))] if args.baseline_path else []) + [("this", None)]
    for system in args.systems:
        for _name, path in checkouts:
            measured(simulate(system, 1000), path)  # a compile, where one is due, outside the figures
        with tempfile.TemporaryDirectory() as folder:
            for out in [None, folder] if args.write else [None]:
                for name, path in checkouts:
                    cpu, gb = measured(simulate(system, args.requests, out), path)
                    written = "--out (requests.csv)" if out else "no files"
                    print(f"{name:<8} {system:<8} {args.requests:>11,} requests, --no-steps, {written}: {cpu:6.1f} s "
                          f"of CPU ({cpu / reference:.0f} x reference), peak {gb:.2f} GB, "
                          f"{gb * 1e9 / args.requests:.0f} bytes a request (peak / requests) "
                          "(targets at 10M: < 60 s, < 2 GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
