"""The state's layout is declared once (``sim/core/state.py``'s tables, and each feature's part in
its own file): the index constants are made from it, in order, without gaps or two names for one
thing, a feature's entries in its room of a shared table."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from pagesim.sim import metrics
from pagesim.sim.core import build, state  # build: every file that declares a part of the state


@pytest.fixture
def scratch_table():
    """Declare tables for a test, then take their constants back out of the module."""
    made: list[str] = []

    def declare(name, text, size, **kw):
        before = set(vars(state))
        try:
            return state.table(name, text, size, **kw)
        finally:
            made.extend(set(vars(state)) - before)

    yield declare
    for name in made:
        delattr(state, name)
    for table in (state.TABLES, state.ROOMS, state.SIZES):
        for name in [n for n in table if n.startswith("scratch")]:
            del table[name]


def test_a_table_makes_its_constants_in_order_with_widths(scratch_table):
    size = scratch_table("scratch", """
        SCRATCH_A      one entry
        SCRATCH_B[3]   three entries, and a meaning
            that goes on
        SCRATCH_C      one more
    """, size="SCRATCH_SIZE")
    # worked by hand: A at 0, B at 1..3, C at 4, five entries
    assert (state.SCRATCH_A, state.SCRATCH_B, state.SCRATCH_C, state.SCRATCH_SIZE, size) == (0, 1, 4, 5, 5)
    fields = state.TABLES["scratch"]
    assert [(f.name, f.index, f.width) for f in fields] == [("SCRATCH_A", 0, 1), ("SCRATCH_B", 1, 3),
                                                           ("SCRATCH_C", 4, 1)]
    assert fields[1].meaning == "three entries, and a meaning that goes on"


def test_a_padded_table_reports_its_columns(scratch_table):
    assert scratch_table("scratch_padded", "SCRATCH_X  x\nSCRATCH_Y  y", size="SCRATCH_PADDED", columns=8) == 8
    assert state.SCRATCH_Y == 1
    with pytest.raises(ValueError, match="do not fit"):
        scratch_table("scratch_tight", "SCRATCH_P[3]  p", size="SCRATCH_TIGHT", columns=2)


@pytest.mark.parametrize("text, size", [
    ("SCRATCH_D  d\nSCRATCH_D  again", "SCRATCH_SIZE_D"),  # twice in one table
    ("NUM_RUNNING  a counter's name", "SCRATCH_SIZE_E"),  # a name another table made
    ("RUNNING  a request status's name", "SCRATCH_SIZE_F"),  # a constant of the module
    ("SCRATCH_G  g", "NUM_COUNTS"),  # the size of another table
])
def test_a_name_is_made_once(scratch_table, text, size):
    with pytest.raises(ValueError, match="named twice"):
        scratch_table("scratch_twice", text, size=size)


def test_a_line_must_name_a_field(scratch_table):
    with pytest.raises(ValueError, match="does not start with NAME"):
        scratch_table("scratch_bad", "lower_case  no", size="SCRATCH_BAD")


def test_rooms_and_sections_lay_out_a_shared_table(scratch_table):
    size = scratch_table("scratch_shared", """
        SCRATCH_CORE_A  the core's first
        SCRATCH_CORE_B  and second
    """, size="SCRATCH_SHARED", rooms={"kv.first": 4, "sched.second": 2})
    first = {"__name__": "pagesim.sim.core.kv.first"}
    state.section("scratch_shared", first, """
        SCRATCH_F_A     the first feature's
        SCRATCH_F_B[2]  two more
    """)
    second = {"__name__": "pagesim.sim.core.sched.second"}
    state.section("scratch_shared", second, "SCRATCH_S_A  the second feature's")
    # worked by hand: the core's at 0, 1; kv.first's room 2..5 (3 used), sched.second's 6..7
    assert (size, state.SCRATCH_CORE_B) == (8, 1)
    assert (first["SCRATCH_F_A"], first["SCRATCH_F_B"], second["SCRATCH_S_A"]) == (2, 3, 6)
    assert "SCRATCH_F_A" not in vars(state)  # a feature's constants are its file's
    assert [(f.name, f.index, f.owner) for f in state.TABLES["scratch_shared"]] == [
        ("SCRATCH_CORE_A", 0, "state"), ("SCRATCH_CORE_B", 1, "state"), ("SCRATCH_F_A", 2, "kv.first"),
        ("SCRATCH_F_B", 3, "kv.first"), ("SCRATCH_S_A", 6, "sched.second")]
    with pytest.raises(ValueError, match="do not fit in its room of 2"):
        state.section("scratch_shared", {"__name__": "pagesim.sim.core.sched.second"}, "SCRATCH_S_B[3]  x")
    with pytest.raises(ValueError, match="no room for kv.third"):
        state.section("scratch_shared", {"__name__": "pagesim.sim.core.kv.third"}, "SCRATCH_T  x")
    with pytest.raises(ValueError, match="named twice"):  # a name another file's section made
        state.section("scratch_shared", {"__name__": "pagesim.sim.core.sched.second"}, "SCRATCH_F_A  x")


def test_a_table_of_one_feature_goes_in_its_file(scratch_table):
    owner = {"__name__": "pagesim.sim.core.kv.first"}
    assert scratch_table("scratch_owned", "SCRATCH_O_A  a\nSCRATCH_O_B  b", size="SCRATCH_OWNED",
                         into=owner) == 2
    assert (owner["SCRATCH_O_B"], owner["SCRATCH_OWNED"]) == (1, 2) and "SCRATCH_O_B" not in vars(state)
    assert {f.owner for f in state.TABLES["scratch_owned"]} == {"kv.first"}


def test_every_table_is_contiguous_and_sized():
    """The core's entries from 0 without a gap, then each room's from its start, within it; each
    constant, in the module that declared it, is its entry's index."""
    assert "host_blocks" in state.TABLES and "window" in state.ROOMS  # build imported every owner
    for name, fields in state.TABLES.items():
        declarer = {f.owner for f in fields} - set(state.ROOMS.get(name, {}))  # the table's own entries
        assert len(declarer) <= 1, name
        rooms = {owner: (0, None) for owner in declarer} | state.ROOMS.get(name, {})
        at = {owner: start for owner, (start, _) in rooms.items()}
        for f in fields:
            assert f.index == at[f.owner], (name, f.name)
            module = state if f.owner == "state" else importlib.import_module(f"pagesim.sim.core.{f.owner}")
            assert getattr(module, f.name) == f.index, (name, f.name)
            assert f.meaning, f"{name}.{f.name} says nothing of what it holds"
            at[f.owner] += f.width
        for owner, (start, room) in rooms.items():
            assert room is None or at[owner] - start <= room, (name, owner)
        end = max([start + room for start, room in rooms.values() if room is not None] + list(at.values()))
        assert state.SIZES[name] >= end and (state.SIZES[name] == end or name in ("block_info", "key_entries")), name
    # each room is declared by its owner (an empty room is one nobody uses)
    for name, rooms in state.ROOMS.items():
        assert {f.owner for f in state.TABLES[name]} >= set(rooms), name


