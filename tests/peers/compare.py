"""pagesim against vLLM, step by step: ``python -m tests.peers.compare [--v0] [--prefix-hashes-only] [WORKLOAD...]``
(or against SGLang's radix cache: ``--sglang [WORKLOAD...]``).

Prints, per workload (tests/peers/workloads.py), the steps each side took, the share of steps
whose records are identical (position by position, over the longer run) and the first step
that differs, with both records. By default vLLM 0.33.0's v1 scheduler against ``--system
vllm-v1``; ``--v0``: vLLM 0.4.2's against ``--system vllm`` (``V0_WORKLOADS``).
``--prefix-hashes-only`` (v1): vLLM names only the blocks the trace's prefix hashes cover, as
pagesim does (vllm_v1.make_request).

``--sglang``: SGLang 0.5.23's radix cache against ``--system sglang``'s, call by call
(sglang_radix.py): per workload the radix calls pagesim made, the share identical (result and
trees after it), the share whose results alone agree, the share after which the whole trees
were compared (the others: a match's path, sglang_radix.Twin) and the first call that differs,
with both trees. ``--mooncake-requests=N``: the Mooncake workloads over the trace's first N
requests (200 by default, the tests'). ``--checkpoint``: pagesim's inserts made on SGLang's side
as its ``RadixCache.checkpoint`` makes them (a known divergence: sglang_radix.py, Checkpoints).
"""

from __future__ import annotations

import sys

import functools

from tests.peers import pagesim_steps, vllm_v0, vllm_v1
from tests.peers.workloads import V0_WORKLOADS, WORKLOADS


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
                swaps = (f" swapped out {sorted(s.swapped_out)} in {sorted(s.swapped_in)}"
                         if s.swapped_out or s.swapped_in else "")
                lines.append(f"  {label} step {j} t={s.start_s}: scheduled {dict(sorted(s.scheduled.items()))} "
                             f"preempted {sorted(s.preempted)} free {s.free_blocks} finished {sorted(s.finished)}"
                             + swaps)
            elif j == k:
                lines.append(f"  {label} step {j}: none (its run ended after {len(steps)} steps)")
    return "\n".join(lines)


def sglang(names: list, mooncake_requests: int = 200, checkpoint: bool = False) -> int:
    """The ``--sglang`` table (sglang_radix.WORKLOADS; the Mooncake ones over the trace's first
    ``mooncake_requests``; ``checkpoint``: inserts as SGLang's RadixCache.checkpoint makes them)."""
    from tests.peers import sglang_radix

    workloads = sglang_radix.workloads(mooncake_requests)
    names = names or list(workloads)
    print(f"{'workload':<24} {'operations':>10} {'identical':>10} {'results':>8} {'whole':>8}  first divergence")
    details = []
    for name in names:
        workload = workloads[name]
        if workload.needs is not None and not workload.needs.exists():
            print(f"{name:<24} {'-':>10} {'-':>10} {'-':>8} {'-':>8}  skipped: {workload.needs} is not here")
            continue
        run = sglang_radix.run(workload, checkpoint)
        n = max(len(run.operations), 1)
        first = "-" if run.first is None else f"operation {run.first[0].index} ({run.first[0].kind})"
        print(f"{name:<24} {len(run.operations):>10} {run.identical / n:>10.2%} {run.same_results / n:>8.2%} "
              f"{(len(run.operations) - run.path_only) / n:>8.1%}  {first}")
        if run.first is not None:
            details.append(f"{name}: {run.divergence()}")
    for text in details:
        print("\n" + text)
    return 0


def main(argv=None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if "--sglang" in args:
        requests = [int(a.split("=", 1)[1]) for a in args if a.startswith("--mooncake-requests=")]
        return sglang([a for a in args if not a.startswith("--")], *(requests or [200]), "--checkpoint" in args)
    prefix_hashes_only = "--prefix-hashes-only" in args
    v0 = "--v0" in args
    workloads = V0_WORKLOADS if v0 else WORKLOADS
    peer = vllm_v0.run if v0 else functools.partial(vllm_v1.run, prefix_hashes_only=prefix_hashes_only)
    names = [a for a in args if not a.startswith("--")] or list(workloads)
    print(f"{'workload':<18} {'steps vLLM':>10} {'pagesim':>8} {'identical':>10}  first diverging step")
    details = []
    for name in names:
        workload = workloads[name]
        theirs = peer(workload)
        try:
            ours = pagesim_steps.run(workload, "vllm" if v0 else "vllm-v1")
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
