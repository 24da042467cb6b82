"""Disaggregated speed (issue #38, Speed): the Azure conversation trace (../shared/traces/) on
Llama-2-13B / A100-80GB, ``vllm-v1``, through 4 prefill + 4 decode replicas (InfiniBand NDR)
and through 8 aggregated replicas, in the same process, alternating ``--repeat`` times: each
run's loop wall time (``wall_time_s``, after numba's cache is loaded) and whole call, the best of
each, and their ratio (target: disaggregated within 2x).

Run: ``python benchmarks/disagg_speed.py [--repeat 3] [--router NAME] [--no-prefix-caching]``.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

from pagesim.sim.config import SimConfig  # noqa: E402

AZURE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--router", default="round-robin")
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false")
    args = p.parse_args()
    from pagesim.sim.cluster import run_cluster
    from pagesim.sim.disagg import run_disaggregated
    from pagesim.traces.loaders import load_trace

    if not AZURE.exists():
        print(f"Azure conversation trace not found at {AZURE}")
        return
    trace = load_trace(AZURE)
    cfg = SimConfig.for_system("vllm-v1", model="llama-2-13b", gpu="a100-80gb", prefix_caching=args.prefix_caching,
                               max_len_policy="drop", record_steps=False)
    run_cluster(cfg, trace.iloc[:20], 8, args.router)  # numba's caches loaded (or compiled) first
    run_disaggregated(cfg, cfg, trace.iloc[:20], 4, 4, args.router)
    print(f"Azure conv ({len(trace):,} requests), vllm-v1 prefix caching {args.prefix_caching}, {cfg.model} "
          f"{cfg.gpu}, router {args.router}")
    best = {"aggregated": [float("inf")] * 2, "disaggregated": [float("inf")] * 2}
    for k in range(args.repeat):
        for name, run in (("aggregated", lambda: run_cluster(cfg, trace, 8, args.router)),
                          ("disaggregated", lambda: run_disaggregated(cfg, cfg, trace, 4, 4, args.router))):
            t0 = time.perf_counter()
            s = run().summary
            call = time.perf_counter() - t0
            best[name] = [min(best[name][0], s["wall_time_s"]), min(best[name][1], call)]
            print(f"  {k + 1} {name:13s} loop {s['wall_time_s']:.3f} s, call {call:.2f} s; "
                  f"{s['completed']:,} done, mean TTFT {s['mean_ttft_ms']:.0f} ms, "
                  f"p99 TTFT {s['p99_ttft_ms']:.0f} ms, {s['num_steps']:,} steps")
    (agg_loop, agg_call), (dis_loop, dis_call) = best["aggregated"], best["disaggregated"]
    print(f"best loop: aggregated {agg_loop:.3f} s, disaggregated {dis_loop:.3f} s: "
          f"ratio {dis_loop / agg_loop:.2f} (target <= 2)")
    print(f"best call: aggregated {agg_call:.2f} s, disaggregated {dis_call:.2f} s: ratio {dis_call / agg_call:.2f}")


if __name__ == "__main__":
    main()
