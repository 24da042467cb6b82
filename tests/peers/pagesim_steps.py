"""pagesim over a peer workload (``--system vllm-v1`` or ``vllm``), one ``Step`` record per iteration.

An executor outside the core (``sim/executor.py``) reads each iteration as the core scheduled it,
before it completes, and says it lasts ``STEP_S``: the prefill chunks (``step_prefill_ids``,
``step_prefill_tokens``), the running requests that decode a token per sequence (``in_decode``),
who was preempted while scheduling it (``num_preemptions`` went up), who was swapped out or in
(its status) and the free blocks. A request's
finish is seen at the next step (or the run's end): it is set when the step completes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types

import numpy as np
import pandas as pd

from tests.peers.workloads import STEP_S, Layers, Step, Workload

from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache, prefix_cache
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.core.state import FULL_GROUPS, SLIDING_GROUPS, STATE_GROUPS
from pagesim.sim.run import run_simulation
from pagesim.sim.specs import presets
from pagesim.sim.specs.kv_groups import kv_cache_groups
from pagesim.sim.specs.model import GATED_DELTA_NET, MAMBA, GatedDeltaNet, MambaMixer, ModelSpec
from pagesim.sim.core.kv.host_tier import (HOST_KEY_CHAIN, HOST_KEY_END, HOST_RANK, OFFLOAD_GPU_HITS,
                                           OFFLOAD_LOADING)
from pagesim.sim.core.kv.prefix_cache import KEY_GROUP
from pagesim.sim.core.sched.speculative import SPEC_DRAFTS

OPT13B_SLOT = 819200  # KV bytes per token of OPT-13B (tests/sim/helpers.py): the pool is kv_gib / this


def gib(blocks: int, workload: Workload) -> float:
    return blocks * workload.block_size * OPT13B_SLOT / 2**30


def model_of(layers: Layers) -> ModelSpec:
    """pagesim's model of ``layers``: its preset, or a tiny model of those layers (its other
    shapes only price steps, which the executor times itself)."""
    if layers.preset:
        return presets.MODELS[layers.preset]
    mamba = MambaMixer(layers.mamba_inner, layers.mamba_state, 4, 4) if layers.mamba_inner else None
    if layers.prefill_checkpoint_alignment:  # gated-delta-net layers on FlashInfer: pagesim tells them apart
        kinds = tuple(GATED_DELTA_NET if kind == MAMBA else kind for kind in layers.kinds)
        return ModelSpec(layers.name, len(kinds), 64, layers.num_kv_heads, layers.num_kv_heads, layers.head_size,
                         64, 100, 8192, layer_kinds=kinds, delta_net=GatedDeltaNet(1, 1, 4, 4, 4))
    return ModelSpec(layers.name, len(layers.kinds), 64, layers.num_kv_heads, layers.num_kv_heads, layers.head_size,
                     64, 100, 8192, layer_kinds=layers.kinds, sliding_window=layers.window or None, mamba=mamba)


@contextlib.contextmanager
def registered(workload: Workload):
    """A tiny model of ``workload.layers`` known to pagesim's presets while its run lasts."""
    layers = workload.layers
    if layers is None or layers.preset:
        yield
        return
    presets.MODELS[layers.name] = model_of(layers)
    try:
        yield
    finally:
        del presets.MODELS[layers.name]


def group_settings(workload: Workload) -> dict:
    """The model and KV memory of ``num_blocks`` blocks of ``workload.layers``' groups (pagesim's
    grouping: one block is ``block_size`` tokens of one group's layers)."""
    model = model_of(workload.layers)
    per_block = kv_cache_groups(model).bytes_per_block(model, workload.block_size)
    return dict(model=model.name, kv_gib=workload.num_blocks * per_block / 2**30,
                gpu="h100-80gb" if workload.layers.preset else "a100-40gb")


