"""The command line prints the library's notices (sim/core/events/replay.py: numba compiling the core)
as 'pagesim: ...' lines of their own on stderr, above a progress bar that is showing."""

from __future__ import annotations

import logging

from tqdm import tqdm

from pagesim.sim import cli


def test_a_notice_is_a_line_of_its_own_above_the_bar(capsys):
    handler = cli.NoticeHandler()
    handler.setFormatter(logging.Formatter("pagesim: %(message)s"))
    bar = tqdm(total=3, desc="sweep")  # drawn on stderr
    try:
        handler.emit(logging.LogRecord("pagesim.sim.core.events.replay", logging.INFO, __file__, 1,
                                       "compiling the simulator's core", None, None))
    finally:
        bar.close()
    err = capsys.readouterr().err
    lines = err.replace("\r", "\n").split("\n")
    assert "pagesim: compiling the simulator's core" in lines  # a whole line, not glued to the bar's


def test_a_long_notice_wraps_within_100_columns():
    import logging

    from pagesim.sim.cli import NoticeFormatter

    record = logging.LogRecord("pagesim.sim.cost.cli", logging.INFO, __file__, 1,
                               "fitting a100-80gb's constants on " + ", ".join(["codellama-34b-instruct"] * 6), None, None)
    lines = NoticeFormatter("pagesim: %(message)s").format(record).splitlines()
    assert len(lines) == 2 and lines[0].startswith("pagesim: fitting") and lines[1].startswith("  ")
    assert max(map(len, lines)) <= 100
