"""vLLM 0.4.2's own ``Scheduler`` (v0), run on CPU step by step beside pagesim's ``--system vllm``.

Executed from vLLM's source (fetched by ``python -m tests.peers.fetch``): the scheduler and its
policy (``core/scheduler.py``, ``core/policy.py``), both block managers and what they use
(``core/block_manager_v1.py``, ``core/block_manager_v2.py``, ``core/block/``, the evictors,
``block.py``), the sequence and its group (``sequence.py``, ``sampling_params.py``), and the
engine's output processor, which appends each sampled token, stops a sequence at its
``max_tokens``, forks a group's ``n`` sequences after its prompt and frees finished ones
(``engine/output_processor/single_step.py``, ``stop_checker.py``). The stubs (``STUBS``) are
the configuration classes (``config.py`` imports transformers and the model code; the scheduler
reads plain attributes, given here by ``Settings``), the detokenizer (none is used:
``detokenize=False``), and, where those packages are not installed, ``psutil`` and
``transformers``, named at import only.

Each step: the requests that have arrived by the step's start are added, ``schedule()`` runs,
the step's record is taken, then as vLLM's engine does after the model runs
(``engine/llm_engine.py:507-519``): each scheduled group's computed tokens advance by its chunk,
the output processor takes one sample per running sequence (``n`` samples for a prompt of a
group of ``n``), and finished groups leave the running queue.

Swap preemption: vLLM 0.4.2 swaps a group with more than one running sequence and recomputes
one with a single sequence (``scheduler.py:1047-1060``); it has no setting for it (0.5 added
``--preemption-mode``). A workload with ``preemption="swap"`` passes ``PreemptionMode.SWAP``
to vLLM's own ``Scheduler._preempt``, the argument it takes for that, for every group.
"""

from __future__ import annotations

import functools
import itertools
import os
import types

from tests.peers.importing import Peer, placeholders
from tests.peers.workloads import STEP_S, TOKEN, Step, Workload

REAL = (
    "vllm.envs", "vllm.logger", "vllm.utils", "vllm.block",
    "vllm.sequence", "vllm.sampling_params", "vllm.lora.request",
    "vllm.core.interfaces", "vllm.core.policy", "vllm.core.scheduler", "vllm.core.evictor_v1", "vllm.core.evictor_v2",
    "vllm.core.block_manager_v1", "vllm.core.block_manager_v2", "vllm.core.block.interfaces",
    "vllm.core.block.common", "vllm.core.block.block_table", "vllm.core.block.naive_block",
    "vllm.core.block.prefix_caching_block", "vllm.core.block.cpu_gpu_block_allocator",
    "vllm.engine.output_processor.interfaces", "vllm.engine.output_processor.single_step",
    "vllm.engine.output_processor.stop_checker",
)

STUBS = {
    "vllm.config": placeholders("CacheConfig", "LoRAConfig", "SchedulerConfig", "ModelConfig"),
    "vllm.transformers_utils.detokenizer": placeholders("Detokenizer"),
    "vllm.engine.output_processor.util": placeholders("create_output_by_sequence_group"),
    "psutil": {},  # vllm.utils imports it for functions the scheduler never calls
    "transformers": placeholders("PreTrainedTokenizer"),  # type hints of the output processor
}
PEER = Peer("0.4.2", REAL, STUBS, "tests/peers/vllm_v0.py")


def load() -> types.SimpleNamespace:
    """vLLM 0.4.2's scheduler and what drives it, imported from the cache folder."""
    # vllm/logger.py would otherwise configure logging at import (dictConfig), disabling every
    # logger made before it, pagesim's included, for the rest of the process
    configure = os.environ.get("VLLM_CONFIGURE_LOGGING")
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    try:
        with PEER.active():
            from vllm.core.scheduler import PreemptionMode, Scheduler
            from vllm.engine.output_processor.single_step import SingleStepOutputProcessor
            from vllm.engine.output_processor.stop_checker import StopChecker
            from vllm.sampling_params import SamplingParams
            from vllm.sequence import (Logprob, Sequence, SequenceGroup, SequenceGroupOutput, SequenceOutput,
                                       SequenceStatus)
    finally:
        if configure is None:
            del os.environ["VLLM_CONFIGURE_LOGGING"]
        else:
            os.environ["VLLM_CONFIGURE_LOGGING"] = configure
    return types.SimpleNamespace(PreemptionMode=PreemptionMode, Scheduler=Scheduler,
                                 SingleStepOutputProcessor=SingleStepOutputProcessor, StopChecker=StopChecker,
                                 SamplingParams=SamplingParams, Logprob=Logprob, Sequence=Sequence,
                                 SequenceGroup=SequenceGroup, SequenceGroupOutput=SequenceGroupOutput,
                                 SequenceOutput=SequenceOutput, SequenceStatus=SequenceStatus)


