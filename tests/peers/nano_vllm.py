"""nano-vllm's own ``Scheduler`` and ``BlockManager``, run on CPU step by step beside pagesim's
``--system vllm --append-rule exact --watermark 0`` (``PAGESIM_SETTINGS``).

Executed from nano-vllm's source at ``fetch.NANO_VLLM_COMMIT`` (bb823b3, fetched by ``python -m
tests.peers.fetch``): the scheduler (``nanovllm/engine/scheduler.py``), the block manager
(``engine/block_manager.py``, which needs ``xxhash`` and numpy), the sequence
(``engine/sequence.py``) and ``sampling_params.py``. One module is a stub: ``nanovllm/config.py``
(it imports transformers, and its ``Config`` asserts a model folder and a block size that is a
multiple of 256, config.py:20-25); the scheduler reads five settings of it (scheduler.py:11-15),
given by ``Settings``, which raises on any other. The package's ``__init__`` (the LLM engine:
torch, flash-attn, transformers) is not run. File:line citations below are at that commit.

Each step, as nano-vllm's ``LLMEngine.step`` (llm_engine.py:49-53): the requests that have
arrived by the step's start are added (``Scheduler.add``), ``schedule()`` runs, the step's
record is taken, then ``postprocess`` gets one sampled token per scheduled sequence (``TOKEN``,
never EOS: ``ignore_eos``); it appends it to a sequence whose prompt is done, stops a sequence
at its ``max_tokens`` and frees it (scheduler.py:81-92). An engine with nothing to run waits for
the next arrival.

nano-vllm's rules, and what the workloads must respect (``check_workload``):

* prefill first: a step runs new prompts alone while the waiting head fits, decodes otherwise
  (scheduler.py:29-55); no swap: preemption recomputes, the latest in the running queue first,
  the sequence itself when it is the last (:58-65, :75-79); one sequence per request;
* a prompt fits when the free blocks cover its blocks that no running sequence holds (a cached
  block that is free counts as a new one: block_manager.py:58-73); no watermark;
* a decode takes a block exactly when its token starts one (``len(seq) % block_size == 1``,
  block_manager.py:103-108): pagesim's ``append_rule="exact"``;
* chunked prefill of the waiting head alone, when it is the step's first and exceeds the budget
  (scheduler.py:42-46): never, with ``max_num_batched_tokens`` at least ``max_model_len``, which
  pagesim requires without chunked prefill (``SimConfig.check_batched_tokens``);
* ``max_num_seqs`` caps the sequences one step schedules (scheduler.py:30, :58), not the
  running ones: a second prefill step admits more (pagesim caps the running ones);
* prefix caching is always on (block_manager.py:58-73, :110-120: every full block, generated
  ones too, is hashed once computed). ``Workload.prefix_caching=False`` keeps nano-vllm's hash
  index empty (``NoCacheIndex``): every lookup misses, so every prompt is computed whole.
* block size: nano-vllm's ``Config`` takes multiples of 256 (config.py:22); its scheduler and
  block manager are written for any (``Sequence.block_size``, set as llm_engine.py:21 does):
  the workloads use 16 as the others do, and 256.
"""

from __future__ import annotations

import types

from tests.peers import fetch
from tests.peers.importing import Peer, placeholders
from tests.peers.workloads import STEP_S, TOKEN, Step, Workload

REAL = ("nanovllm.sampling_params", "nanovllm.engine.sequence", "nanovllm.engine.block_manager",
        "nanovllm.engine.scheduler")
# config.py imports transformers for its model config; scheduler.py imports Config only to annotate
STUBS = {"nanovllm.config": placeholders("Config")}
PEER = Peer(fetch.NANO_VLLM_COMMIT[:7], REAL, STUBS, "tests/peers/nano_vllm.py", package="nanovllm",
            folder=fetch.nano_vllm_folder(), name=f"nano-vllm {fetch.NANO_VLLM_COMMIT[:7]}")

# pagesim's settings for nano-vllm, over --system vllm's (pagesim_steps.config): no watermark
# (block_manager.py:71-72 compares the free blocks with the blocks needed, nothing kept back),
# a decode needs a free block only at a block edge (block_manager.py:103-104)
PAGESIM_SETTINGS = dict(watermark=0.0, append_rule="exact")

# nano-vllm's Config default (config.py:16): no token is EOS; the requests ignore it anyway
NO_EOS = -1


def load() -> types.SimpleNamespace:
    """nano-vllm's scheduler and sequence, imported from the cache folder."""
    with PEER.active():
        from nanovllm.engine.scheduler import Scheduler
        from nanovllm.engine.sequence import Sequence, SequenceStatus
        from nanovllm.sampling_params import SamplingParams
    return types.SimpleNamespace(Scheduler=Scheduler, Sequence=Sequence, SequenceStatus=SequenceStatus,
                                 SamplingParams=SamplingParams)


