"""The simulation core: the scheduler's policy, the paged manager and time, stated once as
plain functions over numpy arrays, compiled by numba where it is installed and run as the
same CPython functions otherwise (``sim/core/jit.py``).

    state.py        the run's arrays and their named indices
    block_pool.py   free block ids and the running slots' block tables
    prefix_cache.py prefix caching: the key -> block map, reference counts, the LRU of cached blocks
    kv_cache.py     the paged manager: admission checks, allocation, decode slots, accounting
    scheduler.py    vLLM's policy: swap-in, FCFS admission, prefill-first or chunked, preemption
    cost.py         the roofline's price of an iteration (sim.cost's model calls it too)
    loop.py         time: the next arrival or the end of the running step
    replay.py       the glue: which runs it covers, arrays in, records out

It covers the continuous scheduler with the paged manager (vllm, token; any block size),
prefill-first or chunked, preemption by recompute or swap, prefix caching,
``waiting_served_ratio``, parallel sampling (``n``: fork, copy-on-write), the roofline cost
model. Beam search and every other configuration run on the Python engine
(``sim/engine.py``), which the core will replace system by system.
"""
