"""Decode-attention kernel benchmark: paged vs contiguous vs torch SDPA, against copy bandwidth.

Sweep (full): batch {1, 4, 16, 64, 256} x context {128, 512, 2k, 8k, 32k} x block size 16 x
{MHA 32/32, GQA-8 32/8} x {fp16, bf16}, head_dim 128; plus a smaller slice at block sizes
{1, 32, 128} (batch {16, 64}, context {512, 8k}, fp16). Every sequence of a point has the same
context; tables are shuffled (physical blocks in random order). ``--quick``: a handful of points.

Per point (one layer):
  kv_bytes      = 2 * sum(context) * num_kv_heads * head_dim * dtype_bytes   (K and V read once)
  kernel        the kernel ``time_us`` measured: the default choice (``paged_attention.choose_kernel``:
                "tensor", the tensor-core kernel, for GQA; "simple" for MHA)
  time_us       median over repeats of the paged kernel (incl. the split-K reduce), CUDA events
                around the launch only (plan prepared beforehand). Before every repeat the L2 is
                flushed by writing a buffer of max(2 x L2, 256 MiB) when kv_bytes < 4 x L2; that
                memset also keeps the GPU busy while Python enqueues the timed launch.
  achieved_gbps = kv_bytes / time / 1e9
  copy_gbps     device-to-device cupy copy of a 1 GiB buffer, measured once per run:
                (bytes read + bytes written) / time / 1e9 = 2 GiB / time. Read+write is the
                traffic a copy moves, so it is the like-for-like ceiling for a streaming read.
  frac_of_copy  = achieved_gbps / copy_gbps
  contiguous_time_us  same kernel on [batch, context, kv_heads, head_dim] KV (no table)
  sdpa_time_us  torch SDPA (q [B, H, 1, D]) on the contiguous KV (empty without torch+CUDA)
  simple_time_us  GQA points: the simple kernel (CUDA cores) on the same paged KV, so one run
                compares both kernels against the copy and SDPA (empty for MHA, where it is time_us)
  simple_partitions  its split-K partitions (the two kernels size them differently)
Points whose memory (paged + contiguous KV) exceeds ``--mem-budget-gib`` (default: 70% of
free memory; a point needs about 2.5 x kv_bytes) are skipped and logged.
"""

from __future__ import annotations

import csv
import datetime as _dt
import itertools
import statistics
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from pagesim.gpu import paged_attention as pa
from pagesim.gpu.device import device_info, gpu_slug, require_cupy, torch_cuda_available
from pagesim.gpu.hold_timing import device_time_us
from pagesim.gpu.kernels_src import TC_STAGES

COLUMNS = ["batch", "context", "block_size", "num_heads", "num_kv_heads", "head_dim", "dtype", "kv_bytes",
           "time_us", "achieved_gbps", "copy_gbps", "frac_of_copy", "contiguous_time_us", "sdpa_time_us",
           "num_partitions", "partition_size", "gpu", "kernel", "stages", "other_stages_time_us", "simple_time_us",
           "simple_partitions"]


@dataclass(frozen=True)
class Point:
    batch: int
    context: int
    block_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str

    @property
    def kv_bytes(self) -> int:
        return 2 * self.batch * self.context * self.num_kv_heads * self.head_dim * 2


def sweep(quick: bool = False) -> list[Point]:
    heads = [(32, 32), (32, 8)]
    if quick:
        pts = [Point(b, c, 16, h, kv, 128, "float16") for b, c in [(1, 2048), (16, 512), (64, 2048), (16, 8192)]
               for h, kv in heads]
        pts += [Point(16, 2048, bs, 32, 8, 128, dt) for bs, dt in [(1, "float16"), (128, "float16"), (16, "bfloat16")]]
        return pts
    pts = [Point(b, c, 16, h, kv, 128, dt)
           for b, c, (h, kv), dt in itertools.product([1, 4, 16, 64, 256], [128, 512, 2048, 8192, 32768], heads,
                                                      ["float16", "bfloat16"])]
    # engines' block sizes 8 to 128 (16 above), MHA and GQA: the time model's block-size cost against the kernel
    pts += [Point(b, c, bs, h, kv, 128, "float16")
            for bs, b, c, (h, kv) in itertools.product([8, 32, 64, 128], [16, 64], [512, 8192], heads)]
    return pts


