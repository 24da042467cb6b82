"""The simulated executor: an iteration takes what the cost model prices it at. The GPU mode
swaps this one object (``gpu/executor.py`` runs the iteration's kernels and times them)."""

from __future__ import annotations

from pagesim.sim.batch import StepBatch


class SimulatedExecutor:
    """Prices an iteration with a cost model (roofline, calibrated, or a measured table)."""

    def __init__(self, cost_model):
        self.cost_model = cost_model

    def run_step(self, batch: StepBatch, manager) -> float:
        return self.cost_model.step_time(batch)


def is_external(executor) -> bool:
    """Whether ``executor`` runs the core's steps from outside it (the GPU mode,
    ``gpu/executor.py``): ``start(core)`` before the run, ``step(core) -> seconds`` after each
    iteration the core scheduled (``sim.core.loop.SCHEDULED``: the core's arrays say what it
    computes and which blocks it copies and swaps), ``finish(core)`` after the run. It has no
    cost model: the core's loop keeps time with the durations it returns."""
    return callable(getattr(executor, "step", None)) and callable(getattr(executor, "start", None))
