"""Request traces: load real ones, synthesize the paper's workloads, transform, summarize.

Canonical form
==============

Every loader, generator and transformation in this package returns (and every consumer of a
workload may assume) a :class:`pandas.DataFrame` with one row per request, sorted by arrival:

==================  ===========  ==============================================================
column              dtype        meaning
==================  ===========  ==============================================================
``request_id``      str          unique id; loaders use the 0-based row of the source file
``arrival_s``       float64      seconds from trace start, non-decreasing, finite, >= 0. Real
                                 traces are re-zeroed so their first request arrives at 0;
                                 synthetic ones keep the first inter-arrival gap (> 0)
``prompt_tokens``   int64 >= 1   prompt (prefill) length
``output_tokens``   int64 >= 1   tokens to generate (per sequence)
``n``               int64 >= 1   optional (default 1): parallel samples per request
``beam_width``      int64 >= 1   optional (default 1): beam-search width
``priority``        int64        optional (default 0): vLLM's request priority, lower served
                                 first under ``--scheduling-policy priority`` (vllm-v1)
``prefix_hashes``   object       optional: tuple of ints per row, Mooncake-style prefix block
                                 hashes, one per ``df.attrs['hash_block_tokens']`` (e.g. 512)
                                 prompt tokens; equal ids mean a shareable KV prefix
==================  ===========  ==============================================================

``df.attrs`` may carry ``source`` (file or workload name, used in error messages),
``hash_block_tokens`` and ``load_report`` (what a loader read, dropped and re-sorted; see
:func:`traces.loaders.load_trace`).

Public API (what the simulator, planner and validation commands call), each name from the
module that defines it (the package re-exports none)::

    from pagesim.traces.loaders import load_trace, write_trace
    from pagesim.traces.synth import make_workload
    from pagesim.traces.schema import validate_canonical
    from pagesim.traces.stats import trace_stats
    from pagesim.traces.args import add_workload_args, workload_from_args
    from pagesim.traces.transform import time_slice, scale_rate, sample, set_parallel, apply_max_len_policy

Errors in user input raise :class:`sim.errors.TraceError` naming the file, the 1-based data row
and the field.
"""
