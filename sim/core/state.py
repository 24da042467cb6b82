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
  counters) and ``clock`` (float64 times and sums).

The entries of ``config``, ``count`` and ``clock`` and the columns of the 2-D arrays are
declared once, in tables (:func:`table`: a line per name, with what it holds); each name becomes
the constant that indexes it (``count[NUM_RUNNING]``), numbered in the table's order, and each
table's size a constant too (``NUM_COUNTS``). A new counter is one line in its table. numba reads
the constants as it compiles, as literals. This file declares what the core and several files
share; an entry one feature alone uses is declared in that feature's file, in a table of its own
(``table(..., into=globals())``) or in its room of a shared table (:func:`section`).
"""

from __future__ import annotations

import re
import textwrap
from typing import NamedTuple

import numpy as np

class Field(NamedTuple):
    """One named index of a table below: ``width`` consecutive entries from ``index``, declared by
    ``owner`` (this module, or a feature's: its module under sim.core)."""
    name: str
    index: int
    width: int
    meaning: str
    owner: str = "state"


#: each table's fields in order, by the table's name: the state's layout, stated once (its
#: index constants are made from it; ``tests/sim/core/test_state_layout.py`` reads it). A table
#: that one feature alone uses is declared in that feature's file; so is a feature's part of a
#: table the core and several features share (its room: :func:`section`)
TABLES: dict[str, tuple[Field, ...]] = {}
#: each shared table's rooms: by owner (its module under sim.core), where its room starts and its
#: entries at most
ROOMS: dict[str, dict[str, tuple[int, int]]] = {}
#: each table's size: its entries, or its row's columns (the ``size`` constant's value)
SIZES: dict[str, int] = {}


def _fields(name: str, text: str, start: int, owner: str) -> list[Field]:
    """Read ``text``, one field a line: ``NAME`` or ``NAME[width]``, then what it holds (a
    deeper-indented line goes on the meaning above it), numbered from ``start``, declared by
    ``owner``."""
    fields: list[Field] = []
    index = start
    for line in textwrap.dedent(text).strip("\n").splitlines():
        if line.startswith(" "):  # more of the meaning above
            fields[-1] = fields[-1]._replace(meaning=fields[-1].meaning + " " + line.strip())
            continue
        head, _, meaning = line.partition(" ")
        match = re.fullmatch(r"([A-Z][A-Z0-9_]*)(?:\[(\d+)\])?", head)
        if match is None:
            raise ValueError(f"state table {name}: {line!r} does not start with NAME or NAME[width]")
        width = int(match[2] or 1)
        fields.append(Field(match[1], index, width, meaning.strip(), owner))
        index += width
    return fields


def _make(name: str, fields: list[Field], made: dict[str, int], into: dict) -> None:
    """Put the constants ``made`` in the module ``into`` and the fields in TABLES; a name a table
    or that module has already taken is an error (a constant made twice would index two things)."""
    names = [f.name for f in fields] + [n for n in made if n not in {f.name for f in fields}]
    tabled = {f.name for fields in TABLES.values() for f in fields}
    taken = sorted({n for n in names if n in into or n in tabled or n in globals() or names.count(n) > 1})
    if taken:
        raise ValueError(f"state table {name}: {', '.join(taken)} named twice")
    into.update(made)
    TABLES[name] = tuple(sorted(TABLES.get(name, ()) + tuple(fields), key=lambda f: f.index))


def table(name: str, text: str, size: str, columns: int = 0, rooms: dict[str, int] | None = None,
          into: dict | None = None) -> int:
    """Declare table ``name`` (:func:`_fields`' lines). Each ``NAME`` becomes a constant, its
    index, in the order of the lines; so does ``size``, the entries of them all (``columns`` when
    given: a row padded to a cache line). The constants go in this module, or in ``into``, the
    globals of the one file that uses the table. ``rooms``: after these fields, the entries each
    feature (a module under sim.core) declares in its own file (:func:`section`), at most so many.
    A room's place is fixed here, whichever file a process imports first: numba compiles indices
    in as literals, and a compiled module outlives the process that compiled it."""
    fields = _fields(name, text, 0, "state" if into is None else _owner(into))
    end = fields[-1].index + fields[-1].width if fields else 0
    for owner, entries in (rooms or {}).items():
        ROOMS.setdefault(name, {})[owner] = (end, entries)
        end += entries
    if columns and columns < end:
        raise ValueError(f"state table {name}: {end} entries do not fit in {columns} columns")
    made = {f.name: f.index for f in fields} | {size: columns or end}
    _make(name, fields, made, globals() if into is None else into)
    SIZES[name] = made[size]
    return made[size]


def _owner(module_globals: dict) -> str:
    """The module under sim.core whose globals these are (``kv.host_tier``)."""
    return module_globals["__name__"].removeprefix("pagesim.").removeprefix("sim.core.")


def section(name: str, into: dict, text: str) -> None:
    """Declare a feature's entries of the shared table ``name`` (:func:`_fields`' lines) in its
    room, from the file that owns them: ``into`` is that file's globals, where their constants
    go. A feature with no room, or more entries than its room holds, is an error."""
    owner = _owner(into)
    if owner not in ROOMS.get(name, {}):
        raise ValueError(f"state table {name}: no room for {owner} (sim/core/state.py: its rooms)")
    start, entries = ROOMS[name][owner]
    fields = _fields(name, text, start, owner)
    used = sum(f.width for f in fields)
    if used > entries:
        raise ValueError(f"state table {name}: {owner}'s {used} entries do not fit in its room of "
                         f"{entries} (sim/core/state.py: its rooms)")
    _make(name, fields, {f.name: f.index for f in fields}, into)


# request status: the values of sim.requests.Status
PENDING, WAITING, RUNNING, SWAPPED, FINISHED, REJECTED = 0, 1, 2, 3, 4, 5
# why a request was rejected (sim.core.outcome puts each in words for the request table)
REJECT_OVER_BATCHED_TOKENS, REJECT_NEVER_FITS, REJECT_TOO_WIDE = 1, 2, 3
REJECT_WIDTH_UNSHARED = 4  # n / beam_width > 1 on a manager whose forks cannot share blocks
REJECT_CLIENT_TIMEOUT = 5  # its client gave up waiting (--client-timeout): the engine aborted it
# a decode replica's request whose blocks are allocated and whose prompt KV is on the wire
# (vLLM's WAITING_FOR_REMOTE_KVS: sim/core/kv/remote_kv.py)
LOADING = 6
# the KV slots' categories, in sim.metrics.MEMORY_CATEGORIES' order: the six of every manager,
# speculative decoding's slack (SPECULATIVE_SLACK: sim/core/sched/speculative.py), then the blocks held
# by in-flight KV transfers (IN_TRANSFER: sim/core/kv/remote_kv.py), a category of disaggregated
# runs only (sim.metrics.DISAGG_MEMORY_CATEGORIES)
MEMORY_CATEGORIES = 8
SPECULATIVE_SLACK, IN_TRANSFER = 6, 7
# config[DISAGG_ROLE]: a replica of a disaggregated cluster (sim/core/events/disagg.py), or neither
NOT_DISAGGREGATED, PREFILL_SIDE, DECODE_SIDE = 0, 1, 2

# Core.config: int64, the policy as data (read only; sim/core/build.py writes it)
table("config", """
    NUM_REQUESTS        the trace's requests
    BLOCK_SIZE          tokens a KV block holds
    NUM_BLOCKS          the pool's blocks
    LEFTOVER_SLOTS      token slots of the KV memory too few to make a block
    WATERMARK_BLOCKS    free blocks an admission must leave (vLLM v0's watermark)
    MAX_SEQ_LEN         the longest sequence the engine takes (prompt + output)
    MAX_NUM_SEQS        the most sequences running at once
    MAX_BATCHED_TOKENS  the tokens one iteration may compute
    KEEP_ROWS           1: write a step-table row per iteration
    PROGRESS_EVERY      the loop returns PROGRESS after this many more finished requests
    CHUNK_BUDGET        the prefill tokens of a chunk (sglang: of a step)
    SWAP_CAPACITY_TOKENS  the host swap space, in tokens
    MANAGER_KIND        which manager the memory verbs go to (PAGED, CONTIGUOUS, RADIX)
    CAPACITY            the KV memory's token slots (the categories sum to it)
    PREFIX_CACHING      1: full prompt blocks are cached by their prefix's hash
    HASH_BLOCK_TOKENS   the tokens a prefix key covers
    SCHEDULER_KIND      the scheduler family (CONTINUOUS, CONTINUOUS_CONTIGUOUS, STATIC, V1, SGLANG)
    FAMILY_TRAITS       what the family does, one bit each (sim/core/compile/families.py TRAITS)
    SCHEDULER_ADDRESS   compiled, the address of the family's scheduler (loop.call_scheduler; 0: none given)
    STATE_ADDRESS       compiled, the address of the running loop's copy of the state, which the
        functions it calls by address read (sim/core/compile/by_reference.py; 0: no loop running)
    LAZY_ADDRESSES[64]  compiled, the addresses of the functions compiled apart (jit.njit's
        ``lazy``), a slot each, numbered by name (jit.fix_lazy_slots; 0: not compiled for this run)
    SHARED_BLOCKS       1: blocks carry reference counts (prefix caching, forks)
    CHECK_STEPS         1 under --check: the loop returns after every iteration (sim/core/check.py)
    EXTERNAL_STEPS      1 when an executor outside the core runs the steps (the GPU mode): the
        loop returns SCHEDULED after scheduling an iteration, Python puts its duration in
        clock[STEP_S], and the core records the step's data movement (Core.step_copies,
        step_swap_out, step_swap_in) as it acts
    ROUTED              1: a cluster's replica, whose router hands it its arrivals
    ASYNC_SCHEDULING    1: vLLM v1 schedules the next step while this one runs
    SCHEDULING_POLICY   vLLM's --scheduling-policy, its place in sim.systems.SCHEDULING_POLICIES
        (POLICY_FCFS the first): the waiting order and the victim of a preemption
        (sim/core/sched/policies.py)
    SPEC_TOKENS         vLLM v1 speculative decoding: the drafts a decoding request verifies per
        step (num_speculative_tokens; 0: off; sim/core/sched/speculative.py)
    SPEC_LOOKAHEAD      the slots allocated past a request's scheduled tokens for its drafter
        (vLLM's num_lookahead_tokens)
    SPEC_DRAFT_SLOTS    the input slots each scheduled request takes from the budget beyond its
        tokens (vLLM's max_num_new_slots_for_drafting)
    FULL_GROUPS         vLLM v1's full-attention KV cache groups beside SLIDING_GROUPS
        (sim/specs/kv_groups.py; both 0: one group, the plain pool). Each group has its own
        block table: columns [g * M, (g + 1) * M) of Core.block_table, M its width / groups,
        the full groups first
    SLIDING_GROUPS      the sliding-window groups, which free the blocks out of their window
        (kv_cache.remove_skipped)
    SLIDING_WINDOW      their window, in tokens
    STATE_GROUPS        vLLM v1's Mamba / linear-attention groups, after the attention groups: a
        request holds one block of each from its first allocation to its end (its state);
        column g * M of Core.block_table
    STATE_SLOTS         the slots of such a block its state fills (the rest pads it to the page:
        internal fragmentation; kv_cache.memory_categories)
    MAMBA_ALIGN         1: prefix caching over STATE_GROUPS, vLLM's "align" mode
        (docs/notes/mamba-align.md; model_executor/models/config.py:760-777): a state group's
        table is position-indexed like an attention group's (column j: the state after (j + 1)
        blocks, most columns null), a request holds its state block and, for the step after it
        crosses a block, the one it was copied from (kv_cache.take_state_block,
        kv_cache.remove_skipped_states); prompt chunks are cut at blocks
        (scheduler_v1.mamba_aligned_split)
    DISAGG_ROLE         a disaggregated cluster's prefill or decode replica (PREFILL_SIDE,
        DECODE_SIDE), else NOT_DISAGGREGATED (sim/core/events/disagg.py)
    HOST_BLOCKS         vLLM v1's CPU offload tier (--kv-offload-gib; sim/core/kv/host_tier.py): the host
        memory's blocks (0: no tier)
    HICACHE_HOST_PAGES  sglang's host tier (HiCache L2, --kv-offload-gib; sim/core/kv/radix_cache.py): the
        host pool's pages (0: no host tier)
""", size="NUM_CONFIG",
      rooms={"kv.prefix_cache": 4, "sched.scheduler_vllm": 8, "sched.lifecycle": 4,
             "events.loop": 4, "kv.extent": 4, "kv.placement": 4, "sched.static": 4,
             "sched.beam": 4, "sched.scheduler_v1": 4, "sched.scheduler_sglang": 4,
             "kv.kv_cache": 4, "kv.host_tier": 4, "kv.radix_cache": 4})

# Core.count: int64 counters
table("count", """
    COMPUTED_SLOTS      token slots holding computed K/V (the token-state category)
    DEMAND_SLOTS        token slots the running requests need now
    LOGICAL_BLOCKS      the block tables' lengths: more than the blocks allocated when blocks are shared
    NUM_ALLOCATIONS     allocations by the manager
    NUM_FREES           frees by the manager
    NUM_FREE_BLOCK_IDS  the free block stack's height (Core.free_block_ids)
    NUM_FREE_SLOTS      the free running slots (Core.free_slots)
    NUM_RUNNING         requests running
    DECODE_SET_SIZE     running requests past their prefill
    WAITING_HEAD        the waiting ring's head (Core.waiting)
    WAITING_LEN         requests waiting
    SWAPPED_HEAD        the swapped ring's head (Core.swapped)
    SWAPPED_LEN         requests swapped out
    SWAP_USED_TOKENS    the swap space's tokens in use
    NUM_SWAP_FALLBACKS  swap preemptions that recomputed instead (no space left, or mid-prefill)
    FREE_EPOCH          bumped at each free: a waiting head blocked on memory may fit now
    DEMAND_WAITING      1: the memory categories count the waiting head's demand
    NUM_PREEMPTIONS     preemptions
    NUM_REJECTED        requests rejected
    NUM_FINISHED        requests finished
    NUM_FINISHED_REPORTED  NUM_FINISHED when the loop last returned PROGRESS
    STEP_PREFILL_SEQS   this iteration's prefilling sequences
    STEP_PREFILL_TOKENS  this iteration's prefill tokens
    STEP_DECODE_SEQS    this iteration's decoding sequences
    STEP_SWAP_IN        this iteration's blocks swapped in
    STEP_SWAP_OUT       this iteration's blocks swapped out
    NUM_ROWS            iterations recorded (step-table rows)
    ITL_COUNT           inter-token latencies counted (clock[ITL_SUM] is their sum)
    NEXT_EVENT_ID       the next event's id: events at the same time run in the order made
    ENGINE_PENDING      1: an engine event (a step's end or a wake-up) is scheduled
    ENGINE_EVENT_ID     its id
    ARRIVALS_DONE       1: every request has arrived
    STARTED             1: the loop has begun
    NUM_LRU             prefix caching: cached blocks no running request holds
    NUM_EVICTIONS       cached blocks (sglang: tree leaves) evicted
    PREFIX_HIT_TOKENS   prompt tokens found cached
    PREFIX_LOOKUP_TOKENS  prompt tokens looked up
    NUM_CACHED_KEYS     prefix keys held
    SCHEDULED_STEPS     vLLM 0.4.2 with prefix caching: the steps scheduled so far (the clock of
        its blocks' last access, Core.last_scheduled_step, block_info ACCESS_STEP); vLLM v1 under
        MAMBA_ALIGN: the same count (block_info STATE_CACHED_STEP)
    STEPS_WITHOUT_TOKEN  iterations in a row that gave no request a token (a stall is ended)
    NUM_RUNNING_SEQS    sequences the running requests run or will run once forked (width each)
    NUM_FORKS           forks made (parallel sampling, beams)
    NUM_COW_COPIES      copy-on-write block copies
    STEP_COPIED_BLOCKS  this iteration's rows of Core.step_copies
    NUM_OVERFLOWS       the contiguous manager: requests that outgrew their reservation
    NUM_GROWS_IN_PLACE  reservations grown where they lie
    NUM_MOVES           reservations moved to grow
    STEP_SWAP_OUT_BLOCKS  this iteration's rows of Core.step_swap_out (under EXTERNAL_STEPS)
    STEP_SWAP_IN_BLOCKS  this iteration's rows of Core.step_swap_in
    STEP_NUM_FINISHED   the requests the last completed step finished (Core.step_finished[:n])
    STEP_SWAP_OUT_EARLY  the rows of step_swap_out made by an iteration's first scheduling pass
        when it had to take a second (scheduler_vllm.schedule): they come before the second
        pass's swap-ins, which may take their blocks
    SCHEDULE_ON_RESUME  1 when the loop returned PROGRESS as a step ended, before the next
        iteration was scheduled (sim/core/events/loop.py): the next call schedules it first
    HORIZON_EVENT_ID    a replica: the event id of the cluster's next arrival (clock[HORIZON_S])
    HOST_USED           the host tier's blocks holding a key (its occupancy)
    HOST_HIT_TOKENS     prompt tokens found in the host tier past the GPU's hits
    HOST_LOADED_BLOCKS  blocks loaded host -> GPU
    HOST_STORED_BLOCKS  blocks stored GPU -> host
    HOST_EVICTIONS      host blocks evicted for a store
    TRANSFER_SLOTS      disaggregated: the slots of the blocks held by in-flight KV transfers
        (sim/core/kv/remote_kv.py)
    KV_HOLDING_WAITING  the waiting queue's first places: its requests holding KV blocks while
        a connector loads them, or loaded (a transfer's, a host load's: lifecycle.hold_waiting)
    NUM_EXCHANGE        disaggregated: the requests in Core.exchange for the cluster's loop
""", size="NUM_COUNTS",
      rooms={"sched.scheduler_vllm": 8, "events.loop": 8, "kv.extent": 4, "kv.placement": 4,
             "kv.prefix_cache": 4, "kv.kv_cache": 8, "sched.static": 4,
             "sched.scheduler_sglang": 8, "kv.radix_cache": 12, "sched.speculative": 8,
             "kv.host_tier": 12})

# Core.clock: float64 times and time-weighted sums, then the policy's floats (read only)
table("clock", f"""
    NOW                 the simulated time
    ENGINE_TIME         the scheduled engine event's time
    IDLE_S              seconds idle
    BUSY_S              seconds running iterations
    END_S               when the run ended
    ITL_SUM             the inter-token latencies' sum
    RUNNING_WEIGHTED    running requests x seconds
    MEM_SUM[{MEMORY_CATEGORIES}]          the memory categories' slot-seconds, in sim.metrics' order
    BLOCKS_SUM          allocated blocks x seconds
    LOGICAL_SUM         the block tables' blocks x seconds
    PREDICTOR_ERROR     the predicted reservation's relative error
    STEP_S              EXTERNAL_STEPS: the duration of the iteration just scheduled, as its
        executor measured it
    HORIZON_S           a replica: the time of the cluster's next arrival
    HOST_BLOCK_S        the host tier: the seconds one block takes over the host link, either way
    LOAD_LINK_FREE_S    when the link's host -> GPU direction has moved every load queued on it
    STORE_LINK_FREE_S   when its GPU -> host direction has moved every store queued on it
""", size="NUM_CLOCK",
      rooms={"events.loop": 4, "sched.scheduler_vllm": 4,
             "sched.scheduler_sglang": 8, "sched.scheduler_v1": 4, "kv.kv_cache": 8})

# Core.block_info (prefix caching): a block's row, sixteen int32, one cache line (int64 rows, two
# lines, left the Mooncake v0 prefix-caching engine ~4 % slower). Every value is a block or key row,
# a token count, a step or a run number; runs number at most the blocks let go, under 2^31 for any
# trace below ~4 M requests of 500 blocks
table("block_info", """
    REF                 the running requests holding it
    KEY_END             its key's end token (0: no key)
    COMPUTED            vLLM 0.4.2: a later prompt that hits it need not compute it (marked one
        full block behind a scheduled sequence: kv_cache.mark_computed)
    ACCESS_STEP         vLLM 0.4.2: the last step a request holding it was scheduled in
        (count[SCHEDULED_STEPS]), brought up to date as each holder lets it go: its evictor's order
    HASHED_TOKENS       vLLM 0.4.2: the tokens up to its end in the table that let it go last: its
        evictor takes the deepest of the least recently accessed
    RUN                 vLLM 0.4.2: the run of blocks it was let go with, one after another in the
        LRU list, of one last access and deeper first (count[EVICTOR_RUNS] then): the evictor's scan
        passes a run at its first block (prefix_cache.evict_oldest)
    RUN_LAST            vLLM 0.4.2: the last block of its run when it was let go (found again by the
        scan once that one has left the list)
    TRANSFERS           disaggregated: the in-flight KV transfers holding it (of REF); held by
        them alone, its slots are in transfer (sim/core/kv/remote_kv.py)
""", size="BLOCK_INFO_COLUMNS", columns=16, rooms={"kv.prefix_cache": 5})
# Core.window: per request, its sliding-window groups' state (SLIDING_GROUPS; one row elsewhere)
table("window", """
    WINDOW_JUNCTION     prefix caching: its shared-prefix boundary (tokens) found at its admission's
        lookup, the full groups' hit where longer than the sliding ones' (0: none;
        kv_cache_manager.py:319-325): its sliding groups cache the blocks before it too (its
        state groups the state there: MAMBA_ALIGN)
""", size="WINDOW_COLUMNS", rooms={"kv.kv_cache": 4})
# Core.radix_request: per request
table("radix_request", """
    LOCKED_NODE         the node it locks
    PREFIX_LEN          its prefix in the tree
""", size="RADIX_REQUEST_COLUMNS", rooms={"sched.scheduler_sglang": 3, "kv.radix_cache": 2})
# Core.host_work (the host tier), a row each: its LRU's min-heap of the request groups (by their
# numbers), and room for host_tier.evict's work (a compiled loop allocates no array) and the ring
# of blocks being stored
table("host_work", """
""", size="HOST_WORK_COLUMNS", rooms={"kv.host_tier": 5, "kv.radix_cache": 3})
# Core.row_floats and Core.row_ints: an iteration's row of the step table (sim.metrics.STEP_COLUMNS)
table("row_floats", """
    ROW_START           when it started
    ROW_DT              how long it took
""", size="ROW_FLOATS")
table("row_ints", f"""
    ROW_BATCH           its sequences
    ROW_PREFILL_TOKENS  its prefill tokens
    ROW_DECODE_SEQS     its decode tokens: a token per decoding sequence and the drafts they verify
    ROW_QUEUED          requests waiting or swapped out
    ROW_RUNNING         requests running
    ROW_MEMORY[{MEMORY_CATEGORIES}]       the memory categories at its start
    ROW_USED_BLOCKS     blocks allocated
    ROW_LOGICAL_BLOCKS  the block tables' blocks
""", size="ROW_INTS")

# config[COST_MODEL]: which step price the loop calls (sim.core.cost, cost_calibrated, cost_table)
ROOFLINE, CALIBRATED, TABLE = 0, 1, 2

# config[MANAGER_KIND]: which manager the scheduler's memory verbs go to (sim/core/kv/memory.py)
PAGED, CONTIGUOUS = 0, 1
RADIX = 2  # --system sglang: the radix cache's token pool (sim/core/kv/radix_cache.py)
# config[RESERVATION_KIND] and config[PLACEMENT_KIND] of the contiguous (Orca) manager
RESERVE_MAX, RESERVE_POW2, RESERVE_ORACLE, RESERVE_PREDICTED = 0, 1, 2, 3
BUDDY, FIRST_FIT, BEST_FIT = 0, 1, 2
# config[SCHEDULER_KIND]: iteration-level (continuous: vLLM, Orca) or request-level (static);
# V1: vLLM v1's one token budget over running then waiting requests (sim/core/sched/scheduler_v1.py)
CONTINUOUS, STATIC, V1 = 0, 1, 2
SGLANG = 3  # SGLang's prefill-first scheduler over a radix cache (sim/core/sched/scheduler_sglang.py)
# vLLM v0's and Orca's scheduler over contiguous extents: CONTINUOUS is the same scheduler over
# paged memory; each a family, a loop, of its own (sim/core/compile/families.py)
CONTINUOUS_CONTIGUOUS = 4
FCFS, LPM = 0, 1  # config[SCHEDULE_POLICY] (sglang): first come first served, longest prefix match
# config[SCHEDULING_POLICY] (vLLM's --scheduling-policy): by arrival, the latest admitted
# preempted; or by (priority, arrival)
POLICY_FCFS = 0  # the first of sim.systems.SCHEDULING_POLICIES, inlined (sim/core/sched/policies.py)
# count[BLOCKED_KIND]: what blocked the waiting queue's head (it is not retried until something is freed)
NOT_BLOCKED, BLOCKED_ON_MEMORY, BLOCKED_ON_MAX_SEQS = 0, 1, 2


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
    swapped_tokens: np.ndarray  # (one entry where nothing can be swapped out: sim.core.build)
    # queues (rings over request ids) and the running list (admission order); the running list
    # and this iteration's per-request arrays as long as the most requests that run at once
    # (sim.core.build), the swapped queue one place where nothing can be swapped out
    waiting: np.ndarray
    swapped: np.ndarray
    running: np.ndarray
    running_group: np.ndarray  # scratch beside running: scheduler_vllm.arrival_order's groups (int8)
    # the block pool and the running slots' block tables
    free_block_ids: np.ndarray
    free_slots: np.ndarray
    block_table: np.ndarray
    # this iteration
    step_prefill_ids: np.ndarray
    step_prefill_tokens: np.ndarray
    step_finished: np.ndarray
    step_memory: np.ndarray  # the memory categories at the step's start
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
    # the contiguous manager (sim/core/kv/extent.py): each request's extent, (start, R the
    # reservation asked, A >= R placed), and its placement (sim/core/kv/placement.py): the
    # buddy's free blocks, one bit per aligned block of each order (32 bits a word), per order
    # (its first word, free blocks, first word that may hold one), and the fit holes by address.
    # Few arrays: every call of a compiled function passes each array of the state
    extent: np.ndarray
    buddy_bits: np.ndarray
    buddy_orders: np.ndarray
    holes: np.ndarray
    # prefix caching (sim/core/kv/prefix_cache.py; one-element arrays without it)
    block_info: np.ndarray  # [block, REF..RUN_LAST], int32: one row (one cache line) per block
    key_entries: np.ndarray  # [entry, ENTRY_END..ENTRY_BLOCK]: the key -> block map (TABLE_MASK + 1 rows)
    chain_start: np.ndarray  # per request: its prefix chain hashes are chains[chain_start[i]:chain_start[i + 1]]
    last_scheduled_step: np.ndarray  # per request (vLLM 0.4.2): count[SCHEDULED_STEPS] when it was last scheduled
    chains: np.ndarray
    # parallel sampling (n): a request runs width[i] sequences after its prefill, in lockstep
    # (the same tokens and blocks count); sequence j's block-table row is seq_slot[i, j]
    # (no separate column-0 view: in a beam run it would be strided, a second machine-code
    # variant of the whole loop for numba to compile)
    width: np.ndarray
    num_seqs: np.ndarray  # its live sequences: 1 until the fork after its prefill, then width
    seq_slot: np.ndarray
    # beam search (sim/core/sched/beam.py): each request's beam width (1: none); the lineage records
    # its beams follow (int16: each row a step's parent of each new beam, config[BEAM_STEPS] rows a
    # record, sim/beam_lineage.py) and per request its record's first row (one row each where no
    # request has beams: config[BEAM_SEARCH]); the run's seeded numpy Generator (speculative
    # decoding's draws)
    beam: np.ndarray
    beam_parents: np.ndarray
    beam_row: np.ndarray
    rng: np.random.Generator
    # the predicted reservation (sim/core/kv/extent.py): each request's standard normal draw z of
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
    # speculative decoding (sim/core/sched/speculative.py; one row elsewhere): the chance that draft
    # position j is accepted once those before it were, and per request its speculative
    # high-water mark and drafts this step (SPEC_HIGH, SPEC_DRAFTS)
    spec_acceptance: np.ndarray
    speculative: np.ndarray
    # vLLM v1's CPU offload tier (config[HOST_BLOCKS]; sim/core/kv/host_tier.py; one row each
    # elsewhere): its key map (key_entries' ENTRY_* columns) and blocks (HOST_* columns), its LRU's
    # heap of groups and evict's work (host_work's rows), when each block's store is on the host,
    # per request its OFFLOAD_* columns, and per prompt block of each request (host_seen, from
    # OFFLOAD_SEEN_AT) a bit set once the request has offered or loaded its key (vLLM's seen_keys)
    # and above it, plus one, the host block it last found its key in (host_tier.find); and, per
    # request where a connector loads KV (a host tier, a disaggregated run), when its load ends (a
    # host load's or a transfer's: lifecycle.kv_arrived)
    host_entries: np.ndarray
    host_blocks: np.ndarray
    host_work: np.ndarray
    host_ready_s: np.ndarray
    offload: np.ndarray
    host_seen: np.ndarray
    load_ready_s: np.ndarray
    # vLLM v1's sliding-window KV cache groups (config[SLIDING_GROUPS]): per request, WINDOW_* columns
    window: np.ndarray
    # disaggregated (sim/core/events/disagg.py; one entry elsewhere): per request, when it was first
    # admitted (NaN before); per replica, the requests its last run left for the cluster's loop
    # (count[NUM_EXCHANGE] of them: a prefill replica's finished prefills to hand over, a decode
    # replica's admissions whose transfer is to be priced, or refusals whose blocks to free)
    admitted_s: np.ndarray
    exchange: np.ndarray
