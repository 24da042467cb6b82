"""One dataclass holds a simulation's whole configuration; ``--system`` names fill it in.

Systems (what users think in) and what each sets; any field can still be set separately:

============  ===================  ===========================  ==========
system        memory manager       reservation / placement      scheduler
============  ===================  ===========================  ==========
static        static slots         max_seq_len per slot         static
orca-max      contiguous           max / buddy                  orca
orca-pow2     contiguous           pow2 / buddy                 orca
orca-oracle   contiguous           oracle / buddy               orca
vllm          paged (block 16)     on demand                    vllm
token         paged (block 1)      on demand (TokenAttention)   vllm
vattention    vattention pages     on demand, 64 KiB pages      vllm
============  ===================  ===========================  ==========
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sim.errors import ConfigError
from traces.names import MAX_LEN_POLICIES

SYSTEMS: dict[str, dict[str, Any]] = {
    "static": dict(manager="static", scheduler="static"),
    "orca-max": dict(manager="contiguous", scheduler="orca", reservation="max", placement="buddy"),
    "orca-pow2": dict(manager="contiguous", scheduler="orca", reservation="pow2", placement="buddy"),
    "orca-oracle": dict(manager="contiguous", scheduler="orca", reservation="oracle", placement="buddy"),
    "vllm": dict(manager="paged", scheduler="vllm", block_size=16),
    "token": dict(manager="paged", scheduler="vllm", block_size=1),
    "vattention": dict(manager="vattention", scheduler="vllm"),
}

MANAGERS = ("static", "contiguous", "paged", "vattention")
SCHEDULERS = ("static", "orca", "vllm")
RESERVATIONS = ("max", "pow2", "oracle", "predicted")
PLACEMENTS = ("buddy", "first-fit", "best-fit")
PREEMPTIONS = ("recompute", "swap")
COST_MODELS = ("roofline", "calibrated")


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

    # cost model
    cost_model: str = "roofline"  # or "calibrated" (sim/cost_calibrated.py); a profile means the table model
    cost_scale: float = 1.0  # the cost model's GPU time x this (plan's error band: 1 -/+ its p90 error)
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
        def one_of(name, value, valid):
            if value not in valid:
                raise ConfigError(f"unknown {name} '{value}'; valid: {', '.join(valid)}")
        one_of("system", self.system, list(SYSTEMS) + ["custom"])
        one_of("manager", self.manager, MANAGERS)
        one_of("scheduler", self.scheduler, SCHEDULERS)
        one_of("reservation", self.reservation, RESERVATIONS)
        one_of("placement", self.placement, PLACEMENTS)
        one_of("preemption", self.preemption, PREEMPTIONS)
        one_of("max_len_policy", self.max_len_policy, MAX_LEN_POLICIES)
        one_of("cost_model", self.cost_model, COST_MODELS)
        if not (math.isfinite(self.cost_scale) and self.cost_scale > 0):
            raise ConfigError(f"cost_scale must be a finite number > 0, got {self.cost_scale} (e.g. 1.1)")
        if self.profile and self.cost_model != "roofline":
            raise ConfigError(f"a profile selects the table cost model; drop --cost-model {self.cost_model} "
                              "or the profile")
        if not 1 <= self.block_size <= 256:
            raise ConfigError(f"block_size must be in 1..256, got {self.block_size} (vLLM uses 16)")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.tensor_parallel < 1:
            raise ConfigError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        if self.chunk_budget < 1:
            raise ConfigError(f"chunk_budget must be >= 1, got {self.chunk_budget}")
        if not (math.isfinite(self.swap_gib) and self.swap_gib >= 0):
            raise ConfigError(f"swap_gib must be a finite number >= 0, got {self.swap_gib} (e.g. 4)")
        if self.kv_gib is not None and self.kv_gib <= 0:
            raise ConfigError(f"kv_gib must be > 0, got {self.kv_gib}")
        if self.manager == "static" and self.scheduler != "static":
            raise ConfigError("the static manager needs scheduler 'static'")
        if self.scheduler == "static" and self.manager != "static":
            raise ConfigError("scheduler 'static' needs manager 'static'")

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
        return cls(system=system, **values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "SimConfig":
        return replace(self, **changes)


def read_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A TOML file as a dict; ConfigError naming the file (``what`` it is) when missing or invalid."""
    try:
        import tomllib  # py >= 3.11
    except ModuleNotFoundError:  # pragma: no cover
        import tomli as tomllib
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e})") from None


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a ``--config`` TOML file into a flat dict of settings (dashes become underscores)."""
    data = read_toml(path)
    flat: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):  # allow [simulation] / [workload] tables
            flat.update({kk.replace("-", "_"): vv for kk, vv in v.items()})
        else:
            flat[k.replace("-", "_")] = v
    return flat