def test_no_constant_of_the_module_rebinds_a_table_name():
    """A constant assigned after the tables (``PAGED = 0``) would silently index something else."""
    names = {f.name for fields in state.TABLES.values() for f in fields}
    assigned = set()
    for node in ast.parse(inspect.getsource(state)).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(element, ast.Name):
                    assigned.add(element.id)
    assert not names & assigned


def test_the_step_table_and_the_sums_hold_every_memory_category():
    # every engine's six, then a disaggregated replica's in-transfer slots (its records alone)
    assert state.MEMORY_CATEGORIES == len(metrics.MEMORY_CATEGORIES) + 1
    assert metrics.DISAGG_MEMORY_CATEGORIES == metrics.MEMORY_CATEGORIES + ("in_transfer",)
    widths = {f.name: f.width for fields in state.TABLES.values() for f in fields}
    assert widths["MEM_SUM"] == widths["ROW_MEMORY"] == state.MEMORY_CATEGORIES
    # the step table's integer columns are metrics.STEP_COLUMNS after step, start_s and dt_s, then
    # the in-transfer slots
    assert state.ROW_USED_BLOCKS == len(metrics.STEP_COLUMNS) - 3 + 1
    assert metrics.STEP_COLUMNS[3 + state.ROW_MEMORY] == "mem_token_states"
    assert metrics.STEP_COLUMNS[3 + state.ROW_RUNNING] == "num_running"
