"""The peer workloads, and the per-step record both sides leave (``Step``).

A workload is a pool (``num_blocks`` blocks of ``block_size`` token slots), the batch limits, and
requests (arrival, prompt and output lengths, priority, prefix hashes). ``prompt_token_ids``
gives vLLM prompts whose blocks share tokens exactly where pagesim's hash chains agree.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

STEP_S = 1.0  # every step lasts this long on both sides: time stays simple and exact
TOKEN = 7  # the token the fake GPU samples (the requests ignore EOS: none is ever 'stop')


@dataclass(frozen=True)
class Row:
    arrival_s: float
    prompt: int
    output: int
    priority: int = 0
    hashes: tuple = ()  # one per full block of the prompt's prefix, a chain: block k's key is hashes[:k + 1]


@dataclass
class Workload:
    name: str
    requests: list
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: 8192, or the pool's tokens if fewer (pagesim's bound)
    prefix_caching: bool = False
    policy: str = "fcfs"
    description: str = ""

    def __post_init__(self):
        if self.max_model_len is None:
            self.max_model_len = min(8192, self.num_blocks * self.block_size)

    def prompt_token_ids(self, index: int) -> list[int]:
        """A block's tokens come from its hash chain where the request has one (so two prompts
        share a block exactly when their chains agree up to it), else are this request's own."""
        row = self.requests[index]
        tokens = []
        for k in range(len(row.hashes)):
            chain = random.Random(repr(row.hashes[:k + 1]))
            tokens += [chain.randrange(1, 1 << 30) for _ in range(self.block_size)]
        own = 1 << 31 | index << 20  # above every chain token: never shared
        return (tokens + [own + p for p in range(len(tokens), row.prompt)])[:row.prompt]


@dataclass(frozen=True)
class Step:
    """One step that scheduled tokens: its start, tokens per request (trace index), the requests
    preempted while scheduling it, the free blocks once it is scheduled, and the requests that
    finished with it."""

    start_s: float
    scheduled: dict = field(default_factory=dict)
    preempted: frozenset = frozenset()
    free_blocks: int = 0
    finished: frozenset = frozenset()


def rows(seed: int, n: int, prompt: tuple, output: tuple, spread_s: float = 0.0, priorities: int = 1) -> list:
    """``n`` requests with lengths drawn uniformly from the ranges, arrivals uniform over
    ``spread_s`` (at half steps: an arrival never ties with a step's start), priorities 0..p-1."""
    rng = random.Random(seed)
    drawn = [Row(arrival_s=(rng.randrange(int(spread_s)) + 0.5) if spread_s else 0.0,
                 prompt=rng.randint(*prompt), output=rng.randint(*output), priority=rng.randrange(priorities))
             for _ in range(n)]
    return first_at_zero(sorted(drawn, key=lambda r: r.arrival_s))  # a trace is in arrival order


def first_at_zero(requests: list) -> list:
    """pagesim times a trace from its first arrival (its records start at 0): the first comes at 0."""
    return [dataclasses.replace(requests[0], arrival_s=0.0), *requests[1:]]


def shared_prefix_rows(seed: int, n: int, block_size: int) -> list:
    """Requests over 3 system prompts of 2-6 blocks, each with a few blocks of its own and a
    partial last block: their prefixes share full blocks, never the tail."""
    rng = random.Random(seed)
    systems = [tuple(range(100 * s, 100 * s + rng.randint(2, 6))) for s in range(3)]
    out = []
    for i in range(n):
        system = systems[rng.randrange(3)]
        own = tuple(10_000 + 100 * i + k for k in range(rng.randint(0, 3)))
        hashes = system + own
        prompt = len(hashes) * block_size + rng.randint(1, block_size - 1)
        out.append(Row(arrival_s=i * 2 + 0.5, prompt=prompt, output=rng.randint(2, 12), hashes=hashes))
    return first_at_zero(out)


WORKLOADS = {
    "budget": Workload("budget", [Row(0.0, 10, 3), Row(0.0, 8, 2), Row(0.0, 30, 4), Row(1.5, 5, 6)],
                       num_blocks=256, max_num_batched_tokens=16, max_num_seqs=4,
                       description="a few requests, a budget of 16, a big pool"),
    "preemption": Workload("preemption", rows(1, 20, (16, 200), (8, 120)), num_blocks=48,
                           description="20 requests, 48 blocks of 16: recompute preemption, no prefix caching"),
    "chunked": Workload("chunked", rows(2, 6, (1500, 5000), (4, 40), spread_s=20), num_blocks=1024,
                        max_num_batched_tokens=512,
                        description="prompts of 1.5k-5k tokens chunked by a budget of 512"),
    "prefix": Workload("prefix", shared_prefix_rows(3, 24, 16), num_blocks=512, prefix_caching=True,
                       description="shared prefixes (3 system prompts), no memory pressure"),
    "priority": Workload("priority", rows(4, 20, (16, 200), (8, 120), priorities=4), num_blocks=48,
                         policy="priority", description="priorities 0-3, 48 blocks: preemption, no prefix caching"),
    "priority-arrivals": Workload("priority-arrivals", rows(5, 30, (16, 200), (8, 120), spread_s=60, priorities=4),
                                  num_blocks=48, policy="priority",
                                  description="priorities 0-3, arrivals over 60 steps, 48 blocks"),
    # prefix caching under memory pressure: known divergences (test_vllm_v1_peer.py KNOWN)
    "prefix-own-blocks": Workload("prefix-own-blocks", [Row(0.0, 8, 6), Row(0.0, 8, 6)], num_blocks=5, block_size=4,
                                  prefix_caching=True,
                                  description="B is preempted, then readmitted: vLLM hits B's own cached block"),
    "prefix-lru": Workload("prefix-lru", [Row(0.0, 9, 1, hashes=(1, 2)), Row(1.5, 12, 1), Row(3.5, 12, 1),
                                          Row(5.5, 9, 1, hashes=(1, 2))], num_blocks=6, block_size=4,
                           prefix_caching=True,
                           description="a prefix, 2 unshared prompts, the prefix again: which blocks are evicted"),
    "prefix-pressure": Workload("prefix-pressure", rows(1, 20, (16, 200), (8, 120)), num_blocks=48,
                                prefix_caching=True, description="the preemption workload with prefix caching on"),
}
