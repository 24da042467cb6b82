"""Every simulator output quoted in README and docs/ is rerun and compared, or dated with its script.

A page ties a number to the command that prints it with two HTML comments (invisible on the
site and on GitHub):

* ``<!-- command NAME: pagesim ARGS -->`` names a command for the page (one line);
* ``NUMBER <!-- check NAME: EXPRESSION ~ TOLERANCE -->`` right after a number (the last number
  before the comment on its line; ``1,612`` and ``-3.5`` are numbers) says it is what
  EXPRESSION gives on NAME's output. With ``--json`` among the command's arguments the output
  is read as JSON and EXPRESSION is Python over its keys (``mean_ttft_ms / 1000``,
  ``workload.max_len.dropped``); otherwise EXPRESSION is ``/REGEX/``, its first group the
  number on the first line of the printed text that matches.
* ``<!-- output of NAME ~ TOLERANCE -->`` on the line before a ``text`` code block says the
  block is NAME's printed output, or a run of its consecutive lines: the same lines, the same
  words around the numbers, each number within the tolerance.

TOLERANCE is ``5%`` (of the command's value) or ``exact``; either way the page's number may
differ by its own rounding (half a unit of its last digit: 8.3 for 8.32 is exact). The test
runs each command once, in a scratch folder beside the real traces (``../shared``, as
``docs/examples.py`` does; a command that reads them skips where they are absent), compiled as
the rest of the suite. Choose commands that take seconds (a built-in workload, ``--no-steps``,
``--quick``): every check together is meant to stay within 90 s of CI on 2 cores.

Numbers that no quick command gives (the machine's timings, a full ``reproduce all``, a fit on
real runs) say so beside them: their date and the script or command that measured them, as
``(2026-11-29, `benchmarks/reproduce_speed.py`)``; every results file a page cites exists
(``test_every_cited_result_exists``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import types
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"

COMMAND = re.compile(r"<!--\s*command\s+([\w-]+):\s*pagesim\s+(.*?)\s*-->")
CHECK = re.compile(r"<!--\s*check\s+([\w-]+):\s*(.*?)\s*~\s*(\S+)\s*-->")
OUTPUT = re.compile(r"^\s*<!--\s*output of\s+([\w-]+)\s*~\s*(\S+)\s*-->\s*$")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
#: a number as pages write it: thousands separated by commas, a sign (or a minus sign) and decimals
NUMBER = re.compile(r"(?<![\w.])[-+\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{line}"


def number_of(text: str) -> float:
    return float(text.replace(",", "").replace("\u2212", "-"))


def tolerance_of(text: str, place: str) -> float:
    """The relative tolerance a mark states: ``5%`` is 0.05, ``exact`` 0."""
    if text == "exact":
        return 0.0
    if text.endswith("%"):
        try:
            return float(text[:-1]) / 100
        except ValueError:
            pass
    raise ValueError(f"{place}: the tolerance {text!r} is neither N% nor exact")


def rounding_of(text: str) -> float:
    """Half a unit of the written number's last digit: how far rounding may have moved it."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** -decimals


@dataclass
class Check:
    place: str
    written: str  # the number as the page writes it
    expression: str
    tolerance: float


@dataclass
class Output:
    place: str
    lines: list[str]
    tolerance: float


@dataclass
class Command:
    place: str
    name: str
    argv: list[str]
    checks: list[Check] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)

    @property
    def is_json(self) -> bool:
        return "--json" in self.argv


def marks(path: Path) -> list[Command]:
    """The page's commands, each with the numbers and output blocks that name it."""
    lines = path.read_text().splitlines()
    commands: dict[str, Command] = {}
    for number, line in enumerate(lines, 1):
        for found in COMMAND.finditer(line):
            name = found.group(1)
            if name in commands:
                raise ValueError(f"{where(path, number)}: the command {name!r} is named twice")
            commands[name] = Command(where(path, number), name, shlex.split(found.group(2)))

    def named(name: str, place: str) -> Command:
        if name not in commands:
            raise ValueError(f"{place}: no '<!-- command {name}: ... -->' on this page")
        return commands[name]

    for number, line in enumerate(lines, 1):
        place = where(path, number)
        for found in CHECK.finditer(line):
            before = NUMBER.findall(COMMAND.sub("", CHECK.sub("", line[:found.start()])))
            if not before:
                raise ValueError(f"{place}: a check with no number before it on its line")
            command = named(found.group(1), place)
            expression = found.group(2)
            if command.is_json:
                compile(expression, place, "eval")  # a SyntaxError names the place
            elif not (len(expression) > 2 and expression[0] == expression[-1] == "/"
                      and re.compile(expression[1:-1]).groups >= 1):
                raise ValueError(f"{place}: {command.name} prints text: the check is /REGEX/ with a group")
            command.checks.append(Check(place, before[-1], expression, tolerance_of(found.group(3), place)))
        output = OUTPUT.match(line)
        if output:
            fence = FENCE.match(lines[number]) if number < len(lines) else None
            if not fence or fence.group(1) != "text":
                raise ValueError(f"{place}: an output mark not right before a text code block")
            block = []
            for text in lines[number + 1:]:
                if FENCE.match(text):
                    break
                block.append(text)
            command = named(output.group(1), place)
            command.outputs.append(Output(place, block, tolerance_of(output.group(2), place)))
    return list(commands.values())


