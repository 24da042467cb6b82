"""The state's layout is declared once (``sim/core/state.py``'s tables): the index constants are
made from it, in order, without gaps or two names for one thing."""

from __future__ import annotations

import ast
import inspect

import pytest

from pagesim.sim import metrics
from pagesim.sim.core import state


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
    for name in [n for n in state.TABLES if n.startswith("scratch")]:
        del state.TABLES[name]


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


def test_every_table_is_contiguous_and_sized():
    sizes = {"config": state.NUM_CONFIG, "count": state.NUM_COUNTS, "clock": state.NUM_CLOCK,
             "block_info": state.BLOCK_INFO_COLUMNS, "key_entries": state.ENTRY_COLUMNS,
             "extent": state.EXTENT_COLUMNS, "buddy_orders": state.ORDER_COLUMNS, "holes": state.HOLE_COLUMNS,
             "radix_nodes": state.NODE_COLUMNS, "radix_request": state.RADIX_REQUEST_COLUMNS,
             "speculative": state.SPEC_COLUMNS,
             "host_blocks": state.HOST_BLOCK_COLUMNS, "host_work": state.HOST_WORK_COLUMNS,
             "offload": state.OFFLOAD_COLUMNS,
             "row_floats": state.ROW_FLOATS, "row_ints": state.ROW_INTS,
             "window": state.WINDOW_COLUMNS}
    assert set(sizes) == set(state.TABLES)
    for name, fields in state.TABLES.items():
        at = 0
        for f in fields:
            assert f.index == at and getattr(state, f.name) == at, (name, f.name)
            assert f.meaning, f"{name}.{f.name} says nothing of what it holds"
            at += f.width
        assert sizes[name] >= at and (sizes[name] == at or name in ("block_info", "key_entries")), name


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
