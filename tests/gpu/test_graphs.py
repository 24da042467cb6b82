"""Decode steps in CUDA graphs (gpu/graphs.py): vLLM's capture sizes and padding rule worked by hand,
and the runner's capture/replay path on the CPU (``CPUGraph``, the kernels in the emulation):
padded batches replay the right graph, give the eager step's hidden states and KV pool (padding
rows write nothing), and a batch above the largest size runs eagerly."""

from __future__ import annotations

import pytest

from pagesim.gpu.device import cuda_available, torch_cuda_available
from pagesim.gpu.graphs import capture_sizes, ceiling_for, context_ceilings, padded_size, sizes_to_capture
from pagesim.gpu.testing import HandSteps
from pagesim.sim.specs import ModelSpec

TINY = ModelSpec("tiny-graphs", 2, 96, 4, 2, 64, 160, 300, 128)


def test_capture_sizes_by_hand():
    # max_num_seqs 256: the ceiling 512 = min(2 x 256, 512); 1 2 4, 8..248 by 8 (31), 256..512 by 16 (17)
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[33:36] == [248, 256, 272] and sizes[-1] == 512
    assert len(sizes) == 3 + 31 + 17
    assert capture_sizes(3) == [1, 2, 4]  # ceiling 6: no 8
    assert capture_sizes(12) == [1, 2, 4, 8, 16, 24]
    assert capture_sizes(128)[-1] == 256 and capture_sizes(1000)[-1] == 512


def test_sizes_to_capture_by_hand():
    # a batch of at most 256 sequences pads to 256 at most: 1 2 4, 8..248 (31), 256
    assert sizes_to_capture(capture_sizes(256), 256) == [1, 2, 4] + list(range(8, 257, 8))
    assert sizes_to_capture([1, 2, 4, 8], 3) == [1, 2, 4]
    assert sizes_to_capture([1, 2, 4], 100) == [1, 2, 4]  # above the largest: all of them


