"""The simulation core: the scheduler's policy, every memory manager and time, stated once as
plain functions over numpy arrays, compiled by numba where it is installed and run as the
same CPython functions otherwise (``sim/core/compile/jit.py``).

At the root, what every room reads or what reads every room:

    state.py        the run's arrays, and tables of the names that index them (constants made from them;
                    a feature's own in its file)
    build.py        a configuration's policy as the core's numbers and flags, its arrays before the run
    check.py        --check: every incremental quantity recomputed from scratch
    outcome.py      what a run left, in words and counters: reject reasons, the manager's events

sched/ (the rules of scheduling):

    lifecycle.py    what every scheduler shares: the queues, admission, preemption's mechanics,
                    a step's end
    policies.py     the scheduling policies' interface: where a request waits, which running
                    request a preemption takes; one file a policy (policy_fcfs.py, inlined;
                    policy_priority.py, policy_sjf.py, compiled apart), one line in
                    sim.systems.SCHEDULING_POLICIES
    scheduler_vllm.py   vLLM v0's iteration: swap-in, admission, prefill-first or chunked, preemption
                        (compiled once per manager: two families, paged and contiguous)
    scheduler_orca.py   what the contiguous manager changes in it (Orca)
    scheduler_v1.py     vLLM v1's: one token budget, running then waiting (--system vllm-v1)
    scheduler_sglang.py SGLang's: prefill-first adder, retraction (--system sglang)
    static.py       request-level (static) batching: padded batches in fixed slots
    speculative.py  vLLM v1's speculative decoding: drafts per decode, lookahead slots, acceptance,
                    the speculative slack (--num-speculative-tokens)
    beam.py         beam search's deaths and forks, as a real beam search's record has them

kv/ (the rules of KV memory):

    memory.py       the manager the config names: the scheduler's memory verbs dispatched
    block_pool.py   free block ids and the running slots' block tables
    prefix_cache.py prefix caching: the key -> block map, reference counts, the LRU of cached blocks
    kv_cache.py     the paged manager: admission checks, allocation, decode slots, accounting
    extent.py       the contiguous (Orca) manager: reservations (max, pow2, oracle, predicted), accounting
    placement.py    where its extents go: buddy, first-fit, best-fit
    radix_cache.py  SGLang's radix tree over a token pool (--system sglang), and its host tier
                    (HiCache, --kv-offload-gib)
    host_tier.py    vLLM v1's CPU offload tier: the host blocks' LRU, stores, loads (--kv-offload-gib)
    transfer.py     KV transfers from a prefill to a decode replica: bytes as whole blocks, a link's queue
    remote_kv.py    the blocks a KV transfer holds on both sides (in transfer), a loaded prompt's own

events/ (time):

    loop.py         the next arrival or the end of the running step
    cluster.py      replicas behind a router: the loop of each, the router's choice at each arrival
    disagg.py       two pools (prefill, decode) in one loop: handoffs, transfers, the earliest event
    replay.py       runs the loop to its end: progress, --check, an executor outside the core

price/ (what a step costs):

    cost.py         the roofline's price of an iteration (sim.cost.roofline's model calls it
                    too), and the scale of any model's GPU time (sim.cost.models.ScaledCostModel's)
    cost_calibrated.py  the calibrated roofline's price (sim.cost.calibrated's model calls it)
    cost_table.py   a measured profile, interpolated (sim.cost.roofline.TableCostModel calls it)

compile/ (how the core is compiled; none of the rules):

    jit.py, aot.py  numba, loaded when first needed; the loop as an extension module (runs need no numba)
    families.py     the scheduler families, each with its own loop, and the files only each compiles
    numba_patches.py what the core changes in numba as it loads: a cold compile's work trimmed
    by_reference.py the state passed by reference to what compiled code calls by address

It covers the continuous scheduler with the paged manager (vllm, token, vattention; any block
size) or the contiguous one (orca-max, orca-pow2, orca-oracle, --reservation predicted; buddy,
first-fit or best-fit), and static batching (``--system static``); prefill-first or chunked,
preemption by recompute or swap, FCFS or priority scheduling, prefix caching,
``waiting_served_ratio``, parallel sampling (``n``: fork, copy-on-write), beam search, and every
cost model (roofline, calibrated, a measured profile; scaled or not).
"""
