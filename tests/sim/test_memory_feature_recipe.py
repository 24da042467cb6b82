"""docs/design.md's "How to add a memory feature", carried out in a copy of the checkout: a small
feature (the KV blocks in use after each scheduling pass, summed) as its own file under
sim/core/kv/, its counter declared there in a room one line of state.py gives it, met by vLLM v1's
loop through one hook line where its pass ends. Its counter must equal the sum of the step
table's ``used_blocks`` (each step's row is written after that step's pass; a pass that schedules
nothing has nothing in use), and the run's records must be the run's without it."""

from __future__ import annotations

from tests.sim.helpers import checkout_copy

#: the feature's file: its state (a counter, in its room of Core.count) and its rule (a hook)
FEATURE = '''"""The KV blocks in use after each scheduling pass, summed (an example of a memory feature)."""

from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.kv.block_pool import num_free_blocks
from pagesim.sim.core.state import NUM_BLOCKS, section

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    BLOCK_PASSES        the blocks in use after each scheduling pass, summed
""")


@njit(inline=True)
def pass_ended(s):
    """A scheduling pass ended: count its blocks in use."""
    s.count[BLOCK_PASSES] += s.config[NUM_BLOCKS] - num_free_blocks(s)
'''

#: a run of vLLM v1 in the copy: the feature's counter (where it exists), the sum of the step
#: table's used_blocks, and a digest of the request table
RUN = """
import hashlib, importlib
from pagesim.sim.config import SimConfig
from pagesim.sim.core.events import replay
from pagesim.sim.core.state import NUM_ROWS, ROW_USED_BLOCKS
from pagesim.sim.run import prepare, result
from pagesim.traces.synth import make_workload
cfg = SimConfig.for_system("vllm-v1", model="opt-13b", gpu="a100-40gb", kv_gib=2.0, seed=0)
run = prepare(cfg, make_workload("sharegpt", rate=20.0, num_requests=40, seed=0))
s, wall = replay.run(run.state)
try:
    passes = int(s.count[importlib.import_module("pagesim.sim.core.kv.block_passes").BLOCK_PASSES])
except ModuleNotFoundError:
    passes = -1
rows = s.row_ints[:s.count[NUM_ROWS], ROW_USED_BLOCKS]
requests = result(cfg, run._replace(state=s), wall).requests.to_csv(index=False)
print(passes, int(rows.sum()), hashlib.sha256(requests.encode()).hexdigest())
"""


def test_a_memory_feature_is_its_file_a_room_and_a_hook(tmp_path):
    copy, python = checkout_copy(tmp_path)
    without, used, requests = python("-c", RUN).split()
    assert without == "-1" and int(used) > 0
    # 1. its file: its state and its rule
    (copy / "sim/core/kv/block_passes.py").write_text(FEATURE)
    # 2. its room in the shared table (one entry, room for three more)
    state = (copy / "sim/core/state.py").read_text()
    rooms = '"kv.host_tier": 12})'
    assert state.count(rooms) == 1
    (copy / "sim/core/state.py").write_text(state.replace(rooms, '"kv.host_tier": 12, "kv.block_passes": 4})'))
    # 3. the hook's call where vLLM v1's pass ends (beside the host tier's own)
    scheduler = (copy / "sim/core/sched/scheduler_v1.py").read_text()
    hook, imports = "    host_tier.pass_ended(s, reached, ran)\n", "from pagesim.sim.core.sched import policies, speculative\n"
    assert scheduler.count(hook) == 1 and scheduler.count(imports) == 1
    scheduler = scheduler.replace(hook, hook + "    block_passes.pass_ended(s)\n")
    (copy / "sim/core/sched/scheduler_v1.py").write_text(
        scheduler.replace(imports, imports + "from pagesim.sim.core.kv import block_passes\n"))
    passes, used_after, requests_after = python("-c", RUN).split()
    assert (passes, used_after, requests_after) == (used, used, requests)
