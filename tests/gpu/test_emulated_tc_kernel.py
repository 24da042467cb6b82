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
from pagesim.gpu.kernels_src import CTYPES, HEAD_DIMS, TC_ROWS, TC_STAGES
from pagesim.gpu.testing import make_case
from tests.gpu.test_emulated_kernels import check, emu_attention

# (num_heads, num_kv_heads) per head dim: groups 2, 6, 4, 16 (the fragment full) and 20 (two chunks
# per KV head over two KV heads, the second chunk of 4 heads: the chunk -> KV head -> first head map)
GROUPS_FOR = {64: (8, 4), 80: (12, 2), 96: (16, 4), 128: (16, 1), 256: (40, 2)}


@pytest.mark.parametrize("stages", TC_STAGES)
@pytest.mark.parametrize("dtype", list(CTYPES))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_tc_instantiation(emu, dtype, head_dim, stages):
    """Two partitions of 150 tokens and a reduce (each warp's tiles 2, 3, 2, 2 of 16 tokens, the
    last 6 tokens long: more tiles than stages, the pipeline wraps), an empty sequence, and a row of
    45 tokens (warp 3 with no tile)."""
    heads, kv_heads = GROUPS_FOR[head_dim]
    case = make_case(np.random.default_rng(head_dim), num_seqs=3, num_heads=heads, num_kv_heads=kv_heads,
                     head_dim=head_dim, block_size=16, lens=[299, 0, 45], dtype=dtype)
    cfg = check(emu, case, kernel="tensor", num_partitions=2, stages=stages)
    chunks = -(-heads // kv_heads // 16)
    assert (cfg.kernel, cfg.heads, cfg.max_parts, cfg.chunks, cfg.stages) == ("tensor", TC_ROWS, 2, chunks, stages)


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
    # 64 x 8,192 tokens, 32 / 8 heads (grid x 8), an H200's 132 SMs x 3 blocks = 396 slots; a block's
    # walk is its tokens + 64. One partition a row: 512 blocks = 1.29 waves of work, 2 walks of 8,256
    # = 16,512; 3 (2,752 tokens, the row cut in 3 and rounded up to tiles): 1,536 blocks of 2,816,
    # work 8 x (524,288 + 1,536 / 8 x 64) / (396 x 2,816) = 3.85 waves -> 4 walks = 11,264, the least
    # (4 partitions of 2,048: 2,048 blocks, 5.2 -> 6 x 2,112 = 12,672; 8 of 1,024: 10.3 -> 11 x 1,088
    # = 11,968)
    assert pa.tc_partition_size([8192] * 64, 8, 3, 132) == 2752
    # on 264 slots (2 blocks an SM) the same 512 blocks are 1.94 waves: 2 x 8,256 = 16,512, and 3
    # partitions give 5.8 -> 6 x 2,816 = 16,896: one partition a row, no reduce
    assert pa.tc_partition_size([8192] * 64, 8, 2, 132) == 8192
    # 4 x 2,048 on 264 slots: 8 partitions of 256: 256 blocks, under one wave: one walk of 320
    assert pa.tc_partition_size([2048] * 4, 8, 2, 132) == 256
    # the real lengths, not the longest times the batch: 8,000 + 3 x 100 tokens in 256s: 32 + 3
    # partitions, 280 blocks of work 8 x (8,300 + 35 x 64) / (264 x 320) = 0.998 waves: one walk of
    # 320 (at 320 tokens: 25 + 3 partitions, one walk of 384)
    assert pa.tc_partition_size([8000, 100, 100, 100], 8, 2, 132) == 256
    # 2 x 4,096, 1 block an SM: 256s give 256 blocks, 1.94 waves (2 x 320 = 640); 512s 128 blocks,
    # 0.985 waves: one walk of 576, the least
    assert pa.tc_partition_size([4096] * 2, 8, 1, 132) == 512
    # a row at most the 256 minimum (rounded up to a tile): one partition; a 10-token row: one tile;
    # no rows at all: one tile
    assert pa.tc_partition_size([300], 8, 2, 132) == 256  # 256 + 44: one walk of 320, not 384
    assert pa.tc_partition_size([250], 8, 2, 132) == 256
    assert pa.tc_partition_size([10], 1, 2, 132) == 64
    assert pa.tc_partition_size([], 8, 2, 132) == 64


def test_choose_kernel_rule():
    optin, h100 = 227 * 1024, 90
    assert pa.choose_kernel(1, 128, optin, h100) == "simple"  # MHA: 15 of 16 rows would be padding
    assert pa.choose_kernel(2, 128, optin, h100) == "tensor"
    assert pa.choose_kernel(8, 128, optin, 75) == "simple"  # a T4: no bf16 m16n8k16, no cp.async
    # head_dim 256 needs at least 2 * (16 * 264 + 4 * 2 * 2 * 16 * 264) = 143,616 B (2 stages): over an
    # sm_86's 99 KiB
    assert pa.tc_smem_bytes(256, 2) == 143616
    assert pa.choose_kernel(8, 256, 99 * 1024, 86) == "simple"
    # head_dim 128, 2 stages: 2 * (16 * 136 + 4 * 2 * 2 * 16 * 136) = 73,984 B: fits; 3 stages 108,800
    assert (pa.tc_smem_bytes(128, 2), pa.tc_smem_bytes(128, 3)) == (73984, 108800)
    assert pa.choose_kernel(8, 128, 99 * 1024, 86) == "tensor"
    assert pa.choose_kernel(1, 128, optin, h100, "tensor") == "tensor"  # forced, even for MHA
    assert pa.choose_kernel(8, 128, optin, h100, "simple") == "simple"
    with pytest.raises(ValueError, match="compute capability"):
        pa.choose_kernel(8, 128, optin, 75, "tensor")
    with pytest.raises(ValueError, match="kernel must be one of"):
        pa.choose_kernel(8, 128, optin, h100, "tensor-core")


def test_tc_stages_rule():
    """The most warp tiles in flight an SM, blocks x (stages - 1); the fewer stages on a tie."""
    # an H200 at head_dim 128: 228 KiB // (73,984 + 1,024) = 3 blocks, // (108,800 + 1,024) = 2
    assert pa.tc_choose_stages({2: 3, 3: 2}) == 3  # 3 against 4
    assert pa.tc_choose_stages({2: 2, 3: 1}) == 2  # an A100: 2 and 2, a tie
    assert pa.tc_choose_stages({2: 1}) == 2  # an sm_89: 3 stages do not fit
    assert pa.tc_choose_stages({2: 5, 3: 3}) == 3  # head_dim 64: 5 against 6
    with pytest.raises(ValueError, match="no instantiation"):
        pa.tc_choose_stages({})


def test_kernel_environment_variable(monkeypatch):
    monkeypatch.delenv(pa.KERNEL_ENV, raising=False)
    assert pa.default_kernel() == "auto"
    monkeypatch.setenv(pa.KERNEL_ENV, "simple")
    assert pa.default_kernel() == "simple"
    monkeypatch.setenv(pa.KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match=pa.KERNEL_ENV):
        pa.default_kernel()


def on_device(cp, seed, lens):
    """A case of 8 query heads over 2 KV heads (head_dim 64, blocks of 16) with ``lens``: the plan's
    arguments as (fake) device arrays, and the reference output."""
    case = make_case(np.random.default_rng(seed), num_seqs=len(lens), num_heads=8, num_kv_heads=2, head_dim=64,
                     block_size=16, lens=lens)
    args = (cp.asarray(case.query), cp.asarray(case.key_cache), cp.asarray(case.value_cache),
            cp.asarray(case.block_tables), cp.asarray(case.context_lens), 16, case.max_context_len)
    want = ref.paged_attention_ref(case.query, case.key_cache, case.value_cache, case.block_tables,
                                   case.context_lens, 16, case.scale)
    return case, args, want


def test_plan_forces_either_kernel(cp, monkeypatch):
    """The plan: auto -> tensor for GQA, the environment variable or kernel= force the simple one;
    the tensor plan sizes its partitions from the (fake) occupancy query and the real lengths."""
    _, args, want = on_device(cp, 5, [700, 3])
    monkeypatch.delenv(pa.KERNEL_ENV, raising=False)
    plan = pa.prepare(*args)
    # fake occupancy at head_dim 64: 228 KiB // (39,168 + 1,024) = 5 blocks an SM with 2 stages,
    # // (57,600 + 1,024) = 3 with 3: 3 stages (6 warp tiles in flight against 5); 396 slots, grid x 2:
    # the 700-token row in 3 partitions of 256 (one wave: 8 blocks), not 2 of 384 (one longer walk)
    got = (plan.kernel_kind, plan.stages, plan.blocks_per_sm, plan.partition_size, plan.max_parts)
    assert got == ("tensor", 3, 3, 256, 3)
    ref.assert_attention_close(np.asarray(plan.run()).astype(np.float32), want, "float16")
    monkeypatch.setenv(pa.KERNEL_ENV, "simple")
    assert pa.prepare(*args).kernel_kind == "simple"
    assert pa.prepare(*args, kernel="tensor").kernel_kind == "tensor"  # an explicit argument wins


def test_plan_takes_the_stages_it_is_given(cp):
    """``stages=``: the sweep times the count the rule passed over (3 here, by the fake occupancy:
    test_plan_forces_either_kernel) beside it; a count with no instantiation, or given to the simple
    kernel, is an error."""
    _, args, want = on_device(cp, 7, [300, 20])
    plan = pa.prepare(*args, kernel="tensor", stages=2)
    assert (plan.stages, plan.blocks_per_sm) == (2, 5)  # 228 KiB // (39,168 + 1,024)
    ref.assert_attention_close(np.asarray(plan.run()).astype(np.float32), want, "float16")
    with pytest.raises(ValueError, match="stages=4"):
        pa.prepare(*args, kernel="tensor", stages=4)
    with pytest.raises(ValueError, match="not the simple one's"):
        pa.prepare(*args, kernel="simple", stages=2)


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

QROWS = "ldmatrix_x4(a, q_s + ((lm_mat & 1) * 8 + lm_row)"
WAIT = "        cp_async_wait<STAGES - 2>();"
AHEAD = "        pending = entry_of(it + STAGES);"
TRANS = "            ldmatrix_x4_trans(b, vs"
QCOLUMN = "kk * 16 + (lm_mat >> 1) * 8);"


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
    (QROWS, QROWS.replace("(lm_mat & 1)", "(lm_mat >> 1)")),  # Q's matrices 1 and 2 swapped: a[1] <-> a[2]
    (WAIT, WAIT.replace("STAGES - 2", "STAGES - 1")),  # one group short: tile it has not landed
    (AHEAD, AHEAD.replace("STAGES)", "STAGES - 1)")),  # the entry of the tile before the one it is for
    (TRANS, TRANS.replace("_trans", "")),  # V's B fragment untransposed
], ids=["fragment-rows", "wait-one-group-short", "table-entry-of-another-tile", "v-untransposed"])
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


