"""A family's loop calls its scheduler by address (``loop.call_scheduler``): what the address does,
and what a loop run without one does."""

from __future__ import annotations

import pytest

from pagesim.sim.core import state
from pagesim.sim.core.compile import jit
from pagesim.sim.core.events import loop, replay
from pagesim.sim.errors import InvariantError
from pagesim.sim.run import initial_state, run_simulation
from tests.checked_core import unchecked_only
from tests.sim.helpers import cfg_for, rand_trace

compiled_only = pytest.mark.skipif(not jit.COMPILED, reason="interpreted, the loop calls the scheduler's source")


@compiled_only
def test_a_loop_run_without_its_schedulers_address_stops_with_a_named_error():
    s = initial_state(cfg_for("static", slots=2048), rand_trace(1, n=20))
    s.config[state.SCHEDULER_ADDRESS] = 0  # as built: replay.compiled_entry sets it
    code = jit.compiled(loop.run_for(state.STATIC))(s)  # numba's dispatcher, called from Python
    assert code == loop.NO_SCHEDULER and s.count[state.NUM_ROWS] == 0  # nothing scheduled
    with pytest.raises(InvariantError, match=r"without its scheduler's address \(config\[SCHEDULER_ADDRESS\]"):
        replay.raise_for(code, s)


@compiled_only
def test_the_address_set_is_that_familys_scheduler_for_that_state(monkeypatch):
    monkeypatch.setenv("PAGESIM_JIT", "numba")  # numba's machine code (a module links a scheduler of its own)
    monkeypatch.setattr(replay, "_ENTRIES", {})
    s = initial_state(cfg_for("static", slots=2048), rand_trace(1, n=20))
    run = replay.compiled_entry(loop.run_for(state.STATIC), s)
    assert run(s) == loop.DONE
    assert s.config[state.SCHEDULER_ADDRESS] == replay.scheduler_address(state.STATIC, s) != 0


def _widest_calls(library, name: str) -> list:
    """The calls in compiled function ``name``'s own machine-independent code (LLVM's, optimized),
    widest first, as (the callee, its number of arguments): the library's module where it was
    compiled in this process, else the module numba's cache kept with its machine code (the
    optimized module it links into callers, ``CPUCodeLibrary._get_module_for_linking``)."""
    import llvmlite.binding as llvm

    text = library.get_llvm_str()
    if name not in text:
        text = str(library._shared_module)
    module = llvm.parse_assembly(text)
    own = [fn for fn in module.functions if name in fn.name and not fn.is_declaration
           and not fn.name.startswith("_ZN7cpython")]
    assert len(own) == 1, [fn.name for fn in own]
    calls = [(list(call.operands)[-1].name or "(by address)", len(list(call.operands)) - 1)
             for block in own[0].blocks for call in block.instructions if call.opcode == "call"]
    return sorted(calls, key=lambda call: -call[1])


@compiled_only
@unchecked_only
@pytest.mark.parametrize("system", ["static", "vllm-v1", "sglang"])
def test_a_schedulers_entry_passes_the_state_to_no_function_field_by_field(system):
    """The entry loads the state's fields from the reference it is given (``by_reference.state_at``):
    a call of numba's that passed the state on would have it load all ~550 words as it starts, at
    every step, whether it calls or not (vLLM v1's engine ~15 % slower, SGLang's ~40 %,
    2026-11-29): what it calls apart is called by reference (``jit.njit``'s lazy), the rest inlined."""
    cfg = cfg_for(system, slots=2048)
    s = initial_state(cfg, rand_trace(1, n=20))
    family = int(s.config[state.SCHEDULER_KIND])
    replay.scheduler_address(family, s)  # compiled, or loaded from numba's cache
    dispatcher = jit.compiled(loop.scheduler_of(family))
    signature = loop.scheduler_signature(dispatcher.typeof_pyval(s))
    compiled = dispatcher.overloads[signature]
    calls = _widest_calls(compiled.library, compiled.fndesc.mangled_name)
    assert calls and calls[0][1] < 40, calls[:3]  # the widest a few scalars and a reference


def test_the_step_table_is_the_interpreted_ones_through_the_schedulers_call():
    """The stores the loop makes after its scheduler's call (a step's start and duration in the
    step table) are kept: numba's dead-code elimination deleted them once (``numba_patches._stores_kept``)."""
    cfg, trace = cfg_for("static", slots=2048), rand_trace(2, n=40)
    result = run_simulation(cfg, trace)
    steps = result.steps
    assert len(steps) > 10 and (steps["dt_s"] > 0).all()
    assert (steps["start_s"].diff().iloc[1:] >= steps["dt_s"].iloc[:-1].to_numpy() - 1e-12).all()
