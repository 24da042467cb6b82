"""The registry: every system ``--system`` names, its scheduler and memory manager, and the
settings each takes or refuses, stated once.

The command line's choices and its refusal of a flag that does nothing (``sim.args``), the
configuration's validation (``sim.config``), the core's scheduler kind (``sim.core.build``), the
planner's what-if variants (``experiments.plan``) and the systems table of the docs
(``docs/guide/simulate.md``, checked against :func:`markdown_table`) read it. A new system is an
entry in :data:`SYSTEMS`; a new scheduler, its policy file under ``sim/core/`` and an entry in
:data:`SCHEDULERS`, with its ``schedule`` chosen in ``sim.core.loop.loop_for``'s loop. Nothing
outside this file names a scheduler: the layers above read what its entry declares it does
(:class:`Scheduler`'s fields; ``SimConfig.capabilities``; ``tests/test_registry_names.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pagesim.sim.core import state
from pagesim.sim.core.compile.families import family_of
from pagesim.sim.specs import GiB, get_gpu


@dataclass(frozen=True)
class Refusal:
    """A configuration a scheduler cannot run: the test, and the one line that says why (its
    ``{c.name}`` the configuration's values)."""

    refused: Callable[[Any], bool]  # of the SimConfig
    why: str


@dataclass(frozen=True)
class Scheduler:
    """An iteration's policy: the core's function for it (``config[SCHEDULER_KIND]``), where its
    rules live and whose they are, the managers it runs over, and its settings: ``settings`` are
    its own (a flag giving one to another scheduler is refused: it would do nothing there),
    ``exclusive`` its own that the configuration refuses elsewhere even from Python (ignored, they
    would change what a run measures unseen), ``refuses`` what it cannot run."""

    name: str
    core_kind: int
    files: str  # its policy under sim/core/
    follows: str  # the engine and release its rules are read from
    words: str  # the systems table's words
    managers: tuple[str, ...]
    settings: tuple[str, ...] = ()
    exclusive: tuple[str, ...] = ()
    refuses: tuple[Refusal, ...] = ()
    batch_defaults: Callable[[str], dict[str, int]] | None = None  # the engine's, by GPU, where unset
    cost_model: str = "roofline"  # its default (sim.config.default_cost_model)
    always_chunks: bool = False  # prompts are chunked by a token budget whatever --chunked-prefill says
    # what it does that the layers above branch on (never on its name):
    radix_cache: bool = False  # caches prefixes in a radix tree of its own, always (SGLang's RadixCache)
    host_tier_pages: bool = False  # --kv-offload-gib is a host pool of pages of its own (SGLang's HiCache)
    kv_groups: bool = False  # a KV cache group per attention type: sliding windows, Mamba states (vLLM v1)
    async_scheduling: bool = False  # schedules step N + 1 while step N runs, unless told not to (vLLM v1)
    disaggregates: bool = False  # prefill and decode replicas joined by a KV connector (vLLM v1's)
    one_sequence_per_request: str = ""  # why n / beam_width > 1 is refused, where it runs one sequence each
    reads_whole_blocks: bool = False  # its decode kernel reads whole blocks of a paged cache (vLLM 0.4.2's)
    padded_prefill: bool = False  # a batch's prefill is padded to its longest prompt (FasterTransformer's)

    @property
    def owned(self) -> tuple[str, ...]:
        return self.settings + self.exclusive

    @property
    def swaps(self) -> bool:
        """Whether it swaps preempted requests to the CPU: with ``--preemption swap``, and a
        request of several sequences whatever the setting (vLLM 0.4.2 cannot recompute a
        group: ``vllm/core/scheduler.py:1047-1060``), into ``--swap-gib``."""
        return self.core_kind == state.CONTINUOUS


@dataclass(frozen=True)
class Manager:
    """A memory manager (sim/core/kv/memory.py dispatches to each) and the settings it alone takes."""

    name: str
    settings: tuple[str, ...] = ()

    @property
    def owned(self) -> tuple[str, ...]:
        return self.settings


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

    @property
    def family(self) -> int:
        """The core's scheduler family (its compiled loop: ``sim/core/compile/families.py``)."""
        return family_of(SCHEDULERS[self.scheduler].core_kind, self.manager)


def v1_batch_defaults(gpu: str) -> dict[str, int]:
    """vLLM v1's ``max_num_batched_tokens`` and ``max_num_seqs`` when the user sets neither, for
    the OpenAI API server (``vllm serve``) on ``gpu`` (vLLM 0.33.0, vllm/engine/arg_utils.py:2973-3006,
    ``EngineArgs.get_batch_defaults``): 16384 and 1024 from 160 GiB of memory; 8192 and 1024
    from 70 GiB but on an A100; else 2048 and 256."""
    spec = get_gpu(gpu)
    if spec.mem_bytes >= 160 * GiB:
        tokens, seqs = 16384, 1024
    elif spec.mem_bytes >= 70 * GiB and "a100" not in spec.name:
        tokens, seqs = 8192, 1024
    else:
        tokens, seqs = 2048, 256
    return dict(max_num_batched_tokens=tokens, max_num_seqs=seqs)


def sglang_defaults(gpu: str) -> dict[str, int]:
    """SGLang's ``max_prefill_tokens`` (16384, server_args.py), ``chunked_prefill_size`` by the
    GPU's memory (server_args.py ``_handle_gpu_memory_settings``: 2048 below 35 GB, 4096 below
    60 GB, 8192 below 160 GB, else 16384) and ``max_running_requests``: 4096, what SGLang derives
    (model_runner.py: ``min(max(pool tokens / context length * 512, 2048), 4096)``) for any pool
    of eight or more full contexts."""
    mem_gb = get_gpu(gpu).mem_bytes / 1e9
    chunk = 2048 if mem_gb < 35 else 4096 if mem_gb < 60 else 8192 if mem_gb < 160 else 16384
    return dict(max_num_batched_tokens=16384, chunk_budget=chunk, max_num_seqs=4096)


def _recompute_only(scheduler: str, why: str) -> Refusal:
    return Refusal(lambda c: c.preemption != "recompute", f"{scheduler} {why}; drop --preemption swap")


ITERATION_MANAGERS = ("contiguous", "paged", "vattention")
#: vllm-v1's speculative decoding (sim/core/sched/speculative.py): K, then what applies once K > 0
SPECULATIVE_SETTINGS = ("num_speculative_tokens", "speculative_method", "spec_acceptance_rate",
                        "spec_acceptance_rates", "draft_model")

SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (
    Scheduler("static", state.STATIC, "sched/static.py", "FasterTransformer's request-level batching",
              "static (request-level)", managers=("static",), settings=("static_batch_size",),
              refuses=(_recompute_only("static batching", "never preempts (a batch holds its slots to its end)"),),
              padded_prefill=True),
    Scheduler("orca", state.CONTINUOUS, "sched/scheduler_vllm.py, sched/scheduler_orca.py", "Orca (OSDI '22) as the vLLM paper ran it",
              "orca (iteration-level)", ITERATION_MANAGERS, settings=("chunked_prefill",)),
    Scheduler("vllm", state.CONTINUOUS, "sched/scheduler_vllm.py", "vLLM 0.4.2 (v0)", "vllm (preemption)", ITERATION_MANAGERS,
              settings=("chunked_prefill",), reads_whole_blocks=True),
    Scheduler("vllm-v1", state.V1, "sched/scheduler_v1.py", "vLLM 0.33.0 (v1)", "vllm-v1 (one token budget, recompute)",
              ("paged",), exclusive=("async_scheduling", "client_timeout_s", "scheduling_policy",
                                     *SPECULATIVE_SETTINGS, "kv_offload_gib", "expert_parallel"), refuses=(
                  _recompute_only("vllm-v1", "preempts by recompute only (vLLM v1 has no swap preemption)"),
                  Refusal(lambda c: c.waiting_served_ratio is not None,
                          "waiting_served_ratio is not a vLLM v1 setting; drop it with vllm-v1"),
                  # vllm/config/scheduler.py:331
                  Refusal(lambda c: c.max_num_batched_tokens is not None and c.max_num_batched_tokens < c.max_num_seqs,
                          "max_num_batched_tokens={c.max_num_batched_tokens} must be >= "
                          "max_num_seqs={c.max_num_seqs} (vLLM v1 refuses it)"),
                  # the CPU offload tier (sim/core/kv/host_tier.py) is keyed by the prefix cache's hashes
                  Refusal(lambda c: c.kv_offload_gib and not c.prefix_caching,
                          "--kv-offload-gib needs prefix caching (its tier is keyed by block hash)"),
                  Refusal(lambda c: c.kv_offload_gib and c.client_timeout_s,
                          "--kv-offload-gib with --client-timeout is not modelled; drop one"),
                  Refusal(lambda c: c.kv_offload_gib and c.num_speculative_tokens and c.speculative_method in (
                      "eagle", "mtp"), "--kv-offload-gib with EAGLE or MTP drafts is not modelled (vLLM keeps the "
                      "drafter's trailing block off the tier); use ngram or draft-model")),
              # its cost model: fitted on real vLLM v1 serving runs (docs/accuracy.md)
              batch_defaults=v1_batch_defaults, cost_model="serving", always_chunks=True, kv_groups=True,
              async_scheduling=True, disaggregates=True,
              one_sequence_per_request="vllm-v1 runs one sequence per request here (n = beam_width = 1; vLLM v1 fans "
                                       "n out into requests)"),
    Scheduler("sglang", state.SGLANG, "sched/scheduler_sglang.py", "SGLang 0.5",
              "sglang (prefill first, PrefillAdder budgets, retraction)", ("paged",),
              # kv_offload_gib: its host tier, HiCache's L2 (sim/core/kv/radix_cache.py)
              settings=("schedule_policy", "schedule_conservativeness", "ignore_eos"), exclusive=("kv_offload_gib",),
              refuses=(
                  _recompute_only("sglang", "retracts requests for recompute (no swap preemption)"),
                  Refusal(lambda c: c.prefix_caching,
                          "sglang caches prefixes in its radix tree, always; drop --prefix-caching "
                          "(vLLM's block-hash cache)"),
                  Refusal(lambda c: c.waiting_served_ratio is not None or c.chunked_prefill,
                          "waiting_served_ratio and --chunked-prefill are not SGLang settings (it always chunks "
                          "by chunk_budget, its chunked_prefill_size); drop them with sglang"),
                  # sglang 0.5.23 python/sglang/srt/arg_groups/validation_hook.py:244: a chunk is cut to
                  # whole pages (schedule_policy.py:1665), so a smaller one would never be scheduled
                  Refusal(lambda c: c.chunk_budget is not None and c.chunk_budget % c.block_size != 0,
                          "sglang: --chunk-budget {c.chunk_budget} (its chunked_prefill_size) must be a multiple "
                          "of --page-size {c.block_size}, as SGLang requires")),
              # its cost model: the one fitted on real vLLM v1 runs, whose physics SGLang's step shares (CUDA
              # graphs over the decode batch, FlashInfer's paged kernels reading each token once, the scheduler
              # overlapped with the GPU); no SGLang run measured it, which its band says (sim/cost/regime.py)
              batch_defaults=sglang_defaults, always_chunks=True, radix_cache=True, host_tier_pages=True,
              cost_model="serving"),
)}

