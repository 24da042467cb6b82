"""Where one real step's time goes: the GPU executor's model runner, profiled step by step.

    python3 benchmarks/gpu_step_profile.py [--model llama-2-7b] [--layers 4] [--out DIR]

Runs prefill steps (1 and 4 sequences of 128 tokens) and decode steps (8 and 32 sequences at a
context of 300) through ``TorchCupyBackend`` as ``pagesim validate`` does, for each combination of
attention (paged kernel / torch SDPA) and cache operations (kernel / torch), and prints each
step's median time with the share the host spends between launches. Then it profiles the
default configuration twice: ``torch.profiler`` (the ops' host and device times) and ``cProfile``
(the Python functions), and writes both tables under ``--out``. Last, the hold probe
(``hold_probe.txt``): prefill steps at the lengths the H200 validation of 2026-11-27 ran, which
lost the hold behind their launches in about half the steps (their launch waited for the GPU),
over a backend warmed up at powers of two and one warmed up densely (``pagesim validate``'s),
each in a process of its own (``--hold-probe DENSE`` runs one).
Needs CUDA; this is a measuring tool for the device machine, not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()

from pagesim.gpu.model_runner import DENSE_WARM_TOKENS, TorchCupyBackend  # noqa: E402
from pagesim.gpu.testing import HandSteps  # noqa: E402
from pagesim.sim.specs import get_model  # noqa: E402


class Steps:
    """Hand-built steps over a fresh backend (gpu.testing.HandSteps): prefill and decode
    batches of given shapes, new sequence ids for every prefill."""

    def __init__(self, model, backend, block_size=16):
        self.steps = HandSteps(model, backend, num_blocks=200_000 // block_size, block_size=block_size)
        self.backend = backend
        self.next_id = 0

    def prefill(self, num_seqs: int, tokens: int) -> float:
        ids = list(range(self.next_id, self.next_id + num_seqs))
        self.next_id += num_seqs
        return self.steps.prefill(ids, [tokens] * num_seqs)

    def decode_set(self, num_seqs: int, context: int) -> list[int]:
        self.prefill(num_seqs, context - 1)
        return list(range(self.next_id - num_seqs, self.next_id))

    def decode(self, ids: list[int]) -> float:
        return self.steps.decode(ids)


def sdpa_backends(torch, model) -> list[str]:
    """Host and device time of one causal SDPA call per backend and length (the prefill path calls
    it once per sequence and layer): a first call at a new length may build a plan (cuDNN)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    rows = [f"{'sdpa backend':28s} " + " ".join(f"{'n=' + str(n) + ' 1st/then ms':>22s}" for n in (7, 128, 1000))]
    for b in (None, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
              SDPBackend.MATH):
        cells = []
        for n in (7, 128, 1000):
            q = torch.randn(1, model.num_heads, n, model.head_dim, device="cuda", dtype=torch.float16)
            times = []
            try:
                for _ in range(6):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    if b is None:
                        F.scaled_dot_product_attention(q, q, q, is_causal=True)
                    else:
                        with sdpa_kernel(b):
                            F.scaled_dot_product_attention(q, q, q, is_causal=True)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
                cells.append(f"{1e3 * times[0]:10.3f}/{1e3 * float(np.median(times[1:])):<11.3f}")
            except Exception as e:  # a backend that does not take this shape
                cells.append(f"{type(e).__name__:>22s}")
        rows.append(f"{'default' if b is None else b.name:28s} " + " ".join(cells))
    return rows


#: prefill lengths of benchmarks/results/2026-11-27-h200/session2/partition-rule/val_llama-2-7b, in
#: its order: 72, 210, 238, 64 and 30 kept the hold there, the others lost it (gaps_hidden False)
HOLD_PROBE = (90, 100, 45, 150, 72, 332, 210, 238, 64, 30, 348, 132, 23, 123, 83, 743, 581, 267, 422, 110)


def hold_probe(torch, model, layers: int, dtype: str, dense: int) -> list[str]:
    """Device-timed prefills of one sequence, each after a decode step (as a serving run alternates
    them), over a backend warmed up at powers of two (``dense`` 0) or at every count to ``dense``
    (``pagesim validate``'s: model_runner.warm_up_token_counts); run in a fresh process, as CUDA
    loads a kernel once per process. First each length of HOLD_PROBE unprofiled: whether its
    launches stayed behind the hold, its launch time and the hold's estimate; then each length + 1
    (lengths not yet run) with torch's synchronizing calls (``set_sync_debug_mode``: their Python
    lines) and the Python function with the most self time (a wait on the GPU sits in one)."""
    be = TorchCupyBackend(dtype=dtype, num_layers_run=layers, dense_warm_tokens=dense)
    st = Steps(model, be)
    dec = st.decode_set(8, 300)
    mode = f"dense {dense}" if dense else "pow2"
    lines = []
    for n in HOLD_PROBE:
        st.decode(dec)
        estimate = be._hold_estimate(1)
        st.prefill(1, n)
        t = be.last_timing
        lines.append(f"{mode:>10} {n:6d} {str(t.get('gaps_hidden')):>6} {1e3 * t.get('launch_s', float('nan')):9.2f} "
                     f"{1e3 * estimate:8.2f}")
        print(lines[-1], flush=True)
    for n in HOLD_PROBE:
        st.decode(dec)
        pr = cProfile.Profile()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            pr.enable()
            try:
                st.prefill(1, n + 1)
            finally:
                pr.disable()
                torch.cuda.set_sync_debug_mode("default")
        t = be.last_timing
        (file, line, fn), (_, _, self_s, _, _) = max(pstats.Stats(pr).stats.items(), key=lambda kv: kv[1][2])
        syncs = sorted({f"{Path(w.filename).name}:{w.lineno}" for w in caught if "ynchroniz" in str(w.message)})
        new = [f"{mode:>10} {n + 1:6d} {str(t.get('gaps_hidden')):>6} profiled: {1e3 * self_s:8.2f} ms "
               f"in {fn} ({Path(file).name}:{line})"]
        # torch's synchronizing calls, wrapped (never cut) to 100 columns
        new += textwrap.wrap(f"syncs: {' '.join(syncs) or '-'}", 100, initial_indent=" " * 18,
                             subsequent_indent=" " * 25)
        lines += new
        print("\n".join(new), flush=True)
    return lines


