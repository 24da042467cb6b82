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


def sampled_token(index: int) -> int:
    """The token request ``index`` samples, each time: its own, as pagesim keys a request's
    generated blocks as its own (``prefix_cache.own_chain``). One token for all would give two
    identical prompts the same generated blocks, found by each other after a preemption."""
    return 1 << 31 | index << 20 | 1 << 19  # apart from every prompt token (Workload.prompt_token_ids)


@dataclass(frozen=True)
class Row:
    arrival_s: float
    prompt: int
    output: int
    priority: int = 0
    hashes: tuple = ()  # one per full block of the prompt's prefix, a chain: block k's key is hashes[:k + 1]
    n: int = 1  # parallel sampling: sequences of this request (vLLM v0 only)
    beam: int = 1  # beam search: its beams (vLLM v0 only), which follow pagesim's lineage record (vllm_v0.beams)


FULL, SLIDING = "full_attention", "sliding_attention"  # a layer's kind: Hugging Face's layer_types
MAMBA = "mamba"  # a Mamba layer: a recurrent state per request (Layers.mamba_inner, mamba_state)


@dataclass(frozen=True)
class Layers:
    """A model's attention layers, for vLLM v1's KV cache groups: each layer's kind, the sliding
    window (tokens), and the KV heads and head size that size a block (2-byte elements).
    ``preset``: pagesim's model preset of these layers ("": a tiny model of them, ``name``).
    A Mamba layer keeps a conv state of ``mamba_inner`` x 3 and an SSM state of ``mamba_inner`` x
    ``mamba_state`` elements (Mamba-1's shapes at d_conv 4, ``mamba_utils.py:171-183``)."""

    name: str
    kinds: tuple
    window: int
    num_kv_heads: int = 1
    head_size: int = 4
    preset: str = ""
    mamba_inner: int = 0
    mamba_state: int = 0
    # a gated-delta-net layer on FlashInfer's prefill (Qwen3-Next on Hopper): in "align" mode it
    # exports a checkpoint from inside a prefill chunk at this token alignment (0: none, as
    # Mamba-1 and Mamba-2 layers; qwen_gdn_linear_attn.py:690-700, 739-750)
    prefill_checkpoint_alignment: int = 0


def every_nth_full(num_layers: int, n: int) -> tuple:
    """Every ``n``-th layer full attention, the rest sliding (Gemma-2: 2, Gemma-3: 6)."""
    return tuple(FULL if (k + 1) % n == 0 else SLIDING for k in range(num_layers))


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
    # speculative decoding (v1 only): drafts per step (0: off), the drafter (pagesim's
    # --speculative-method: ngram, eagle, mtp, draft-model) and the acceptance rate of its draws
    num_speculative_tokens: int = 0
    speculative_method: str = "ngram"
    spec_acceptance_rate: float = 0.7
    layers: Layers | None = None  # v1: KV cache groups of these layers (None: one full-attention group)
    host_blocks: int = 0  # v1: the CPU offload tier's blocks (vllm_offload.py; 0: none)
    # vLLM v0 (vllm_v0.py) only
    preemption: str = "recompute"
    cpu_blocks: int = 4096  # swap space: ample, vLLM 0.4.2 stops the engine when it runs out
    block_manager: str = "v1"
    chunked_prefill: bool = False  # its budget: max_num_batched_tokens

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
    """One step that scheduled tokens: its start, tokens per request (trace index; a decode, one
    per running sequence), the requests preempted while scheduling it, the free blocks once it
    is scheduled, the requests that finished with it, and those swapped out and in. With
    speculative decoding (v1), ``scheduled`` counts a decode's drafts too, and the record adds
    the drafts each request verifies (``scheduled_spec_decode_tokens``), the blocks each running
    request holds once the step is scheduled, and the drafts each verifying request kept: those
    accepted, less any past its output length (trimmed: scheduler.py:2744-2770)."""

    start_s: float
    scheduled: dict = field(default_factory=dict)
    preempted: frozenset = frozenset()
    free_blocks: int = 0
    finished: frozenset = frozenset()
    swapped_out: frozenset = frozenset()  # of the preempted, those swapped out (vLLM v0)
    swapped_in: frozenset = frozenset()
    drafts: dict = field(default_factory=dict)  # speculative decoding: request -> drafts verified
    blocks: dict = field(default_factory=dict)  # request -> blocks held once scheduled
    kept: dict = field(default_factory=dict)  # request -> of its drafts, those accepted and kept
    # several KV cache groups: running request -> blocks each group holds once the step is
    # scheduled (full-attention groups first; a sliding group's are those in its window)
    group_blocks: dict = field(default_factory=dict)
    # the CPU offload tier (vllm_offload.py): the blocks it holds once the step is scheduled (each
    # named by the first (request, block index) whose prompt has it), the GPU and host hit
    # tokens of each admission looked up since the last record, the blocks in eviction order
    host_blocks: frozenset = frozenset()
    admitted: dict = field(default_factory=dict)
    host_order: tuple = ()
    # prefix caching over several KV cache groups (GROUP_PREFIX_WORKLOADS): each request admitted
    # in the step and its prefix-cache hit tokens, and the blocks cached (registered under a
    # hash) in each group once the step is scheduled, in group_blocks' order
    hits: dict = field(default_factory=dict)
    group_cached: tuple = ()


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



# vLLM v1's KV cache groups (vllm_v1.kv_cache_config_of): layer mixes, each grouped by vLLM's
# kv_cache_planning.py and by pagesim's sim/specs/kv_groups.py; windows that start inside a block
GEMMA2_LIKE = Layers("gemma2-like", every_nth_full(8, 2), window=40)  # 4 + 4: 2 groups of 4 layers
GEMMA3_LIKE = Layers("gemma3-like", every_nth_full(12, 6), window=64)  # 10 + 2: 5 sliding + 1 full of 2
MISTRAL_LIKE = Layers("mistral-like", (SLIDING,) * 4, window=48)  # every layer slides: one group
UNEVEN = Layers("uneven", every_nth_full(24, 2) + (FULL,), window=24)  # 12 + 13 < 1.5 x 12: groups of 13
# Mamba hybrids: a Jamba-like 1 full + 3 Mamba layers (one group each: 3 < 1.5 x 1 fails, size 1);
# the state 8 x (3 + 9) x 2 B = 192 B fits a page of 16 tokens x 16 B (blocks of 16: not raised)
JAMBA_LIKE = Layers("jamba-like", (MAMBA, FULL, MAMBA, MAMBA), window=0, mamba_inner=8, mamba_state=9)
# 2 full + 6 Mamba layers: groups of 2, 1 full + 3 state groups
JAMBA_WIDE = Layers("jamba-wide", (MAMBA, MAMBA, MAMBA, FULL) * 2, window=0, mamba_inner=8, mamba_state=9)
GEMMA2_27B = Layers("gemma-2-27b", every_nth_full(46, 2), window=4096, num_kv_heads=16, head_size=128,
                    preset="gemma-2-27b")


