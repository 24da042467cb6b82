"""CPU tests of `pagesim gpu` without a GPU (clear one-line errors) and of the pure helpers of
the benchmark and calibration modules."""

from __future__ import annotations

import pytest

from pagesim.gpu.device import cuda_available, gpu_slug
from pagesim.sim.cli import main


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("argv", [["gpu", "bench", "--quick"], ["gpu", "info"],
                                  ["gpu", "calibrate", "--model", "llama-2-7b", "--out", "x.csv", "--quick"]])
def test_needs_gpu_one_line_exit_2(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pagesim: error: ") and "CUDA GPU" in err[0]
    assert "Traceback" not in err[0]
    assert not (tmp_path / "x.csv").exists()


def test_help_works_without_cupy(capsys):
    with pytest.raises(SystemExit) as e:
        main(["gpu", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "bench" in out and "calibrate" in out and "info" in out
    assert main(["gpu"]) == 2  # no subcommand: help, exit 2


def test_calibrate_unknown_model_is_a_config_error(capsys):
    assert main(["gpu", "calibrate", "--model", "nope", "--out", "x.csv"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err


def test_gpu_slug():
    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA A100-SXM4-80GB") == "a100-sxm4-80gb"
    assert gpu_slug("") == "gpu"


def test_bench_sweep_and_bytes():
    from pagesim.gpu.bench import COLUMNS, Point, sweep
    full, quick = sweep(False), sweep(True)
    assert len(full) == 5 * 5 * 2 * 2 + 4 * 2 * 2 * 2 and len(quick) < 15
    for heads in ((32, 32), (32, 8)):  # engines' block sizes 8 to 128, MHA and GQA
        assert {p.block_size for p in full if (p.num_heads, p.num_kv_heads) == heads} == {8, 16, 32, 64, 128}
    assert {(p.num_heads, p.num_kv_heads) for p in full} == {(32, 32), (32, 8)}
    assert {p.dtype for p in full} == {"float16", "bfloat16"}
    assert Point(2, 1000, 16, 32, 8, 128, "float16").kv_bytes == 2 * 2 * 1000 * 8 * 128 * 2
    for c in ["batch", "context", "block_size", "num_heads", "num_kv_heads", "head_dim", "dtype", "kv_bytes",
              "time_us", "achieved_gbps", "copy_gbps", "frac_of_copy", "contiguous_time_us", "sdpa_time_us",
              "kernel", "stages", "other_stages_time_us", "simple_time_us", "simple_partitions"]:
        assert c in COLUMNS


def test_calibrate_grids_respect_max_seq_len():
    from pagesim.gpu.calibrate import grids, per_gpu_heads
    from pagesim.sim.errors import ConfigError
    from pagesim.sim.specs import get_model
    m = get_model("llama-2-7b")  # max_seq_len 4096
    decode, tokens, prefill = grids(m, quick=False)
    assert max(c for _, c in decode) == 4096 and max(prefill) == 4096 and 1 in tokens
    assert per_gpu_heads(get_model("llama-2-70b"), 8) == (8, 1)
    with pytest.raises(ConfigError, match="does not divide"):
        per_gpu_heads(m, 3)


def test_bench_summary_against_the_targets(tmp_path):
    """512 MiB = 536,870,912 B of KV at 3000 GB/s of copy: MHA in 200 us is 2684 GB/s = 0.89 of the
    copy, SDPA 200 / 200 = 1.00: met. GQA's tensor kernel in 250 us: 0.72, SDPA 275 / 250 = 1.10: not
    met (bandwidth); its simple kernel in 400 us: 0.45, 275 / 400 = 0.69. The 1,000-byte point is
    under 256 MiB: left out."""
    import csv

    from pagesim.gpu.bench import COLUMNS, summarize
    path = tmp_path / "k.csv"
    base = dict.fromkeys(COLUMNS, "")
    rows = [dict(base, num_heads=32, num_kv_heads=32, kv_bytes=536870912, time_us=200, copy_gbps=3000,
                 sdpa_time_us=200, kernel="simple"),
            dict(base, num_heads=32, num_kv_heads=8, kv_bytes=536870912, time_us=250, copy_gbps=3000,
                 sdpa_time_us=275, kernel="tensor", simple_time_us=400, stages=3, other_stages_time_us=300),
            dict(base, num_heads=32, num_kv_heads=8, kv_bytes=1000, time_us=1, copy_gbps=3000, sdpa_time_us=9,
                 kernel="tensor", simple_time_us=2)]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    lines = summarize(path)
    assert lines[1:] == ["  GQA simple     1 points  copy 0.45 (0.45)  SDPA/ours 0.69 (0.69)  NOT met",
                         "  GQA tensor     1 points  copy 0.72 (0.72)  SDPA/ours 1.10 (1.10)  NOT met",
                         "  MHA simple     1 points  copy 0.89 (0.89)  SDPA/ours 1.00 (1.00)  met",
                         # the other stage count took 300 us where the chosen 3 took 250: 1.20
                         "  tensor stages: the count chosen quicker at 1 of 1 points; other / chosen time, "
                         "median 1.20"]
    assert all(len(x) <= 100 for x in lines)
    path.write_text(",".join(COLUMNS) + "\n")  # the dry run's header-only file
    assert summarize(path) == [f"kernel sweep: no point with >= 256 MiB of KV in {path}"]


def test_a_bad_attention_kernel_variable_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    from pagesim.sim.cli import main
    monkeypatch.setenv("PAGESIM_ATTENTION_KERNEL", "fast")
    assert main(["validate", "--workload", "sharegpt", "--rate", "2", "--num-requests", "3", "--model",
                 "llama-2-7b", "--gpu", "h100", "--backend", "fake", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pagesim: error: PAGESIM_ATTENTION_KERNEL must be one of auto, simple, tensor, got 'fast'"]
