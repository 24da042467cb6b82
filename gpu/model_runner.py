"""The real backend of the GPU executor: a transformer with the model's shapes and random weights.

``TorchCupyBackend(dtype="float16", num_layers_run=None)`` implements the executor's
:class:`gpu.executor.Backend` protocol. ``setup`` allocates, once, the weights and a paged KV
pool ``[layers, 2, num_blocks, block_size, kv_heads, head_dim]`` sized from the manager's
``num_blocks`` (``kv[l, 0]`` / ``kv[l, 1]`` are layer l's contiguous key / value caches, the
layout of ``gpu.paged_attention``). ``execute(plan)`` runs one iteration::

    swap-in, swap-out       gpu.cache_ops.swap_blocks  per layer, pinned host pool
    copy-on-write           gpu.cache_ops.copy_blocks  per layer
    embedding of the step's tokens (prefill chunks first, then one token per decode sequence)
    per layer (LLaMA-style; OPT-style ReLU MLP when the model is not gated; ``ops``: the norms,
    rotary and SiLU-and-mul as fused kernels or torch ops one by one, see gpu/layer_ops.py):
        RMSNorm -> fused QKV matmul -> rotary -> reshape_and_cache(new K/V -> their slots)
        prefill attention: torch SDPA per sequence (causal; with cached context, i.e. chunked
                           prefill or prefix hits, over the context gathered from the pool)
        decode attention:  gpu.paged_attention over the live block tables (one plan per step,
                           rebound to each layer's query and caches)
        O matmul + residual, RMSNorm, gate/up matmul, SiLU*, down matmul + residual
    final norm + LM head for the sampled positions (each prefill chunk's last token and every
    decode token) + greedy argmax
    torch.cuda.synchronize()

Weights are random (std 1/sqrt(fan_in), so fp16 activations stay finite) and token ids are a
fixed function of the position (every sequence reads the same text): the tokens do not matter
for timing, and it makes every sequence's hidden state at position p the same however it was
computed (whole prefill, chunks, decode, after copy-on-write or a swap), which the CPU tests use
to check the KV data flow end to end. Not modelled: tensor-parallel all-reduce (``tp`` only shrinks the shapes),
sampling beyond argmax, a varlen prefill kernel (prefills run one SDPA call per
sequence, as vLLM's fallback path does).

Timing (``timing=``, see ``TIMINGS``). This runner launches ~25 kernels a layer from Python;
on the H100 VM measured 2026-11-23 that takes ~1.6 ms a layer while the kernels of an
8-sequence decode run in ~0.35 ms (10-12.8 ms for 32 layers, device-timed), so timed as
launched ("eager") a step measures the host. A serving engine replays its decode steps as CUDA
graphs, which run the kernels back to back. The default, "device", gets the same from an eager
loop: a hold kernel (``torch.cuda._sleep``) keeps the GPU waiting until every kernel of the
step is queued, then CUDA events time them back to back. The hold is sized from the launch
times of recent steps (``_hold_estimate``); a step whose hold ended before the last launch (the
GPU caught up: ``ev0`` had completed) is reported with ``gaps_hidden=False``, and the launch
time itself as ``launch_s``.

Layer scaling: ``num_layers_run=N`` (< the model's L) builds only N layers and an N-layer KV
pool (N/L of the memory). The per-layer part of the step (swaps, copies and the N layers,
timed with CUDA events) is scaled by L/N and the rest is counted once::

    device:  t = host preparation before the first launch + (L/N) * layer_span_N + LM head
             (+ the graph's launch once, for a replayed step)
    eager:   t = wall_N + (L/N - 1) * layer_span_N

A replayed decode graph is held too: between ``ev0`` and the graph's first kernel the GPU would
otherwise wait for the host's launch call, a gap inside the layer span that the scaling counted
L/N times (on the H100 of 2026-11-26, llama-2-7b at one sequence: +1.3 ms a step over the same
kernels held; 0.7 ms of it the graph's coarser attention split, see gpu/graphs.py, the rest this
gap). The launch call's host time is counted once, in the step.

``tests/gpu/test_executor.py::test_layer_scaling_matches_full`` checks it against all layers
(within 10 %).

``attention="torch"`` / ``cache_ops="torch"`` (automatic on a CPU device) replace the CuPy
kernels by torch gathers and indexing: used by the CPU tests of this file (tiny model, float32)
and as a reference for the kernel path.
"""

