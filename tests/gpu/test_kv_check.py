"""gpu/kv_check.py: K/V contents after copy-on-write and swaps, checked against the sources'
contents before the step (FakeBackend's tag pool as the device; hand-built steps and a real run)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pagesim.gpu.executor import ExecutorError, StepPlan
from pagesim.gpu.fake_backend import FakeBackend
from pagesim.gpu.kv_check import KVContentCheck
from pagesim.sim.cli import main
from pagesim.sim.specs import ModelSpec

TINY = ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 101, 256)
I64 = np.int64


def checked(backend_cls=FakeBackend):
    fb = backend_cls(verify=False)
    chk = KVContentCheck(fb)
    chk.setup(TINY, 6, 4, 3)
    fb.writer[3], fb.pos[3] = [7, 7, 7, -1], [0, 1, 2, -1]  # block 3: sequence 7's positions 0..2
    fb.host_writer[1], fb.host_pos[1] = [5, 5, 5, 5], [4, 5, 6, 7]  # host block 1: sequence 5's 4..7
    return fb, chk


def plan(**kw):
    base = dict(step=0, block_size=4, num_blocks=6)
    base.update({k: np.asarray(v, I64).reshape(-1, 2) if k in ("copies", "swap_in", "swap_out") else v
                 for k, v in kw.items()})
    return StepPlan(**base)


def cow_step():
    # sequence 8 (forked from 7) gets a copy of block 3 in block 4 and writes its position 3 at slot 4*4+3
    return plan(copies=[[3, 4]], decode_seq_ids=np.array([8], I64), decode_context=np.array([4], np.int32),
                decode_slots=np.array([19], I64), decode_tables=np.array([[4]], np.int32))


def test_copy_checked_except_the_slot_the_step_writes():
    fb, chk = checked()
    chk.execute(cow_step())
    assert fb.writer[4].tolist() == [7, 7, 7, 8] and chk.checked_blocks == 1 and chk.checked_steps == 1


def test_copies_without_a_host_pool_read_no_host_block():
    """A step with copies only reads nothing back from the host, which may not exist (no swap space):
    found on an H100, where the real backend refused an empty host read."""
    fb = FakeBackend(verify=False)
    chk = KVContentCheck(fb)
    chk.setup(TINY, 6, 4, 0)
    fb.writer[3], fb.pos[3] = [7, 7, 7, -1], [0, 1, 2, -1]
    chk.execute(cow_step())
    assert chk.checked_blocks == 1


class DropsCopies(FakeBackend):
    def execute(self, plan):
        plan.copies = plan.copies[:0]
        return super().execute(plan)


class SwapsOutTheWrongBlock(FakeBackend):
    def execute(self, plan):
        plan.swap_out = plan.swap_out + np.array([1, 0])  # device block one off
        return super().execute(plan)


class SwapsInOneSlotShort(FakeBackend):
    def execute(self, plan):
        t = super().execute(plan)
        d = int(plan.swap_in[0, 1])
        self.pos[d, -1] = -1  # the last token of the block never arrives
        return t


def test_a_missed_copy_is_caught():
    _, chk = checked(DropsCopies)
    with pytest.raises(ExecutorError, match=r"step 0: after copy-on-write 3 -> 4, device block 4"):
        chk.execute(cow_step())


def test_a_wrong_swap_out_is_caught():
    _, chk = checked(SwapsOutTheWrongBlock)
    with pytest.raises(ExecutorError, match=r"after swap-out 3 -> 2, host block 2"):
        chk.execute(plan(swap_out=[[3, 2]]))
    fb, chk = checked()
    chk.execute(plan(swap_out=[[3, 2]]))
    assert fb.host_pos[2].tolist() == [0, 1, 2, -1]


def test_a_short_swap_in_is_caught():
    _, chk = checked(SwapsInOneSlotShort)
    with pytest.raises(ExecutorError, match=r"after swap-in 1 -> 5, device block 5"):
        chk.execute(plan(swap_in=[[1, 5]]))
    fb, chk = checked()
    chk.execute(plan(swap_in=[[1, 5]]))
    assert fb.pos[5].tolist() == [4, 5, 6, 7] and chk.checked_blocks == 1


def test_steps_without_copies_or_swaps_read_nothing():
    fb, chk = checked()
    fb.read_blocks = None  # would fail if called
    chk.inner.read_blocks = lambda *a: pytest.fail("read without a copy or swap")
    chk.execute(plan(decode_seq_ids=np.array([7], I64), decode_context=np.array([4], np.int32),
                     decode_slots=np.array([15], I64), decode_tables=np.array([[3]], np.int32)))
    assert chk.checked_blocks == 0


def test_validate_cow_and_swap_run_checks_kv(tmp_path, capsys):
    out = tmp_path / "v"
    args = ["validate", "--workload", "sharegpt", "--rate", "4", "--num-requests", "40", "--n", "2", "--kv-gib", "2",
            "--max-seq-len", "2048", "--preemption", "swap", "--swap-gib", "4", "--model", "llama-2-7b",
            "--gpu", "h200", "--system", "vllm", "--backend", "fake", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    m = json.loads((out / "validation.json").read_text())
    assert m["kv_check"] == "passed" and m["kv_checked_blocks"] >= m["executor_copies"] > 0
    assert re.search(r"K/V after copies and swaps\s+passed \(\d+ blocks compared\)", capsys.readouterr().out)
    assert main(args[:-2] + ["--no-check-kv", "--out", str(tmp_path / "n")]) == 0
    assert json.loads((tmp_path / "n" / "validation.json").read_text())["kv_check"] == "skipped"


def test_swapped_in_and_straight_back_out_in_one_step():
    # host block 1 -> device 5 (swap-in), then device 5 -> host 2 (swap-out): host 2 holds host 1's tokens
    fb, chk = checked()
    chk.execute(plan(swap_in=[[1, 5]], swap_out=[[5, 2]]))
    assert fb.host_pos[2].tolist() == [4, 5, 6, 7] and chk.checked_blocks == 2
