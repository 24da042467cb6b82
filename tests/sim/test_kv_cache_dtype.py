"""``--kv-cache-dtype auto|fp8``: the KV cache's own width (``ModelSpec.kv_cache_dtype_bytes``),
worked by hand.

Llama-2-7B: 32 layers, 32 KV heads of 128 (hidden 4096), fp16. One token keeps K and V in every
layer: 2 x 32 x 4096 elements = 262,144 elements, 524,288 B at 2 B ("auto"), 262,144 B at 1 B
("fp8"). A100-40GB streams at 1555e9 x 0.8 = 1.244e12 B/s; PCIe 25e9 B/s.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pagesim.sim.batch import StepBatch
from pagesim.sim.cli import main
from pagesim.sim.config import SimConfig
from pagesim.sim.core.price import cost as C
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.roofline import RooflineCostModel, TableCostModel
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import resolve_budget
from pagesim.sim.specs import GiB, MODELS, get_gpu, get_model, kv_capacity, with_kv_cache_dtype
from tests.sim.helpers import write_table_profile

BW = 1555e9 * 0.8
LLAMA = get_model("llama-2-7b")
LLAMA_FP8 = with_kv_cache_dtype(LLAMA, "fp8")


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_halves_the_kv_bytes_per_token(name):
    assert LLAMA.kv_bytes_per_token() == 2 * 32 * 4096 * 2 == 524_288
    fp8 = with_kv_cache_dtype(LLAMA, name)
    assert fp8.kv_cache_dtype_bytes == 1
    assert fp8.kv_bytes_per_token() == 2 * 32 * 4096 * 1 == 262_144
    assert fp8.kv_bytes_per_token(2) == 131_072  # half the KV heads on each GPU of TP 2
    # DeepSeek-V3's latent: 61 layers x (512 + 64) x 1 B
    assert with_kv_cache_dtype(MODELS["deepseek-v3"], name).kv_bytes_per_token(8) == 35_136
    # the weights and the activations' width stay
    assert (fp8.dtype_bytes, fp8.weight_bytes) == (2, LLAMA.weight_bytes)


def test_auto_is_the_model_itself():
    assert with_kv_cache_dtype(LLAMA, "auto") is LLAMA and with_kv_cache_dtype(LLAMA, None) is LLAMA
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of auto, fp8"):
        with_kv_cache_dtype(LLAMA, "int4")


def test_a_gib_holds_twice_the_slots():
    # 12 GiB = 12,884,901,888 B: 24,576 tokens at 524,288 B, 49,152 at 262,144 B
    assert kv_capacity(LLAMA, kv_bytes=12 * GiB).capacity_tokens == 24_576
    assert kv_capacity(LLAMA_FP8, kv_bytes=12 * GiB).capacity_tokens == 49_152
    # derived from the GPU: the same bytes are left after the (unchanged) weights, each token takes half
    gpu = get_gpu("a100-80gb")
    auto, fp8 = kv_capacity(LLAMA, gpu), kv_capacity(LLAMA_FP8, gpu)
    assert fp8.kv_bytes == auto.kv_bytes
    assert (auto.capacity_tokens, fp8.capacity_tokens) == (auto.kv_bytes // 524_288, auto.kv_bytes // 262_144)


def test_the_config_reaches_the_budget():
    # SimConfig(kv_cache_dtype=...) is what --kv-cache-dtype and a TOML file set
    model, _gpu, budget = resolve_budget(SimConfig(model="llama-2-7b", kv_gib=12, kv_cache_dtype="fp8"))
    assert model.kv_cache_dtype == "fp8" and budget.kv_bytes_per_token == 262_144
    assert budget.capacity_tokens == 49_152
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        SimConfig(kv_cache_dtype="fp4")


def test_decode_attention_and_swaps_halve_the_rest_stays():
    auto, fp8 = (RooflineCostModel(m, get_gpu("a100-40gb")) for m in (LLAMA, LLAMA_FP8))
    # 4 sequences decoding, 1,000 tokens of context each: 4,000 x 262,144 B at 1.244e12 B/s = 0.842907 ms
    # (1.685813 ms at 16 bits); 8 tokens swapped: 8 x 262,144 B at 25e9 B/s = 83.886 us (167.772 us)
    assert fp8.decode_attention_time(4000) == pytest.approx(0.842907e-3, rel=1e-6)
    assert auto.decode_attention_time(4000) == pytest.approx(1.685813e-3, rel=1e-6)
    decode = StepBatch(decode_seq_ids=np.arange(4), decode_context=np.full(4, 1000, np.int64))
    assert auto.step_time(decode) - fp8.step_time(decode) == pytest.approx(0.842907e-3, rel=1e-6)
    swap = StepBatch(decode_seq_ids=np.arange(4), decode_context=np.full(4, 1000, np.int64), swap_in_tokens=8)
    assert (auto.step_time(swap) - auto.step_time(decode)) - (fp8.step_time(swap) - fp8.step_time(decode)) == \
        pytest.approx(83.886e-6, rel=1e-4)
    # the weights, FLOPs and (TP 2) all-reduces of 16-bit activations are as before
    a2, f2 = (RooflineCostModel(m, get_gpu("a100-40gb"), 2).constants() for m in (LLAMA, LLAMA_FP8))
    for i in (C.LINEAR_FLOPS_PER_TOKEN, C.LINEAR_WEIGHT_TIME_S, C.ALLREDUCE_S_PER_TOKEN, C.ATTENTION_FLOPS_COEF):
        assert a2[i] == f2[i]
    assert f2[C.KV_BYTES_PER_TOKEN] == 131_072


def test_calibrated_model_refuses_an_fp8_cache():
    with pytest.raises(ConfigError, match="an fp8 KV cache: use --cost-model roofline"):
        CalibratedCostModel(LLAMA_FP8, get_gpu("a100-80gb"))


def test_table_model_refuses_an_fp8_cache(tmp_path):
    # a profile's dtype is float16 or bfloat16: its attention rows read a 16-bit cache
    path = write_table_profile(tmp_path / "p.csv")
    opt = get_model("opt-13b")
    TableCostModel(path, opt, get_gpu("a100-80gb"))  # the same profile, a 16-bit cache: accepted
    with pytest.raises(ConfigError, match="measured on a 16-bit KV cache; --kv-cache-dtype fp8_e5m2 needs the "
                                          "roofline"):
        TableCostModel(path, with_kv_cache_dtype(opt, "fp8_e5m2"), get_gpu("a100-80gb"))


RUN = ["simulate", "--workload", "sharegpt", "--rate", "2", "--num-requests", "5", "--model", "llama-2-7b",
       "--gpu", "a100-40gb", "--kv-gib", "4", "--max-seq-len", "2048", "--no-progress"]


def test_cli_flag_lands_in_summary_json(tmp_path):
    assert main(RUN + ["--kv-cache-dtype", "fp8", "--out", str(tmp_path / "fp8")]) == 0
    s = json.loads((tmp_path / "fp8" / "summary.json").read_text())
    # 4 GiB = 4,294,967,296 B / 262,144 B = 16,384 slots (8,192 at 16 bits)
    assert (s["kv_cache_dtype"], s["kv_bytes_per_token"], s["kv_capacity_tokens"]) == ("fp8", 262_144, 16_384)
    assert main(RUN + ["--out", str(tmp_path / "auto")]) == 0
    s = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert (s["kv_cache_dtype"], s["kv_bytes_per_token"], s["kv_capacity_tokens"]) == ("auto", 524_288, 8_192)


def exit_code(args) -> int:
    """``pagesim``'s exit code: main's return, or argparse's usage error's SystemExit."""
    try:
        return main(args)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("extra, says", [
    (["--kv-cache-dtype", "fp16"], "argument --kv-cache-dtype: invalid choice: 'fp16'"),
    (["--kv-cache-dtype", "fp8", "--cost-model", "calibrated", "--gpu", "a100-80gb"],
     "has an fp8 KV cache: use --cost-model roofline"),
])
def test_cli_refuses_in_one_line(extra, says, capsys):
    assert exit_code(RUN + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
