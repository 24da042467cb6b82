"""KV memory: the managers' verbs (``memory.py``) over the paged pool (``kv_cache.py``,
``block_pool.py``, ``prefix_cache.py``), SGLang's radix cache, the host tier, contiguous
extents and their placement, swaps and KV transfers."""
