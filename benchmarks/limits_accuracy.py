"""How close the estimate of a run's tables (:func:`sim.run_memory.bytes_per_request`,
weighed on the tables the run's options allocate) comes to the memory the command takes.

    python benchmarks/limits_accuracy.py [--requests 1000000] [--steps-requests 200000]

Each case is ``pagesim simulate`` on the built-in ShareGPT workload (synthetic), run as its own
process and measured by its peak RSS (``wait4``'s ``ru_maxrss``), above the peak of the same
command at :data:`BASE_REQUESTS` requests, run twice (the first may compile the core): the
interpreter, the imports, the compiled core and the KV pool's tables, which the estimate counts
apart. Prints, per case, the estimate, the measured growth and their ratio. Target (issue 85 item 3): within 25 %.
"""

from __future__ import annotations

import argparse
import sys

from _import_path import import_path
from _measure import measured

#: the requests of the baseline run each case is measured above
BASE_REQUESTS = 1000
#: the cases: system, steps recorded, and the option naming the request count
CASES = (("vllm", False, "requests"), ("vllm-v1", False, "requests"), ("vllm", True, "steps_requests"))


def peak_rss_bytes(argv: list[str]) -> int:
    """The peak resident memory of ``pagesim ARGV`` run as a fresh process (its output dropped)."""
    return measured([sys.executable, "-m", "pagesim.sim.cli", *argv]).peak_bytes


def command(system: str, steps: bool, requests: int) -> list[str]:
    return ["simulate", "--workload", "sharegpt", "--rate", "20", "--num-requests", str(requests), "--system", system,
            "--no-progress", *([] if steps else ["--no-steps"])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests of the --no-steps cases")
    ap.add_argument("--steps-requests", type=int, default=200_000, help="requests of the case with steps")
    args = ap.parse_args()
    sys.path.insert(0, import_path())
    from pagesim.sim.config import SimConfig
    from pagesim.sim.run_memory import bytes_per_request

    print(f"{'case':<38} {'estimate MB':>12} {'measured MB':>12} {'ratio':>6}  (peak RSS above {BASE_REQUESTS:,} "
          "requests)")
    for system, steps, option in CASES:
        n = getattr(args, option)
        per_request = bytes_per_request(SimConfig.for_system(system, record_steps=steps))
        peak_rss_bytes(command(system, steps, BASE_REQUESTS))  # a compile, where one is due, outside the figures
        base = peak_rss_bytes(command(system, steps, BASE_REQUESTS))
        peak = peak_rss_bytes(command(system, steps, n))
        estimate, measured = (n - BASE_REQUESTS) * per_request, peak - base
        case = f"{system} {n:,} requests {'with steps' if steps else '--no-steps'}"
        print(f"{case:<38} {estimate / 1e6:>12.0f} {measured / 1e6:>12.0f} {estimate / measured:>6.2f}  "
              f"({per_request:,.0f} B a request; whole process {peak / 1e6:,.0f} MB)", flush=True)


if __name__ == "__main__":
    main()
