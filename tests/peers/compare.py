"""pagesim against a peer, step by step: ``python -m tests.peers.compare [--groups | --spec | --v0 | --nano]
[WORKLOAD...]`` (or against SGLang's radix cache, call by call: ``--sglang [WORKLOAD...]``).

Prints, per workload (tests/peers/workloads.py), the steps each side took, the share of steps
whose records are identical (position by position, over the longer run) and the first step
that differs, with both records. By default vLLM 0.33.0's v1 scheduler against ``--system
vllm-v1``; ``--groups``: the same over models whose sliding-window layers make several KV
cache groups (``GROUP_WORKLOADS``: each running request's blocks in each group compared too;
``--groups-random=N``: over workloads drawn from seeds 0..N-1, ``workloads.random_grouped``;
``--mamba-random=N``: the same over Mamba hybrids; ``--groups-spec-random=N``: over
``workloads.random_grouped_speculative``, speculative decoding over the groups;
``--mamba-spec-random=N``: the same over Mamba hybrids);
``--spec``: the same with speculative decoding (``SPECULATIVE_WORKLOADS``; ``--spec-random=N``,
``--spec-prefix-random=N``: drawn, ``workloads.random_speculative``, ``random_speculative_prefix``: each
step's drafts, blocks held and drafts kept compared too, pagesim's acceptance draws replayed into
vLLM, ``vllm_v1.run``); ``--v0``: vLLM 0.4.2's against ``--system vllm`` (``V0_WORKLOADS``); ``--nano``:
nano-vllm's against ``--system vllm`` with ``nano_vllm.PAGESIM_SETTINGS`` (``NANO_WORKLOADS``).
``--offload``: vLLM 0.33.0 with its CPU offload tier (``OFFLOAD_WORKLOADS``, vllm_offload.py: each step's
host blocks and admissions' hits compared too; ``--offload-random=N``: over ``workloads.random_offload``
drawn from seeds 0..N-1; ``--offload-spec``: the tier with speculative decoding
(``OFFLOAD_SPECULATIVE_WORKLOADS``), ``--offload-spec-random=N`` over
``workloads.random_offload_speculative``; ``--offload-aligned-random=N``,
``--offload-spec-aligned-random=N``: the same with prompts ending on a block boundary, tighter
pools; ``--deferred-stores``: vLLM's worker submits a step's
stores at the next step's start, which pagesim does not model).
``--sglang``: SGLang 0.5.23's radix cache against ``--system sglang``'s, call by call
(sglang_radix.py): per workload the radix calls pagesim made, the share identical (result and
trees after it), the share whose results alone agree, the share after which the whole trees
were compared (the others: a match's path, sglang_radix.Twin) and the first call that differs,
with both trees. ``--mooncake-requests=N``: the Mooncake workloads over the trace's first N
requests (200 by default; the tests run 100: sglang_radix.TEST_MOONCAKE_REQUESTS).
``--checkpoint``: pagesim's checkpoints (each two inserts) made on SGLang's side as its
``RadixCache.checkpoint`` makes them (sglang_radix.py, Checkpoints).
``--mamba-prefix [WORKLOAD...]``: Jamba-like hybrids with prefix caching on
(``MAMBA_PREFIX_WORKLOADS``), where vLLM 0.33.0 keeps its Mamba states in "align" mode
(docs/notes/mamba-align.md): per workload, the comparison (the first diverging step described) or
pagesim's refusal in one line (gated-delta-net's prefill checkpoints), then vLLM's step records
(each running request's blocks per group: full attention first, then the Mamba groups).
``--groups-prefix [WORKLOAD...]``: prefix caching over sliding-window groups
(``GROUP_PREFIX_WORKLOADS``, docs/notes/swa-prefix-caching.md), step by step (``--tables``:
vLLM's records and each running request's block table in each group too);
``--groups-prefix-random=N``: over ``workloads.random_grouped_prefix``, the drawn sliding-window
workloads with prefix caching.
``--sglang-scheduler [WORKLOAD...]``: SGLang 0.5.23's scheduling policy against ``--system
sglang``, step by step (sglang_scheduler.py, its ``WORKLOADS``): steps on each side, the share of
identical steps and the first that differs.
``--sglang-swa [--disable-radix-cache] [--interval N]``: not a comparison, a probe: SGLang 0.5.23's
hybrid sliding-window pool and its unified radix cache through the worked example of
docs/notes/sglang-swa.md (sglang_swa.py), each pool's free slots and the tree after each call.
``--sglang-hicache [--device N] [--ratio R] [--policy P]``: not a comparison, a probe: SGLang
0.5.23's hierarchical cache (GPU and host tiers) through the worked example of
docs/notes/sglang-hicache.md (sglang_hicache.py), both pools' free slots and the tree (GPU, host
or both per node) after each call.
``--sglang-hicache-side [WORKLOAD...]``: ``--system sglang --kv-offload-gib`` (sim/core/kv/radix_cache.py)
beside SGLang 0.5.23's ``UnifiedRadixCache`` with its host tier, call by call
(sglang_hicache_side.py, its ``WORKLOADS``): per workload the operations identical / total, per
kind, and the first that differs, with both trees.
"""

