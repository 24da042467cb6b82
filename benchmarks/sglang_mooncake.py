"""Issue #19, item 2: SGLang's radix cache against vLLM's block-hash caches on the Mooncake
conversation trace (../shared/traces/, 512-token block hashes): prefix hit rate and throughput
of ``--system sglang`` (RadixAttention; ``--schedule-policy`` fcfs, its default, and lpm),
``--system vllm --prefix-caching`` (vLLM v0) and ``--system vllm-v1``, all on Llama-3.1-8B /
H100-80GB with each system's own defaults, in one process.

Two loads: the trace as it is (3.4 req/s offered: one H100 is overloaded, the queue grows all
hour and throughput is the engine's capacity) and its arrival times stretched x3 (1.1 req/s:
the engine keeps up, so the hit rate is the cache's under a working load).

Hit rate: prompt tokens found cached / prompt tokens looked up, every admission counted (a
recompute's too), as each system's logger counts it. Run: ``python benchmarks/sglang_mooncake.py
[--out FILE]``; prints a table and writes it to ``--out`` (default
benchmarks/results/sglang_mooncake_<date>.txt). Asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

from pagesim.sim.config import SimConfig  # noqa: E402

MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
MODEL, GPU = "llama-3.1-8b", "h100-80gb"
SYSTEMS = (("sglang (fcfs)", "sglang", {}), ("sglang --schedule-policy lpm", "sglang", dict(schedule_policy="lpm")),
           ("vllm --prefix-caching (v0)", "vllm", dict(prefix_caching=True)), ("vllm-v1", "vllm-v1", {}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" /
                                        f"sglang_mooncake_{datetime.date.today().isoformat()}.txt"))
    args = p.parse_args()
    from pagesim.sim.run import run_simulation
    from pagesim.traces.loaders import load_trace

    if not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}: skipped")
        return
    trace = load_trace(MOONCAKE)
    lines = [f"Mooncake conversation trace ({len(trace):,} requests), {MODEL} on {GPU}, each system's defaults; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"{'load':<16} {'system':<30} {'hit rate':>8} {'req/s':>7} {'out tok/s':>9} {'p50 TTFT s':>10} "
             f"{'p99 TTFT s':>10} {'preempt':>7} {'evictions':>9} {'wall s':>6}"]
    print("\n".join(lines), flush=True)
    for load, stretch in (("as is (3.4/s)", 1.0), ("x3 spread (1.1/s)", 3.0)):
        t = trace.copy()
        t["arrival_s"] = t["arrival_s"] * stretch
        for label, system, settings in SYSTEMS:
            cfg = SimConfig.for_system(system, model=MODEL, gpu=GPU, max_len_policy="drop", record_steps=False,
                                       **settings)
            run_simulation(cfg, t.iloc[:20])  # numba's cache loaded outside the timing
            start = time.perf_counter()
            s = run_simulation(cfg, t).summary
            wall = time.perf_counter() - start
            line = (f"{load:<16} {label:<30} {s['prefix_cache_hit_rate']:>8.4f} {s['request_throughput']:>7.3f} "
                    f"{s['output_throughput']:>9.1f} {s['median_ttft_ms'] / 1e3:>10.1f} {s['p99_ttft_ms'] / 1e3:>10.1f} "
                    f"{s['num_preemptions']:>7} {s['mgr_evictions']:>9} {wall:>6.2f}")
            lines.append(line)
            print(line, flush=True)
    lines.append("hit rate: cached prompt tokens / prompt tokens looked up; evictions: tree nodes (sglang) or blocks "
                 "(vllm); completed and rejected: every request completes, none is dropped")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
