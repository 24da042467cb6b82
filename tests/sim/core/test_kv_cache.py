"""The core's paged managers (sim/core/kv/kv_cache.py: vLLM's block manager, the token manager
as blocks of one token, vAttention's pages), worked by hand on tiny pools: where every slot
goes (the six categories) as requests are admitted, prefill, decode and leave; leftover slots
no block can use; vLLM's watermark at admission."""

from __future__ import annotations

import numpy as np

from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for, trace
from pagesim.sim.core.kv.prefix_cache import BLOCK_SHIFT

OK, LATER, NEVER = kv_cache.CAN_ALLOCATE, kv_cache.ALLOCATE_LATER, kv_cache.NEVER_FITS


def core_state(system, rows, slots, max_seq_len=16, **kw):
    """The core's state before the run: ``rows`` (arrival, prompt, output) over ``slots``."""
    return initial_state(cfg_for(system, slots=slots, max_seq_len=max_seq_len, **kw), trace(rows))


def categories(s, demand_waiting):
    out = np.zeros(state.MEMORY_CATEGORIES, np.int64)  # the six, speculative slack, in transfer
    kv_cache.memory_categories(s, demand_waiting, out)
    return out[:6].tolist()


def both(s, token_states, reservation, internal, free):
    """The six categories with nobody waiting (free slots idle) and with a request waiting for
    memory (free slots external fragmentation); a paged pool has no allocator slack."""
    assert categories(s, False) == [token_states, reservation, internal, 0, 0, free]
    assert categories(s, True) == [token_states, reservation, internal, 0, free, 0]


def admitted(s, i, computed=None):
    """Request ``i``'s prompt allocated; ``computed`` of its tokens (default all) prefilled."""
    prompt = int(s.prompt_tokens[i])
    assert kv_cache.can_allocate(s, i, prompt) == OK
    kv_cache.allocate(s, i, prompt, 0)
    kv_cache.compute_tokens(s, i, prompt if computed is None else computed, s.config[state.FAMILY_TRAITS])


def decoded(s, i):
    """One decode token of request ``i`` (as scheduler_vllm.decode: room, then the token)."""
    kv_cache.take_decode_slot(s, i)
    s.num_computed_tokens[i] += 1
    s.count[state.COMPUTED_SLOTS] += 1


def test_three_requests_in_blocks_of_4():
    """64 slots, blocks of 4, M 16. A (P 4, F 6), B (P 2, F 16), C (P 8, F 9).
    Allocated: A 1 block, B 1, C 2 (16 slots); nothing computed, every slot up to F is to come:
    reservation min(F, blocks x 4) = 4 + 4 + 8 = 16, 48 free.
    Prefilled: 4 + 2 + 8 = 14 token states, B's 2 slots to come.
    A decode step: A's 5th token takes a block (demand min(6 - 4, 4) = 2: 1 to come, 2 never
    filled); B's 3rd fits its block (1 to come); C's 9th takes a block (demand min(9 - 8, 4) =
    1: 3 never filled). 17 tokens, 2 reserved, 5 internal, 6 blocks used: 40 free.
    C leaves: its 3 blocks go back: A 5 + B 3 = 8 tokens, 2 reserved, A's 2 internal, 52 free."""
    s = core_state("vllm", [(0, 4, 2), (0, 2, 14), (0, 8, 1)], slots=64, block_size=4, watermark=0.0)
    assert s.config[state.NUM_BLOCKS] == 16 and s.config[state.LEFTOVER_SLOTS] == 0
    for i in range(3):
        admitted(s, i, computed=0)
    both(s, 0, 16, 0, 48)
    for i in range(3):
        kv_cache.compute_tokens(s, i, int(s.prompt_tokens[i]), s.config[state.FAMILY_TRAITS])
    both(s, 14, 2, 0, 48)
    for i in range(3):
        decoded(s, i)
    both(s, 17, 2, 5, 40)
    assert s.num_blocks[:3].tolist() == [2, 1, 3] and kv_cache.num_free_blocks(s) == 10
    kv_cache.free(s, 2)
    both(s, 8, 2, 2, 52)
    assert kv_cache.num_free_blocks(s) == 13


