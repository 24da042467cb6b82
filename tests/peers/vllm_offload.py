"""vLLM 0.33.0's v1 ``Scheduler`` with its CPU offload tier, run on CPU step by step beside
pagesim's ``--system vllm-v1 --kv-offload-gib N``.

What ``--kv-offloading-size N`` makes of the engine (config/vllm.py:1157-1175): a
``kv_transfer_config`` naming the ``OffloadingConnector`` with ``kv_role`` "kv_both" and
``cpu_bytes_to_use``. Executed from vLLM's source (on top of ``vllm_v1.REAL``): the connector
(``distributed/kv_transfer/kv_connector/v1/offloading_connector.py``) and its base class, its
scheduler side (``offloading/scheduler.py``, ``config.py``, ``common.py``, ``events.py``,
``metrics.py``), the offloading spec, factory and base (``v1/kv_offload/``), the CPU spec, its
manager (``cpu/manager.py``) and LRU policy (``cpu/policies/lru.py``). The scheduler role only:
the worker side (``offloading/worker.py``, ``cpu/gpu_worker.py``: CUDA copies) is a stub that
raises if called. ``Worker`` below stands for it: it reads each step's
``OffloadingConnectorMetadata`` (the load and store jobs the scheduler side built) and reports
what the real worker's ``get_finished`` and ``build_connector_worker_meta`` would
(offloading/worker.py: the jobs completed, ``finished_recving`` for a load's request) in the
``KVConnectorOutput`` of the step in which the transfer ends.

**When a transfer ends: pagesim's link, stated.** A transfer ends when pagesim's model says
(sim/core/kv/host_tier.py): each direction of the host link (loads, stores) takes one job after the
other from the step's start, ``blocks x host_block_s`` each (``host_block_s``: the seconds pagesim
prices a block at over the GPU preset's ``pcie_bw``, read from pagesim's own settings for the
workload: ``pagesim_steps.host_block_seconds``). Steps last ``STEP_S`` (1 s); a step that
schedules nothing while loads are in flight lasts until the first of them ends (or the next
arrival), as pagesim's loop wakes then (sim/core/events/loop.py); a step that schedules nothing else
still hands vLLM its (empty) output and the connector's report, as ``EngineCore.step`` does.
With the workloads' few blocks each transfer ends within its step. vLLM's worker submits a
store at the next step's start (``prepare_store_kv``, worker.py, deferred to
``start_kv_transfers``), which pagesim does not model (host_tier.py, "not modelled");
``Worker(deferred_stores=True)`` reports each store a step later, as that worker does
(a diagnosis: ``compare --offload --deferred-stores``).

Each step's record adds (``Step``): the host tier's blocks once the step is scheduled (the
set of prompt blocks it holds, each named by the first request and block index whose prompt
has it: ``BlockNames``), and the GPU and host hit tokens of each admission whose lookup was
made since the last record (an admission that loads, in a step that schedules nothing else,
goes to the next record on both sides). ``host_order``: the tier's blocks in eviction order
(vLLM: by its LRU policy's rank, cpu/policies/lru.py; pagesim: by its ranks, the order of its
lists), recorded only when asked (``run(order=True)``): the two part only where requests that
finished in one step touch their blocks, vLLM in a Python set's order, pagesim in finishing order
(``test_the_lru_order_is_vllms``).
"""

from __future__ import annotations

import dataclasses
import mmap
import types
from typing import Literal, get_args

from tests.peers import vllm_v1
from tests.peers.importing import Peer, constants, members, placeholders
from tests.peers.vllm_v1 import Settings
from tests.peers.workloads import STEP_S, Step, Workload

