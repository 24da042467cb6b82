"""Iteration-level (continuous) batching: Orca and vLLM share this scheduler.

Each call to :meth:`ContinuousScheduler.schedule` builds one iteration and performs its
memory operations on the manager; :meth:`complete_step` applies what the iteration produced
(tokens sampled, requests finished, beams forked). The manager decides what "fits": a
contiguous (Orca) manager reserves a request's whole extent at admission and never runs out
while decoding; a paged (vLLM) manager allocates a block at each block boundary, and when
the pool is empty the scheduler preempts the most recently admitted request.

Policy (vLLM v0, the paper's §4.5), per iteration::

    1. resume swapped requests first (FCFS); while any stays swapped, admit nobody new
    2. admit waiting requests FCFS while the prompt budget (max_num_batched_tokens),
       max_num_seqs and memory allow; the first that does not fit blocks the queue
       (a request that can never fit is rejected with a reason)
    3. prefill-first: if anything was admitted, this iteration runs only prefills
    4. otherwise decode one token for every running sequence; if memory is short,
       preempt the latest-admitted request (recompute: back to the queue head with its
       generated tokens as prompt; swap: K/V to CPU, bounded by swap space) until it fits

Chunked prefill (Sarathi-Serve) replaces 3-4: every iteration first takes one decode token
per running sequence, then fills the rest of ``chunk_budget`` with prefill chunks (ongoing
prefills first, then new admissions). ``waiting_served_ratio`` (optional) admits new requests
only when ``waiting / running`` reaches it, or nothing runs.

Parallel sampling (``n``) prefills the prompt once and forks ``n - 1`` children sharing its
blocks. Beam search (``beam_width`` k) is modelled as k beams that each step survive, or
die and are replaced by a fork of a surviving beam with probability ``beam_churn`` (seeded):
the shared prefix of a beam family then grows the way real beam search's does. All
sequences of a request advance in lockstep and finish together at ``output_tokens``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from pagesim.sim.batch import StepBatch
from pagesim.sim.memory.base import Admit, KVCacheManager, SeqSpec
from pagesim.sim.sched.state import RequestTable, Status

_I64 = np.int64
# plain ints and bound members: the hot path compares them per request (an IntEnum against a
# numpy scalar, or an attribute lookup on an Enum class, costs a Python call each time)
_WAITING, _RUNNING, _SWAPPED, _FINISHED, _REJECTED = (int(Status.WAITING), int(Status.RUNNING),
                                                      int(Status.SWAPPED), int(Status.FINISHED),
                                                      int(Status.REJECTED))
_OK, _LATER, _NEVER = Admit.OK, Admit.LATER, Admit.NEVER
#: beam search: the chance that a beam dies at a decode step and is replaced by a fork of a
#: surviving beam (the model's one constant; see the module docstring)
BEAM_CHURN = 0.25


class ContinuousScheduler:
    name = "continuous"

    def __init__(self, cfg, table: RequestTable, manager: KVCacheManager, *, max_seq_len: int,
                 kv_bytes_per_token: float, rng: np.random.Generator):
        self.cfg = cfg
        self.t = table
        self.mgr = manager
        self.max_seq_len = max_seq_len
        self.rng = rng
        self.max_num_seqs = cfg.max_num_seqs
        self.max_batched = cfg.max_num_batched_tokens or max(max_seq_len, 2048)
        self.chunked = cfg.chunked_prefill
        self.budget = cfg.chunk_budget
        self.swap = cfg.preemption == "swap"
        self.swap_capacity = int(cfg.swap_gib * (1 << 30) / kv_bytes_per_token) if self.swap else 0
        self.swap_used = 0
        self.beam_churn = BEAM_CHURN
        if table.size and int(table.width.max()) > self.max_num_seqs:
            # such a request is rejected at arrival, which the engine's macro steps would count
            # as joining the queue (its step table's num_waiting): these traces run step by step
            self.macro_steps_ok = False

        self.waiting: deque[int] = deque()
        self.swapped: deque[int] = deque()
        self.running: list[int] = []  # admission order; the last is preempted first
        self.swapped_tokens: dict[int, list[int]] = {}
        self.running_seqs = 0
        self.next_seq_id = table.size
        self.demand_waiting = False
        self.num_preemptions = 0
        self.num_swap_fallbacks = 0
        self.num_rejected = 0
        # iterations in a row that handed out no token (sim/core/scheduler.py's
        # steps_without_token_limit ends a live-locked run)
        self.steps_without_token = 0
        # forks share blocks only in the paged managers; the others would copy whole reservations
        self.fork_ok = getattr(manager, "kind", "") in ("paged", "token")
        # The decode set: requests past their prefill, in join order. All advance in lockstep,
        # so a decode step is O(1) here and joining or leaving is O(log n): with K the decode
        # steps taken so far, member i has generated goff[i] + K tokens; the context sum is
        # ctx_base + K * width (width: member sequences); a heap holds the K at which each
        # member finishes. Members' table rows (generated, last_token_s) are written back when
        # they leave. Last-token times: every member got its last token at the last decode step
        # (lt_main), except those joined since (lt_extra: their own time and width).
        self._K = 0
        self._dec_goff: dict[int, int] = {}  # member -> goff (generated - K), in join order
        self._dec_width: dict[int, int] = {}  # member -> its sequences (n, beams, or 1)
        self._dec_nseq = 0  # sum of the widths: the decode batch's sequences
        self._ctx_base = 0
        self._fin: list[tuple[int, int, int, int]] = []  # heap: (K at finish, join order, request, goff)
        self._joins = 0
        self._lt_main = 0.0
        self._lt_extra: dict[int, tuple[float, int]] = {}
        self._n_beam = 0  # members with beam search (their beams churn: no macro steps)
        self._dseqs = np.zeros(0, _I64)  # the members' sequence ids (rebuilt after changes)
        self._dseqs_stale = False
        # admission is skipped while the queue head is blocked and nothing was freed since
        self._free_epoch = 0
        self._blocked: tuple | None = None
        self._cache_hits_possible = bool(getattr(manager, "prefix_caching", False))
        self._spec_memo: tuple = (None, None)
        # inter-token latencies: exact sum/count, percentiles from a log-spaced histogram
        self.itl_edges = np.logspace(-6, 4, 2001)
        self.itl_hist = np.zeros(len(self.itl_edges) + 1, _I64)
        self.itl_sum = 0.0
        self.itl_count = 0
        self._itl_scalars: list[float] = []
        self._itl_scalar_w: list[int] = []
        self._itl_arrays: list[tuple[np.ndarray, np.ndarray]] = []

    # ---------------------------------------------------------------- arrivals
    def add_arrival(self, i: int) -> None:
        if int(self.t.width[i]) > self.max_num_seqs:  # its sequences run together: it could never be admitted
            self._reject(i, self.too_wide_reason(i))
            return
        self.t.status[i] = _WAITING
        self.waiting.append(i)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.swapped)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ---------------------------------------------------------------- helpers
    def _spec(self, i: int, prompt_len: int, seq_id: int | None = None) -> SeqSpec:
        t = self.t
        resumed = bool(t.generated[i] > 0)
        key = (i, prompt_len, seq_id, resumed)
        if key == self._spec_memo[0]:  # the queue head is asked about at every boundary
            return self._spec_memo[1]
        spec = SeqSpec(i if seq_id is None else seq_id, int(prompt_len), t.final_len(i),
                       t.prefix_hashes(i), t.hash_block_tokens, resumed)
        self._spec_memo = (key, spec)
        return spec

    def _reject(self, i: int, reason: str) -> None:
        self.t.status[i] = _REJECTED
        self.t.reject_reason[i] = reason
        self.num_rejected += 1

    def too_wide_reason(self, i: int) -> str:
        return f"its {int(self.t.width[i])} sequences (n / beam_width) exceed max_num_seqs={self.max_num_seqs}"

    def width_reason(self, i: int) -> str:
        """Why request ``i``'s sequences (n / beam_width > 1) cannot run on this manager (``fork_ok``)."""
        return (f"parallel sampling / beam search (width {int(self.t.width[i])}) needs a manager that shares "
                "blocks (paged); this one would copy whole reservations")

    def batched_reason(self, i: int) -> str:
        return f"prompt of {int(self.t.target[i])} tokens exceeds max_num_batched_tokens={self.max_batched}"

    def never_reason(self, i: int) -> str:
        explain = getattr(self.mgr, "explain_never", None)
        if explain is not None:
            return str(explain(self._spec(i, int(self.t.target[i]))))
        return (f"needs {self.t.final_len(i)} KV slots, more than the manager can ever give "
                f"(capacity {self.mgr.capacity})")

    def _join(self, i: int) -> None:
        """Request i enters the decode set (prefill done, or swapped back in)."""
        t = self.t
        g = int(t.generated[i])
        goff = g - self._K
        w = len(t.seq_ids(i))
        self._dec_goff[i] = goff
        self._dec_width[i] = w
        self._dec_nseq += w
        self._ctx_base += w * (int(t.prompt[i]) + goff)
        self._joins += 1
        heapq.heappush(self._fin, (int(t.output[i]) - goff, self._joins, i, goff))
        self._lt_extra[i] = (float(t.last_token_s[i]), w)
        if t.beam[i] > 1:
            self._n_beam += 1
        self._dseqs_stale = True

    def _leave(self, i: int) -> None:
        """Request i leaves the decode set (finished, preempted or swapped out): its table row
        gets its lockstep progress."""
        t = self.t
        goff = self._dec_goff.pop(i)
        w = self._dec_width.pop(i)
        self._dec_nseq -= w
        self._ctx_base -= w * (int(t.prompt[i]) + goff)
        t.generated[i] = goff + self._K
        extra = self._lt_extra.pop(i, None)
        t.last_token_s[i] = self._lt_main if extra is None else extra[0]
        if t.beam[i] > 1:
            self._n_beam -= 1
        self._dseqs_stale = True

    @property
    def _dec_seqs(self) -> np.ndarray:
        """The decode set's sequence ids (the same array object until the set changes, so the
        memory manager's decode lane recognizes it)."""
        if self._dseqs_stale:
            t = self.t
            if t.seqs:
                seqs: list[int] = []
                for i in self._dec_goff:
                    seqs.extend(t.seq_ids(i))
                self._dseqs = np.array(seqs, dtype=_I64)
            else:
                self._dseqs = np.fromiter(self._dec_goff, _I64, len(self._dec_goff))
            self._dseqs_stale = False
        return self._dseqs

    def _rem_min(self) -> int:
        """Decode steps until the next member finishes (0 with no member)."""
        h, dm = self._fin, self._dec_goff
        while h and dm.get(h[0][2]) != h[0][3]:
            heapq.heappop(h)  # left (or rejoined since)
        return h[0][0] - self._K if h else 0

    def _decode_context_sum(self) -> int:
        return self._ctx_base + self._K * self._dec_nseq

    def _decode_context(self) -> np.ndarray:
        """Per-sequence context (after this step's token) for executors that need the array."""
        t, K = self.t, self._K
        ctx = [int(t.prompt[i]) + goff + K for i, goff in self._dec_goff.items()]
        if t.seqs:
            ctx = [c for c, w in zip(ctx, self._dec_width.values()) for _ in range(w)]
        return np.array(ctx, dtype=_I64)

    def _decode_itl(self, end: float) -> None:
        """The inter-token latencies of a decode step ending at ``end``."""
        extra = self._lt_extra
        if extra:
            main = self._dec_nseq
            for T, w in extra.values():
                self._itl_scalars.append(end - T)
                self._itl_scalar_w.append(w)
                main -= w
            extra.clear()
            if main:
                self._itl_scalars.append(end - self._lt_main)
                self._itl_scalar_w.append(main)
        else:
            self._itl_scalars.append(end - self._lt_main)
            self._itl_scalar_w.append(self._dec_nseq)
        self._lt_main = end
        if len(self._itl_scalars) > 65536:
            self.itl_stats()  # fold into the histogram: memory stays flat on long runs

    # ---------------------------------------------------------------- admission
    def _admission(self, i: int, budget_left: int, chunk_limit: int | None) -> tuple[str, SeqSpec | None]:
        """Whether waiting request i can be admitted now, without changing anything: ``ok``
        (with its spec), ``full`` (max_num_seqs), ``budget`` (this iteration's token budget),
        ``memory`` (may fit later), or a reason to reject it (``width``, ``batched``, ``never``)."""
        t = self.t
        width = int(t.width[i])
        if width > 1 and not self.fork_ok:
            return "width", None
        if self.running_seqs + width > self.max_num_seqs:
            return "full", None
        target = int(t.target[i])
        if chunk_limit is None and target > self.max_batched:
            return "batched", None
        if (target > budget_left) if chunk_limit is None else (budget_left <= 0):
            return "budget", None
        spec = self._spec(i, target)
        adm = self.mgr.can_allocate(spec)
        if adm is _NEVER:
            return "never", None
        return ("memory", None) if adm is _LATER else ("ok", spec)

    def _try_admit(self, i: int, budget_left: int, chunk_limit: int | None) -> tuple[str, int]:
        """Admit waiting request i. Returns (outcome, prefill tokens scheduled)."""
        t = self.t
        outcome, spec = self._admission(i, budget_left, chunk_limit)
        if outcome in ("width", "batched", "never"):
            self.waiting.popleft()
            if outcome == "width":
                self._reject(i, self.width_reason(i))
            elif outcome == "batched":
                self._reject(i, self.batched_reason(i))
            else:
                self._reject(i, self.never_reason(i))
            return "rejected", 0
        if outcome != "ok":
            if outcome == "memory":
                self.demand_waiting = True
            return outcome, 0
        target = spec.prompt_len
        self.waiting.popleft()
        cached = int(self.mgr.allocate(spec))
        cached = min(cached, target - 1)  # the last prompt token is always computed
        t.prefilled[i] = cached
        t.status[i] = _RUNNING
        self.running.append(i)
        self.running_seqs += 1  # children join at fork time
        todo = target - cached
        n = todo if chunk_limit is None else min(todo, chunk_limit)
        return "ok", n

    def mgr_append(self, i: int, n: int) -> None:
        if n:
            self.mgr.append(i, n)
            self.t.prefilled[i] += n

    def _resume_swapped(self, batch: StepBatch) -> bool:
        """Swap in swapped requests FCFS; True when none is left swapped.

        A paged request comes back only if one free block per sequence is left after it (as
        vLLM's ``can_swap_in`` in ``block_manager_v1.py``: "every sequence will allocate at
        least one free block right after the swap-in"; the watermark is checked as for any
        admission): without that room, as the latest request it would be the first preempted
        again before producing a token, and with nothing else running that repeats forever.
        One that cannot come back even with nothing else running never will: it is recomputed
        instead (its prefill yields a token)."""
        t = self.t
        while self.swapped:
            i = self.swapped[0]
            lens = self.swapped_tokens[i]
            seqs = t.seq_ids(i)
            if self.running_seqs + len(seqs) > self.max_num_seqs:
                return False
            specs = [self._spec(i, L, s) for s, L in zip(seqs, lens)]
            ok = self._swap_in_leaves_room(specs)
            # all of the group's sequences must fit: admit them one by one, undo on a miss
            done = []
            for sp in specs if ok else ():
                if self.mgr.can_allocate(sp) is not _OK:
                    ok = False
                    break
                cached = int(self.mgr.allocate(sp))  # prefix-cache hits are already there
                self.mgr.append(sp.seq_id, sp.prompt_len - cached)
                done.append(sp.seq_id)
            if not ok:
                for s in done:
                    self.mgr.free(s)
                if not self.running:  # nothing else holds memory: it can never come back
                    self._recompute_swapped(i)
                    continue
                self.demand_waiting = True
                return False
            self.swapped.popleft()
            del self.swapped_tokens[i]
            tokens = sum(lens)
            self.swap_used -= tokens
            batch.swap_in_tokens += tokens
            t.status[i] = _RUNNING
            self.running.append(i)
            self.running_seqs += len(seqs)
            self._join(i)
        return True

    def _swap_in_leaves_room(self, specs: list[SeqSpec]) -> bool:
        """One free block per sequence left after swapping ``specs`` in (paged managers; the
        others reserve each sequence's growth already). Prefix-cache hits the sequences share
        are counted for each: conservative."""
        needed = getattr(self.mgr, "blocks_needed_to_allocate", None)
        if needed is None:
            return True
        return self.mgr.num_free_blocks() - sum(needed(sp) for sp in specs) >= len(specs)

    def _recompute_swapped(self, i: int) -> None:
        """The swapped queue's head goes back to the waiting queue's front for recompute."""
        self.swapped.popleft()
        self.swap_used -= sum(self.swapped_tokens.pop(i))
        self.num_swap_fallbacks += 1
        self._restart(i)

    def _restart(self, i: int) -> None:
        """Request i (holding no memory) waits at the queue's front to be recomputed."""
        t = self.t
        if t.generated[i] > 0:
            t.target[i] = t.prompt[i] + t.generated[i]  # generated tokens become prompt
        t.prefilled[i] = 0
        if i in t.seqs:  # the group restarts as one sequence and re-forks after its prefill
            del t.seqs[i]
            t.forked[i] = False
        t.status[i] = _WAITING
        self.waiting.appendleft(i)

    # ---------------------------------------------------------------- preemption
    def _preempt_last(self, batch: StepBatch) -> None:
        t = self.t
        i = self.running.pop()
        if i in self._dec_goff:
            self._leave(i)
        self._free_epoch += 1
        seqs = t.seq_ids(i)
        self.running_seqs -= len(seqs)
        t.preemptions[i] += 1
        self.num_preemptions += 1
        self.demand_waiting = True
        in_prefill = t.prefilled[i] < t.target[i]
        lens = [self.mgr.num_tokens(s) for s in seqs]
        if self.swap and not in_prefill and self.swap_used + sum(lens) <= self.swap_capacity:
            for s in seqs:
                self.mgr.free(s)
            self.swapped_tokens[i] = lens
            self.swap_used += sum(lens)
            batch.swap_out_tokens += sum(lens)
            t.status[i] = _SWAPPED
            self.swapped.append(i)
            return
        if self.swap:
            self.num_swap_fallbacks += 1
        for s in seqs:
            self.mgr.free(s)
        self._restart(i)

    def _make_decode_room(self, batch: StepBatch) -> None:
        while self._dec_goff and not self.mgr.can_append_batch(self._dec_seqs, self._latest_decoding_seq()):
            self._preempt_last(batch)

    def _latest_decoding_seq(self) -> int:
        """The last sequence, in the running order (admission, swap-in), of the decode set:
        vLLM v0 checks room request by request in that order (the decode set's own order is
        the order its members joined, after their prefill)."""
        for i in reversed(self.running):
            if i in self._dec_goff:
                return self.t.seq_ids(i)[-1]
        raise AssertionError("the decode set is empty")

    # ---------------------------------------------------------------- one iteration
    def schedule(self, now: float) -> StepBatch:
        batch = StepBatch()
        preemptions = self.num_preemptions
        self._schedule_pass(batch)
        if batch.num_seqs == 0 and self.num_preemptions != preemptions and self.has_work:
            # the decode step preempted every running request: vLLM's iteration is then empty
            # (it takes no time, and only carries the swap-outs) and the next one, at the same
            # instant, admits or swaps in again into the emptied pool. Both are this one
            # iteration here: nothing is recorded with no sequence, the swap-outs go with it.
            # One more pass cannot preempt everyone again (a swapped request comes back only
            # with room for its next token, see _resume_swapped); if it did, the engine's
            # checks name it
            self._schedule_pass(batch)
        if not (self.waiting or self.swapped):
            # a request preempted for memory may have been admitted again (chunked prefill) or
            # rejected in the same iteration: nobody waits, so no free slot is external
            # fragmentation
            self.demand_waiting = False
        return batch

    def _schedule_pass(self, batch: StepBatch) -> None:
        self.demand_waiting = False
        all_resumed = self._resume_swapped(batch)
        if self.chunked:
            self._schedule_chunked(batch, all_resumed)
            return
        pre_ids: list[int] = []
        pre_tok: list[int] = []
        if all_resumed and self._may_admit() and not self._still_blocked():
            self._admit_waiting(self.max_batched, False, pre_ids, pre_tok)
        if pre_ids:  # prefill-first: this iteration runs the new prompts only
            ids = np.array(pre_ids, _I64)
            batch.set_prefill(ids, pre_tok, self.t.prefilled[ids])
            return
        self._decode_into(batch)

    def _decode_into(self, batch: StepBatch) -> None:
        """Make room (preempting if needed) and append one token to every decoding sequence."""
        self._make_decode_room(batch)
        if self._dec_goff:
            forked = bool(self.t.seqs)
            copies0 = self.mgr.num_cow_copies() if forked else 0
            releases = self.mgr.num_releases
            self.mgr.append_batch(self._dec_seqs)
            if self.mgr.num_releases != releases:  # an extent moved: the blocked head may fit now
                self._free_epoch += 1
            if forked:  # forked sequences writing into shared blocks copy them first
                batch.copy_blocks = self.mgr.num_cow_copies() - copies0
                batch.copy_tokens = batch.copy_blocks * getattr(self.mgr, "block_size", 1)
            batch.decode_seq_ids = self._dec_seqs
            batch.set_decode_context_lazy(self._decode_context_sum(), self._decode_context)

    # ---------------------------------------------------------------- macro steps
    macro_steps_ok = True

    def macro_plan(self) -> tuple[int, int, bool, bool] | None:
        """Between two iterations: can the next ones be predicted as pure decode steps of the
        decode set? Returns ``(limit, width, blocked, demand_waiting)``: at most ``limit``
        such steps (the last may finish requests: :meth:`macro_complete` then finishes them;
        the manager's lane and free blocks bound them too), ``width`` sequences each;
        ``blocked``: the waiting queue's head stays blocked (arrivals only join the queue)
        rather than the queue being empty (an arrival ends the stretch). None when the next
        iteration needs the full path. A changed decode set is refreshed here, exactly as the
        next ``schedule`` would do first (nothing to resume, nobody to admit)."""
        if self.swapped:
            return None
        blocked = False
        dw = False
        if self.waiting:
            if self.cfg.waiting_served_ratio is not None:
                return None
            b = self._blocked
            if b is None or b[0] != self.waiting[0] or b[1] != self._free_epoch:
                b = self._probe_head()
                if b is None:
                    return None
            blocked = True
            dw = b[2] == "memory"
        if self._n_beam and self.beam_churn > 0:
            return None  # beams die and fork at random every step
        if not self._dec_goff or len(self._dec_goff) != len(self.running):
            return None  # nothing decodes, or some request is still in its prefill
        seqs = self._dec_seqs
        W = len(seqs)
        lim = self._rem_min()
        if lim <= 0:
            return None
        lim = self.mgr.lane_steps(seqs, lim)
        if lim <= 0:
            return None
        return lim, W, blocked, dw

    def _probe_head(self) -> tuple | None:
        """The next ``schedule`` would try to admit the queue head: when that attempt would
        only find it blocked (memory or ``max_num_seqs``), record that as ``_admit_waiting``
        would and return the block; None when it would admit or reject it (the full path
        does that). Prefill-first only: chunked iterations mix prefill into decode steps."""
        if self.chunked:
            return None
        i = self.waiting[0]
        outcome, _ = self._admission(i, self.max_batched, None)  # a pass starts with the full budget
        if outcome not in ("memory", "full"):
            return None
        self._blocked = (i, self._free_epoch, outcome)
        return self._blocked

    def macro_context_sum0(self) -> int:
        """``decode_context_sum`` of the next decode step (each later one adds the width)."""
        return self._decode_context_sum()

    def macro_context_sums(self, m: int) -> np.ndarray:
        """``decode_context_sum`` of the next ``m`` decode steps."""
        return self._decode_context_sum() + np.arange(m, dtype=_I64) * self._dec_nseq

    def macro_apply(self, m: int, bounds: list[float]) -> None:
        """Account ``m`` decode steps planned by :meth:`macro_plan`; ``bounds[j]`` is step j's
        start and ``bounds[m]`` the last one's end (the manager advanced its lane itself)."""
        W = self._dec_nseq
        self.steps_without_token = 0  # decode steps hand out tokens
        if not self.waiting and self._may_admit():
            self._blocked = None
        ends = bounds[1:m + 1]  # a list of floats
        self._decode_itl(ends[0])
        if m > 1:
            self._itl_scalars.extend([b - a for a, b in zip(ends, ends[1:])])
            self._itl_scalar_w.extend([W] * (m - 1))
        self._lt_main = ends[-1]
        self._K += m

    def macro_complete(self, now: float) -> list[int]:
        """After a macro step's last iteration (at ``now``): finish the requests it completed,
        as :meth:`complete_step` would."""
        finished = self._decoded()
        for i in finished:
            self._finish(i, now)
        return finished

    def _decoded(self) -> list[int]:
        """The members that reached their output length (in join order), out of the set."""
        h, dm, K = self._fin, self._dec_goff, self._K
        out = []
        while h and h[0][0] <= K:
            _, _, i, goff = heapq.heappop(h)
            if dm.get(i) == goff:
                self._leave(i)
                out.append(i)
        return out

    def _admit_waiting(self, budget: int, chunked: bool, pre_ids: list[int], pre_tok: list[int]) -> int:
        """Admit FCFS from the queue into this iteration's prefills; return the token budget left.

        Whole prompts must fit ``budget`` (prefill-first), or take a chunk of it (chunked). The
        first request that does not fit ends the pass; when memory or ``max_num_seqs`` stopped it
        and nothing was admitted, later iterations skip admission until something is freed.
        """
        while self.waiting and (budget > 0 or not chunked):
            i = self.waiting[0]
            outcome, n = self._try_admit(i, budget, budget if chunked else None)
            if outcome == "rejected":
                continue
            if outcome != "ok":
                # blocked until something is freed. After admitting others in this pass too:
                # their prefill only takes memory, so the head cannot fit before a free; except
                # with a prefix cache, where their prompts' blocks may become its hits
                if outcome in ("memory", "full") and (chunked or not pre_ids or not self._cache_hits_possible):
                    self._blocked = (i, self._free_epoch, outcome)
                break
            self.mgr_append(i, n)
            pre_ids.append(i)
            pre_tok.append(n)
            budget -= n
        return budget

    def _still_blocked(self) -> bool:
        """The queue head was blocked by memory or max_num_seqs and nothing was freed since."""
        b = self._blocked
        if b is None or not self.waiting or b[0] != self.waiting[0] or b[1] != self._free_epoch:
            self._blocked = None
            return False
        if b[2] == "memory":
            self.demand_waiting = True
        return True

    def _may_admit(self) -> bool:
        r = self.cfg.waiting_served_ratio
        if r is None or not self.running:
            return True
        return len(self.waiting) / len(self.running) >= r

    def _schedule_chunked(self, batch: StepBatch, all_resumed: bool) -> StepBatch:
        t = self.t
        self._decode_into(batch)
        budget = self.budget - len(batch.decode_seq_ids)
        pre_ids: list[int] = []
        pre_tok: list[int] = []
        for i in self.running:  # ongoing prefills continue first
            if budget <= 0:
                break
            todo = int(t.target[i] - t.prefilled[i])
            if todo > 0:
                n = min(todo, budget)
                self.mgr_append(i, n)
                pre_ids.append(i)
                pre_tok.append(n)
                budget -= n
        if all_resumed and self._may_admit() and not self._still_blocked():
            budget = self._admit_waiting(budget, True, pre_ids, pre_tok)
        if pre_ids:
            ids = np.array(pre_ids, _I64)
            batch.set_prefill(ids, pre_tok, t.prefilled[ids])
        return batch

    # ---------------------------------------------------------------- after the iteration
    def complete_step(self, batch: StepBatch, now: float) -> list[int]:
        t = self.t
        finished: list[int] = []
        self.steps_without_token += 1  # back to 0 below with the first token handed out
        if len(batch.decode_seq_ids):
            self.steps_without_token = 0
            self._K += 1
            self._decode_itl(now)
            finished.extend(self._decoded())
        for i in batch.prefill_seq_ids.tolist():
            if t.prefilled[i] < t.target[i] or t.status[i] != _RUNNING:
                continue
            self.steps_without_token = 0
            t.generated[i] += 1
            if math.isnan(t.first_token_s[i]):
                t.first_token_s[i] = now
            else:  # a recompute: the gap since the last token is an inter-token latency
                self._record_itl(np.array([now - t.last_token_s[i]]), np.array([1]))
            t.last_token_s[i] = now
            if t.generated[i] >= t.output[i]:
                finished.append(i)
            else:
                if t.width[i] > 1 and not t.forked[i]:
                    self._fork_children(i)
                self._join(i)
        for i in finished:
            self._finish(i, now)
        if self.beam_churn > 0 and len(batch.decode_seq_ids) and t.seqs:
            self._beam_churn()
        return finished

    def _fork_children(self, i: int) -> None:
        t = self.t
        ids = [i]
        for _ in range(int(t.width[i]) - 1):
            c = self.next_seq_id
            self.next_seq_id += 1
            self.mgr.fork(i, c, t.final_len(i))
            ids.append(c)
        t.seqs[i] = ids
        t.forked[i] = True
        self.running_seqs += len(ids) - 1

    def _beam_churn(self) -> None:
        """Beam search: some beams die and are replaced by forks of surviving ones."""
        t = self.t
        for i in self.running:
            if t.beam[i] <= 1 or i not in t.seqs:
                continue
            seqs = t.seqs[i]
            k = len(seqs)
            dies = self.rng.random(k) < self.beam_churn
            if dies.all():
                dies[self.rng.integers(k)] = False
            if not dies.any():
                continue
            self._free_epoch += 1
            alive = [s for s, d in zip(seqs, dies) if not d]
            new = list(alive)
            for s, d in zip(seqs, dies):
                if d:
                    self.mgr.free(s)
            for _ in range(int(dies.sum())):
                parent = alive[int(self.rng.integers(len(alive)))]
                c = self.next_seq_id
                self.next_seq_id += 1
                self.mgr.fork(parent, c, t.final_len(i))
                new.append(c)
            t.seqs[i] = new
            self._dseqs_stale = True

    def _finish(self, i: int, now: float) -> None:
        t = self.t
        self._free_epoch += 1
        seqs = t.seq_ids(i)
        for s in seqs:
            self.mgr.free(s)
        self.running_seqs -= len(seqs)
        self.running.remove(i)
        t.seqs.pop(i, None)
        t.status[i] = _FINISHED
        t.finish_s[i] = now

    def check(self) -> None:
        """``--check``: the incremental decode set and the admission shortcut against their
        definitions, recomputed from scratch (AssertionError names what drifted)."""
        t, K = self.t, self._K
        running = set(self.running)
        assert set(self._dec_goff) <= running, "a decode-set member is not running"
        widths = {i: len(t.seq_ids(i)) for i in self._dec_goff}
        assert self._dec_width == widths and self._dec_nseq == sum(widths.values()), "decode-set widths drifted"
        ctx = sum(w * (int(t.prompt[i]) + self._dec_goff[i] + K) for i, w in widths.items())
        assert self._decode_context_sum() == ctx, "decode context sum drifted"
        live = {(h[2], h[3]): h[0] for h in self._fin}
        for i, goff in self._dec_goff.items():
            g = goff + K
            assert t.status[i] == Status.RUNNING and 1 <= g < int(t.output[i]), f"member {i}: generated {g}"
            assert live.get((i, goff)) == int(t.output[i]) - goff, f"member {i}: finish step drifted"
        if not self._dseqs_stale:
            seqs = [s for i in self._dec_goff for s in t.seq_ids(i)]
            assert self._dseqs.tolist() == seqs, "decode-set sequence array drifted"
        b = self._blocked
        if (b is not None and self.waiting and b[0] == self.waiting[0] and b[1] == self._free_epoch
                and not self._cache_hits_possible):  # the head is skipped: it must not fit
            i = b[0]
            full = self.running_seqs + int(t.width[i]) > self.max_num_seqs
            assert full or self.mgr.can_allocate(self._spec(i, int(t.target[i]))) is not Admit.OK, \
                f"queue head {i} is skipped as blocked but would be admitted"

    def _record_itl(self, itl: np.ndarray, weights: np.ndarray) -> None:
        self._itl_arrays.append((np.asarray(itl, float), np.asarray(weights)))

    def itl_stats(self) -> tuple[float, int, np.ndarray, np.ndarray]:
        """(sum, count, histogram, bin edges) of inter-token latencies; flushes the buffers."""
        vals = [np.asarray(self._itl_scalars, float)] + [a for a, _ in self._itl_arrays]
        wts = [np.asarray(self._itl_scalar_w, np.int64)] + [np.asarray(w, np.int64) for _, w in self._itl_arrays]
        v = np.concatenate(vals)
        w = np.concatenate(wts)
        if len(v):
            self.itl_sum += float(np.dot(v, w))
            self.itl_count += int(w.sum())
            idx = np.searchsorted(self.itl_edges, v)
            self.itl_hist += np.bincount(idx, weights=w, minlength=len(self.itl_hist)).astype(_I64)
        self._itl_scalars, self._itl_scalar_w, self._itl_arrays = [], [], []
        return self.itl_sum, self.itl_count, self.itl_hist, self.itl_edges