class Settings:
    """nano-vllm's ``Config``, holding only the settings given: reading any other raises."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def __getattr__(self, name):
        raise AttributeError(f"nano-vllm read the setting {name!r}, which the peer does not give (nano_vllm.build)")


class NoCacheIndex(dict):
    """The block manager's ``hash_to_block_id`` with prefix caching off: it keeps nothing, so
    every lookup misses (``can_allocate``, block_manager.py:65-67; ``_allocate_block`` then
    finds no entry to drop, :47). nano-vllm has no switch for its cache."""

    def __setitem__(self, key, value):
        pass  # hash_blocks (block_manager.py:120) names a computed block: forgotten


def check_workload(workload: Workload) -> None:
    """Refuse what nano-vllm has no rule for (its rules: the module's docstring)."""
    problems = [text for wrong, text in (
        (workload.policy != "fcfs", f"scheduling policy {workload.policy} (nano-vllm's is FCFS)"),
        (workload.preemption != "recompute", "swap preemption (nano-vllm recomputes)"),
        (workload.chunked_prefill, "vLLM 0.4.2's chunked prefill"),
        (workload.block_manager != "v1", "vLLM 0.4.2's block manager v2"),
        (any(row.n > 1 for row in workload.requests), "parallel sampling (one sequence per request)"),
        (workload.max_num_batched_tokens < workload.max_model_len,
         "a budget below max_model_len (nano-vllm would chunk the waiting head)"),
    ) if wrong]
    if problems:
        raise ValueError(f"{workload.name} is not a nano-vllm workload: {'; '.join(problems)}")


def build(nano, workload: Workload):
    """A ``Scheduler`` over ``workload``'s pool."""
    check_workload(workload)
    settings = Settings(  # config.py:6-18's Config, what scheduler.py:11-15 reads
        max_num_seqs=workload.max_num_seqs, max_num_batched_tokens=workload.max_num_batched_tokens, eos=NO_EOS,
        kvcache_block_size=workload.block_size, num_kvcache_blocks=workload.num_blocks)
    # a class attribute that LLMEngine sets from the config (llm_engine.py:21): every
    # sequence's block arithmetic (sequence.py:15, :55-65)
    nano.Sequence.block_size = workload.block_size
    scheduler = nano.Scheduler(settings)
    if not workload.prefix_caching:
        scheduler.block_manager.hash_to_block_id = NoCacheIndex()
    return scheduler


def make_sequence(nano, workload: Workload, index: int):
    row = workload.requests[index]
    sampling = nano.SamplingParams(max_tokens=row.output, ignore_eos=True)  # temperature: its default, 1.0
    return nano.Sequence(workload.prompt_token_ids(index), sampling)


def run(workload: Workload, max_steps: int = 100_000) -> list[Step]:
    """nano-vllm's scheduler over ``workload``, one ``Step`` record per step; each step lasts
    ``STEP_S``; an idle engine waits for the next arrival."""
    nano = load()
    with PEER.active():
        return drive(nano, workload, max_steps)


def drive(nano, workload: Workload, max_steps: int) -> list[Step]:
    scheduler = build(nano, workload)
    index: dict[int, int] = {}  # seq_id -> the request's trace index (seq ids count on across runs)
    steps: list[Step] = []
    pending = sorted(range(len(workload.requests)), key=lambda i: (workload.requests[i].arrival_s, i))
    now = 0.0
    while (pending or not scheduler.is_finished()) and len(steps) < max_steps:
        while pending and workload.requests[pending[0]].arrival_s <= now:
            request = pending.pop(0)
            sequence = make_sequence(nano, workload, request)
            index[sequence.seq_id] = request
            scheduler.add(sequence)
        if scheduler.is_finished():  # nothing to run until the next arrival
            now = workload.requests[pending[0]].arrival_s
            continue
        running_before = {index[s.seq_id] for s in scheduler.running}
        try:
            sequences, is_prefill = scheduler.schedule()
        except AssertionError as error:  # scheduler.py:71: nothing runs and the waiting head never fits
            raise RuntimeError(f"nano-vllm scheduled nothing at {now}: not a peer workload") from error
        scheduled = {index[s.seq_id]: s.num_scheduled_tokens for s in sequences}
        preempted = running_before - {index[s.seq_id] for s in scheduler.running}
        free_blocks = len(scheduler.block_manager.free_block_ids)  # once scheduled, as pagesim's
        scheduler.postprocess(sequences, [TOKEN] * len(sequences), is_prefill)
        finished = frozenset(index[s.seq_id] for s in sequences if s.is_finished)
        steps.append(Step(now, scheduled, frozenset(preempted), free_blocks, finished=finished))
        now += STEP_S
    return steps