def hold_probes(a) -> list[str]:
    """hold_probe for each warm-up, each in a process of its own."""
    import subprocess
    lines = ["hold probe: prefill steps of one sequence, each after a decode of 8; each warm-up in a fresh process",
             f"{'warm-up':>10} {'tokens':>6} {'hidden':>6} {'launch ms':>9} {'hold est':>8}"]
    for dense in (0, DENSE_WARM_TOKENS):
        done = subprocess.run([sys.executable, __file__, "--model", a.model, "--layers", str(a.layers),
                               "--hold-probe", str(dense)], capture_output=True, text=True)
        lines += done.stdout.splitlines() or [f"dense {dense}: failed: {done.stderr.strip()[-300:]}"]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default="out/gpu_step_profile")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the torch paths only")
    ap.add_argument("--hold-probe", type=int, metavar="DENSE", help="only the hold probe, warmed up at every "
                    "count to DENSE (0: powers of two), in this process (main runs both so)")
    a = ap.parse_args(argv)
    import torch
    if a.hold_probe is not None:
        hold_probe(torch, get_model(a.model), a.layers, "float16", a.hold_probe)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = get_model(a.model)
    cpu = a.device == "cpu"
    lines = [f"{a.model}, {a.layers} of {model.num_layers} layers run, on {torch.cuda.get_device_name() if not cpu else 'cpu'}",
             f"{'attention':9s} {'cache':6s} {'step':22s} {'wall ms':>9s} {'span ms':>9s} {'scaled ms':>10s}"]
    kinds = ("torch",) if cpu else ("kernel", "torch")
    dtype = "float32" if cpu else "float16"
    for attention in kinds:
        for cache_ops in kinds:
            be = TorchCupyBackend(dtype=dtype, num_layers_run=a.layers, attention=attention,
                                  cache_ops=cache_ops, device=a.device)
            st = Steps(model, be)
            dec8, dec32 = st.decode_set(8, 300), st.decode_set(32, 300)
            cases = {"prefill 1x128": lambda: st.prefill(1, 128), "prefill 4x128": lambda: st.prefill(4, 128),
                     "decode 8 @300": lambda: st.decode(dec8), "decode 32 @300": lambda: st.decode(dec32)}
            for name, fn in cases.items():
                for _ in range(3):
                    fn()  # warm: compilation, cuDNN/cuBLAS plans, allocator
                rows = []
                for _ in range(10):
                    fn()
                    rows.append(dict(be.last_timing))
                med = {k: float(np.median([r[k] for r in rows])) for k in ("wall_s", "layer_span_s", "step_s")}
                lines.append(f"{attention:9s} {cache_ops:6s} {name:22s} {1e3 * med['wall_s']:9.3f} "
                             f"{1e3 * med['layer_span_s']:9.3f} {1e3 * med['step_s']:10.3f}")
                print(lines[-1], flush=True)
            del st, be
            if not cpu:
                torch.cuda.empty_cache()
    if not cpu:
        lines += sdpa_backends(torch, model)
        print("\n".join(lines[-6:]), flush=True)
    be = TorchCupyBackend(dtype=dtype, num_layers_run=a.layers, device=a.device)
    st = Steps(model, be)
    dec = st.decode_set(8, 300)
    for _ in range(3):
        st.decode(dec)
        st.prefill(1, 128)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            st.decode(dec)
            st.prefill(1, 128)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    (out / "torch_profile_cpu.txt").write_text(table)
    (out / "torch_profile_cuda.txt").write_text(prof.key_averages().table(sort_by="self_cuda_time_total",
                                                                          row_limit=30))
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(5):
        st.decode(dec)
        st.prefill(1, 128)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
    (out / "cprofile.txt").write_text(f"5 x (decode 8 + prefill 1x128) in {time.perf_counter() - t0:.3f} s\n"
                                      + s.getvalue())
    (out / "steps.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(table[:6000])
    if not cpu:
        (out / "hold_probe.txt").write_text("\n".join(hold_probes(a)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