#: the memory managers (sim/core/kv/memory.py dispatches to each)
MANAGERS: dict[str, Manager] = {m.name: m for m in (
    Manager("static"),
    Manager("contiguous", settings=("reservation", "placement")),
    Manager("paged", settings=("block_size", "prefix_caching")),
    Manager("vattention", settings=("vattention_page_kib",)),
)}

#: settings that take effect only with another's value: (the test, where it applies in words)
CONDITIONAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "predictor_error": (lambda c: c.manager == "contiguous" and c.reservation == "predicted",
                        "--reservation predicted"),
    "swap_gib": (lambda c: SCHEDULERS[c.scheduler].swaps, "the vllm and orca schedulers"),
    "chunk_budget": (lambda c: (c.chunked_prefill and "chunked_prefill" in SCHEDULERS[c.scheduler].settings)
                     or c.scheduler == "sglang", "--chunked-prefill with the vllm or orca scheduler, or sglang"),
    **{name: (lambda c: c.scheduler == "vllm-v1" and c.num_speculative_tokens > 0,
              "--num-speculative-tokens > 0 with vllm-v1") for name in SPECULATIVE_SETTINGS[1:]},
}


def owners(setting: str) -> tuple[str, list[str]] | None:
    """``("manager" | "scheduler", names)`` for a setting some managers or schedulers alone take."""
    for kind, table in (("manager", MANAGERS), ("scheduler", SCHEDULERS)):
        names = [x.name for x in table.values() if setting in x.owned]
        if names:
            return kind, names
    return None


