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

# -- what each family does: its traits, one bit each ---------------------------------------------
# The core branches on what a family does (``traits & SPECULATES``), never on its name. ``traits``
# is a constant where a family's code is compiled (its loop's closure, ``loop.loop_for``; its
# scheduler's entry; the calls made one per family, ``lifecycle.preempt_for``), passed down to the
# functions inlined there, so that numba prunes the code of what the family never does before it
# types it: numba's ``dead_branch_prune`` takes a branch on an operation of two constants, not on a
# function's returned value (a branch it cannot prune would compile every family's code into
# each). A run reads its family's traits at run time from ``config[FAMILY_TRAITS]`` (``build.py``).
# ``tests/sim/test_systems.py`` checks them against what the registry declares (``sim/systems.py``).
BLOCK_TABLE = 1 << 0  # the paged manager's blocks (kv_cache.py over block_pool.py, prefix_cache.py)
EXTENTS = 1 << 1  # the contiguous manager's extents (extent.py over placement.py): Orca's, static batching's
RADIX_TREE = 1 << 2  # SGLang's token pool under its radix tree (radix_cache.py)
WHOLE_BATCHES = 1 << 3  # a batch runs to its end, its requests ending together (static.py)
INLINED_SCHEDULER = 1 << 4  # its loop inlines its scheduler (:data:`SCHEDULER_BY_ADDRESS` False)
FORKS = 1 << 5  # a request's sequences fork from its one prefill (parallel sampling, beams: kv_cache.fork)
EVICTS_ANY_BLOCK = 1 << 6  # vLLM 0.4.2's prefix cache: every block let go is evictable (prefix_cache.v0_evictor)
CACHES_COMPUTED = 1 << 7  # its prefix cache keys a block once computed, a group's by group (vLLM v1's)
SPECULATES = 1 << 8  # speculative decoding (speculative.py)
KV_GROUPS = 1 << 9  # a KV cache group per attention type (kv_cache.py: sliding windows, Mamba states)
DISAGGREGATES = 1 << 10  # prefill and decode replicas joined by a KV connector (remote_kv.py)
HOST_LOADS = 1 << 11  # a request waits while its KV loads from a host tier (vLLM v1's: host_tier.py)
HOST_COPIES = 1 << 12  # a host tier's copies in and out of the step (SGLang's HiCache: radix_cache.py)
HOLDS_ARRIVED_KV = 1 << 13  # the waiting queue's holding part: requests holding blocks whose KV arrived
# (lifecycle.hold_waiting), which a pass admits first
PREEMPTING_PASS_ADMITS_NONE = 1 << 14  # a pass that preempted admits nobody (vLLM v1, scheduler.py:1050)

#: each family's traits
TRAITS = {
    CONTINUOUS: BLOCK_TABLE | INLINED_SCHEDULER | FORKS | EVICTS_ANY_BLOCK,
    CONTINUOUS_CONTIGUOUS: EXTENTS | INLINED_SCHEDULER | EVICTS_ANY_BLOCK,
    STATIC: EXTENTS | WHOLE_BATCHES,
    V1: (BLOCK_TABLE | CACHES_COMPUTED | SPECULATES | KV_GROUPS | DISAGGREGATES | HOST_LOADS | HOLDS_ARRIVED_KV
         | PREEMPTING_PASS_ADMITS_NONE),
    SGLANG: RADIX_TREE | HOST_COPIES,
}


def family_of(scheduler_kind: int, manager: str) -> int:
    """The family of a scheduler (its core kind, ``sim/systems.py``) over the memory manager named
    ``manager``: vLLM v0's and Orca's over contiguous extents is one of its own."""
    return CONTINUOUS_CONTIGUOUS if scheduler_kind == CONTINUOUS and manager == "contiguous" else scheduler_kind
