"""Cluster speed (issue #19, item 4): wall time and peak memory of ``--replicas K`` runs on one
core, each beside a baseline taken in the same run: the single-replica run of the same trace.

1. The Mooncake conversation trace (../shared/traces/, 512-token block hashes) on Llama-3.1-8B /
   A100-80GB, ``--system vllm --prefix-caching``, over 8 replicas with each router, and one
   engine alone: wall seconds (the whole call and the loop's own), hit rate, throughput, p99
   TTFT, how evenly the router spread the requests.
2. A synthetic day: ShareGPT lengths at 50 req/s for 86,400 s (4.3 million requests) on OPT-13B
   / A100-80GB, ``--no-steps``, over 32 replicas (``--router``, least-outstanding-requests by
   default), and the same trace on one replica, each in a fresh process so that its peak RSS
   is its own. ``--hours`` shortens the day.

The process pins itself to one CPU first (Linux), so "one core" is literal.
Run: ``python benchmarks/cluster_speed.py [--hours 24] [--router NAME] [--skip-mooncake] [--skip-day]
[--skip-day-baseline]``. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

from pagesim.sim.config import SimConfig  # noqa: E402

MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
ROUTERS = ("round-robin", "least-outstanding-requests", "least-kv-usage", "prefix-affinity")


def mooncake(replicas: int = 8) -> None:
    """Section 1: the Mooncake conversation trace over ``replicas`` replicas, each router."""
    from pagesim.sim.cluster import run_cluster
    from pagesim.sim.run import run_simulation
    from pagesim.traces.loaders import load_trace

    if not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}: skipped")
        return
    trace = load_trace(MOONCAKE)
    cfg = SimConfig.for_system("vllm", model="llama-3.1-8b", gpu="a100-80gb", prefix_caching=True,
                               max_len_policy="drop")
    run_simulation(cfg, trace.iloc[:20])  # numba's cache loaded
    run_cluster(cfg, trace.iloc[:20], 2, "prefix-affinity")
    t0 = time.perf_counter()
    s = run_simulation(cfg, trace).summary
    wall = time.perf_counter() - t0
    print(f"mooncake conversation ({len(trace):,} requests), vllm --prefix-caching, {cfg.model} {cfg.gpu}")
    print(f"  1 replica (baseline): {wall:.2f} s wall (loop {s['wall_time_s']:.2f} s), {s['num_steps']:,} steps, "
          f"hit rate {s['prefix_cache_hit_rate']:.3f}, {s['request_throughput']:.2f} req/s, "
          f"p99 TTFT {s['p99_ttft_ms']:.0f} ms")
    for router in ROUTERS:
        t0 = time.perf_counter()
        s = run_cluster(cfg, trace, replicas, router).summary
        wall = time.perf_counter() - t0
        print(f"  {replicas} replicas, {router:<27}: {wall:.2f} s wall (loop {s['wall_time_s']:.2f} s), "
              f"{s['num_steps']:,} steps, hit rate {s['prefix_cache_hit_rate']:.3f}, "
              f"{s['request_throughput']:.2f} req/s, p99 TTFT {s['p99_ttft_ms']:.0f} ms, "
              f"routed max/mean {s['routed_max_over_mean']:.2f}")


DAY_RUN = """
import sys, time, resource
from pagesim.sim.config import SimConfig
from pagesim.sim.run import run_simulation
from pagesim.sim.cluster import run_cluster
from pagesim.traces.synth import make_workload
hours, replicas, router = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
t0 = time.perf_counter()
trace = make_workload("sharegpt", rate=50.0, duration_s=hours * 3600.0, seed=0)
made = time.perf_counter() - t0
cfg = SimConfig.for_system("vllm", model="opt-13b", gpu="a100-80gb", record_steps=False)
if replicas == 1:
    run_simulation(cfg, trace.iloc[:20])  # numba's cache loaded
    t0 = time.perf_counter()
    s = run_simulation(cfg, trace).summary
else:
    run_cluster(cfg, trace.iloc[:20], 2, router)
    t0 = time.perf_counter()
    s = run_cluster(cfg, trace, replicas, router).summary
wall = time.perf_counter() - t0
print(len(trace), made, wall, s["wall_time_s"], s["num_steps"], s["completed"], s["request_throughput"],
      s["p99_ttft_ms"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def day(hours: float, replicas: int, router: str, baseline: bool) -> None:
    """Section 2: a synthetic day at 50 req/s over ``replicas`` replicas and on one, each in a
    fresh process."""
    for k in ((replicas, 1) if baseline else (replicas,)):
        out = subprocess.run([sys.executable, "-c", DAY_RUN, str(hours), str(k), router], check=True,
                             capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=import_path())).stdout
        n, made, wall, loop, steps, done, rps, ttft, rss = out.split()
        label = f"{k} replicas, {router}" if k > 1 else "1 replica (baseline)"
        print(f"sharegpt at 50 req/s for {hours:g} h ({int(n):,} requests; made in {float(made):.1f} s), vllm opt-13b "
              f"a100-80gb, --no-steps, {label}: {float(wall):.1f} s wall (loop {float(loop):.1f} s), "
              f"{int(steps):,} steps, {int(done):,} completed, {float(rps):.2f} req/s, p99 TTFT {float(ttft):.0f} ms, "
              f"peak RSS {float(rss):,.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, default=24.0, help="length of the synthetic day (default 24)")
    ap.add_argument("--replicas", type=int, default=32, help="replicas of the synthetic day (default 32)")
    ap.add_argument("--router", default="least-outstanding-requests", help="router of the synthetic day")
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument("--skip-day", action="store_true")
    ap.add_argument("--skip-day-baseline", action="store_true", help="no single-replica run of the day")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    if not args.skip_mooncake:
        mooncake()
    if not args.skip_day:
        day(args.hours, args.replicas, args.router, not args.skip_day_baseline)


if __name__ == "__main__":
    main()
