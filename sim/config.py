"""One dataclass holds a simulation's whole configuration; ``--system`` names fill it in.

The systems, their schedulers and memory managers are ``sim/systems.py``'s registry (its
``markdown_table`` is the docs' table of them). ``vllm`` is vLLM v0 (the 2023 paper's system);
``vllm-v1`` is vLLM v1's scheduler as of vLLM 0.33.0 (``sim/core/sched/scheduler_v1.py``): one token
budget per step, chunked prefill always, prefix caching on, no watermark, recompute preemption,
FCFS or priority scheduling, and its batch defaults by GPU (``systems.v1_batch_defaults``). ``sglang``
is SGLang's RadixAttention serving (v0.5 line; ``sim/core/kv/radix_cache.py``,
``sim/core/sched/scheduler_sglang.py``): a radix tree of cached tokens (page 1 by default:
``block_size`` is its ``page_size``), prefill first, its PrefillAdder's budgets
(``max_num_batched_tokens`` is its ``max_prefill_tokens``, ``chunk_budget`` its
``chunked_prefill_size``, ``max_num_seqs`` its ``max_running_requests``; ``systems.sglang_defaults``)
and retraction of decoding requests when memory runs out.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import types
import typing
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from pagesim.sim import systems
from pagesim.sim.core.compile.families import family_of
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.model import KV_CACHE_DTYPES

#: each system's settings (sim.systems.System.settings): what --system NAME fills in
SYSTEMS: dict[str, dict[str, Any]] = {name: system.settings() for name, system in systems.SYSTEMS.items()}
MANAGERS = tuple(systems.MANAGERS)
SCHEDULERS = tuple(systems.SCHEDULERS)
#: SGLang's schedule_policy: fcfs (server_args.py's default) or lpm (longest prefix match)
SCHEDULE_POLICIES = ("fcfs", "lpm")
#: vLLM's --scheduling-policy (vllm-v1), by name (sim.systems.SCHEDULING_POLICIES)
SCHEDULING_POLICIES = tuple(systems.SCHEDULING_POLICIES)
RESERVATIONS = ("max", "pow2", "oracle", "predicted")
PLACEMENTS = ("buddy", "first-fit", "best-fit")
PREEMPTIONS = ("recompute", "swap")
#: what a decode step needs free in the paged manager: vLLM v0's one free block per running
#: sequence (block_manager_v1.py, can_append_slots), or exactly the blocks the step takes
APPEND_RULES = ("free-block-per-seq", "exact")
COST_MODELS = ("roofline", "calibrated", "serving")
#: what happens to a request longer than max_seq_len (applied by traces/transform.py)
MAX_LEN_POLICIES = ("error", "drop", "truncate", "clip-prompt")
#: vAttention's physical page sizes per layer (CUDA's 2 MiB pages and the smaller pages its driver adds)
VATTENTION_PAGE_KIB = (64, 128, 256, 2048)
#: vLLM v1's speculative decoding methods modelled (sim/core/sched/speculative.py)
SPECULATIVE_METHODS = ("ngram", "draft-model", "eagle", "mtp")
#: the largest integer setting: counts beyond it overflow the int64 tables the engine keeps
MAX_INT_SETTING = 2**62
#: the settings that take one of a few values
CHOICES: dict[str, tuple] = {
    "system": (*SYSTEMS, "custom"), "manager": MANAGERS, "scheduler": SCHEDULERS, "reservation": RESERVATIONS,
    "placement": PLACEMENTS, "preemption": PREEMPTIONS, "append_rule": APPEND_RULES, "max_len_policy": MAX_LEN_POLICIES,
    "cost_model": COST_MODELS, "schedule_policy": SCHEDULE_POLICIES, "scheduling_policy": SCHEDULING_POLICIES,
    "vattention_page_kib": VATTENTION_PAGE_KIB, "kv_cache_dtype": KV_CACHE_DTYPES,
    "speculative_method": SPECULATIVE_METHODS,
}
#: numeric settings' ranges: (lowest, highest or None, whether the lowest itself is allowed, a value that works)
RANGES: dict[str, tuple] = {
    "block_size": (1, 256, True, 16), "max_num_seqs": (1, None, True, 256), "tensor_parallel": (1, None, True, 2),
    "chunk_budget": (1, None, True, 512), "static_batch_size": (1, None, True, 4),
    "max_num_batched_tokens": (1, None, True, 2048), "seed": (0, None, True, 0), "kv_gib": (0, None, False, 12),
    "swap_gib": (0, None, True, 4), "activation_reserve_gib": (0, None, True, 2),
    "predictor_error": (0, None, True, 0.3), "waiting_served_ratio": (0, None, True, 1.0),
    "step_overhead_ms": (0, None, True, 3), "client_timeout_s": (0, None, False, 300), "schedule_conservativeness": (0, None, False, 1.0), "cost_scale": (0, None, False, 1.1), "per_seq_overhead_ms": (0, None, True, 0.02),
    "num_speculative_tokens": (0, None, True, 3), "spec_acceptance_rate": (0, 1, True, 0.7),
    "kv_offload_gib": (0, None, True, 64), "data_parallel": (1, None, True, 2),
}


@dataclass
class SimConfig:
    """Everything one simulation run needs besides the trace."""

    # hardware and model
    model: str = "opt-13b"
    gpu: str = "a100-40gb"
    tensor_parallel: int = 1
    kv_gib: float | None = None  # KV pool size; None: derive from GPU memory
    gpu_memory_utilization: float = 0.9
    activation_reserve_gib: float = 2.0
    max_seq_len: int | None = None  # None: the model's max_position_embeddings
    kv_cache_dtype: str = "auto"  # vLLM's --kv-cache-dtype: auto (the model's dtype) or fp8 (1 byte)
    # a mixture of experts' routed experts split whole over the GPUs, as vLLM's
    # --enable-expert-parallel: the TP group's, times data_parallel engine ranks (expert_group)
    expert_parallel: bool = False
    # the engine ranks of that expert-parallel group (vLLM's --data-parallel-size): a cluster of K
    # replicas with expert_parallel sets K (sim.cluster.run_cluster); each rank's tokens meet the
    # other ranks' at every MoE layer (sim.core.cost.routed_expert_seconds)
    data_parallel: int = 1

    # system (memory manager + scheduler)
    system: str = "vllm"
    manager: str = "paged"
    scheduler: str = "vllm"
    block_size: int = 16
    reservation: str = "max"
    placement: str = "buddy"
    predictor_error: float = 0.3  # relative std of the Predicted reservation's length predictor
    vattention_page_kib: int = 64  # physical page per layer (64 KiB or 2048 KiB)
    watermark: float = 0.01  # vLLM: keep this fraction of blocks free when admitting
    append_rule: str = "free-block-per-seq"  # paged decode steps: APPEND_RULES
    prefix_caching: bool = False
    static_batch_size: int | None = None  # static: B (None: as many max_seq_len slots as fit)

    # scheduler knobs
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: max(max_seq_len, 2048)
    preemption: str = "recompute"
    swap_gib: float = 4.0  # CPU swap space
    chunked_prefill: bool = False
    chunk_budget: int = 512  # chunked prefill: tokens per iteration (decodes + prefill chunks)
    waiting_served_ratio: float | None = None
    schedule_policy: str = "fcfs"  # sglang: fcfs or lpm (SCHEDULE_POLICIES)
    scheduling_policy: str = systems.DEFAULT_POLICY  # vllm-v1's (SCHEDULING_POLICIES)
    schedule_conservativeness: float = 1.0  # sglang: scales its initial new_token_ratio (0.7)
    # sglang: requests carry ignore_eos, as benchmark clients send them (sglang.bench_serving) and
    # as the trace's output lengths say (each runs to its max_new_tokens): the prefill budget
    # charges a running request's remaining output whole (schedule_policy.py:785-794). False: they
    # might stop at EOS earlier, charged at new_token_ratio. None: the default, on
    ignore_eos: bool | None = None
    # vllm-v1: schedule step N+1 while step N runs (vLLM's --async-scheduling, on by default in
    # vLLM; sim/core/sched/scheduler_v1.py). None: the system's default (on for vllm-v1)
    async_scheduling: bool | None = None
    # vllm-v1: a client gives up on its request after this many seconds, and the engine aborts it
    # (sim/core/sched/scheduler_v1.py). None: clients wait forever
    client_timeout_s: float | None = None
    # vllm-v1 speculative decoding (sim/core/sched/speculative.py): drafts per step (0: off), how they
    # are proposed, and the chance each draft position is accepted once those before it were (one
    # rate, or one per position: "0.8,0.6,0.5"); a draft model's preset for the draft-model method
    num_speculative_tokens: int = 0
    speculative_method: str = "ngram"
    spec_acceptance_rate: float = 0.7
    spec_acceptance_rates: str | None = None
    draft_model: str | None = None
    # vllm-v1's CPU offload tier (vLLM's --kv-offloading-size; sim/core/kv/host_tier.py), or sglang's
    # host tier (HiCache's L2, its --hicache-size; sim/core/kv/radix_cache.py): host memory in GiB for KV,
    # over the tensor-parallel GPUs (0: none)
    kv_offload_gib: float = 0.0

    # cost model
    # roofline, calibrated (sim/cost/calibrated.py) or serving (sim/cost/serving.py); a profile means
    # the table model. None: the scheduler's default (default_cost_model)
    cost_model: str | None = None
    cost_scale: float = 1.0  # the cost model's GPU time x this (plan's error band: calibration.gpu_time_scales)
    profile: str | None = None  # profile CSV for the table cost model
    step_overhead_ms: float | None = None  # None: cost-model default (roofline: 3 ms)
    per_seq_overhead_ms: float | None = None  # None: cost-model default (roofline: 0.02 ms)

    # run
    seed: int = 0
    max_len_policy: str = "error"  # requests longer than max_seq_len (traces.transform.apply_max_len_policy)
    check: bool = False  # assert invariants every step (slow)
    record_steps: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.cost_model is None:
            self.cost_model = default_cost_model(self.scheduler, self.profile)
        for f in dataclasses.fields(self):
            problem = setting_problem(f.name, getattr(self, f.name))
            if problem:
                raise ConfigError(problem)
        if not 0 <= self.watermark < 1:  # a fraction of the blocks kept free: all of them would admit nobody
            raise ConfigError(f"watermark must be in [0, 1), got {self.watermark} (vLLM uses 0.01)")
        if self.profile and self.cost_model != "roofline":
            raise ConfigError(f"a profile selects the table cost model; drop --cost-model {self.cost_model} "
                              "or the profile")
        if self.data_parallel > 1 and not self.expert_parallel:
            raise ConfigError(f"data_parallel={self.data_parallel} is the engine ranks of an expert-parallel group: "
                              "give --expert-parallel with --replicas K (each replica one rank)")
        if self.max_seq_len is not None:
            self.check_batched_tokens(self.max_seq_len)
        self.check_scheduler()
        self.check_speculative()

    def check_speculative(self) -> None:
        """Speculative decoding's settings between themselves (vllm-v1 alone takes them: the
        registry's refusal, ``check_scheduler``)."""
        k = self.num_speculative_tokens
        if self.spec_acceptance_rates is not None:
            try:
                rates = [float(x) for x in self.spec_acceptance_rates.split(",")]
            except ValueError:
                rates = []
            if len(rates) != k or not all(0 <= r <= 1 for r in rates):
                raise ConfigError(f"spec_acceptance_rates takes {k} comma-separated rates in [0, 1], one per "
                                  f"draft position (num_speculative_tokens={k}), got '{self.spec_acceptance_rates}'")
        if (self.speculative_method == "draft-model") != (self.draft_model is not None) and k:
            raise ConfigError("speculative_method draft-model needs --draft-model PRESET (the draft's model), "
                              "and --draft-model needs --speculative-method draft-model")
        budget = self.max_num_batched_tokens
        if k and self.speculative_method != "ngram" and budget is not None and budget <= k:
            # vllm/config/vllm.py:2369-2377: a token and the lookahead slots must fit
            raise ConfigError(f"max_num_batched_tokens={budget} must exceed num_speculative_tokens={k} (the "
                              "drafter's lookahead slots), as vLLM requires")

    def check_scheduler(self) -> None:
        """What the scheduler cannot run (``sim.systems``' registry states it): one line each."""
        scheduler = systems.SCHEDULERS[self.scheduler]
        if self.manager not in scheduler.managers:
            needs = repr(scheduler.managers[0]) if len(scheduler.managers) == 1 else \
                "one of " + ", ".join(map(repr, scheduler.managers))
            raise ConfigError(f"scheduler '{self.scheduler}' needs manager {needs}, got '{self.manager}'")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for other in systems.SCHEDULERS.values():
            for name in other.exclusive:
                value = getattr(self, name)
                if name not in scheduler.owned and value not in (None, False, defaults[name]):
                    raise ConfigError(f"{name}={value!r} applies to {systems.where_it_applies(name)} alone; "
                                      f"scheduler '{self.scheduler}' has none: drop it")
        for refusal in scheduler.refuses:
            if refusal.refused(self):
                raise ConfigError(refusal.why.format(c=self))

    def check_batched_tokens(self, max_seq_len: int) -> None:
        """vLLM's rule: without chunked prefill a prompt must fit in one iteration's token budget,
        so ``max_num_batched_tokens`` below ``max_seq_len`` would reject every longer request."""
        budget = self.max_num_batched_tokens
        chunked = self.chunked_prefill or systems.SCHEDULERS[self.scheduler].always_chunks
        if budget is not None and not chunked and budget < max_seq_len:
            raise ConfigError(f"max_num_batched_tokens={budget} is smaller than max_seq_len={max_seq_len}: "
                              f"longer prompts could never be scheduled; use max_num_batched_tokens >= "
                              f"{max_seq_len} or chunked_prefill")

    def check_token_pairs(self, max_seq_len: int, capacity_tokens: int) -> None:
        """An iteration's prefill attention is priced from sum(n * (2b + n)) over its prompts (n new
        tokens after b cached, b + n <= max_seq_len; sim/core/events/loop.py step_time), an int64: at most
        twice the iteration's prompt tokens times max_seq_len, which must stay below 2**63. The
        prompt tokens of an iteration are bounded by its token budget and by the KV pool (static
        batching's padded prefill, B x the longest prompt, by the pool alone)."""
        if self.capabilities.padded_prefill:
            tokens, what = capacity_tokens, "the KV pool's tokens (a static batch's padded prefill)"
        elif self.chunked_prefill:
            tokens, what = min(self.chunk_budget, capacity_tokens), "chunk_budget"
        else:
            tokens, what = min(self.max_num_batched_tokens or max(max_seq_len, 2048), capacity_tokens), \
                "max_num_batched_tokens"
        if 2 * tokens * max_seq_len >= 2**63:
            raise ConfigError(f"max_seq_len={max_seq_len} with up to {tokens} prompt tokens per iteration ({what}) "
                              "overflows the prefill attention's token-pair count (2 x tokens x max_seq_len must be "
                              f"below 2**63); use a max_seq_len below {2**62 // tokens} or fewer tokens per iteration")

    @property
    def expert_group(self) -> int:
        """The GPUs a mixture of experts' routed experts are split among whole: the TP group's
        times the data-parallel ranks under ``expert_parallel`` (vLLM's EP size, the TP size
        flattened over the ranks: ``FusedMoEParallelConfig.make``, fused_moe/config.py of vLLM
        0.33.0, lines 1198-1230); 1 otherwise (each expert TP-sharded)."""
        return self.tensor_parallel * self.data_parallel if self.expert_parallel else 1

    @property
    def kernel_block_tokens(self) -> int:
        """The block the decode attention kernel reads K/V in, block by block: vLLM v0's
        PagedAttention kernel under the vllm scheduler on a paged cache (``sim.core.cost``:
        whole blocks, and work per block). 0 for the other kernels: FasterTransformer's over a
        contiguous cache, and today's FlashAttention / FlashInfer of vllm-v1 and SGLang, which
        read each cached token once and are priced per token."""
        return self.block_size if self.manager == "paged" and self.capabilities.reads_whole_blocks else 0

    @property
    def family(self) -> int:
        """The core's scheduler family that runs it (its compiled loop: ``sim/core/compile/families.py``)."""
        return family_of(self.capabilities.core_kind, self.manager)

    @property
    def capabilities(self) -> "systems.Scheduler":
        """Its scheduler's entry in the registry (``sim.systems.SCHEDULERS``): what it does, which
        the layers above branch on instead of its name."""
        return systems.SCHEDULERS[self.scheduler]

    @property
    def label(self) -> str:
        """What ran, in words: the preset's name, or the parts of a custom combination."""
        if self.system != "custom":
            return self.system
        parts = [f"{self.manager} manager", f"{self.scheduler} scheduler"]
        if self.manager == "contiguous":
            parts += [f"{self.reservation} reservation", f"{self.placement} placement"]
        return "custom: " + ", ".join(parts)

    @classmethod
    def for_system(cls, system: str = "vllm", **overrides: Any) -> "SimConfig":
        """The preset for ``system``, then ``overrides`` (``None`` values are ignored)."""
        if system not in SYSTEMS:
            raise ConfigError(f"unknown system '{system}'; valid systems: {', '.join(SYSTEMS)}")
        fields = {f.name for f in dataclasses.fields(cls)}
        bad = [k for k in overrides if k not in fields]
        if bad:
            raise ConfigError(f"unknown setting(s) {', '.join(bad)}; valid: {', '.join(sorted(fields))}")
        values = dict(SYSTEMS[system])
        values.update({k: v for k, v in overrides.items() if v is not None})
        scheduler = systems.SCHEDULERS.get(values.get("scheduler"))
        if scheduler is not None and scheduler.batch_defaults is not None:  # the engine's, by GPU
            for name, default in scheduler.batch_defaults(values.get("gpu", cls.gpu)).items():
                values.setdefault(name, default)
        return cls(system=matching_system(system, values), **values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "SimConfig":
        return replace(self, **changes)


def matching_system(requested: str, values: dict[str, Any]) -> str:
    """The preset that ``values`` (a preset's settings after overrides) still are: ``requested``
    if its parts are unchanged, else another preset with the same parts, else ``custom``. The
    parts are the manager and the scheduler, and a contiguous manager's reservation and placement;
    knobs such as the block size keep the name."""
    def parts(settings):
        keys = ("manager", "scheduler") + (("reservation", "placement")
                                           if settings.get("manager") == "contiguous" else ())
        defaults = {f.name: f.default for f in dataclasses.fields(SimConfig)}
        return tuple(settings.get(k, defaults[k]) for k in keys)
    ran = parts(values)
    for name in [requested, *SYSTEMS]:
        if parts(SYSTEMS[name]) == ran:
            return name
    return "custom"


@lru_cache(maxsize=1)
def _setting_kinds() -> dict[str, tuple[type, bool]]:
    """Each SimConfig field's base type (bool, int, float or str) and whether it may be None."""
    kinds = {}
    for name, hint in typing.get_type_hints(SimConfig).items():
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        base = next(a for a in args if a is not type(None))
        kinds[name] = (base, type(None) in args)
    return kinds


_KIND_WORDS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}


