"""The core's arrays for one run: what a :class:`~sim.config.SimConfig`, its KV pool and its
request table ask of the core, as numbers and flags (``state.Core``), before the first event.

Every setting is turned into the core's policy here and nowhere else: the paged pool
(``block_size``, its watermark in blocks, the append rule, prefix caching), the contiguous
(Orca) manager's reservation and placement, static batching's slots, the scheduler's limits
(``max_num_seqs``, the token budgets, swap space in tokens) and the cost model's constants.
Settings that only make sense against the pool (a block table that cannot hold one
``max_seq_len`` request, a buddy pool whose largest block is too small, more static slots than
fit) are refused here, in one line naming the setting.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pagesim.sim.core import state
from pagesim.sim.core.kv import memory, placement
from pagesim.sim.beam_lineage import RECORD_TOKENS, RECORDS, lineage_library
from pagesim.sim.core.sched.beam import BEAM_SEARCH, BEAM_STEPS
from pagesim.sim.core.price.cost import swap_seconds
from pagesim.sim.core.compile import families
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.core.kv.prefix_cache import (BLOCK_SHIFT, ENTRY_BLOCK, ENTRY_COLUMNS, LRU_HEAD, LRU_TAIL, NEXT,
                                              PREV, SPEC_HASH_LOOKAHEAD, TABLE_MASK, prefix_chain)
from pagesim.sim.errors import ConfigError
from pagesim.sim.systems import SCHEDULERS, SCHEDULING_POLICIES
from pagesim.sim.specs.capacity import vattention_page_tokens
from pagesim.sim.specs.gpus import get_gpu
from pagesim.sim.specs.presets import get_model
from pagesim.sim.specs.kv_groups import request_layer_blocks, window_cap_blocks
from pagesim.sim.core.events.loop import COST_MODEL, COST_SCALED, SPEC_DRAFT_COST
from pagesim.sim.core.kv.extent import EXTENT_COLUMNS, EXTENT_START, LARGEST_EXTENT, RESERVATION_KIND
from pagesim.sim.core.kv.host_tier import (HOST_BLOCK_COLUMNS, HOST_TABLE_MASK, HOST_TOUCHED_HEAD, HOST_TOUCHED_TAIL,
                                           OFFLOAD_COLUMNS, OFFLOAD_FRONT, OFFLOAD_HEAP_AT, OFFLOAD_SEEN_AT)
from pagesim.sim.core.kv.kv_cache import SLIDING_FIRST, STATE_FIRST, WINDOW_CAP_BLOCKS
from pagesim.sim.core.kv.placement import ADDRESS_SPACE, HOLE_COLUMNS, ORDER_COLUMNS, ORDER_ROW, PLACEMENT_KIND
from pagesim.sim.core.kv.radix_cache import (HICACHE_LAYERS, NODE_COLUMNS, NODE_FIRST_CHILD, NODE_LOCK_REF,
                                             NODE_OWNER, NODE_PARENT, RADIX_FREE_NODE, RADIX_NODES_USED)
from pagesim.sim.core.sched.lifecycle import SWAP_PREEMPTION
from pagesim.sim.core.sched.scheduler_sglang import (CHUNKED_REQUEST, IGNORE_EOS, INIT_NEW_TOKEN_RATIO,
                                                     MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO,
                                                     NEW_TOKEN_RATIO_DECAY, SCHEDULE_POLICY)
from pagesim.sim.core.sched.scheduler_v1 import CLIENT_TIMEOUT_S, HAS_CLIENT_TIMEOUT
from pagesim.sim.core.sched.scheduler_vllm import (CHUNKED_PREFILL, FORKS_SHARE_BLOCKS, FREE_BLOCK_PER_SEQ,
                                                   HAS_WAITING_SERVED_RATIO, KERNEL_BLOCK, SWAPS,
                                                   WAITING_SERVED_RATIO)
from pagesim.sim.core.sched.speculative import SPEC_COLUMNS
from pagesim.sim.core.sched.static import STATIC_BATCH_LIMIT

ROWS_PER_REQUEST = 8  # the step table's first size: runs take about 5 steps per request
UNLIMITED = 1 << 62  # limits beyond any count a run reaches (swap_gib=1e16) behave alike clamped
#: inter-token latencies are binned on this log grid (1 us .. 10^4 s; sim/metrics.py's docstring)
ITL_EDGES = np.logspace(-6, 4, 2001)


class Pool(NamedTuple):
    """The KV pool as the memory manager divides it. Paged managers (vllm, token, vattention):
    ``num_blocks`` blocks of ``block_size`` slots and ``leftover`` slots too few for another
    block; the contiguous and static managers: one address space of ``capacity`` slots (no blocks)."""

    kind: str  # "paged", "vattention", "contiguous" or "static"
    capacity: int
    max_seq_len: int
    block_size: int = 1
    num_blocks: int = 0
    leftover: int = 0
    watermark_blocks: int = 0
    largest_extent: int = 0  # contiguous: the largest extent an empty pool can place
    num_slots: int = 0  # static: B slots of max_seq_len
    groups: object = None  # vllm-v1: the KV cache groups when some slides (sim.specs.kv_groups), else None

    @property
    def has_blocks(self) -> bool:
        """The pool is divided into blocks (the paged managers: vllm, token, vattention)."""
        return self.kind in ("paged", "vattention")

    @property
    def shares_blocks(self) -> bool:
        """Forks (parallel samples, beams) share blocks: the paged managers but vAttention's."""
        return self.kind == "paged"


