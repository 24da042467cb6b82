"""Engine speed of speculative decoding (issue #37, "Speed": within 2x of plain ``vllm-v1``).

The Azure LLM inference 2023 conv trace (../shared/traces/, requests over 2048 tokens dropped) on
OPT-13B / A100-80GB: ``--system vllm-v1`` as it is, and with ``--num-speculative-tokens 3`` by
n-gram (no drafter priced) and by EAGLE (lookahead slots, a drafter priced per step), each at
``--spec-acceptance-rate 0.7``; engine seconds (``summary['wall_time_s']``), the best of 3,
interleaved, in this process (pinned to one CPU on Linux), and each speculative run's engine time
over the plain one's. Prints figures; asserts nothing.
Run: ``python benchmarks/speculative_speed.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

from pagesim.sim.config import SimConfig  # noqa: E402
from pagesim.sim.run import run_simulation  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
VARIANTS = {"plain": {}, "ngram K=3": dict(num_speculative_tokens=3),
            "eagle K=3": dict(num_speculative_tokens=3, speculative_method="eagle")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from pagesim.traces.loaders import load_trace
    from pagesim.traces.transform import apply_max_len_policy

    trace = apply_max_len_policy(load_trace(AZURE), 2048, "drop")[0]
    configs = {name: SimConfig.for_system("vllm-v1", model="opt-13b", gpu="a100-80gb", max_len_policy="error",
                                          **settings) for name, settings in VARIANTS.items()}
    for cfg in configs.values():
        run_simulation(cfg, trace.iloc[:20])  # numba's cache loaded (or the family compiled)
    best: dict[str, dict] = {}
    for _ in range(args.repeats):
        for name, cfg in configs.items():
            s = run_simulation(cfg, trace).summary
            if name not in best or s["wall_time_s"] < best[name]["wall_time_s"]:
                best[name] = s
    plain = best["plain"]["wall_time_s"]
    print(f"azure conv ({len(trace)} requests <= 2048 tokens), vllm-v1, opt-13b a100-80gb, engine seconds, "
          f"best of {args.repeats}:")
    for name, s in best.items():
        spec = (f", {s['spec_tokens_per_step']:.2f} tokens per verification"
                if "spec_tokens_per_step" in s else "")
        print(f"  {name:10s} {s['wall_time_s']:.3f} s  x{s['wall_time_s'] / plain:.2f} of plain  "
              f"{s['num_steps']} steps, {s['num_preemptions']} preemptions{spec}")


if __name__ == "__main__":
    main()
