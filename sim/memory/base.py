"""The protocol every KV-cache memory manager speaks, and the accounting it keeps.

Managers are plain Python objects (no SimPy): the simulated engine and the GPU executor
drive the very same objects. They manage *sequences* (one per sample or beam), named by
small integer ``seq_id``s the scheduler hands out.

Verbs (pairs, as in nano-vllm's block manager)::

    can_allocate(spec) -> Admit.OK | LATER | NEVER     allocate(spec) -> cached_tokens
    can_append(seq_id, n) -> bool                       append(seq_id, n)
    can_append_batch(seq_ids, last) -> bool             append_batch(seq_ids)   # one token each
    fork(parent_id, child_id, child_final_len)          free(seq_id)
    usage(demand_waiting) -> MemoryUsage                export() -> snapshot of tables/extents
    can_fork(parent_id, child_final_len) -> bool        explain_never(spec) -> str (why NEVER)
    has_seq(seq_id) -> bool                             num_tokens(seq_id) -> L

Paged managers add ``num_free_blocks()``, ``num_seq_blocks(seq_id)``, ``block_table(seq_id)``
and ``blocks_needed_for_append_batch(seq_ids)`` (exact, copy-on-write included). ``seq_ids``
within one batch call must be distinct. ``allocate`` sets L to the cached-token count it
returns; the caller then appends the remaining ``prompt_len - cached`` prompt tokens.

``allocate`` makes room for the sequence's prompt (paged, vAttention: on demand) or for its
whole reservation (static, contiguous); no token is *computed* yet, except prefix-cache hits,
whose count it returns. ``append(seq_id, n)`` records that ``n`` more tokens' K/V were
computed and stored (a prefill chunk, or one decode token), allocating on demand.

Accounting: the vLLM paper's Fig. 2 categories, for every slot at every instant
---------------------------------------------------------------------------------
For a sequence with true final length F (prompt + output; the simulator knows it),
current computed length L and allocation A (slots it holds), the policy's request R::

    |<-------------------------- allocator's extent / blocks ------------------------->|
    |<------------------- requested R ------------------->|                            |
    |<--------- F --------->|                             |                            |
    |<--- L --->|           |                             |                            |
    [ token_states | reserv. |      internal_frag          |      allocator_slack       ]

    token_states     L                      KV of tokens already computed
    reservation      min(R, F) - L          allocated, will be filled by this sequence later
    internal_frag    max(R - F, 0)          asked for by the policy, never filled (Max/Pow2
                                            over-provisioning, the paged last block's slack,
                                            vAttention page rounding)
    allocator_slack  A - R                  added by placement (buddy power-of-two rounding);
                                            the paper counts it under "external frag & others"
    external_frag    free slots while a request waits for memory
    free_idle        free slots with no demand waiting for memory

The six are integers that sum to ``capacity`` at every instant; a shared block counts once
(in the category of its one physical copy). Free slots are split by ``demand_waiting``, which
the scheduler passes in: True when the head-of-line waiting request could not be admitted
because memory was short (for contiguous managers that also covers holes too small for it).
Cached prefix blocks with no reference are reclaimable, so they count as free (idle or
external); ``stats()['cached_tokens']`` reports them separately.

Counters are kept incrementally (O(1) per change): ``usage`` never scans the pool.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod

import numpy as np
from dataclasses import dataclass, field, fields
from typing import Iterable, NamedTuple, Sequence


class Admit(enum.Enum):
    """Answer of ``can_allocate``: fits now, may fit once memory frees up, or can never fit."""

    OK = "ok"
    LATER = "later"
    NEVER = "never"


class SeqSpec(NamedTuple):
    """What a manager needs to know about a sequence when it is admitted (immutable; a
    NamedTuple because the scheduler builds one for every admission attempt)."""

    seq_id: int
    prompt_len: int  # tokens to hold before decoding (prompt, or prompt + generated on recompute)
    final_len: int  # true final length F: prompt + all output tokens
    prefix_hashes: tuple | None = None  # one hash per ``hash_block_tokens`` prompt tokens (Mooncake: 512)
    hash_block_tokens: int = 16
    # back after a preemption (it has produced output): the paged managers' watermark may
    # delay it, never turn it away (see PagedManager's docstring)
    resumed: bool = False


@dataclass
class MemoryUsage:
    """Slots per category; the six sum to ``capacity``."""

    token_states: int
    reservation: int
    internal_frag: int
    allocator_slack: int
    external_frag: int
    free_idle: int

    CATEGORIES = ("token_states", "reservation", "internal_frag", "allocator_slack",
                  "external_frag", "free_idle")

    @property
    def total(self) -> int:
        return (self.token_states + self.reservation + self.internal_frag + self.allocator_slack
                + self.external_frag + self.free_idle)

    def as_tuple(self) -> tuple[int, int, int, int, int, int]:
        return (self.token_states, self.reservation, self.internal_frag, self.allocator_slack,
                self.external_frag, self.free_idle)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class BlockTableSnapshot:
    """Paged layout: what the GPU kernel consumes (int32 tables built from these lists)."""

    block_size: int
    num_blocks: int
    tables: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> physical block ids
    context_lens: dict[int, int] = field(default_factory=dict)  # seq_id -> computed tokens L
    refcounts: dict[int, int] = field(default_factory=dict)  # block id -> references (>1: shared)


@dataclass
class ExtentSnapshot:
    """Contiguous layout: each sequence's [start, start + size) range in the slot address space."""

    capacity: int
    extents: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq_id -> (start, size)
    context_lens: dict[int, int] = field(default_factory=dict)


