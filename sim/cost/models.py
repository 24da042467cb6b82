"""The cost model a configuration names (:func:`make_cost_model`: the roofline, the calibrated
roofline, a measured profile's table, each scaled or not) and the CPU time it charges per
iteration, for the summary (:func:`cpu_overhead_note`)."""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.price.cost import scaled_step_time
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.core.state import CALIBRATED, ROOFLINE, TABLE
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.roofline import RooflineCostModel, TableCostModel
from pagesim.sim.cost.serving import ServingCostModel
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import GPUSpec, ModelSpec


def make_cost_model(model: ModelSpec, gpu: GPUSpec, tensor_parallel: int = 1, profile: str | None = None,
                    step_overhead_ms: float | None = None, per_seq_overhead_ms: float | None = None,
                    cost_model: str = "roofline", calibration=None, cost_scale: float = 1.0,
                    swap_block_tokens: int = 0, kernel_block_tokens: int = 0, expert_group: int = 1,
                    data_parallel: int = 1):
    """``cost_model``: ``roofline``, ``calibrated`` (``sim/cost/calibrated.py``) or ``serving``
    (``sim/cost/serving.py``); ``calibration`` overrides the GPU's shipped constants of either;
    a ``profile`` selects the table model. ``cost_scale``
    multiplies the GPU time (:class:`ScaledCostModel`). ``swap_block_tokens``: the
    tokens one swap copy moves, the KV block size of a paged cache (``sim.core.cost``'s copy
    latency); 0 leaves swapping priced by its bytes alone. ``kernel_block_tokens``: the block of
    vLLM v0's paged decode kernel (``SimConfig.kernel_block_tokens``; 0: none), whose work per
    block the roofline, calibrated and serving models add to their decode attention (the table
    model's profile measured its own kernel and takes none). ``expert_group``: the GPUs a
    mixture of experts' routed experts are split among whole, and ``data_parallel`` the engine
    ranks of that group (``SimConfig.expert_group``), which the roofline and serving models price
    (``sim.core.cost.routed_expert_seconds``); the others refuse them."""
    if expert_group > 1 and (profile or cost_model == "calibrated"):
        raise ConfigError(f"--expert-parallel is priced by the roofline and serving cost models, not by "
                          f"{'a --profile table' if profile else '--cost-model calibrated'}")
    if profile:
        cm = TableCostModel(profile, model, gpu, tensor_parallel, swap_block_tokens)
    elif cost_model == "calibrated":
        cm = CalibratedCostModel(model, gpu, tensor_parallel, calibration, swap_block_tokens, kernel_block_tokens)
    elif cost_model == "serving":
        cm = ServingCostModel(model, gpu, tensor_parallel, calibration, swap_block_tokens, kernel_block_tokens,
                              expert_group, data_parallel)
    else:
        cm = RooflineCostModel(model, gpu, tensor_parallel, swap_block_tokens=swap_block_tokens,
                               kernel_block_tokens=kernel_block_tokens, expert_group=expert_group,
                               data_parallel=data_parallel)
    if step_overhead_ms is not None or per_seq_overhead_ms is not None:
        cm.set_cpu_overhead(None if step_overhead_ms is None else step_overhead_ms * 1e-3,
                            None if per_seq_overhead_ms is None else per_seq_overhead_ms * 1e-3)
    if cost_scale != 1.0:
        cm = ScaledCostModel(cm, cost_scale)
    return cm


class ScaledCostModel:
    """Another cost model with its GPU time (everything but the CPU overheads) times ``scale``:
    ``plan`` reruns its search at ``1 -/+ p90`` of the measured error to give its answer a band.
    Every method applies :func:`sim.core.cost.scaled_step_time`, which the core's loop applies
    too."""

    def __init__(self, inner, scale: float):
        self.inner, self.scale = inner, scale
        self._scaled_step_time = interpreted(scaled_step_time)

    def _scaled(self, t, num_seqs: int):
        return self._scaled_step_time(t, self.scale, self.inner.overhead_s, self.inner.per_seq_overhead_s, num_seqs)

    def step_time(self, batch) -> float:
        return self._scaled(self.inner.step_time(batch), batch.num_seqs)


def frontend_seconds(cost_model) -> float:
    """What a request spends outside the engine under ``cost_model`` (None: an executor times the
    steps, and nothing outside them): the serving model's fitted front end, 0 for the others."""
    return float(getattr(getattr(cost_model, "inner", cost_model), "frontend_s", 0.0))


def swap_block_tokens(cfg) -> int:
    """The tokens one swap copy moves in ``cfg``'s cache (``make_cost_model``'s
    ``swap_block_tokens``): a paged cache's block size; 0 for the others (one extent per
    sequence)."""
    return cfg.block_size if cfg.manager == "paged" else 0


def cpu_overhead_note(cost_model) -> str:
    """The CPU time a run charged per iteration, and where it came from, for its summary."""
    inner = getattr(cost_model, "inner", cost_model)  # a ScaledCostModel scales the GPU time only
    source = getattr(inner, "cpu_overhead_source", "set by the caller")
    return f"{inner.overhead_s * 1e3:.4g} ms + {inner.per_seq_overhead_s * 1e6:.4g} us/sequence ({source})"


#: the price of a run whose executor times the steps itself (the GPU mode): none
NO_COST = (ROOFLINE, False, np.zeros(1), np.zeros(0))


def core_cost(cost_model) -> tuple[int, bool, np.ndarray, np.ndarray]:
    """``cost_model`` as the core prices a step (``sim.core.loop.step_time``): which price
    (``state.ROOFLINE``, ``CALIBRATED``, ``TABLE``), whether its GPU time is scaled, its
    constants followed by the scale (1 when unscaled), and its tables array (the calibrated
    model's, the table model's; empty for the roofline)."""
    scaled = type(cost_model) is ScaledCostModel
    inner = cost_model.inner if scaled else cost_model
    code = {RooflineCostModel: ROOFLINE, ServingCostModel: ROOFLINE, CalibratedCostModel: CALIBRATED,
            TableCostModel: TABLE}[type(inner)]
    data = inner.tables() if code in (CALIBRATED, TABLE) else np.zeros(0)
    constants = np.array([*inner.constants(), cost_model.scale if scaled else 1.0], dtype=np.float64)
    return code, scaled, constants, np.ascontiguousarray(data, dtype=np.float64)
