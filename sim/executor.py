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