class KVCacheManager(ABC):
    """Base class: the shared protocol plus default (per-sequence) batch operations."""

    #: short name used in records and the CLI (static, contiguous, paged, vattention)
    kind: str = "base"
    capacity: int
    #: times space was freed other than by ``free``: a contiguous extent that outgrew its
    #: reservation and moved left a hole where it was. A request that did not fit before may
    #: fit after one (the scheduler's blocked-queue-head shortcut is then void)
    num_releases: int = 0

    @abstractmethod
    def can_allocate(self, spec: SeqSpec) -> Admit: ...

    @abstractmethod
    def allocate(self, spec: SeqSpec) -> int:
        """Admit ``spec``; return how many prompt tokens were already cached (prefix hits)."""

    @abstractmethod
    def can_append(self, seq_id: int, n: int = 1) -> bool: ...

    @abstractmethod
    def append(self, seq_id: int, n: int = 1) -> None: ...

    @abstractmethod
    def fork(self, parent_id: int, child_id: int, child_final_len: int | None = None) -> None:
        """Make ``child_id`` share the parent's tokens (copy-on-write where supported)."""

    @abstractmethod
    def free(self, seq_id: int) -> None: ...

    @abstractmethod
    def num_tokens(self, seq_id: int) -> int:
        """Computed tokens L of a sequence."""

    @abstractmethod
    def usage(self, demand_waiting: bool = False) -> MemoryUsage: ...

    @abstractmethod
    def export(self) -> BlockTableSnapshot | ExtentSnapshot: ...

    # --- compatible additions (defaults; managers override) -------------------------------
    #: longest sequence (final length) the manager admits; set by every concrete manager
    max_seq_len: int = 0

    def can_fork(self, parent_id: int, child_final_len: int | None = None) -> bool:
        """True if ``fork(parent_id, ...)`` would succeed now (paged: always; it shares blocks).

        Static and contiguous managers copy the parent into a new slot / extent, which needs room.
        """
        return True

    def explain_never(self, spec: SeqSpec) -> str:
        """Why ``can_allocate(spec)`` is NEVER: one line the scheduler can put in its rejection."""
        if spec.final_len > self.max_seq_len:
            return (f"sequence {spec.seq_id}: final length {spec.final_len} exceeds max_seq_len "
                    f"{self.max_seq_len}")
        return f"sequence {spec.seq_id}: can never fit in a {self.capacity}-slot pool"

    def has_seq(self, seq_id: int) -> bool:
        """True while ``seq_id`` is allocated (between ``allocate``/``fork`` and ``free``)."""
        raise NotImplementedError

    def num_cow_copies(self) -> int:
        """Copy-on-write block copies so far (managers that share blocks override this)."""
        return 0

    def stats(self) -> dict[str, int]:
        """Event counters (copy-on-write copies, evictions, prefix hits, overflows ...)."""
        return {}

    # Batch decode path: one token for each sequence. Subclasses override with vectorized code.
    def can_append_batch(self, seq_ids: Sequence[int], last: int | None = None) -> bool:
        """Whether one token for each of ``seq_ids`` fits; ``last``: the sequence whose turn
        comes last in the scheduler's order (only rules that go member by member read it)."""
        return all(self.can_append(s, 1) for s in seq_ids)

    def append_batch(self, seq_ids: Iterable[int]) -> None:
        for s in seq_ids:
            self.append(s, 1)

    def check(self) -> None:
        """Full (slow) consistency check used by tests and ``--check``: raise AssertionError."""
        u = self.usage(False)
        assert u.total == self.capacity, f"categories sum to {u.total}, capacity {self.capacity}"
        assert min(u.as_tuple()) >= 0, f"negative category: {u}"


def grow_seq_arrays(manager, seq_id: int, fields: Iterable[str]) -> None:
    """Make the per-sequence numpy arrays ``_<field>`` (and ``_active``) long enough for
    ``seq_id``: they are indexed by seq_id so batch operations can gather with numpy."""
    n = len(manager._active)
    if seq_id < n:
        return
    m = max(2 * n, seq_id + 1)
    for f in (*fields, "active"):
        a = getattr(manager, "_" + f)
        b = np.zeros(m, dtype=a.dtype)
        b[:n] = a
        setattr(manager, "_" + f, b)


#: methods that must see settled per-sequence state when a manager batches decode steps lazily
LANE_SETTLED_METHODS = ("can_allocate", "explain_never", "allocate", "blocks_needed_to_allocate",
                        "num_seq_blocks", "block_table", "can_append", "append", "fork", "free",
                        "num_tokens", "stats", "export", "check", "can_fork", "request_size")


def settles_itself(method):
    """Mark a lane manager's method as settling what it reads itself (or needing nothing
    settled): :func:`settle_lane_before` leaves it unwrapped."""
    method._settles = True
    return method


def settle_lane_before(cls: type) -> type:
    """Class decorator: wrap ``cls``'s own public methods so the decode lane is written back first.

    Managers with a decode lane (``PagedManager``, ``ExtentManager``) count a lockstep decode
    step in O(1) and write per-sequence lengths back lazily in ``_settle``; every method that
    reads or changes per-sequence state must call it first. Subclasses are decorated too.
    """
    import functools

    for name in LANE_SETTLED_METHODS:
        method = cls.__dict__.get(name)
        if method is None or getattr(method, "_settles", False):
            continue

        def make(m):
            @functools.wraps(m)
            def wrapper(self, *args, **kwargs):
                if self._lane_ids is not None:
                    self._settle()
                return m(self, *args, **kwargs)
            wrapper._settles = True
            return wrapper
        setattr(cls, name, make(method))
    return cls
