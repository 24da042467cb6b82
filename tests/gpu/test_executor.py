"""The GPU executor on CPU (FakeBackend, torch-on-CPU backend) and on a GPU (marked ``gpu``).

What the CPU tests prove:
* the executor runs the core's own schedule: ``run_simulation(..., executor=GPUExecutor(...))``
  whose fake step time is the roofline cost gives the very same request and step records
  (memory categories included) as a simulation, with beams, parallel sampling, swapping and
  chunked prefill;
* its plans are the core's step contract: slot mappings and tables are the core's block tables,
  copy-on-write pairs and swapped blocks the ones the core recorded (hand-checked, block size 4);
* the K/V data flow (writes, copies, swaps) is right: the fake keeps a tag per slot and checks
  every read; the torch backend on CPU gives the same hidden state for a position whether it
  came from a whole prefill, chunks, or a decode over the paged pool.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.gpu.device import cuda_available, torch_cuda_available
from pagesim.gpu.executor import ExecutorError, GPUExecutor, StepPlan, plan_step, slots_for
from pagesim.gpu.fake_backend import FakeBackend
from pagesim.gpu.kv_check import KVContentCheck
from pagesim.gpu.testing import HandSteps
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.cost.models import swap_block_tokens
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import resolve_budget, run_simulation
from pagesim.sim.specs import ModelSpec, get_gpu, get_model

I64 = np.int64
TINY = ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 101, 256)
KVB = get_model("llama-2-7b").kv_bytes_per_token()


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


def run(cfg, trace, backend, **kw):
    ex = GPUExecutor(TINY, backend, **kw)
    return run_simulation(cfg, trace, executor=ex), ex


# ------------------------------------------------------------------ the core's own schedule
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("width", [False, True])
def test_same_records_as_simulation(name, width):
    """GPUExecutor(fake time = roofline) reproduces run_simulation exactly: the same core, the
    same policy; the fake backend's checks pass on every step (copies, swaps, reads)."""
    cfg = cfg_for(name)
    trace = make_trace(width=width)
    sim = run_simulation(cfg, trace)
    roof = RooflineCostModel(get_model("llama-2-7b"), get_gpu("h200"), 1, swap_block_tokens=swap_block_tokens(cfg),
                             kernel_block_tokens=cfg.kernel_block_tokens)  # the simulation's price
    copies_per_step = []
    # a swap-only plan run first (StepPlan.first: a second pass's swap-ins after the first's
    # swap-outs) has no batch: the step's plan prices all its swaps, as the simulation does
    real, ex = run(cfg, trace, FakeBackend(lambda plan: roof.step_time(plan.batch) if plan.batch is not None else 0.0),
                   on_step=lambda b, p, dt: copies_per_step.append(len(p.copies)))
    assert real.summary["engine"] == sim.summary["engine"]
    pd.testing.assert_frame_equal(real.requests, sim.requests)
    pd.testing.assert_frame_equal(real.steps, sim.steps)
    assert sim.summary["mgr_cow_copies"] == ex.total_copies == sum(copies_per_step)
    assert len(copies_per_step) == len(sim.steps)
    if width:
        assert ex.total_copies > 0
    if name.startswith("swap"):
        assert ex.total_swap_out_blocks > 0 and ex.total_swap_in_blocks > 0
    assert not ex.host and len(ex._host_free) == ex.host_blocks  # every host block given back


def test_plan_mirrors_batch():
    seen = []

    def on_step(batch, plan, dt):
        assert plan.batch is batch
        assert plan.prefill_seq_ids.tolist() == batch.prefill_seq_ids.tolist()
        assert plan.prefill_tokens.tolist() == batch.prefill_tokens.tolist()
        assert plan.decode_seq_ids.tolist() == batch.decode_seq_ids.tolist()
        assert int(plan.decode_context.sum()) == batch.decode_context_sum
        assert len(plan.slot_mapping) == batch.num_prefill_tokens + batch.num_decode_tokens
        assert batch.copy_blocks == len(plan.copies) and batch.copy_tokens == plan.block_size * len(plan.copies)
        seen.append(plan.step)

    run(cfg_for("chunked"), make_trace(30, width=True), FakeBackend(), on_step=on_step)
    assert seen == list(range(len(seen))) and len(seen) > 100


def test_needs_a_paged_manager():
    cfg = SimConfig.for_system("orca-max", model="llama-2-7b", gpu="h200", kv_gib=0.25, max_seq_len=512)
    with pytest.raises(ConfigError, match="paged"):
        run_simulation(cfg, make_trace(5), executor=GPUExecutor(TINY, FakeBackend()))


