"""State by owner: an entry of the state that one feature alone uses is declared in that
feature's file (``state.section``, or a table of its own), and no other file names it; what the
core declares (``sim/core/state.py``) is what several files share. Read from the sources: a new
read of another feature's entry, or a core entry left to one user, fails here."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from pagesim.sim.core import build, state  # noqa: F401  (build: every file that declares a part)

ROOT = Path(state.__file__).resolve().parents[2]
#: the files that may name any entry: the state's declaration, the one place a run's options
#: become its config (build.py), and the checker, which re-derives every feature's invariants
#: from the arrays apart from the feature's own code (sim/core/check.py: a checker that called
#: the feature's functions would share their mistakes)
EVERY_ENTRY = {"sim/core/state.py", "sim/core/build.py", "sim/core/check.py"}
#: tables whose layout is a record's: the step table's row, whose columns sim.metrics.STEP_COLUMNS
#: names in this order, written by the loop alone
RECORDS = {"row_floats", "row_ints"}


@functools.cache
def _sources() -> dict[str, str]:
    folders = ("sim", "gpu", "experiments", "reports", "benchmarks", "traces")
    return {str(path.relative_to(ROOT)): path.read_text() for folder in folders
            for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts}


def _namers(name: str, sources: dict[str, str]) -> list[str]:
    word = re.compile(rf"\b{name}\b")
    return sorted(path for path, text in sources.items() if path not in EVERY_ENTRY and word.search(text))


def _owner_file(owner: str) -> str:
    return "sim/core/" + owner.replace(".", "/") + ".py"


ENTRIES = [(table, f) for table, fields in state.TABLES.items() if not table.startswith("scratch")
           for f in fields]


def test_owners_are_files_of_the_core():
    for table, f in ENTRIES:
        assert f.owner == "state" or (ROOT / _owner_file(f.owner)).is_file(), (table, f.name, f.owner)


@pytest.mark.parametrize("table, field", [(t, f) for t, f in ENTRIES if f.owner != "state"],
                         ids=lambda x: getattr(x, "name", x))
def test_a_features_entry_is_named_in_its_file_alone(table, field):
    others = [path for path in _namers(field.name, _sources()) if path != _owner_file(field.owner)]
    assert not others, (f"{table}.{field.name} is {field.owner}'s: {', '.join(others)} should call a "
                        f"function of {_owner_file(field.owner)} (or the entry belongs in sim/core/state.py)")


@pytest.mark.parametrize("table, field", [(t, f) for t, f in ENTRIES if f.owner == "state" and t not in RECORDS],
                         ids=lambda x: getattr(x, "name", x))
def test_a_core_entry_is_shared(table, field):
    namers = _namers(field.name, _sources())
    assert namers, f"{table}.{field.name}: no file uses it; remove it"
    assert len(namers) > 1, (f"{table}.{field.name} is used by {namers[0]} alone: declare it there "
                             "(state.section, in a room of the table)")


def test_the_rule_reads_the_files():
    """The two checks above on a made-up case: a feature's entry another file names, and a core
    entry one file alone uses (worked by hand)."""
    sources = {"sim/core/kv/host_tier.py": "s.count[HOST_REFUSED]", "sim/core/events/loop.py": "HOST_REFUSED",
               "sim/core/state.py": "HOST_REFUSED NUM_LOADING", "sim/core/kv/radix_cache.py": "NUM_LOADING"}
    assert _namers("HOST_REFUSED", sources) == ["sim/core/events/loop.py", "sim/core/kv/host_tier.py"]
    assert _namers("NUM_LOADING", sources) == ["sim/core/kv/radix_cache.py"]
    assert _namers("HOST_REFUSE", sources) == []  # a whole word, not a prefix
