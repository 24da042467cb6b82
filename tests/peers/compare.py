"""pagesim against vLLM 0.33.0, step by step: ``python -m tests.peers.compare [--prefix-hashes-only] [WORKLOAD...]``.

Prints, per workload (tests/peers/workloads.py), the steps each side took, the share of steps
whose records are identical (position by position, over the longer run) and the first step
that differs, with both records. ``--prefix-hashes-only``: vLLM names only the blocks the trace's
prefix hashes cover, as pagesim does (vllm_v1.make_request).
"""

from __future__ import annotations

import sys

from tests.peers import pagesim_steps, vllm_v1
from tests.peers.workloads import WORKLOADS


def identical_steps(ours, theirs) -> int:
    return sum(a == b for a, b in zip(ours, theirs))


def first_divergence(ours, theirs) -> int | None:
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return k
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def describe(k: int, ours, theirs) -> str:
    """Both sides' records at step ``k`` (and the one before, for context)."""
    lines = [f"first diverging step: {k}"]
    for label, steps in (("pagesim", ours), ("vLLM   ", theirs)):
        for j in (k - 1, k):
            if 0 <= j < len(steps):
                s = steps[j]
                lines.append(f"  {label} step {j} t={s.start_s}: scheduled {dict(sorted(s.scheduled.items()))} "
                             f"preempted {sorted(s.preempted)} free {s.free_blocks} finished {sorted(s.finished)}")
            elif j == k:
                lines.append(f"  {label} step {j}: none (its run ended after {len(steps)} steps)")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    prefix_hashes_only = "--prefix-hashes-only" in args
    names = [a for a in args if a != "--prefix-hashes-only"] or list(WORKLOADS)
    print(f"{'workload':<18} {'steps vLLM':>10} {'pagesim':>8} {'identical':>10}  first diverging step")
    details = []
    for name in names:
        workload = WORKLOADS[name]
        theirs = vllm_v1.run(workload, prefix_hashes_only=prefix_hashes_only)
        try:
            ours = pagesim_steps.run(workload)
        except Exception as error:  # e.g. a setting this pagesim has not (priority, before it lands)
            print(f"{name:<18} {len(theirs):>10} {'-':>8} {'-':>10}  pagesim: {type(error).__name__}: {error}")
            continue
        share = identical_steps(ours, theirs) / max(len(ours), len(theirs), 1)
        k = first_divergence(ours, theirs)
        print(f"{name:<18} {len(theirs):>10} {len(ours):>8} {share:>10.1%}  {'-' if k is None else k}")
        if k is not None:
            details.append(f"{name}: {describe(k, ours, theirs)}")
    for text in details:
        print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