def test_refuses_an_fp8_kv_cache():
    # the GPU mode's kernels keep a 16-bit cache: --kv-cache-dtype fp8 is simulated only
    fp8 = SimConfig.for_system("vllm", model="llama-2-7b", gpu="h200", kv_gib=0.25, max_seq_len=512,
                               kv_cache_dtype="fp8")
    with pytest.raises(ConfigError, match="the GPU mode keeps the KV cache at the model's 16-bit dtype; "
                                          "--kv-cache-dtype fp8 is simulated only"):
        GPUExecutor(resolve_budget(fp8)[0], FakeBackend())


# ------------------------------------------------------------------ hand-checked small cases
def tiny(rows, **kw):
    """A pool of 4 blocks of 4 tokens (llama-2-7b bytes): the core hands out blocks 3, 2, 1, 0."""
    trace = pd.DataFrame(rows, columns=["arrival_s", "prompt_tokens", "output_tokens", "n"])
    trace.insert(0, "request_id", [f"r{i}" for i in range(len(trace))])
    cfg = SimConfig.for_system("vllm", model="llama-2-7b", gpu="h200", kv_gib=16 * KVB / 2**30, max_seq_len=16,
                               block_size=4, watermark=0.0, check=True, **kw)
    return trace, cfg


def test_fork_copy_on_write_slots_and_tables_hand_checked():
    """A: 6 prompt tokens, 2 output, n = 2. Step 0 prefills it into blocks 3 (positions 0-3:
    slots 12-15) and 2 (4-5: slots 8, 9). Step 1: sequence 0 writes into the shared tail 2, so
    block 2 is copied into a fresh block 1 first; position 6 goes to slot 1 * 4 + 2 = 6 for
    sequence 0 and 2 * 4 + 2 = 10 for sequence 1; A finishes. (A third output token would find
    1 free block for its 2 sequences: vLLM's rule would swap A out.)"""
    trace, cfg = tiny([(0.0, 6, 2, 2)])
    fb = FakeBackend()
    run(cfg, trace, KVContentCheck(fb))
    p0, p1 = fb.plans
    assert p0.prefill_slots.tolist() == [12, 13, 14, 15, 8, 9] and p0.prefill_positions.tolist() == list(range(6))
    assert p0.prefill_tables.tolist() == [[3, 2]] and p0.prefill_tables.dtype == np.int32
    assert len(p0.copies) == 0 and len(p0.decode_slots) == 0
    assert p1.copies.tolist() == [[2, 1]]
    assert p1.decode_tables.tolist() == [[3, 1], [3, 2]] and p1.decode_context.tolist() == [7, 7]
    assert p1.decode_slots.tolist() == [6, 10] and p1.decode_seq_ids.tolist() == [0, 0]
    assert p1.decode_tables.dtype == np.int32 and p1.decode_context.dtype == np.int32
    assert [c[0] for c in fb.calls] == ["setup", "reshape_and_cache", "prefill_attention", "copy_blocks",
                                        "reshape_and_cache", "decode_attention"]


def test_swap_out_and_in_hand_checked():
    """A (4 + 3 tokens) and B (4 + 10): B is swapped out at step 2 from blocks [2, 0] into the
    executor's first host blocks 0 and 1, and comes back at step 3 into [1, 3] (the core's
    tests/sim/core/test_step_output.py works the blocks out): host 0 -> 1, host 1 -> 3. Then
    B's reads of positions 0-5 through [1, 3] find what it wrote before it left."""
    trace, cfg = tiny([(0.0, 4, 3, 1), (0.0, 4, 10, 1)], preemption="swap", swap_gib=1.0)
    fb = FakeBackend()
    chk = KVContentCheck(fb)
    res, ex = run(cfg, trace, chk, host_blocks=8)
    p = fb.plans
    assert p[2].swap_out.tolist() == [[2, 0], [0, 1]] and len(p[2].swap_in) == 0
    assert (p[2].swap_out_tokens, p[2].swap_in_tokens) == (5, 0)
    assert p[3].swap_in.tolist() == [[0, 1], [1, 3]] and len(p[3].swap_out) == 0
    assert p[3].decode_tables.tolist() == [[1, 3]] and p[3].decode_context.tolist() == [6]
    assert ex.total_swap_out_blocks == ex.total_swap_in_blocks == 2 and chk.checked_blocks == 4
    assert res.summary["num_preemptions"] == 1 and ex.host == {}


