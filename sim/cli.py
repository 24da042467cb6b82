"""The ``pagesim`` command line: one console script, one subcommand per job.

Each subcommand lives beside the code it drives and exposes ``register(subparsers)``, which
adds its parser and sets ``func``; the ``pagesim.commands`` entry-point group in setup.cfg names
them, so this file, at the bottom of the layers, names none of the packages above it. It only
wires them together and turns user errors (:class:`sim.errors.PagesimError`) into one line on
stderr and exit code 2.
"""

from __future__ import annotations

import os

# numpy's OpenBLAS keeps a thread per core spinning after each BLAS call (the summary's few small
# products): a tenth of a whole run's CPU on 2 cores for nothing, so one thread, unless the user
# chose; set before numpy loads (the command's own process, not a library user's)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# numpy advises the kernel to back each array of 4 MB or more by transparent huge pages; where
# memory is fragmented the kernel compacts it to find them, system time the core's accesses do
# not win back (ten million requests: docs/performance.md), so off, unless the user chose
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
# Arrow's default allocator (mimalloc) asks for huge pages too, and the kernel zeroes each 2 MB
# page at its first touch: system time in `reproduce all`'s workers, which read and write their
# run cache's tables (docs/performance.md); the C library's allocator, unless the user chose
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

import argparse
import configparser
import contextlib
import importlib
import logging
import shlex
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

from pagesim.sim import __version__
from pagesim.sim.errors import PagesimError, PagesimWarning
from pagesim.sim.terminal import NOTICE_KEY, fill

COMMANDS_GROUP = "pagesim.commands"
SOURCE_SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"


def subcommands() -> dict[str, str]:
    """Subcommand name -> ``module:function`` that registers it, in ``--help``'s order: the
    ``pagesim.commands`` entry points, read from setup.cfg in a source tree (an editable install,
    or the GPU machine's uninstalled checkout), else from the installed package's metadata."""
    if SOURCE_SETUP_CFG.exists():
        cfg = configparser.ConfigParser()
        cfg.read(SOURCE_SETUP_CFG)
        lines = cfg.get("options.entry_points", COMMANDS_GROUP, fallback="").strip().splitlines()
        return dict((part.strip() for part in line.split("=", 1)) for line in lines if "=" in line)
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=COMMANDS_GROUP)}


def shell_lines(command: str, width: int, lead: str) -> list[str]:
    """``command`` as shell lines of at most ``width`` columns, broken between its words (a quoted
    argument stays whole) with " \\" continuations indented under it."""
    words = [shlex.quote(word) for word in shlex.split(command)]
    lines = [lead + words[0]]
    for word in words[1:]:
        if len(lines[-1]) + 1 + len(word) + 2 > width:
            lines[-1] += " \\"
            lines.append(lead + "    " + word)
        else:
            lines[-1] += " " + word
    return lines


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep examples' line breaks, but no line past the terminal (argparse's width: ``COLUMNS``
    less 2): a long paragraph wraps under its own indent, a long example command wraps into
    shell continuation lines that still paste and run. Show defaults that say something (not
    None/False)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for line in text.splitlines():
            if len(indent + line) <= width:
                out.append(indent + line)
                continue
            lead = indent + line[:len(line) - len(line.lstrip())]
            if line.lstrip().startswith("pagesim "):  # a runnable example: " \" continuations
                out += shell_lines(line.strip(), width, lead)
            else:
                out += textwrap.wrap(line.strip(), width=width, initial_indent=lead, subsequent_indent=lead,
                                     break_long_words=False, break_on_hyphens=False)
        return "\n".join(out)

    def _split_lines(self, text: str, width: int) -> list[str]:
        """An option's help wrapped as argparse does, but never at a hyphen: ``--num-requests``
        and ``leave-one-model-out`` stay whole."""
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line (the usage is in ``--help``)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def example(*lines: str) -> str:
    """The epilog every subcommand's help ends with: runnable examples."""
    return "example:\n" + "\n".join(f"  {line}" for line in lines)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (``command``, a subcommand's name) only that subcommand's: a run
    of ``pagesim simulate`` need not import the planner, the reports and the GPU mode."""
    parser = Parser(
        prog="pagesim",
        description="Simulate LLM serving and see where every KV-cache slot goes "
                    "(static batching, Orca reservations, PagedAttention), with a GPU mode.",
        formatter_class=HelpFormatter,
        epilog=example("pagesim simulate --workload sharegpt --rate 2 --duration 600 --system vllm --out out/run",
                       "pagesim reproduce fig2 --out out/fig2"),
    )
    parser.add_argument("--version", action="version", version=f"pagesim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, target in subcommands().items():
        if command in (None, name):
            module, function = target.split(":")
            getattr(importlib.import_module(module), function)(sub)
    return parser


PYTHON_FORMAT_WARNING = warnings.formatwarning


def format_warning(message, category, filename, lineno, line=None) -> str:
    """A :class:`PagesimWarning` without Python's source line, wrapped within the terminal's 100
    columns; other warnings as Python prints them."""
    if issubclass(category, PagesimWarning):
        return fill(str(message), first="pagesim: warning: ") + "\n"
    return PYTHON_FORMAT_WARNING(message, category, filename, lineno, line)


class NoticeFormatter(logging.Formatter):
    """A notice within the terminal's 100 columns, its later lines indented (sim.terminal)."""

    def format(self, record: logging.LogRecord) -> str:
        return fill(super().format(record))


class NoticeHandler(logging.StreamHandler):
    """A notice as its own line on stderr, above a progress bar that is showing (tqdm's write
    clears and redraws the bar; plain stderr where tqdm is missing, as on the GPU device)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:  # imported here: a notice is rare, and tqdm's import is 25-70 ms of every command
            from tqdm import tqdm
        except ImportError:
            super().emit(record)
            return
        tqdm.write(self.format(record), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    warnings.formatwarning = format_warning  # the command owns its process's stderr; a library import changes nothing
    notices = logging.getLogger("pagesim")  # the library's notices (numba compiling the core)
    if not notices.handlers:
        handler = NoticeHandler()
        handler.setFormatter(NoticeFormatter("pagesim: %(message)s"))
        notices.addHandler(handler)
        notices.setLevel(logging.INFO)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in subcommands() else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    marker = None
    if NOTICE_KEY not in os.environ:  # one compile notice for the command's processes (sim.core.replay)
        marker = os.path.join(tempfile.gettempdir(), f"pagesim-compile-notice-{os.getpid()}-{time.time_ns()}")
        os.environ[NOTICE_KEY] = marker
    try:
        rc = args.func(args)
    except PagesimError as e:
        print(f"pagesim: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("pagesim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # unreadable input, unwritable --out, a full disk (sim.outdir.naming names the file)
        where = f"{e.filename}: " if e.filename else ""
        print(f"pagesim: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        if marker is not None:
            os.environ.pop(NOTICE_KEY, None)
            with contextlib.suppress(OSError):
                os.remove(marker)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