# vLLM's modules executed as they are, beyond the scheduler's
OFFLOAD_REAL = (
    "vllm.v1.metrics.cache_hit_source",
    "vllm.distributed.kv_transfer.kv_connector.v1.base",
    "vllm.distributed.kv_transfer.kv_connector.v1",
    "vllm.distributed.kv_transfer.kv_connector.v1.metrics",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.common",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.config",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.events",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
    "vllm.v1.kv_offload.config", "vllm.v1.kv_offload.base", "vllm.v1.kv_offload.factory",
    "vllm.v1.kv_offload.cpu.common", "vllm.v1.kv_offload.cpu.spec", "vllm.v1.kv_offload.cpu.manager",
    "vllm.v1.kv_offload.cpu.policies.base", "vllm.v1.kv_offload.cpu.policies.factory",
    "vllm.v1.kv_offload.cpu.policies.lru",
)


class SharedOffloadRegion:
    """``cpu/shared_offload_region.py``'s class as the CPU spec reads it on the scheduler side:
    its chunk alignment alone, the page size (``BLOCK_SIZE_ALIGNMENT: int = mmap.PAGESIZE``,
    :105); the region itself (a worker's mmap) is never built here."""

    BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE


def yield_req_data(scheduler_output):
    raise RuntimeError("replaced by kv_connector/utils.py's own yield_req_data (load)")


class ConnectorFactory:
    """``KVConnectorFactory.create_connector`` (kv_connector/factory.py:43-75) for the one
    connector configured: its class, refused under the hybrid manager unless it supports it
    (``SupportsHMA``, :54-60: the OffloadingConnector does), built for the role asked."""

    @staticmethod
    def create_connector(config, role, kv_cache_config):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

        assert config.kv_transfer_config.kv_connector == "OffloadingConnector", config.kv_transfer_config.kv_connector
        if not config.scheduler_config.disable_hybrid_kv_cache_manager:
            assert issubclass(OffloadingConnector, SupportsHMA)
        return OffloadingConnector(config, role, kv_cache_config)


STUBS = {
    **vllm_v1.STUBS,  # (the dicts vllm_v1.compile_stubs fills are shared; those extended are copies)
    "vllm.config": {**vllm_v1.STUBS["vllm.config"], **placeholders("KVTransferConfig")},
    "vllm.distributed.kv_events": {**vllm_v1.STUBS["vllm.distributed.kv_events"], "MEDIUM_STORAGE": "STORAGE"},
    # the connector's factory: only OffloadingConnector is configured (KVConnectorFactory's
    # registry imports every connector)
    "vllm.distributed.kv_transfer.kv_connector.factory": {"KVConnectorFactory": ConnectorFactory},
    # yield_req_data: compiled from kv_connector/utils.py (the module imports the model executor)
    "vllm.distributed.kv_transfer.kv_connector.utils": {"yield_req_data": yield_req_data},
    "vllm.distributed.kv_transfer.kv_connector.v1.decode_bench_connector": placeholders("DecodeBenchConnector"),
    # the worker side: CUDA copies, never run here (``Worker`` reports what it would)
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker": placeholders("OffloadingConnectorWorker"),
    "vllm.v1.kv_offload.cpu.gpu_worker": placeholders("CPUOffloadingWorker"),
    "vllm.v1.kv_offload.cpu.shared_offload_region": {"SharedOffloadRegion": SharedOffloadRegion},
    "vllm.forward_context": placeholders("ForwardContext"),
    "vllm.v1.attention.backend": placeholders("MultipleOf", "AttentionMetadata"),
    "vllm.v1.kv_hints": placeholders("KvHintsEnvelope"),
    "prometheus_client": placeholders("Counter", "Gauge", "Histogram"),  # metrics' exporters, never built
}
PEER = Peer("0.33.0", vllm_v1.REAL + OFFLOAD_REAL, STUBS, "tests/peers/vllm_offload.py")



class TransferSettings(Settings):
    """``KVTransferConfig`` (config/kv_transfer.py): its fields as given, and its roles
    (``is_kv_producer``, ``is_kv_consumer``, :131-136) compiled from vLLM's source."""