from __future__ import annotations

import collections
import gc
import math
import time

import numpy as np

from pagesim.gpu import hold_timing
from pagesim.gpu import paged_attention as pa
from pagesim.gpu.cache_ops import copy_blocks, empty_pinned_cache, reshape_and_cache, swap_blocks
from pagesim.gpu.device import require_cupy
from pagesim.gpu.executor import slots_for
from pagesim.gpu.graphs import DecodeGraphs, capture_sizes, sizes_to_capture
from pagesim.gpu.layer_ops import OPS, RMS_EPS, layer_ops
from pagesim.sim.errors import ConfigError, NeedsGPUError

_TORCH_DTYPES = ("float16", "bfloat16", "float32")
#: "device": the step's kernels are queued behind a hold kernel and timed back to back, as CUDA
#: graphs let a serving engine run them; "eager": timed as this Python loop launches them, its
#: launch gaps included (measured on an H100 VM, 2026-11-23: ~1.6 ms of launches per layer against
#: ~0.35 ms of kernels in an 8-sequence decode, so eager steps time the host, not the GPU)
TIMINGS = ("device", "eager")
#: the largest token count the warm-up runs (device timing, _warm_up)
RESERVE_TOKENS = 8192
#: the dense warm-up's bound (``dense_warm_tokens``; ``pagesim validate`` runs it) and stride past it
DENSE_WARM_TOKENS = 1024
WARM_STRIDE = 64


def warm_up_token_counts(dense: int = 0, reserve: int | None = None, stride: int = WARM_STRIDE) -> list[int]:
    """The step sizes the warm-up runs: with ``dense`` 0, the powers of two to ``reserve``
    (RESERVE_TOKENS, read when called); else every count from 1 to ``dense``, then every
    ``stride``-th to ``reserve``. Why every one: a matmul's kernel is chosen by its row count and
    flash attention's by the length (whether it is a whole number of tiles), and a kernel's first
    use loads it (CUDA's lazy loading), which can wait for the GPU; inside a held step that wait
    ends the hold. Warmed at powers of two, 16 of 31 prefill steps of the H200 validation of
    2026-11-27 lost their hold, the first four waiting exactly a hold each
    (benchmarks/results/2026-11-27-h200/session2). Dense is for timed runs: it is some 1,100 steps
    where the powers of two are 14, too many for every backend the GPU tests make."""
    reserve = RESERVE_TOKENS if reserve is None else reserve
    if dense <= 0:
        return [1 << k for k in range(reserve.bit_length()) if 1 << k <= reserve]
    top = min(dense, reserve)
    return list(range(1, top + 1)) + list(range(top + stride - top % stride, reserve + 1, stride))


def device_step_timing(*, prep_s: float, head_s: float, span_s: float, tail_s: float, scale: float,
                       launch_s: float, graph: bool, held_launch_s: float = 0.0) -> dict:
    """A held or replayed step's time (``TIMINGS`` "device") from its parts, in seconds: the
    host's preparation before the first launch (``prep_s``), the device's work before the layers
    (``head_s``: the uploads), the layers' span (``span_s``, N of the model's L layers: times
    ``scale`` = L/N) and the LM head after them (``tail_s``). ``launch_s``: the launch calls' host
    time, reported as a step's (an eager step's N layers scaled by L/N, a graph's one call not).
    ``held_launch_s``: a held graph's launch call where the hold outlasted it, counted once (the
    span then starts at the graph's first kernel; a hold that ran short leaves the call inside
    the span, scaled, and such a step is flagged ``gaps_hidden=False``)."""
    step = prep_s + held_launch_s + scale * span_s + tail_s
    gpu = head_s + scale * span_s + tail_s
    return {"layer_span_s": span_s, "scale": scale, "step_s": step, "gpu_s": gpu, "host_s": step - gpu,
            "launch_s": launch_s if graph else scale * launch_s}


def _torch():
    try:
        import torch
        return torch
    except Exception as e:  # pragma: no cover - depends on the machine
        raise NeedsGPUError(f"the GPU backend needs torch ({type(e).__name__}: {e}); "
                            "install it with: pip install torch") from None


