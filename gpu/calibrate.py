"""Measure a model's per-iteration costs on this GPU and write the simulator's profile CSV.

``pagesim gpu calibrate --model llama-2-7b --out profile.csv [--quick] [--tp 1] [--dtype float16]``

Profile format (read by the table cost model through :func:`sim.profile_format.read_profile`)::

    component,num_tokens,batch,context,time_us,model,gpu,dtype,tp

    linear        num_tokens   all layers' linear layers + lm head for num_tokens batched tokens
    attn_decode   batch,context all layers' decode attention, batch sequences of context tokens
    attn_prefill  num_tokens   all layers' causal prefill attention, one sequence of num_tokens
    overhead      (no keys)    fixed per-iteration time

How each is measured (median of repeats, CUDA events, random fp16/bf16 data):

* linear: one layer's matmuls at the model's real shapes, per GPU of a TP group
  (qkv [h, (H + 2 KVH) D / tp], o [H D / tp, h], gated MLP gate+up [h, 2 I / tp] and down
  [I / tp, h], or up/down for OPT-style MLPs), timed as one sequence of torch matmuls and
  multiplied by num_layers, plus the lm head [h, vocab / tp] for all num_tokens tokens (an upper
  bound for prefill, where vLLM only projects the last token). Norms, activations, rotary,
  all-reduce and sampling are not included.
* attn_decode: our PagedAttention kernel (block size 16, shuffled tables) for one layer with
  H / tp query heads and max(1, KVH / tp) KV heads, times num_layers.
* attn_prefill: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on
  [1, H / tp, n, D] (GQA by ``enable_gqa``), one layer times num_layers.
* overhead: host wall time of one minimal step (a tiny kernel launch and a stream
  synchronize), median over 200: the floor of per-iteration fixed cost (Python scheduling and
  sampling in a real engine add more; override in the cost model if needed).

Points that need more than ``mem_budget`` of device memory are skipped. Needs CuPy and torch
with CUDA.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from gpu.device import device_info, gpu_slug, require_cupy, torch_cuda_available
from sim.profile_format import write_profile
from sim.errors import ConfigError, NeedsGPUError

DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXT = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
LINEAR_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
QUICK = dict(batch=(1, 16, 64), context=(256, 2048), tokens=(1, 64, 512, 2048), prefill=(128, 1024))


def grids(model, quick: bool):
    """(decode (batch, context) pairs, linear num_tokens, prefill lengths) capped by max_seq_len."""
    if quick:
        b, c, t, p = QUICK["batch"], QUICK["context"], QUICK["tokens"], QUICK["prefill"]
    else:
        b, c, t, p = DECODE_BATCH, DECODE_CONTEXT, LINEAR_TOKENS, PREFILL_TOKENS
    c = [x for x in c if x <= model.max_seq_len] or [min(c)]
    p = [x for x in p if x <= model.max_seq_len] or [min(p)]
    return [(bb, cc) for bb in b for cc in c], list(t), list(p)


def per_gpu_heads(model, tp: int) -> tuple[int, int]:
    if model.num_heads % tp:
        raise ConfigError(f"--tp {tp} does not divide num_heads={model.num_heads} of {model.name}")
    return model.num_heads // tp, max(1, model.num_kv_heads // tp)


def _time_cuda(fn, reps: int, warmup: int = 2) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return float(statistics.median(ts))


def linear_time_us(model, n: int, tp: int, tdtype, reps: int) -> float:
    import torch
    h, D = model.hidden_size, model.head_dim
    H, KVH = per_gpu_heads(model, tp)
    inter = model.intermediate_size // tp
    dev = "cuda"
    x = torch.randn(n, h, device=dev, dtype=tdtype)
    w_qkv = torch.randn(h, (H + 2 * KVH) * D, device=dev, dtype=tdtype)
    w_o = torch.randn(H * D, h, device=dev, dtype=tdtype)
    w_up = torch.randn(h, (2 if model.gated_mlp else 1) * inter, device=dev, dtype=tdtype)
    w_down = torch.randn(inter, h, device=dev, dtype=tdtype)
    w_lm = torch.randn(h, model.vocab_size // tp, device=dev, dtype=tdtype)
    a = torch.randn(n, H * D, device=dev, dtype=tdtype)
    m = torch.randn(n, inter, device=dev, dtype=tdtype)

    def layer():
        torch.matmul(x, w_qkv)
        torch.matmul(a, w_o)
        torch.matmul(x, w_up)
        torch.matmul(m, w_down)

    t_layer = _time_cuda(layer, reps)
    t_lm = _time_cuda(lambda: torch.matmul(x, w_lm), reps)
    return t_layer * model.num_layers + t_lm


def decode_time_us(cp, model, batch: int, context: int, tp: int, dtype: str, reps: int) -> float:
    from gpu import paged_attention as pa
    from gpu.bench import random_fill
    H, KVH = per_gpu_heads(model, tp)
    D, bs = model.head_dim, 16
    storage = cp.float16 if dtype == "float16" else cp.uint16
    nblk = -(-context // bs)
    rng = np.random.default_rng(batch + context)
    tables = cp.asarray(rng.permutation(batch * nblk).astype(np.int32).reshape(batch, nblk))
    lens = cp.full(batch, context, dtype=cp.int32)
    q = cp.empty((batch, H, D), dtype=storage)
    kc = cp.empty((batch * nblk, bs, KVH, D), dtype=storage)
    vc = cp.empty_like(kc)
    for i, a in enumerate((q, kc, vc)):
        random_fill(cp, a, dtype, i)
    plan = pa.prepare(q, kc, vc, tables, lens, bs, context, dtype=dtype, check=False)
    import torch
    torch.cuda.synchronize()
    t = _time_cuda(plan.launch, reps)
    del plan, kc, vc
    cp.get_default_memory_pool().free_all_blocks()
    return t * model.num_layers


def prefill_time_us(model, n: int, tp: int, tdtype, reps: int) -> float:
    import torch
    import torch.nn.functional as F
    H, KVH = per_gpu_heads(model, tp)
    D = model.head_dim
    q = torch.randn(1, H, n, D, device="cuda", dtype=tdtype)
    k = torch.randn(1, KVH, n, D, device="cuda", dtype=tdtype)
    v = torch.randn(1, KVH, n, D, device="cuda", dtype=tdtype)
    kw = {"enable_gqa": True} if KVH != H else {}
    return _time_cuda(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw), reps) * model.num_layers


def overhead_us(cp, reps: int = 200) -> float:
    x = cp.zeros(1, dtype=cp.float32)
    stream = cp.cuda.get_current_stream()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x += 1
        stream.synchronize()
        ts.append((time.perf_counter() - t0) * 1e6)
    return float(statistics.median(ts))


def run(model_name: str, out: str | Path, quick: bool = False, tp: int = 1, dtype: str = "float16",
        gpu_name: str | None = None, reps: int | None = None, mem_budget_gib: float | None = None,
        log=print) -> Path:
    from sim.specs import get_model
    model = get_model(model_name)
    if dtype not in ("float16", "bfloat16"):
        raise ConfigError(f"--dtype must be float16 or bfloat16, got {dtype}")
    if tp < 1:
        raise ConfigError(f"--tp must be >= 1, got {tp}")
    per_gpu_heads(model, tp)
    cp = require_cupy("pagesim gpu calibrate")
    if not torch_cuda_available():
        raise NeedsGPUError("pagesim gpu calibrate needs PyTorch with CUDA (prefill attention via SDPA and the "
                            "linear layers via cuBLAS); install a CUDA build of torch")
    import torch
    tdtype = torch.float16 if dtype == "float16" else torch.bfloat16
    info = device_info()
    gpu = gpu_name or gpu_slug(info["name"])
    reps = reps or (5 if quick else 20)
    budget = (mem_budget_gib * (1 << 30)) if mem_budget_gib else 0.6 * info["free_mem_bytes"]
    decode_pts, tokens, prefill = grids(model, quick)
    H, KVH = per_gpu_heads(model, tp)
    common = dict(model=model.name, gpu=gpu, dtype=dtype, tp=tp)
    rows = []

    def add(component, t, **keys):
        row = dict(component=component, num_tokens=None, batch=None, context=None, time_us=t, **common)
        row.update(keys)
        rows.append(row)

    log(f"calibrating {model.name} on {info['name']} ({dtype}, tp={tp}); {len(tokens)} linear, "
        f"{len(decode_pts)} decode, {len(prefill)} prefill points")
    for n in tokens:
        t = linear_time_us(model, n, tp, tdtype, reps)
        add("linear", t, num_tokens=n)
        log(f"  linear       n={n:<6} {t:12.1f} us")
    for b, c in decode_pts:
        need = 2 * b * c * KVH * model.head_dim * 2 + b * H * model.head_dim * 2
        if need > budget:
            log(f"  attn_decode  b={b} ctx={c}: skipped (needs {need / 2**30:.1f} GiB)")
            continue
        t = decode_time_us(cp, model, b, c, tp, dtype, reps)
        add("attn_decode", t, batch=b, context=c)
        log(f"  attn_decode  b={b:<4} ctx={c:<6} {t:12.1f} us")
    for n in prefill:
        t = prefill_time_us(model, n, tp, tdtype, reps)
        add("attn_prefill", t, num_tokens=n)
        log(f"  attn_prefill n={n:<6} {t:12.1f} us")
        torch.cuda.empty_cache()
    add("overhead", overhead_us(cp))
    p = write_profile(rows, out)
    log(f"wrote {len(rows)} rows to {p}")
    return p