class Settings:
    """One of vLLM's config objects, holding only the settings given: reading any other raises."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def __getattr__(self, name):
        raise AttributeError(f"vLLM read the setting {name!r}, which the peer does not give (vllm_v0.build)")


def build(vllm, workload: Workload):
    """A ``Scheduler`` over ``workload``'s pool, and the output processor beside it."""
    scheduler_config = Settings(  # config.py:551-620's SchedulerConfig, with the workload's limits
        max_num_batched_tokens=workload.max_num_batched_tokens, max_num_seqs=workload.max_num_seqs,
        max_model_len=workload.max_model_len, chunked_prefill_enabled=workload.chunked_prefill,
        use_v2_block_manager=workload.block_manager == "v2", delay_factor=0.0, num_lookahead_slots=0)
    cache_config = Settings(block_size=workload.block_size, num_gpu_blocks=workload.num_blocks,
                            num_cpu_blocks=workload.cpu_blocks, sliding_window=None,
                            enable_prefix_caching=workload.prefix_caching)
    scheduler = vllm.Scheduler(scheduler_config, cache_config, None)
    if workload.preemption == "swap":
        swap = vllm.PreemptionMode.SWAP
        scheduler._preempt = functools.partial(type(scheduler)._preempt, scheduler, preemption_mode=swap)
    stop_checker = vllm.StopChecker(workload.max_model_len, get_tokenizer_for_seq=None)
    processor = vllm.SingleStepOutputProcessor(scheduler_config, None, scheduler, itertools.count(10**6),
                                               stop_checker)
    return scheduler, processor


def make_group(vllm, workload: Workload, index: int):
    row = workload.requests[index]
    if row.beam > 1:  # beam search's settings (sampling_params.py:_verify_beam_search: greedy)
        sampling = vllm.SamplingParams(n=1, best_of=row.beam, use_beam_search=True, temperature=0.0,
                                       max_tokens=row.output, ignore_eos=True, detokenize=False)
    else:
        sampling = vllm.SamplingParams(n=row.n, max_tokens=row.output, ignore_eos=True, detokenize=False)
    sequence = vllm.Sequence(index, "", workload.prompt_token_ids(index), workload.block_size)
    return vllm.SequenceGroup(request_id(index), [sequence], sampling, arrival_time=row.arrival_s)


def request_id(index: int) -> str:
    return f"r{index:06d}"


def group_index(group) -> int:
    return int(group.request_id[1:])


def run(workload: Workload, max_steps: int = 100_000) -> list[Step]:
    """vLLM's scheduler over ``workload``, one ``Step`` record per step that scheduled tokens;
    each step lasts ``STEP_S``; an idle engine waits for the next arrival."""
    vllm = load()
    with PEER.active():
        return drive(vllm, workload, max_steps)


def drive(vllm, workload: Workload, max_steps: int) -> list[Step]:
    scheduler, processor = build(vllm, workload)
    beams: dict = {}  # a beam search's group -> its beams' sequence ids in its record's order
    steps: list[Step] = []
    pending = sorted(range(len(workload.requests)), key=lambda i: (workload.requests[i].arrival_s, i))
    now = 0.0
    while (pending or scheduler.has_unfinished_seqs()) and len(steps) < max_steps:
        while pending and workload.requests[pending[0]].arrival_s <= now:
            scheduler.add_seq_group(make_group(vllm, workload, pending.pop(0)))
        running_before = {group_index(g) for g in scheduler.running}
        swapped_before = {group_index(g) for g in scheduler.swapped}
        metadata, output = scheduler.schedule()
        if output.is_empty():
            if not pending:
                raise RuntimeError(f"vLLM scheduled nothing at {now} with nothing left to arrive")
            now = workload.requests[pending[0]].arrival_s
            continue
        if output.ignored_seq_groups:
            raise RuntimeError(f"vLLM refused {[g.request_id for g in output.ignored_seq_groups]}: not a peer workload")
        swapped = {group_index(g) for g in scheduler.swapped}
        scheduled = {}
        for item, meta in zip(output.scheduled_seq_groups, metadata):
            group = item.seq_group
            # a prompt's tokens the model runs: past its cached blocks (worker/model_runner.py:271-276)
            cached = len(meta.computed_block_nums or ()) * workload.block_size
            running = group.num_seqs(status=vllm.SequenceStatus.RUNNING)
            scheduled[group_index(group)] = item.token_chunk_size - cached if group.is_prefill() else running
        preempted = running_before - {group_index(g) for g in scheduler.running} - scheduled.keys()
        free_blocks = scheduler.block_manager.get_num_free_gpu_blocks()  # once scheduled, as pagesim's
        complete(vllm, scheduler, processor, output, metadata, beams)
        steps.append(Step(now, scheduled, frozenset(preempted), free_blocks,
                          finished=frozenset(i for i in scheduled if scheduler_group_finished(scheduler, i)),
                          swapped_out=frozenset(swapped - swapped_before), swapped_in=frozenset(swapped_before - swapped)))
        now += STEP_S
    return steps


