"""The simple (MHA) decode kernel's time by partition size, at the decode batches a validation runs.

    python3 benchmarks/gpu_partition_sweep.py [--batches 1,2,4,8,16,32] [--out partition_sweep.csv]

The H200 validations of 2026-11-27 found llama-2-7b's decode steps over the table model by about
2 ms per thousand tokens of the longest walk one block makes (min(partition, longest context)):
a block reads its partition's tokens one after another, and at these sizes the kernel waits on
that walk. This times one layer's decode attention (llama-2-7b: 32 heads, head_dim 128, fp16,
blocks of 16 tokens, the L2 flushed before each repeat, behind a hold) for each batch, two
context shapes (every sequence at 600 tokens; one at 1,000 and the rest spread over 100-600, as
a serving batch is) and forced partitions: ``p=N`` cuts the longest context in ceil(longest / N)
equal partitions (600 tokens at ``p=512``: 300 + 300), beside what ``choose_partition_size``
picks (``rule``) and picks with 2 blocks an SM (``rule_fill2``: the fill before 2026-11-27; its
partitions made equal since, so it is not the old rule's 512 + 88 either). It prints the time of
each and the partition size the kernel ran in brackets.

Needs CUDA; a measuring tool for the device machine, not a test.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()

from pagesim.gpu import bench  # noqa: E402
from pagesim.gpu import paged_attention as pa  # noqa: E402
from pagesim.gpu.device import device_info, require_cupy  # noqa: E402

HEADS, HEAD_DIM, BLOCK = 32, 128, 16
FORCED = (64, 128, 256, 512)


def contexts(shape: str, batch: int, rng) -> np.ndarray:
    if shape == "uniform":
        return np.full(batch, 600, dtype=np.int32)
    lens = rng.integers(100, 601, batch).astype(np.int32)
    lens[0] = 1000
    return lens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="partition_sweep.csv")
    a = ap.parse_args(argv)
    cp = require_cupy("gpu_partition_sweep")
    info = device_info()
    timer = bench.Timer(cp, info["l2_bytes"])
    rng = np.random.default_rng(0)
    rows = []
    print(f"{info['name']}: {info['sm_count']} SMs; one layer's decode attention, us")
    print("us / the partition size the kernel ran")
    print(f"{'batch':>5} {'shape':>8} {'max':>5} {'sum':>6} " + " ".join(f"{c:>10}" for c in
          [f"p={p}" for p in FORCED] + ["rule", "rule_fill2"]))
    for batch in (int(b) for b in a.batches.split(",")):
        for shape in ("uniform", "mixed"):
            lens = contexts(shape, batch, rng)
            longest = int(lens.max())
            nblk = -(-longest // BLOCK)
            tables = rng.permutation(batch * nblk).astype(np.int32).reshape(batch, nblk)
            q = cp.empty((batch, HEADS, HEAD_DIM), dtype=cp.float16)
            kc = cp.empty((batch * nblk, BLOCK, HEADS, HEAD_DIM), dtype=cp.float16)
            vc = cp.empty_like(kc)
            for i, x in enumerate((q, kc, vc)):
                bench.random_fill(cp, x, "float16", i)
            args = (q, kc, vc, cp.asarray(tables), cp.asarray(lens), BLOCK, longest)
            cells = []
            for label, parts, fill in [(f"p={p}", math.ceil(longest / p), None) for p in FORCED] + [
                    ("rule", None, None), ("rule_fill2", None, 2)]:
                kept = pa.FILL_BLOCKS_PER_SM
                if fill is not None:
                    pa.FILL_BLOCKS_PER_SM = fill
                try:
                    plan = pa.prepare(*args, num_partitions=parts, dtype="float16", check=False, kernel="simple")
                finally:
                    pa.FILL_BLOCKS_PER_SM = kept
                t = timer.time_us(plan.launch, reps=a.reps)
                rows.append(dict(batch=batch, shape=shape, longest=longest, context_sum=int(lens.sum()),
                                 config=label, partition_size=plan.partition_size, partitions=plan.max_parts,
                                 time_us=round(t, 2), gpu=info["name"]))
                cells.append(f"{t:6.1f}/{plan.partition_size:<3}")
            print(f"{batch:>5} {shape:>8} {longest:>5} {int(lens.sum()):>6} " + " ".join(cells), flush=True)
            del q, kc, vc, plan
    if not rows:
        raise SystemExit("--batches: no batch size given")
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} rows to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