def test_a_misaligned_row_stops_the_emulation(sound_tc_case, tmp_path):
    """ldmatrix and cp.async fault on an address that is not 16-byte aligned: the emulation stops
    there, naming it (tests/gpu/emu/emu.h), where a plain read would pass on the CPU. Q's rows read
    4 elements (8 bytes) on."""
    import shutil

    from pagesim.gpu.kernels_src import KERNEL_DIR
    src = tmp_path / "mutated"
    shutil.copytree(KERNEL_DIR, src)
    text = (src / "paged_attention_tc.cu").read_text()
    assert text.count(QCOLUMN) == 1
    (src / "paged_attention_tc.cu").write_text(text.replace(QCOLUMN, QCOLUMN.replace("* 8)", "* 8 + 4)")))
    r = run_tc_case(src, tmp_path)
    assert r.returncode not in (0, 3) and "an ldmatrix row at" in r.stderr and "not 16-byte aligned" in r.stderr


def test_plan_sizes_from_the_host_lengths_it_is_given(cp):
    """Device lengths with check=False: without a host copy every row counts as max_context_len, 2 x
    40,000 tokens on 396 slots (132 SMs x 3, the fake occupancy at 3 stages) and grid x 2: in 448s,
    180 blocks, 2 x (80,000 + 180 x 64) / (396 x 512) = 0.90 waves, one walk of 512 (in 384s 1.05
    waves: two of 448); with ``host_context_lens`` the real 40,003 tokens in 256s, 158 blocks, 0.79
    waves of 320."""
    case, args, _ = on_device(cp, 6, [40000, 3])
    assert pa.prepare(*args, check=False, kernel="tensor").partition_size == 448
    assert pa.prepare(*args, check=False, kernel="tensor",
                      host_context_lens=case.context_lens).partition_size == 256
    assert pa.prepare(*args, kernel="tensor").partition_size == 256  # check=True copies them back
