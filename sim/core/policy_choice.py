"""Which scheduling policy a run's config names (``config[SCHEDULING_POLICY]``), stated once:
read by the dispatch every run compiles (``policies.py``) and by the lazy rule of the policy's
own functions (``policy_priority.py``: compiled for the runs that choose it). A file of its own,
below both, since ``policies.py`` imports the policies."""

from __future__ import annotations

from pagesim.sim.core.jit import njit
from pagesim.sim.core.state import POLICY_PRIORITY, SCHEDULING_POLICY


@njit(inline=True)
def priority_chosen(config):
    """Whether the run schedules by priority."""
    return config[SCHEDULING_POLICY] == POLICY_PRIORITY
