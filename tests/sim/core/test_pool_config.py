"""A system's settings as the core's memory configuration (``sim.run.initial_state``'s
``config``), and the bad ones refused before a run with a ConfigError naming the parameter."""

from __future__ import annotations

import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for, trace
from pagesim.sim.core.kv.extent import RESERVATION_KIND
from pagesim.sim.core.kv.placement import PLACEMENT_KIND
from pagesim.sim.core.sched.scheduler_vllm import FORKS_SHARE_BLOCKS
from pagesim.sim.core.sched.static import STATIC_BATCH_LIMIT

ONE_REQUEST = [(0, 4, 4)]


def config(system="vllm", **kw):
    return initial_state(cfg_for(system, **kw), trace(ONE_REQUEST)).config


@pytest.mark.parametrize("system,manager,scheduler,reservation,block_size", [
    ("static", state.CONTIGUOUS, state.STATIC, None, None),
    ("orca-max", state.CONTIGUOUS, state.CONTINUOUS_CONTIGUOUS, state.RESERVE_MAX, None),
    ("orca-pow2", state.CONTIGUOUS, state.CONTINUOUS_CONTIGUOUS, state.RESERVE_POW2, None),
    ("orca-oracle", state.CONTIGUOUS, state.CONTINUOUS_CONTIGUOUS, state.RESERVE_ORACLE, None),
    ("vllm", state.PAGED, state.CONTINUOUS, None, 16),
    ("token", state.PAGED, state.CONTINUOUS, None, 1),  # the token manager: blocks of one token
])
def test_presets(system, manager, scheduler, reservation, block_size):
    """3,000 slots: a contiguous pool is all of them; a paged pool is 3000 // 16 = 187 blocks
    of 16 and 8 slots left over, or 3,000 blocks of 1."""
    c = config(system, slots=3000)
    assert c[state.MANAGER_KIND] == manager and c[state.SCHEDULER_KIND] == scheduler
    assert c[state.MAX_SEQ_LEN] == 256
    if manager == state.CONTIGUOUS:
        assert c[state.CAPACITY] == 3000
    if reservation is not None:
        assert c[RESERVATION_KIND] == reservation and c[PLACEMENT_KIND] == state.BUDDY
    if block_size is not None:
        assert c[state.BLOCK_SIZE] == block_size
        assert (c[state.NUM_BLOCKS], c[state.LEFTOVER_SLOTS]) == divmod(3000, block_size)
        assert c[FORKS_SHARE_BLOCKS] == 1


def test_settings_are_read():
    c = config("orca-pow2", placement="best-fit", max_seq_len=128)
    assert c[RESERVATION_KIND] == state.RESERVE_POW2 and c[PLACEMENT_KIND] == state.BEST_FIT
    assert c[state.MAX_SEQ_LEN] == 128
    c = config("vllm", block_size=32, watermark=0.0, prefix_caching=True)
    assert c[state.BLOCK_SIZE] == 32 and c[state.WATERMARK_BLOCKS] == 0 and c[state.PREFIX_CACHING] == 1
    # vAttention's pages are private: a fork would copy them (test_contiguous.py rejects n > 1)
    c = config("vattention", vattention_page_kib=2048)
    assert c[state.BLOCK_SIZE] == 102 and c[FORKS_SHARE_BLOCKS] == 0
    # 3,000 slots hold int(3000 / 256) = 11 static slots; 3 asked for
    c = config("static", static_batch_size=3)
    assert c[STATIC_BATCH_LIMIT] == 3


def refused(match, system="vllm", **kw):
    """``kw`` on ``system`` is refused with a ConfigError matching ``match``, when the
    configuration is made or, at the latest, before the run starts."""
    with pytest.raises(ConfigError, match=match):
        initial_state(cfg_for(system, **kw), trace(ONE_REQUEST))


@pytest.mark.parametrize("bs", [0, -1, 257])
def test_bad_block_size(bs):
    refused("block_size", block_size=bs)


def test_bad_settings_name_their_parameter():
    refused("reservation", "orca-max", reservation="greedy")
    refused("placement", "orca-max", placement="worst-fit")
    refused("watermark", watermark=1.5)
    refused("vattention_page_kib", "vattention", vattention_page_kib=0)


@pytest.mark.parametrize("system", ["static", "orca-max", "vllm"])
def test_pool_smaller_than_one_request(system):
    """10 slots cannot hold one max_seq_len = 16 request, whatever the manager."""
    refused("max_seq_len", system, slots=10, max_seq_len=16, **({"block_size": 4} if system == "vllm" else {}))


def test_a_pool_of_whole_blocks_holds_one_request():
    """23 slots in blocks of 4 are 5 blocks: at most 20 tokens, not 22; 20 slots in blocks of
    8 are 2 blocks, 16 tokens: one max_seq_len = 16 request fits."""
    refused("max_seq_len <= 20", slots=23, max_seq_len=22, block_size=4)
    c = config(slots=20, max_seq_len=16, block_size=8)
    assert c[state.NUM_BLOCKS] == 2 and c[state.LEFTOVER_SLOTS] == 4


def test_buddy_pool_whose_largest_chunk_is_too_small():
    """2,000 slots are buddy chunks 1024 + 512 + 256 + 128 + 64 + 16: a 2,000-slot extent is
    placed in 2,048, larger than any. First-fit places it in the whole pool."""
    refused("max_seq_len <= 1024", "orca-max", slots=2000, max_seq_len=2000)
    assert config("orca-max", slots=2000, max_seq_len=2000, placement="first-fit")[state.CAPACITY] == 2000


def test_static_batch_larger_than_the_pool():
    """70 slots hold 70 // 16 = 4 static slots of 16; 15,728 hold 15728 // 2048 = 7 of 2,048."""
    refused("static_batch_size <= 4", "static", slots=70, max_seq_len=16, static_batch_size=5)
    cfg = SimConfig.for_system("static", model="opt-13b", gpu="a100-80gb", kv_gib=15728 * 819200 / 2**30,
                               static_batch_size=8)
    with pytest.raises(ConfigError, match="static_batch_size <= 7"):
        initial_state(cfg, trace(ONE_REQUEST))
