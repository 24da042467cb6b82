"""Orca's iteration (``--system orca-max``, ``orca-pow2``, ``orca-oracle``): vLLM v0's scheduler
(``scheduler_vllm.py``: the same FCFS admission, prefill-first or chunked) over the contiguous
manager (``extent.py``), which changes two of its rules:

* **decode room.** An extent was reserved whole at admission, so a decode step needs no new
  block; only a predicted reservation (``--reservation predicted``) can be outgrown, and then
  the policy's victim is preempted while the outgrown extents cannot be re-reserved
  (``extent.decode_fits``), and those that can are (``extent.rereserve_overflowing``);
* **swap-in.** A request swapped out (its predicted reservation could not grow) is reserved
  again as at an admission with the tokens it holds.
"""

from __future__ import annotations

from pagesim.sim.core.kv import extent, kv_cache
from pagesim.sim.core.sched import policies
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.sched.lifecycle import preempt_contiguous
from pagesim.sim.core.state import DECODE_SET_SIZE


@njit(inline=True)
def make_decode_room(s):
    while s.count[DECODE_SET_SIZE] and not extent.decode_fits(s):
        preempt_contiguous(s, policies.victim(s))
    extent.rereserve_overflowing(s)


# per swap-in: a call, not inlined (sim/core/events/loop.py's docstring, "Compiled per family")
@njit
def swap_in(s, i, n):
    """Whether request ``i`` came back with its ``n`` tokens (its extent reserved)."""
    held = max(n, s.prompt_target[i])  # swapped out mid-prompt: its whole prompt, as admitted
    fits = extent.can_allocate(s, i, held) == kv_cache.CAN_ALLOCATE
    if fits:
        extent.allocate(s, i, held, n)
    return fits
