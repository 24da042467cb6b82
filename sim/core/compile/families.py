"""The scheduler families: vLLM v0's and Orca's scheduler over paged memory, the same over
contiguous extents, static batching, vLLM v1, SGLang (``config[SCHEDULER_KIND]``). Each has a loop of
its own (``loop.loop_for``) and an entry to its scheduler (``loop.scheduler_entry_for``), which
the loop calls by address or inlines (:data:`SCHEDULER_BY_ADDRESS`), each cached apart
(``jit.py``) and keyed by the shared sources and the files only it compiles: the entry, its
scheduler's files, which no other core file imports (``tests/sim/core/test_jit_cache.py``
checks); a loop, the scheduler's files it compiles itself (:data:`LOOP_FILES`). So an edit of
vLLM v1's ``scheduler_v1.py`` recompiles its scheduler's entry alone, not its loop.

vLLM v0's and Orca's scheduler is one source (``scheduler_vllm.py``, ``scheduler_orca.py``)
compiled into two loops, one per memory manager: a loop compiles its own manager alone (``family``
a constant there, ``memory.py``), each in less time than one loop of both (docs/performance.md,
"The compiler's machinery"), and a sweep of both compiles them side by side
(``experiments/sweep.py``)."""

from __future__ import annotations

from pagesim.sim.core.state import CONTINUOUS, CONTINUOUS_CONTIGUOUS, SGLANG, STATIC, V1

#: each family's name (its loops' cache folder, its extension module's name, ``loop.run_<name>``)
FAMILIES = {CONTINUOUS: "continuous", CONTINUOUS_CONTIGUOUS: "contiguous", STATIC: "static", V1: "v1",
            SGLANG: "sglang"}
#: the files only one family compiles, its scheduler (the registry names the same per scheduler,
#: ``sim/systems.py``: tests/sim/test_systems.py checks)
FAMILY_FILES = {CONTINUOUS: ("sched/scheduler_vllm.py", "sched/scheduler_orca.py"),
                CONTINUOUS_CONTIGUOUS: ("sched/scheduler_vllm.py", "sched/scheduler_orca.py"),
                STATIC: ("sched/static.py",), V1: ("sched/scheduler_v1.py",), SGLANG: ("sched/scheduler_sglang.py",)}
#: whether the family's loop calls its scheduler by address (``loop.call_scheduler``) or inlines it:
#: vLLM v0's and Orca's is inlined (by address their engines were slower: their scheduler passes
#: the whole state to a call at every iteration; docs/performance.md)
SCHEDULER_BY_ADDRESS = {CONTINUOUS: False, CONTINUOUS_CONTIGUOUS: False, STATIC: True, V1: True, SGLANG: True}
#: of a family's files, what its loops compile themselves: static batching's loop ends a batch
#: (``static.complete_step``); a loop that inlines its scheduler, all; the others, none
LOOP_FILES = {CONTINUOUS: FAMILY_FILES[CONTINUOUS], CONTINUOUS_CONTIGUOUS: FAMILY_FILES[CONTINUOUS_CONTIGUOUS],
              STATIC: ("sched/static.py",), V1: (), SGLANG: ()}
#: each family's scheduler's cache group (``loop.scheduler_entry_for``), keyed by the family's files
SCHEDULER_GROUPS = {kind: f"{name}-scheduler" for kind, name in FAMILIES.items()}


def family_of(scheduler_kind: int, manager: str) -> int:
    """The family of a scheduler (its core kind, ``sim/systems.py``) over the memory manager named
    ``manager``: vLLM v0's and Orca's over contiguous extents is one of its own."""
    return CONTINUOUS_CONTIGUOUS if scheduler_kind == CONTINUOUS and manager == "contiguous" else scheduler_kind