def config(workload: Workload, system: str, **overrides) -> SimConfig:
    """pagesim's settings for ``workload`` as ``system`` models its vLLM release; ``overrides``
    replace them where a peer on the same system differs (nano-vllm: ``nano_vllm.PAGESIM_SETTINGS``)."""
    settings = dict(model="opt-13b", gpu="a100-40gb", block_size=workload.block_size,
                    kv_gib=gib(workload.num_blocks, workload), max_seq_len=workload.max_model_len,
                    max_num_seqs=workload.max_num_seqs, max_num_batched_tokens=workload.max_num_batched_tokens,
                    prefix_caching=workload.prefix_caching, cost_model="roofline")
    if workload.layers is not None:
        settings.update(group_settings(workload))
    if workload.host_blocks:  # the CPU offload tier of that many blocks (vllm_offload.py)
        settings.update(kv_offload_gib=gib(workload.host_blocks, workload))
    if system == "vllm-v1":
        settings.update(scheduling_policy=workload.policy, watermark=0.0, async_scheduling=False)
        if workload.num_speculative_tokens:
            settings.update(num_speculative_tokens=workload.num_speculative_tokens,
                            speculative_method=workload.speculative_method,
                            spec_acceptance_rate=workload.spec_acceptance_rate)
            if workload.speculative_method == "draft-model":
                settings.update(draft_model="opt-13b")  # its price only: the peer times the steps itself
    else:
        # vLLM 0.4.2: a watermark of 1 % (block_manager_v1.py:219); both its block managers' decode
        # rule is one free block per running sequence (block_manager_v1.py:308-318; v2's "touched
        # blocks", block_manager_v2.py:136-163, are one per sequence for a one-token step)
        if workload.chunked_prefill:
            settings.update(chunked_prefill=True, chunk_budget=workload.max_num_batched_tokens)
        settings.update(watermark=0.01, preemption=workload.preemption, swap_gib=gib(workload.cpu_blocks, workload),
                        append_rule="free-block-per-seq")
    return SimConfig.for_system(system, **{**settings, **overrides})


def trace(workload: Workload) -> pd.DataFrame:
    rows = workload.requests
    df = pd.DataFrame({"request_id": [f"r{i:06d}" for i in range(len(rows))],
                       "arrival_s": [r.arrival_s for r in rows], "prompt_tokens": [r.prompt for r in rows],
                       "output_tokens": [r.output for r in rows]})
    if workload.policy != "fcfs":
        df["priority"] = [r.priority for r in rows]
    if any(r.n > 1 for r in rows):
        df["n"] = [r.n for r in rows]
    if any(r.beam > 1 for r in rows):
        df["beam_width"] = [r.beam for r in rows]
    if any(r.hashes for r in rows):
        df["prefix_hashes"] = [tuple(r.hashes) for r in rows]
        df.attrs["hash_block_tokens"] = workload.block_size
    return df


def group_blocks(core) -> dict:
    """With KV cache groups: each running request's blocks held in each group's table (full
    groups first, state ones last), read from the tables (a block a sliding group freed is -1
    there; a state group's blocks, its state's and one per draft, are its first columns:
    kv_cache.state_blocks)."""
    attention, states = int(core.config[FULL_GROUPS] + core.config[SLIDING_GROUPS]), int(core.config[STATE_GROUPS])
    if not (core.config[SLIDING_GROUPS] or states):
        return {}
    width = core.block_table.shape[1] // (attention + states)
    per = 1 + int(core.config[state.SPEC_TOKENS])
    align = bool(core.config[state.MAMBA_ALIGN])  # position-indexed, most columns null
    held = {}
    for i in core.running[:core.count[state.NUM_RUNNING]]:
        row = core.block_table[core.seq_slot[i, 0]]
        held[int(i)] = (tuple(int(np.count_nonzero(row[g * width:g * width + core.num_blocks[i]] >= 0))
                              for g in range(attention))
                        + tuple(int(np.count_nonzero(row[g * width:g * width + (core.num_blocks[i] if align else per)]
                                                     >= 0)) if core.num_blocks[i] else 0
                                for g in range(attention, attention + states)))
    return held


def group_cached(core) -> tuple:
    """Prefix caching over KV cache groups: the blocks cached under a key in each group (full
    groups first, as ``group_blocks``; ``block_info`` ``KEY_GROUP``), copies of a key too."""
    if not ((core.config[SLIDING_GROUPS] or core.config[state.MAMBA_ALIGN]) and core.config[state.PREFIX_CACHING]):
        return ()
    info = core.block_info[:int(core.config[state.NUM_BLOCKS])]
    keyed = info[:, state.KEY_END] > 0
    groups = int(core.config[FULL_GROUPS] + core.config[SLIDING_GROUPS])
    groups += int(core.config[STATE_GROUPS]) if core.config[state.MAMBA_ALIGN] else 0
    return tuple(int(np.count_nonzero(keyed & (info[:, KEY_GROUP] == g))) for g in range(groups))


