"""Errors that reach the user as one clear line and exit code 2 (never a traceback).

Everything the user can get wrong (a malformed trace, an impossible configuration, an
unknown preset name) raises a subclass of :class:`PagesimError`; ``pagesim`` catches it
in ``sim.cli.main`` and prints ``pagesim: error: <message>``.
"""

from __future__ import annotations

import warnings


class PagesimError(Exception):
    """Base class of user-facing errors. ``exit_code`` is what the CLI returns."""

    exit_code = 2


class PagesimWarning(UserWarning):
    """A warning about the user's input that the run goes on from (a trace's unsorted rows):
    ``pagesim`` prints it as one line, ``pagesim: warning: <message>`` (``sim.cli``)."""


def warn(message: str, category: type | None = None, stacklevel: int = 2) -> None:
    """Tell the user something was ignored or looks wrong: ``pagesim: warning: <message>`` from
    the command line (``sim.cli``), a :class:`PagesimWarning` (or ``category``, one of its kinds)
    to a library caller."""
    warnings.warn(message, category or PagesimWarning, stacklevel=stacklevel)


class ConfigError(PagesimError, ValueError):
    """An impossible or unknown configuration; the message names the parameter and a value that works."""


class EmptyWorkload(ConfigError):
    """A synthetic workload drew no requests; ``what`` says at what rate and for how long, so that a
    command whose own flag set them (``reproduce --scale``) can name it."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(f"the workload has no requests ({what}); raise --rate or --duration")

    def __reduce__(self):  # (raised in a worker process, it crosses back whole: what, not the message)
        return EmptyWorkload, (self.what,)


class TraceError(PagesimError, ValueError):
    """A malformed trace; the message names the file, the 1-based row and the field."""

    def __init__(self, message: str, *, path: str | None = None, row: int | None = None,
                 field: str | None = None):
        where = []
        if path is not None:
            where.append(str(path))
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        self.path, self.row, self.field = path, row, field
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")


class InvariantError(PagesimError):
    """``--check`` (or a run's own bound) found a broken invariant: a bug; please report it with
    the command line."""


class NeedsGPUError(PagesimError):
    """A command that needs a CUDA GPU (CuPy + a device) was run without one."""
