"""Trace-layer speed: vectorized loaders/generators against naive per-row Python, same run.

    python benchmarks/trace_speed.py [--shared ../shared/traces] [--synth-requests 1000000]

Prints wall times and speed-ups; asserts nothing. Baselines:
* loading: csv module + datetime.strptime per row, then per-row Python stats (sorted() for the
  percentiles) on the Azure conv trace (19,366 rows);
* synthesis: a per-request Python loop (random.expovariate gaps, lognormal lengths by rejection
  under the vLLM filter) for 100,000 requests, scaled linearly to the vectorized request count.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import statistics
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def best_of(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def naive_load_stats(path: Path) -> dict:
    t, p, o = [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            ts = row["TIMESTAMP"]
            head, _, frac = ts.partition(".")
            t.append(datetime.strptime(f"{head}.{frac[:6]}", "%Y-%m-%d %H:%M:%S.%f").timestamp())
            p.append(int(row["ContextTokens"]))
            o.append(int(row["GeneratedTokens"]))
    t0 = t[0]
    t = [x - t0 for x in t]
    gaps = [b - a for a, b in zip(t, t[1:])]

    def dist(xs):
        s = sorted(xs)
        q = lambda f: s[min(len(s) - 1, int(round(f * (len(s) - 1))))]  # noqa: E731
        return dict(mean=sum(xs) / len(xs), p50=q(.5), p90=q(.9), p99=q(.99), max=s[-1])

    return dict(rows=len(t), duration_s=t[-1] - t[0], rate_rps=(len(t) - 1) / (t[-1] - t[0]),
                interarrival_cv=statistics.pstdev(gaps) / statistics.fmean(gaps),
                prompt_tokens=dist(p), output_tokens=dist(o))


def naive_synth(num: int, rate: float = 2.0, seed: int = 0) -> list[tuple]:
    from traces.synth import fit_paper_workload
    fit = fit_paper_workload("sharegpt")
    rnd = random.Random(seed)
    out, t = [], 0.0
    for i in range(num):
        t += rnd.expovariate(rate)
        while True:
            pr = round(rnd.lognormvariate(fit["prompt_mu"], fit["prompt_sigma"]))
            ou = round(rnd.lognormvariate(fit["output_mu"], fit["output_sigma"]))
            if 4 <= pr <= 1024 and ou >= 4 and pr + ou <= 2048:
                break
        out.append((str(i), t, pr, ou, 1, 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "traces")
    ap.add_argument("--synth-requests", type=int, default=1_000_000)
    ap.add_argument("--naive-requests", type=int, default=100_000)
    args = ap.parse_args()

    from traces.loaders import load_trace
    from traces.stats import trace_stats
    from traces.synth import make_workload

    azure = args.shared / "AzureLLMInferenceTrace_conv.csv"
    if azure.exists():
        fast, st = best_of(lambda: trace_stats(load_trace(azure)))
        slow, nst = best_of(lambda: naive_load_stats(azure))
        assert st["rows"] == nst["rows"]
        print(f"load+stats Azure conv ({st['rows']:,} rows): vectorized {fast * 1e3:8.1f} ms | "
              f"naive csv+strptime {slow * 1e3:8.1f} ms | speed-up {slow / fast:5.1f}x")
    else:
        print(f"load+stats Azure conv: skipped ({azure} not present)")

    n = args.synth_requests
    fast, df = best_of(lambda: make_workload("sharegpt", 2.0, num_requests=n, seed=0))
    slow, _ = best_of(lambda: naive_synth(args.naive_requests), repeat=1)
    slow_scaled = slow * n / args.naive_requests
    print(f"synth sharegpt ({n:,} requests): vectorized {fast:8.3f} s | naive loop {slow:.3f} s for "
          f"{args.naive_requests:,} -> {slow_scaled:8.3f} s scaled | speed-up {slow_scaled / fast:5.1f}x")
    print(f"  means: prompt {df['prompt_tokens'].mean():.2f} (paper 161.31), "
          f"output {df['output_tokens'].mean():.2f} (paper 337.99)")


if __name__ == "__main__":
    main()
