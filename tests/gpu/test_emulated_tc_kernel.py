"""The tensor-core GQA kernel (gpu/kernels/paged_attention_tc.cu) run on the CPU through the
emulation (tests/gpu/emu/emu.h: mma.sync as an exchange of the 32 lanes' fragment registers laid
out as the PTX ISA lays them out, cp.async deferred to the wait_group that covers it) against the
numpy reference, with the launch computed by ``gpu.paged_attention.launch_config``; its split-K
sizing and kernel choice worked by hand; injected bugs each seen to fail.
Skipped when g++ (C++20) or the CUDA headers are missing."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.gpu import paged_attention as pa
from pagesim.gpu import reference as ref
from pagesim.gpu.kernels_src import CTYPES, HEAD_DIMS, TC_ROWS
from pagesim.gpu.testing import make_case
from tests.gpu.test_emulated_kernels import check, emu_attention

# (num_heads, num_kv_heads) per head dim: groups 2, 6, 4, 16 (the fragment full) and 20 (two chunks
# per KV head over two KV heads, the second chunk of 4 heads: the chunk -> KV head -> first head map)
GROUPS_FOR = {64: (8, 4), 80: (12, 2), 96: (16, 4), 128: (16, 1), 256: (40, 2)}


@pytest.mark.parametrize("dtype", list(CTYPES))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_tc_instantiation(emu, dtype, head_dim):
    """Two partitions of 150 tokens (3 tiles, the last part full) and a reduce, an empty sequence."""
    heads, kv_heads = GROUPS_FOR[head_dim]
    case = make_case(np.random.default_rng(head_dim), num_seqs=3, num_heads=heads, num_kv_heads=kv_heads,
                     head_dim=head_dim, block_size=16, lens=[299, 0, 45], dtype=dtype)
    cfg = check(emu, case, kernel="tensor", num_partitions=2)
    chunks = -(-heads // kv_heads // 16)
    assert (cfg.kernel, cfg.heads, cfg.max_parts, cfg.chunks) == ("tensor", TC_ROWS, 2, chunks)


@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128, 5])
def test_tc_block_sizes_odd_lengths_and_split_k(emu, block_size):
    """Block sizes 8-128 and one not a power of two (a division, not a shift); lengths that end mid
    block and mid tile. 16 SMs x 1 block: a wave takes 8 partitions per KV head, so 911 tokens are
    cut at 256 (ceil(911 / 8) = 114, up to the 256 minimum): 3 partitions for the 517-token row."""
    case = make_case(np.random.default_rng(block_size), num_seqs=4, num_heads=8, num_kv_heads=2, head_dim=64,
                     block_size=block_size, lens=[517, 1, 130, 263])
    cfg = check(emu, case, kernel="tensor", sm_count=16, blocks_per_sm=1)
    assert (cfg.partition_size, cfg.max_parts) == (256, 3)


@pytest.mark.parametrize("group,dtype", [(2, "float16"), (4, "bfloat16"), (6, "float16"), (8, "bfloat16"),
                                         (16, "float16"), (32, "bfloat16")])
def test_tc_group_sizes(emu, group, dtype):
    """Groups 2 to 16 padded to the 16-row fragment, 32 in two full chunks; two KV heads."""
    case = make_case(np.random.default_rng(group), num_seqs=2, num_heads=2 * group, num_kv_heads=2, head_dim=128,
                     block_size=16, lens=[201, 77], dtype=dtype)
    check(emu, case, kernel="tensor")


def test_tc_contiguous_variant(emu):
    case = make_case(np.random.default_rng(9), num_seqs=3, num_heads=8, num_kv_heads=2, head_dim=64,
                     block_size=16, lens=[140, 1, 77])
    k = np.zeros((3, 150, 2, 64), np.float16)
    v = np.zeros_like(k)
    for s in range(3):
        n = int(case.context_lens[s])
        k[s, :n] = ref.gather_kv(case.key_cache, case.block_tables[s], n, 16)
        v[s, :n] = ref.gather_kv(case.value_cache, case.block_tables[s], n, 16)
    got, _ = emu_attention(emu, case, contiguous=(k, v), kernel="tensor", num_partitions=2)
    want = ref.contiguous_attention_ref(case.query, k, v, case.context_lens, case.scale)
    ref.assert_attention_close(got, want, "float16")


def test_tc_partition_size_worked_by_hand():
    # H100: 132 SMs x 2 blocks = 264 slots; 32/8 heads: grid x = 8 -> 33 partitions per wave.
    # 4 x 2048 tokens: ceil(8192 / 33) = 249 -> 256 (whole tiles) -> 256: 8 partitions a row,
    # 8 x 4 x 8 = 256 blocks <= 264, one wave.
    assert pa.tc_partition_size([2048] * 4, 8, 2, 132) == 256
    # 64 x 2048: ceil(131072 / 33) = 3972 -> 4032, capped at the longest row: one partition, no reduce
    assert pa.tc_partition_size([2048] * 64, 8, 2, 132) == 2048
    # the real lengths, not the longest times the batch: 8300 tokens / 33 = 252 -> 256 (32 partitions
    # for the long row, 1 each for the short ones); sized from 4 x 8000 it would be 970 -> 1024
    assert pa.tc_partition_size([8000, 100, 100, 100], 8, 2, 132) == 256
    # occupancy: 1 block per SM -> 16 a wave: 8192 / 16 = 512; 3 -> 49: 168 -> 192 -> the 256 minimum
    assert pa.tc_partition_size([4096] * 2, 8, 1, 132) == 512
    assert pa.tc_partition_size([4096] * 2, 8, 3, 132) == 256
    # a 10-token row: one tile (64), not the 256 minimum past the row's end; no rows at all: one tile
    assert pa.tc_partition_size([10], 1, 2, 132) == 64
    assert pa.tc_partition_size([], 8, 2, 132) == 64


def test_choose_kernel_rule():
    optin, h100 = 227 * 1024, 90
    assert pa.choose_kernel(1, 128, optin, h100) == "simple"  # MHA: 15 of 16 rows would be padding
    assert pa.choose_kernel(2, 128, optin, h100) == "tensor"
    assert pa.choose_kernel(8, 128, optin, 75) == "simple"  # a T4: no bf16 m16n8k16, no cp.async
    # head_dim 256 needs 2 * (2 * 2 * 64 * 264 + 16 * 264) + 4 * 2 * 65 = 144,136 B: over an sm_86's 99 KiB
    assert pa.tc_smem_bytes(256) == 144136
    assert pa.choose_kernel(8, 256, 99 * 1024, 86) == "simple"
    # 2 stages from head_dim 128: 2 * (2 * 2 * 64 * 136 + 16 * 136) + 4 * 2 * 65 = 74,504 B: fits
    assert pa.tc_smem_bytes(128) == 74504
    assert pa.choose_kernel(8, 128, 99 * 1024, 86) == "tensor"
    assert pa.choose_kernel(1, 128, optin, h100, "tensor") == "tensor"  # forced, even for MHA
    assert pa.choose_kernel(8, 128, optin, h100, "simple") == "simple"
    with pytest.raises(ValueError, match="compute capability"):
        pa.choose_kernel(8, 128, optin, 75, "tensor")
    with pytest.raises(ValueError, match="kernel must be one of"):
        pa.choose_kernel(8, 128, optin, h100, "tensor-core")


def test_kernel_environment_variable(monkeypatch):
    monkeypatch.delenv(pa.KERNEL_ENV, raising=False)
    assert pa.default_kernel() == "auto"
    monkeypatch.setenv(pa.KERNEL_ENV, "simple")
    assert pa.default_kernel() == "simple"
    monkeypatch.setenv(pa.KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match=pa.KERNEL_ENV):
        pa.default_kernel()


def test_plan_forces_either_kernel(cp, monkeypatch):
    """The plan: auto -> tensor for GQA, the environment variable or kernel= force the simple one;
    the tensor plan sizes its partitions from the (fake) occupancy query and the real lengths."""
    case = make_case(np.random.default_rng(5), num_seqs=2, num_heads=8, num_kv_heads=2, head_dim=64,
                     block_size=16, lens=[700, 3])
    args = (cp.asarray(case.query), cp.asarray(case.key_cache), cp.asarray(case.value_cache),
            cp.asarray(case.block_tables), cp.asarray(case.context_lens), 16, case.max_context_len)
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, 16, case.scale)
    monkeypatch.delenv(pa.KERNEL_ENV, raising=False)
    plan = pa.prepare(*args)
    # fake occupancy: 228 KiB // (58,380 + 1,024) = 3 blocks an SM; 132 x 3 / 2 = 198 a wave;
    # ceil(703 / 198) = 4 -> 64 -> 256: 3 partitions for the 700-token row
    got = (plan.kernel_kind, plan.blocks_per_sm, plan.partition_size, plan.max_parts)
    assert got == ("tensor", 3, 256, 3)
    ref.assert_attention_close(np.asarray(plan.run()).astype(np.float32), want, "float16")
    monkeypatch.setenv(pa.KERNEL_ENV, "simple")
    assert pa.prepare(*args).kernel_kind == "simple"
    assert pa.prepare(*args, kernel="tensor").kernel_kind == "tensor"  # an explicit argument wins


RUN_TC_CASE = """
import sys
import numpy as np
from pathlib import Path
from pagesim.gpu.testing import make_case
from tests.gpu.emu.build import build
from tests.gpu.test_emulated_kernels import check
# the library in argv[1] where there is one (the sound case: the session's build of the real sources)
lib, why = build(Path(sys.argv[1]), Path(sys.argv[1]) / "kernels", ("PAGESIM_EMU_FP16_64_ONLY",), reuse=True)
case = make_case(np.random.default_rng(81), num_seqs=3, num_heads=24, num_kv_heads=2, head_dim=64,
                 block_size=16, lens=[517, 1, 130])