from __future__ import annotations

import collections
import sys
import textwrap

from tests.peers import nano_vllm, pagesim_steps, vllm_offload, vllm_v0, vllm_v1
from tests.peers.workloads import (GROUP_PREFIX_WORKLOADS, GROUP_WORKLOADS, MAMBA_PREFIX_WORKLOADS, NANO_WORKLOADS,
                                  OFFLOAD_SPECULATIVE_WORKLOADS, OFFLOAD_WORKLOADS,
                                  SPECULATIVE_WORKLOADS, V0_WORKLOADS, WORKLOADS, random_grouped,
                                  random_grouped_prefix, random_grouped_speculative, random_offload,
                                  random_offload_speculative, random_speculative, random_speculative_prefix)

#: the options drawing group workloads from seeds 0..N-1 (``--option=N``)
DRAWN_GROUPS = ("--groups-random=", "--mamba-random=", "--groups-spec-random=", "--mamba-spec-random=",
                "--groups-prefix-random=")
#: the same for speculative decoding (``--spec-prefix-random``: EAGLE and MTP over shared prefixes)
DRAWN_SPECULATIVE = ("--spec-random=", "--spec-prefix-random=")
#: the same for the CPU offload tier (``-aligned``: half the prompts end on a block boundary)
DRAWN_OFFLOAD = ("--offload-random=", "--offload-spec-random=", "--offload-aligned-random=",
                 "--offload-spec-aligned-random=")


def identical_steps(ours, theirs) -> int:
    return sum(a == b for a, b in zip(ours, theirs))


def first_divergence(ours, theirs) -> int | None:
    for k, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return k
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def describe(k: int, ours, theirs, peer: str = "vLLM") -> str:
    """Both sides' records at step ``k`` (and the one before, for context)."""
    lines = [f"first diverging step: {k}"]
    width = max(len("pagesim"), len(peer))
    for label, steps in (("pagesim".ljust(width), ours), (peer.ljust(width), theirs)):
        for j in (k - 1, k):
            if 0 <= j < len(steps):
                s = steps[j]
                swaps = (f" swapped out {sorted(s.swapped_out)} in {sorted(s.swapped_in)}"
                         if s.swapped_out or s.swapped_in else "")
                speculation = (f" drafts {dict(sorted(s.drafts.items()))} blocks {dict(sorted(s.blocks.items()))} "
                               f"kept {dict(sorted(s.kept.items()))}" if s.blocks else "")
                speculation += f" group blocks {dict(sorted(s.group_blocks.items()))}" if s.group_blocks else ""
                speculation += host_tier(s, steps[j - 1] if j > 0 else None)
                lines.append(f"  {label} step {j} t={s.start_s}: scheduled {dict(sorted(s.scheduled.items()))} "
                             f"preempted {sorted(s.preempted)} free {s.free_blocks} finished {sorted(s.finished)}"
                             + swaps + speculation)
            elif j == k:
                lines.append(f"  {label} step {j}: none (its run ended after {len(steps)} steps)")
    return "\n".join(lines)