def test_a_swapped_group_recomputed_gives_its_host_blocks_back():
    """B (4 + 10) and A (4 + 3, n = 2): A is swapped out twice (the second time with nothing
    else running, so the core recomputes it instead of swapping it back in: a swap fallback).
    Its sequences' host blocks go back to the free list then, and the run ends with none held.
    Step 1: its shared block 2 goes out once, with sequence 0, to host 0; step 10: it comes back
    into device block 3, which the sequences share again (tests/sim/core/test_step_output.py
    works the schedule out); step 11: host 0 (given back at step 10) and 1 take sequence 0's
    [3, 1], host 2 sequence 1's own block 2 (block 3, shared, goes once)."""
    trace, cfg = tiny([(0.0, 4, 10, 1), (0.0, 4, 3, 2)], preemption="swap", swap_gib=1.0)
    fb = FakeBackend()
    res, ex = run(cfg, trace, fb, host_blocks=8)
    outs = [k for k, p in enumerate(fb.plans) if len(p.swap_out)]
    assert outs == [1, 11] and fb.plans[1].swap_out.tolist() == [[2, 0]]
    assert fb.plans[10].swap_in.tolist() == [[0, 3]]
    assert fb.plans[11].swap_out.tolist() == [[3, 0], [1, 1], [2, 2]]
    assert res.summary["num_swap_fallbacks"] >= 1 and ex.host == {} and len(ex._host_free) == 8


def test_swap_outs_of_a_first_pass_run_before_the_second_passs_swap_in():
    """X (4 + 10, n = 4) and Y (5 + 10): step 1's first scheduling pass swaps out Y from [2, 1]
    and X (its 4 sequences share block 3), then a second pass at the same instant swaps Y back
    into 3 and 2 (tests/sim/core/test_step_output.py works it out). Those swap-outs run first, as
    a plan of their own: Y to host 0, 1 and X's shared block, once, to host 2; then the step's
    plan brings Y's host 0, 1 into 3, 2, where its reads of positions 0-5 find what it wrote
    (the fake checks every read).
    Later steps swap X out and recompute it at once (a second pass's swap fallback): it holds no
    host block after any step."""
    trace, cfg = tiny([(0.0, 4, 10, 4), (0.0, 5, 10, 1)], preemption="swap", swap_gib=1.0)
    fb = FakeBackend()
    chk = KVContentCheck(fb)
    held = []

    def on_step(batch, plan, dt):
        held.append(sorted({i for i, _ in ex.host if ex.core.status[i] != state.SWAPPED}))

    ex = GPUExecutor(TINY, chk, on_step=on_step)
    res = run_simulation(cfg, trace, executor=ex)
    assert held == [[]] * len(held) and res.summary["num_swap_fallbacks"] >= 5
    first, main = fb.plans[1], fb.plans[2]
    assert main.first is first and first.num_tokens == 0 and len(first.swap_in) == len(first.copies) == 0
    assert first.swap_out.tolist() == [[2, 0], [1, 1], [3, 2]]
    assert main.swap_in.tolist() == [[0, 3], [1, 2]] and len(main.swap_out) == 0
    assert main.decode_tables.tolist() == [[3, 2]] and main.decode_slots.tolist() == [9]
    assert chk.checked_blocks >= 3 + 2 and ex.host == {} and len(ex._host_free) == ex.host_blocks
    assert res.summary["num_preemptions"] >= 2


def test_fake_detects_a_wrong_slot():
    fb = FakeBackend()
    steps = HandSteps(TINY, fb, num_blocks=8, block_size=4)
    steps.prefill([0], [5])
    plan = steps.plan_decode([0])
    plan.decode_slots = plan.decode_slots + 1  # write the token one slot off
    with pytest.raises(ExecutorError, match="position"):
        fb.execute(plan)


def test_a_slot_past_the_pool_is_refused_before_the_backend_runs():
    class Corrupt(GPUExecutor):
        def plan(self, core):
            core.block_table[core.seq_slot[0, 0], 0] = self.num_blocks  # a block id one past the pool
            return super().plan(core)

    trace, cfg = tiny([(0.0, 4, 3, 1)])
    fb = FakeBackend()
    with pytest.raises(ExecutorError, match="outside the pool's 16 slots"):
        run_simulation(cfg, trace, executor=Corrupt(TINY, fb))
    assert not fb.plans


