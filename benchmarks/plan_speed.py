"""Speed of ``pagesim plan``: a POINTS-point max-rate plan over a DURATION-second ``sharegpt`` workload.

    python benchmarks/plan_speed.py [--points 20] [--duration 3600] [--workers 2] [--systems ...]

The plan is the real machinery (:func:`experiments.probe.run_searches` through ``run_sweep``:
process pool, fresh on-disk cache) for the given systems, each search capped at
POINTS / len(systems) probes, so the plan simulates POINTS points. Then, in the same run:

* baseline: the same points simulated one after another in this process (``run_point``, no
  pool, no cache) -> ratio baseline / plan (the pool's speed-up, minus the cache's overhead);
* re-run: the same plan again against the now-warm cache (what repeating a plan costs);

Target (issue 8): a 20-point plan over a 1-hour trace in under 2 minutes on 2 cores.
Probes that certainly fail are stopped early (``--no-early-stop`` to simulate every point in full),
as ``pagesim plan`` does by default. Prints wall times and per-point means; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

from pagesim.experiments import plan as P  # noqa: E402
from pagesim.experiments.probe import (  # noqa: E402
    Runner, SearchTask, early_stop_options, encode_workload, run_point, run_searches)
from pagesim.experiments.search import BoundarySearch  # noqa: E402
from pagesim.experiments.slo import SLO  # noqa: E402

TARGET_SLO = SLO(ttft_p99_s=2.0, tpot_p99_s=0.1)


def make_tasks(args) -> list[SearchTask]:
    setup = P.PlanSetup(sim={"model": args.model, "gpu": args.gpu},
                        workload=encode_workload({"workload": "sharegpt", "duration": args.duration}),
                        start_rate=args.start_rate, rtol=0.02,
                        early_stop=early_stop_options(TARGET_SLO) if args.early_stop else None)
    per = max(1, args.points // len(args.systems))
    tasks = []
    for s in args.systems:
        search = BoundarySearch(setup.start_rate, rtol=0.02, max_probes=per)
        tasks.append(SearchTask(s, search, lambda x, s=s: setup.spec(s, x)))
    return tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of sharegpt arrivals per point")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--systems", default="orca-max,orca-pow2,orca-oracle,vllm")
    ap.add_argument("--model", default="opt-13b")
    ap.add_argument("--gpu", default="a100-40gb")
    ap.add_argument("--start-rate", type=float, default=1.0)
    ap.add_argument("--no-baseline", action="store_true", help="skip the serial baseline")
    ap.add_argument("--early-stop", action=argparse.BooleanOptionalAction, default=True,
                    help="stop certainly-failing probes early (the plan CLI's default)")
    args = ap.parse_args()
    args.systems = [s for s in args.systems.split(",") if s]
    slo = TARGET_SLO
    print(f"plan: {args.points} points, sharegpt {args.duration:g} s per point, systems {','.join(args.systems)}, "
          f"workers {args.workers} (cpu_count {os.cpu_count()})", flush=True)

    with tempfile.TemporaryDirectory() as cache:
        tasks = make_tasks(args)
        runner = Runner(slo=slo, workers=args.workers, cache_dir=cache)
        t0 = time.perf_counter()
        run_searches(tasks, runner)
        plan_s = time.perf_counter() - t0
        specs = [t.make_spec(p["x"]) for t in tasks for p in t.points]
        n = len(specs)
        stopped = sum(bool(p.get("stopped_early")) for t in tasks for p in t.points)
        print(f"plan          {plan_s:8.1f} s  {n} points ({stopped} stopped early)  {plan_s / n:6.2f} s/point  "
              f"answers {', '.join(f'{t.name} {t.search.answer}' for t in tasks)}", flush=True)

        tasks2 = make_tasks(args)
        t0 = time.perf_counter()
        run_searches(tasks2, Runner(slo=slo, workers=args.workers, cache_dir=cache))
        warm_s = time.perf_counter() - t0
        print(f"warm re-run   {warm_s:8.1f} s  ({warm_s / n:.3f} s/point from the cache)", flush=True)

    if not args.no_baseline:
        t0 = time.perf_counter()
        for spec in specs:
            run_point(spec)
        base_s = time.perf_counter() - t0
        print(f"serial        {base_s:8.1f} s  {base_s / n:6.2f} s/point (same points, one process, no cache)")
        print(f"ratio serial / plan = {base_s / plan_s:.2f}x")
    target = 120.0 * n / 20 * args.duration / 3600.0
    print(f"target: 20 points x 3600 s in 120 s on 2 cores -> {target:.0f} s for this size; "
          f"{'met' if plan_s <= target else 'NOT met'} ({plan_s / target:.2f}x the budget)")


if __name__ == "__main__":
    main()
