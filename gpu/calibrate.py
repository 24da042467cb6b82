"""Measure a model's per-iteration costs on this GPU and write the simulator's profile CSV.

``pagesim gpu calibrate --model llama-2-7b --out profile.csv [--quick] [--tp 1] [--dtype float16]``

Profile format (read by the table cost model through :func:`sim.cost.profile_format.read_profile`)::

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
  bound for prefill, where vLLM only projects the last token). With them, in the same timed
  sequence, the runner's fused element-wise kernels of a layer (``fused_layer_fn``: the two
  norms with their residual adds, rotary with the KV-cache write, SiLU-and-mul; what
  ``validate --ops fused`` runs), so that the table model prices the runner's own steps.
  All-reduce and sampling are not included.
* attn_decode: our PagedAttention kernel (block size 16, shuffled tables) for one layer with
  H / tp query heads and max(1, KVH / tp) KV heads, times num_layers. The L2 is flushed (a
  write of max(2 x L2, 256 MiB), ``gpu.bench.Timer``) before every timed launch: a layer's K/V
  is read from memory once per step, never from a cache warmed by the previous repeat.
  The (batch, context) grid is cut *before* measuring to the largest full rectangle whose
  points fit the memory budget (``decode_grid``): the table model interpolates over a full
  grid and refuses a grid with holes.
* attn_prefill: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on
  [1, H / tp, n, D] (GQA by ``enable_gqa``), one layer times num_layers.
* overhead: host wall time of one minimal step (a tiny kernel launch and a stream
  synchronize), median over 200: the floor of per-iteration fixed cost (Python scheduling and
  sampling in a real engine add more; override in the cost model if needed).

Points that need more than ``mem_budget`` of device memory are not measured (see decode_grid).
Before writing, the rows are read back by the table cost model exactly as ``--profile`` would
(``check_profile``): a profile it would refuse is never written (one line, exit code 2). Needs
CuPy and torch with CUDA; ``fake_profile`` writes the same grid priced by the roofline (the
GPU programme's dry run, no device).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from pagesim.gpu import paged_attention as pa
from pagesim.gpu.bench import Timer, random_fill
from pagesim.gpu.device import device_info, gpu_slug, require_cupy, torch_cuda_available
from pagesim.gpu.hold_timing import device_time_us
from pagesim.sim.cost.profile_format import write_profile
from pagesim.sim.cost.roofline import RooflineCostModel, TableCostModel
from pagesim.sim.errors import ConfigError, NeedsGPUError
from pagesim.sim.specs import get_gpu, get_model

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


def decode_bytes(model, batch: int, context: int, tp: int = 1) -> int:
    """Device memory of one decode-attention point: K and V of every token, plus the queries."""
    H, KVH = per_gpu_heads(model, tp)
    return 2 * batch * context * KVH * model.head_dim * 2 + batch * H * model.head_dim * 2


def decode_grid(model, pairs, budget: float, tp: int = 1):
    """The largest full (batch x context) rectangle of ``pairs`` whose points all fit ``budget``
    bytes: (kept pairs, dropped pairs). Need grows with batch and context, so the points that fit
    form a staircase; of the rectangles under it (the smallest k batches x the contexts that fit
    the k-th), the one with the most points wins, ties to more batches. Pure."""
    batches = sorted({b for b, _ in pairs})
    contexts = sorted({c for _, c in pairs})
    best = ([], [])
    for k in range(1, len(batches) + 1):
        bs = batches[:k]
        cs = [c for c in contexts if decode_bytes(model, bs[-1], c, tp) <= budget]
        if len(bs) * len(cs) >= len(best[0]) * len(best[1]) and cs:
            best = (bs, cs)
    keep = {(b, c) for b in best[0] for c in best[1]}
    return [p for p in pairs if p in keep], [p for p in pairs if p not in keep]


def check_profile(rows, model, gpu_name: str, tp: int = 1) -> None:
    """Raise ConfigError (one line) when the table cost model would refuse these rows as a profile."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "profile.csv"
        try:
            write_profile(rows, path)
            try:
                gpu = get_gpu(gpu_name)
            except Exception:
                gpu = get_gpu("h200")  # the GPU spec only prices what a profile lacks (never needed here)
            TableCostModel(path, model, gpu, tp)
        except ConfigError as e:
            raise ConfigError(f"calibrate: the table cost model would refuse this profile, so it is not "
                              f"written: {str(e).replace(str(path), 'profile')}") from None


def per_gpu_heads(model, tp: int) -> tuple[int, int]:
    if model.num_heads % tp:
        raise ConfigError(f"--tp {tp} does not divide num_heads={model.num_heads} of {model.name}")
    return model.num_heads // tp, max(1, model.num_kv_heads // tp)


def _time_cuda(fn, reps: int, warmup: int = 2) -> float:
    """Device time of torch launches (gpu/hold_timing.py): the kernels, not the host's launches."""
    import cupy as cp
    return device_time_us(cp, fn, reps, warmup)


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

    fused = fused_layer_fn(model, n, tp, tdtype, dev)

    def layer():
        torch.matmul(x, w_qkv)
        torch.matmul(a, w_o)
        torch.matmul(x, w_up)
        torch.matmul(m, w_down)
        fused()

    t_layer = _time_cuda(layer, reps)
    t_lm = _time_cuda(lambda: torch.matmul(x, w_lm), reps)
    return t_layer * model.num_layers + t_lm


