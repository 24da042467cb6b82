"""The KV cache size vLLM 0.33.0 logs at start for a hybrid model ("GPU KV cache size: N
tokens"): ``sim.specs.kv_groups.vllm_kv_cache_size``, worked by hand, and where the summary and
the printed table show it beside the pool's slots (``kv_capacity_tokens``)."""

from __future__ import annotations

import json

import pytest

from pagesim.sim.cli import main
from pagesim.sim.specs.kv_groups import KVCacheGroups, vllm_kv_cache_size
from pagesim.sim.terminal import WIDTH

GEMMA2 = KVCacheGroups(1, 1, 23, 4096)  # Gemma-2-27B: 1 full + 1 sliding(4096) x 23 layers


def test_gemma2_27b_by_hand():
    """6,869 blocks of 16, max_model_len 8,192, 16,384 tokens in flight (2 x 8,192 under async
    scheduling): the full group takes 8192/16 = 512 blocks, the sliding one its cap,
    cdiv(min(4095 + 16384, 8192), 16) + 1 = 513: 1,025 a request, 6869/1025 = 6.7015 requests,
    int(6.7015 x 8192) = 54,898 tokens, where the pool has 6,869 x 16 = 109,904 slots."""
    tokens, concurrency = vllm_kv_cache_size(GEMMA2, 6869, 16, 16384, 8192)
    assert concurrency == pytest.approx(6869 / 1025, rel=1e-15)
    assert tokens == 54_898
    # one batch of 2,048 in flight: the window's cap is cdiv(4095 + 2048, 16) + 1 = 385 blocks,
    # 512 + 385 = 897 a request, int(6869 / 897 x 8192) = 62,732
    assert vllm_kv_cache_size(GEMMA2, 6869, 16, 2048, 8192)[0] == 62_732


def test_gemma3_like_and_state_groups_by_hand():
    """Gemma-3-27B's 1 full + 6 sliding(1024) groups of 10 layers, 15,505 blocks of 16, 8,192
    tokens, 16,384 in flight: each sliding cap min(1023 + 16384, 8192) = 8192 tokens, 513 blocks;
    512 + 6 x 513 = 3,590 a request; int(15505 / 3590 x 8192) = 35,380 (the pool: 248,080 slots).
    Jamba-1.5-Mini's 1 full + 7 state groups of 4, blocks of 80, 262,144 tokens: cdiv(262144, 80)
    = 3,277 blocks + 7 states = 3,284 a request; with 2 drafts and prefix caching (align mode) a
    state takes 1 + 1 + 2 blocks: 3,277 + 28 = 3,305."""
    gemma3 = KVCacheGroups(1, 6, 10, 1024)
    assert vllm_kv_cache_size(gemma3, 15505, 16, 16384, 8192) == (35_380, pytest.approx(15505 / 3590))
    jamba = KVCacheGroups(1, 0, 4, 0, state_groups=7, block_size=80)
    assert vllm_kv_cache_size(jamba, 10_000, 80, 16384, 262_144)[1] == pytest.approx(10_000 / 3284)
    assert vllm_kv_cache_size(jamba, 10_000, 80, 16384, 262_144, 2, True)[1] == pytest.approx(10_000 / 3305)


def test_a_gemma2_27b_run_reports_it(tmp_path, capsys):
    """Gemma-2-27B on an H100 under vllm-v1 (8,192 tokens, a budget of 8,192 twice in flight):
    the summary's figure is the pool's blocks (its slots // 16) over 1,025 a request, x 8,192
    (docs/guide/models-gpus.md quotes the three figures);
    the printed KV capacity row leads with it, the slots beside it, within 100 columns."""
    argv = ["simulate", "--model", "gemma-2-27b", "--gpu", "h100", "--system", "vllm-v1", "--workload", "sharegpt",
            "--rate", "2", "--num-requests", "4", "--no-progress", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    blocks = s["kv_capacity_tokens"] // 16
    assert (s["kv_capacity_tokens"], blocks, s["vllm_kv_cache_size_tokens"]) == (109_913, 6_869, 54_898)  # (docs)
    assert s["vllm_max_concurrency"] == pytest.approx(blocks / 1025, rel=1e-12)
    assert s["vllm_kv_cache_size_tokens"] == int(blocks / 1025 * 8192)
    row = " ".join(out[out.index("KV capacity"):].split("\n")[:2])
    assert f"KV capacity {s['vllm_kv_cache_size_tokens']:,} tokens as vLLM logs it" in " ".join(row.split())
    assert f"{s['kv_capacity_tokens']:,} slots, each a token of one group's 23 layers, shared by 2 groups" in \
        " ".join(row.split())
    assert all(len(line) <= WIDTH for line in out.splitlines())


def test_one_group_keeps_its_capacity_line(capsys):
    """No groups (a model every layer of which is full attention): no vLLM-style figure, the
    capacity printed as before."""
    assert main(["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "5", "--no-progress",
                 "--json"]) == 0
    assert "vllm_kv_cache_size_tokens" not in json.loads(capsys.readouterr().out)