def host_tier(step, before) -> str:
    """A step's CPU offload tier record (vllm_offload.py): the admissions' (GPU, host) hit tokens,
    its blocks (those it gained and lost since ``before``, or all), its eviction order if kept."""
    if not (step.host_blocks or step.admitted):
        return ""
    def names(blocks, ordered=False) -> str:
        shown = list(blocks) if ordered else sorted(blocks)
        return "[" + ", ".join(f"{i}.{k}" for i, k in shown[:6]) + (", ..." if len(shown) > 6 else "") + "]"

    gained, lost = step.host_blocks - (before.host_blocks if before else frozenset()), \
        (before.host_blocks if before else frozenset()) - step.host_blocks
    text = f" admitted {dict(sorted(step.admitted.items()))} host {len(step.host_blocks)} +{names(gained)}"
    return text + (f" -{names(lost)}" if lost else "") + (f" order {names(step.host_order, True)}" if step.host_order else "")


def offload_cause(ours, theirs, k: int) -> str:
    """The likely cause of a CPU offload tier workload's first divergence at step ``k``, read from
    the two records (a heuristic: README.md, "CPU offload tier", says which rules each names)."""
    if k >= min(len(ours), len(theirs)):
        return "other"
    a, b = ours[k], theirs[k]
    if a.admitted != b.admitted:
        if set(b.admitted) > set(a.admitted):
            return "reserved"
        # a hit on chunks another request is loading: vLLM defers it (offloading/scheduler.py:1022-1045)
        return "being-loaded" if any(h[1] and i not in b.admitted for i, h in a.admitted.items()) else "other"
    if a.host_blocks == b.host_blocks:
        return "other"
    before = theirs[k - 1].host_blocks if k else frozenset()
    if (b.host_blocks - before) - a.host_blocks or len(b.host_blocks) < len(a.host_blocks):
        return "store-refused"  # a block stored in the step that pagesim evicted in it, or a store vLLM refused
    finished = theirs[k - 1].finished if k else frozenset()
    if any(i in finished for i, _ in (b.host_blocks ^ a.host_blocks)):
        return "finish-touch"
    return "eviction-order"


def sglang_table(workloads: dict, names: list, header: str, skipped: str, row) -> int:
    """Print a SGLang peer's table: ``header``, then each workload's line (``skipped`` and why,
    where it needs a file that is not here) from ``row(workload) -> (line, divergence or None)``,
    then each divergence in full."""
    print(header)
    details = []
    for name in names or list(workloads):
        workload = workloads[name]
        if workload.needs is not None and not workload.needs.exists():
            print(f"{skipped.format(name)}  skipped: {workload.needs} is not here")
            continue
        line, divergence = row(workload)
        print(line)
        if divergence is not None:
            details.append(f"{name}: {divergence}")
    for text in details:
        print("\n" + text)
    return 0


def sglang(names: list, mooncake_requests: int = 200, checkpoint: bool = False) -> int:
    """The ``--sglang`` table (sglang_radix.WORKLOADS; the Mooncake ones over the trace's first
    ``mooncake_requests``; ``checkpoint``: checkpoints as SGLang's RadixCache.checkpoint makes them)."""
    from tests.peers import sglang_radix

    def row(workload):
        run = sglang_radix.run(workload, checkpoint)
        n = max(len(run.operations), 1)
        first = "-" if run.first is None else f"operation {run.first[0].index} ({run.first[0].kind})"
        line = (f"{workload.name:<24} {len(run.operations):>10} {run.identical / n:>10.2%} "
                f"{run.same_results / n:>8.2%} {(len(run.operations) - run.path_only) / n:>8.1%}  {first}")
        return line, None if run.first is None else run.divergence()

    return sglang_table(sglang_radix.workloads(mooncake_requests), names,
                        f"{'workload':<24} {'operations':>10} {'identical':>10} {'results':>8} {'whole':>8}  "
                        f"first divergence", "{:<24}" + f" {'-':>10} {'-':>10} {'-':>8} {'-':>8}", row)