class TorchCupyBackend:
    """Transformer with real shapes and random weights over the paged KV pool (see module docstring)."""

    name = "torch-cupy"
    measures_time = True

    def __init__(self, *, dtype: str = "float16", num_layers_run: int | None = None, device: str = "cuda",
                 attention: str | None = None, cache_ops: str | None = None, tp: int = 1, seed: int = 0,
                 memory_fraction: float = 0.95, timing: str = "device", device_name: str | None = None,
                 ops: str | None = None, cuda_graphs: bool | None = None, max_num_seqs: int = 256,
                 graph_sizes: list[int] | None = None, graph_max_context: int | None = None,
                 dense_warm_tokens: int = 0):
        if dtype in ("fp16", "half"):
            dtype = "float16"
        if dtype in ("bf16",):
            dtype = "bfloat16"
        if dtype not in _TORCH_DTYPES:
            raise ConfigError(f"dtype must be fp16 or bf16, got {dtype}")
        if num_layers_run is not None and num_layers_run < 1:
            raise ConfigError(f"--layers must be >= 1, got {num_layers_run}")
        cpu = str(device).startswith("cpu")
        self.dtype_name = dtype
        self.num_layers_run = num_layers_run
        self.device = device
        self.attention = attention or ("torch" if cpu else "kernel")
        self.cache_ops = cache_ops or ("torch" if cpu else "kernel")
        if self.attention not in ("kernel", "torch") or self.cache_ops not in ("kernel", "torch"):
            raise ConfigError("attention and cache_ops must be 'kernel' or 'torch'")
        self.ops = ops or ("eager" if cpu else "fused")
        if self.ops not in OPS:
            raise ConfigError(f"ops must be one of {', '.join(OPS)}, got {self.ops!r}")
        if self.ops == "fused" and dtype == "float32":
            raise ConfigError("the fused kernels take fp16 or bf16 (ops='eager' runs float32)")
        if cuda_graphs is None:
            cuda_graphs = not cpu and self.ops == "fused" and self.attention == "kernel"
        if cuda_graphs and (self.ops != "fused" or self.attention != "kernel"):
            raise ConfigError("CUDA graphs capture the fused kernels and the attention kernel "
                              "(ops='fused', attention='kernel')")
        self.cuda_graphs = bool(cuda_graphs)
        self.graph_sizes = list(graph_sizes) if graph_sizes else sizes_to_capture(capture_sizes(max_num_seqs),
                                                                                 max_num_seqs)
        self.graph_max_context = graph_max_context  # None: the model's longest context
        self._graphs = None  # DecodeGraphs after setup
        self.graph_error = None  # why capturing failed (the run goes on eagerly), if it did
        if timing not in TIMINGS:
            raise ConfigError(f"timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
        self.timing = timing
        self.dense_warm_tokens = int(dense_warm_tokens)  # warm_up_token_counts' dense bound (0: powers of two)
        self.device_name = device_name  # what validation reports as the GPU (None: the backend's name)
        self._launch_per_group = collections.deque(maxlen=16)  # recent launch seconds per launch group
        self._graph_launch = collections.deque(maxlen=16)  # recent seconds of a graph's launch call
        self.tp = int(tp)
        self.seed = seed
        self.memory_fraction = memory_fraction
        self.last_outputs = None  # (positions, sampled token ids, final hidden states) of the last step
        self._attention_plan = None
        self.last_timing: dict = {}

    # ------------------------------------------------------------------ setup
    def _check_memory(self, torch, nbytes: int) -> None:
        if not self.device.startswith("cuda"):
            return
        free, _total = torch.cuda.mem_get_info()
        if nbytes > free * self.memory_fraction:
            raise ConfigError(
                f"weights + KV pool of {self.L_run} layers need {nbytes / 2**30:.1f} GiB, the GPU has "
                f"{free / 2**30:.1f} GiB free; run fewer layers (--layers 4) or a smaller pool (--kv-gib 20)")

    def setup(self, model, num_blocks: int, block_size: int, host_blocks: int) -> None:
        torch = _torch()
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise NeedsGPUError("the GPU backend needs torch with CUDA (torch.cuda.is_available() is False)")
        if "kernel" in (self.attention, self.cache_ops) or self.ops == "fused":
            require_cupy("the GPU backend")
        self.torch = torch
        self.model = model
        tp = self.tp
        if model.num_heads % tp:
            raise ConfigError(f"tp={tp} does not divide num_heads={model.num_heads}")
        self.L = int(model.num_layers)
        self.L_run = min(int(self.num_layers_run or self.L), self.L)
        self.H = model.num_heads // tp
        self.KVH = max(1, model.num_kv_heads // tp)
        self.D = model.head_dim
        self.h = model.hidden_size
        self.I = model.intermediate_size // tp
        self.V = model.vocab_size // tp
        self.gated = bool(model.gated_mlp)
        self.block_size = int(block_size)
        self.num_blocks = int(num_blocks)
        dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[self.dtype_name]
        self.tdtype = dt
        esize = torch.tensor([], dtype=dt).element_size()
        h, H, KVH, D, I = self.h, self.H, self.KVH, self.D, self.I
        per_layer = h * (H + 2 * KVH) * D + H * D * h + (2 if self.gated else 1) * h * I + I * h
        weight_bytes = (per_layer * self.L_run + 2 * self.V * h) * esize
        self.block_bytes_per_layer = 2 * self.block_size * KVH * D * esize  # K and V
        pool_bytes = self.num_blocks * self.block_bytes_per_layer * self.L_run
        self._check_memory(torch, weight_bytes + pool_bytes)
        dev = self.device
        g = torch.Generator(device=dev).manual_seed(self.seed)

        def rand(*shape):
            return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32)
                    / math.sqrt(shape[0])).to(dt)

        self.layers = []
        for _ in range(self.L_run):
            w = {"qkv": rand(h, (H + 2 * KVH) * D), "o": rand(H * D, h),
                 "up": rand(h, (2 if self.gated else 1) * I), "down": rand(I, h),
                 "ln1": torch.ones(h, device=dev, dtype=dt), "ln2": torch.ones(h, device=dev, dtype=dt)}
            self.layers.append(w)
        self.emb = torch.randn(self.V, h, generator=g, device=dev, dtype=torch.float32).to(dt)
        self.lm_head = rand(h, self.V)
        self.ln_f = torch.ones(h, device=dev, dtype=dt)
        self.kv = torch.zeros((self.L_run, 2, self.num_blocks, self.block_size, KVH, D), device=dev, dtype=dt)
        max_pos = int(model.max_seq_len) + 1
        inv = 1.0 / (10000 ** (torch.arange(0, D // 2, device=dev, dtype=torch.float32) * 2 / D))
        ang = torch.arange(max_pos, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().to(dt), ang.sin().to(dt)
        self.host_blocks = int(host_blocks)
        self.host = None
        if host_blocks > 0:
            shape = (self.host_blocks, self.block_size, KVH, D)
            if self.cache_ops == "kernel":
                npdt = np.float16 if self.dtype_name == "float16" else (np.uint16 if self.dtype_name == "bfloat16"
                                                                        else np.float32)
                self.host = [[empty_pinned_cache(shape, npdt) for _ in range(2)] for _ in range(self.L_run)]
            else:
                self.host = torch.zeros((self.L_run, 2) + shape, dtype=dt)
        self._gqa = self._probe_gqa()
        self._layer_ops = layer_ops(self.ops, self)
        self.pool_bytes = pool_bytes
        self.weight_bytes = weight_bytes
        if self.device.startswith("cuda") and self.timing == "device":
            try:
                self._warm_up()
            except Exception as e:  # a missed warm-up costs held steps (flagged), not the run
                import warnings
                warnings.warn(f"the GPU backend's warm-up failed ({type(e).__name__}: {e}); "
                              "steps may lose their hold (gaps_hidden=False)", stacklevel=2)
        if self.cuda_graphs:
            self._capture_graphs()

    def _capture_graphs(self) -> None:
        """Capture the decode graphs (gpu/graphs.py); a failure is reported (``graph_error``, a
        warning) and the run goes on with every step eager."""
        try:
            graphs = DecodeGraphs(self, self.graph_sizes, self.graph_max_context or int(self.model.max_seq_len))
            graphs.capture_all()
            self._graphs = graphs
        except Exception as e:
            if not self.device.startswith("cuda"):
                raise
            import warnings
            self.graph_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"capturing the decode CUDA graphs failed ({self.graph_error}); every step runs eagerly",
                          stacklevel=2)
            self._sync()

    def _as_torch(self, arr, like):
        """A CuPy array (the attention plan's output) as a torch tensor of ``like``'s dtype."""
        torch = self.torch
        t = torch.from_dlpack(arr) if self.device.startswith("cuda") else torch.from_numpy(np.asarray(arr))
        return t if t.dtype == like.dtype else t.view(like.dtype)

    def _warm_up(self) -> None:
        """Run the step's kernels once, here, at every token count of :func:`warm_up_token_counts`
        (``dense_warm_tokens``; why: there) and decode batches of 1 to 256: a new size can also grow
        an allocator, which may wait for the GPU too. On the H100 run of 2026-11-23 all 7 prefill
        steps lost their hold, while 1921 of 1988 decode steps kept it. That the dense warm-up cures
        it is not yet measured. No KV block is written: the cache writes go to slot -1, which
        reshape_and_cache skips, and decode attention reads block 0."""
        torch = self.torch
        dev, dt = self.device, self.tdtype
        H, D = self.H, self.D
        w = self.layers[0]
        ops = self._layer_ops
        for T in warm_up_token_counts(self.dense_warm_tokens):
            pos = torch.arange(T, device=dev) % self.cos.shape[0]
            nowhere = torch.full((T,), -1, device=dev, dtype=torch.int64)
            state, q, k, v = ops.qkv(ops.start(torch.randn(T, self.h, device=dev, dtype=dt)), w, pos,
                                     self.kv[0, 0], self.kv[0, 1], nowhere)
            att = self._sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal=True)
            state = ops.finish(state, att[0].transpose(0, 1), w)
            rows = torch.arange(min(T, 256), device=dev)  # the LM head runs on the sampled positions only
            (ops.final(state, rows) @ self.lm_head).argmax(-1)
        if self.attention == "kernel":
            kc, vc = self.kv[0, 0], self.kv[0, 1]
            for batch in (1, 8, 64, 256):
                for context in (self.block_size, min(4096, int(self.model.max_seq_len))):
                    q = torch.randn(batch, H, D, device=dev, dtype=dt)
                    tables = torch.zeros((batch, -(-context // self.block_size)), device=dev, dtype=torch.int32)
                    lens = torch.full((batch,), context, device=dev, dtype=torch.int32)
                    pa.prepare(q, kc, vc, tables, lens, self.block_size, context, check=False).run()
        self._sync()

    def read_blocks(self, where: str, block_ids) -> np.ndarray:
        """[n, layers run, 2 (K, V), block_size, kv_heads, head_dim] of device or host blocks, as
        2-byte bit patterns (gpu/kv_check.py compares them byte for byte). Synchronizes."""
        torch = self.torch
        ids = np.asarray(block_ids, np.int64)
        self._sync()
        if where == "device":
            x = self.kv[:, :, torch.as_tensor(ids, device=self.kv.device)].transpose(0, 2).transpose(1, 2)
            return x.contiguous().cpu().view(torch.int16 if x.element_size() == 2 else torch.int32).numpy()
        if self.host is None:
            raise ValueError("no host swap space")
        if isinstance(self.host, list):  # pinned numpy per layer and K/V
            return np.stack([np.stack([self.host[l][j][ids] for j in range(2)], 1) for l in range(self.L_run)], 1)
        x = self.host[:, :, torch.as_tensor(ids)].transpose(0, 2).transpose(1, 2)
        return x.contiguous().view(torch.int16 if x.element_size() == 2 else torch.int32).numpy()

    # ------------------------------------------------------------------ pieces
    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _rms(self, x, w):
        torch = self.torch
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)).to(x.dtype) * w

    def _rope(self, x, pos):
        half = self.D // 2
        c, s = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return self.torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    def _qkv(self, x, w, pos):
        """A layer's norm, fused QKV projection and rotary: q [T, H, D], k and v [T, KVH, D]."""
        H, KVH, D, T = self.H, self.KVH, self.D, x.shape[0]
        qkv = self._rms(x, w["ln1"]) @ w["qkv"]
        q = self._rope(qkv[:, :H * D].view(T, H, D), pos)
        k = self._rope(qkv[:, H * D:(H + KVH) * D].view(T, KVH, D), pos)
        return q, k, qkv[:, (H + KVH) * D:].view(T, KVH, D)

    def _mlp(self, x, w):
        """The residual stream after a layer's norm and MLP (gated SiLU, else ReLU)."""
        F = self.torch.nn.functional
        m = self._rms(x, w["ln2"]) @ w["up"]
        if self.gated:
            g_, u = m.chunk(2, dim=-1)
            m = F.silu(g_) * u
        else:
            m = F.relu(m)
        return x + m @ w["down"]

    def _sdpa(self, q, k, v, causal: bool, mask=None):
        """q [1, H, n, D], k/v [1, KVH, m, D]; ``mask`` (bool, True = attend) replaces ``causal``."""
        F = self.torch.nn.functional
        kw = {}
        if self.KVH != self.H:
            # enable_gqa only without a mask: with one (chunked prefill, prefix hits) torch falls back
            # to its math backend; repeated K/V heads keep the memory-efficient kernel
            if self._gqa and mask is None:
                kw = {"enable_gqa": True}
            else:  # torch < 2.5, or a mask
                rep = self.H // self.KVH
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        with self._sdpa_backends():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, **kw)

    def _sdpa_backends(self):
        """Flash, memory-efficient or math attention, never cuDNN: torch 2.11 picks cuDNN on an H100
        by default, and cuDNN builds a plan for every new sequence length (70 ms a length measured
        on an H100, 2026-11-23, against 0.1 ms for flash) while every prefill brings a new length."""
        import contextlib
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:  # torch < 2.3 has no cuDNN attention to avoid
            return contextlib.nullcontext()
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def _probe_gqa(self) -> bool:
        torch = self.torch
        try:
            t = torch.zeros(1, 2, 1, 8)
            torch.nn.functional.scaled_dot_product_attention(t, t[:, :1], t[:, :1], enable_gqa=True)
            return True
        except Exception:
            return False

    def _gather(self, cache, slots):
        """cache [num_blocks, bs, KVH, D] -> [len(slots), KVH, D]."""
        return cache.view(-1, self.KVH, self.D).index_select(0, slots)

    def _write(self, kc, vc, k, v, slots) -> None:
        if self.cache_ops == "kernel":
            reshape_and_cache(k, v, kc, vc, slots, check=False)  # the executor checked the plan's slots
        else:  # negative slots are skipped, as the kernel skips them (padding, the warm-up)
            keep = slots >= 0
            kc.view(-1, self.KVH, self.D)[slots[keep]] = k[keep]
            vc.view(-1, self.KVH, self.D)[slots[keep]] = v[keep]

    def _copy_and_swap(self, plan) -> None:
        torch = self.torch
        for l in range(self.L_run):
            for j in range(2):
                dev = self.kv[l, j]
                if len(plan.swap_in):
                    if self.cache_ops == "kernel":
                        swap_blocks(self.host[l][j], dev, plan.swap_in)
                    else:
                        dev[torch.as_tensor(plan.swap_in[:, 1], device=dev.device)] = \
                            self.host[l, j][torch.as_tensor(plan.swap_in[:, 0])].to(dev.device)
            for j in range(2):
                dev = self.kv[l, j]
                if len(plan.swap_out):
                    if self.cache_ops == "kernel":
                        swap_blocks(dev, self.host[l][j], plan.swap_out)
                    else:
                        self.host[l, j][torch.as_tensor(plan.swap_out[:, 1])] = \
                            dev[torch.as_tensor(plan.swap_out[:, 0], device=dev.device)].cpu()
            if len(plan.copies):
                kc, vc = self.kv[l, 0], self.kv[l, 1]
                if self.cache_ops == "kernel":
                    copy_blocks(kc, vc, plan.copies)
                else:
                    src = torch.as_tensor(plan.copies[:, 0], device=kc.device)
                    dst = torch.as_tensor(plan.copies[:, 1], device=kc.device)
                    kc[dst] = kc[src]
                    vc[dst] = vc[src]

    def _decode_attention(self, q, kc, vc, dev_tables, dev_lens, plan, dec_slots_all):
        if self.attention == "kernel":
            # one plan per step (launch geometry, buffers, the tables' device copies), rebound to each
            # layer's query and caches: the host work of planning is paid once, not once per layer
            if self._attention_plan is None:
                self._attention_plan = pa.prepare(q, kc, vc, dev_tables, dev_lens, self.block_size,
                                                  plan.decode_max_context, check=False,
                                                  host_context_lens=plan.decode_context)
            else:
                self._attention_plan.rebind(q, kc, vc)
            return self._attention_plan.run()
        out = self.torch.empty_like(q)
        for r, (slots, c) in enumerate(dec_slots_all):
            k = self._gather(kc, slots).transpose(0, 1)[None]
            v = self._gather(vc, slots).transpose(0, 1)[None]
            out[r] = self._sdpa(q[r][None, :, None, :], k, v, causal=False)[0, :, 0, :]
        return out

    # ------------------------------------------------------------------ one step
    def execute(self, plan) -> float:
        gc_was_enabled = gc.isenabled()  # device timing pauses the collector while it launches
        try:
            return self._execute(plan)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _execute(self, plan) -> float:
        torch = self.torch
        dev = self.device
        cuda = dev.startswith("cuda")
        self._sync()
        t0 = time.perf_counter()
        self._attention_plan = None  # built by the first layer's decode attention (see _decode_attention)
        if cuda:  # the step's device work, start to end (uploads, swaps, copies, layers, LM head)
            ev_start, ev_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev_start.record()
        P = len(plan.prefill_slots)  # prefill tokens
        num_prefill_seqs = len(plan.prefill_tokens)
        T = plan.num_tokens
        slots = torch.as_tensor(plan.slot_mapping, device=dev)
        pos_np = np.concatenate([plan.prefill_positions, plan.decode_context.astype(np.int64) - 1])
        pos = torch.as_tensor(pos_np, device=dev)
        nd = len(plan.decode_seq_ids)
        dev_tables = dev_lens = None
        dec_slots_all = []
        if nd:
            dev_tables = torch.as_tensor(plan.decode_tables, device=dev)
            dev_lens = torch.as_tensor(plan.decode_context, device=dev)
            if self.attention == "torch":
                dec_slots_all = [(torch.as_tensor(slots_for(plan.decode_tables[r], 0, int(c), self.block_size),
                                                  device=dev), int(c))
                                 for r, c in enumerate(plan.decode_context.tolist())]
        pre = []  # (offset, n, ctx, gather slots or None, mask or None)
        off = 0
        for r, (n, c) in enumerate(zip(plan.prefill_tokens.tolist(), plan.prefill_context.tolist())):
            if c == n:
                pre.append((off, n, c, None, None))
            else:
                gs = torch.as_tensor(slots_for(plan.prefill_tables[r], 0, c, self.block_size), device=dev)
                qi = torch.arange(c - n, c, device=dev)[:, None]
                kj = torch.arange(c, device=dev)[None, :]
                pre.append((off, n, c, gs, (kj <= qi)[None, None]))
            off += n
        sample = np.concatenate([np.cumsum(plan.prefill_tokens) - 1, P + np.arange(nd)]).astype(np.int64)
        sample_t = torch.as_tensor(sample, device=dev)
        ids = (pos * 7919 + 13) % self.V  # token ids: a fixed function of the position
        graph = None  # a decode-only step replays the graph of its padded batch (gpu/graphs.py)
        if self._graphs is not None:
            graph = self._graphs.load(plan, ids)
        graph_size = graph[0] if graph is not None else None
        x = self.emb[ids] if T and graph is None else None
        hold = cuda and self.timing == "device"
        if cuda:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if hold:  # the GPU waits here until every kernel of the step is queued (see TIMINGS)
                ev_hold = torch.cuda.Event(enable_timing=True)
                ev_hold.record()
                hold_timing.hold(self._hold_estimate(num_prefill_seqs, graph is not None))
                gc.disable()  # a collection inside the launches would outlast the hold
            ev0.record()
        tl0 = time.perf_counter()
        prep_s = tl0 - t0
        self._copy_and_swap(plan)
        H, D = self.H, self.D
        ops = self._layer_ops
        state = ops.start(x) if x is not None else None
        if graph is not None:
            state = self._graphs.replay(graph)
        for l, w in enumerate(self.layers if x is not None else ()):
            kc, vc = self.kv[l, 0], self.kv[l, 1]
            state, q, k, v = ops.qkv(state, w, pos, kc, vc, slots)
            att = torch.empty((T, H, D), device=dev, dtype=self.tdtype)
            for (o, n, c, gs, mask) in pre:
                qq = q[o:o + n].transpose(0, 1)[None]
                if gs is None:
                    kk, vv = k[o:o + n], v[o:o + n]
                else:
                    kk, vv = self._gather(kc, gs), self._gather(vc, gs)
                out = self._sdpa(qq, kk.transpose(0, 1)[None], vv.transpose(0, 1)[None], causal=True, mask=mask)
                att[o:o + n] = out[0].transpose(0, 1)
            if nd:
                att[P:] = self._decode_attention(q[P:].contiguous(), kc, vc, dev_tables, dev_lens, plan,
                                                 dec_slots_all)
            state = ops.finish(state, att, w)
        if cuda:
            ev1.record()
            # the hold outlasted the layers' launches (a graph's: the LM head after it is not held)
            span_held = hold and not ev0.query()
        tl1 = time.perf_counter()
        if T:
            hs = ops.final(state, sample_t)
            tokens = (hs @ self.lm_head).argmax(-1)
            self.last_outputs = (pos_np[sample], tokens, hs)
        if cuda:
            ev_end.record()
        hidden = None
        launch_s = time.perf_counter() - tl0
        if hold and graph is not None:  # its copies and swaps too are queued behind the hold
            hidden = span_held
            self._graph_launch.append(tl1 - tl0)
        elif graph is not None:  # back to back by construction, unless copies or swaps were launched before it
            hidden = not (len(plan.copies) or len(plan.swap_in) or len(plan.swap_out))
        elif hold:
            hidden = not ev0.query()  # still holding once the whole step was queued: no gap inside it
            self._launch_per_group.append(launch_s / (num_prefill_seqs + 1))
        self._sync()
        self._attention_plan = None  # bound to this step's tables and lengths: never reused by the next
        wall = time.perf_counter() - t0
        span = ev0.elapsed_time(ev1) * 1e-3 if cuda else (tl1 - tl0)
        scale = self.L / self.L_run
        if hold or (cuda and graph_size is not None):
            # device time without the hold: the uploads before it, the layers (scaled) and the LM
            # head, back to back (a replayed graph runs them so with no hold); the host share is the
            # preparation before the first launch (a graph's input copies included)
            head = ev_start.elapsed_time(ev_hold if hold else ev0) * 1e-3
            held_launch_s = tl1 - tl0 if hold and graph is not None and span_held else 0.0
            timing = device_step_timing(prep_s=prep_s, head_s=head, span_s=span,
                                        tail_s=ev1.elapsed_time(ev_end) * 1e-3, scale=scale, launch_s=launch_s,
                                        graph=graph is not None, held_launch_s=held_launch_s)
            self.last_timing = {"wall_s": wall, **timing, "gaps_hidden": hidden, "graph_size": graph_size}
            return timing["step_s"]
        whole = ev_start.elapsed_time(ev_end) * 1e-3 if cuda else wall
        t = wall + (scale - 1.0) * span
        # device share: the events' span, scaled like the step; launch gaps while the GPU waits for
        # the host are inside it (the eager timing), so the host share below is a lower bound
        gpu = min(whole + (scale - 1.0) * span, t)
        self.last_timing = {"wall_s": wall, "layer_span_s": span, "scale": scale, "step_s": t, "gpu_s": gpu,
                            "host_s": t - gpu, "graph_size": graph_size}
        return t

    def _hold_estimate(self, num_prefill: int, graph: bool = False) -> float:
        """Seconds the step's launches should take: the median launch time per launch group (the
        layers' kernels once, plus once per prefill sequence, whose attention is launched per
        sequence) over the last 16 steps, times the step's groups; for a replayed graph, the
        median of its launch calls. A median, so that a one-off cost (a first compilation, say)
        does not lengthen the holds after it."""
        if graph:
            return min(float(np.median(self._graph_launch)), 2.0) if self._graph_launch else 0.002
        if not self._launch_per_group:
            return 0.02
        return min(float(np.median(self._launch_per_group)) * (num_prefill + 1), 2.0)