def test_slots_for():
    assert slots_for([7, 2], 2, 7, 4).tolist() == [30, 31, 8, 9, 10]


def test_plan_step_positions_and_slots_of_chunks():
    """A chunk of 3 tokens ending at context 6 (positions 3-5) over table [5, 1], block size 4:
    slots 23, 4, 5; a decode at context 2 over [7] writes position 1: slot 29."""
    p = plan_step(0, 4, 8, prefill_seq_ids=[0], prefill_tokens=[3], prefill_context=[6],
                  prefill_tables=[[5, 1]], decode_seq_ids=[1], decode_context=[2], decode_tables=[[7]])
    assert p.prefill_positions.tolist() == [3, 4, 5] and p.prefill_slots.tolist() == [23, 4, 5]
    assert p.decode_slots.tolist() == [29] and p.slot_mapping.tolist() == [23, 4, 5, 29]


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
        be = TorchCupyBackend(dtype="float32", device="cpu", seed=seed)
        HandSteps(TINY, be, num_blocks=256, block_size=4).prefill([0], [p + 1])
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
    be = TorchCupyBackend(dtype="float32", device="cpu")
    states: dict[int, list] = {}

    def on_step(batch, plan, dt):
        pos, _tok, hs = be.last_outputs
        assert torch.isfinite(hs).all()
        for p, h in zip(pos.tolist(), hs):
            states.setdefault(p, []).append(h.clone())

    res, ex = run(cfg, trace, be, on_step=on_step)
    assert (res.requests["status"] == "finished").all()
    assert ex.total_copies > 0
    if name == "swap":
        assert ex.total_swap_out_blocks > 0 and res.summary["num_preemptions"] > 0
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
    be = TorchCupyBackend(dtype="float32", device="cpu", num_layers_run=1)
    t = HandSteps(m4, be, num_blocks=64, block_size=4).prefill([0], [9])
    lt = be.last_timing
    assert be.kv.shape[0] == 1 and lt["scale"] == 4
    assert lt["step_s"] == pytest.approx(lt["wall_s"] + 3 * lt["layer_span_s"])
    assert t >= lt["step_s"]  # plus the executor's host preparation


# ------------------------------------------------------------------ on a GPU
TINY_GPU = ModelSpec("tiny-gpu", 2, 256, 4, 2, 64, 512, 1000, 512)


def _manual_steps(model, be, lens=(37, 5, 80), decode_steps=3, bs=16):
    """Prefill three sequences, then decode them: the hand-built steps after them."""
    steps = HandSteps(model, be, num_blocks=512, block_size=bs)
    ids = list(range(len(lens)))
    steps.prefill(ids, list(lens))
    for _ in range(decode_steps):
        steps.decode(ids)
    return steps


@pytest.mark.gpu
@pytest.mark.skipif(not (cuda_available() and torch_cuda_available()), reason="needs CuPy and torch with CUDA")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_backend_finite_outputs(dtype):
    import torch
    from pagesim.gpu.model_runner import TorchCupyBackend
    be = TorchCupyBackend(dtype=dtype)
    _manual_steps(TINY_GPU, be)
    pos, tok, hs = be.last_outputs
    assert torch.isfinite(hs.float()).all() and len(tok) == 3
    assert be.last_timing["step_s"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not (cuda_available() and torch_cuda_available()), reason="needs CuPy and torch with CUDA")
def test_gpu_decode_kernel_equals_sdpa_over_live_tables():
    import torch
    from pagesim.gpu.model_runner import TorchCupyBackend
    be = TorchCupyBackend(dtype="float16")
    steps = _manual_steps(TINY_GPU, be)
    plan = steps.plan_decode([0, 1, 2])
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
    """N layers x L/N (plus the unscaled rest) is within 10 % of running all L layers. The two
    runners' decode steps alternate and each is read at its fastest: with other GPU tests on the
    same device (the programme runs them on 4 workers), medians taken one runner after the other
    saw different loads and missed by 11 % (H200, 2026-11-27 and 2026-11-28; both passed alone)."""
    from pagesim.gpu.model_runner import TorchCupyBackend
    model = ModelSpec("mid", 16, 2048, 16, 16, 128, 5504, 32000, 2048)
    ids = list(range(32))
    runners = {}
    for n_layers in (16, 4):
        be = TorchCupyBackend(dtype="float16", num_layers_run=n_layers)
        runners[n_layers] = HandSteps(model, be, num_blocks=2048, block_size=16, include_prep=False)
        runners[n_layers].prefill(ids, [512] * 32)  # warm-up + fills the pool
    times = {n: [] for n in runners}
    for _ in range(20):
        for n, steps in runners.items():
            times[n].append(steps.decode(ids))
    full, part = (min(times[n][5:]) for n in (16, 4))
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


