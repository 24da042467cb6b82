"""The runner's fused layer (gpu/layer_ops.py, ``ops="fused"``) on the CPU: torch CPU tensors
handed to the fused kernels as fake-CuPy views of the same memory, the kernels running in the
emulation. Checked against the eager layer (``ops="eager"``, torch ops one by one): the same hidden
states at every sampled position and the same KV pool, through prefills and decodes."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.gpu.testing import HandSteps
from pagesim.sim.specs import ModelSpec

torch = pytest.importorskip("torch")

#: head_dim 64 (a compiled attention kernel), an MLP of 2 x 160 (odd thread counts)
TINY = ModelSpec("tiny-fused", 2, 96, 4, 2, 64, 160, 300, 256)


def run_steps(ops, dtype="float16", **kw):
    """(hidden states per sampled position, the KV pool) after a prefill of two prompts and three
    decode steps of both."""
    from pagesim.gpu.model_runner import TorchCupyBackend
    be = TorchCupyBackend(dtype=dtype, device="cpu", ops=ops, **kw)
    steps = HandSteps(TINY, be, num_blocks=32, block_size=16)
    states = {}
    steps.prefill([0, 1], [21, 5])
    for _ in range(3):
        pos, _tok, hs = be.last_outputs
        states.update({(len(states), int(p)): h.float().clone() for p, h in zip(pos.tolist(), hs)})
        steps.decode([0, 1])
    return states, be.kv.float().clone()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_layer_equals_the_eager_one(cpu_kernels, dtype):
    fused, kv_fused = run_steps("fused", dtype)
    eager, kv_eager = run_steps("eager", dtype)
    assert fused.keys() == eager.keys()
    # the two paths round differently (one rounding per fused kernel, one per torch op): at most
    # 0.002 (fp16) and 0.02 (bf16) apart in the emulation; skipping a residual add is 3.2 apart
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == "float16" else dict(atol=6e-2, rtol=5e-2)
    for key in eager:
        torch.testing.assert_close(fused[key], eager[key], **tol)
    torch.testing.assert_close(kv_fused, kv_eager, **tol)
    assert kv_fused.abs().sum() > 0


def test_fused_refuses_float32():
    from pagesim.gpu.model_runner import TorchCupyBackend
    from pagesim.sim.errors import ConfigError
    with pytest.raises(ConfigError, match="fused kernels take fp16 or bf16"):
        TorchCupyBackend(dtype="float32", device="cpu", ops="fused")
    with pytest.raises(ConfigError, match="ops must be one of fused, eager"):
        TorchCupyBackend(dtype="float16", device="cpu", ops="graph")
    assert np.all([TorchCupyBackend(device="cpu").ops == "eager"])


def test_calibration_times_the_fused_kernels_of_a_layer(cpu_kernels):
    """gpu/calibrate.fused_layer_fn (timed with the linear layers) launches the runner's fused kernels:
    on the CPU through the emulation, the norms change x and the residual, rotary writes one cache
    slot per token, SiLU-and-mul fills its output."""
    from pagesim.gpu.calibrate import fused_layer_fn
    run = fused_layer_fn(TINY, 20, 1, torch.float16, "cpu")
    cells = {id(c.cell_contents): c.cell_contents for c in run.__closure__ if isinstance(c.cell_contents,
                                                                                         torch.Tensor)}
    before = {k: v.clone() for k, v in cells.items()}
    run()
    changed = [k for k in cells if not torch.equal(cells[k], before[k])]
    kc = [v for v in cells.values() if v.dim() == 4][0]
    assert (kc.reshape(-1, kc.shape[-2] * kc.shape[-1]).abs().sum(1) > 0).sum() == 20  # slots 0..19
    # x, residual, qkv (rotated), both caches and the SiLU output: weights, positions and tables unchanged
    assert len(changed) == 6