def compile_stubs() -> None:
    """``yield_req_data`` (kv_connector/utils.py:320-339) and ``KVTransferConfig``'s roles, from
    vLLM's source; the scheduler's own (``vllm_v1.compile_stubs``)."""
    from tests.peers.importing import functions

    if "get_dtype_size" not in STUBS["vllm.utils.torch_utils"]:
        vllm_v1.compile_stubs()  # the same stub dicts: vllm_v1.STUBS' are shared
    STUBS["vllm.distributed.kv_transfer.kv_connector.utils"].update(
        functions(PEER, "vllm.distributed.kv_transfer.kv_connector.utils", ("yield_req_data",), {"chain": None}))
    roles = constants(PEER, "vllm.config.kv_transfer", ("KVProducer", "KVConsumer"), {"Literal": Literal})
    for name, member in members(PEER, "vllm.config.kv_transfer", "KVTransferConfig",
                                ("is_kv_producer", "is_kv_consumer"), {"get_args": get_args, **roles}).items():
        setattr(TransferSettings, name, member)


def load() -> types.SimpleNamespace:
    """vLLM 0.33.0's scheduler (``vllm_v1.load``'s, under this driver's modules) and the
    connector's pieces the driver reads."""
    if PEER.fetched() and getattr(TransferSettings, "is_kv_producer", None) is None:
        compile_stubs()
    vllm = vllm_v1.load(PEER)
    with PEER.active():
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.kv_offload.base import get_offload_block_hash
        from vllm.v1.outputs import KVConnectorOutput
    vllm.OffloadingWorkerMetadata, vllm.KVConnectorOutput = OffloadingWorkerMetadata, KVConnectorOutput
    vllm.get_offload_block_hash = get_offload_block_hash
    return vllm


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def build(vllm, workload: Workload):
    """``vllm_v1.build``'s scheduler with the connector ``--kv-offloading-size`` configures
    (config/vllm.py:1157-1175: ``OffloadingConnector``, ``kv_both``, ``cpu_bytes_to_use``), the
    CPU bytes those of ``workload.host_blocks`` chunks of one block each (cpu/spec.py:111-123:
    ``cpu_bytes_to_use // round_up(a block's bytes, the page size)``); the settings the connector
    reads, at vLLM's defaults (config/kv_transfer.py, config/parallel.py, config/cache.py)."""
    page = vllm.FullAttentionSpec(block_size=workload.block_size, num_kv_heads=1, head_size=1,
                                  dtype=vllm.float16).page_size_bytes  # vllm_v1.layer_specs' one layer
    cpu_bytes = workload.host_blocks * round_up(page, SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT)

    def configure(vllm_config):
        vllm_config.kv_transfer_config = TransferSettings(
            kv_connector="OffloadingConnector", kv_role="kv_both", engine_id="pagesim-peer",
            kv_connector_extra_config={"cpu_bytes_to_use": cpu_bytes}, kv_load_failure_policy="fail")
        vllm_config.kv_events_config = None
        # the settings build_offloading_config reads (offloading/config.py:88-323): one GPU, no
        # MLA, the model's dtype for the cache, the default layout; none decides a chunk here
        model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
        model.use_mla, model.model, model.dtype = False, "pagesim-peer", "float16"
        model.get_total_num_kv_heads = lambda: 1
        parallel.rank, parallel.world_size, parallel.tensor_parallel_size = 0, 1, 1
        parallel.data_parallel_rank_local = None
        cache.cache_dtype, cache.kv_cache_layout = "auto", None

    scheduler = vllm_v1.build(vllm, workload, configure)
    manager = scheduler.connector.connector_scheduler.manager
    assert manager._num_chunks == workload.host_blocks, (manager._num_chunks, workload.host_blocks)
    return scheduler


@dataclasses.dataclass
class Transfer:
    job: int
    end_s: float
    request: str | None  # a load's request (its finished_recving), None for a store


