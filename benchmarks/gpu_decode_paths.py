"""Decode steps three ways through the GPU runner, with ratios against the eager one measured in the
same run: what the fused kernels and the CUDA graphs change in a step's device and host time.

    python3 benchmarks/gpu_decode_paths.py [--model llama-2-7b] [--layers 4] [--out FILE]
    python3 benchmarks/gpu_decode_paths.py --dry-run      # the cases, on any machine

Paths (``TorchCupyBackend``): ``eager`` (torch ops one by one, every step launched from Python:
the first H100 run's runner), ``fused`` (gpu/fused_ops.py's kernels, launched from Python) and
``fused+graphs`` (the decode forward replayed from a CUDA graph at vLLM's padded size). Each path
runs decode steps of 1, 8, 32 and 100 sequences at a context of 300 (100 pads to the graph of
104), 3 warm-up and 10 timed steps each; it prints the median device time (``gpu_s``: CUDA events
around the step's kernels, run back to back), host time (``host_s``) and whole step (``step_s``)
in ms, and each path's device and whole-step time over eager's. Needs CUDA (but ``--dry-run``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()

#: (name, TorchCupyBackend keyword arguments)
PATHS = (("eager", dict(ops="eager", cuda_graphs=False)), ("fused", dict(ops="fused", cuda_graphs=False)),
         ("fused+graphs", dict(ops="fused", cuda_graphs=True)))
BATCHES = (1, 8, 32, 100)
CONTEXT = 300


def measure(model, layers: int, kw: dict) -> dict[int, dict[str, float]]:
    """Median gpu_s, host_s and step_s (ms) of decode steps per batch size, on a fresh backend."""
    import numpy as np
    import torch

    from pagesim.gpu.model_runner import TorchCupyBackend
    from pagesim.gpu.testing import HandSteps
    be = TorchCupyBackend(dtype="float16", num_layers_run=layers, max_num_seqs=max(BATCHES),
                          graph_max_context=CONTEXT + 32, **kw)
    steps = HandSteps(model, be, num_blocks=sum(BATCHES) * (CONTEXT + 64) // 16, block_size=16)
    out, first = {}, 0
    for b in BATCHES:
        ids = list(range(first, first + b))
        first += b
        steps.prefill(ids, [CONTEXT - 1] * b)
        rows = []
        for i in range(13):
            steps.decode(ids)
            if i >= 3:
                rows.append(be.last_timing)
        out[b] = {k: 1e3 * float(np.median([r[k] for r in rows])) for k in ("gpu_s", "host_s", "step_s")}
        out[b]["graph"] = rows[-1].get("graph_size")
    del steps, be
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--dry-run", action="store_true", help="list the cases; no GPU needed")
    a = ap.parse_args(argv)
    from pagesim.sim.specs import get_model
    model = get_model(a.model)
    if a.dry_run:
        print(f"dry run: {len(PATHS)} paths x decode batches {BATCHES} at context {CONTEXT}, {a.layers} of "
              f"{model.num_layers} layers of {a.model}: " + ", ".join(name for name, _ in PATHS))
        return 0
    results = {name: measure(model, a.layers, kw) for name, kw in PATHS}
    lines = [f"{a.model}, {a.layers} of {model.num_layers} layers run, decode at context {CONTEXT}; ms (median of 10)",
             f"{'path':13s} {'batch':>5s} {'graph':>5s} {'device':>8s} {'host':>8s} {'step':>8s} "
             f"{'device/eager':>12s} {'step/eager':>10s}"]
    for name, _ in PATHS:
        for b in BATCHES:
            r, e = results[name][b], results["eager"][b]
            lines.append(f"{name:13s} {b:5d} {str(r['graph'] or '-'):>5s} {r['gpu_s']:8.3f} {r['host_s']:8.3f} "
                         f"{r['step_s']:8.3f} {r['gpu_s'] / e['gpu_s']:12.3f} {r['step_s'] / e['step_s']:10.3f}")
    print("\n".join(lines))
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