def close(written: str, value: float, tolerance: float) -> bool:
    return abs(number_of(written) - value) <= tolerance * abs(value) + rounding_of(written) + 1e-12


def namespace(value):
    """JSON as attributes: ``workload.max_len.dropped``."""
    if isinstance(value, dict):
        return types.SimpleNamespace(**{key: namespace(item) for key, item in value.items()})
    return value


def value_of(check: Check, printed: str, is_json: bool) -> float:
    if is_json:
        data = json.loads(printed)
        names = {key: namespace(item) for key, item in data.items()}
        return float(eval(check.expression, {"__builtins__": {"abs": abs, "max": max, "min": min,
                                                              "round": round, "len": len}}, names))
    pattern = re.compile(check.expression[1:-1])
    for line in printed.splitlines():
        found = pattern.search(line)
        if found:
            return number_of(found.group(1))
    raise LookupError(f"no printed line matches {check.expression}")


def mismatches(command: Command, printed: str) -> list[str]:
    """One line per number or output line of the page that the command's output contradicts."""
    found = []
    for check in command.checks:
        try:
            value = value_of(check, printed, command.is_json)
        except Exception as error:  # a key the output lost is a stale page too
            found.append(f"{check.place}: {check.expression}: {type(error).__name__}: {error}")
            continue
        if not math.isfinite(value) or not close(check.written, value, check.tolerance):
            found.append(f"{check.place}: the page says {check.written}, {check.expression} is "
                         f"{value:.6g} (tolerance {check.tolerance:.0%} + rounding)")
    for output in command.outputs:
        printed_lines = printed.rstrip("\n").splitlines()
        starts = [index for index, line in enumerate(printed_lines)
                  if output.lines and same_line(output.lines[0], line, output.tolerance)]
        if not starts:
            found.append(f"{output.place}: the block's first line is not printed:\n    "
                         + (output.lines[0] if output.lines else "(an empty block)"))
            continue
        shown = printed_lines[starts[0]:starts[0] + len(output.lines)]
        if len(shown) < len(output.lines):
            found.append(f"{output.place}: the page shows {len(output.lines)} lines, "
                         f"the command prints {len(shown)} from the first on")
        for offset, (page_line, line) in enumerate(zip(output.lines, shown), 1):
            if not same_line(page_line, line, output.tolerance):
                found.append(f"{output.place}+{offset}: the page shows\n    {page_line}\n"
                             f"  the command prints\n    {line}")
    return found


def same_line(page_line: str, printed: str, tolerance: float) -> bool:
    """The same words around the numbers (spacing aside), and each number within the tolerance
    of the printed one."""
    def words(line: str) -> str:
        return " ".join(NUMBER.sub("#", line).split())

    page_numbers, printed_numbers = NUMBER.findall(page_line), NUMBER.findall(printed)
    return (words(page_line) == words(printed) and len(page_numbers) == len(printed_numbers)
            and all(close(written, number_of(value), tolerance)
                    for written, value in zip(page_numbers, printed_numbers)))


COMMANDS = [command for page in pages() for command in marks(page)]


@lru_cache(maxsize=None)
def printed_by(argv: tuple[str, ...], scratch: str) -> str:
    p = subprocess.run([sys.executable, "-m", "pagesim.sim.cli", *argv], cwd=scratch,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "COLUMNS": "100"})
    assert p.returncode == 0, f"pagesim {shlex.join(argv)}: exit {p.returncode}\n{p.stderr[-2000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> str:
    """A working folder with the real traces at ``../shared``, as a checkout beside them has."""
    top = tmp_path_factory.mktemp("doc-numbers")
    (top / "work").mkdir()
    if SHARED.is_dir():
        (top / "shared").symlink_to(SHARED, target_is_directory=True)
    return str(top / "work")