def sglang_scheduler(names: list, mooncake_requests: int = 200) -> int:
    """The ``--sglang-scheduler`` table (sglang_scheduler.WORKLOADS)."""
    from tests.peers import sglang_scheduler as driver

    def row(workload):
        run = driver.run(workload)
        line = (f"{workload.name:<22} {len(run.theirs):>12} {len(run.ours):>8} {run.share:>10.1%}  "
                f"{'-' if run.first is None else run.first}")
        return line, None if run.first is None else run.describe()

    return sglang_table(driver.workloads(mooncake_requests), names,
                        f"{'workload':<22} {'steps SGLang':>12} {'pagesim':>8} {'identical':>10}  first diverging step",
                        "{:<22}" + f" {'-':>12} {'-':>8} {'-':>10}", row)


def record_lines(k: int, step) -> list[str]:
    """vLLM's record of step ``k`` over a prefix-caching group workload, wrapped at 100 columns:
    the tokens scheduled, the preempted, the free blocks, the finished, each admission's hit
    tokens, each running request's blocks per group (full groups first) and the blocks cached
    in each group."""
    text = (f"step {k} t={step.start_s}: scheduled {dict(sorted(step.scheduled.items()))} "
            f"preempted {sorted(step.preempted)} free {step.free_blocks} finished {sorted(step.finished)} "
            f"hits {dict(sorted(step.hits.items()))} held {dict(sorted(step.group_blocks.items()))} "
            f"cached {step.group_cached}")
    return textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="      ")


def groups_prefix(names: list, show_tables: bool = False) -> int:
    """The ``--groups-prefix`` table: each workload compared step by step; with ``show_tables``,
    vLLM's records and block tables after its row."""
    names = names or list(GROUP_PREFIX_WORKLOADS)
    wide = max(18, *map(len, names))
    print(f"{'workload':<{wide}} {'steps vLLM':>10} {'pagesim':>8} {'identical':>10}  first diverging step")
    for name in names:
        workload = GROUP_PREFIX_WORKLOADS[name]
        lines, count = [], [0]

        def observe(step, scheduler, vllm):
            lines.extend(record_lines(count[0], step))
            lines.extend(vllm_v1.block_tables(vllm, scheduler))
            count[0] += 1

        theirs = vllm_v1.run(workload, observe=observe if show_tables else None)
        ours = pagesim_steps.run(workload, "vllm-v1")
        share = identical_steps(ours, theirs) / max(len(ours), len(theirs), 1)
        k = first_divergence(ours, theirs)
        print(f"{name:<{wide}} {len(theirs):>10} {len(ours):>8} {share:>10.1%}  {'-' if k is None else k}")
        if k is not None:
            print(describe(k, ours, theirs))
        if lines:  # --tables: vLLM's records and block tables, step by step
            print("\n".join(lines))
    return 0


def peer_steps(peer, workload, ours: list) -> list:
    """The peer's steps over ``workload``; with speculative decoding, vLLM is given the drafts
    pagesim's run accepted at each step (``ours``: its steps), so both see the same acceptance."""
    if workload.num_speculative_tokens:
        return peer(workload, replay=ours)
    return peer(workload)


def assert_same_steps(name: str, workload, ours, theirs, peer: str = "vLLM") -> None:
    """The peer tests' check: every step of ``workload`` identical, else where they part."""
    k = first_divergence(ours, theirs)
    assert k is None, f"{name} ({workload.description}): {len(ours)} pagesim steps, {len(theirs)} {peer}'s\n" + \
        describe(k, ours, theirs, peer=peer)


def wrapped(text: str, indent: str = "      ", width: int = 100) -> list:
    """``text`` cut at spaces into lines of at most ``width`` columns, the later ones indented."""
    words = text.split(" ")
    lines, line = [], words.pop(0)
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = indent + word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line]


def step_record(k: int, step) -> list:
    """vLLM's record of step ``k`` in lines of at most 100 columns: the tokens scheduled per
    request, the preempted, the free blocks, the finished, and each running request's blocks
    per group (full attention first, then the Mamba groups: their state blocks held)."""
    scheduled = " ".join(f"{i}:{n}" for i, n in sorted(step.scheduled.items()))
    groups = " ".join(f"{i}:{'/'.join(map(str, held))}" for i, held in sorted(step.group_blocks.items()))
    text = (f"  {k:>3}".replace(" ", "\N{NO-BREAK SPACE}") + f" t={step.start_s:g} scheduled {scheduled} free {step.free_blocks}"
            + (f" preempted {sorted(step.preempted)}" if step.preempted else "")
            + (f" finished {sorted(step.finished)}" if step.finished else "")
            + f" | blocks {groups}")
    return [line.replace("\N{NO-BREAK SPACE}", " ") for line in wrapped(text)]