def test_leftover_slots_no_block_can_use_are_free():
    """70 slots in blocks of 16: 4 blocks (64 slots) and 6 left over, free from the start.
    A request of P 20, F 30 takes 2 blocks: 30 slots to come, 32 - 30 = 2 never filled; the
    2 free blocks and the 6 leftover slots, 38, are external fragmentation while one waits."""
    s = core_state("vllm", [(0, 20, 10)], slots=70, max_seq_len=32, block_size=16, watermark=0.0)
    assert s.config[state.NUM_BLOCKS] == 4 and s.config[state.LEFTOVER_SLOTS] == 6
    both(s, 0, 0, 0, 70)
    admitted(s, 0, computed=0)
    assert categories(s, True) == [0, 30, 2, 0, 38, 0]


def test_admission_leaves_the_watermark_free():
    """160 slots in blocks of 4: 40 blocks, watermark int(0.1 x 40) = 4. Nine requests of 15
    tokens (4 blocks each) hold 36: 4 free. A 1-token prompt (1 block) would leave 3 < 4: it
    waits. One leaves (8 free): a 15-token prompt leaves exactly 4, admitted; then 1 token
    waits again. A pool of 20 slots (5 blocks) with watermark 0.4 keeps int(2.0) = 2 blocks:
    15 tokens (4 blocks) > 5 - 2 never fit."""
    rows = [(0, 15, 1)] * 9 + [(0, 1, 1), (0, 15, 1), (0, 1, 1)]
    s = core_state("vllm", rows, slots=160, block_size=4, watermark=0.1)
    assert s.config[state.NUM_BLOCKS] == 40 and s.config[state.WATERMARK_BLOCKS] == 4
    for i in range(9):
        admitted(s, i)
    assert kv_cache.num_free_blocks(s) == 4
    assert kv_cache.can_allocate(s, 9, 1) == LATER
    kv_cache.free(s, 0)
    admitted(s, 10)
    assert kv_cache.num_free_blocks(s) == 4
    assert kv_cache.can_allocate(s, 11, 1) == LATER
    tiny = core_state("vllm", [(0, 15, 1)], slots=20, block_size=4, watermark=0.4)
    assert tiny.config[state.NUM_BLOCKS] == 5 and tiny.config[state.WATERMARK_BLOCKS] == 2
    assert kv_cache.can_allocate(tiny, 0, 15) == NEVER


def test_a_resumed_request_is_delayed_by_the_watermark_never_turned_away():
    """8 blocks of 2, watermark int(0.25 x 8) = 2. A new 13-token prompt needs 7 blocks,
    more than 8 - 2: it never fits. Back after a preemption (it has generated), the watermark
    is cut to what the pool leaves, min(2, 8 - 7) = 1: with 8 free it fits (8 - 7 >= 1); with
    another request holding 1 block, 7 - 7 = 0 < 1: it waits (sim/core/kv/kv_cache.py)."""
    s = core_state("vllm", [(0, 13, 1), (0, 1, 1)], slots=16, block_size=2, watermark=0.25)
    assert s.config[state.NUM_BLOCKS] == 8 and s.config[state.WATERMARK_BLOCKS] == 2
    assert kv_cache.can_allocate(s, 0, 13) == NEVER
    s.num_generated[0] = 1
    assert kv_cache.can_allocate(s, 0, 13) == OK
    admitted(s, 1)
    assert kv_cache.can_allocate(s, 0, 13) == LATER


def test_the_token_manager_is_blocks_of_one_token():
    """token: 32 slots are 32 blocks of 1. P 3, F 10: 3 blocks, then a decode token takes a 4th;
    no slot is reserved ahead or left unfilled: 4 token states, 28 free."""
    s = core_state("token", [(0, 3, 7)], slots=32, watermark=0.0)
    assert s.config[state.BLOCK_SIZE] == 1 and s.config[state.NUM_BLOCKS] == 32
    admitted(s, 0)
    decoded(s, 0)
    both(s, 4, 0, 0, 28)