def test_the_pages_mark_what_they_check():
    # the marks parse (at collection) and the pages use them: the stale figures of issue 80
    # (docs/guide/traces.md's latencies) among them
    assert len(COMMANDS) >= 4
    assert sum(len(command.checks) + len(command.outputs) for command in COMMANDS) >= 15
    assert any(command.place.startswith("docs/guide/traces.md") and command.checks for command in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.place}:{c.name}" for c in COMMANDS])
def test_each_number_is_what_its_command_prints(command, scratch):
    if any("../shared" in word for word in command.argv) and not SHARED.is_dir():
        pytest.skip("the real traces (../shared) are absent")
    problems = mismatches(command, printed_by(tuple(command.argv), scratch))
    assert not problems, f"pagesim {shlex.join(command.argv)}\n" + "\n".join(problems)


def test_a_changed_number_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- command run: pagesim simulate --workload sharegpt --json -->\n"
        "Mean TTFT 0.22 s <!-- check run: mean_ttft_ms / 1000 ~ 10% -->, 1,612"
        "<!-- check run: workload.max_len.dropped ~ exact --> of 19,366 dropped.\n"
        "<!-- command table: pagesim validate --against x -->\n"
        "median 3.8 % <!-- check table: /median error\\s+([\\d.]+)%/ ~ exact -->\n"
        "<!-- output of table ~ 5% -->\n```text\nrun   E2E\nmedian error   3.8%\n```\n")
    run, table = marks(page)
    assert [(c.written, c.tolerance) for c in run.checks] == [("0.22", 0.1), ("1,612", 0.0)]
    printed = json.dumps({"mean_ttft_ms": 217.0, "workload": {"max_len": {"dropped": 1612}}})
    assert mismatches(run, printed) == []
    # 0.22 within 10 % of 0.199 (+ 0.005 of rounding), not of 0.19; 1,612 exactly
    assert mismatches(run, printed.replace("217.0", "199.0")) == []
    [slow] = mismatches(run, printed.replace("217.0", "190.0"))
    assert slow.startswith("page.md:2: the page says 0.22, mean_ttft_ms / 1000 is 0.19")
    [dropped] = mismatches(run, printed.replace("1612", "1613"))
    assert "the page says 1,612" in dropped
    [lost] = mismatches(run, json.dumps({"mean_ttft_ms": 217.0}))
    assert "NameError: name 'workload' is not defined" in lost
    assert mismatches(table, "run   E2E\nmedian error   3.84%\n") == []
    assert "the command prints" in mismatches(table, "run   E2E\nmedian error   4.1%\n")[-1]
    # a run of the printed lines, in order: the lines around it are not the page's
    assert mismatches(table, "header\nrun   E2E\nmedian error   3.8%\nmore\n") == []
    assert "prints 1 from the first on" in mismatches(table, "header\nrun   E2E\n")[-1]
    assert "first line is not printed" in mismatches(table, "run   E2E   TTFT\nmedian error   3.8%\n")[-1]
    assert "the page says 3.8" in mismatches(table, "run   E2E\nmedian error   3.9%\n")[0]


@pytest.mark.parametrize("text,message", [
    ("1 <!-- check run: x ~ 5% -->\n", "no '<!-- command run"),
    ("<!-- command run: pagesim simulate --json -->\nno number <!-- check run: x ~ 5% -->\n", "no number"),
    ("<!-- command run: pagesim simulate --json -->\n1 <!-- check run: x ~ about -->\n", "neither N% nor exact"),
    ("<!-- command run: pagesim validate -->\n1 <!-- check run: x ~ 5% -->\n", "prints text"),
    ("<!-- command run: pagesim validate -->\n<!-- output of run ~ 5% -->\ntext\n", "not right before"),
])
def test_a_mark_that_cannot_be_checked_is_refused(tmp_path, text, message):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError, match=message):
        marks(page)


def test_every_cited_result_exists():
    # a dated figure names the script and the results file that hold it: both must be there
    results = {path.name for path in (ROOT / "benchmarks" / "results").rglob("*")}
    for page in pages():
        text = page.read_text()
        for name in set(re.findall(r"[\w.-]+_20\d\d-\d\d-\d\d[\w.-]*\.txt", text)):
            assert name in results, f"{where(page, 1)}: cites {name}, not in benchmarks/results/"
        for script in set(re.findall(r"(?<![\w/])benchmarks/[\w/]+\.py", text)):
            assert (ROOT / script).is_file(), f"{where(page, 1)}: cites {script}, which is not there"
