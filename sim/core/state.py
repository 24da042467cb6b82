"""The core's state: plain numpy arrays, grouped in one named tuple, with named indices.

numba compiles functions over arrays and tuples of arrays, not over Python objects, so the
state of a run is a :class:`Core` of arrays:

* per request (row ``i`` of the trace): the :class:`~sim.requests.RequestTable`'s own
  columns (written in place: status, tokens generated, times), plus the core's
  ``num_computed_tokens``, ``num_blocks``, ``final_len``, ``in_decode`` and
  ``swapped_tokens``;
* per running slot (one per running sequence): the block table ``block_table[slot, k]``, the
  int32 table the GPU kernel reads, and the free slot ids; a request's sequences' slots are
  the row ``seq_slot[i]`` (``seq_slot[i, 0]`` its first);
* the block pool: ``free_block_ids`` (a stack), and the waiting and swapped queues (rings);
* the contiguous manager's extents (start, reservation R, placed size A, the tokens held at
  admission P and when it joined the decode set, per request) and its placement: the buddy's
  free-block bitmaps per order, or the holes by address;
* scalars: ``config`` (int64, the policy as numbers and flags, read only), ``count`` (int64
  counters) and ``clock`` (float64 times and sums), indexed by the constants below.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# request status: the values of sim.requests.Status
PENDING, WAITING, RUNNING, SWAPPED, FINISHED, REJECTED = 0, 1, 2, 3, 4, 5
# why a request was rejected (sim.core.outcome puts each in words for the request table)
REJECT_OVER_BATCHED_TOKENS, REJECT_NEVER_FITS, REJECT_TOO_WIDE = 1, 2, 3
REJECT_WIDTH_UNSHARED = 4  # n / beam_width > 1 on a manager whose forks cannot share blocks
REJECT_CLIENT_TIMEOUT = 5  # its client gave up waiting (--client-timeout): the engine aborted it

# config: int64, the policy as data
(NUM_REQUESTS, BLOCK_SIZE, NUM_BLOCKS, LEFTOVER_SLOTS, WATERMARK_BLOCKS, MAX_SEQ_LEN, MAX_NUM_SEQS,
 MAX_BATCHED_TOKENS, KEEP_ROWS, PROGRESS_EVERY, CHUNKED_PREFILL, CHUNK_BUDGET, SWAP_PREEMPTION,
 SWAP_CAPACITY_TOKENS, FREE_BLOCK_PER_SEQ, COST_MODEL, COST_SCALED,
 MANAGER_KIND, CAPACITY, RESERVATION_KIND, PLACEMENT_KIND, LARGEST_EXTENT,
 PREFIX_CACHING, HASH_BLOCK_TOKENS, TABLE_MASK, HAS_WAITING_SERVED_RATIO,
 SCHEDULER_KIND, STATIC_BATCH_LIMIT, ADDRESS_SPACE, SHARED_BLOCKS, CHECK_STEPS, BEAM_SEARCH, FORKS_SHARE_BLOCKS,
 EXTERNAL_STEPS, ROUTED, SCHEDULE_POLICY, ASYNC_SCHEDULING, KERNEL_BLOCK, SCHEDULING_POLICY, NUM_CONFIG) = range(40)
# config[COST_MODEL]: which step price the loop calls (sim.core.cost, cost_calibrated, cost_table);
# config[COST_SCALED]: 1 when its GPU time is scaled (sim.cost.models.ScaledCostModel), the scale
# being the last entry of ``cost``
ROOFLINE, CALIBRATED, TABLE = 0, 1, 2
# config[KERNEL_BLOCK]: the tokens the decode attention kernel reads a sequence's KV in: the block
# size under vLLM v0's PagedAttention kernel (it reads whole blocks, sim.core.cost.kernel_read_tokens),
# 1 for a kernel that reads each cached token once (SimConfig.kernel_block_tokens)
# config[CHECK_STEPS]: 1 under --check: the loop returns after every iteration (sim/core/check.py)
# config[EXTERNAL_STEPS]: 1 when an executor outside the core runs the steps (the GPU mode): the
# loop returns SCHEDULED after scheduling an iteration, Python puts its duration in
# clock[STEP_S], and the core records the step's data movement (Core.step_copies,
# step_swap_out, step_swap_in) as it acts

# count: int64 counters
(USED_BLOCKS, COMPUTED_SLOTS, DEMAND_SLOTS, LOGICAL_BLOCKS, NUM_ALLOCATIONS, NUM_FREES,
 NUM_FREE_BLOCK_IDS, NUM_FREE_SLOTS, NUM_RUNNING, DECODE_SET_SIZE,
 WAITING_HEAD, WAITING_LEN, SWAPPED_HEAD, SWAPPED_LEN, SWAP_USED_TOKENS, NUM_SWAP_FALLBACKS,
 FREE_EPOCH, BLOCKED_REQUEST, BLOCKED_EPOCH, BLOCKED_KIND, DEMAND_WAITING,
 NUM_PREEMPTIONS, NUM_REJECTED, NUM_FINISHED, NUM_FINISHED_REPORTED,
 STEP_PREFILL_SEQS, STEP_PREFILL_TOKENS, STEP_DECODE_SEQS, STEP_SWAP_IN, STEP_SWAP_OUT,
 NUM_ROWS, ITL_COUNT,
 NEXT_EVENT_ID, NEXT_ARRIVAL, ARRIVAL_PENDING, ARRIVAL_EVENT_ID, ENGINE_PENDING, ENGINE_EVENT_ID,
 ARRIVALS_DONE, IDLE, WAKE_TRIGGERED, IN_STEP, STARTED,
 RESERVED_SLOTS, PLACED_SLOTS, NUM_HOLES,
 NUM_LRU, LRU_HEAD, LRU_TAIL, NUM_EVICTIONS, PREFIX_HIT_TOKENS, PREFIX_LOOKUP_TOKENS, NUM_CACHED_KEYS,
 STEPS_WITHOUT_TOKEN, STATIC_LIVE, STATIC_CONTEXT_SUM,
 NUM_RUNNING_SEQS, NUM_FORKS, NUM_COW_COPIES, STEP_COPIED_BLOCKS,
 NUM_OVERFLOWS, NUM_GROWS_IN_PLACE, NUM_MOVES, NUM_JOINS,
 STEP_SWAP_OUT_BLOCKS, STEP_SWAP_IN_BLOCKS, STEP_NUM_FINISHED, AWAITING_STEP_TIME, STEP_SWAP_OUT_EARLY,
 SCHEDULE_ON_RESUME, HORIZON_EVENT_ID,
 CHUNKED_REQUEST, RADIX_TREE_TOKENS, RADIX_EVICTABLE, RADIX_PRIVATE_PAGES, RADIX_ACCESS_CLOCK, RADIX_FREE_NODE,
 RADIX_NODES_USED, NUM_COUNTS) = range(79)
# the radix cache (sim/core/radix_cache.py, --system sglang): the request whose prefill is chunked
# (-1: none); the tokens the tree holds, those of them no running request locks (evictable), the
# pages the running requests hold outside the tree; the access clock (a node's last access is a
# tick of it); the free node list's head and the nodes ever used (evictions scan these)
# STEP_SWAP_OUT_BLOCKS, STEP_SWAP_IN_BLOCKS: rows of step_swap_out / step_swap_in this iteration
# (under EXTERNAL_STEPS; STEP_COPIED_BLOCKS counts step_copies' rows); STEP_NUM_FINISHED: the
# requests the last completed step finished (step_finished[:n]); AWAITING_STEP_TIME: the loop
# returned SCHEDULED and resumes with clock[STEP_S]; STEP_SWAP_OUT_EARLY: the rows of step_swap_out
# made by an iteration's first scheduling pass when it had to take a second (scheduler_vllm.schedule):
# they come before the second pass's swap-ins, which may take their blocks
# count[SCHEDULE_ON_RESUME]: 1 when run() returned PROGRESS as a step ended, before the next
# iteration was scheduled (sim/core/loop.py): the next call schedules it first

# clock: float64 times and time-weighted sums
(NOW, ARRIVAL_TIME, ENGINE_TIME, IDLE_FROM, IDLE_S, BUSY_S, END_S, ITL_SUM, RUNNING_WEIGHTED) = range(9)
MEM_SUM = 9  # six slots: the memory categories' slot-seconds, in sim.metrics' order
BLOCKS_SUM, LOGICAL_SUM = 15, 16
WAITING_SERVED_RATIO = 17  # the policy's one float (read only; see HAS_WAITING_SERVED_RATIO)
BEAM_CHURN = 18  # beam search: the chance that a beam dies at a decode step (read only; see BEAM_SEARCH)
PREDICTOR_ERROR = 19  # the predicted reservation's relative error (read only)
STEP_S = 20  # EXTERNAL_STEPS: the duration of the iteration just scheduled, as its executor measured it
HORIZON_S = 21  # config[ROUTED]: the time of the cluster's next arrival (its event id: count[HORIZON_EVENT_ID])
# --system sglang: the scheduler's new_token_ratio (SGLang's estimate of the share of max_new_tokens a
# running request still decodes) now, at its start, its floor and its decay per decode step
NEW_TOKEN_RATIO, INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, NEW_TOKEN_RATIO_DECAY = 22, 23, 24, 25
# --system vllm-v1 under config[ASYNC_SCHEDULING]: when the scheduler last scheduled a step
# (sim/core/scheduler_v1.py: a request arriving after it waits one more step)
LAST_SCHEDULE_S = 26
# --system vllm-v1: how long a client waits for its whole answer before it gives up (inf: forever)
CLIENT_TIMEOUT_S = 27
NUM_CLOCK = 28

# prefix caching: the columns of block_info (a block's row: the running requests holding it, its
# neighbours in the LRU list, its key's end token (0: no key) and its row in key_entries), eight
# int64 to a row so that a row is one cache line; and of key_entries (ENTRY_BLOCK -1: empty)
REF, PREV, NEXT, KEY_END, KEY_SLOT, BLOCK_INFO_COLUMNS = 0, 1, 2, 3, 4, 8
ENTRY_END, ENTRY_CHAIN, ENTRY_BLOCK, ENTRY_COLUMNS = 0, 1, 2, 4

# config[MANAGER_KIND]: which manager the scheduler's memory verbs go to (sim/core/memory.py)
PAGED, CONTIGUOUS = 0, 1
# config[RESERVATION_KIND] and config[PLACEMENT_KIND] of the contiguous (Orca) manager
RESERVE_MAX, RESERVE_POW2, RESERVE_ORACLE, RESERVE_PREDICTED = 0, 1, 2, 3
BUDDY, FIRST_FIT, BEST_FIT = 0, 1, 2
# columns of Core.extent, Core.buddy_orders and Core.holes
EXTENT_START, EXTENT_RESERVED, EXTENT_PLACED = 0, 1, 2
EXTENT_PROMPT, EXTENT_COLUMNS = 3, 5  # the tokens it held at admission (P of a re-reservation)
EXTENT_JOINED = 4  # when it joined the decode set (a count): re-reservations go in this order
ORDER_ROW, ORDER_FREE, ORDER_FIRST_WORD = 0, 1, 2
HOLE_START, HOLE_SIZE = 0, 1
# config[SCHEDULER_KIND]: iteration-level (continuous: vLLM, Orca) or request-level (static);
# V1: vLLM v1's one token budget over running then waiting requests (sim/core/scheduler_v1.py)
CONTINUOUS, STATIC, V1 = 0, 1, 2
SGLANG = 3  # SGLang's prefill-first scheduler over a radix cache (sim/core/scheduler_sglang.py)
RADIX = 2  # config[MANAGER_KIND] of --system sglang: the radix cache's token pool (sim/core/radix_cache.py)
FCFS, LPM = 0, 1  # config[SCHEDULE_POLICY] (sglang): first come first served, longest prefix match
# config[SCHEDULING_POLICY] (vLLM's --scheduling-policy): the waiting queue's order and the victim of a
# preemption (sim/core/policies.py): by arrival, the latest admitted preempted; or by (priority, arrival)
POLICY_FCFS, POLICY_PRIORITY = 0, 1
# columns of Core.radix_nodes (a tree node: a run of tokens [START, END) of every path through it,
# named by the tokens of request OWNER; free nodes have PARENT -2) and of Core.radix_request
(NODE_PARENT, NODE_FIRST_CHILD, NODE_NEXT_SIBLING, NODE_PREV_SIBLING, NODE_START, NODE_END, NODE_OWNER,
 NODE_LOCK_REF, NODE_LAST_ACCESS, NODE_COLUMNS) = range(10)
LOCKED_NODE, PREFIX_LEN, MATCH_LEN, MATCH_NODE, EXTEND_LEN, RADIX_REQUEST_COLUMNS = range(6)

# what blocked the waiting queue's head (it is not retried until something is freed)
NOT_BLOCKED, BLOCKED_ON_MEMORY, BLOCKED_ON_MAX_SEQS = 0, 1, 2

# step-table columns: two floats (start_s, dt_s) and thirteen ints per iteration
ROW_FLOATS = 2
ROW_INTS = 13  # batch, prefill tokens, decode seqs, waiting, running, 6 memory categories, blocks, logical


class Core(NamedTuple):
    config: np.ndarray
    count: np.ndarray
    clock: np.ndarray
    cost: np.ndarray  # the cost model's constants (sim.core.cost, cost_calibrated, cost_table); then the scale
    # requests (RequestTable columns, written in place)
    arrival_s: np.ndarray
    priority: np.ndarray  # the trace's priority column (lower served first; 0 without one)
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    status: np.ndarray
    reject_code: np.ndarray
    num_generated: np.ndarray
    num_prompt_computed: np.ndarray  # prompt tokens computed since this admission
    prompt_target: np.ndarray  # tokens this admission's prefill computes (prompt + regenerated)
    num_preemptions: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    last_token_s: np.ndarray
    # requests (the core's own)
    num_computed_tokens: np.ndarray  # tokens whose K/V are in the pool
    num_blocks: np.ndarray
    final_len: np.ndarray  # prompt + output: the accounting's F
    in_decode: np.ndarray  # prefill done, generating
    swapped_tokens: np.ndarray
    # queues (rings over request ids) and the running list (admission order)
    waiting: np.ndarray
    swapped: np.ndarray
    running: np.ndarray
    # the block pool and the running slots' block tables
    free_block_ids: np.ndarray
    free_slots: np.ndarray
    block_table: np.ndarray
    # this iteration
    step_prefill_ids: np.ndarray
    step_prefill_tokens: np.ndarray
    step_finished: np.ndarray
    step_memory: np.ndarray  # the six memory categories at the step's start
    # inter-token latency histogram (its edges: sim.core.build.ITL_EDGES)
    itl_edges: np.ndarray
    itl_hist: np.ndarray
    # step table rows
    row_floats: np.ndarray
    row_ints: np.ndarray
    # the cost model's arrays beside its constants: the calibrated model's GEMM shapes, the table
    # model's tables (empty for the roofline); each prefilling sequence's context after this step
    cost_data: np.ndarray
    step_prefill_context: np.ndarray
    # the contiguous manager (sim/core/extent.py): each request's extent, (start, R the
    # reservation asked, A >= R placed), and its placement (sim/core/placement.py): the
    # buddy's free blocks, one bit per aligned block of each order (32 bits a word), per order
    # (its first word, free blocks, first word that may hold one), and the fit holes by address.
    # Few arrays: every call of a compiled function passes each array of the state
    extent: np.ndarray
    buddy_bits: np.ndarray
    buddy_orders: np.ndarray
    holes: np.ndarray
    # prefix caching (sim/core/prefix_cache.py; one-element arrays without it)
    block_info: np.ndarray  # [block, REF..KEY_SLOT]: one row (one cache line) per block
    key_entries: np.ndarray  # [entry, ENTRY_END..ENTRY_BLOCK]: the key -> block map (TABLE_MASK + 1 rows)
    chain_start: np.ndarray  # per request: its prefix chain hashes are chains[chain_start[i]:chain_start[i + 1]]
    chains: np.ndarray
    num_keys: np.ndarray  # per request: its keyable prompt blocks in this admission
    # parallel sampling (n): a request runs width[i] sequences after its prefill, in lockstep
    # (the same tokens and blocks count); sequence j's block-table row is seq_slot[i, j]
    # (no separate column-0 view: in a beam run it would be strided, a second machine-code
    # variant of the whole loop for numba to compile)
    width: np.ndarray
    num_seqs: np.ndarray  # its live sequences: 1 until the fork after its prefill, then width
    seq_slot: np.ndarray
    # beam search (sim/core/beam.py): each request's beam width (1: none), and the run's seeded
    # numpy Generator its beams die and fork by (config[BEAM_SEARCH]: some request has beams)
    beam: np.ndarray
    rng: np.random.Generator
    # the predicted reservation (sim/core/extent.py): each request's standard normal draw z of
    # its length predictor, and room to save the placement in while several re-reservations
    # are tried (empty for the other reservations)
    predictor_draw: np.ndarray
    placement_saved: np.ndarray
    # the step's data movement, recorded where it happens (config[EXTERNAL_STEPS] only; one row
    # elsewhere), reset by the scheduler at each iteration's start: copy-on-write (source,
    # destination) block pairs; the device blocks of each sequence swapped out (request, its
    # sequence, block, in table order, before they are freed) and of each swapped back in
    # (request, sequence, block: the blocks allocated for it). An executor outside the core runs
    # exactly these (gpu/executor.py); host blocks are its business
    step_copies: np.ndarray
    step_swap_out: np.ndarray
    step_swap_in: np.ndarray
    # the radix cache (--system sglang; one row each elsewhere): the tree's nodes (NODE_* columns)
    # and per request: the node it locks, its prefix in the tree, its last match (node and
    # length) and this step's extend length (LOCKED_NODE..EXTEND_LEN)
    radix_nodes: np.ndarray
    radix_request: np.ndarray
