"""Request-level (static) batching, as FasterTransformer serves.

Take up to B earliest waiting requests (B: as many ``max_seq_len`` slots as the pool holds,
or ``static_batch_size``), prefill them together, then decode until the batch's longest member
finishes; nobody joins mid-batch. The batch is padded: the prefill is priced as
``B x longest prompt`` tokens and every decode step computes all B sequences, finished or not
(that is the compute a padded ``[batch, seq]`` tensor costs). Results return when the whole
batch ends, so every member's finish time is the batch's.
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.batch import StepBatch
from pagesim.sim.memory.base import Admit, KVCacheManager, SeqSpec
from pagesim.sim.sched.continuous import ContinuousScheduler
from pagesim.sim.sched.state import RequestTable, Status

_I64 = np.int64


class StaticScheduler(ContinuousScheduler):
    name = "static"
    macro_steps_ok = False  # its own fast path; the engine runs it step by step

    def __init__(self, cfg, table: RequestTable, manager: KVCacheManager, **kw):
        super().__init__(cfg, table, manager, **kw)
        slots = getattr(manager, "num_slots", None) or max(1, manager.capacity // self.max_seq_len)
        self.batch_limit = min(cfg.static_batch_size or slots, slots, self.max_num_seqs)
        self.batch: np.ndarray = np.zeros(0, _I64)
        self._live: np.ndarray | None = None

    def width_reason(self, i: int) -> str:
        return "static batching runs one sequence per request (n = beam_width = 1)"

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or len(self.batch))

    @property
    def num_running(self) -> int:
        return len(self.batch)

    def schedule(self, now: float) -> StepBatch:
        t = self.t
        self.demand_waiting = False
        batch = StepBatch()
        if not len(self.batch):
            members = []
            while self.waiting and len(members) < self.batch_limit:
                i = self.waiting[0]
                if t.width[i] > 1:
                    self.waiting.popleft()
                    self._reject(i, self.width_reason(i))
                    continue
                spec = SeqSpec(i, int(t.prompt[i]), t.final_len(i))
                adm = self.mgr.can_allocate(spec)
                if adm is Admit.NEVER:
                    self.waiting.popleft()
                    self._reject(i, self.never_reason(i))
                    continue
                if adm is Admit.LATER:
                    self.demand_waiting = True
                    break
                self.waiting.popleft()
                self.mgr.allocate(spec)
                self.mgr.append(i, int(t.prompt[i]))
                t.prefilled[i] = t.prompt[i]
                t.status[i] = Status.RUNNING
                members.append(i)
            if not members:
                return batch
            self.batch = np.array(members, _I64)
            self._live = None
            longest = int(t.prompt[self.batch].max())
            batch.prefill_seq_ids = self.batch
            batch.prefill_tokens = np.full(len(self.batch), longest, _I64)  # padded
            batch.prefill_context = batch.prefill_tokens.copy()
            return batch
        # decode: everyone still generating appends a token; finished members only pad.
        # The live set is recomputed only when a member finishes, so the manager sees the same
        # array object step after step (its decode lane makes that O(1)).
        if self._live is None:
            self._live = self.batch[t.generated[self.batch] < t.output[self.batch]]
        live = self._live
        if len(live):
            self.mgr.append_batch(live)
        batch.decode_seq_ids = self.batch
        batch.decode_context = t.prompt[self.batch] + np.minimum(t.generated[self.batch], t.output[self.batch])
        return batch

    def complete_step(self, batch: StepBatch, now: float) -> list[int]:
        t = self.t
        if len(batch.prefill_seq_ids):
            ids = self.batch
            t.generated[ids] = 1
            t.first_token_s[ids] = now
            t.last_token_s[ids] = now
        else:
            live = self._live
            t.generated[live] += 1
            self._itl_scalars.append(now - float(t.last_token_s[live[0]]))
            self._itl_scalar_w.append(len(live))
            if len(self._itl_scalars) > 65536:
                self.itl_stats()  # fold into the histogram
            t.last_token_s[live] = now
            if (t.generated[live] >= t.output[live]).any():
                self._live = None
        if (t.generated[self.batch] >= t.output[self.batch]).all():
            done = self.batch.tolist()
            for i in done:
                self.mgr.free(i)
                t.status[i] = Status.FINISHED
                t.finish_s[i] = now
            self.batch = np.zeros(0, _I64)
            return done
        return []
