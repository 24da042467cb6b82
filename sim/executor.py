"""Executors outside the core: an object that runs the iterations the core schedules instead of
the core pricing them with its cost model (the GPU mode's ``gpu/executor.py``)."""

from __future__ import annotations


def is_external(executor) -> bool:
    """Whether ``executor`` runs the core's steps from outside it: ``start(core)`` before the run,
    ``step(core) -> seconds`` after each iteration the core scheduled (``sim.core.loop.SCHEDULED``:
    the core's arrays say what it computes and which blocks it copies and swaps), ``finish(core)``
    after the run. It has no cost model: the core's loop keeps time with the durations it returns."""
    return callable(getattr(executor, "step", None)) and callable(getattr(executor, "start", None))