def random_fill(cp, arr, dtype: str, seed: int = 0) -> None:
    """Fill a float16 / bf16-bits array with N(0,1) values in chunks (bounded temporary memory)."""
    flat = arr.reshape(-1)
    rs = cp.random.RandomState(seed)
    step = 1 << 26
    for i in range(0, flat.size, step):
        x = rs.standard_normal(min(step, flat.size - i), dtype=cp.float32)
        if dtype == "float16":
            flat[i:i + len(x)] = x.astype(cp.float16)
        else:
            flat[i:i + len(x)] = (x.view(cp.uint32) >> 16).astype(cp.uint16)


class Timer:
    """Device time of a launch function (gpu/hold_timing.py), with an optional L2 flush before
    each repeat."""

    def __init__(self, cp, l2_bytes: int):
        self.cp = cp
        self.flush_buf = cp.empty(max(2 * l2_bytes, 256 << 20), dtype=cp.uint8)
        self.l2_bytes = l2_bytes

    def time_us(self, fn, reps: int = 20, warmup: int = 3, flush: bool = True) -> float:
        return device_time_us(self.cp, fn, reps, warmup, before=(lambda: self.flush_buf.fill(1)) if flush else None)


def copy_gbps(cp, timer: Timer, nbytes: int = 1 << 30) -> float:
    """(read + write bytes) / time of a device-to-device copy of ``nbytes``."""
    free = cp.cuda.runtime.memGetInfo()[0]
    nbytes = int(min(nbytes, free // 4))
    a = cp.ones(nbytes, dtype=cp.uint8)
    b = cp.empty_like(a)
    t = timer.time_us(lambda: b.data.copy_from_device_async(a.data, nbytes), reps=10, flush=False)
    return 2 * nbytes / (t * 1e-6) / 1e9


def _torch_tensor(cp_arr, dtype):
    import torch
    t = torch.from_dlpack(cp_arr)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def run_point(cp, p: Point, timer: Timer, copy_bw: float, reps: int, gpu: str) -> dict:
    storage = cp.float16 if p.dtype == "float16" else cp.uint16
    rng = np.random.default_rng(p.batch * 7 + p.context)
    nblk = -(-p.context // p.block_size)
    num_blocks = p.batch * nblk
    tables = rng.permutation(num_blocks).astype(np.int32).reshape(p.batch, nblk)
    lens = np.full(p.batch, p.context, dtype=np.int32)
    q = cp.empty((p.batch, p.num_heads, p.head_dim), dtype=storage)
    random_fill(cp, q, p.dtype, 1)
    flush = p.kv_bytes < 4 * timer.l2_bytes
    kc = cp.empty((num_blocks, p.block_size, p.num_kv_heads, p.head_dim), dtype=storage)
    vc = cp.empty_like(kc)
    random_fill(cp, kc, p.dtype, 2)
    random_fill(cp, vc, p.dtype, 3)
    plan = pa.prepare(q, kc, vc, cp.asarray(tables), cp.asarray(lens), p.block_size, p.context,
                      dtype=p.dtype, check=False)
    t_paged = timer.time_us(plan.launch, reps=reps, flush=flush)
    part, nparts, kind, stages = plan.partition_size, plan.max_parts, plan.kernel_kind, plan.stages
    t_other = ""
    if kind == "tensor" and p.kv_bytes >= BIG_KV_BYTES:  # the stage count not chosen, where it fits
        other = next(s for s in TC_STAGES if s != stages)
        try:
            oplan = pa.prepare(q, kc, vc, cp.asarray(tables), cp.asarray(lens), p.block_size, p.context,
                               dtype=p.dtype, check=False, stages=other)
        except ValueError:
            oplan = None
        if oplan is not None:
            t_other = round(timer.time_us(oplan.launch, reps=reps, flush=flush), 3)
            del oplan
    t_simple, simple_parts = "", ""
    if kind != "simple":
        splan = pa.prepare(q, kc, vc, cp.asarray(tables), cp.asarray(lens), p.block_size, p.context,
                           dtype=p.dtype, check=False, kernel="simple")
        t_simple, simple_parts = round(timer.time_us(splan.launch, reps=reps, flush=flush), 3), splan.max_parts
        del splan
    # the same K/V rows, contiguous: [batch, context, kv_heads, head_dim]
    order = cp.asarray(tables.reshape(-1))
    kcont = kc[order].reshape(p.batch, nblk * p.block_size, p.num_kv_heads, p.head_dim)[:, :p.context]
    kcont = cp.ascontiguousarray(kcont)
    del kc
    vcont = cp.ascontiguousarray(vc[order].reshape(p.batch, nblk * p.block_size, p.num_kv_heads,
                                                   p.head_dim)[:, :p.context])
    del vc, plan
    cplan = pa.prepare_contiguous(q, kcont, vcont, cp.asarray(lens), p.context, dtype=p.dtype, check=False)
    t_cont = timer.time_us(cplan.launch, reps=reps, flush=flush)
    t_sdpa = ""
    if torch_cuda_available():
        import torch
        import torch.nn.functional as F
        tq = _torch_tensor(q, p.dtype).unsqueeze(2)  # [B, H, 1, D]
        tk = _torch_tensor(kcont, p.dtype).transpose(1, 2)  # [B, KVH, L, D] view
        tv = _torch_tensor(vcont, p.dtype).transpose(1, 2)
        kw = {"enable_gqa": True} if p.num_kv_heads != p.num_heads else {}
        stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        try:
            with stream:
                t_sdpa = timer.time_us(lambda: F.scaled_dot_product_attention(tq, tk, tv, **kw), reps=reps,
                                       flush=flush)
        except Exception as e:  # an SDPA backend refusing a shape must not sink the sweep
            print(f"  sdpa failed at {p}: {type(e).__name__}: {e}", file=sys.stderr)
            t_sdpa = ""
    del kcont, vcont, cplan
    ach = p.kv_bytes / (t_paged * 1e-6) / 1e9
    row = {f.name: getattr(p, f.name) for f in fields(p)}
    row.update(kv_bytes=p.kv_bytes, time_us=round(t_paged, 3), achieved_gbps=round(ach, 2),
               copy_gbps=round(copy_bw, 2), frac_of_copy=round(ach / copy_bw, 4),
               contiguous_time_us=round(t_cont, 3),
               sdpa_time_us=round(t_sdpa, 3) if t_sdpa != "" else "", num_partitions=nparts,
               partition_size=part, gpu=gpu, kernel=kind, stages=stages if kind == "tensor" else "",
               other_stages_time_us=t_other,
               simple_time_us=t_simple,
               simple_partitions=simple_parts)
    return row


def default_out(gpu_name: str) -> Path:
    day = _dt.date.today().isoformat()
    return Path("benchmarks/results") / f"gpu_kernel_{day}_{gpu_slug(gpu_name)}.csv"


def run(quick: bool = False, out: str | Path | None = None, reps: int | None = None,
        mem_budget_gib: float | None = None, log=print) -> Path:
    cp = require_cupy("pagesim gpu bench")
    info = device_info()
    out = Path(out) if out else default_out(info["name"])
    out.parent.mkdir(parents=True, exist_ok=True)
    reps = reps or (10 if quick else 30)
    budget = (mem_budget_gib * (1 << 30)) if mem_budget_gib else 0.7 * info["free_mem_bytes"]
    timer = Timer(cp, info["l2_bytes"])
    bw = copy_gbps(cp, timer)
    log(f"{info['name']} (sm {info['compute_capability']}, {info['sm_count']} SMs): copy {bw:.0f} GB/s (read+write)")
    rows, skipped = [], 0
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for p in sweep(quick):
            need = 2.5 * p.kv_bytes  # paged pool + contiguous copy + a gather temporary
            if need > budget:
                skipped += 1
                log(f"  skip {p} (needs {need / 2**30:.1f} GiB > budget {budget / 2**30:.1f} GiB)")
                continue
            row = run_point(cp, p, timer, bw, reps, info["name"])
            cp.get_default_memory_pool().free_all_blocks()
            w.writerow(row)
            f.flush()
            rows.append(row)
            log(f"  b={p.batch:<4} ctx={p.context:<6} bs={p.block_size:<4} h={p.num_heads}/{p.num_kv_heads} "
                f"{p.dtype:<8} {row['time_us']:>10.1f} us {row['achieved_gbps']:>8.0f} GB/s "
                f"({row['frac_of_copy']:.0%} of copy) contiguous {row['contiguous_time_us']:.1f} us "
                f"sdpa {row['sdpa_time_us']} {row['kernel']}"
                + (f" (simple {row['simple_time_us']} us)" if row["simple_time_us"] != "" else ""))
    log(f"wrote {len(rows)} points to {out} ({skipped} skipped for memory)")
    return out


#: the points the targets are judged on: enough KV that the kernel streams (the 2026-11-23 README)
BIG_KV_BYTES = 256 << 20
TARGET_FRAC, TARGET_SDPA = 0.8, 1.0


def summarize(path: str | Path) -> list[str]:
    """Per kernel and head layout, over the points with >= 256 MiB of KV: the median (and lowest)
    fraction of the copy bandwidth and of SDPA's speed (SDPA time / ours), against the targets
    (>= 0.8 of the copy, >= 1.0x SDPA). GQA points give two lines: the tensor-core kernel
    (``time_us``) and the simple one beside it (``simple_time_us``)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kv_bytes"] and int(r["kv_bytes"]) >= BIG_KV_BYTES]
    groups: dict[str, list[tuple[float, float | None]]] = {}
    for r in rows:
        layout = "MHA" if r["num_heads"] == r["num_kv_heads"] else "GQA"
        timed = [(r.get("kernel") or "simple", r["time_us"])]
        if r.get("simple_time_us"):
            timed.append(("simple", r["simple_time_us"]))
        for kernel, t in timed:
            t = float(t)
            frac = int(r["kv_bytes"]) / (t * 1e-6) / 1e9 / float(r["copy_gbps"])
            sdpa = float(r["sdpa_time_us"]) / t if r["sdpa_time_us"] else None
            groups.setdefault(f"{layout} {kernel}", []).append((frac, sdpa))
    if not groups:
        return [f"kernel sweep: no point with >= {BIG_KV_BYTES >> 20} MiB of KV in {path}"]
    lines = [f"kernel sweep, points with >= {BIG_KV_BYTES >> 20} MiB of KV: median (min); "
             f"targets >= {TARGET_FRAC} of copy, >= {TARGET_SDPA}x SDPA"]
    for name in sorted(groups):
        fr = [a for a, _ in groups[name]]
        sd = [b for _, b in groups[name] if b is not None]
        frac_med = statistics.median(fr)
        sdpa = (f"SDPA/ours {statistics.median(sd):.2f} ({min(sd):.2f})" if sd else "SDPA not measured")
        met = frac_med >= TARGET_FRAC and bool(sd) and statistics.median(sd) >= TARGET_SDPA
        lines.append(f"  {name:<12} {len(fr):>3} points  copy {frac_med:.2f} ({min(fr):.2f})  {sdpa}  "
                     f"{'met' if met else 'NOT met'}")
    # the tensor kernel's stage rule (paged_attention.tc_choose_stages) against the count it passed over
    other = [float(r["other_stages_time_us"]) / float(r["time_us"]) for r in rows if r.get("other_stages_time_us")]
    if other:
        lines.append(f"  tensor stages: the count chosen quicker at {sum(x > 1 for x in other)} of {len(other)} "
                     f"points; other / chosen time, median {statistics.median(other):.2f}")
    return lines
