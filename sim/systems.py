"""The registry: every system ``--system`` names, its scheduler and memory manager, stated once.

The command line's choices, the configuration's validation (``sim.config``), the core's scheduler
kind (``sim.core.build``) and the systems table of the docs (``docs/guide/simulate.md``, checked
against :func:`markdown_table`) read it. A new system is an entry in :data:`SYSTEMS`; a new
scheduler, its policy file under ``sim/core/`` and an entry in :data:`SCHEDULERS`, with its
``schedule`` in ``sim.core.loop.schedule_iteration``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagesim.sim.core import state


@dataclass(frozen=True)
class Scheduler:
    """An iteration's policy: the core's function for it (``config[SCHEDULER_KIND]``), where its
    rules live and whose they are."""

    name: str
    core_kind: int
    files: str  # its policy under sim/core/
    follows: str  # the engine and release its rules are read from
    words: str  # the systems table's words


@dataclass(frozen=True)
class System:
    """A named combination: a memory manager, a scheduler and the settings it presets."""

    name: str
    manager: str
    scheduler: str
    presets: dict[str, Any] = field(default_factory=dict)
    memory: str = ""  # the systems table's words: the pool, and how memory is taken
    taken: str = ""

    def settings(self) -> dict[str, Any]:
        """What the preset sets: its manager, its scheduler, then its own settings."""
        return dict(manager=self.manager, scheduler=self.scheduler, **self.presets)


SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (
    Scheduler("static", state.STATIC, "static.py", "FasterTransformer's request-level batching",
              "static (request-level)"),
    Scheduler("orca", state.CONTINUOUS, "scheduler_vllm.py, scheduler_orca.py", "Orca (OSDI '22) as the vLLM paper ran it",
              "orca (iteration-level)"),
    Scheduler("vllm", state.CONTINUOUS, "scheduler_vllm.py", "vLLM 0.4.2 (v0)", "vllm (preemption)"),
    Scheduler("vllm-v1", state.V1, "scheduler_v1.py", "vLLM 0.33.0 (v1)", "vllm-v1 (one token budget, recompute)"),
    Scheduler("sglang", state.SGLANG, "scheduler_sglang.py", "SGLang 0.5",
              "sglang (prefill first, PrefillAdder budgets, retraction)"),
)}

#: the memory managers (sim/core/memory.py dispatches to each)
MANAGERS = ("static", "contiguous", "paged", "vattention")

#: vLLM's --scheduling-policy (vllm-v1): the waiting queue's order and a preemption's victim,
#: one file each (sim/core/policies.py)
SCHEDULING_POLICIES = {"fcfs": state.POLICY_FCFS, "priority": state.POLICY_PRIORITY}

SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("static", "static", "static", memory="static slots of `max_seq_len`", taken="one slot per request"),
    System("orca-max", "contiguous", "orca", dict(reservation="max", placement="buddy"),
           "contiguous", "`max_seq_len` / buddy"),
    System("orca-pow2", "contiguous", "orca", dict(reservation="pow2", placement="buddy"),
           "contiguous", "prompt + next pow2 ≥ output / buddy"),
    System("orca-oracle", "contiguous", "orca", dict(reservation="oracle", placement="buddy"),
           "contiguous", "prompt + true output / buddy"),
    System("vllm", "paged", "vllm", dict(block_size=16), "paged, block 16", "on demand"),
    System("token", "paged", "vllm", dict(block_size=1), "paged, block 1", "on demand"),
    System("vattention", "vattention", "vllm", memory="on-demand 64 KiB pages", taken="on demand"),
    # vLLM 0.33.0's defaults: block size 16 (config/cache.py:185), prefix caching on
    # (config/cache.py:257), watermark 0.0 (config/scheduler.py:196); the batch limits are
    # the GPU's (sim.config.v1_batch_defaults)
    System("vllm-v1", "paged", "vllm-v1", dict(block_size=16, prefix_caching=True, watermark=0.0),
           "paged, block 16, prefix caching on", "on demand, chunk by chunk"),
    # SGLang: page_size 1 (server_args.py), its radix cache always on (not the block-hash cache)
    System("sglang", "paged", "sglang", dict(block_size=1, watermark=0.0),
           "token pool, page 1, radix cache (RadixAttention)", "on demand, chunk by chunk"),
)}


def markdown_table() -> str:
    """The docs' systems table (``docs/guide/simulate.md``), from the registry."""
    rows = ["| system | memory manager | reservation / placement | scheduler |", "|---|---|---|---|"]
    seen: set[str] = set()
    for system in SYSTEMS.values():
        words = SCHEDULERS[system.scheduler].words
        scheduler = words if system.scheduler not in seen else system.scheduler
        seen.add(system.scheduler)
        rows.append(f"| `{system.name}` | {system.memory} | {system.taken} | {scheduler} |")
    return "\n".join(rows)