def test_padded_size_by_hand():
    sizes = [1, 2, 4, 8, 16]
    assert [padded_size(b, sizes) for b in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    assert padded_size(17, sizes) is None  # above the largest: eager


def test_context_ceilings_by_hand():
    assert context_ceilings(4096) == [256, 512, 1024, 2048, 4096]
    assert context_ceilings(300) == [256, 300]  # the longest context closes the list
    assert context_ceilings(128) == [128]
    assert context_ceilings(256) == [256]
    assert [ceiling_for(c, [256, 512, 1024]) for c in (1, 256, 257, 512, 1000)] == [256, 256, 512, 512, 1024]
    assert ceiling_for(1025, [256, 512, 1024]) is None  # past the longest: eager


#: multi-head (the simple kernel: one block per KV head and partition), contexts up to 1,024
MHA = ModelSpec("mha-classes", 1, 128, 2, 2, 64, 96, 300, 1024)


def test_context_classes_kept_and_replayed_by_hand(cpu_kernels):
    """Which context classes a size is captured for, worked from choose_partition_size (132 SMs:
    from the power of two holding the ceiling, at most 512, it halves the partition, not below
    64, while the blocks number under 8 x 132 = 1,056), and which graph a step replays.

    Size 1, grid 2 x 1: every ceiling halves to 64 (2 x 16 = 32 blocks at 1,024): one class,
    served by 1,024. Size 136, grid 2 x 136 = 272 blocks a partition: 256 halves to 64 (272 x 4 =
    1,088 blocks), 512 to 128 (272 x 4), 1,024 to 256 (272 x 4). Kept: 256, 512, 1024. Size 528,
    1,056 blocks a partition, none halves: 1,024 splits in two of 512; 512 and 256 are one pass
    each (partitions of 512 and 256): 256 is left to 512, which is not left to 1,024. The
    replayed steps give the eager hidden states."""
    torch = pytest.importorskip("torch")
    from pagesim.gpu.model_runner import TorchCupyBackend
    outs = []
    for graphs in (True, False):
        be = TorchCupyBackend(dtype="float16", device="cpu", ops="fused", attention="kernel", cache_ops="kernel",
                              cuda_graphs=graphs, graph_sizes=[1, 136, 528])
        steps = HandSteps(MHA, be, num_blocks=64, block_size=16)
        steps.prefill([0, 1, 2], [259, 19, 60])
        got, replayed = [], []
        for ids in ([1], [0], [0, 1, 2]):
            steps.decode(ids)
            got.append(be.last_outputs[2].float().clone())
            replayed.append(be._graphs.last_replayed if graphs else None)
        outs.append(got)
        if graphs:
            assert be._graphs.ceilings == {1: [1024], 136: [256, 512, 1024], 528: [512, 1024]}
            assert sorted(be._graphs.graphs) == [(1, 1024), (136, 256), (136, 512), (136, 1024), (528, 512),
                                                 (528, 1024)]
            # one sequence replays size 1's one class; the three (longest 261) size 136's class 512
            assert replayed == [(1, 1024), (1, 1024), (136, 512)]
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


def run_steps(graphs: bool, batches=(3, 5, 2, 3)):
    """Prefill of 5 prompts, then one decode step per batch size (the first sequences of the five)."""
    torch = pytest.importorskip("torch")
    from pagesim.gpu.model_runner import TorchCupyBackend
    be = TorchCupyBackend(dtype="float16", device="cpu", ops="fused", attention="kernel", cache_ops="kernel",
                          cuda_graphs=graphs, graph_sizes=[2, 4])
    steps = HandSteps(TINY, be, num_blocks=48, block_size=16)
    steps.prefill(list(range(5)), [19, 7, 33, 2, 16])
    out = []
    for b in batches:
        steps.decode(list(range(b)))
        out.append((be.last_timing["graph_size"], be.last_outputs[2].float().clone()))
    return be, out, be.kv.float().clone(), torch


def test_replayed_decode_equals_eager(cpu_kernels):
    be, graphed, kv_graphed, torch = run_steps(True)
    _, eager, kv_eager, _ = run_steps(False)
    # batch 3 pads to 4, 5 is above the largest (4): eager, 2 replays 2
    assert [g for g, _ in graphed] == [4, None, 2, 4]
    assert be._graphs.replays == {4: 2, 2: 1}
    assert be._graphs.ceilings == {4: [128], 2: [128]}  # the longest context, 128, is the only class
    assert all(g is None for g, _ in eager)
    for (_, a), (_, b) in zip(graphed, eager):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)  # split-K partitions differ: rounding only
    assert torch.equal(kv_graphed != 0, kv_eager != 0)  # the padding rows wrote no slot
    torch.testing.assert_close(kv_graphed, kv_eager, atol=2e-3, rtol=2e-3)


def test_graphs_are_captured_with_the_garbage_collected_and_the_collector_paused(cpu_kernels, monkeypatch):
    """A collection during a capture can destroy an earlier backend's graph, which invalidates the
    capture on CUDA: the garbage is collected once before the first capture, the collector is off
    through every capture and on again after."""
    import gc

    from pagesim.gpu import graphs
    events = []
    real_collect, real_capture = gc.collect, graphs.CPUGraph.capture
    monkeypatch.setattr(graphs.gc, "collect", lambda *a: events.append("collect") or real_collect(*a))
    monkeypatch.setattr(graphs.CPUGraph, "capture",
                        lambda self, fn: events.append(("capture", gc.isenabled())) or real_capture(self, fn))
    assert gc.isenabled()
    run_steps(True, batches=(2,))
    assert events == ["collect", ("capture", False), ("capture", False)]  # sizes 4 and 2, one class each
    assert gc.isenabled()


def test_graphs_need_the_fused_kernels_and_the_attention_kernel():
    pytest.importorskip("torch")
    from pagesim.gpu.model_runner import TorchCupyBackend
    from pagesim.sim.errors import ConfigError
    with pytest.raises(ConfigError, match="CUDA graphs capture the fused kernels"):
        TorchCupyBackend(dtype="float16", device="cpu", ops="eager", cuda_graphs=True)
    assert not TorchCupyBackend(dtype="float16", device="cpu").cuda_graphs  # off by default on a CPU