def grouped(name: str, layers: Layers, requests: list, **settings) -> Workload:
    """A workload over ``layers``' groups; its ``max_model_len`` at most the pool's blocks over
    the groups (pagesim refuses a longer one: sim/run.py's budget)."""
    return Workload(name, requests, layers=layers, **settings)


GROUP_WORKLOADS = {
    "gemma2-preemption": grouped("gemma2-preemption", GEMMA2_LIKE, rows(1, 20, (16, 200), (8, 120)), num_blocks=96,
                                 max_num_batched_tokens=64, max_model_len=768,
                                 description="Gemma-2-like (window 40), 96 blocks, a budget of 64: a cap of 8"),
    "gemma2-priority": grouped("gemma2-priority", GEMMA2_LIKE, rows(4, 20, (16, 200), (8, 120), priorities=4),
                               num_blocks=96, max_num_batched_tokens=64, max_model_len=768, policy="priority",
                               description="the same, priorities 0-3"),
    "gemma2-arrivals": grouped("gemma2-arrivals", GEMMA2_LIKE, rows(5, 30, (16, 300), (8, 200), spread_s=60),
                               num_blocks=120, max_num_batched_tokens=128, max_model_len=960,
                               description="Gemma-2-like, 30 requests over 60 steps, a budget of 128"),
    "gemma2-chunked": grouped("gemma2-chunked", GEMMA2_LIKE, rows(2, 6, (1500, 5000), (4, 40), spread_s=20),
                              num_blocks=700, max_num_batched_tokens=256, max_model_len=5600,
                              description="Gemma-2-like, prompts of 1.5k-5k chunked by 256: windows move mid-prompt"),
    "gemma3-pressure": grouped("gemma3-pressure", GEMMA3_LIKE, rows(4, 20, (16, 400), (8, 150)), num_blocks=240,
                               max_num_batched_tokens=128, max_model_len=640,
                               description="Gemma-3-like (window 64): 1 full + 5 sliding groups, 240 blocks"),
    "mistral-long": grouped("mistral-long", MISTRAL_LIKE, rows(6, 16, (100, 600), (50, 300)), num_blocks=64,
                            max_num_batched_tokens=512, max_model_len=1024,
                            description="Mistral-like (window 48): one sliding group, 64 blocks, a cap of 36"),
    "uneven": grouped("uneven", UNEVEN, rows(8, 20, (16, 200), (8, 120)), num_blocks=80, max_num_batched_tokens=64,
                      max_model_len=640,
                      description="13 full + 12 sliding layers (window 24): 2 groups of 13, 80 blocks"),
    "jamba-preemption": grouped("jamba-preemption", JAMBA_LIKE, rows(1, 20, (16, 200), (8, 120)), num_blocks=120,
                                max_num_batched_tokens=64, max_model_len=768,
                                description="1 full + 3 Mamba groups, 120 blocks of 16: preemptions free the states"),
    "jamba-arrivals": grouped("jamba-arrivals", JAMBA_WIDE, rows(5, 30, (16, 300), (8, 200), spread_s=60),
                              num_blocks=150, max_num_batched_tokens=128, max_model_len=960, policy="priority",
                              description="1 full + 3 state groups of 2 layers, 30 arrivals, priorities"),
    "gemma-2-27b": grouped("gemma-2-27b", GEMMA2_27B, rows(7, 12, (3000, 7000), (20, 200), spread_s=20),
                           num_blocks=1500, description="Gemma-2-27B's layers (window 4096), 1500 blocks of 16"),
}


def with_drafts(name: str, workload: Workload, k: int, method: str) -> Workload:
    """``workload`` with ``k`` drafts a step by ``method``, accepted at 0.6."""
    return dataclasses.replace(workload, name=name, num_speculative_tokens=k, speculative_method=method,
                               spec_acceptance_rate=0.6,
                               description=f"{workload.description}; {k} {method} drafts a step")


# speculative decoding over the groups: the drafts' and lookahead slots in every attention group, the
# window freeing below them, a state group's blocks for the drafts' states
GROUP_WORKLOADS.update({name: with_drafts(name, GROUP_WORKLOADS[base], k, method) for name, base, k, method in (
    ("gemma2-spec-eagle", "gemma2-preemption", 3, "eagle"),
    ("gemma3-spec-ngram", "gemma3-pressure", 2, "ngram"),
    ("mistral-spec-draft-model", "mistral-long", 3, "draft-model"),
    # a Mamba group's blocks for the drafts' states (num_speculative_blocks)
    ("jamba-spec-eagle", "jamba-preemption", 2, "eagle"),
    ("jamba-spec-mtp", "jamba-arrivals", 1, "mtp"),
)})


# Mamba hybrids with prefix caching on: vLLM 0.33.0 then keeps Mamba states in "align" mode
# (models/config.py:760-777; vllm_v1.mamba_cache_mode), which pagesim models (the Jamba-like ones;
# the gated-delta-net one it refuses: sim/run.py's hybrid_groups). ``python -m tests.peers.compare
# --mamba-prefix`` compares them (docs/notes/mamba-align.md works the first through by hand).
MAMBA_PREFIX_WORKLOADS = {
    "jamba-prefix-repeat": grouped(
        "jamba-prefix-repeat", JAMBA_LIKE,
        [Row(0.0, 52, 3, hashes=(1, 2, 3)), Row(4.5, 60, 2, hashes=(1, 2, 3))],
        num_blocks=40, max_model_len=160, prefix_caching=True,
        description="B repeats A's 3 blocks: A's prompt splits at 48, B hits A's state at 48"),
    "jamba-prefix-sibling": grouped(
        "jamba-prefix-sibling", JAMBA_LIKE,
        [Row(0.0, 52, 2, hashes=(1, 2, 3)), Row(3.5, 60, 2, hashes=(1, 2, 9)),
         Row(6.5, 60, 2, hashes=(1, 2, 8))],
        num_blocks=40, max_model_len=160, prefix_caching=True,
        description="B shares 2 of A's 3 blocks: no state at 32, B misses and stops there; C hits"),
    "jamba-prefix-same-step": grouped(
        "jamba-prefix-same-step", JAMBA_LIKE,
        [Row(0.0, 40, 2, hashes=(1, 2)), Row(0.0, 40, 2, hashes=(1, 2)), Row(0.5, 70, 20, hashes=(1, 2, 3, 4))],
        num_blocks=40, max_model_len=160, max_num_batched_tokens=20, prefix_caching=True,
        description="chunks of 20 cut to 16; B waits while the budget left is under a block"),
    "jamba-prefix-same-step-hit": grouped(
        "jamba-prefix-same-step-hit", JAMBA_LIKE,
        [Row(0.0, 40, 2, hashes=(1, 2)), Row(0.0, 40, 2, hashes=(1, 2))],
        num_blocks=40, max_model_len=160, max_num_batched_tokens=100, prefix_caching=True,
        description="B's hit on A's state cached in the same step is refused: B runs a step later"),
    # the sibling workload over gated-delta-net layers on FlashInfer (Qwen3-Next on Hopper): a
    # final chunk exports the prompt's boundary state into a reserved block instead of being cut
    # there (its alignment: the Mamba block, as get_mamba_prefill_checkpoint_grid makes it)
    "gdn-prefix-sibling": grouped(
        "gdn-prefix-sibling", dataclasses.replace(JAMBA_LIKE, name="gdn-like", prefill_checkpoint_alignment=16),
        [Row(0.0, 52, 2, hashes=(1, 2, 3)), Row(3.5, 60, 2, hashes=(1, 2, 9)),
         Row(6.5, 60, 2, hashes=(1, 2, 8))],
        num_blocks=40, max_model_len=160, prefix_caching=True,
        description="the sibling workload, gated-delta-net layers exporting checkpoints: no cut at 48"),
    "jamba-prefix-pressure": grouped(
        "jamba-prefix-pressure", JAMBA_WIDE, shared_prefix_rows(3, 24, 16), num_blocks=48,
        max_model_len=192, max_num_batched_tokens=64, prefix_caching=True,
        description="3 system prompts, 24 requests, 48 blocks, a budget of 64: states under pressure"),
}