def setting_type_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the setting ``name`` (its type, or a non-finite number, or an
    integer beyond :data:`MAX_INT_SETTING`), or None when it can. ``true`` is not an integer and
    ``"false"`` is not a boolean: TOML and JSON spell booleans and numbers without quotes."""
    base, optional = _setting_kinds()[name]
    if value is None:
        return None if optional else f"{name} must be {_KIND_WORDS[base]}, got nothing"
    is_bool = isinstance(value, (bool, np.bool_))
    if base is bool:
        ok = is_bool
    elif base is int:
        ok = isinstance(value, numbers.Integral) and not is_bool
    elif base is float:
        ok = isinstance(value, numbers.Real) and not is_bool
    else:
        ok = isinstance(value, base)
    if not ok:
        return f"{name} must be {_KIND_WORDS[base]}, got {value!r} ({type(value).__name__})"
    if base is float and not math.isfinite(value):
        return f"{name} must be a finite number, got {value}"
    if base is int and abs(value) > MAX_INT_SETTING:
        return f"{name} must be at most {MAX_INT_SETTING:.3g}, got {value}"
    return None


def default_cost_model(scheduler: str, profile: str | None = None) -> str:
    """The cost model a run gets unless it names one (its scheduler's, ``sim.systems``): the one
    measured closest to real runs of its engine. vLLM v1: ``serving``, fitted on real vLLM v1
    serving runs (docs/accuracy.md: median |error| of their mean E2E 5.1 % held out, the
    roofline's 21.5 %); SGLang, whose step shares that physics, too, its band saying no SGLang
    run measured it. The paper's engines (vLLM v0, Orca, static batching) have no real runs to
    choose by: the roofline, as the paper's figures have always run. A profile selects the table
    model."""
    known = systems.SCHEDULERS.get(scheduler)  # (an unknown one is refused with the other settings)
    return known.cost_model if known is not None and not profile else "roofline"


def setting_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the setting ``name`` on its own (its type, :data:`CHOICES`,
    :data:`RANGES`), or None; rules between settings are :meth:`SimConfig.validate`'s."""
    problem = setting_type_problem(name, value)
    if problem or value is None:
        return problem
    if name in CHOICES and value not in CHOICES[name]:
        return f"unknown {name} '{value}'; valid: {', '.join(map(str, CHOICES[name]))}"
    if name in RANGES:
        low, high, inclusive, example = RANGES[name]
        if not (value >= low if inclusive else value > low):
            return f"{name} must be {'>=' if inclusive else '>'} {low}, got {value} (e.g. {example})"
        if high is not None and value > high:
            return f"{name} must be <= {high}, got {value} (e.g. {example})"
    return None


def unknown_setting_message(key: str, known) -> str:
    """``unknown setting 'blok_size'; did you mean 'block_size'?`` (difflib's closest known key),
    or the list of known keys when none is close."""
    close = difflib.get_close_matches(key, list(known), n=1)
    if close:
        return f"unknown setting '{key}'; did you mean '{close[0]}'?"
    return f"unknown setting '{key}'; valid: {', '.join(sorted(known))}"


def read_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A TOML file as a dict; ConfigError naming the file (``what`` it is) when missing or invalid."""
    try:
        import tomllib  # py >= 3.11
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib
    path = Path(path)
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a TOML text file (byte {e.start} is not UTF-8)") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e})") from None


#: SimConfig fields a run sets for itself, not a user: the data-parallel ranks of an
#: expert-parallel group are the cluster's replicas (sim.cluster.replica_groups sets them)
SET_BY_THE_RUN = {"data_parallel": "data_parallel is the replicas of an expert-parallel group: give "
                                   "--expert-parallel with --replicas K"}


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a ``--config`` TOML file into a flat dict of SimConfig settings (dashes become
    underscores; an optional ``[simulation]`` table holds the same keys as the top level).

    Every key must be a SimConfig field and every value one that field takes
    (:func:`setting_problem`); otherwise one line names the file, the key and, for an
    unknown key, the closest known one. Workload options (rate, duration, ...) are command-line
    flags, not settings of this file."""
    data = read_toml(path)
    flat: dict[str, Any] = {}
    for k, v in data.items():
        if k == "simulation" and isinstance(v, dict):
            flat.update({kk.replace("-", "_"): vv for kk, vv in v.items()})
        else:
            flat[k.replace("-", "_")] = v
    known = {f.name for f in dataclasses.fields(SimConfig)} - set(SET_BY_THE_RUN)
    for key, value in flat.items():
        problem = SET_BY_THE_RUN.get(key) or (setting_problem(key, value) if key in known
                                                else unknown_setting_message(key, known))
        if problem:
            raise ConfigError(f"{path}: {problem}")
    return flat
