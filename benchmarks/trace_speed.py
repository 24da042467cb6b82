"""Trace-layer speed: vectorized loaders/generators against baselines measured in the same run.

    python benchmarks/trace_speed.py [--shared ../shared/traces] [--synth-requests 1000000]
                                     [--big-rows 27303999] [--baseline-rows 2000000]

Prints wall times and speed-ups; asserts nothing. Baselines:
* loading: csv module + datetime.strptime per row, then per-row Python stats (sorted() for the
  percentiles) on the Azure conv trace (19,366 rows);
* synthesis: a per-request Python loop (random.expovariate gaps, lognormal lengths by rejection
  under the vLLM filter) for 100,000 requests, scaled linearly to the vectorized request count;
* a big trace: a file in the Azure 2024 week-long format (``TIMESTAMP`` like
  ``2024-05-12 00:00:00.001163+00:00``; the conversation week has 27,303,999 rows, ~45 req/s),
  written to a temporary folder (deleted at the end) with the conv trace's lengths. Targets:
  ``pagesim trace stats`` under 30 s and 3 GB peak RSS, and ``pagesim simulate --time-slice
  0:3600`` under 10 s (both run as commands, timed with their own peak RSS). Baselines: the
  pandas reader this project used before pyarrow (``pd.read_csv`` + ``pd.to_datetime``) on the
  first ``--baseline-rows`` rows against today's reader on the same rows (the full file would
  take the old reader minutes and ~5 GB), and the whole file's load without the windowed read
  against the simulate command with it.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _measure import measured

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
    from pagesim.traces.synth import fit_paper_workload
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


def write_azure_week(path: Path, rows: int, lengths_from: Path | None, seed: int = 0) -> None:
    """``rows`` requests over one week (Poisson at rows / week) in the Azure 2024 format, with
    (prompt, output) pairs resampled from ``lengths_from`` (else lognormal), in chunks."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    rng = np.random.default_rng(seed)
    if lengths_from is not None and lengths_from.exists():
        from pagesim.traces.loaders import load_trace
        src = load_trace(lengths_from)
        prompts, outputs = src["prompt_tokens"].to_numpy(), src["output_tokens"].to_numpy()
    else:
        prompts = np.maximum(np.rint(rng.lognormal(6.8, 0.8, 100_000)), 1).astype(np.int64)
        outputs = np.maximum(np.rint(rng.lognormal(4.9, 1.0, 100_000)), 1).astype(np.int64)
    start_us = np.int64(1715472000) * 10**6  # 2024-05-12 00:00:00 UTC, the conversation week's start
    mean_gap_us = 7 * 86400 * 1e6 / rows
    t = float(start_us)
    with open(path, "wb") as f:
        f.write(b"TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for lo in range(0, rows, 2_000_000):
            n = min(2_000_000, rows - lo)
            us = t + np.cumsum(rng.exponential(mean_gap_us, n))
            t = float(us[-1])
            stamps = pc.binary_join_element_wise(
                pc.strftime(pa.array(us.astype(np.int64), type=pa.timestamp("us")), format="%Y-%m-%d %H:%M:%S"),
                "+00:00", "")
            pick = rng.integers(0, prompts.size, n)
            table = pa.table({"TIMESTAMP": stamps, "ContextTokens": prompts[pick], "GeneratedTokens": outputs[pick]})
            pacsv.write_csv(table, f, write_options=pacsv.WriteOptions(include_header=False, quoting_style="none"))


def old_pandas_stats(path: Path) -> dict:
    """The reader this project used before pyarrow: pandas' C parser, then pd.to_datetime."""
    import numpy as np
    import pandas as pd
    from pagesim.traces.stats import trace_stats
    raw = pd.read_csv(path, usecols=["TIMESTAMP", "ContextTokens", "GeneratedTokens"], dtype={"TIMESTAMP": str},
                      skipinitialspace=True)
    t = pd.to_datetime(raw["TIMESTAMP"], format="ISO8601")
    df = pd.DataFrame({"request_id": pd.Series(np.arange(len(raw))).astype(str),
                       "arrival_s": (t - t.min()).dt.total_seconds().to_numpy(),
                       "prompt_tokens": raw["ContextTokens"].to_numpy(np.int64),
                       "output_tokens": raw["GeneratedTokens"].to_numpy(np.int64)})
    assert not df["request_id"].duplicated().any()  # the check it made on every load
    return trace_stats(df)


def timed_command(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (GB) and exit code of a command run to completion."""
    t0 = time.perf_counter()
    run = measured(argv, env=dict(os.environ), check=False)
    return time.perf_counter() - t0, run.peak_gb, run.exit_code


def big_trace(rows: int, baseline_rows: int, lengths_from: Path) -> None:
    from pagesim.traces.loaders import load_trace
    from pagesim.traces.stats import trace_stats
    pagesim = [sys.executable, "-m", "pagesim.sim.cli"]
    tmp = Path(tempfile.mkdtemp(prefix="pagesim-trace-speed-"))
    try:
        path, head = tmp / "azure_conv_1week.csv", tmp / "azure_conv_head.csv"
        t0 = time.perf_counter()
        write_azure_week(path, rows, lengths_from)
        with open(path, "rb") as src, open(head, "wb") as dst:
            for _, line in zip(range(baseline_rows + 1), src):
                dst.write(line)
        print(f"big trace: wrote {rows:,} rows in the Azure 2024 format ({path.stat().st_size / 1e9:.2f} GB) "
              f"in {time.perf_counter() - t0:.1f} s")

        wall, rss, rc = timed_command([*pagesim, "trace", "stats", str(path), "--json"])
        print(f"  trace stats, {rows:,} rows: {wall:6.1f} s (target < 30 s), peak RSS {rss:.2f} GB "
              f"(target < 3 GB), exit {rc}")
        old, _ = best_of(lambda: old_pandas_stats(head), repeat=1)
        new, _ = best_of(lambda: trace_stats(load_trace(head)), repeat=1)
        print(f"  load + stats, first {baseline_rows:,} rows: pyarrow reader {new:6.2f} s | old pandas reader "
              f"{old:6.2f} s | speed-up {old / new:5.1f}x")

        sim = [*pagesim, "simulate", "--trace", str(path), "--time-slice", "0:3600", "--model", "llama-2-7b",
               "--gpu", "h100-80gb", "--max-len-policy", "drop", "--no-steps", "--no-progress", "--json"]
        wall, rss, rc = timed_command(sim)
        whole, _ = best_of(lambda: load_trace(path), repeat=1)
        print(f"  simulate --time-slice 0:3600 (llama-2-7b, H100): {wall:6.1f} s (target < 10 s), peak RSS "
              f"{rss:.2f} GB, exit {rc} | loading the whole file first (before the windowed read): {whole:6.1f} s "
              f"for the load alone | speed-up > {whole / wall:5.1f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "traces")
    ap.add_argument("--synth-requests", type=int, default=1_000_000)
    ap.add_argument("--naive-requests", type=int, default=100_000)
    ap.add_argument("--big-rows", type=int, default=27_303_999, help="rows of the week-long file (0: skip)")
    ap.add_argument("--baseline-rows", type=int, default=2_000_000, help="rows the old pandas reader reads")
    args = ap.parse_args()

    from pagesim.traces.loaders import load_trace
    from pagesim.traces.stats import trace_stats
    from pagesim.traces.synth import make_workload

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
    del df

    if args.big_rows:
        big_trace(args.big_rows, min(args.baseline_rows, args.big_rows), azure)


if __name__ == "__main__":
    main()
