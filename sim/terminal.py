"""What a command prints for a person fits a terminal of :data:`WIDTH` columns: text wraps
under its own indent, and a table too wide is printed in blocks of columns, each block led by
the table's key columns, with its long text cells (a note, a reason) listed beneath it. Data
for programs (``--json``, CSV files) is left as it is."""

from __future__ import annotations

import shutil
import textwrap

#: the widest line a command prints for a person
WIDTH = 100
#: the environment variable naming the file whose creation claims a command's one notice that
#: numba compiles the core (``sim.core.replay.compile_notice``), shared by every process of the
#: command (a sweep's workers inherit it); ``sim/cli.py`` sets it
NOTICE_KEY = "PAGESIM_COMPILE_NOTICE"


def bar_columns() -> int:
    """A progress bar's width: the terminal's, at most :data:`WIDTH` (tqdm takes a whole line
    of a terminal it cannot measure, as on a pipe)."""
    return min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)


def fill(text: str, first: str = "", rest: str = "  ", width: int = WIDTH) -> str:
    """``text`` wrapped to ``width`` after ``first``, its later lines indented by ``rest``;
    never inside a word or at a hyphen (a flag or a file name stays whole)."""
    return textwrap.fill(text, width=width, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False)


def key_value_lines(rows: list[tuple[str, object]], width: int = WIDTH) -> list[str]:
    """``key  value`` lines, the values in one column after the longest key, a long value
    wrapped under itself (a summary: ``simulate``'s, ``validate``'s)."""
    w = max((len(key) for key, _ in rows), default=0)
    return [line for key, value in rows
            for line in fill(str(value), first=f"{key:<{w}}  ", rest=" " * (w + 2), width=width).splitlines()]


def table_lines(header: list[str], rows: list[list[str]], *, keys: int = 1, text: tuple[int, ...] = (),
                width: int = WIDTH) -> list[str]:
    """A table of strings as lines within ``width``. The first ``keys`` columns name a row (left
    aligned, repeated at the head of every block of columns); the others are right aligned and
    go into as few blocks as fit. Columns at the indices ``text`` (long text: a note, a reason)
    are not columns but lines under the table, ``<keys>: <text>``, for the rows that have one."""
    shown = [i for i in range(len(header)) if i not in text]
    widths = {i: max([len(header[i])] + [len(row[i]) for row in rows]) for i in shown}
    lead = [i for i in shown if i < keys]
    blocks, current = [], list(lead)
    for i in shown[len(lead):]:
        if len(current) > len(lead) and sum(widths[j] + 2 for j in current) + widths[i] > width:
            blocks.append(current)
            current = list(lead)
        current.append(i)
    blocks.append(current)

    def line(cells: list[str], block: list[int]) -> str:
        return "  ".join(cells[i].ljust(widths[i]) if i < keys else cells[i].rjust(widths[i]) for i in block).rstrip()

    lines = []
    for n, block in enumerate(blocks):
        lines += [""] * (n > 0) + [line(header, block)] + [line(row, block) for row in rows]
    for i in text:
        noted = [row for row in rows if row[i] not in ("", "-")]
        if noted:
            lines.append(f"{header[i]}:")
            for row in noted:
                name = " ".join([row[0]] + [f"{header[k]} {row[k]}" for k in range(1, keys)])
                lines += fill(row[i], first=f"  {name}: ", rest="    ", width=width).splitlines()
    return lines