def complete(vllm, scheduler, processor, output, metadata, beams: dict) -> None:
    """What vLLM's engine does once the model has run (llm_engine.py:507-519): each scheduled
    group's computed tokens advance by its chunk, and, unless it was a prompt's partial chunk
    (``do_sample``, scheduler.py:942-952), it samples ``TOKEN`` for each running sequence (``n``
    samples for a group's prompt: its sequences fork, single_step.py:100-132), or a beam search's
    candidates (:func:`beam_samples`)."""
    for item, meta in zip(output.scheduled_seq_groups, metadata):
        group = item.seq_group
        if not meta.do_sample:
            group.update_num_computed_tokens(item.token_chunk_size)
            continue
        prefill = group.is_prefill()
        per_parent = group.sampling_params.best_of if prefill else 1  # the sampler's, per prompt
        group.update_num_computed_tokens(item.token_chunk_size)
        if group.sampling_params.use_beam_search:
            beam_step(vllm, processor, group, prefill, beams)
            continue
        samples = [vllm.SequenceOutput(parent.seq_id, TOKEN, {TOKEN: vllm.Logprob(0.0)})
                   for parent in group.get_seqs(status=vllm.SequenceStatus.RUNNING) for _ in range(per_parent)]
        processor.process_outputs(group, [vllm.SequenceGroupOutput(samples, None)])
    scheduler.free_finished_seq_groups()


#: a beam's sampled token: ``BEAM_TOKEN + j`` for the record's new beam ``j`` (how the driver
#: finds, among the group's sequences after vLLM processed them, which beam each is)
BEAM_TOKEN = 1 << 30


def beam_step(vllm, processor, group, prefill: bool, beams: dict) -> None:
    """One step of a beam search of ``best_of`` beams, its selection given by the lineage record
    pagesim's beams follow (``sim/beam_lineage.py``; the request's record, ``i mod RECORDS`` of
    its width: ``sim/core/build.py``'s ``beam_arrays``), as the workload's input: after the
    prompt every beam is a child of it; after a decode of token ``g`` (from 0) the record's row
    ``g - 1`` names each new beam's parent. The samples are exactly the new beams (each a
    candidate of its parent, scored best first as the record orders them), so vLLM's own output
    processor selects them all, forks each parent with several children, continues it with its
    last, and frees each parent with none (single_step.py:72-240); its block manager forks and
    frees the blocks."""
    from pagesim.sim.beam_lineage import RECORDS, lineage_library

    width, index = group.sampling_params.best_of, group_index(group)
    running = group.get_seqs(status=vllm.SequenceStatus.RUNNING)
    if prefill:
        parents, order = [0] * width, [running[0].seq_id]
    else:
        generated = running[0].get_output_len()
        records = lineage_library(width)
        assert generated - 1 < records.shape[1], "a peer beam search longer than its record"
        parents, order = records[index % RECORDS, generated - 1].tolist(), beams[index]
    samples = [vllm.SequenceOutput(order[q], BEAM_TOKEN + j, {BEAM_TOKEN + j: vllm.Logprob(-float(j))})
               for j, q in enumerate(parents)]
    processor.process_outputs(group, [vllm.SequenceGroupOutput(samples, None)])
    by_beam = {seq.get_last_token_id() - BEAM_TOKEN: seq.seq_id for seq in group.get_seqs()
               if not seq.is_finished()}
    beams[index] = [by_beam[j] for j in range(width)] if by_beam else []


def scheduler_group_finished(scheduler, index: int) -> bool:
    return not any(group_index(g) == index for queue in (scheduler.running, scheduler.swapped, scheduler.waiting)
                   for g in queue)
