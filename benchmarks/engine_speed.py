"""Simulation speed: wall seconds and simulated requests per second.

1. Replay the Azure LLM inference 2023 conv trace (19,366 requests, ../shared/traces/) through
   ``--system vllm`` on OPT-13B / A100-80GB (target: under 1 s on one core).
2. Linear growth: synthetic ShareGPT traces of growing size up to 1,000,000 requests
   (target: under 60 s, peak memory under 2 GB with ``record_steps=False``).
3. The baselines measured in the same run: the same Azure replay step by step
   (``macro_steps=False``: no decode-only stretches taken at once) and with the decode lane
   disabled (every decode step through the managers' full vectorized path, which also rules
   out macro steps), so the printed ratio is what the lane and macro steps buy.
4. Macro steps where they pay off: a low-rate synthetic trace (long decode-only stretches
   between arrivals), with and without them.

Run: ``python benchmarks/engine_speed.py [--max-requests 1000000] [--skip-azure]``.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.config import SimConfig  # noqa: E402
from sim.run import run_simulation  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def timed(cfg, trace, *, no_lane: bool = False, macro_steps: bool = True):
    if no_lane:
        import sim.memory.paged as paged

        paged.PagedManager.decode_lane = False
    try:
        t0 = time.perf_counter()
        res = run_simulation(cfg, trace, macro_steps=macro_steps)
        wall = time.perf_counter() - t0
    finally:
        if no_lane:
            paged.PagedManager.decode_lane = True
    return wall, res.summary


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    ap.add_argument("--skip-azure", action="store_true")
    args = ap.parse_args()

    if not args.skip_azure and AZURE.exists():
        from traces import load_trace

        trace = load_trace(AZURE)
        cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", max_len_policy="error")
        from traces.transform import apply_max_len_policy

        trace, _ = apply_max_len_policy(trace, 2048, "drop")
        wall, s = timed(cfg, trace)
        step, _ = timed(cfg, trace, macro_steps=False)
        base, _ = timed(cfg, trace, no_lane=True)
        print(f"azure conv ({len(trace)} requests <= 2048 tokens) vllm opt-13b a100-80gb: "
              f"{wall:.2f} s wall ({wall / len(trace) * 1e6:.0f} us/request), engine {s['wall_time_s']:.2f} s, "
              f"{s['num_steps']} steps, {len(trace) / wall:,.0f} simulated req/s; "
              f"step by step (macro_steps=False) {step:.2f} s (x{step / wall:.2f}); "
              f"without the decode lane (and so without macro steps) {base:.2f} s (x{base / wall:.2f})")
        for system in ("orca-max", "orca-oracle", "token"):
            c = SimConfig.for_system(system, model="opt-13b", gpu="a100-80gb", max_len_policy="error")
            w, s2 = timed(c, trace)
            print(f"  same trace, --system {system}: {w:.2f} s wall, {s2['num_steps']} steps")
    elif not args.skip_azure:
        print(f"azure conv trace not found at {AZURE}: skipped")

    from traces.synth import make_workload

    sizes = [n for n in (10_000, 100_000, 1_000_000) if n <= args.max_requests]
    rows = []
    for n in sizes:
        trace = make_workload("sharegpt", rate=20.0, num_requests=n, seed=0)
        cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", record_steps=False)
        wall, s = timed(cfg, trace)
        rows.append((n, wall))
        print(f"sharegpt {n:>9,} requests at 20 req/s, vllm opt-13b a100-80gb: {wall:7.2f} s wall, "
              f"{n / wall:,.0f} req/s ({wall / n * 1e6:.0f} us/request), {s['num_steps']:,} steps, "
              f"peak RSS {peak_rss_mb():,.0f} MB")
    # decode-heavy stretches (few arrivals per iteration): where macro steps pay off
    trace = make_workload("sharegpt", rate=1.0, num_requests=2000, seed=0)
    cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", record_steps=False)
    on, s = timed(cfg, trace)
    off, _ = timed(cfg, trace, macro_steps=False)
    print(f"sharegpt     2,000 requests at 1 req/s, vllm opt-13b a100-80gb: {on:7.2f} s wall, "
          f"{s['num_steps']:,} steps; step by step (macro_steps=False) {off:.2f} s (x{off / on:.2f})")
    if len(rows) > 1:
        n0, w0 = rows[0]
        for n, w in rows[1:]:
            print(f"growth {n0:,} -> {n:,} requests: x{n / n0:.0f} requests, x{w / w0:.1f} time "
                  f"(1M at this rate: {w / n * 1e6:.0f} s; target < 60 s)")


if __name__ == "__main__":
    main()