class Recorder:
    """The executor: one ``Step`` per iteration. With speculative decoding it only times the
    steps (``only_times``): the core draws which drafts each accepts, and the record takes
    those kept from the tokens each verifying request gained by the next step (``kept``)."""

    only_times = True

    def __init__(self, workload: Workload):
        self.workload = workload
        self.steps: list[Step] = []
        self.free_blocks = interpreted(kv_cache.num_free_blocks)
        self.verifying: dict = {}  # request -> its tokens generated before the step's verification

    def start(self, core):
        blocks = core.config[state.NUM_BLOCKS]
        assert blocks == self.workload.num_blocks, f"pagesim's pool has {blocks} blocks, not {self.workload.num_blocks}"
        self.preemptions = core.num_preemptions.copy()
        self.status = core.status.copy()
        self.finished = set()
        self.running = set()  # the running list at the last record: an admission is a request new to it

    def newly_finished(self, core):
        done = set(np.flatnonzero(core.status == state.FINISHED).tolist())
        new, self.finished = frozenset(done - self.finished), done
        return new

    def kept(self, core) -> dict:
        """The drafts each request that verified some in the step before kept: the tokens it
        gained, less the one every decode gives (its accepted drafts, less any past its output
        length: ``speculative.accept``)."""
        return {i: int(core.num_generated[i]) - before - 1 for i, before in self.verifying.items()}

    def ended(self, core):
        """The previous step's outcome, known now: who finished, what each verification kept
        (a record without speculation has no ``kept``: sglang_scheduler.SglangStep)."""
        if self.steps:
            kept = dict(kept=self.kept(core)) if self.verifying else {}
            self.steps[-1] = dataclasses.replace(self.steps[-1], finished=self.newly_finished(core), **kept)

    def step(self, core):
        self.ended(core)
        c = core.count
        speculating = bool(core.config[state.SPEC_TOKENS])
        scheduled = {int(core.step_prefill_ids[k]): int(core.step_prefill_tokens[k])
                     for k in range(c[state.STEP_PREFILL_SEQS])}
        drafts, self.verifying = {}, {}
        for i in list(scheduled) if speculating else ():  # an admission padded with placeholders (speculative.pads)
            if core.speculative[i, SPEC_DRAFTS]:
                drafts[i] = int(core.speculative[i, SPEC_DRAFTS])
                scheduled[i] += drafts[i]
                self.verifying[i] = int(core.num_generated[i])
        for i in core.running[:c[state.NUM_RUNNING]] if c[state.STEP_DECODE_SEQS] else ():  # v0: not in a prefill step
            if core.in_decode[i]:
                assert int(i) not in scheduled, f"request {i} both prefills and decodes"
                scheduled[int(i)] = int(core.num_seqs[i])
                if speculating and core.speculative[i, SPEC_DRAFTS]:
                    drafts[int(i)] = int(core.speculative[i, SPEC_DRAFTS])
                    scheduled[int(i)] += drafts[int(i)]
                    # num_generated counts the decode's own token only when the step completes
                    self.verifying[int(i)] = int(core.num_generated[i])
        blocks = {int(i): int(core.num_blocks[i]) for i in core.running[:c[state.NUM_RUNNING]]} if speculating else {}
        preempted = frozenset(np.flatnonzero(core.num_preemptions > self.preemptions).tolist())
        swapped = core.status == state.SWAPPED
        swapped_out = frozenset(np.flatnonzero(swapped & (self.status != state.SWAPPED)).tolist())
        swapped_in = frozenset(np.flatnonzero(~swapped & (self.status == state.SWAPPED)).tolist())
        self.preemptions, self.status = core.num_preemptions.copy(), core.status.copy()
        cached = group_cached(core)
        running = set(core.running[:c[state.NUM_RUNNING]].tolist())
        # each admission's hit: the prompt tokens it had computed before its chunk (vLLM's records
        # them with prefix caching over groups: vllm_v1.Lookups)
        hits = {i: int(core.num_prompt_computed[i]) - scheduled[i] for i in sorted(running - self.running)
                if i in scheduled} if cached else {}
        self.running = running
        self.steps.append(Step(float(core.clock[state.NOW]), scheduled, preempted, int(self.free_blocks(core)),
                               swapped_out=swapped_out, swapped_in=swapped_in, drafts=drafts, blocks=blocks,
                               group_blocks=group_blocks(core), hits=hits, group_cached=cached))
        return STEP_S

    def finish(self, core):
        self.ended(core)