def mamba_prefix(names: list) -> int:
    """``--mamba-prefix``: per workload, pagesim's refusal (one line) or the comparison, then
    vLLM's steps."""
    for name in names or list(MAMBA_PREFIX_WORKLOADS):
        workload = MAMBA_PREFIX_WORKLOADS[name]
        theirs = vllm_v1.run(workload)
        print("\n".join(wrapped(f"{name}: {workload.description}", indent="  ")))
        try:
            ours = pagesim_steps.run(workload, "vllm-v1")
        except Exception as refusal:  # sim/run.py's hybrid_groups: gated-delta-net's checkpoints
            print("\n".join("  " + line for line in wrapped(f"pagesim refuses: {refusal}", indent="    ", width=98)))
        else:
            share = identical_steps(ours, theirs) / max(len(ours), len(theirs), 1)
            k = first_divergence(ours, theirs)
            print(f"  pagesim {len(ours)} steps, vLLM {len(theirs)}: {share:.1%} identical"
                  + ("" if k is None else f", first diverging step {k}"))
            if k is not None:
                print(describe(k, ours, theirs))
        print(f"  vLLM's {len(theirs)} steps (blocks per group: full/mamba/...):")
        for k, step in enumerate(theirs):
            print("\n".join(step_record(k, step)))
    return 0


