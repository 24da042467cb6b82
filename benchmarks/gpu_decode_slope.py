"""Where a decode step's time grows with its sequences: the runner's step against the calibration's parts.

    python3 benchmarks/gpu_decode_slope.py [--models llama-2-7b,llama-3-8b] [--batches 1,2,4,8,16]
                                           [--context 300] [--layers 4] [--out DIR]

The 2026-11-26 H100 validation found the runner's llama-2-7b (MHA) decode step growing +0.29 ms a
sequence where the table model's sum of calibrated parts grows +0.01 (llama-3-8b, GQA: no such
slope). For each model and decode batch (every sequence at the same context) this prints:

- the runner's step as ``pagesim validate`` times it (CUDA graphs, behind a hold; its GPU share);
- the calibration's parts at the same point, timed as ``pagesim gpu calibrate`` times them:
  ``linear`` at that many tokens and ``attn_decode`` at (batch, context), and their sum;
- the runner's kernels one by one (eager, under torch.profiler), device microseconds a step scaled
  to every layer, so the kernel whose time grows with the batch shows by name.

Needs CUDA; a measuring tool for the device machine, not a test.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()

from pagesim.gpu.model_runner import TorchCupyBackend  # noqa: E402
from pagesim.gpu.testing import HandSteps  # noqa: E402
from pagesim.sim.specs import get_model  # noqa: E402


def decode_ids(steps: HandSteps, first: int, batch: int, context: int) -> list[int]:
    """``batch`` new sequences prefilled to ``context - 1`` tokens, ready to decode."""
    ids = list(range(first, first + batch))
    steps.prefill(ids, [context - 1] * batch)
    return ids


def blocks_for(batches, context: int) -> int:
    """Blocks for every sequence of every batch at its context plus the steps it decodes."""
    return sum(batches) * -(-(context + 32) // 16) + 64


def backend_for(layers: int, device: str, **kw) -> TorchCupyBackend:
    cpu = device == "cpu"
    return TorchCupyBackend(num_layers_run=layers, device=device, dtype="float32" if cpu else "float16", **kw)


def warm_batches(model, layers: int, batches, context: int, device: str, graphs: bool):
    """For each batch size: (its size, its sequence ids, the steps, the backend), once a fresh
    backend's decode of that batch has run three times (compilation, plans, allocator)."""
    graph_kw = {"cuda_graphs": graphs, "graph_sizes": list(batches)} if graphs else {"cuda_graphs": False}
    backend = backend_for(layers, device, **({} if device == "cpu" else graph_kw))
    steps = HandSteps(model, backend, num_blocks=blocks_for(batches, context), block_size=16)
    first = 0
    for b in batches:
        ids = decode_ids(steps, first, b, context)
        first += b
        for _ in range(3):
            steps.decode(ids)
        yield b, ids, steps, backend


def runner_steps(model, layers: int, batches, context: int, device: str, repeats: int = 10,
                 graphs: bool = True) -> dict[int, dict]:
    """Median step, GPU and layer-span seconds of the validation's runner (fused; its graphs
    replayed, or the same kernels launched behind a hold)."""
    out = {}
    for b, ids, steps, backend in warm_batches(model, layers, batches, context, device, graphs):
        rows = []
        for _ in range(repeats):
            steps.decode(ids)
            rows.append(dict(backend.last_timing))
        out[b] = {k: float(np.median([r[k] for r in rows])) for k in ("step_s", "gpu_s", "layer_span_s")}
        out[b]["graph_size"] = rows[-1].get("graph_size")
    return out


def kernel_times(model, layers: int, batches, context: int, device: str, repeats: int = 5,
                 graphs: bool = False) -> tuple[dict, float]:
    """Device microseconds a step of each kernel name (graphs replayed or eager), scaled to every layer."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    scale = model.num_layers / layers
    out = {}
    for b, ids, steps, _backend in warm_batches(model, layers, batches, context, device, graphs):
        with profile(activities=[ProfilerActivity.CPU if device == "cpu" else ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                steps.decode(ids)
            if device != "cpu":
                torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.key_averages():
            us = e.self_cpu_time_total if device == "cpu" else getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0.0)
            if us:
                per[e.key[:44]] += float(us) / repeats
        # per-layer kernels scale with the layers; the LM head, sampling and embedding run once, but
        # which is which is not in the name: the scaled and unscaled sums are both printed
        out[b] = dict(per)
    return out, scale


def calibration_parts(model, batches, context: int, device: str) -> dict[int, tuple[float, float]]:
    if device == "cpu":
        return {b: (0.0, 0.0) for b in batches}
    import cupy as cp
    import torch

    from pagesim.gpu.calibrate import decode_time_us, linear_time_us
    return {b: (linear_time_us(model, b, 1, torch.float16, 10),
                decode_time_us(cp, model, b, context, 1, "float16", 10)) for b in batches}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default="out/gpu_decode_slope")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the torch paths (times mean nothing)")
    a = ap.parse_args(argv)
    batches = [int(x) for x in a.batches.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def say(s=""):
        lines.append(s)
        print(s, flush=True)

    for name in a.models.split(","):
        model = get_model(name)
        say(f"== {name}: decode at context {a.context}, {a.layers} of {model.num_layers} layers run")
        run = runner_steps(model, a.layers, batches, a.context, a.device)
        cpu = a.device == "cpu"  # (no graphs on a CPU: both paths are one, run once)
        held = run if cpu else runner_steps(model, a.layers, batches, a.context, a.device, graphs=False)
        parts = calibration_parts(model, batches, a.context, a.device)
        say("the runner's step (graphs / eager behind a hold): gpu ms and its layer span ms (as run);")
        say("the calibration's parts, ms")
        say(f"{'batch':>5} {'gpu':>8} {'span':>7} {'graph':>5} {'held gpu':>8} {'span':>7} {'linear':>8} "
            f"{'attn':>8} {'sum':>8} {'gpu-sum':>8}")
        for b in batches:
            lin, att = (x / 1e3 for x in parts[b])
            r, h = run[b], held[b]
            say(f"{b:5d} {1e3 * r['gpu_s']:8.3f} {1e3 * r['layer_span_s']:7.3f} {str(r['graph_size']):>5} "
                f"{1e3 * h['gpu_s']:8.3f} {1e3 * h['layer_span_s']:7.3f} "
                f"{lin:8.3f} {att:8.3f} {lin + att:8.3f} {1e3 * r['gpu_s'] - lin - att:8.3f}")
        for graphs in (False,) if cpu else (False, True):
            kernel_table(say, model, a, batches, graphs)
        say()
    (out / "decode_slope.txt").write_text("\n".join(lines) + "\n")
    return 0


def kernel_table(say, model, a, batches, graphs: bool) -> None:
    kernels, scale = kernel_times(model, a.layers, batches, a.context, a.device, graphs=graphs)
    names = sorted({k for d in kernels.values() for k in d},
                   key=lambda k: -max(d.get(k, 0.0) for d in kernels.values()))
    say(f"kernels ({'graphs replayed' if graphs else 'eager'}), device us a step x {scale:g} "
        f"(the {a.layers} layers run stand for {model.num_layers}):")
    say(f"{'kernel':44s} " + " ".join(f"{'b=' + str(b):>8s}" for b in batches))
    for k in names[:25]:
        say(f"{k:44s} " + " ".join(f"{scale * kernels[b].get(k, 0.0):8.1f}" for b in batches))
    say(f"{'(sum, scaled)':44s} " + " ".join(f"{scale * sum(kernels[b].values()):8.1f}" for b in batches))


if __name__ == "__main__":
    sys.exit(main())
