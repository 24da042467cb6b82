"""Executors outside the core: an object that runs the iterations the core schedules instead of
the core pricing them with its cost model (the GPU mode's ``gpu/executor.py``)."""

from __future__ import annotations


def is_external(executor) -> bool:
    """Whether ``executor`` runs the core's steps from outside it: ``start(core)`` before the run,
    ``step(core) -> seconds`` after each iteration the core scheduled (``sim.core.loop.SCHEDULED``:
    the core's arrays say what it computes and which blocks it copies and swaps), ``finish(core)``
    after the run. It has no cost model: the core's loop keeps time with the durations it returns."""
    return callable(getattr(executor, "step", None)) and callable(getattr(executor, "start", None))


def only_times(executor) -> bool:
    """Whether ``executor`` only times the core's steps, as the peer tests' recorder does
    (``tests/peers/pagesim_steps.py``: ``only_times = True``): it may then run speculative
    decoding (the core's own draws decide which drafts each step accepts:
    ``sim/core/sched/speculative.py``) and sliding-window KV cache groups (it reads no block table).
    The GPU mode's executor runs a model that verifies no drafts and reads one block table per
    sequence, so both are refused with it."""
    return bool(getattr(executor, "only_times", False))