def main(argv=None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if "--sglang-swa" in args:  # a probe, not a comparison: SGLang's SWA pool and cache alone
        from tests.peers import sglang_swa

        sglang_swa.main([a for a in args if a != "--sglang-swa"])
        return 0
    if "--sglang-hicache" in args:  # a probe, not a comparison: SGLang's host tier alone
        from tests.peers import sglang_hicache

        sglang_hicache.main([a for a in args if a != "--sglang-hicache"])
        return 0
    if "--sglang-hicache-side" in args:  # pagesim's host tier beside SGLang's, call by call
        from tests.peers import sglang_hicache_side

        runs = sglang_hicache_side.report([a for a in args if not a.startswith("--")] or None)
        return int(any(run.first is not None for run in runs))
    if "--mamba-prefix" in args:
        return mamba_prefix([a for a in args if not a.startswith("--")])
    if "--sglang-scheduler" in args:
        requests = [int(a.split("=", 1)[1]) for a in args if a.startswith("--mooncake-requests=")]
        return sglang_scheduler([a for a in args if not a.startswith("--")], *(requests or [200]))
    if "--sglang" in args:
        requests = [int(a.split("=", 1)[1]) for a in args if a.startswith("--mooncake-requests=")]
        return sglang([a for a in args if not a.startswith("--")], *(requests or [200]), "--checkpoint" in args)
    if "--groups-prefix" in args:
        return groups_prefix([a for a in args if not a.startswith("--")], "--tables" in args)
    # the peer, its workloads, and pagesim's system and settings for it
    if "--nano" in args:
        label, workloads, peer = "nano-vllm", NANO_WORKLOADS, nano_vllm.run
        system, overrides = "vllm", nano_vllm.PAGESIM_SETTINGS
    elif "--spec" in args or any(a.startswith(DRAWN_SPECULATIVE) for a in args):
        drawn = {a.split("=", 1)[0]: int(a.split("=", 1)[1]) for a in args if a.startswith(DRAWN_SPECULATIVE)}
        make = {"--spec-random": random_speculative, "--spec-prefix-random": random_speculative_prefix}
        workloads = ({w.name: w for option, n in drawn.items() for w in map(make[option], range(n))} if drawn
                     else SPECULATIVE_WORKLOADS)
        label, system, overrides = "vLLM", "vllm-v1", {}
        pad = "--no-padding" not in args
        peer = vllm_v1.run if pad else (lambda workload, **kw: vllm_v1.run(workload, pad_resumed=False, **kw))
    elif "--groups" in args or any(a.startswith(DRAWN_GROUPS) for a in args):
        drawn = {a.split("=", 1)[0]: int(a.split("=", 1)[1]) for a in args if a.startswith(DRAWN_GROUPS)}
        make = {"--groups-random": random_grouped, "--mamba-random": lambda k: random_grouped(k, mamba=True),
                "--groups-spec-random": random_grouped_speculative,
                "--mamba-spec-random": lambda k: random_grouped_speculative(k, mamba=True),
                "--groups-prefix-random": random_grouped_prefix}
        workloads = ({w.name: w for option, n in drawn.items() for w in map(make[option], range(n))} if drawn
                     else GROUP_WORKLOADS)
        label, peer, system, overrides = "vLLM", vllm_v1.run, "vllm-v1", {}
    elif any(a.startswith("--offload") for a in args):
        drawn = {a.split("=", 1)[0]: int(a.split("=", 1)[1]) for a in args if a.startswith(DRAWN_OFFLOAD)}
        make = {"--offload-random": random_offload, "--offload-spec-random": random_offload_speculative,
                "--offload-aligned-random": lambda k: random_offload(k, aligned=True),
                "--offload-spec-aligned-random": lambda k: random_offload_speculative(k, aligned=True)}
        workloads = ({w.name: w for option, n in drawn.items() for w in map(make[option], range(n))} if drawn
                     else OFFLOAD_SPECULATIVE_WORKLOADS if "--offload-spec" in args else OFFLOAD_WORKLOADS)
        label, system, overrides = "vLLM", "vllm-v1", {}
        deferred = "--deferred-stores" in args
        peer = lambda workload, **kw: vllm_offload.run(workload, deferred_stores=deferred, **kw)  # noqa: E731
    elif "--v0" in args:
        label, workloads, peer, system, overrides = "vLLM", V0_WORKLOADS, vllm_v0.run, "vllm", {}
    else:
        label, workloads, peer, system, overrides = "vLLM", WORKLOADS, vllm_v1.run, "vllm-v1", {}
    names = [a for a in args if not a.startswith("--")] or list(workloads)
    width = max(10, len("steps " + label))  # the peer's steps column
    wide = max(18, *map(len, names))  # the workloads' column
    print(f"{'workload':<{wide}} {'steps ' + label:>{width}} {'pagesim':>8} {'identical':>10}  first diverging step")
    details = []
    same = 0
    causes = collections.Counter()
    for name in names:
        workload = workloads[name]
        try:
            ours = pagesim_steps.run(workload, system, **overrides)
        except Exception as error:  # e.g. a setting this pagesim has not (priority, before it lands)
            try:
                theirs, what = f"{len(peer(workload))}", f"pagesim: {type(error).__name__}: {error}"
            except ValueError as refusal:  # vLLM refuses to start too (vllm_v1.kv_cache_config_of)
                theirs, what = "-", "both refuse to start"
                same += type(error).__name__ == "ConfigError"
                details.append(f"{name}: pagesim: {error}\n  vLLM: {str(refusal)[:90]}")
            print(f"{name:<{wide}} {theirs:>{width}} {'-':>8} {'-':>10}  {what}")
            continue
        theirs = peer_steps(peer, workload, ours)
        share = identical_steps(ours, theirs) / max(len(ours), len(theirs), 1)
        k = first_divergence(ours, theirs)
        print(f"{name:<{wide}} {len(theirs):>{width}} {len(ours):>8} {share:>10.1%}  {'-' if k is None else k}")
        same += k is None
        if k is not None:
            cause = f" (likely: {offload_cause(ours, theirs, k)})" if workload.host_blocks else ""
            details.append(f"{name}{cause}: {describe(k, ours, theirs, peer=label)}")
            causes[offload_cause(ours, theirs, k) if workload.host_blocks else "-"] += 1
    if any(a.startswith((*DRAWN_SPECULATIVE, *DRAWN_OFFLOAD, *DRAWN_GROUPS)) for a in args):
        print(f"{same} of {len(names)} identical on every step")
        if any(w.host_blocks for w in workloads.values()) and causes:
            print("the others' likely causes: " + ", ".join(f"{c} {n}" for c, n in causes.most_common()))
    for text in details:
        print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
