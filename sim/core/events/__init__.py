"""Time: the event loop of one engine, of a cluster of them behind a router, of a disaggregated
pair of pools, and ``replay.py``, which runs a loop to its end from Python."""
