"""The whole ``pagesim simulate`` process on the Azure conv trace (vllm, OPT-13B, A100-80GB,
``--out``: load, run, write), in CPU seconds (user + system of the process and its threads,
``wait4``), beside a bare ``python -c "import numpy, pandas"`` measured alternately in the same
run (issue 85's target: <= 1.5x it), and the same command with two OpenBLAS threads
(``OPENBLAS_NUM_THREADS=2``: what the command ran with on 2 cores before ``sim/cli.py`` chose one
thread, its spinning after each BLAS call counted in the process's CPU). Medians of
``--repeat`` rounds. Prints; asserts nothing.

    python benchmarks/whole_process_cpu.py [--repeat 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from _import_path import child_env
from _measure import measured

TRACE = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def cpu_of(argv: list[str], env: dict) -> float:
    return measured(argv, env=env).cpu_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=8)
    args = ap.parse_args()
    if not TRACE.exists():
        print(f"the Azure conv trace is not at {TRACE}: nothing to measure")
        return 0
    env = {k: v for k, v in child_env().items() if k != "OPENBLAS_NUM_THREADS"}
    with tempfile.TemporaryDirectory() as out:
        simulate = [sys.executable, "-m", "pagesim.sim.cli", "simulate", "--trace", str(TRACE), "--system", "vllm",
                    "--model", "opt-13b", "--gpu", "a100-80gb", "--max-len-policy", "drop", "--no-progress",
                    "--out", out]
        cpu_of(simulate, env)  # a compile or a module's build, where one is due, outside the figures
        runs = {"bare": [], "pagesim": [], "two BLAS threads": []}
        for _ in range(args.repeat):
            runs["bare"].append(cpu_of([sys.executable, "-c", "import numpy, pandas"], env))
            runs["pagesim"].append(cpu_of(simulate, env))
            runs["two BLAS threads"].append(cpu_of(simulate, {**env, "OPENBLAS_NUM_THREADS": "2"}))
    bare, ours, two = (statistics.median(runs[k]) for k in ("bare", "pagesim", "two BLAS threads"))
    print(f"bare `import numpy, pandas`: {bare:.3f} s of CPU (median of {args.repeat})")
    print(f"pagesim simulate, Azure conv, vllm, --out: {ours:.3f} s of CPU: x{ours / bare:.2f} the bare import "
          f"(target x1.5)")
    print(f"the same with OPENBLAS_NUM_THREADS=2: {two:.3f} s of CPU: x{two / bare:.2f} ({two / ours:.2f} x one thread's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
