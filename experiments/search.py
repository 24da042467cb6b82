"""The boundary search: the largest setting that still passes, for a monotone pass/fail.

Every plan question reduces to "how far can x go before the probe fails" (x = request rate, or
``1 / kv_gib`` for the smallest KV pool), and a probe is a full simulation, so the search is built
to need few of them and to use idle workers.

:class:`BoundarySearch` finds the largest ``x`` that passes when passing is monotone (passes below
a threshold, fails above): bracket by multiplying the start value by 2 until a probe fails (or
dividing by 2 until one passes, down to ``x_min``), then bisect until ``hi - lo <= rtol * lo``.
The answer is ``lo``, the highest value that *was simulated and passed* (never an interpolation).
With ``k`` free workers a round proposes ``k`` points at once (speculative doublings while
bracketing, a k-section while bisecting). Probe count: about
``log2(answer / start) + log2(1 / rtol) + 2`` per search with one worker.

The search knows nothing about simulations: it proposes numbers and is told pass or fail
(:func:`experiments.probe.run_searches` drives several searches in shared rounds).
"""

from __future__ import annotations

import math
from typing import Callable

from pagesim.sim.errors import ConfigError

#: defaults for a search over request rates (req/s): first probe, range, relative tolerance
DEFAULT_START_RATE = 1.0
DEFAULT_MIN_RATE = 0.05
DEFAULT_MAX_RATE = 1000.0
DEFAULT_RTOL = 0.05


def _round_sig(x: float, sig: int = 4) -> float:
    # probed values are rounded so they read well in reports and repeat exactly from plan to plan
    # (they are part of each probe's cache key)
    if x <= 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{sig}g}")


class BoundarySearch:
    """The largest ``x`` in ``[x_min, x_max]`` that passes, for a pass/fail that is monotone
    (pass below a threshold). Propose points with :meth:`propose`, report with :meth:`record`."""

    def __init__(self, start: float, *, rtol: float = DEFAULT_RTOL, x_min: float = DEFAULT_MIN_RATE,
                 x_max: float = DEFAULT_MAX_RATE, grow: float = 2.0, max_probes: int = 60):
        if not 0 < x_min <= x_max:
            raise ConfigError(f"search range needs 0 < min <= max, got {x_min}..{x_max}")
        if not 0 < rtol < 1:
            raise ConfigError(f"relative tolerance must be in (0, 1), got {rtol}")
        if grow <= 1:
            raise ConfigError(f"grow factor must be > 1, got {grow}")
        self.start = min(max(float(start), x_min), x_max)
        self.rtol, self.x_min, self.x_max, self.grow, self.max_probes = rtol, x_min, x_max, grow, max_probes
        self.tried: dict[float, bool] = {}

    @property
    def hi(self) -> float | None:
        """Lowest failing x."""
        fails = [x for x, ok in self.tried.items() if not ok]
        return min(fails) if fails else None

    @property
    def lo(self) -> float | None:
        """Highest passing x below :attr:`hi`."""
        hi = self.hi
        ok = [x for x, p in self.tried.items() if p and (hi is None or x < hi)]
        return max(ok) if ok else None

    @property
    def infeasible(self) -> bool:
        return self.lo is None and self.hi is not None and self.hi <= self.x_min * (1 + 1e-9)

    @property
    def capped(self) -> bool:
        return self.hi is None and self.lo is not None and self.lo >= self.x_max * (1 - 1e-9)

    @property
    def done(self) -> bool:
        if len(self.tried) >= self.max_probes or self.infeasible or self.capped:
            return True
        lo, hi = self.lo, self.hi
        return lo is not None and hi is not None and hi - lo <= self.rtol * lo

    @property
    def answer(self) -> float | None:
        """The highest passing x (None when even ``x_min`` fails)."""
        return self.lo

    def propose(self, k: int = 1) -> list[float]:
        if self.done:
            return []
        k = max(1, int(k))
        lo, hi = self.lo, self.hi
        if lo is None and hi is None:
            xs = [self.start * self.grow ** i for i in range(k)]
        elif hi is None:
            xs = [lo * self.grow ** (i + 1) for i in range(k)]
        elif lo is None:
            xs = [hi / self.grow ** (i + 1) for i in range(k)]
        else:
            xs = [lo + (hi - lo) * (i + 1) / (k + 1) for i in range(k)]
        out = []
        for x in xs:
            x = _round_sig(min(max(x, self.x_min), self.x_max))
            if lo is not None and hi is not None and not lo < x < hi:
                continue
            if x not in self.tried and x not in out:
                out.append(x)
        if not out and lo is not None and hi is not None:
            out = [(lo + hi) / 2]  # rounding collapsed the k-section: use the exact midpoint
        return sorted(out)

    def record(self, x: float, passed: bool) -> None:
        self.tried[float(x)] = bool(passed)


def search_max(passes: Callable[[list[float]], list[bool]], start: float = DEFAULT_START_RATE, *,
               k: int = 1, **kw) -> BoundarySearch:
    """Run a :class:`BoundarySearch` to the end with ``passes(xs) -> [bool]`` (batches of ``k``)."""
    s = BoundarySearch(start, **kw)
    while True:
        xs = s.propose(k)
        if not xs:
            return s
        for x, ok in zip(xs, passes(xs)):
            s.record(x, ok)
