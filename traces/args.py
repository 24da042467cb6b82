"""Workload options shared by ``pagesim simulate``/``plan``/``validate`` (and ``trace synth``).

Usage in another command::

    from pagesim.traces.args import add_workload_args, workload_from_args
    add_workload_args(parser)
    ...
    df, info = workload_from_args(args, max_seq_len=cfg.max_seq_len)

Pipeline: build (``--trace`` file, else the synthetic ``--workload``), then in this order
``--time-slice``, ``--rate`` (traces only, see below), ``--rate-scale``, ``--duration`` /
``--num-requests`` (traces only: keep requests arriving before DURATION / the first N),
``--sample``, ``--n``/``--beam-width``, the max-length policy (``SimConfig.max_len_policy``:
``--max-len-policy`` or ``max_len_policy`` in a ``--config`` file). A CSV trace's reader stops
once past what ``--time-slice``, ``--duration`` and ``--num-requests`` keep (see
:mod:`traces.reading`).

Arrivals of synthetic workloads: ``--arrival poisson|gamma`` with ``--cv`` for gamma, or vLLM's
``--burstiness K`` (gamma shape K, i.e. ``--arrival gamma --cv 1/sqrt(K)``; K = 1 has Poisson
statistics, K < 1 is burstier). See :mod:`traces.arrivals`.

Rates: without ``--trace`` the synthetic workload runs at ``--rate`` (default 2.0 req/s) for
``--duration`` (default 600 s when neither ``--duration`` nor ``--num-requests`` is given).
With ``--trace``, ``--rate`` defaults to None and, when given, rescales the arrivals so the
trace's mean rate ((rows - 1) / span) becomes RATE (for a lengths-only trace it is the
synthetic arrival rate); ``--rate-scale K`` multiplies the rate by K afterwards.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from pagesim.sim.config import MAX_LEN_POLICIES
from pagesim.sim.errors import ConfigError
from pagesim.traces.names import ARRIVALS, FORMATS, PAPER_WORKLOAD_NAMES, TIME_UNITS

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_RATE = 2.0
DEFAULT_DURATION_S = 600.0


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
    return v


def _int_at_least(s: str, least: int) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, got {s}")
    return v


def seed_int(s: str) -> int:
    """A random seed: an integer >= 0 (numpy's generators refuse a negative one)."""
    return _int_at_least(s, 0)


def _positive_int(s: str) -> int:
    return _int_at_least(s, 1)


def parse_time_slice(s: str) -> tuple[float | None, float | None]:
    """``"START:END"`` (seconds; either side may be empty) -> (start, end)."""
    a, sep, b = s.partition(":")
    try:
        if not sep:
            raise ValueError
        start = float(a) if a.strip() else None
        end = float(b) if b.strip() else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END in seconds (e.g. 600:1200 or 600:), got {s!r}") from None
    if (start is not None and start < 0) or (start is not None and end is not None and end <= start):
        raise argparse.ArgumentTypeError(f"need 0 <= START < END, got {s!r}")
    return start, end


def _weights(s: str) -> tuple[float, ...]:
    """``"W0,W1,..."``: one weight >= 0 per priority level, some above 0."""
    try:
        weights = tuple(float(w) for w in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected weights W0,W1,... (numbers), got {s!r}") from None
    if not all(math.isfinite(w) and w >= 0 for w in weights) or not 0 < sum(weights) < math.inf:
        raise argparse.ArgumentTypeError(f"weights must be >= 0, not all 0, and sum to a finite number, got {s}")
    return weights


def _fraction_or_count(s: str) -> float:
    v = _positive_float(s)
    if v > 1 and v != int(v):
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] or a whole count, got {s}")
    return v


class _ArrivalOption(argparse.Action):
    """``--arrival``, ``--cv`` and ``--burstiness``: ``--burstiness K`` is vLLM's way of saying
    ``--arrival gamma --cv 1/sqrt(K)``, so it sets those two; giving it with ``--cv`` or
    ``--arrival poisson`` (in either order) is an error."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_arrival_given", set()) | {self.dest}
        namespace._arrival_given = given
        arrival = values if self.dest == "arrival" else namespace.arrival
        if "burstiness" in given and ("cv" in given or ("arrival" in given and arrival != "gamma")):
            parser.error("--burstiness K sets a gamma process with --cv 1/sqrt(K); give it without "
                         "--cv and without --arrival poisson")
        setattr(namespace, self.dest, values)
        if self.dest == "burstiness":
            namespace.arrival, namespace.cv = "gamma", 1.0 / math.sqrt(values)


def check_arrival_args(args: argparse.Namespace) -> None:
    """``--cv`` given without gamma arrivals (``--arrival gamma`` or ``--burstiness``) would do
    nothing: a ConfigError naming it (a parser's namespace records what was given)."""
    if "cv" in getattr(args, "_arrival_given", ()) and args.arrival != "gamma":
        raise ConfigError(f"--cv sets the variation of gamma arrivals; the arrivals are {args.arrival}: "
                          "add --arrival gamma or leave --cv out")
    if not hasattr(args, "trace"):  # (trace synth: no trace to read)
        return
    if args.trace is None:  # how to read a trace file, with none to read, would do nothing
        given = [flag for flag, name in (("--format", "format"), ("--columns", "columns"), ("--time-unit", "time_unit"),
                                         ("--hash-block-tokens", "hash_block_tokens"),
                                         ("--spread-timestamps", "spread_timestamps"))
                 if getattr(args, name, None) not in (None, False)]
        if given:
            raise ConfigError(f"{', '.join(given)} read a trace file; there is no --trace: add one or drop them")
    elif getattr(args, "_arrival_given", ()):  # a trace's arrivals are its own
        given = ", ".join(f"--{name}" for name in sorted(args._arrival_given))
        raise ConfigError(f"{given} shape synthetic arrivals; --trace {args.trace} has its own: drop them")


def add_arrival_args(g) -> None:
    """``--arrival``, ``--cv``, ``--burstiness`` (synthetic arrival process) to a parser or group."""
    g.add_argument("--arrival", choices=ARRIVALS, default="poisson", action=_ArrivalOption,
                   help="synthetic arrival process")
    g.add_argument("--cv", type=_positive_float, default=1.0, action=_ArrivalOption,
                   help="gamma arrivals: inter-arrival coefficient of variation (burstiness; 1 = Poisson-like)")
    g.add_argument("--burstiness", type=_positive_float, default=None, metavar="K", action=_ArrivalOption,
                   help="vLLM's burstiness: gamma arrivals of shape K (--arrival gamma --cv 1/sqrt(K); "
                        "1 = Poisson-like, below 1 burstier)")


def add_trace_file_args(g) -> None:
    """How to read a trace file: ``--format``, ``--columns``, ``--time-unit``, ``--hash-block-tokens``."""
    g.add_argument("--format", choices=FORMATS, help="trace format; detected from the extension and header when omitted")
    g.add_argument("--columns", metavar="MAP", help="column map for generic traces: prompt=COL,output=COL"
                                                    "[,arrival=COL|arrival_ms=COL|timestamp=COL][,id=COL][,hashes=COL]")
    g.add_argument("--time-unit", choices=list(TIME_UNITS), default=None,
                   help="unit of numeric timestamps (unset: the format's; Mooncake ms, others s)")
    g.add_argument("--hash-block-tokens", type=_positive_int, default=None, metavar="N",
                   help="prompt tokens per prefix hash (unset: Mooncake 512; needed with --columns ...,hashes=COL)")


def add_workload_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the workload options (see module docstring) to ``parser``; returns the group."""
    g = parser.add_argument_group("workload", "synthetic workload (--workload) or a trace file (--trace), "
                                              "then optional transformations")
    g.add_argument("--workload", choices=list(PAPER_WORKLOAD_NAMES), default="sharegpt",
                   help="built-in synthetic workload with the vLLM paper's length statistics (ignored with --trace)")
    g.add_argument("--trace", metavar="PATH", help="replay a trace file instead (Azure, Mooncake, BurstGPT, "
                                                   "lengths-only, canonical, or generic with --columns)")
    add_trace_file_args(g)
    g.add_argument("--rate", type=_positive_float, default=None,
                   help=f"requests/s (unset: {DEFAULT_RATE} for synthetic workloads; with --trace, rescale the trace to this mean rate only when given)")
    g.add_argument("--duration", type=_positive_float, default=None, metavar="SECONDS",
                   help=f"length of the workload (unset: {DEFAULT_DURATION_S:g} s for synthetic workloads unless "
                        f"--num-requests; with --trace: keep requests arriving before it)")
    g.add_argument("--num-requests", type=_positive_int, default=None, metavar="N",
                   help="number of requests (with --trace: the first N)")
    add_arrival_args(g)
    g.add_argument("--seed", type=seed_int, default=0, help="seed for synthesis, sampling and timestamp spreading")
    g.add_argument("--spread-timestamps", action="store_true",
                   help="spread requests sharing a quantized timestamp (Mooncake) uniformly within the step")
    g.add_argument("--time-slice", type=parse_time_slice, metavar="START:END",
                   help="keep requests arriving in [START, END) seconds, re-zeroed to START")
    g.add_argument("--rate-scale", type=_positive_float, metavar="K", help="multiply the arrival rate by K")
    g.add_argument("--sample", type=_fraction_or_count, metavar="F",
                   help="keep a seeded random subset: a fraction in (0, 1] or a count > 1")
    g.add_argument("--n", type=_positive_int, default=None, help="parallel samples per request (unset: the trace's, else 1)")
    g.add_argument("--beam-width", type=_positive_int, default=None, help="beam width per request (unset: the trace's, else 1)")
    g.add_argument("--priority-weights", type=_weights, metavar="W0,W1,...",
                   help="give each request a priority, 0, 1, ... with these relative weights (seeded draw), "
                        "replacing the trace's: what --scheduling-policy priority orders by (lower first)")
    g.add_argument("--max-len-policy", choices=MAX_LEN_POLICIES, default=None,
                   help="requests with prompt+output > max_seq_len: fail, drop them, truncate the output "
                        "(prompt to max-1 if it alone is too long), or clip-prompt (keep the prompt's end "
                        "so prompt + output fit). Unset: max_len_policy of --config, else error")
    return g


def read_window(args: argparse.Namespace):
    """The rows of a trace the options keep (:class:`traces.reading.Window`), so that a reader may
    stop early: ``--time-slice``, then (without ``--rate``, whose factor needs the whole slice)
    ``--duration`` scaled back by ``--rate-scale`` and ``--num-requests``."""
    from pagesim.traces.reading import Window  # see workload_from_args
    start, end = getattr(args, "time_slice", None) or (None, None)
    start = start or 0.0
    end = math.inf if end is None else end
    if getattr(args, "rate", None) is not None:
        return Window(start, end)
    duration, count = getattr(args, "duration", None), getattr(args, "num_requests", None)
    if duration is not None:
        end = min(end, start + duration * (getattr(args, "rate_scale", None) or 1.0))
    return Window(start, end, count)


def workload_from_args(args: argparse.Namespace, max_seq_len: int,
                       max_len_policy: str) -> "tuple[pd.DataFrame, dict[str, Any]]":
    """Build the workload the options describe; ``max_len_policy`` is the run's
    ``SimConfig.max_len_policy``. Returns ``(df, info)``.

    ``info`` = ``{"source", "kind" ("trace"|"synthetic"), "workload"/"load_report", "steps": [...],
    "max_len": {...}, "rows"}``: every transformation is listed in order with its row counts.
    """
    # here, not at the top: the readers and generators (about 70 ms) that the ``--help`` of
    # simulate, plan and validate, which build their parsers from this module, need not load
    from pagesim.traces import transform as tf
    from pagesim.traces.loaders import load_trace
    from pagesim.traces.synth import make_workload

    g = lambda name, default=None: getattr(args, name, default)  # noqa: E731 (tolerate partial namespaces)
    check_arrival_args(args)
    steps: list[dict] = []
    trace = g("trace")
    if trace:
        df = load_trace(trace, format=g("format"), columns=g("columns"), spread_timestamps=bool(g("spread_timestamps")),
                        arrival=g("arrival", "poisson"), seed=g("seed", 0), rate=g("rate"), cv=g("cv", 1.0),
                        time_unit=g("time_unit"), hash_block_tokens=g("hash_block_tokens"), window=read_window(args))
        info: dict[str, Any] = dict(source=str(trace), kind="trace", load_report=df.attrs.get("load_report"))
    else:
        rate = g("rate") if g("rate") is not None else DEFAULT_RATE
        duration, count = g("duration"), g("num_requests")
        if duration is None and count is None:
            duration = DEFAULT_DURATION_S
        df = make_workload(g("workload", "sharegpt"), rate, duration_s=duration, num_requests=count,
                           seed=g("seed", 0), arrival=g("arrival", "poisson"), cv=g("cv", 1.0))
        info = dict(source=f"builtin:{g('workload', 'sharegpt')}", kind="synthetic", workload=df.attrs["workload"])

    def step(name, new, **params):
        steps.append(dict(step=name, **params, rows_in=len(df_prev[0]), rows_out=len(new)))
        df_prev[0] = new
        return new

    df_prev = [df]
    if g("time_slice"):
        start, end = g("time_slice")
        df = step("time_slice", tf.time_slice(df, start, end), start_s=start, end_s=end)
    if trace and g("rate") is not None and (info["load_report"] or {}).get("synthetic_arrivals") is None:
        a = df["arrival_s"].to_numpy()
        if len(a) < 2 or a[-1] <= a[0]:
            raise ConfigError(f"{trace}: fewer than two distinct arrival times, so its rate cannot be rescaled to "
                              f"{g('rate'):g} req/s (--rate; plan rescales it for each probe): give a longer trace")
        current = (len(a) - 1) / (a[-1] - a[0])
        df = step("rate", tf.scale_rate(df, g("rate") / current), from_rps=current, to_rps=g("rate"))
    if g("rate_scale"):
        df = step("rate_scale", tf.scale_rate(df, g("rate_scale")), k=g("rate_scale"))
    if trace and g("duration") is not None:
        df = step("duration", tf.time_slice(df, 0.0, g("duration")), end_s=g("duration"))
    if trace and g("num_requests") is not None:
        new = df.iloc[: g("num_requests")].reset_index(drop=True)
        new.attrs = dict(df.attrs)
        df = step("num_requests", new, count=g("num_requests"))
    if g("sample"):
        f = g("sample")
        kw = dict(fraction=f) if f <= 1 else dict(count=int(f))
        df = step("sample", tf.sample(df, seed=g("seed", 0), **kw), **kw)
    if g("n") is not None or g("beam_width") is not None:
        df = step("parallel", tf.set_parallel(df, n=g("n"), beam_width=g("beam_width")), n=g("n"),
                  beam_width=g("beam_width"))
    if g("priority_weights"):
        weights = g("priority_weights")
        df = step("priority", tf.draw_priorities(df, weights, seed=g("seed", 0)), weights=list(weights))
    if len(df) == 0:
        raise ConfigError(f"the workload from {info['source']} has no requests left after "
                          f"{', '.join(s['step'] for s in steps) or 'loading'}")
    df, info["max_len"] = tf.apply_max_len_policy(df, max_seq_len, max_len_policy)
    if len(df) == 0:
        raise ConfigError(f"every request is longer than max_seq_len {max_seq_len}")
    info["steps"] = steps
    info["rows"] = len(df)
    # the Arrow buffers the readers and generators freed go back to the OS: an allocator keeps
    # them for reuse otherwise (mimalloc, Arrow's default, held 0.25 GB of ten million ids through
    # the run; the command picks the C library's, sim/cli.py, whose heap this trims)
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    return df, info
