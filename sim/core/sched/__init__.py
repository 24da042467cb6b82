"""Scheduling: each engine's iteration (vLLM v0 and Orca, vLLM v1, SGLang, static batching), what
they share (the queues, admission, preemption's mechanics, a step's end), the scheduling
policies, speculative decoding and beam search."""