try:
    # group 12: fragment rows 8-11 are heads; 3 partitions of 4 tiles for the 517-token row
    check(lib, case, kernel="tensor", sm_count=16, blocks_per_sm=1)
except AssertionError:
    sys.exit(3)  # the check failed (any other failure, a build that failed among them, exits 1)
"""

A1 = "            a[1] = ld_pair(qa + 8 * G::PITCH);\n"
WAIT = "        cp_async_wait<G::STAGES - 2>();"
SLOT = "table_s[(x % G::STAGES) * G::TABLE + i] = "


def run_tc_case(kernels, work, built=None):
    """RUN_TC_CASE's process over a copy of ``kernels`` in ``work``: the tree under test first on
    its path, then whatever made `pagesim` importable here. ``built``: a library of ``kernels``
    already built, which the process loads instead of building its own."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    shutil.copytree(kernels, work / "kernels")
    if built is not None:
        shutil.copy2(built, work / "emu.so")
    return subprocess.run([sys.executable, "-c", RUN_TC_CASE, str(work)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def sound_tc_case(emu, tmp_path_factory):
    """RUN_TC_CASE passes on the real sources (once for the injected bugs below): their emulation
    as the session built it (``emu``: every instantiation, the case's fp16 head_dim 64 among them)."""
    from pagesim.gpu.kernels_src import KERNEL_DIR
    sound = run_tc_case(KERNEL_DIR, tmp_path_factory.mktemp("sound"), built=emu._name)
    assert sound.returncode == 0, sound.stderr[-2000:]


@pytest.mark.parametrize("bug,fix", [
    (A1, A1.replace("qa + 8 * G::PITCH", "qa")),  # A fragment: row gid where a[1] is row gid + 8
    (WAIT, WAIT.replace("STAGES - 2", "STAGES - 1")),  # one group short: tile it has not landed
    (SLOT, SLOT.replace("(x % G::STAGES)", "((x + 1) % G::STAGES)")),  # a tile's entries in another's slot
], ids=["fragment-row", "wait-one-group-short", "table-stage-slot"])
def test_injected_tc_bug_is_caught(sound_tc_case, tmp_path, bug, fix):
    import shutil

    from pagesim.gpu.kernels_src import KERNEL_DIR
    src = tmp_path / "mutated"
    shutil.copytree(KERNEL_DIR, src)
    text = (src / "paged_attention_tc.cu").read_text()
    assert text.count(bug) == 1
    (src / "paged_attention_tc.cu").write_text(text.replace(bug, fix))
    r = run_tc_case(src, tmp_path)  # the mutated sources' own build
    assert r.returncode == 3, r.stderr[-2000:]


def test_plan_sizes_from_the_host_lengths_it_is_given(cp):
    """Device lengths with check=False: without a host copy every row counts as max_context_len
    (80,000 tokens / 198 a wave = 405 -> 448); with ``host_context_lens`` the real 40,003 tokens
    (203 -> 256). 198 = 132 SMs x 3 (the fake occupancy) / 2 KV heads."""
    case = make_case(np.random.default_rng(6), num_seqs=2, num_heads=8, num_kv_heads=2, head_dim=64,
                     block_size=16, lens=[40000, 3])
    args = (cp.asarray(case.query), cp.asarray(case.key_cache), cp.asarray(case.value_cache),
            cp.asarray(case.block_tables), cp.asarray(case.context_lens), 16, case.max_context_len)
    assert pa.prepare(*args, check=False, kernel="tensor").partition_size == 448
    assert pa.prepare(*args, check=False, kernel="tensor",
                      host_context_lens=case.context_lens).partition_size == 256
    assert pa.prepare(*args, kernel="tensor").partition_size == 256  # check=True copies them back