def fused_layer_fn(model, n: int, tp: int, tdtype, dev: str):
    """One layer's fused element-wise kernels for ``n`` tokens, as gpu/layer_ops.FusedLayers launches
    them: RMSNorm with the residual add before attention, rotary with the KV-cache write (a slot
    per token), RMSNorm with the residual add before the MLP, SiLU-and-mul (gated MLPs)."""
    import torch

    from pagesim.gpu.fused_ops import fused_add_rms_norm, rotary_and_cache, silu_and_mul
    from pagesim.gpu.layer_ops import RMS_EPS
    h, D = model.hidden_size, model.head_dim
    H, KVH = per_gpu_heads(model, tp)
    inter = model.intermediate_size // tp
    x, residual = torch.randn(n, h, device=dev, dtype=tdtype), torch.randn(n, h, device=dev, dtype=tdtype)
    weight = torch.ones(h, device=dev, dtype=tdtype)
    qkv = torch.randn(n, (H + 2 * KVH) * D, device=dev, dtype=tdtype)
    pos = torch.arange(n, device=dev, dtype=torch.int64)
    angle = torch.rand(n, D // 2, device=dev) * 6.28
    cos, sin = angle.cos().to(tdtype), angle.sin().to(tdtype)
    kc = torch.zeros(-(-n // 16), 16, KVH, D, device=dev, dtype=tdtype)
    vc = torch.zeros_like(kc)
    gate_up = torch.randn(n, 2 * inter, device=dev, dtype=tdtype)
    act = torch.zeros(n, inter, device=dev, dtype=tdtype)

    def run():
        fused_add_rms_norm(x, residual, weight, RMS_EPS)
        rotary_and_cache(qkv, pos, cos, sin, H, KVH, kc, vc, pos)
        fused_add_rms_norm(x, residual, weight, RMS_EPS)
        if model.gated_mlp:
            silu_and_mul(gate_up, act)

    return run


def decode_time_us(cp, model, batch: int, context: int, tp: int, dtype: str, reps: int, timer=None) -> float:
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
    if timer is None:
        timer = Timer(cp, device_info()["l2_bytes"])
    t = timer.time_us(plan.launch, reps=reps, warmup=2, flush=True)  # K/V from memory, not from L2
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
    decode_pts, dropped = decode_grid(model, decode_pts, budget, tp)
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
    if dropped:
        log(f"  attn_decode: {len(dropped)} points left out to keep a full grid within "
            f"{budget / 2**30:.1f} GiB (largest kept: b={decode_pts[-1][0]} ctx={decode_pts[-1][1]})")
    timer = Timer(cp, info["l2_bytes"])
    for b, c in decode_pts:
        t = decode_time_us(cp, model, b, c, tp, dtype, reps, timer)
        add("attn_decode", t, batch=b, context=c)
        log(f"  attn_decode  b={b:<4} ctx={c:<6} {t:12.1f} us")
    for n in prefill:
        t = prefill_time_us(model, n, tp, tdtype, reps)
        add("attn_prefill", t, num_tokens=n)
        log(f"  attn_prefill n={n:<6} {t:12.1f} us")
        torch.cuda.empty_cache()
    add("overhead", overhead_us(cp))
    check_profile(rows, model, gpu, tp)
    p = write_profile(rows, out)
    log(f"wrote {len(rows)} rows to {p}")
    return p


def fake_profile(model_name: str, gpu_name: str, out: str | Path, budget_gib: float = 48.0, log=print) -> Path:
    """The calibration grid priced by the roofline model (no device): the GPU programme's dry run of
    ``calibrate``, through the same grid cut, refusal check and writer. Says nothing about a GPU."""
    model, gpu = get_model(model_name), get_gpu(gpu_name)
    roof = RooflineCostModel(model, gpu)
    decode_pts, tokens, prefill = grids(model, False)
    decode_pts, dropped = decode_grid(model, decode_pts, budget_gib * (1 << 30))
    common = dict(model=model.name, gpu=gpu_name, dtype="float16", tp=1, num_tokens=None, batch=None, context=None)
    rows = [dict(common, component="linear", num_tokens=n, time_us=roof.linear_time(n) * 1e6) for n in tokens]
    rows += [dict(common, component="attn_decode", batch=b, context=c, time_us=roof.decode_attention_time(b * c) * 1e6)
             for b, c in decode_pts]
    rows += [dict(common, component="attn_prefill", num_tokens=n,
                  time_us=float(roof.prefill_attention_time(np.array([n]), np.array([n]))) * 1e6) for n in prefill]
    rows.append(dict(common, component="overhead", time_us=max(roof.overhead_s * 1e6, 1.0)))
    check_profile(rows, model, gpu_name)
    p = write_profile(rows, out)
    log(f"fake profile (roofline prices, no device): {len(rows)} rows, {len(dropped)} decode points left out "
        f"for a {budget_gib:g} GiB budget -> {p}")
    return p
