"""The GPU executor on CPU (FakeBackend, torch-on-CPU backend) and on a GPU (marked ``gpu``).

What the CPU tests prove:
* the scheduler and the paged manager are shared unchanged: the engine with a GPUExecutor
  whose fake step time is the roofline cost gives the very same request and step records
  (memory categories included) as ``run_simulation``, with beams, parallel sampling, swapping
  and chunked prefill;
* slot mappings and decode tables are the manager's block tables (hand-checked, block size 4);
* copy-on-write copies are issued exactly once per shared-block write (hand-checked, and equal
  to the manager's ``cow_copies`` at every step of whole runs);
* the K/V data flow (writes, copies, swaps) is right: the fake keeps a tag per slot and checks
  every read; the torch backend on CPU gives the same hidden state for a position whether it
  came from a whole prefill, chunks, or a decode over the paged pool.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.gpu.device import cuda_available, torch_cuda_available
from pagesim.gpu.executor import ExecutorError, FakeBackend, GPUExecutor, StepPlan, slots_for
from pagesim.gpu.tables import build_block_tables
from pagesim.sim.batch import StepBatch
from pagesim.sim.config import SimConfig
from pagesim.sim.cost import RooflineCostModel
from pagesim.sim.cost_models import swap_block_tokens
from pagesim.sim.engine import Engine
from pagesim.sim.errors import ConfigError
from pagesim.sim.memory import PagedManager, SeqSpec, StaticManager
from pagesim.sim.run import build, run_simulation
from pagesim.sim.specs import ModelSpec, get_gpu, get_model

I64 = np.int64
TINY = ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 101, 256)


def make_trace(n=50, seed=1, width=False, rate=20.0, pmax=200, omax=120):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                       "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                       "prompt_tokens": rng.integers(5, pmax, n), "output_tokens": rng.integers(1, omax, n)})
    if width:
        df["n"] = rng.choice([1, 2, 3], n)
        df["beam_width"] = np.where(df["n"] == 1, rng.choice([1, 3], n), 1)
    return df


CONFIGS = {
    "plain": dict(),
    "chunked": dict(chunked_prefill=True, chunk_budget=64),
    "swap": dict(preemption="swap", swap_gib=0.05),
    "swap-chunked": dict(preemption="swap", swap_gib=0.05, chunked_prefill=True, chunk_budget=96),
}


def cfg_for(name, **kw):
    return SimConfig.for_system("vllm", model="llama-2-7b", gpu="h200", kv_gib=0.25, max_seq_len=512,
                                check=True, **CONFIGS[name], **kw)


def run_engine(cfg, trace, backend, on_step=None):
    model, gpu, budget, table, mgr, sched, _ = build(cfg, trace, executor=object())
    ex = GPUExecutor(model, mgr, backend, scheduler=sched, on_step=on_step)
    eng = Engine(sched, mgr, ex, table.arrival_s, check=cfg.check)
    eng.run()
    return eng, ex, mgr, sched, table


# ------------------------------------------------------------------ shared scheduler and manager
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("width", [False, True])
def test_same_records_as_simulation(name, width):
    """GPUExecutor(fake time = roofline) reproduces run_simulation exactly: same objects, same policy."""
    cfg = cfg_for(name)
    trace = make_trace(width=width)
    sim = run_simulation(cfg, trace)
    model, gpu = get_model("llama-2-7b"), get_gpu("h200")
    roof = RooflineCostModel(model, gpu, 1, swap_block_tokens=swap_block_tokens(cfg))  # the simulation's price
    copies_per_step = []
    eng, ex, mgr, sched, table = run_engine(cfg, trace, FakeBackend(lambda plan: roof.step_time(plan.batch)),
                                            on_step=lambda b, p, dt: copies_per_step.append(len(p.copies)))
    from pagesim.sim.metrics import request_frame
    pd.testing.assert_frame_equal(request_frame(table), sim.requests)
    pd.testing.assert_frame_equal(eng.rec.frame(), sim.steps)
    assert sim.summary["mgr_cow_copies"] == ex.total_copies == sum(copies_per_step)
    if width:
        assert ex.total_copies > 0
    if name.startswith("swap"):
        assert ex.total_swap_out_blocks > 0 and ex.total_swap_in_blocks > 0
    # the observer is gone after close(): the manager is back to its class methods
    ex.close()
    assert "allocate" not in vars(mgr) and "free" not in vars(mgr) and "fork" not in vars(mgr)


def test_plan_mirrors_batch():
    cfg = cfg_for("chunked")
    seen = []

    def on_step(batch, plan, dt):
        assert plan.batch is batch
        assert plan.prefill_seq_ids.tolist() == batch.prefill_seq_ids.tolist()
        assert plan.prefill_tokens.tolist() == batch.prefill_tokens.tolist()
        assert plan.decode_seq_ids.tolist() == batch.decode_seq_ids.tolist()
        assert int(plan.decode_context.sum()) == batch.decode_context_sum
        assert len(plan.slot_mapping) == batch.num_prefill_tokens + batch.num_decode_tokens
        seen.append(plan.step)

    run_engine(cfg, make_trace(30, width=True), FakeBackend(), on_step)
    assert seen == list(range(len(seen))) and len(seen) > 100


def test_copies_equal_manager_cow_every_step():
    cfg = cfg_for("plain")
    state = {"last": 0, "n": 0}
    holder = {}

    def on_step(batch, plan, dt):
        c = holder["mgr"].stats()["cow_copies"]
        assert len(plan.copies) == c - state["last"], f"step {plan.step}"
        state["last"] = c
        state["n"] += len(plan.copies)

    model, gpu, budget, table, mgr, sched, _ = build(cfg, make_trace(width=True), executor=object())
    holder["mgr"] = mgr
    ex = GPUExecutor(model, mgr, FakeBackend(), scheduler=sched, on_step=on_step)
    Engine(sched, mgr, ex, table.arrival_s, check=True).run()
    assert state["n"] == mgr.stats()["cow_copies"] > 0


# ------------------------------------------------------------------ hand-checked small cases
def small(bs=4, cap=64):
    mgr = PagedManager(cap, 32, block_size=bs, watermark=0.0)
    fb = FakeBackend()
    ex = GPUExecutor(TINY, mgr, fb)
    return mgr, fb, ex


def prefill_batch(ids, tokens, ctx):
    return StepBatch(np.array(ids, I64), np.array(tokens, I64), np.array(ctx, I64))


def decode_batch(ids, ctx):
    return StepBatch(decode_seq_ids=np.array(ids, I64), decode_context=np.array(ctx, I64))


def test_slot_mapping_hand_checked_block_size_4():
    mgr, fb, ex = small()
    mgr.allocate(SeqSpec(0, 3, 10))  # A: block 0
    mgr.allocate(SeqSpec(1, 6, 12))  # B: blocks 1, 2
    mgr.append(0, 3)
    mgr.append(1, 6)
    ex.run_step(prefill_batch([0, 1], [3, 6], [3, 6]), mgr)
    p = fb.plans[-1]
    # A: positions 0..2 in block 0; B: positions 0..3 in block 1, 4..5 in block 2
    assert p.prefill_slots.tolist() == [0, 1, 2] + [4, 5, 6, 7, 8, 9]
    assert p.prefill_positions.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5]
    assert p.prefill_tables.tolist() == [[0, -1], [1, 2]]
    assert len(p.copies) == 0 and len(p.decode_slots) == 0

    mgr.append_batch([0, 1])  # A -> 4 tokens (slot 3), B -> 7 tokens (block 2 offset 2 = slot 10)
    ex.run_step(decode_batch([0, 1], [4, 7]), mgr)
    p = fb.plans[-1]
    assert p.decode_slots.tolist() == [3, 10]
    assert p.decode_tables.tolist() == [[0, -1], [1, 2]] and p.decode_context.tolist() == [4, 7]

    mgr.append_batch([0, 1])  # A crosses into a new block (3): slot 12; B: slot 11
    ex.run_step(decode_batch([0, 1], [5, 8]), mgr)
    p = fb.plans[-1]
    assert mgr.block_table(0) == [0, 3] and mgr.block_table(1) == [1, 2]
    assert p.decode_slots.tolist() == [12, 11]
    assert p.decode_tables.tolist() == [[0, 3], [1, 2]]
    assert p.decode_tables.dtype == np.int32 and p.decode_context.dtype == np.int32
    # the same as the colleague's table builder over the manager's export
    bt = build_block_tables(mgr.export(), seq_ids=[0, 1])
    assert bt.block_tables.tolist() == p.decode_tables.tolist()
    assert bt.slot_mapping(0, 4, 5).tolist() == [12] and bt.slot_mapping(1, 7, 8).tolist() == [11]
    assert [c[0] for c in fb.calls] == ["setup", "reshape_and_cache", "prefill_attention",
                                        "reshape_and_cache", "decode_attention",
                                        "reshape_and_cache", "decode_attention"]


def test_cow_copy_once_per_shared_block_write():
    mgr, fb, ex = small()
    mgr.allocate(SeqSpec(0, 6, 12))  # blocks 0, 1 (block 1 half full after the prefill)
    mgr.append(0, 6)
    ex.run_step(prefill_batch([0], [6], [6]), mgr)
    mgr.fork(0, 5, 12)  # child 5 shares blocks 0 and 1
    mgr.fork(0, 6, 12)  # and child 6: block 1 has three references
    assert mgr.export().refcounts[1] == 3
    before = mgr.stats()["cow_copies"]
    mgr.append_batch([0, 5, 6])  # three writers into block 1 with 3 refs: 2 copies, the last writes in place
    ex.run_step(decode_batch([0, 5, 6], [7, 7, 7]), mgr)
    p = fb.plans[-1]
    assert mgr.stats()["cow_copies"] - before == 2 == len(p.copies)
    assert set(p.copies[:, 0].tolist()) == {1}  # both copies read the shared block
    tables = [mgr.block_table(s) for s in (0, 5, 6)]
    assert sorted(p.copies[:, 1].tolist()) == sorted(t[1] for t in tables if t[1] != 1)
    assert p.forks == [(0, 5), (0, 6)]
    # a write into now-private blocks copies nothing
    mgr.append_batch([0, 5, 6])
    ex.run_step(decode_batch([0, 5, 6], [8, 8, 8]), mgr)
    assert len(fb.plans[-1].copies) == 0
    # forking at a block boundary: new blocks, no copy
    mgr.fork(5, 9, 12)
    mgr.append_batch([5, 9])
    ex.run_step(decode_batch([5, 9], [9, 9]), mgr)
    assert len(fb.plans[-1].copies) == 0
    assert ex.total_copies == mgr.stats()["cow_copies"] == 2


def test_manager_copy_hook_is_used():
    class Hooked(PagedManager):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.log = []

        def drain_copies(self):
            out, self.log = self.log, []
            return out

    mgr = Hooked(64, 32, block_size=4, watermark=0.0)
    fb = FakeBackend(verify=False)
    ex = GPUExecutor(TINY, mgr, fb)
    mgr.allocate(SeqSpec(0, 2, 8))
    mgr.append(0, 2)
    mgr.log = [(3, 4)]
    ex.run_step(prefill_batch([0], [2], [2]), mgr)
    assert fb.plans[-1].copies.tolist() == [[3, 4]]


def test_fake_detects_a_wrong_slot():
    mgr, fb, ex = small()
    mgr.allocate(SeqSpec(0, 5, 8))
    mgr.append(0, 5)
    ex.run_step(prefill_batch([0], [5], [5]), mgr)
    mgr.append_batch([0])
    plan = ex.plan(decode_batch([0], [6]))
    plan.decode_slots = plan.decode_slots + 1  # write the token one slot off
    with pytest.raises(ExecutorError, match="position"):
        fb.execute(plan)


def test_a_slot_past_the_pool_is_refused_before_the_backend_runs():
    mgr, fb, ex = small()
    mgr.allocate(SeqSpec(0, 5, 8))
    mgr.append(0, 5)
    real = ex._table_of
    ex._table_of = lambda s: [ex.num_blocks] + list(real(s))[1:]  # a block id one past the pool
    with pytest.raises(ExecutorError, match=f"outside the pool's {ex.num_blocks * ex.block_size} slots"):
        ex.run_step(prefill_batch([0], [5], [5]), mgr)
    assert not fb.plans


def test_batch_inconsistent_with_manager_is_caught():
    mgr, fb, ex = small()
    mgr.allocate(SeqSpec(0, 5, 8))
    mgr.append(0, 5)
    with pytest.raises(ExecutorError, match="context"):
        ex.run_step(prefill_batch([0], [5], [6]), mgr)


def test_needs_a_paged_manager():
    with pytest.raises(ConfigError, match="paged"):
        GPUExecutor(TINY, StaticManager(64, 16), FakeBackend())


def test_slots_for():
    assert slots_for([7, 2], 2, 7, 4).tolist() == [30, 31, 8, 9, 10]


def test_fake_time_formula_and_sleep():
    fb = FakeBackend(base_s=0.001, per_token_s=0.0, per_context_s=0.0, sleep=True)
    fb.setup(TINY, 4, 4, 0)
    import time
    t0 = time.perf_counter()
    assert fb.execute(StepPlan(0, 4, 4)) == pytest.approx(0.001)
    assert time.perf_counter() - t0 >= 0.001


# ------------------------------------------------------------------ the torch backend on CPU
def _torch_or_skip():
    return pytest.importorskip("torch")


def _reference_states(positions, seed=0):
    """Hidden state at each position from one fresh whole-prompt prefill (no pool reads)."""
    from pagesim.gpu.model_runner import TorchCupyBackend
    out = {}
    for p in positions:
        mgr = PagedManager(512, 256, block_size=4, watermark=0.0)
        be = TorchCupyBackend(dtype="float32", device="cpu", seed=seed)
        ex = GPUExecutor(TINY, mgr, be)
        mgr.allocate(SeqSpec(0, p + 1, p + 1))
        mgr.append(0, p + 1)
        ex.run_step(prefill_batch([0], [p + 1], [p + 1]), mgr)
        out[p] = be.last_outputs[2][0].clone()
    return out


@pytest.mark.parametrize("name", ["chunked", "swap"])
def test_torch_backend_cpu_paged_data_flow(name):
    """Same position -> same hidden state, however it was computed (prefill, chunks, decode over
    the paged pool after copy-on-write and swaps)."""
    torch = _torch_or_skip()
    from pagesim.gpu.model_runner import TorchCupyBackend
    # the scheduler and pool are sized in llama-2-7b bytes (160 slots, 60 swap slots); the tiny
    # model runs over that many blocks
    kvb = get_model("llama-2-7b").kv_bytes_per_token() / 2**30
    kw = dict(chunked_prefill=True, chunk_budget=24) if name == "chunked" else dict(preemption="swap",
                                                                                     swap_gib=60 * kvb)
    cfg = SimConfig.for_system("vllm", model="llama-2-7b", kv_gib=160 * kvb, max_seq_len=128, block_size=4,
                               check=True, watermark=0.0, **kw)
    trace = make_trace(10, seed=3, width=True, rate=50, pmax=40, omax=25)
    # everyone arrives at once: the step times are real CPU timings, and staggered arrivals would
    # make whether the pool fills up (and swaps) depend on how fast this machine is
    trace["arrival_s"] = 0.0
    model, gpu, budget, table, mgr, sched, _ = build(cfg, trace, executor=object())
    be = TorchCupyBackend(dtype="float32", device="cpu")
    states: dict[int, list] = {}

    def on_step(batch, plan, dt):
        pos, _tok, hs = be.last_outputs
        assert torch.isfinite(hs).all()
        for p, h in zip(pos.tolist(), hs):
            states.setdefault(p, []).append(h.clone())

    ex = GPUExecutor(TINY, mgr, be, scheduler=sched, on_step=on_step)
    Engine(sched, mgr, ex, table.arrival_s, check=True).run()
    assert (table.status == 4).all()
    assert ex.total_copies > 0
    if name == "swap":
        assert ex.total_swap_out_blocks > 0 and sched.num_preemptions > 0
    for p, hs in states.items():
        for h in hs[1:]:
            torch.testing.assert_close(h, hs[0], atol=2e-4, rtol=2e-4)
    some = sorted(states)[:: max(1, len(states) // 6)]
    ref = _reference_states(some)
    for p in some:
        torch.testing.assert_close(states[p][0], ref[p], atol=2e-4, rtol=2e-4)


def test_torch_backend_cpu_layer_scaling_arithmetic():
    _torch_or_skip()
    from pagesim.gpu.model_runner import TorchCupyBackend
    m4 = ModelSpec("tiny4", 4, 64, 4, 2, 16, 128, 101, 256)
    mgr = PagedManager(256, 64, block_size=4, watermark=0.0)
    be = TorchCupyBackend(dtype="float32", device="cpu", num_layers_run=1)
    ex = GPUExecutor(m4, mgr, be)
    mgr.allocate(SeqSpec(0, 9, 20))
    mgr.append(0, 9)
    t = ex.run_step(prefill_batch([0], [9], [9]), mgr)
    lt = be.last_timing
    assert be.kv.shape[0] == 1 and lt["scale"] == 4
    assert lt["step_s"] == pytest.approx(lt["wall_s"] + 3 * lt["layer_span_s"])
    assert t >= lt["step_s"]  # plus the executor's host preparation


# ------------------------------------------------------------------ on a GPU
TINY_GPU = ModelSpec("tiny-gpu", 2, 256, 4, 2, 64, 512, 1000, 512)


def _manual_steps(model, be, lens=(37, 5, 80), decode_steps=3, bs=16):
    """Prefill three sequences, then decode them: (manager, executor) after the steps."""
    mgr = PagedManager(4096, 512, block_size=bs, watermark=0.0)
    ex = GPUExecutor(model, mgr, be)
    for s, L in enumerate(lens):
        mgr.allocate(SeqSpec(s, L, L + decode_steps + 1))
        mgr.append(s, L)
    ex.run_step(prefill_batch(list(range(len(lens))), list(lens), list(lens)), mgr)
    ctx = np.array(lens, I64)
    for _ in range(decode_steps):
        ids = list(range(len(lens)))
        mgr.append_batch(ids)
        ctx = ctx + 1
        ex.run_step(decode_batch(ids, ctx), mgr)
    return mgr, ex


@pytest.mark.gpu
@pytest.mark.skipif(not (cuda_available() and torch_cuda_available()), reason="needs CuPy and torch with CUDA")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_backend_finite_outputs(dtype):
    import torch
    from pagesim.gpu.model_runner import TorchCupyBackend
    be = TorchCupyBackend(dtype=dtype)
    mgr, ex = _manual_steps(TINY_GPU, be)
    pos, tok, hs = be.last_outputs
    assert torch.isfinite(hs.float()).all() and len(tok) == 3
    assert be.last_timing["step_s"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not (cuda_available() and torch_cuda_available()), reason="needs CuPy and torch with CUDA")
def test_gpu_decode_kernel_equals_sdpa_over_live_tables():
    import torch
    from pagesim.gpu.model_runner import TorchCupyBackend
    be = TorchCupyBackend(dtype="float16")
    mgr, ex = _manual_steps(TINY_GPU, be)
    ids = [0, 1, 2]
    mgr.append_batch(ids)
    plan = ex.plan(decode_batch(ids, np.array([mgr.num_tokens(s) for s in ids], I64)))
    q = torch.randn(3, be.H, be.D, device="cuda", dtype=torch.float16)
    kc, vc = be.kv[0, 0], be.kv[0, 1]
    tables = torch.as_tensor(plan.decode_tables, device="cuda")
    lens = torch.as_tensor(plan.decode_context, device="cuda")
    be.attention = "kernel"
    out_k = be._decode_attention(q, kc, vc, tables, lens, plan, [])
    slots = [(torch.as_tensor(slots_for(plan.decode_tables[r], 0, int(c), be.block_size), device="cuda"), int(c))
             for r, c in enumerate(plan.decode_context.tolist())]
    be.attention = "torch"
    out_t = be._decode_attention(q, kc, vc, tables, lens, plan, slots)
    torch.testing.assert_close(out_k.float(), out_t.float(), atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not (cuda_available() and torch_cuda_available()), reason="needs CuPy and torch with CUDA")
def test_layer_scaling_matches_full():
    """N layers x L/N (plus the unscaled rest) is within 10 % of running all L layers."""
    from pagesim.gpu.model_runner import TorchCupyBackend
    model = ModelSpec("mid", 16, 2048, 16, 16, 128, 5504, 32000, 2048)

    def timed(n_layers):
        be = TorchCupyBackend(dtype="float16", num_layers_run=n_layers)
        mgr = PagedManager(64 * 1024, 2048, block_size=16, watermark=0.0)
        ex = GPUExecutor(model, mgr, be, include_prep=False)
        ids = list(range(32))
        for s in ids:
            mgr.allocate(SeqSpec(s, 512, 600))
            mgr.append(s, 512)
        ex.run_step(prefill_batch(ids, [512] * 32, [512] * 32), mgr)  # warm-up + fills the pool
        times = []
        ctx = np.full(32, 512, I64)
        for _ in range(20):
            mgr.append_batch(ids)
            ctx = ctx + 1
            times.append(ex.run_step(decode_batch(ids, ctx), mgr))
        return float(np.median(times[5:]))

    full, part = timed(16), timed(4)
    assert abs(part - full) / full < 0.10, (part, full)


def test_hold_sized_from_the_median_recent_launch_time():
    """The device timing's hold (model_runner.TIMINGS), worked by hand: a decode step is one launch
    group, a step with 3 prefill sequences 4. With nothing seen: 20 ms. Launch times per group of
    5, 7 and 1000 ms (a first compilation): median 7 ms, so a decode step expects 7 ms and a step of
    3 prefills 28 ms (the 1 s outlier does not count); the estimate is capped at 2 s."""
    from pagesim.gpu.model_runner import TorchCupyBackend
    be = TorchCupyBackend(timing="device")
    assert be._hold_estimate(0) == pytest.approx(0.02)
    be._launch_per_group.extend([0.005, 0.007, 1.0])
    assert be._hold_estimate(0) == pytest.approx(0.007)
    assert be._hold_estimate(3) == pytest.approx(0.028)
    be._launch_per_group.extend([1.0] * 16)
    assert be._hold_estimate(5) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="timing"):
        TorchCupyBackend(timing="graphs")


def test_warm_up_runs_every_torch_path_and_writes_no_block(monkeypatch):
    """The device timing's warm-up (model_runner._warm_up) at token counts 1..64 on the CPU paths:
    it runs, and the KV pool is as setup left it (all zeros): no block is written."""
    _torch_or_skip()
    import pagesim.gpu.model_runner as mr
    monkeypatch.setattr(mr, "RESERVE_TOKENS", 64)
    be = mr.TorchCupyBackend(dtype="float32", device="cpu")
    be.setup(TINY_GPU, 64, 16, 0)
    be._warm_up()
    assert not be.kv.any()