@pytest.mark.gpu
@pytest.mark.skipif(not (cuda_available() and torch_cuda_available()), reason="needs CuPy and torch with CUDA")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_replayed_decode_equals_eager(dtype):
    """On a GPU: torch.cuda.CUDAGraph captures the decode forward (the fused kernels, the attention
    plans), replays give the eager step's hidden states, and no step fell back to eager by a
    failed capture (graph_error)."""
    import torch
    from pagesim.gpu.model_runner import TorchCupyBackend
    model = ModelSpec("mid-graphs", 4, 1024, 16, 4, 128, 2816, 32000, 1024)
    outs = []
    for graphs in (True, False):
        be = TorchCupyBackend(dtype=dtype, cuda_graphs=graphs, graph_sizes=[1, 2, 4, 8])
        steps = HandSteps(model, be, num_blocks=256, block_size=16)
        steps.prefill(list(range(10)), [300, 17, 64, 5, 129, 33, 2, 90, 250, 1])
        got = []
        for b in (3, 8, 10, 1):
            steps.decode(list(range(b)))
            got.append((be.last_timing["graph_size"], be.last_outputs[2].float().clone()))
        assert be.graph_error is None
        outs.append(got)
    assert [g for g, _ in outs[0]] == [4, 8, None, 1]
    for (_, a), (_, b) in zip(*outs):
        torch.testing.assert_close(a, b, atol=3e-2, rtol=3e-2)


def fake_steps(graph_sizes, batches, monkeypatch=None):
    from pagesim.gpu.fake_backend import FakeBackend
    fb = FakeBackend(graph_sizes=graph_sizes)
    steps = HandSteps(TINY, fb, num_blocks=64, block_size=16)
    steps.prefill(list(range(10)), [19, 7, 33, 2, 16, 1, 40, 3, 9, 20])
    sizes = []
    for b in batches:
        steps.decode(list(range(b)))
        sizes.append(fb.last_timing["graph_size"])
    return fb, sizes


def test_fake_backend_replays_padded_graphs_and_checks_the_padding():
    """The fake backend runs a replayed step on the padded inputs (gpu/graphs.padded_inputs): its tag
    pool sees the padding rows' slots and lengths, so padding that writes or reads K/V fails."""
    fb, sizes = fake_steps([1, 2, 4, 8], (3, 6, 9, 8, 1))
    assert sizes == [4, 8, None, 8, 1]  # 9 is above the largest size: eager
    assert fb.graph_replays == {4: 1, 8: 2, 1: 1}
    assert ("graph_replay", 4) in fb.calls
    _, eager = fake_steps([], (3, 6))
    assert eager == [None, None]


@pytest.mark.parametrize("field,value,error", [("slots", 0, r"reads K/V written by \[-1\]"),
                                               ("lens", 1, "padding row")])
def test_fake_backend_catches_wrong_padding(monkeypatch, field, value, error):
    from pagesim.gpu import fake_backend, graphs
    from pagesim.gpu.executor import ExecutorError
    real = graphs.padded_inputs

    def wrong(plan, size, max_blocks):  # padding rows given a real slot / a context
        out = real(plan, size, max_blocks)
        out[field][len(plan.decode_seq_ids):] = value
        return out

    monkeypatch.setattr(fake_backend, "padded_inputs", wrong)
    with pytest.raises(ExecutorError, match=error):
        fake_steps([4], (3,))


def test_only_decode_steps_whose_tables_fit_replay_a_graph():
    import numpy as np

    from pagesim.gpu.executor import plan_step
    from pagesim.gpu.graphs import graph_size_for
    dec = dict(decode_seq_ids=np.array([0]), decode_context=np.array([5]), decode_tables=np.array([[0]], np.int32))
    pre = dict(prefill_seq_ids=np.array([1]), prefill_tokens=np.array([3]), prefill_context=np.array([3]),
               prefill_tables=np.array([[1]], np.int32))
    assert graph_size_for(plan_step(0, 16, 8, **dec), [1, 2], 8) == 1
    assert graph_size_for(plan_step(0, 16, 8, **dec, **pre), [1, 2], 8) is None  # a prefill in it: eager
    assert graph_size_for(plan_step(0, 16, 8, **pre), [1, 2], 8) is None
    wide = dict(dec, decode_tables=np.array([[0] + [7] * 8], np.int32))  # 9 columns > the buffers' 8
    assert graph_size_for(plan_step(0, 16, 8, **wide), [1, 2], 8) is None
    assert graph_size_for(plan_step(0, 16, 8, **dec), [], 8) is None  # no graphs captured
