"""Prefix caching and routing on the Mooncake conversation trace (issue #19's tables, docs/guide/clusters.md).

1. One engine, each caching system with its own defaults: ``sglang`` (RadixAttention, fcfs, its
   default, and ``--schedule-policy lpm``), ``vllm --prefix-caching`` (vLLM v0's block-hash
   cache) and ``vllm-v1`` (v1's, on by default); at two loads: the trace as it is (3.4 req/s
   offered: one engine is overloaded, its queue grows all trace long and throughput is its
   capacity) and its arrival times stretched x8 (0.42 req/s, one replica's share of eight: the
   engine keeps up, so the hit rate is the cache's under a working load).
2. Eight replicas of ``vllm --prefix-caching`` behind each router at the trace's rate, each
   beside the rate/k estimate: one replica given the same trace at 1/k of its rate (every
   arrival time x k: each request, each conversation, as if a perfect router split the load
   without breaking any conversation apart), its throughput x k. That is what ``plan
   resources`` assumes without ``--router`` (one replica at rate / k); the routed cluster says
   how far off it is.

Hit rate: prompt tokens found cached / prompt tokens looked up, every admission counted.
Llama-3.1-8B on A100-80GB. Prints the tables and writes them to
``benchmarks/results/mooncake_caching_<date>.txt``. Asserts nothing.
Run: ``python benchmarks/mooncake_caching.py [--replicas 8]``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

from pagesim.sim.cluster import ROUTERS, run_cluster  # noqa: E402
from pagesim.sim.config import SimConfig  # noqa: E402
from pagesim.sim.run import run_simulation  # noqa: E402
from pagesim.traces.loaders import load_trace  # noqa: E402

MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
MODEL, GPU = "llama-3.1-8b", "a100-80gb"
SYSTEMS = (("sglang (fcfs)", "sglang", {}), ("sglang --schedule-policy lpm", "sglang", {"schedule_policy": "lpm"}),
           ("vllm --prefix-caching (v0)", "vllm", {"prefix_caching": True}), ("vllm-v1", "vllm-v1", {}))
LOADS = (("as is", 1), ("arrivals x8", 8))  # x8: the load of one replica of eight, which one engine keeps up with


def row(name: str, s: dict, wall: float, scale: int = 1) -> str:
    return (f"| {name} | {s['prefix_cache_hit_rate']:.3f} | {s['request_throughput'] * scale:.2f} | "
            f"{s['output_throughput'] * scale:,.0f} | {s['median_ttft_ms'] / 1000:.1f} | {s['p99_ttft_ms'] / 1000:.1f} | "
            f"{wall:.1f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=8)
    args = ap.parse_args(argv)
    if not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}: skipped")
        return 0
    trace = load_trace(MOONCAKE)
    k = args.replicas
    offered = (len(trace) - 1) / (trace["arrival_s"].max() - trace["arrival_s"].min())
    head = ("| run | prefix hit rate | req/s | output tok/s | median TTFT s | p99 TTFT s | wall s |\n"
            "|---|---|---|---|---|---|---|")
    lines = [f"Mooncake conversation trace: {len(trace):,} requests offered at {offered:.2f} req/s; "
             f"{MODEL} on {GPU}; {_dt.date.today()}", "", "One engine, each system's defaults:", head]
    for load, stretch in LOADS:
        for name, system, kw in SYSTEMS:
            cfg = SimConfig.for_system(system, model=MODEL, gpu=GPU, max_len_policy="drop", **kw)
            t0 = time.perf_counter()
            s = run_simulation(cfg, trace.assign(arrival_s=trace["arrival_s"] * stretch)).summary
            lines.append(row(f"{load}, {name}", s, time.perf_counter() - t0))
            print(lines[-1], flush=True)
    cfg = SimConfig.for_system("vllm", model=MODEL, gpu=GPU, max_len_policy="drop", prefix_caching=True)
    lines += ["", f"{k} replicas of vllm --prefix-caching at the trace's rate, each router, and the rate/k "
              f"estimate (one replica at 1/{k} of the rate, throughput x {k}):", head]
    for router in ROUTERS:
        t0 = time.perf_counter()
        s = run_cluster(cfg, trace, k, router).summary
        lines.append(row(f"{k} replicas, {router}", s, time.perf_counter() - t0))
        print(lines[-1], flush=True)
    slow = trace.assign(arrival_s=trace["arrival_s"] * k)
    t0 = time.perf_counter()
    s = run_simulation(cfg, slow).summary
    lines.append(row(f"rate/k estimate: 1 replica at rate / {k}, x {k}", s, time.perf_counter() - t0, scale=k))
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "benchmarks" / "results" / f"mooncake_caching_{_dt.date.today()}.txt"
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