def test_a_replayed_graphs_hold_is_sized_from_its_launch_calls():
    """A replayed decode graph is one launch call: held for the median of the last 16 calls (2 ms
    with none seen), capped at 2 s. Calls of 1, 3 and 5000 ms: 3 ms."""
    from pagesim.gpu.model_runner import TorchCupyBackend
    be = TorchCupyBackend(timing="device")
    assert be._hold_estimate(0, graph=True) == pytest.approx(0.002)
    be._graph_launch.extend([0.001, 0.003, 5.0])
    assert be._hold_estimate(0, graph=True) == pytest.approx(0.003)
    be._graph_launch.extend([5.0] * 16)
    assert be._hold_estimate(0, graph=True) == pytest.approx(2.0)
    assert be._hold_estimate(0) == pytest.approx(0.02)  # the eager steps' own record, untouched


def test_a_held_step_counts_its_parts_once():
    """model_runner.device_step_timing by hand, 4 of 32 layers run (x8): preparation 1 ms, uploads
    0.2 ms, the 4 layers' span 0.5 ms, the LM head 0.3 ms, launches 0.6 ms.
    An eager step held: 1 + 8 x 0.5 + 0.3 = 5.3 ms; the device's 0.2 + 4 + 0.3 = 4.5 ms; host 0.8 ms;
        its launches are the 4 layers', 8 x 0.6 = 4.8 ms a step.
    A graph held past its launch call: the call once, 5.3 + 0.6 = 5.9 ms (host 1.4 ms); reported as
        one call, 0.6 ms. A graph whose hold ran short: the call is inside the span, 5.3 ms."""
    from pagesim.gpu.model_runner import device_step_timing
    parts = dict(prep_s=1e-3, head_s=0.2e-3, span_s=0.5e-3, tail_s=0.3e-3, scale=8.0, launch_s=0.6e-3)
    eager = device_step_timing(**parts, graph=False)
    assert [eager[k] * 1e3 for k in ("step_s", "gpu_s", "host_s", "launch_s")] == pytest.approx([5.3, 4.5, 0.8, 4.8])
    held = device_step_timing(**parts, graph=True, held_launch_s=0.6e-3)
    assert [held[k] * 1e3 for k in ("step_s", "gpu_s", "host_s", "launch_s")] == pytest.approx([5.9, 4.5, 1.4, 0.6])
    assert device_step_timing(**parts, graph=True)["step_s"] == pytest.approx(5.3e-3)


def test_warm_up_token_counts_by_hand():
    """Powers of two by default; dense (pagesim validate): every count up to the bound, then every
    stride-th: a matmul's and flash attention's kernels are chosen by the row count, and each first
    use may wait for the GPU (lazy loading)."""
    from pagesim.gpu.model_runner import warm_up_token_counts
    assert warm_up_token_counts(0, reserve=20) == [1, 2, 4, 8, 16]
    assert warm_up_token_counts(0) == [1 << k for k in range(14)]  # 1 ... 8,192
    assert warm_up_token_counts(4, reserve=20, stride=8) == [1, 2, 3, 4, 8, 16]
    assert warm_up_token_counts(10, reserve=30, stride=8) == list(range(1, 11)) + [16, 24]
    assert warm_up_token_counts(10, reserve=8) == list(range(1, 9))
    counts = warm_up_token_counts(1024)  # 1 ... 1,024, then 1,088 ... 8,192
    assert counts[:3] == [1, 2, 3] and counts[1023:1026] == [1024, 1088, 1152] and counts[-1] == 8192
    assert len(counts) == 1024 + 112


def test_warm_up_runs_every_torch_path_and_writes_no_block(monkeypatch):
    """The device timing's warm-up (model_runner._warm_up), dense to 8 tokens, at token counts
    1..8 and 64 on the CPU paths: it runs, and the KV pool is as setup left it (all zeros): no block
    is written."""
    _torch_or_skip()
    import pagesim.gpu.model_runner as mr
    monkeypatch.setattr(mr, "RESERVE_TOKENS", 64)
    be = mr.TorchCupyBackend(dtype="float32", device="cpu", dense_warm_tokens=8)
    be.setup(TINY_GPU, 64, 16, 0)
    be._warm_up()
    assert not be.kv.any()