def system_prompt_rows(seed: int, n: int, block_size: int, blocks: tuple, own: tuple = (0, 3),
                       repeats: float = 0.0, gap: float = 2.0, output: tuple = (2, 12), offset: float = 0.5) -> list:
    """Requests over 3 system prompts of ``blocks`` blocks each, one every ``gap`` steps: each a
    system prompt, ``own`` blocks of its own and a partial last block (shared full blocks, never
    the tail), or, with chance ``repeats``, a block-aligned prompt of the system prompt alone
    (every token in its hash chain: the same prompt again, as a resend of it). The first arrives
    at 0, the ``i``-th at ``i * gap + offset``: ``offset`` keeps arrivals off the steps' starts (a
    tie is ordered by pagesim's events, by vLLM's driver with the step)."""
    rng = random.Random(seed)
    systems = [tuple(range(100 * s, 100 * s + rng.randint(*blocks))) for s in range(3)]
    out = []
    for i in range(n):
        system = systems[rng.randrange(3)]
        if rng.random() < repeats:
            hashes, prompt = system, len(system) * block_size
        else:
            hashes = system + tuple(10_000 + 100 * i + k for k in range(rng.randint(*own)))
            prompt = len(hashes) * block_size + rng.randint(1, block_size - 1)
        out.append(Row(arrival_s=i * gap + offset, prompt=prompt, output=rng.randint(*output), hashes=hashes))
    return first_at_zero(out)


# prefix caching over sliding-window groups (vLLM's default); docs/notes/swa-prefix-caching.md
# states the rules these reach
EXAMPLE_LIKE = Layers("example-like", every_nth_full(2, 2), window=8)  # 1 sliding + 1 full layer
EXAMPLE_ROWS = [Row(0.0, 26, 3, hashes=(1, 2, 3, 4, 5)), Row(5.5, 30, 3, hashes=(1, 2, 3, 4, 5)),
                Row(10.5, 23, 3, hashes=(1, 2, 3, 4, 5)), Row(15.5, 24, 2, hashes=(1, 2, 3, 4, 5, 6)),
                Row(18.5, 24, 2, hashes=(1, 2, 3, 4, 5, 6))]
GROUP_PREFIX_WORKLOADS = {
    "example": grouped("example", EXAMPLE_LIKE, EXAMPLE_ROWS, num_blocks=64, block_size=4, max_model_len=64,
                       prefix_caching=True,
                       description="the note's example: window 8, blocks of 4, a 20-token prefix shared"),
    "gemma2-system": grouped("gemma2-system", GEMMA2_LIKE, system_prompt_rows(11, 24, 16, (4, 8)), num_blocks=240,
                             max_model_len=768, prefix_caching=True,
                             description="Gemma-2-like (window 40), 3 system prompts of 4-8 blocks, 240 blocks"),
    "gemma3-repeats": grouped("gemma3-repeats", GEMMA3_LIKE,
                              system_prompt_rows(12, 24, 16, (5, 9), repeats=0.5), num_blocks=480,
                              max_model_len=640, prefix_caching=True,
                              description="Gemma-3-like (window 64): half the prompts a system prompt again"),
    "mistral-system": grouped("mistral-system", MISTRAL_LIKE,
                              system_prompt_rows(13, 24, 16, (4, 8), repeats=0.3), num_blocks=160,
                              max_model_len=1024, prefix_caching=True,
                              description="Mistral-like (window 48, one group: the Unitary coordinator)"),
    "gemma2-pressure": grouped("gemma2-pressure", GEMMA2_LIKE,
                               system_prompt_rows(14, 24, 16, (3, 6), repeats=0.3, gap=0.5, output=(40, 120),
                                                  offset=0.25),
                               num_blocks=96, max_num_batched_tokens=128, max_model_len=768, prefix_caching=True,
                               description="Gemma-2-like, 96 blocks, long outputs: preemptions, prefixes hit"),
    # layer 0 full: vLLM's full group comes first, the order its requests let blocks go in
    "full-first-pressure": grouped("full-first-pressure", Layers("full-first-like", GEMMA2_LIKE.kinds[::-1], window=40),
                                   system_prompt_rows(14, 24, 16, (3, 6), repeats=0.3, gap=0.5, output=(40, 120),
                                                      offset=0.25),
                                   num_blocks=96, max_num_batched_tokens=128, max_model_len=768, prefix_caching=True,
                                   description="gemma2-pressure over layers whose first is full: the full group first"),
}