class Worker:
    """The offloading connector's worker side, as the scheduler side hears of it
    (offloading/worker.py: ``start_kv_transfers``, ``prepare_store_kv``, ``get_finished``,
    ``build_connector_worker_meta``), its transfers timed by pagesim's model of the host link
    (module docstring): each direction runs its jobs in order, a load of ``n`` blocks taking ``n
    x host_block_s`` from when the link is free, a store its blocks one after the other (as
    sim/core/kv/host_tier.py's ``start_load`` and ``offer`` add them up). ``deferred_stores``: a
    step's stores start at the next step's start, as vLLM's worker submits them (``jobs_to_flush``
    at once: ``handle_preemptions``)."""

    def __init__(self, vllm, host_block_s: float, deferred_stores: bool = False):
        self.vllm, self.host_block_s, self.deferred_stores = vllm, host_block_s, deferred_stores
        self.load_free = self.store_free = 0.0
        self.in_flight: list[Transfer] = []
        self.held: list[tuple[int, int]] = []  # (job, blocks): stores submitted at the next step's start

    def store(self, job: int, blocks: int, now: float) -> None:
        for _ in range(blocks):
            self.store_free = max(now, self.store_free) + self.host_block_s
        self.in_flight.append(Transfer(job, self.store_free, None))

    def submit(self, meta, now: float) -> None:
        """The step's jobs (``meta``: its ``OffloadingConnectorMetadata``), from ``now``."""
        for job, blocks in self.held:
            self.store(job, blocks, now)
        self.held = []
        for job, entry in meta.load_jobs.items():
            start = max(now, self.load_free)
            self.load_free = start + len(entry.src_spec.block_ids) * self.host_block_s
            self.in_flight.append(Transfer(job, self.load_free, entry.req_id))
        for job, entry in meta.store_jobs.items():
            blocks = len(entry.src_spec.block_ids)
            if self.deferred_stores and job not in (meta.jobs_to_flush or ()):
                self.held.append((job, blocks))
            else:
                self.store(job, blocks, now)

    def next_load_end(self) -> float:
        return min((t.end_s for t in self.in_flight if t.request is not None), default=float("inf"))

    def busy(self) -> bool:
        return bool(self.in_flight or self.held)

    def report(self, end_s: float):
        """The ``KVConnectorOutput`` of a step ending at ``end_s``: the jobs done by then."""
        done = [t for t in self.in_flight if t.end_s <= end_s]
        self.in_flight = [t for t in self.in_flight if t.end_s > end_s]
        if not done:
            return None
        return self.vllm.KVConnectorOutput(
            finished_recving={t.request for t in done if t.request is not None} or None,
            kv_connector_worker_meta=self.vllm.OffloadingWorkerMetadata(completed_jobs={t.job: 1 for t in done}))


def block_names(vllm, workload: Workload, requests: dict) -> dict:
    """Each prompt block's hash -> its name: the first (request, block index) whose prompt has it."""
    names = {}
    for i in sorted(requests):
        full = workload.requests[i].prompt // workload.block_size
        for k, block_hash in enumerate(requests[i].block_hashes[:full]):
            names.setdefault(block_hash, (i, k))
    return names


def run(workload: Workload, max_steps: int = 100_000, order: bool = False, deferred_stores: bool = False,
        host_block_s: float | None = None, replay: list | None = None) -> list[Step]:
    """vLLM's scheduler with its offloading connector over ``workload``, one ``Step`` per step
    that scheduled tokens (``order``: with the tier's eviction order; ``deferred_stores``: see
    ``Worker``; ``host_block_s``: a block's seconds over the link, pagesim's for the workload
    unless given; with speculative decoding, ``replay``: pagesim's steps, whose drafts kept are
    those vLLM's verifications accept, as ``vllm_v1.run`` gives them)."""
    from tests.peers import pagesim_steps

    vllm = load()
    if host_block_s is None:
        host_block_s = pagesim_steps.host_block_seconds(workload)
    with PEER.active():
        return drive(vllm, workload, max_steps, Worker(vllm, host_block_s, deferred_stores), order, replay or [])