def applies(cfg, setting: str) -> bool:
    """Whether ``setting`` does something for the configuration ``cfg`` (every setting not
    named by the registry does)."""
    if setting in CONDITIONAL:
        return CONDITIONAL[setting][0](cfg)
    owned = owners(setting)
    return owned is None or getattr(cfg, owned[0]) in owned[1]


def where_it_applies(setting: str) -> str:
    """Where ``setting`` applies, in words: its owners and the systems built on them."""
    if setting in CONDITIONAL:
        return CONDITIONAL[setting][1]
    kind, names = owners(setting)
    systems = ", ".join(s.name for s in SYSTEMS.values() if getattr(s, kind) in names)
    return f"the {' or '.join(names)} {kind} (--system {systems})"


def placed_settings() -> list[str]:
    """The settings that apply somewhere only (``sim.args`` refuses such a flag elsewhere)."""
    owned = {name for table in (MANAGERS, SCHEDULERS) for x in table.values() for name in x.owned}
    return sorted(owned | set(CONDITIONAL))


@dataclass(frozen=True)
class Policy:
    """A scheduling policy (vLLM's --scheduling-policy, vllm-v1): the waiting queue's order and a
    preemption's victim, in the core's file ``file`` (``sim/core/sched/<file>.py``, implementing
    ``sim/core/sched/policies.py``'s interface); its rule in words (``--help``); the trace's
    column its order reads, where it reads one (the summary groups requests by it)."""

    file: str
    words: str
    orders_by: str | None = None


#: the scheduling policies by name; a run's ``config[SCHEDULING_POLICY]`` is its place here. The
#: first, FCFS, every run's default, is inlined into every loop; the others are compiled apart,
#: each by its own file
SCHEDULING_POLICIES = {
    "fcfs": Policy("policy_fcfs", "vLLM's default: arrival order, a preempted request back in front"),
    "priority": Policy("policy_priority", "by the trace's priority column (lower first), then arrival; a "
                                          "preemption takes the running request with the largest (priority, "
                                          "arrival)", orders_by="priority"),
    "sjf": Policy("policy_sjf", "shortest prompt first, then arrival; a preemption takes the latest admitted"),
}
#: every run's policy unless it names one: the first (inlined)
DEFAULT_POLICY = next(iter(SCHEDULING_POLICIES))

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
    # the GPU's (v1_batch_defaults)
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


def settings_table() -> str:
    """The docs' table of where each setting applies (``docs/guide/simulate.md``), from the registry."""
    rows = ["| setting | applies to |", "|---|---|"]
    rows += [f"| `{name}` | {where_it_applies(name)} |" for name in placed_settings()]
    return "\n".join(rows)