def random_grouped_prefix(seed: int) -> Workload:
    """``random_grouped(seed)`` (sliding-window mixes) with prefix caching, each prompt opening with
    one of 3 system prompts of 1-6 blocks (as much of it as its full blocks hold)."""
    workload = random_grouped(seed)
    rng = random.Random(seed + 1000)
    systems = [tuple(range(100 * s, 100 * s + rng.randint(1, 6))) for s in range(3)]
    requests = [dataclasses.replace(r, hashes=systems[rng.randrange(3)][:r.prompt // workload.block_size])
                for r in workload.requests]
    return dataclasses.replace(workload, name=f"groups-prefix-random-{seed}", requests=requests, prefix_caching=True,
                               description=workload.description + ", prefix caching over 3 system prompts")


def random_grouped(seed: int, mamba: bool = False) -> Workload:
    """A workload over KV cache groups drawn from ``seed``: the layer mix (Gemma-2-like, Gemma-3-
    like, every layer sliding, or one full layer more than sliding ones), 2-12 layers, the
    window (4-200 tokens), blocks of 4-16 (20-240 of them), the budget, ``max_num_seqs``, the
    policy (priority for about a third), arrivals, and 6-30 requests within ``max_model_len``
    (the pool's tokens over the layers, or half: some too long for vLLM's start check, which
    both sides must then refuse). ``mamba``: the mix is 1-3 full-attention and 1-8 Mamba layers
    in a drawn order, blocks of 16-48, each Mamba state one the block's page holds (not raised)."""
    rng = random.Random(seed)
    mix = "mamba" if mamba else rng.choice(["gemma2", "gemma3", "sliding", "uneven"])
    n = rng.randint(1, 6)
    # (a hybrid's blocks are at least FlashAttention's 16, a multiple of it: platforms/interface.py:1066-1100)
    block_size = rng.choice([16, 32, 48]) if mamba else 0
    if mamba:  # a state of 2 x (3 + d_state) x 2 bytes within the page's block_size x 16 bytes
        kinds = [FULL] * rng.randint(1, 3) + [MAMBA] * rng.randint(1, 8)
        rng.shuffle(kinds)
        layers = Layers("random-mamba", tuple(kinds), window=0, mamba_inner=2,
                        mamba_state=rng.randint(1, 4 * block_size - 3))
    else:
        kinds = {"gemma2": every_nth_full(2 * n, 2), "gemma3": every_nth_full(6 * rng.randint(1, 2), 6),
                 "sliding": (SLIDING,) * n, "uneven": every_nth_full(2 * n, 2) + (FULL,)}[mix]
        layers = Layers(f"random-{mix}", kinds, window=rng.randint(4, 200))
        block_size = rng.choice([4, 8, 16])
    num_blocks = rng.randint(20, 240)
    max_model_len = max(8, num_blocks * block_size // len(kinds) // rng.choice([1, 2]))
    budget = rng.choice([8, 16, 32, 64, 256, 2048])
    count = rng.randint(6, 30)
    requests = rows(seed, count, (1, max(2, max_model_len * 2 // 3)), (1, max(2, max_model_len // 2)),
                    spread_s=rng.choice([0, 10, 40]), priorities=4)
    requests = first_at_zero([r for r in requests if r.prompt + r.output <= max_model_len] or
                             [Row(0.0, 1, 1)])
    return grouped(f"{'mamba' if mamba else 'groups'}-random-{seed}", layers, requests, num_blocks=num_blocks, block_size=block_size,
                   max_model_len=max_model_len, max_num_batched_tokens=budget,
                   max_num_seqs=min(budget, rng.choice([4, 16, 64])),
                   policy=rng.choice(["fcfs", "fcfs", "priority"]),
                   description=f"drawn from seed {seed}: {mix}, {len(kinds)} layers, window {layers.window}")


def random_grouped_speculative(seed: int, mamba: bool = False) -> Workload:
    """:func:`random_grouped`'s workload of ``seed`` (``mamba``: its Mamba hybrid) with
    speculative decoding: the method, K (1-5) and the acceptance rate (0-1) drawn from it too, the
    budget at least K + 1."""
    rng = random.Random(-1 - seed)
    workload = random_grouped(seed, mamba=mamba)
    k = rng.choice([1, 2, 3, 5])
    kind = "mamba" if mamba else "groups"
    return dataclasses.replace(workload, name=f"{kind}-spec-random-{seed}", num_speculative_tokens=k,
                               speculative_method=rng.choice(["ngram", "eagle", "mtp", "draft-model"]),
                               spec_acceptance_rate=rng.choice([0.0, 0.5, 0.8, 1.0]),
                               max_num_batched_tokens=max(k + 1, workload.max_num_batched_tokens),
                               description=f"{workload.description}; speculative, drawn from seed {seed}")


def to_the_limit(seed: int, n: int, max_model_len: int) -> list:
    """``n`` requests whose prompt and output fill ``max_model_len`` exactly, arriving over 20
    steps: their last decodes' drafts are cut by it (scheduler.py:852-857)."""
    return [dataclasses.replace(row, output=max_model_len - row.prompt)
            for row in rows(seed, n, (8, max_model_len - 8), (1, 1), spread_s=20)]


def speculative(name: str, requests: list, k: int, method: str = "ngram", **settings) -> Workload:
    """A workload with ``k`` drafts a step by ``method`` (pagesim's names), accepted at 0.7 unless given."""
    return Workload(name, requests, num_speculative_tokens=k, speculative_method=method, **settings)


def random_speculative(seed: int) -> Workload:
    """A speculative workload drawn from ``seed``: the method, K (1-7), blocks (4-16 slots, 20-120
    of them), ``max_model_len``, the budget (from K + 2), ``max_num_seqs``, prefix caching (on
    for about a third), the policy (priority for about a third), the acceptance rate (0-1) and
    8-30 requests that fit ``max_model_len``."""
    rng = random.Random(seed)
    method = rng.choice(["ngram", "eagle", "mtp", "draft-model"])
    k = rng.choice([1, 2, 3, 5, 7])
    block_size = rng.choice([4, 8, 16])
    num_blocks = rng.randint(20, 120)
    pool = num_blocks * block_size
    max_model_len = rng.choice([pool, min(pool, rng.randint(64, 512))])
    n = rng.randint(8, 30)
    prompt_high = rng.randint(8, max(9, max_model_len // 2))
    requests = rows(seed, n, (4, prompt_high), (1, max(2, max_model_len - prompt_high)),
                    spread_s=rng.choice([0, 10, 40]))
    requests = [r for r in requests if r.prompt + r.output <= max_model_len] or requests[:1]
    budget = max(k + 1, rng.choice([k + 2, 16, 32, 64, 256, 2048]))
    return speculative(f"spec-random-{seed}", requests, k, method, num_blocks=num_blocks, block_size=block_size,
                       max_model_len=max_model_len, max_num_batched_tokens=budget,
                       max_num_seqs=min(budget, rng.choice([4, 16, 64])), prefix_caching=rng.random() < 0.3,
                       policy=rng.choice(["fcfs", "fcfs", "priority"]),
                       spec_acceptance_rate=rng.choice([0.0, 0.5, 0.8, 1.0]),
                       description=f"drawn from seed {seed}")


def random_speculative_prefix(seed: int) -> Workload:
    """An EAGLE or MTP workload with prefix caching drawn from ``seed``, of the shape their
    one-block-later hashes change (sim/core/kv/prefix_cache.py, ``hash_lookahead``): 10-30 requests
    over 1-3 system prompts of 1-5 blocks, each with 0-3 blocks of its own, its prompt ending on a
    block boundary half the time (a prompt's last block is then cached only at its first decode),
    K 1-5, blocks of 4-16, a pool of 24-80 of them (preemptions: a resumed request hits its own
    blocks), a budget from K + 2, arrivals over 0-30 steps, FCFS or priority, rates 0-1."""
    rng = random.Random(f"spec-prefix-{seed}")
    method = rng.choice(["eagle", "mtp"])
    k = rng.choice([1, 2, 3, 5])
    block_size = rng.choice([4, 8, 16])
    num_blocks = rng.randint(24, 80)
    systems = [tuple(range(100 * p, 100 * p + rng.randint(1, 5))) for p in range(rng.randint(1, 3))]
    spread = rng.choice([0, 10, 30])
    requests = []
    for i in range(rng.randint(10, 30)):
        hashes = rng.choice(systems) + tuple(10_000 + 100 * i + j for j in range(rng.randint(0, 3)))
        prompt = len(hashes) * block_size + rng.choice([0, rng.randint(1, block_size - 1)])
        output = rng.randint(2, 60)
        if prompt + output <= num_blocks * block_size // 2:  # alone, it always fits
            requests.append(Row(arrival_s=rng.randrange(spread) + 0.5 if spread else 0.0, prompt=prompt,
                                output=output, priority=rng.randrange(4), hashes=hashes))
    requests = first_at_zero(sorted(requests or [Row(0.0, block_size + 1, 2)], key=lambda r: r.arrival_s))
    budget = max(k + 2, rng.choice([k + 2, 16, 64, 256, 2048]))
    return speculative(f"spec-prefix-random-{seed}", requests, k, method, num_blocks=num_blocks,
                       block_size=block_size, max_num_batched_tokens=budget, max_num_seqs=min(budget, 64),
                       prefix_caching=True, policy=rng.choice(["fcfs", "fcfs", "priority"]),
                       spec_acceptance_rate=rng.choice([0.0, 0.5, 0.8, 1.0]), description=f"drawn from seed {seed}")


# speculative decoding (vLLM 0.33.0 only): pagesim's acceptance draws replayed into vLLM
SPECULATIVE_WORKLOADS = {
    "spec-k1": speculative("spec-k1", rows(12, 16, (16, 200), (8, 120), spread_s=20), 1, num_blocks=256,
                           description="n-gram, K = 1, 16 requests over 20 steps, no memory pressure"),
    "spec-k3": speculative("spec-k3", rows(12, 16, (16, 200), (8, 120), spread_s=20), 3, num_blocks=256,
                           description="n-gram, K = 3"),
    "spec-k5": speculative("spec-k5", rows(12, 16, (16, 200), (8, 120), spread_s=20), 5, num_blocks=256,
                           description="n-gram, K = 5"),
    "spec-eagle": speculative("spec-eagle", rows(12, 16, (16, 200), (8, 120), spread_s=20), 3, "eagle",
                              num_blocks=256, description="EAGLE, K = 3: 3 lookahead slots a request"),
    "spec-mtp": speculative("spec-mtp", rows(13, 16, (16, 200), (8, 120), spread_s=20), 2, "mtp", num_blocks=256,
                            description="MTP (one module), K = 2: 2 lookahead slots"),
    "spec-draft-model": speculative("spec-draft-model", rows(14, 16, (8, 40), (20, 80), spread_s=10), 3,
                                    "draft-model", num_blocks=256, max_num_batched_tokens=24,
                                    description="a draft model, K = 3, a budget of 24: a slot of it a request"),
    "spec-budget": speculative("spec-budget", rows(15, 12, (4, 12), (20, 60)), 5, num_blocks=256,
                               max_num_batched_tokens=20,
                               description="n-gram, K = 5, short prompts, a budget of 20: the last decodes' "
                                           "drafts cut by the budget"),
    "spec-pressure": speculative("spec-pressure", rows(1, 20, (16, 200), (8, 120)), 3, num_blocks=48,
                                 description="n-gram, K = 3, 48 blocks: recompute preemption"),
    "spec-eagle-pressure": speculative("spec-eagle-pressure", rows(1, 20, (16, 200), (8, 120)), 3, "eagle",
                                       num_blocks=48, description="EAGLE, K = 3, 48 blocks: preemption"),
    "spec-max-len": speculative("spec-max-len", to_the_limit(16, 16, 128), 5, "eagle", num_blocks=256,
                                max_model_len=128, spec_acceptance_rate=0.9,
                                description="EAGLE, K = 5, prompt + output = max_model_len 128: the drafts' cut"),
    "spec-prefix-pressure": speculative("spec-prefix-pressure", rows(1, 20, (16, 200), (8, 120)), 3,
                                        num_blocks=48, prefix_caching=True,
                                        description="n-gram, K = 3, 48 blocks, prefix caching on"),
    "spec-priority": speculative("spec-priority", rows(4, 20, (16, 200), (8, 120), priorities=4), 3, "eagle",
                                 num_blocks=48, policy="priority",
                                 description="EAGLE, K = 3, priorities 0-3, 48 blocks: preemption by priority"),
    "spec-chunked": speculative("spec-chunked", rows(2, 6, (1500, 5000), (4, 40), spread_s=20), 3, "eagle",
                                num_blocks=1024, max_num_batched_tokens=512,
                                description="EAGLE, K = 3, prompts of 1.5k-5k tokens chunked by a budget of 512"),
    # a known divergence (test_vllm_v1_peer.py KNOWN): a rule pagesim does not model
    "spec-prefix-resume": speculative("spec-prefix-resume", rows(13, 20, (16, 200), (8, 120)), 3, num_blocks=48,
                                      prefix_caching=True,
                                      description="n-gram, K = 3, 48 blocks, prefix caching: a preempted request "
                                                  "resumes with one token to compute"),
}

def bursts(requests: list, size: int) -> list:
    """The requests arriving ``size`` at a time, 4 steps apart (at half steps)."""
    return first_at_zero([dataclasses.replace(row, arrival_s=4.0 * (k // size) + 0.5)
                          for k, row in enumerate(requests)])


def parallel_rows(seed: int, n: int, widths: tuple, spread_s: float = 0.0) -> list:
    """``rows`` whose requests sample ``n`` sequences each, drawn from ``widths``."""
    rng = random.Random(seed)
    return [dataclasses.replace(row, n=rng.randint(*widths)) for row in rows(seed, n, (16, 120), (8, 60), spread_s)]


def beam_rows(seed: int, n: int, widths: tuple, spread_s: float = 0.0) -> list:
    """``rows`` whose requests search ``widths``-drawn beams each."""
    rng = random.Random(seed)
    return [dataclasses.replace(row, beam=rng.randint(*widths)) for row in rows(seed, n, (16, 120), (8, 90), spread_s)]


# vLLM 0.4.2 (vllm_v0.py): prefill-first iterations, a watermark of 1 %
V0_WORKLOADS = {
    "preemption": Workload("preemption", rows(1, 20, (16, 200), (8, 120)), num_blocks=48,
                           description="20 requests, 48 blocks of 16: recompute preemption"),
    "arrivals": Workload("arrivals", rows(5, 30, (16, 200), (8, 120), spread_s=60), num_blocks=48,
                         description="30 requests arriving over 60 steps, 48 blocks"),
    "watermark": Workload("watermark", rows(6, 40, (50, 600), (20, 300), spread_s=40), num_blocks=200, block_size=32,
                          max_model_len=2048, description="block 32, 200 blocks (a watermark of 2), long prompts"),
    "budget": Workload("budget", rows(7, 60, (100, 700), (4, 40), spread_s=20), num_blocks=512,
                       max_num_batched_tokens=1024, max_num_seqs=8, max_model_len=1024,
                       description="prompts up to 700 tokens at a budget of 1024, max_num_seqs 8"),
    "manager-v2": Workload("manager-v2", rows(1, 20, (16, 200), (8, 120)), num_blocks=48, block_manager="v2",
                           description="the preemption workload under block_manager_v2"),
    "swap": Workload("swap", rows(1, 20, (16, 200), (8, 120)), num_blocks=48, preemption="swap",
                     description="the preemption workload, swapped instead of recomputed"),
    "swap-arrivals": Workload("swap-arrivals", rows(5, 30, (16, 200), (8, 120), spread_s=60), num_blocks=48,
                              preemption="swap", description="arrivals over 60 steps, swap preemption"),
    "parallel": Workload("parallel", parallel_rows(8, 30, (2, 4)), num_blocks=96, preemption="swap",
                         description="n = 2-4, 96 blocks"),
    "parallel-tight": Workload("parallel-tight", parallel_rows(8, 30, (2, 4)), num_blocks=40, preemption="swap",
                               description="n = 2-4, 40 blocks: groups swapped out and in"),
    "beam": Workload("beam", beam_rows(11, 24, (2, 6)), num_blocks=160, max_model_len=1024, preemption="swap",
                     description="beam search of 2-6 beams, 160 blocks: beams die and fork as the record says"),
    "beam-tight": Workload("beam-tight", beam_rows(12, 30, (2, 6), spread_s=30), num_blocks=96, max_num_seqs=48,
                           description="beam search of 2-6 beams over 30 steps, 96 blocks: groups swapped "
                                       "out and in"),
    "parallel-default": Workload("parallel-default", parallel_rows(9, 30, (1, 3)), num_blocks=40,
                                 description="n = 1-3, 40 blocks, vLLM's own choice: a group swapped, one "
                                             "sequence recomputed"),
    "swap-watermark": Workload("swap-watermark", rows(6, 40, (50, 600), (20, 300), spread_s=40), num_blocks=200,
                               block_size=32, max_model_len=2048, preemption="swap",
                               description="the watermark workload, swap preemption"),
    "chunked": Workload("chunked", rows(2, 12, (100, 900), (4, 60), spread_s=20), num_blocks=256,
                        max_num_batched_tokens=256, chunked_prefill=True,
                        description="chunked prefill: prompts of 100-900 tokens, a budget of 256"),
    "chunked-preemption": Workload("chunked-preemption", rows(1, 20, (16, 200), (8, 120)), num_blocks=48,
                                   max_num_batched_tokens=64, chunked_prefill=True,
                                   description="chunked prefill, a budget of 64, 48 blocks: preemption"),
    "chunked-arrivals": Workload("chunked-arrivals", rows(5, 30, (16, 300), (8, 120), spread_s=60), num_blocks=48,
                                 max_num_batched_tokens=48, chunked_prefill=True,
                                 description="chunked prefill, arrivals over 60 steps, a budget of 48"),
    "chunked-swap": Workload("chunked-swap", rows(1, 20, (16, 200), (8, 120)), num_blocks=48,
                             max_num_batched_tokens=64, chunked_prefill=True, preemption="swap",
                             description="the chunked-preemption workload, swap preemption"),
    # arrivals apart: with equal ones vLLM 0.4.2 runs new prompts' chunks before the decodes of
    # groups that arrived with them, whose several tokens then overrun the budget and fail its
    # own assertion (scheduler.py:852-853)
    "chunked-parallel": Workload("chunked-parallel", parallel_rows(8, 30, (2, 4), spread_s=40), num_blocks=40,
                                 max_num_batched_tokens=64, chunked_prefill=True, preemption="swap",
                                 description="chunked prefill, n = 2-4, arrivals over 40 steps, 40 blocks"),
    "prefix": Workload("prefix", shared_prefix_rows(3, 24, 16), num_blocks=40, prefix_caching=True,
                       description="shared prefixes, 40 blocks: prefix caching under pressure"),
    "prefix-preemption": Workload("prefix-preemption", rows(1, 20, (16, 200), (8, 120)), num_blocks=48,
                                  prefix_caching=True,
                                  description="the preemption workload with prefix caching: recomputed requests "
                                              "hit their own blocks"),
    "prefix-budget": Workload("prefix-budget", bursts(shared_prefix_rows(4, 40, 16), 4), num_blocks=200,
                              prefix_caching=True, max_num_batched_tokens=160, max_model_len=160,
                              description="shared prefixes in bursts of 4 at a budget of 160 tokens: the whole "
                                          "prompt counts"),
    "prefix-evictor": Workload("prefix-evictor", bursts(shared_prefix_rows(7, 60, 16), 4), num_blocks=24,
                               prefix_caching=True,
                               description="60 requests over 3 shared prefixes in bursts of 4, 24 blocks: which "
                                           "cached block is evicted (evictor_v1.py:66-84)"),
    "prefix-pairs": Workload("prefix-pairs", bursts(shared_prefix_rows(5, 60, 16), 2),
                             num_blocks=24, prefix_caching=True,
                             description="the same over other prefixes, in pairs"),
    # found by shrinking a shared-prefix ShareGPT workload that diverged (2026-11-30): a prompt of
    # whole blocks, every one of them held by a running request's table
    "prefix-whole-prompt-held": Workload(
        "prefix-whole-prompt-held",
        [Row(0.0, 122, 40, hashes=tuple(range(7))), Row(29.0, 80, 8, hashes=tuple(range(5)))],
        num_blocks=48, prefix_caching=True,
        description="a prompt of 5 whole blocks, all held by a running request: its last one shared"),
}


def random_mixed_v0(seed: int) -> Workload:
    """Parallel sampling, n = 1-4, under vLLM 0.4.2's own preemption choice (a group of several
    sequences swapped, one sequence recomputed), drawn from ``seed``: a recomputed request comes
    back after later groups were swapped back in (the running list's order, scheduler.py:409)."""
    rng = random.Random(1000 + seed)
    return Workload(f"mixed-random-{seed}", parallel_rows(100 + seed, rng.randint(15, 35), (1, 4),
                                                          spread_s=rng.choice([0, 20, 60])),
                    num_blocks=rng.randint(30, 70), description=f"n = 1-4, vLLM's preemption choice, seed {seed}")


def random_beam_v0(seed: int) -> Workload:
    """Beam search of 1-6 beams beside parallel sampling of 1-4, under vLLM 0.4.2's own preemption
    choice, drawn from ``seed``: groups forked, their beams dying and forking as pagesim's records
    say, swapped out and back in sharing what they shared."""
    rng = random.Random(2000 + seed)
    requests = [dataclasses.replace(row, n=1, beam=rng.randint(1, 6)) if rng.random() < 0.6 else row
                for row in parallel_rows(200 + seed, rng.randint(15, 30), (1, 4), spread_s=rng.choice([0, 20, 60]))]
    alone = max(max(r.beam, r.n) * -(-(r.prompt + r.output) // 16) for r in requests)  # a group alone fits
    return Workload(f"beam-random-{seed}", requests, num_blocks=alone + rng.randint(2, 16), max_num_seqs=48,
                    description=f"beams of 1-6 and n = 1-4, vLLM's preemption choice, seed {seed}")


def random_beam_prefix_v0(seed: int) -> Workload:
    """Beam search of 1-4 beams over 3 shared system prompts with prefix caching, in bursts of 4,
    60 blocks, drawn from ``seed``: cached prefixes hit by groups, beam groups swapped out and in."""
    rng = random.Random(3000 + seed)
    rows = [dataclasses.replace(r, beam=rng.randint(1, 4), output=rng.randint(20, 90))
            for r in bursts(shared_prefix_rows(300 + seed, 40, 16), 4)]
    return Workload(f"beam-prefix-random-{seed}", rows, num_blocks=60, max_num_seqs=48, prefix_caching=True,
                    description=f"beams of 1-4 over shared prefixes, prefix caching, 60 blocks, seed {seed}")


def edge_rows(block_size: int) -> list:
    """Prompts one token short of, at and one past 1-3 block edges, each with outputs that stop
    just before, at and just after the next edges: the tokens at which a sequence takes a block."""
    lengths = [k * block_size + d for k in (1, 2, 3) for d in (-1, 0, 1)]
    outputs = (1, 2, block_size - 1, block_size, block_size + 1)
    return first_at_zero([Row(arrival_s=i // 4 + 0.5, prompt=lengths[i % len(lengths)], output=outputs[i % 5])
                          for i in range(45)])


def random_workload(seed: int) -> Workload:
    """A workload drawn from ``seed``: block size, pool, request count, lengths and arrivals. A
    request's final length is at most half the pool (alone, it always fits); ``max_num_seqs``
    never binds (nano-vllm caps a step's sequences, pagesim the running ones)."""
    rng = random.Random(seed)
    block_size = rng.choice((8, 16, 32))
    num_blocks = rng.randint(24, 96)
    pool = num_blocks * block_size
    n = rng.randint(15, 40)
    prompt_high = rng.randint(block_size, pool // 3)
    requests = rows(seed, n, (1, prompt_high), (1, pool // 2 - prompt_high), spread_s=rng.randint(1, 80))
    return Workload(f"random-{seed}", requests, num_blocks=num_blocks, block_size=block_size, max_num_seqs=n,
                    max_num_batched_tokens=max(2048, pool),
                    description=f"drawn from seed {seed}: {n} requests, {num_blocks} blocks of {block_size}")


# nano-vllm (nano_vllm.py): prefill first, recompute preemption, no watermark, a block taken at a
# block edge; max_num_seqs caps one step's sequences (kept from binding but in max-seqs), and a
# budget at least max_model_len (it never chunks)
NANO_WORKLOADS = {
    "preemption": V0_WORKLOADS["preemption"],
    "arrivals": V0_WORKLOADS["arrivals"],
    "budget": Workload("budget", rows(7, 60, (300, 960), (4, 60), spread_s=30), num_blocks=400,
                       max_num_batched_tokens=1024, max_num_seqs=64, max_model_len=1024,
                       description="prompts of 300-960 tokens at a budget of 1024: one or two a step"),
    "no-watermark": Workload("no-watermark", rows(6, 40, (50, 600), (20, 300), spread_s=40), num_blocks=200,
                             block_size=32, max_model_len=2048, max_num_seqs=64,
                             description="V0's watermark workload, max_num_seqs 64: nano-vllm keeps no block back"),
    "block-edges": Workload("block-edges", edge_rows(16), num_blocks=16, max_num_seqs=64,
                            description="prompts and outputs at block edges +-1, 16 blocks of 16"),
    "block-256": Workload("block-256", rows(11, 30, (100, 1500), (20, 300), spread_s=40), num_blocks=12,
                          block_size=256, max_model_len=2048, max_num_seqs=64,
                          description="nano-vllm's own block size, 256: 12 blocks, preemption"),
    "random-2": random_workload(2),  # blocks of 8
    "random-6": random_workload(6),  # of 32
    "random-7": random_workload(7),  # of 16
    "prefix": Workload("prefix", shared_prefix_rows(3, 24, 16), num_blocks=512, max_model_len=2048,
                       prefix_caching=True, description="prefix caching on: 3 system prompts, no memory pressure"),
    # known divergences (test_nano_vllm_peer.py KNOWN)
    "max-seqs": Workload("max-seqs", rows(10, 12, (16, 64), (20, 40)), num_blocks=256, max_num_seqs=4,
                         max_model_len=2048,
                         description="max_num_seqs 4, a big pool: nano-vllm runs more than 4"),
    "prefix-held": Workload("prefix-held", shared_prefix_rows(3, 24, 16), num_blocks=40, prefix_caching=True,
                            description="prefix caching on, 40 blocks: a prompt's hits held by others"),
    "prefix-pressure": Workload("prefix-pressure", rows(1, 20, (16, 200), (8, 120)), num_blocks=48,
                                prefix_caching=True, description="the preemption workload, prefix caching on"),
}


def spaced(requests: list, gap: float) -> list:
    """The requests arriving one every ``gap`` steps (at half steps), in their order."""
    return first_at_zero([dataclasses.replace(row, arrival_s=k * gap + 0.5) for k, row in enumerate(requests)])


def offload(name: str, requests: list, num_blocks: int, host_blocks: int, **settings) -> Workload:
    """A workload with prefix caching and a CPU offload tier of ``host_blocks`` blocks
    (vllm_offload.py; pagesim's ``--kv-offload-gib`` of as many); max_num_seqs 64, out of reach
    (pagesim counts the requests loading against it, vLLM does not: docs/guide/offload.md)."""
    return Workload(name, requests, num_blocks=num_blocks, prefix_caching=True, host_blocks=host_blocks,
                    **{"max_num_seqs": 64, **settings})


# vLLM 0.33.0 with its CPU offload tier (vllm_offload.py)
OFFLOAD_WORKLOADS = {
    "offload-preemption": offload("offload-preemption", rows(1, 20, (16, 200), (8, 120)), 48, 200,
                                  description="20 requests, 48 blocks of 16, 200 host blocks: preempted "
                                              "requests load their prompts back"),
    "offload-chunked": offload("offload-chunked", rows(1, 20, (16, 200), (8, 120)), 48, 200,
                               max_num_batched_tokens=64,
                               description="the same, prompts chunked by a budget of 64"),
    "offload-lru": offload("offload-lru", spaced(shared_prefix_rows(6, 30, 16), 16), 12, 12,
                           description="30 requests over 3 system prompts one at a time, 12 blocks, 12 "
                                       "host blocks: the GPU forgets, the tier evicts its LRU"),
    "offload-reserve-binds": offload("offload-reserve-binds",
                                     [Row(0.0, 14, 1, hashes=(1, 2, 3)), Row(1.5, 10, 1, hashes=(4, 5)),
                                      Row(3.5, 23, 1), Row(5.5, 20, 2, hashes=(1, 2, 3, 7)),
                                      Row(5.5, 10, 2, hashes=(4, 5))], 6, 16, block_size=4,
                                     description="offload-reserved with r4 needing 2 blocks more than its "
                                                 "3 hits: r5 must leave them free"),
    "offload-reserved": offload("offload-reserved", [Row(0.0, 14, 1, hashes=(1, 2, 3)), Row(1.5, 10, 1, hashes=(4, 5)),
                                                     Row(3.5, 23, 1), Row(5.5, 14, 6, hashes=(1, 2, 3)),
                                                     Row(5.5, 10, 2, hashes=(4, 5))], 6, 16, block_size=4,
                                description="two prompts stored, a third evicts them from the GPU, both "
                                            "again: the second loads while the first does"),
    "offload-finish-touch": offload("offload-finish-touch", spaced(shared_prefix_rows(3, 30, 16), 16), 12, 12,
                                    description="offload-lru's kind, seed 3: a load's GPU hits at its finish"),
    "offload-pinned": offload("offload-pinned", rows(1, 20, (16, 200), (8, 120)), 48, 32,
                              description="offload-preemption with 32 host blocks: one step stores more"),
    "offload-running-lru": offload("offload-running-lru", shared_prefix_rows(3, 24, 16), 40, 24,
                                   description="3 system prompts, requests overlapping, 40 blocks, 24 host "
                                               "blocks: a running request's blocks evicted"),
}

# the tier with speculative decoding: each a workload above with drafts (n-gram: no lookahead
# slots; a draft model: K of them, which a load's admission leaves for later)
OFFLOAD_SPECULATIVE_WORKLOADS = {
    f"{name}-{method}": dataclasses.replace(OFFLOAD_WORKLOADS[name], name=f"{name}-{method}",
                                            num_speculative_tokens=k, speculative_method=method,
                                            description=f"{name} with {method} drafts, K = {k}")
    for name, method, k in (("offload-preemption", "ngram", 3), ("offload-chunked", "draft-model", 2),
                            ("offload-reserved", "ngram", 3), ("offload-reserved", "draft-model", 2),
                            ("offload-lru", "draft-model", 3))}


def random_offload(seed: int, aligned: bool = False) -> Workload:
    """A workload with a CPU offload tier drawn from ``seed``: blocks of 4-16 slots (16-96 of
    them), a tier of 4-64 blocks, 8-30 requests over 1-3 shared prefixes of 1-6 blocks with
    0-3 blocks and a partial one of their own, outputs of 1-40 tokens, arrivals over 0-60
    steps, a budget of 64-2048 (chunks) and max_num_seqs 64 (out of reach: ``offload``).
    ``aligned``: a pool of 16-48 blocks (preemptions), and half the prompts end on a block
    boundary, whose last block a host hit loads (``host_tier.count_hits``' limit)."""
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    num_blocks = rng.randint(16, 48 if aligned else 96)
    prefixes = [tuple(range(100 * p, 100 * p + rng.randint(1, 6))) for p in range(rng.randint(1, 3))]
    spread = rng.choice([0, 10, 30, 60])
    requests = []
    for i in range(rng.randint(8, 30)):
        hashes = rng.choice(prefixes) + tuple(10_000 + 100 * i + k for k in range(rng.randint(0, 3)))
        prompt = len(hashes) * block_size + rng.randint(1, block_size - 1)
        if aligned and rng.random() < 0.5:
            prompt -= prompt % block_size
        output = rng.randint(1, 40)
        if prompt + output > num_blocks * block_size // 2:  # alone, it always fits
            continue
        requests.append(Row(arrival_s=rng.randrange(spread) + 0.5 if spread else 0.0, prompt=prompt, output=output,
                            hashes=hashes))
    requests = first_at_zero(sorted(requests or [Row(0.0, block_size + 1, 1)], key=lambda r: r.arrival_s))
    return offload(f"offload-{'aligned-' if aligned else ''}random-{seed}", requests, num_blocks, rng.randint(4, 64),
                   block_size=block_size, max_num_batched_tokens=rng.choice([64, 256, 2048]),
                   description=f"drawn from seed {seed}")


def random_offload_speculative(seed: int, aligned: bool = False) -> Workload:
    """``random_offload(seed, aligned)`` with drafts drawn from the same seed: n-gram or a draft
    model (EAGLE and MTP are refused with the tier), K of 1-5, an acceptance rate of 0-1."""
    rng = random.Random(f"spec-{seed}")
    return dataclasses.replace(random_offload(seed, aligned),
                               name=f"offload-spec-{'aligned-' if aligned else ''}random-{seed}",
                               num_speculative_tokens=rng.choice([1, 2, 3, 5]),
                               speculative_method=rng.choice(["ngram", "draft-model"]),
                               spec_acceptance_rate=round(rng.random(), 2))