def drive(vllm, workload: Workload, max_steps: int, worker: Worker, order: bool, replay: list) -> list[Step]:
    scheduler = build(vllm, workload)
    blocks_of = scheduler.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
    connector = scheduler.connector.connector_scheduler
    policy = connector.manager._policy
    # every request made now (its prompt's hashes name the blocks), added at its arrival
    requests = {i: vllm_v1.make_request(vllm, workload, i, scheduler.num_hash_lookahead_tokens)
                for i in range(len(workload.requests))}  # (0: a KV connector keeps the plain hashes)
    names = block_names(vllm, workload, requests)
    steps: list[Step] = []
    pending = sorted(range(len(workload.requests)), key=lambda i: (workload.requests[i].arrival_s, i))
    loading: set = set()  # requests whose load started: their admission is recorded then
    admitted: dict = {}  # admissions looked up since the last record
    preempted: set = set()  # the same for preemptions (a step may preempt and schedule nothing)
    now = 0.0
    idle_passes = 0
    while (pending or scheduler.get_num_unfinished_requests()) and len(steps) < max_steps:
        while pending and workload.requests[pending[0]].arrival_s <= now:
            index = pending.pop(0)
            scheduler.add_request(requests[index])
        output = scheduler.schedule()
        meta = output.kv_connector_metadata
        worker.submit(meta, now)
        for job, entry in meta.load_jobs.items():  # an admission that loads: its hits now
            i = int(entry.req_id[1:])
            gpu = connector._req_status[entry.req_id].num_locally_computed_tokens
            admitted[i] = (gpu, requests[i].num_computed_tokens - gpu)
            loading.add(i)
        cached = output.scheduled_cached_reqs
        for rid, computed in [(r.req_id, r.num_computed_tokens) for r in output.scheduled_new_reqs] + [
                (rid, n) for rid, n in zip(cached.req_ids, cached.num_computed_tokens) if rid in cached.resumed_req_ids]:
            i = int(rid[1:])
            if i in loading:  # its load is over: admitted on the hits recorded when it started
                loading.discard(i)
            else:
                admitted[i] = (computed, 0)
        preempted |= {int(rid[1:]) for rid in output.preempted_req_ids}
        if not output.num_scheduled_tokens:
            # nothing scheduled: the step lasts until the first load in flight ends, or the next
            # arrival (as pagesim's loop wakes), the engine still reporting the connector's output
            wake = min(worker.next_load_end(), workload.requests[pending[0]].arrival_s if pending else float("inf"))
            if wake == float("inf"):
                idle_passes += 1  # (a request holding loaded blocks is admitted by the next pass)
                if idle_passes > 2:
                    raise RuntimeError(f"vLLM scheduled nothing at {now} with nothing left to arrive or load")
                wake = now
            scheduler.update_from_output(output, vllm.ModelRunnerOutput(
                req_ids=[], req_id_to_index={}, kv_connector_output=worker.report(wake)))
            now = max(now, wake)
            continue
        idle_passes = 0
        scheduled = {int(rid[1:]): n for rid, n in output.num_scheduled_tokens.items()}
        free = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        held = frozenset(names[vllm.get_offload_block_hash(key)] for key in policy.chunks)
        ranked = tuple(names[vllm.get_offload_block_hash(key)]
                       for key in sorted(policy.chunks, key=policy._ranks.__getitem__)) if order else ()
        drafts = {int(rid[1:]): len(ids) for rid, ids in output.scheduled_spec_decode_tokens.items()}
        blocks = {int(r.request_id[1:]): len(blocks_of.get(r.request_id, ())) for r in scheduler.running} \
            if workload.num_speculative_tokens else {}
        ids, sampled = vllm_v1.sample(output, requests, drafts,
                                      replay[len(steps)] if len(steps) < len(replay) else Step(now))
        scheduler.update_from_output(output, vllm.ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)}, sampled_token_ids=sampled,
            kv_connector_output=worker.report(now + STEP_S)))
        kept = vllm_v1.propose(vllm, scheduler, workload, ids, sampled, drafts)
        finished = frozenset(i for i in scheduled if requests[i].is_finished())
        steps.append(Step(now, scheduled, frozenset(preempted), free, finished, drafts=drafts, blocks=blocks,
                          kept=kept, host_blocks=held, admitted=dict(admitted), host_order=ranked))
        admitted, preempted = {}, set()
        now += STEP_S
    return steps