def test_vattention_pages():
    """vAttention with 2 MiB pages: a page holds, per layer, 2 MiB / (K and V x 40 heads x 128
    dims x 2 B = 20,480 B) = 102.4 -> 102 tokens of OPT-13B. 1,000 slots: 9 pages (918), 82
    left over. P 150, F 160: 2 pages (204 slots): 150 computed, 10 to come, 44 never filled;
    1000 - 204 = 796 free."""
    s = core_state("vattention", [(0, 150, 10)], slots=1000, max_seq_len=300, vattention_page_kib=2048)
    assert s.config[state.BLOCK_SIZE] == 102
    assert s.config[state.NUM_BLOCKS] == 9 and s.config[state.LEFTOVER_SLOTS] == 82
    admitted(s, 0)
    both(s, 150, 10, 44, 796)


def test_vattention_page_tokens():
    """Tokens per page: the page over one layer's K and V of a token on one GPU, rounded down.
    OPT-13B: 20,480 B (40 heads x 128 x 2 x 2 B): 64 KiB -> 3.2 -> 3; 2 MiB -> 102; at
    tensor parallel 2 a GPU holds 20 heads, 10,240 B: 64 KiB -> 6. Llama-3-8B: 8 KV heads x 128
    x 2 x 2 B = 4,096 B: 64 KiB -> 16."""
    def page_tokens(model, kib, tp=1):
        cfg = SimConfig.for_system("vattention", model=model, gpu="a100-80gb", kv_gib=2.0, max_seq_len=256,
                                   vattention_page_kib=kib, tensor_parallel=tp)
        return int(initial_state(cfg, trace([(0, 4, 4)])).config[state.BLOCK_SIZE])

    assert page_tokens("opt-13b", 64) == 3
    assert page_tokens("opt-13b", 2048) == 102
    assert page_tokens("opt-13b", 64, tp=2) == 6
    assert page_tokens("llama-3-8b", 64) == 16


def test_a_tokens_block_is_found_by_a_shift_where_the_block_size_is_a_power_of_two():
    """``prefix_cache.block_of``: position // block size. vllm's blocks of 16 are 2**4 (shift 4):
    tokens 0-15 in block 0, 16 in block 1, 47 in 2; 33 tokens take 3 blocks, 32 take 2. The token
    manager's blocks of 1 are 2**0: token 5 in block 5. vAttention's 102-token pages are no power of
    two (-1: divided): token 101 in page 0, 102 and 203 in page 1, 204 in page 2; 205 tokens take 3."""
    from pagesim.sim.core.compile.jit import interpreted
    from pagesim.sim.core.kv.prefix_cache import block_of

    block_of, blocks_for = interpreted(block_of), interpreted(kv_cache.blocks_for)
    s = core_state("vllm", [(0, 8, 8)], slots=512)
    assert s.config[state.BLOCK_SIZE] == 16 and s.config[BLOCK_SHIFT] == 4
    assert [block_of(s, p) for p in (0, 15, 16, 47)] == [0, 0, 1, 2]
    assert blocks_for(s, 33) == 3 and blocks_for(s, 32) == 2 and blocks_for(s, 0) == 0
    s = core_state("token", [(0, 3, 7)], slots=32, watermark=0.0)
    assert s.config[BLOCK_SHIFT] == 0 and block_of(s, 5) == 5 and blocks_for(s, 5) == 5
    s = core_state("vattention", [(0, 150, 10)], slots=1000, max_seq_len=300, vattention_page_kib=2048)
    assert s.config[state.BLOCK_SIZE] == 102 and s.config[BLOCK_SHIFT] == -1
    assert [block_of(s, p) for p in (101, 102, 203, 204)] == [0, 1, 1, 2] and blocks_for(s, 205) == 3
