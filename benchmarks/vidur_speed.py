"""The whole process against Vidur's on the same trace (issue 85: >= 50x in CPU seconds).

Both replay Vidur's own Azure conversation 2023 trace (its
``data/processed_traces/splitwise_conv.csv``, 19,366 requests, prompts clipped so that a request
holds at most 4,096 tokens as Vidur's trace replay clips them: pagesim's ``--max-len-policy
clip-prompt``) through vLLM's scheduler, Llama-2-7B on one A100. Each run is a fresh process
measured by ``wait4`` (user + system CPU, children included), the two alternated ``--repeat``
times, each writing its files (Vidur its metrics, plots and event trace; pagesim its ``--out``
folder); the best of each and their ratio are printed. Vidur runs with its trained
execution-time predictor cached, as pagesim runs with its compiled core: its first run trains
its random forests (21 minutes of CPU on 2 cores) and is timed apart, as is pagesim's first (its
compile, where one is due). Asserts nothing.

Vidur runs from a checkout of GitHub microsoft/vidur in its own environment::

    git clone https://github.com/microsoft/vidur DIR
    python -m venv VENV && VENV/bin/pip install -r DIR/requirements.txt
    python benchmarks/vidur_speed.py --vidur DIR --vidur-python VENV/bin/python [--repeat 3]

Its profiling data's ``attention.csv`` files are kept in Git LFS. Where DIR has none for the A100
and Llama-2-7B, this script writes a stand-in from the attention rows of that pair in
``../shared/measured/vidur-attention-subset`` (Vidur's own measurements, 1,317 of them, in
Vidur's columns): Vidur then trains and predicts on fewer rows than with its whole file, which
can only make it faster, and the ratio smaller.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _import_path import ROOT, child_env
from _measure import measured

TRACE = "data/processed_traces/splitwise_conv.csv"
ATTENTION = "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv"
SUBSET = "vidur-attention-subset/a100_llama-2-7b_attention_rows.csv"
#: the columns Vidur's predictor reads of an attention row (sklearn_execution_time_predictor.py:
#: ``_load_attention_df`` filters by the model's shape and TP, ``_train_attention_layer_models``
#: fits decode time on (batch_size, kv_cache_size), prefill time on (kv_cache_size,
#: prefill_chunk_size squared)); Llama-2-7B: 4,096 wide, 32 query and 32 KV heads; blocks of 16
LLAMA_2_7B = {"n_embd": 4096, "n_q_head": 32, "n_kv_head": 32, "block_size": 16, "num_tensor_parallel_workers": 1}


def stand_in_attention(subset: Path, out: Path) -> int:
    """Write Vidur's attention table for the A100 and Llama-2-7B from the measured rows
    ``subset`` (kind, kv, n, median_ms: a decode's batch ``n`` over ``kv`` cached tokens, or a
    prefill's chunk ``n`` after ``kv``); returns its rows."""
    import pandas as pd

    rows = pd.read_csv(subset)
    decode, prefill = rows[rows["kind"] == "decode"], rows[rows["kind"] == "prefill"]
    table = pd.concat([
        pd.DataFrame({**LLAMA_2_7B, "batch_size": decode["n"].to_numpy(), "kv_cache_size": decode["kv"].to_numpy(),
                      "prefill_chunk_size": 0, "time_stats.attn_decode.median": decode["median_ms"].to_numpy(),
                      "time_stats.attn_prefill.median": 0.0}),
        pd.DataFrame({**LLAMA_2_7B, "batch_size": 1, "kv_cache_size": prefill["kv"].to_numpy(),
                      "prefill_chunk_size": prefill["n"].to_numpy(), "time_stats.attn_decode.median": 0.0,
                      "time_stats.attn_prefill.median": prefill["median_ms"].to_numpy()})])
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    return len(table)


def vidur_command(python: str, trace: Path) -> list[str]:
    return [python, "-m", "vidur.main", "--replica_config_device", "a100",
            "--replica_config_model_name", "meta-llama/Llama-2-7b-hf", "--cluster_config_num_replicas", "1",
            "--replica_config_tensor_parallel_size", "1", "--request_generator_config_type", "trace_replay",
            "--trace_request_generator_config_trace_file", str(trace), "--replica_scheduler_config_type", "vllm"]


def pagesim_command(trace: Path, out: Path) -> list[str]:
    """pagesim's run, its files written into ``out`` (as Vidur writes its metrics and traces)."""
    return [sys.executable, "-m", "pagesim.sim.cli", "simulate", "--trace", str(trace),
            "--columns", "arrival=arrived_at,prompt=num_prefill_tokens,output=num_decode_tokens",
            "--system", "vllm", "--model", "llama-2-7b", "--gpu", "a100-80gb", "--max-len-policy", "clip-prompt",
            "--no-progress", "--out", str(out)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vidur", required=True, metavar="DIR", help="a checkout of microsoft/vidur")
    ap.add_argument("--vidur-python", required=True, metavar="PATH", help="the Python of Vidur's environment")
    ap.add_argument("--measured", default=str(ROOT.parent / "shared" / "measured"), metavar="DIR",
                    help="the measured GPU timings (../shared/measured)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    vidur = Path(args.vidur).resolve()
    trace = vidur / TRACE
    attention = vidur / ATTENTION
    if not attention.exists() or attention.read_bytes().startswith(b"version https://git-lfs"):
        rows = stand_in_attention(Path(args.measured) / SUBSET, attention)
        print(f"{ATTENTION}: Git LFS's, not in this checkout: a stand-in of the {rows:,} measured rows of "
              f"{SUBSET} written in its place")
    # Vidur reads its data by relative paths and writes its output and cache there; no network
    vidur_env = {**os.environ, "WANDB_MODE": "disabled"}
    folder = Path(tempfile.mkdtemp(prefix="pagesim-vidur-speed-"))
    runs = {"vidur": (lambda k: vidur_command(args.vidur_python, trace), vidur_env, vidur),
            "pagesim": (lambda k: pagesim_command(trace, folder / f"run{k}"), child_env(), None)}
    for name, (argv, env, cwd) in runs.items():
        first = measured(argv(0), env=env, cwd=cwd)
        # (Vidur trains its predictor where its cache has none; pagesim compiles where due)
        print(f"{name:<8} first run, apart: {first.cpu_s:7.1f} s of CPU, peak {first.peak_gb:.2f} GB")
    best = {name: float("inf") for name in runs}
    for k in range(args.repeat):
        for name, (argv, env, cwd) in runs.items():
            run = measured(argv(k + 1), env=env, cwd=cwd)
            best[name] = min(best[name], run.cpu_s)
            print(f"{name:<8} run {k + 1}: {run.cpu_s:7.2f} s of CPU, peak {run.peak_gb:.2f} GB")
    shutil.rmtree(folder)
    print(f"best: Vidur {best['vidur']:.2f} s, pagesim {best['pagesim']:.2f} s of CPU: "
          f"Vidur / pagesim = {best['vidur'] / best['pagesim']:.1f}x (target >= 50x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
