"""The Mooncake conversation trace through both designs (issue #38 item 6, docs/guide/clusters.md).

Eight A100-80GB GPUs serving Llama-3.1-8B with ``vllm-v1`` (prefix caching on, its default):
eight aggregated replicas behind round-robin, and disaggregated splits of the same eight GPUs
(``P:D`` prefill:decode replicas, KV over InfiniBand NDR, round-robin in each pool), every run
over the same requests (``--max-len-policy drop``, as ``benchmarks/mooncake_caching.py`` runs
the trace). Per design: request and output throughput, TTFT mean and p99, TPOT mean and p99,
prefix hit rate (prompt tokens found cached / prompt tokens looked up; on the prefill pool for
a disaggregated run) and the KV bytes transferred.

``--num-requests N`` keeps the trace's first N requests (its arrival times as they are), for a
machine where the whole trace takes too long. Prints the table and writes it to
``benchmarks/results/mooncake_disagg_<date>.txt``. Asserts nothing.
Run: ``python benchmarks/mooncake_disagg.py [--num-requests 3000] [--splits 2:6,4:4,6:2]``.
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

from pagesim.sim.cluster import run_cluster  # noqa: E402
from pagesim.sim.config import SimConfig  # noqa: E402
from pagesim.sim.disagg import run_disaggregated  # noqa: E402
from pagesim.sim.metrics import prefix_cache_hit_rate  # noqa: E402
from pagesim.traces.loaders import load_trace  # noqa: E402

MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
MODEL, GPU, LINK = "llama-3.1-8b", "a100-80gb", "ib-ndr"


def hit_rate(result) -> float:
    """Prompt tokens found cached / looked up, over the replicas that looked them up (the
    prefill pool of a disaggregated run, every replica of an aggregated one)."""
    rows = [s for s in result.replica_summaries if s.get("pool", "prefill") == "prefill"]
    hits = sum(s["mgr_prefix_hit_tokens"] for s in rows)
    return prefix_cache_hit_rate(hits, sum(s["mgr_prefix_lookup_tokens"] for s in rows))


def row(name: str, s: dict, hits: float, wall: float) -> str:
    moved = s.get("transfer_bytes_total", 0.0) / 1e9
    return (f"| {name} | {s['request_throughput']:.2f} | {s['output_throughput']:,.0f} | "
            f"{s['mean_ttft_ms'] / 1e3:.2f} | {s['p99_ttft_ms'] / 1e3:.2f} | "
            f"{s['mean_tpot_ms']:.1f} | "
            f"{s['p99_tpot_ms']:.1f} | {hits:.3f} | {moved:,.1f} | {wall:.0f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--splits", default="2:6,4:4,6:2",
                    help="P:D prefill:decode replicas, comma-separated")
    ap.add_argument("--num-requests", type=int, default=None, help="the trace's first N requests")
    args = ap.parse_args(argv)
    if not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}: skipped")
        return 0
    trace = load_trace(MOONCAKE)
    whole = len(trace)
    if args.num_requests:
        trace = trace.sort_values("arrival_s").head(args.num_requests).reset_index(drop=True)
    offered = (len(trace) - 1) / (trace["arrival_s"].max() - trace["arrival_s"].min())
    cut = (f"its first {len(trace):,} of {whole:,} requests" if len(trace) < whole
           else f"{whole:,} requests")
    cfg = SimConfig.for_system("vllm-v1", model=MODEL, gpu=GPU, max_len_policy="drop")
    lines = [f"Mooncake conversation trace, {cut}, offered at {offered:.2f} req/s; {MODEL} on "
             f"{args.gpus} x {GPU}, vllm-v1; {_dt.date.today()}", "",
             "| design | req/s | output tok/s | mean TTFT s | p99 TTFT s | mean TPOT ms "
             "| p99 TPOT ms | prefix hit rate | transfer GB | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    t0 = time.perf_counter()
    res = run_cluster(cfg, trace, args.gpus, "round-robin")
    wall = time.perf_counter() - t0
    lines.append(row(f"{args.gpus} aggregated", res.summary, hit_rate(res), wall))
    print(lines[-1], flush=True)
    for split in args.splits.split(","):
        p, d = (int(x) for x in split.split(":"))
        t0 = time.perf_counter()
        res = run_disaggregated(cfg, cfg, trace, p, d, "round-robin", LINK)
        wall = time.perf_counter() - t0
        lines.append(row(f"{p}:{d} disaggregated", res.summary, hit_rate(res), wall))
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "benchmarks" / "results" / f"mooncake_disagg_{_dt.date.today()}.txt"
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