class OffloadRecorder(Recorder):
    """``Recorder`` with the CPU offload tier's record (sim/core/kv/host_tier.py; vllm_offload.py):
    the host blocks once the step is scheduled, named by the first (request, block index) whose
    prompt key (end token, chain: ``prefix_cache.key_chain``) is theirs, and the hits of each
    admission since the last record: a request admitted since (it was neither running nor
    loading then, or has been preempted since) holds GPU hits and host hits its load started
    with (``OFFLOAD_GPU_HITS``, ``OFFLOAD_LOADING``, while it loads; a load started since, over
    by this step, is told by its new ``load_ready_s``), or the tokens it had computed before
    this step's chunk (its tokens less the drafts it verifies). ``order``: the LRU list from its head, too."""

    def __init__(self, workload: Workload, order: bool = False):
        super().__init__(workload)
        self.order = order

    def start(self, core):
        super().start(core)
        assert core.config[state.HOST_BLOCKS] == self.workload.host_blocks, \
            f"pagesim's host tier has {core.config[state.HOST_BLOCKS]} blocks, not {self.workload.host_blocks}"
        key_chain, bs = interpreted(prefix_cache.key_chain), self.workload.block_size
        self.names = {}
        for i, row in enumerate(self.workload.requests):
            for k in range(row.prompt // bs):
                self.names.setdefault(((k + 1) * bs, int(key_chain(core, i, k))), (i, k))
        self.was_admitted = np.zeros(len(self.workload.requests), bool)
        self.load_ready = core.load_ready_s.copy()

    def host_order(self, core) -> tuple:
        """The tier's blocks by their LRU rank, the lowest (the next evicted, pins aside) first."""
        used = core.host_blocks[:int(core.count[state.HOST_USED])]
        return tuple(self.names[(int(row[HOST_KEY_END]), int(row[HOST_KEY_CHAIN]))]
                     for row in sorted(used, key=lambda row: int(row[HOST_RANK])))

    def step(self, core):
        before = core.num_preemptions > self.preemptions  # preempted since the last record
        duration = super().step(core)
        record = self.steps[-1]
        loading = core.offload[:, OFFLOAD_LOADING] > 0
        admitted_now = (core.status == state.RUNNING) | loading
        new_load = core.load_ready_s != self.load_ready
        bs = self.workload.block_size
        admitted = {}
        for i in np.flatnonzero(admitted_now & (~self.was_admitted | before)).tolist():
            gpu = int(core.offload[i, OFFLOAD_GPU_HITS]) * bs
            if loading[i]:
                admitted[i] = (gpu, int(core.offload[i, OFFLOAD_LOADING]) * bs)
                continue
            # (a padded admission's placeholder drafts are scheduled, not computed: speculative.pads)
            computed = int(core.num_prompt_computed[i]) - record.scheduled.get(i, 0) + record.drafts.get(i, 0)
            # (a load is of whole blocks: one of all its tokens left the last to compute, host_tier.start_load)
            admitted[i] = (gpu, -((gpu - computed) // bs) * bs) if new_load[i] else (computed, 0)
        self.was_admitted, self.load_ready = admitted_now, core.load_ready_s.copy()
        order = self.host_order(core)
        self.steps[-1] = dataclasses.replace(record, host_blocks=frozenset(order), admitted=admitted,
                                             host_order=order if self.order else ())
        return duration


def host_block_seconds(workload: Workload) -> float:
    """The seconds pagesim prices a block at over the host link for ``workload`` (its
    ``HOST_BLOCK_S``: sim/core/build.py's ``host_tier_size``), which vllm_offload.Worker takes."""
    from pagesim.sim.core.build import host_tier_size

    cfg = config(workload, "vllm-v1")
    blocks, seconds = host_tier_size(cfg, types.SimpleNamespace(block_size=workload.block_size), OPT13B_SLOT)
    assert blocks == workload.host_blocks, (blocks, workload.host_blocks)
    return seconds


def run(workload: Workload, system: str = "vllm-v1", order: bool = False, **overrides) -> list[Step]:
    """pagesim's steps over ``workload`` as ``system`` (``overrides``: as ``config``'s; with a
    host tier, its record too, ``order``: its LRU order)."""
    recorder = OffloadRecorder(workload, order) if workload.host_blocks else Recorder(workload)
    with registered(workload):
        run_simulation(config(workload, system, **overrides), trace(workload), executor=recorder)
    return recorder.steps