def pool_for(cfg, capacity_tokens: int, model, groups=None) -> Pool:
    """How ``cfg``'s manager divides ``capacity_tokens`` slots; ConfigError when one
    ``max_seq_len`` request cannot fit. ``groups``: vLLM v1's KV cache groups when some slide
    (``sim.specs.kv_groups``): a slot is then one token of one group's layers, and every group
    takes its blocks from the pool."""
    capacity, max_seq_len = int(capacity_tokens), int(model.max_seq_len)
    if capacity < max_seq_len and groups is None:  # (groups: check_groups_hold_a_request)
        raise ConfigError(f"KV pool of {capacity} slots is smaller than one max_seq_len={max_seq_len} request; "
                          + (f"use max_seq_len <= {capacity} or a larger pool (kv_gib)" if capacity >= 2
                             else "no request fits it: use a larger pool (kv_gib)"))
    if cfg.manager == "static":
        fit = capacity // max_seq_len
        slots = fit if cfg.static_batch_size is None else cfg.static_batch_size
        if not 1 <= slots <= fit:
            raise ConfigError(f"static_batch_size={slots} slots of {max_seq_len} do not fit in "
                              f"{capacity} slots; use static_batch_size <= {fit}")
        return Pool("static", capacity, max_seq_len, num_slots=int(slots))
    if cfg.manager == "contiguous":
        largest = int(placement.largest_buddy_block(capacity)) if cfg.placement == "buddy" else capacity
        placed = placement.next_pow2(max_seq_len) if cfg.placement == "buddy" else max_seq_len
        if placed > largest:
            raise ConfigError(
                f"with {cfg.placement} placement a max_seq_len={max_seq_len} request takes {placed} slots but "
                f"the largest block of a {capacity}-slot pool is {largest}; use max_seq_len <= {largest}, "
                f"placement first-fit, or a pool of >= {placed} slots")
        return Pool("contiguous", capacity, max_seq_len, largest_extent=largest)
    if cfg.manager == "vattention":
        block_size = vattention_page_tokens(model, cfg.vattention_page_kib * 1024, cfg.tensor_parallel)
    elif groups is not None and groups.block_size:  # raised so a page holds a Mamba state (kv_groups.py)
        block_size = groups.block_size
    else:
        block_size = int(cfg.block_size)  # in 1..256 (sim.config.RANGES)
    num_blocks = capacity // block_size
    if groups is not None:
        check_groups_hold_a_request(cfg, model, groups, block_size, num_blocks)
    elif num_blocks < -(-max_seq_len // block_size):
        raise ConfigError(f"KV pool of {capacity} slots ({num_blocks} blocks of {block_size}) cannot hold one "
                          f"max_seq_len={max_seq_len} request; "
                          + (f"use max_seq_len <= {num_blocks * block_size} or a larger pool (kv_gib)" if num_blocks
                             else f"less than one block, no request fits: use a larger pool (kv_gib) or a smaller "
                                  "block_size"))
    return Pool("paged" if cfg.manager == "paged" else "vattention", capacity, max_seq_len, block_size, num_blocks,
                capacity - num_blocks * block_size, int(cfg.watermark * num_blocks), groups=groups)


def check_groups_hold_a_request(cfg, model, groups, block_size: int, num_blocks: int) -> None:
    """vLLM v1 starts only if its pool holds one ``max_seq_len`` request, a sliding-window
    layer counting its admission cap (``kv_groups.request_layer_blocks``); ConfigError if not."""
    max_seq_len = int(model.max_seq_len)
    need = request_layer_blocks(model, block_size, in_flight_tokens(cfg, max_seq_len), max_seq_len,
                                int(cfg.num_speculative_tokens), bool(cfg.prefix_caching and groups.state_groups))
    if need > num_blocks * groups.layers_per_group:
        need = -(-need // groups.layers_per_group)
        raise ConfigError(f"{num_blocks} KV blocks cannot hold one max_seq_len={max_seq_len} request ({need}); "
                          "lower it or raise --kv-gib")


def batched_tokens(cfg, max_seq_len: int) -> int:
    """An iteration's token budget: ``max_num_batched_tokens``, or max(max_seq_len, 2048)."""
    return cfg.max_num_batched_tokens or max(max_seq_len, 2048)


def in_flight_tokens(cfg, max_seq_len: int) -> int:
    """vLLM v1's tokens scheduled but not yet settled: one budget per step in flight, 2 under
    async scheduling (``VllmConfig.max_in_flight_tokens``, config/vllm.py:588-609)."""
    return (2 if cfg.async_scheduling is not False else 1) * batched_tokens(cfg, max_seq_len)


class Limits(NamedTuple):
    """The scheduler's limits, as the core reads them."""

    max_num_seqs: int
    max_batched_tokens: int
    swap_capacity_tokens: int
    static_batch_limit: int
    host_blocks: int = 0  # vllm-v1's CPU offload tier (--kv-offload-gib): its blocks (0: none)
    host_block_s: float = 0.0  # the seconds a block takes over the GPU's host link, either way
    hicache_host_pages: int = 0  # sglang's host tier (--kv-offload-gib, sim/core/kv/radix_cache.py): its pages
    num_layers: int = 0  # the model's layers (sglang's host tier pipelines a load back over them)


def limits_for(cfg, pool: Pool, kv_bytes_per_token: float, num_layers: int = 0) -> Limits:
    swap = SCHEDULERS[cfg.scheduler].swaps
    max_num_seqs = min(cfg.max_num_seqs, UNLIMITED)
    static_limit = min(pool.num_slots, max_num_seqs) if pool.kind == "static" else 0
    host_blocks, host_block_s = host_tier_size(cfg, pool, kv_bytes_per_token)
    host_pages = 0
    if cfg.capabilities.host_tier_pages and host_blocks:  # the same link, a pool of its own (hicache_host_pages)
        host_blocks, host_pages = 0, hicache_host_pages(cfg, pool, kv_bytes_per_token)
    return Limits(max_num_seqs, batched_tokens(cfg, pool.max_seq_len),
                  min(int(cfg.swap_gib * (1 << 30) / kv_bytes_per_token) if swap else 0, UNLIMITED), static_limit,
                  host_blocks, host_block_s, host_pages, num_layers)


def hicache_host_pages(cfg, pool: Pool, kv_bytes_per_token: float) -> int:
    """sglang's host tier (sim/core/kv/radix_cache.py): ``--kv-offload-gib N`` read as SGLang's
    ``--hicache-size`` of N GiB over the tensor-parallel ranks (``N * 2**30 / 1e9 / TP`` GB per
    rank, the size vLLM's tier gets here): ``HostKVCache`` holds ``size * 1e9 // size_per_token``
    tokens (pool_host/base.py:221-224, ``size_per_token`` the device pool's bytes per token,
    pool_host/mha.py:290-296), in whole pages and one page more, its padding page, which is
    allocated as any (``page_num = size // page_size + 1``, :227-230)."""
    tokens = int(cfg.kv_offload_gib * (1 << 30) / cfg.tensor_parallel // kv_bytes_per_token)
    return tokens // pool.block_size + 1


def host_tier_size(cfg, pool: Pool, kv_bytes_per_token: float) -> tuple[int, float]:
    """vllm-v1's CPU offload tier (sim/core/kv/host_tier.py): its blocks, ``kv_offload_gib`` over the
    tensor-parallel GPUs (vLLM's ``kv_offloading_size`` is their total, config/cache.py:383-387)
    in whole blocks of each GPU's KV bytes (cpu/spec.py:111-123), and the seconds a block takes
    over a GPU's host link (``GPUSpec.pcie_bw``), priced as a swap's bytes are
    (``sim.core.cost.swap_seconds``, with no per-copy latency: the offload worker copies a
    transfer's blocks in one kernel, v1/kv_offload/cpu/swap_blocks_triton.py)."""
    if not cfg.kv_offload_gib:
        return 0, 0.0
    block_bytes = pool.block_size * kv_bytes_per_token
    blocks = int(cfg.kv_offload_gib * (1 << 30) / cfg.tensor_parallel // block_bytes)
    if blocks < 1:
        raise ConfigError(f"kv_offload_gib={cfg.kv_offload_gib} holds no block of {block_bytes:.0f} bytes "
                          f"per GPU; use kv_offload_gib >= {block_bytes * cfg.tensor_parallel / (1 << 30):.4f}")
    return blocks, float(interpreted(swap_seconds)(pool.block_size, kv_bytes_per_token, get_gpu(cfg.gpu).pcie_bw,
                                                   0.0))


RESERVATIONS = {"max": state.RESERVE_MAX, "pow2": state.RESERVE_POW2, "oracle": state.RESERVE_ORACLE,
                "predicted": state.RESERVE_PREDICTED}
PLACEMENTS = {"buddy": state.BUDDY, "first-fit": state.FIRST_FIT, "best-fit": state.BEST_FIT}


def build(cfg, pool: Pool, limits: Limits, table, cost: tuple, *, external: bool = False,
          draft_cost: float = 0.0) -> state.Core:
    """The state of a run of ``table`` (:class:`sim.requests.RequestTable`, whose columns the
    core writes in place) before its first event. ``cost``: (``state.ROOFLINE``/``CALIBRATED``/
    ``TABLE``, scaled, constants, data) from ``sim.cost.models.core_cost``; ``external``: an
    executor outside the core times the steps (the GPU mode), which then records each step's
    block copies and swaps; ``draft_cost``: speculative decoding's drafter price per step, as a
    fraction of a decode step (``sim.core.speculative.draft_cost``)."""
    t = table
    n = t.size
    paged = pool.has_blocks
    block_size, num_blocks = (pool.block_size, pool.num_blocks) if paged else (1, 0)
    prefix_caching = bool(cfg.prefix_caching) and pool.kind == "paged"
    config = np.zeros(state.NUM_CONFIG, np.int64)
    config[state.NUM_REQUESTS] = n
    config[state.BLOCK_SIZE] = block_size
    config[BLOCK_SHIFT] = block_size.bit_length() - 1 if block_size & (block_size - 1) == 0 else -1
    config[KERNEL_BLOCK] = max(cfg.kernel_block_tokens, 1)
    config[state.NUM_BLOCKS] = num_blocks
    config[state.LEFTOVER_SLOTS] = pool.leftover
    config[state.WATERMARK_BLOCKS] = pool.watermark_blocks
    config[state.MAX_SEQ_LEN] = pool.max_seq_len
    config[state.MAX_NUM_SEQS] = limits.max_num_seqs
    config[state.MAX_BATCHED_TOKENS] = limits.max_batched_tokens
    config[state.KEEP_ROWS] = int(cfg.record_steps)
    config[state.PROGRESS_EVERY] = UNLIMITED  # nobody to tell (replay.run sets it for a progress hook)
    config[CHUNKED_PREFILL] = int(cfg.chunked_prefill)
    config[state.CHUNK_BUDGET] = cfg.chunk_budget
    config[SWAP_PREEMPTION] = int(cfg.preemption == "swap")
    config[state.SWAP_CAPACITY_TOKENS] = limits.swap_capacity_tokens
    config[FREE_BLOCK_PER_SEQ] = int(paged and cfg.append_rule == "free-block-per-seq")
    config[state.CHECK_STEPS] = int(cfg.check)
    config[state.EXTERNAL_STEPS] = int(external)
    config[state.SCHEDULER_KIND] = cfg.family
    config[state.FAMILY_TRAITS] = families.TRAITS[cfg.family]
    config[state.SCHEDULING_POLICY] = list(SCHEDULING_POLICIES).index(cfg.scheduling_policy)
    if cfg.capabilities.async_scheduling:
        config[state.ASYNC_SCHEDULING] = int(cfg.async_scheduling is not False)  # None: vLLM's default, on
    sglang = cfg.capabilities.radix_cache  # (its radix cache's arrays: radix_cache.py)
    cost_code, cost_scaled, cost_constants, cost_data = cost
    config[COST_MODEL] = cost_code
    config[COST_SCALED] = int(cost_scaled)
    count = np.zeros(state.NUM_COUNTS, np.int64)
    count[state.NUM_FREE_BLOCK_IDS] = num_blocks
    # every running request holds a block, so no more than num_blocks run at once, each with at
    # most max_width sequences; admission counts a request's sequences against max_num_seqs but
    # only its first one as running until the fork (scheduler.admit), so the requests admitted
    # by then can run up to max_width times max_num_seqs sequences
    max_width = int(t.width.max()) if n else 1
    num_slots = max(1, min(limits.max_num_seqs * max_width, int(t.width.sum()), num_blocks * max_width))
    count[state.NUM_FREE_SLOTS] = num_slots
    # a sequence holds at most its request's final length, and no request longer than
    # max_seq_len is admitted: the table is as wide as the trace's longest request needs
    longest = int((t.prompt + t.output).max()) if n else 1
    # speculative decoding: the drafts and lookahead slots past the final length (speculative.py)
    longest += int(cfg.num_speculative_tokens) * (1 if cfg.speculative_method == "ngram" else 2)
    blocks_per_seq = -(-min(pool.max_seq_len, longest) // block_size)
    if pool.groups is not None and pool.groups.state_groups:  # a state group's blocks (kv_cache.state_blocks)
        blocks_per_seq = max(blocks_per_seq, 1 + int(cfg.num_speculative_tokens))
    table_groups = set_groups(config, pool, cfg)
    i64 = np.int64
    shared = prefix_caching or max_width > 1
    caching = prefix_caching_arrays(num_blocks, t, prefix_caching, shared, radix=sglang)
    seq_slot = np.full((max(n, 1), max_width), -1, i64)
    config[state.PREFIX_CACHING] = int(prefix_caching)
    config[state.SHARED_BLOCKS] = int(shared)  # reference counts kept
    config[FORKS_SHARE_BLOCKS] = int(pool.shares_blocks)  # else n / beam_width > 1 is rejected
    config[state.HASH_BLOCK_TOKENS] = t.hash_block_tokens
    config[TABLE_MASK] = len(caching["key_entries"]) - 1
    count[LRU_HEAD] = count[LRU_TAIL] = -1
    clock = np.zeros(state.NUM_CLOCK)
    ratio = cfg.waiting_served_ratio
    config[HAS_WAITING_SERVED_RATIO] = int(ratio is not None)
    clock[WAITING_SERVED_RATIO] = 0.0 if ratio is None else float(ratio)
    config[BEAM_SEARCH] = int(n > 0 and int(t.beam.max()) > 1)
    config[HAS_CLIENT_TIMEOUT] = int(cfg.client_timeout_s is not None)
    clock[CLIENT_TIMEOUT_S] = np.inf if cfg.client_timeout_s is None else float(cfg.client_timeout_s)
    rows = max(1024, ROWS_PER_REQUEST * n) if cfg.record_steps else 0
    # the running list and the step's per-request arrays: no more requests run at once than
    # max_num_seqs, nor, under a paged manager, than its running slots (each holds one); a
    # cluster's replicas take theirs at these lengths (sim/cluster.py)
    running = max(1, min(n, limits.max_num_seqs, num_slots if paged and not sglang else n))
    # a request is swapped out only into swap space, with --preemption swap or several
    # sequences (lifecycle.preempt): the swapped queue and each request's swapped tokens
    config[SWAPS] = int(limits.swap_capacity_tokens > 0 and (cfg.preemption == "swap" or max_width > 1))
    swapped = max(n, 1) if config[SWAPS] else 1
    radix = radix_arrays(config, count, clock, cfg, n, radix_rows(num_blocks, limits.hicache_host_pages, t.prompt
                                                                + t.output, block_size)) if sglang else dict(
        radix_nodes=np.zeros((1, NODE_COLUMNS), i64), radix_request=np.zeros((1, state.RADIX_REQUEST_COLUMNS), i64))
    s = state.Core(
        config=config, count=count, clock=clock, cost=cost_constants,
        arrival_s=np.ascontiguousarray(t.arrival_s), priority=priority_column(cfg, t), prompt_tokens=t.prompt,
        output_tokens=t.output,
        status=t.status, reject_code=t.reject_code, num_generated=t.generated,
        num_prompt_computed=t.prefilled, prompt_target=t.target, num_preemptions=t.preemptions,
        first_token_s=t.first_token_s, finish_s=t.finish_s, last_token_s=t.last_token_s,
        num_computed_tokens=np.zeros(n, i64), num_blocks=np.zeros(n, i64), final_len=t.prompt + t.output,
        in_decode=np.zeros(n, np.int8), swapped_tokens=np.zeros(swapped, i64),
        waiting=np.zeros(max(n, 1), i64), swapped=np.zeros(swapped, i64), running=np.zeros(running, i64),
        running_group=np.zeros(running, np.int8),
        # (sglang's radix cache counts its pool's pages, it lists no free block: radix_cache.py)
        free_block_ids=np.arange(0 if sglang else num_blocks, dtype=np.int32), free_slots=np.arange(num_slots, dtype=i64),
        block_table=np.zeros((num_slots, table_groups * blocks_per_seq), np.int32),
        step_prefill_ids=np.zeros(running, i64), step_prefill_tokens=np.zeros(running, i64),
        step_finished=np.zeros(running, i64), step_memory=np.zeros(state.MEMORY_CATEGORIES, i64),
        itl_edges=ITL_EDGES, itl_hist=np.zeros(len(ITL_EDGES) + 1, i64),
        row_floats=np.zeros((rows, state.ROW_FLOATS)), row_ints=np.zeros((rows, state.ROW_INTS), i64),
        cost_data=cost_data, step_prefill_context=np.zeros(running, i64),
        width=t.width, num_seqs=np.ones(max(n, 1), i64), seq_slot=seq_slot, **no_extents(), **caching,
        beam=t.beam, **beam_arrays(config, t), rng=np.random.default_rng(cfg.seed),
        predictor_draw=np.zeros(0), placement_saved=np.zeros(0, i64), **step_output_arrays(
            external, num_blocks, num_slots * blocks_per_seq), **radix,
        **speculative_arrays(config, clock, cfg, n, pool.max_seq_len, draft_cost),
        **host_tier_arrays(config, count, clock, limits, n, t.prompt // block_size,
                           len(radix["radix_nodes"]) if limits.hicache_host_pages else 0),
        window=np.zeros((max(n, 1) if pool.groups is not None else 1, state.WINDOW_COLUMNS), i64),
        admitted_s=np.full(1, np.nan), exchange=np.zeros(1, i64))
    s = s if paged else with_extents(cfg, pool, limits, s, t)
    memory.check_family(s.config)
    return s


def set_groups(config, pool: Pool, cfg) -> int:
    """vLLM v1's KV cache groups into ``config`` when some slide (``Pool.groups``); returns the
    block tables per running sequence (1: the plain pool). (An executor that reads the block
    tables is refused them: ``sim.run.prepare``.)"""
    groups = pool.groups
    if groups is None:
        return 1
    in_flight = in_flight_tokens(cfg, pool.max_seq_len)
    config[state.FULL_GROUPS] = groups.full_groups
    config[state.SLIDING_GROUPS] = groups.sliding_groups
    config[state.SLIDING_WINDOW] = groups.window
    config[WINDOW_CAP_BLOCKS] = window_cap_blocks(groups.window, pool.block_size, in_flight, pool.max_seq_len)
    config[state.STATE_GROUPS] = groups.state_groups
    config[state.STATE_SLOTS] = groups.state_slots
    # (without prefix caching the order only names the blocks: every one goes to the free stack)
    config[SLIDING_FIRST] = int(groups.sliding_first and cfg.prefix_caching)
    # prefix caching over state groups: vLLM's "align" mode (docs/notes/mamba-align.md)
    config[state.MAMBA_ALIGN] = int(bool(groups.state_groups and cfg.prefix_caching))
    config[STATE_FIRST] = int(groups.state_first and cfg.prefix_caching)
    return groups.num_groups


#: SGLang's new_token_ratio constants (environ.py: SGLANG_INIT_NEW_TOKEN_RATIO 0.7,
#: SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS 600)
SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 0.7, 0.14, 600


def radix_rows(device_pages: int, host_pages: int, final_len: np.ndarray, page: int) -> int:
    """The rows the radix tree's nodes can reach (``radix_nodes``; compiled code writes them
    unchecked, so a row too few corrupts memory): the root, a split's two spare rows, and every
    other live node, each holding at least a page (keys are page-aligned) on the device or, with
    a host tier, on the host alone (a node off both is deleted, and a node on the host has its
    ancestors there: ``radix_cache.write``); and each the end of a distinct page-prefix of some
    request's tokens (one tree of the requests' keys), so no more than their pages together."""
    pages_of_keys = int((-(-final_len // page)).sum()) if len(final_len) else 0
    return 1 + min(device_pages + host_pages, pages_of_keys) + 2


def radix_arrays(config, count, clock, cfg, n: int, num_rows: int) -> dict:
    """``--system sglang``: the radix cache's flags and arrays (sim/core/kv/radix_cache.py) and the
    scheduler's new_token_ratio (scheduler.py: init = min(0.7 x schedule_conservativeness, 1),
    min = min(init x 0.14, 1), decay = (init - min) / 600); ``num_rows`` nodes
    (:func:`radix_rows`)."""
    i64 = np.int64
    config[state.MANAGER_KIND] = state.RADIX
    config[SCHEDULE_POLICY] = state.LPM if cfg.schedule_policy == "lpm" else state.FCFS
    config[IGNORE_EOS] = int(cfg.ignore_eos is not False)  # None: on (SimConfig.ignore_eos)
    count[CHUNKED_REQUEST] = -1
    count[RADIX_FREE_NODE] = -1
    count[RADIX_NODES_USED] = 1  # the root
    init = min(SGLANG_INIT_NEW_TOKEN_RATIO * cfg.schedule_conservativeness, 1.0)
    floor = min(init * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
    clock[NEW_TOKEN_RATIO] = clock[INIT_NEW_TOKEN_RATIO] = init
    clock[MIN_NEW_TOKEN_RATIO] = floor
    clock[NEW_TOKEN_RATIO_DECAY] = (init - floor) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    nodes = np.zeros((num_rows, NODE_COLUMNS), i64)
    nodes[:, NODE_FIRST_CHILD] = -1
    nodes[0, NODE_PARENT] = -1
    nodes[0, NODE_OWNER] = -1
    nodes[0, NODE_LOCK_REF] = 1  # radix_cache.py: the root is never evicted
    request = np.zeros((max(n, 1), state.RADIX_REQUEST_COLUMNS), i64)
    request[:, state.LOCKED_NODE] = -1
    return dict(radix_nodes=nodes, radix_request=request)


def host_tier_arrays(config, count, clock, limits: Limits, n: int, prompt_blocks: np.ndarray,
                     radix_nodes: int = 0) -> dict:
    """vllm-v1's CPU offload tier (sim/core/kv/host_tier.py): its blocks and their key map (a power
    of two, at least twice the blocks, as the GPU's), its LRU's lists (empty) and heap of groups,
    the link's price per block, the per-request columns (one row each without it), an entry for
    each request's each prompt block (``prompt_blocks``: a request offers no other) saying whether
    it used its key and where it last found it, and when each request's KV load ends (one entry
    without it; a disaggregated run's are sim/disagg.py's). sglang's host tier (``radix_nodes``:
    the tree's rows; sim/core/kv/radix_cache.py) has its pages, the link's price per page, the
    model's layers, and per node when its copy ends (``host_ready_s``) and ``host_work``'s rows of
    pending nodes and of a path."""
    blocks = limits.host_blocks
    config[state.HOST_BLOCKS] = blocks
    clock[state.HOST_BLOCK_S] = limits.host_block_s
    config[state.HICACHE_HOST_PAGES] = limits.hicache_host_pages
    config[HICACHE_LAYERS] = limits.num_layers
    rows = 1 << max(2 * blocks - 1, 1).bit_length() if blocks else 1
    config[HOST_TABLE_MASK] = rows - 1
    count[HOST_TOUCHED_HEAD] = count[HOST_TOUCHED_TAIL] = -1
    entries = np.zeros((rows, ENTRY_COLUMNS), np.int64)
    entries[:, ENTRY_BLOCK] = -1
    offload = offload_rows(n if blocks else 0)
    seen_at = np.concatenate([[0], np.cumsum(prompt_blocks, dtype=np.int64)]) if blocks else np.zeros(1, np.int64)
    if blocks:
        offload[:n, OFFLOAD_SEEN_AT] = seen_at[:n]
    return dict(host_entries=entries, host_blocks=np.zeros((max(blocks, 1), HOST_BLOCK_COLUMNS), np.int64),
                host_work=np.zeros((state.HOST_WORK_COLUMNS, max(blocks, radix_nodes, 1)), np.int64),
                host_ready_s=np.zeros(max(blocks, radix_nodes, 1)), offload=offload,
                host_seen=np.zeros(max(int(seen_at[-1]), 1), np.int32),
                # a host load's end (lifecycle.kv_arrived; a disaggregated run's: sim/disagg.py)
                load_ready_s=np.zeros(max(n, 1) if blocks else 1))


def offload_rows(n: int) -> np.ndarray:
    """``Core.offload``'s rows for ``n`` requests (one row for none): a replica that loads KV
    asynchronously keeps vLLM's prefills in flight there (``host_tier.reserved_blocks``), the
    host tier's own columns besides."""
    offload = np.zeros((max(n, 1), OFFLOAD_COLUMNS), np.int64)
    offload[:, OFFLOAD_FRONT] = offload[:, OFFLOAD_HEAP_AT] = -1
    return offload


def speculative_arrays(config, clock, cfg, n: int, max_seq_len: int, draft_cost: float) -> dict:
    """Speculative decoding (``--num-speculative-tokens``, vllm-v1; sim/core/sched/speculative.py): K,
    the lookahead slots and input slots its method takes (vLLM 0.33.0 config/vllm.py:625-652,
    config/speculative.py:2057-2098), the drafter's price, each request's high-water mark and
    drafts (one row without it), and the acceptance rate of each draft position."""
    k = int(cfg.num_speculative_tokens)
    if k:
        config[state.SPEC_TOKENS] = k
        config[state.SPEC_LOOKAHEAD] = k if cfg.speculative_method != "ngram" else 0
        config[state.SPEC_DRAFT_SLOTS] = 1 if cfg.speculative_method == "draft-model" else 0
        # EAGLE's and MTP's drafter reads the token after a block: its hash covers it (config/vllm.py:
        # 660-692; 0 with a KV connector, which --kv-offload-gib and disaggregation are, both refused here)
        eagle = cfg.speculative_method in ("eagle", "mtp")
        config[SPEC_HASH_LOOKAHEAD] = int(eagle and bool(cfg.prefix_caching))
        clock[SPEC_DRAFT_COST] = draft_cost
    rates = acceptance_rates(cfg)
    return dict(speculative=np.zeros((max(n, 1) if k else 1, SPEC_COLUMNS), np.int64),
                spec_acceptance=np.array(rates if k else [0.0], np.float64))


def draft_cost(cfg, model) -> float:
    """The drafter's price per step as a fraction of a decode step of the same requests (the
    loop's ``draft_time``): K autoregressive passes, each costing the draft's share of the
    target's work. n-gram: 0 (its proposer matches on the CPU, not priced here); EAGLE and MTP:
    one decoder layer of the target's shape, 1 / its layers (the EAGLE head and an MTP module
    are one layer each; their LM head is not counted); a draft model: its weights over the
    target's (a decode step reads the weights once: small batches are bound by those reads)."""
    k = int(cfg.num_speculative_tokens)
    if not k or cfg.speculative_method == "ngram":
        return 0.0
    if cfg.speculative_method == "draft-model":
        return k * get_model(cfg.draft_model).weight_bytes / model.weight_bytes
    return k / model.num_layers


def acceptance_rates(cfg) -> list[float]:
    """The chance that each draft position is accepted once those before it were:
    ``--spec-acceptance-rates`` (one per position), else ``--spec-acceptance-rate`` at every one."""
    k = int(cfg.num_speculative_tokens)
    if cfg.spec_acceptance_rates:
        return [float(x) for x in cfg.spec_acceptance_rates.split(",")]
    return [float(cfg.spec_acceptance_rate)] * k


def step_output_arrays(external: bool, num_blocks: int, table_cells: int) -> dict:
    """The step's data movement (state.Core.step_copies, step_swap_out, step_swap_in), sized for
    the most a step can record (one row each when nobody reads them): a copy takes a free block;
    a scheduling pass swaps out (and in) at most every cell of the block tables, and an iteration
    is at most two passes (scheduler_vllm.schedule)."""
    if not external:
        num_blocks = table_cells = 0
    i64 = np.int64
    return dict(step_copies=np.zeros((num_blocks + 1, 2), i64), step_swap_out=np.zeros((2 * table_cells + 1, 3), i64),
                step_swap_in=np.zeros((2 * table_cells + 1, 3), i64))


def no_extents() -> dict:
    """The contiguous manager's arrays, empty (a paged run never reads them)."""
    i64 = np.int64
    return dict(extent=np.zeros((0, EXTENT_COLUMNS), i64), buddy_bits=np.zeros(0, i64),
                buddy_orders=np.zeros((0, ORDER_COLUMNS), i64),
                holes=np.zeros((0, HOLE_COLUMNS), i64))


def with_extents(cfg, pool: Pool, limits: Limits, s: state.Core, t) -> state.Core:
    """``s`` (a pool of no blocks) with the contiguous (Orca) manager's flags, its extents'
    arrays and an empty pool: one free block per buddy chunk, or one hole. The static manager
    is the same accounting with the ``max`` reservation in its B fixed slots (first-fit over
    ``[0, B * max_seq_len)``), under the static scheduler."""
    config = s.config
    config[state.MANAGER_KIND] = state.CONTIGUOUS
    config[state.CAPACITY] = pool.capacity
    config[ADDRESS_SPACE] = pool.capacity
    if pool.kind == "static":
        config[STATIC_BATCH_LIMIT] = limits.static_batch_limit
        config[RESERVATION_KIND] = state.RESERVE_MAX
        config[PLACEMENT_KIND] = state.FIRST_FIT
        config[ADDRESS_SPACE] = pool.num_slots * pool.max_seq_len  # the tail stays free
        config[LARGEST_EXTENT] = pool.max_seq_len
    else:
        config[RESERVATION_KIND] = RESERVATIONS[cfg.reservation]
        config[PLACEMENT_KIND] = PLACEMENTS[cfg.placement]
        config[LARGEST_EXTENT] = pool.largest_extent
        s.clock[state.PREDICTOR_ERROR] = cfg.predictor_error
    n = t.size
    i64 = np.int64
    space = int(config[ADDRESS_SPACE])
    orders = max(space.bit_length(), 1) if config[PLACEMENT_KIND] == state.BUDDY else 0
    words = [max(1, -(-(space >> k) // placement.WORD_BITS)) for k in range(orders)]
    buddy_orders = np.zeros((orders, ORDER_COLUMNS), i64)
    buddy_orders[:, ORDER_ROW] = np.cumsum([0] + words[:-1])[:orders]
    # holes never outnumber the extents + 1, and extents the running requests
    holes = min(int(config[state.MAX_NUM_SEQS]), n, pool.capacity) + 2
    extent = np.zeros((n, EXTENT_COLUMNS), i64)
    extent[:, EXTENT_START] = -1
    s = s._replace(extent=extent, buddy_bits=np.zeros(sum(words), i64), buddy_orders=buddy_orders,
                   holes=np.zeros((holes, HOLE_COLUMNS), i64))
    if config[RESERVATION_KIND] == state.RESERVE_PREDICTED:
        s = s._replace(predictor_draw=predictor_draws(cfg.seed, t),
                       placement_saved=np.zeros(placement.saved_size(sum(words), orders, holes), i64))
    placement.init(s)
    return s


def predictor_draws(seed: int, t) -> np.ndarray:
    """Each request's standard normal draw z for the predicted reservation (sim/core/kv/extent.py
    ``request_size``), seeded by (seed, row, F): a request's row names its one sequence and F is
    its final length, so every admission of it (after a recompute or a swap too) draws this z."""
    final = (t.prompt + t.output).tolist()
    return np.array([np.random.default_rng((seed, i, f)).standard_normal() for i, f in enumerate(final)],
                    dtype=np.float64)


def priority_column(cfg, t) -> np.ndarray:
    """The core's priority column: the trace's, or (a trace without one: a single 0) a 0 for
    each request where the run's policy orders by it."""
    if len(t.priority) == t.size or SCHEDULING_POLICIES[cfg.scheduling_policy].orders_by != "priority":
        return t.priority
    return np.zeros(t.size, np.int64)


def beam_arrays(config, t) -> dict:
    """Beam search's lineage records (``sim/beam_lineage.py``), a section for each width the trace's
    requests with beams have, and per such request its record's first row: request ``i`` follows
    record ``i mod RECORDS`` of its width (``sim/core/sched/beam.py``); one row each where no
    request has beams. A width above ``max_num_seqs`` never decodes (``REJECT_TOO_WIDE``): none."""
    beams = (t.beam > 1) & (t.width <= config[state.MAX_NUM_SEQS])
    if not config[BEAM_SEARCH] or not beams.any():
        config[BEAM_STEPS] = 1
        return dict(beam_parents=np.zeros((1, 1), np.int16), beam_row=np.zeros(1, np.int64))
    widths = np.unique(t.width[beams])
    steps = RECORD_TOKENS - 1
    section = RECORDS * steps
    parents = np.zeros((len(widths) * section, int(widths.max())), np.int16)
    row = np.zeros(len(t.beam), np.int64)
    for k, width in enumerate(widths.tolist()):
        parents[k * section:(k + 1) * section, :width] = lineage_library(width).reshape(section, width)
        mine = np.flatnonzero(beams & (t.width == width))
        row[mine] = k * section + mine % RECORDS * steps
    config[BEAM_STEPS] = steps
    return dict(beam_parents=parents, beam_row=row)


def prefix_caching_arrays(num_blocks: int, t, prefix_caching: bool, shared: bool, radix: bool = False) -> dict:
    """The prefix cache's arrays (sim/core/kv/prefix_cache.py): the pool's (also where blocks are
    shared by forks: ``shared``), the key map's (a power of two at least eight times the pool:
    prefix_cache.home_in), and every request's prefix chain hashes
    (:func:`sim.core.prefix_cache.prefix_chain`; also for the radix cache: ``radix``; the paged
    caches keep a request's leading run that another request shares: :func:`shared_chains`) and
    the step it was last scheduled in (vLLM 0.4.2's evictor).
    One-element arrays where not needed."""
    n, i64 = t.size, np.int64
    nb = num_blocks if shared else 1
    cap = 1 << max(1, (8 * nb - 1).bit_length()) if prefix_caching else 1
    chain_start = np.zeros(n + 1 if prefix_caching or radix else 1, i64)
    chains: list[int] = []
    if (prefix_caching or radix) and t.hashes is not None:
        hash_block_tokens = t.hash_block_tokens
        for i in range(n):
            h = t.prefix_hashes(i)
            if h:
                chains.extend(prefix_chain(h, hash_block_tokens))
            chain_start[i + 1] = len(chains)
    chains = np.array(chains if chains else [0], dtype=i64)
    if prefix_caching and chain_start[-1]:  # (the paged caches': SGLang's tree compares them whole)
        chains, chain_start = shared_chains(chains, chain_start)
    block_info = np.zeros((nb, state.BLOCK_INFO_COLUMNS), np.int32)  # a row a cache line (state.py)
    block_info[:, PREV] = block_info[:, NEXT] = -1
    key_entries = np.zeros((cap, ENTRY_COLUMNS), i64)
    key_entries[:, ENTRY_BLOCK] = -1
    return dict(block_info=block_info, key_entries=key_entries, chain_start=chain_start,
                last_scheduled_step=np.zeros(n if prefix_caching else 1, i64),
                chains=chains)


def shared_chains(chains: np.ndarray, chain_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each request's chains (``chains[chain_start[i]:chain_start[i + 1]]``) cut to its leading run
    that some other request's chains hold too. A chain names the whole prefix up to its hash
    block, so the chains past the first no other request holds name tokens only this request has:
    their keys are its own (``prefix_cache.key_chain``), found by nobody but itself after a
    preemption, and the paged caches hold such keys out of their map (``prefix_cache.apart``)
    without a lookup finding less. Every lookup of a run finds the same blocks. (Equal chains in
    one request would take a 64-bit hash collision, as equal chains in two requests that do not
    share their prefix would.)"""
    _, inverse, counts = np.unique(chains, return_inverse=True, return_counts=True)
    unshared = np.append(np.flatnonzero(counts[inverse] == 1), len(chains))  # (and past the end)
    starts, ends = chain_start[:-1], chain_start[1:]
    kept = np.minimum(unshared[np.searchsorted(unshared, starts)], ends) - starts  # each one's leading run
    new_start = np.zeros_like(chain_start)
    np.cumsum(kept, out=new_start[1:])
    sizes = ends - starts
    keep = np.arange(len(chains)) - np.repeat(starts, sizes) < np.repeat(kept, sizes)
    return (chains[keep] if new_start[-1] else np.zeros(1, chains.dtype)), new_start
