"""Speculative decoding under vLLM v1's scheduler (``--system vllm-v1 --num-speculative-tokens K``),
as of vLLM 0.33.0 (file:line below are of that wheel).

**What a step schedules.** A request's owed tokens are ``num_tokens_with_spec + placeholders -
num_computed_tokens`` (``sched/scheduler.py:838-848``), ``num_tokens_with_spec`` counting the
drafts proposed after its last step (``request.py:299-300``). Drafts are kept for a request
that sampled a token and is not mid-prompt (``update_draft_token_ids``, ``scheduler.py:2862-2881``),
so a decoding request schedules ``1 + K`` query tokens: its last sampled token and K drafts.
They are cut to the budget left (``scheduler.py:846-848``; the drafts past it are dropped,
``:1010-1021``) and to ``max_model_len - num_computed_tokens - 1`` (``:852-857``). Every
scheduled request also takes ``max_num_new_slots_for_drafting`` slots of the input budget
(``draft_slots``, ``scheduler.py:720-722, 797, 846-848, 1003, 1068, 1295, 1571``): 1 for a
draft model, 0 for n-gram, EAGLE and MTP (``config/speculative.py:2057-2098``).

**Slots.** ``allocate_slots`` grows a request's blocks to hold its computed tokens, the new ones
and ``num_lookahead_tokens`` more (``kv_cache_manager.py:548-551``: ``num_tokens_need_slot =
min(computed + new + lookahead, max_model_len)``), for running and newly admitted requests alike
(``scheduler.py:914-918, 1401-1440``). ``num_lookahead_tokens`` is K for EAGLE, MTP and a draft
model (drafters with their own forward pass, whose KV they write past the target's query) and 0
for n-gram (``config/vllm.py:625-652``).

**Acceptance.** After the step, the rejection sampler keeps the drafts up to the first rejected
one, and one token more (the target's correction, or its bonus token when all are accepted):
``num_accepted = len(generated) - 1``, ``num_rejected = drafts - num_accepted`` and
``num_computed_tokens -= num_rejected`` (``scheduler.py:2346-2364``); the rejected drafts' slots
stay allocated (nothing frees them; the next step writes over them). A request stops at its
output length within the step's tokens, the rest trimmed (``scheduler.py:2752-2764``). Here
draft position j (from 0) is accepted, once all before it were, when a draw of the run's seeded
generator is below ``spec_acceptance[j]`` (``--spec-acceptance-rate``): a geometric count.

**Speculative slack** (the seventh memory category). A request's slots from its computed tokens
up to its speculative high-water mark (``SPEC_HIGH``: what its blocks were grown to hold when last
scheduled: computed + new + lookahead): the drafts being verified, the lookahead slots, and after
the step the slots of rejected drafts. Without speculation they would be reservation (below the
request's final length) or internal fragmentation (above it), so those two categories give them
up (:func:`split_categories`); the categories still sum to the capacity.

**Padding** (:func:`pads`, ``scheduler.py:1308-1330``). An admission left with one token to
compute (a resumed request, or a prompt whose prefix-cache hits stop one token short) is
scheduled as ``1 + K`` query tokens, K of them placeholder drafts (-1: no drafter proposed
them), when no running request scheduled in the step is mid-prompt, so that the step's batch
stays uniform decodes for CUDA graphs; if ``1 + K`` exceeds the budget left, admissions stop
there rather than schedule it unpadded. Its blocks grow for the ``1 + K`` and the lookahead
slots; the placeholders are all rejected (the target never samples -1) and counted as vLLM's
metrics count them, drafted and none accepted (``scheduler.py:2346-2370``,
:func:`placeholders_rejected`).

**Block hashes** (EAGLE and MTP, prefix caching on): a block's prefix-cache key covers the token
after it, so a hit stops a block before where two prompts part on a block boundary, and a block is
cached once that token exists: a prompt's last block that ends where the prompt does at its first
sampled token, a decode's block once the token after it is sampled (``prefix_cache.hash_lookahead``).
With drafts, each request that sampled caches its blocks right after the step
(``prefix_cache.sampled``, from :func:`accept` and :func:`placeholders_rejected`).

Not modelled: async scheduling's placeholders for drafts not yet known (``num_output_placeholders``;
here a step's drafts are counted once the previous step's acceptance is known, while async
scheduling still delays admissions as ``scheduler_v1.py`` says); n-gram's proposer finding no
match (it always proposes K here: fold a miss into the acceptance rate); the padded drafts'
own attention reads in the step's price; dynamic K by batch size;
and multi-module MTP's chunk boundary rule (``scheduler.py:678-697``) and its hashes covering K
tokens after each block (here 1, as EAGLE's and single-module MTP's).
"""

from __future__ import annotations

from pagesim.sim.core.kv import kv_cache, prefix_cache
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import BLOCK_SIZE, MAX_SEQ_LEN, SPEC_DRAFT_SLOTS, SPEC_LOOKAHEAD, SPEC_TOKENS
from pagesim.sim.core.state import SPECULATIVE_SLACK  # the memory category's index
from pagesim.sim.core.state import section, table

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    SPEC_SLOTS          speculative decoding: the running requests' slots past their computed
        tokens up to their speculative high-water mark (the speculative slack category)
    SPEC_DEMAND_SLOTS   those of them below their request's final length
    STEP_SPEC_TOKENS    this iteration's draft tokens verified (query tokens beyond one per decode)
    STEP_DRAFT_CONTEXT  the contexts' sum of this iteration's decodes that verify drafts (the
        drafter's attention reads)
    SPEC_DRAFTED        draft tokens verified so far
    SPEC_ACCEPTED       of them accepted
    SPEC_VERIFIED       request-steps that verified drafts
""")

# Core.speculative (vLLM v1 with SPEC_TOKENS; one row elsewhere): per request
table("speculative", """
    SPEC_HIGH           the tokens its blocks were grown to hold when last scheduled: computed,
        drafts and lookahead slots (0: none held)
    SPEC_DRAFTS         the drafts it verifies in this step
""", size="SPEC_COLUMNS", into=globals())


@njit(inline=True)
def speculating(config):
    """The runs with speculative decoding (K > 0): the only ones with drafts, lookahead slots and
    speculative slack, and whose drafter may have a price (``loop.draft_time``, ``njit``'s lazy)."""
    return config[SPEC_TOKENS] > 0


@njit(inline=True)
def decode_tokens(s, i, budget):
    """The query tokens decoding request ``i`` schedules: its last sampled token and its
    drafts, within the budget left less its draft slots and within ``max_model_len``
    (scheduler.py:838-857). 1 without speculation."""
    n = 1 + s.config[SPEC_TOKENS]
    return min(n, budget - s.config[SPEC_DRAFT_SLOTS], s.config[MAX_SEQ_LEN] - s.num_computed_tokens[i] - 1)


@njit(inline=True)
def pads(s, cached, target, running_prefill, scheduled_running):
    """Whether an admission with ``cached`` of its ``target`` tokens computed is padded to
    ``1 + K`` query tokens (module docstring; scheduler.py:1308-1330): with speculation, one
    token left, no running request scheduled in the step mid-prompt (``running_prefill``:
    ``prefill_scheduled``, set by the running loop alone, :998), some running request scheduled
    or some tokens computed (:1316), and room in ``max_model_len`` for the ``1 + K`` and the
    token it samples (:1319-1325)."""
    k = s.config[SPEC_TOKENS]
    return (k > 0 and target - cached == 1 and not running_prefill and (scheduled_running or cached > 0)
            and cached + 1 + k + 1 <= s.config[MAX_SEQ_LEN])


@njit(inline=True)
def padded_drafts(s, cached, target, budget, running_prefill, scheduled_running):
    """The placeholder drafts an admission with ``cached`` of its ``target`` tokens computed is
    padded with (:func:`pads`: K or 0), or -1 where its ``1 +`` them exceed the ``budget`` left
    past its draft slots: vLLM then admits nobody rather than schedule it unpadded
    (scheduler.py:1318-1324)."""
    drafts = s.config[SPEC_TOKENS] if pads(s, cached, target, running_prefill, scheduled_running) else 0
    return -1 if 1 + drafts > budget - s.config[SPEC_DRAFT_SLOTS] else drafts


@njit(inline=True)
def slots_needed(s, i, n):
    """The tokens request ``i``'s blocks must hold to compute ``n`` more: its computed ones,
    those and the lookahead slots, at most ``max_model_len`` (kv_cache_manager.py:548-551)."""
    return min(s.num_computed_tokens[i] + n + s.config[SPEC_LOOKAHEAD], max(s.config[MAX_SEQ_LEN],
                                                                              s.num_computed_tokens[i] + n))


@njit(inline=True)
def query_tokens(s, i, budget):
    """The query tokens decoding request ``i`` schedules: :func:`decode_tokens` with speculation,
    else its one token (scheduler.py:836-857)."""
    return decode_tokens(s, i, budget) if speculating(s.config) else 1


@njit(inline=True)
def admission_drafts(s, i, target, budget, running_prefill, scheduled_running, loads):
    """The placeholder drafts admitting request ``i`` pads its first step with (:func:`padded_drafts`
    over its prefix-cache hits: K, 0, or -1 where padding exceeds the budget and nobody is
    admitted); 0 without speculation, or for an admission that ``loads`` its KV first, which
    schedules no token now (scheduler.py:1285-1288)."""
    if not speculating(s.config) or loads:
        return 0
    return padded_drafts(s, prefix_cache.hit_tokens(s, i, target), target, budget, running_prefill,
                         scheduled_running)


@njit(inline=True)
def tokens_to_hold(s, i, held, n):
    """The tokens request ``i``'s blocks must hold to compute ``n`` more past the ``held`` it has:
    with speculation its lookahead slots too (:func:`slots_needed`)."""
    return slots_needed(s, i, n) if speculating(s.config) else held + n


@njit(inline=True)
def leave(s, i):
    """Request ``i``'s slack leaves the counters (before its computed tokens or mark change);
    nothing without speculation."""
    if not speculating(s.config):
        return
    high = s.speculative[i, SPEC_HIGH]
    held = s.num_computed_tokens[i]
    if high > held:
        s.count[SPEC_SLOTS] -= high - held
        s.count[SPEC_DEMAND_SLOTS] -= min(high, s.final_len[i]) - held


@njit(inline=True)
def enter(s, i):
    """Request ``i``'s slack joins the counters (after they changed)."""
    high = s.speculative[i, SPEC_HIGH]
    held = s.num_computed_tokens[i]
    if high > held:
        s.count[SPEC_SLOTS] += high - held
        s.count[SPEC_DEMAND_SLOTS] += min(high, s.final_len[i]) - held


@njit(inline=True)
def verify_context(held, drafts):
    """The context the attention reads for a decode's ``1 + drafts`` query tokens, the first
    after ``held`` tokens: ``held + (held + 1) + ... + (held + drafts)``."""
    return (1 + drafts) * held + drafts * (drafts + 1) // 2


@njit(inline=True)
def step_starts(s):
    """A step's scheduling begins: none of its drafts yet."""
    s.count[STEP_SPEC_TOKENS] = 0
    s.count[STEP_DRAFT_CONTEXT] = 0


@njit(inline=True)
def step_drafts(s):
    """The draft tokens the step verifies: its query tokens beyond one per decode (0 without
    speculative decoding)."""
    return s.count[STEP_SPEC_TOKENS]


@njit(inline=True)
def draft_context(s):
    """The contexts' sum of the step's decodes that verify drafts: the drafter's attention reads."""
    return s.count[STEP_DRAFT_CONTEXT]


def totals(count) -> tuple[int, int, int]:
    """A run's draft tokens verified, of them accepted, and the request-steps that verified
    drafts, from its counters ``count`` (the summary's, sim/run.py and sim/cluster.py)."""
    return int(count[SPEC_DRAFTED]), int(count[SPEC_ACCEPTED]), int(count[SPEC_VERIFIED])


@njit(inline=True)
def scheduled(s, i, high, drafts):
    """Request ``i`` was scheduled with its blocks grown to hold ``high`` tokens and ``drafts``
    drafts to verify (its computed tokens counted already: the caller calls :func:`leave`
    before counting them); nothing without speculation."""
    if not speculating(s.config):
        return
    s.speculative[i, SPEC_HIGH] = high
    s.speculative[i, SPEC_DRAFTS] = drafts
    enter(s, i)
    if drafts:
        s.count[STEP_SPEC_TOKENS] += drafts
        s.count[STEP_DRAFT_CONTEXT] += s.num_computed_tokens[i]


@njit
def unscheduled(s, i):
    """Request ``i``, scheduled earlier in this step, is about to be preempted: its drafts leave
    the step. Returns them."""
    drafts = s.speculative[i, SPEC_DRAFTS]
    if drafts:
        s.count[STEP_SPEC_TOKENS] -= drafts
        s.count[STEP_DRAFT_CONTEXT] -= s.num_computed_tokens[i]
    return drafts


@njit(inline=True)
def accept(s, i, traits):
    """After the step: request ``i``'s drafts accepted, drawn position by position (module
    docstring), its computed tokens rolled forward by those it keeps (its output length caps
    them: scheduler.py:2752-2764). Returns the tokens it emits beyond the one every decode emits.
    ``traits``: the caller's family's (``memory.py``)."""
    drafts = s.speculative[i, SPEC_DRAFTS]
    if drafts == 0:
        prefix_cache.sampled(s, i, 1)
        return 0
    accepted = 0
    while accepted < drafts and s.rng.random() < s.spec_acceptance[accepted]:
        accepted += 1
    c = s.count
    c[SPEC_DRAFTED] += drafts
    c[SPEC_ACCEPTED] += accepted
    c[SPEC_VERIFIED] += 1
    kept = min(accepted, s.output_tokens[i] - s.num_generated[i] - 1)
    s.speculative[i, SPEC_DRAFTS] = 0
    if kept > 0:
        leave(s, i)
        kv_cache.compute_tokens(s, i, kept, traits)
        enter(s, i)
    prefix_cache.sampled(s, i, kept + 1)
    return kept


@njit(inline=True)
def placeholders_rejected(s, i):
    """After the step that completed request ``i``'s prompt: a padded admission's placeholder
    drafts (:func:`pads`) are all rejected, counted as drafted, none accepted
    (scheduler.py:2346-2370); its computed tokens are its one real token's already. Its sampled
    token may complete a block's hash (``prefix_cache.sampled``), as a decode's may (:func:`accept`)."""
    prefix_cache.sampled(s, i, 1)
    drafts = s.speculative[i, SPEC_DRAFTS]
    if drafts:
        s.count[SPEC_DRAFTED] += drafts
        s.count[SPEC_VERIFIED] += 1
        s.speculative[i, SPEC_DRAFTS] = 0


@njit(inline=True)
def clear(s, i):
    """Request ``i`` lets its memory go (finished, preempted, aborted): its slack with it."""
    leave(s, i)
    s.speculative[i, SPEC_HIGH] = 0
    s.speculative[i, SPEC_DRAFTS] = 0


@njit(inline=True)
def split_categories(s, out):
    """The speculative slack out of the reservation (its slots below the final length) and the
    internal fragmentation (above it), into its own category: in every attention group's blocks
    (KV cache groups: each holds a request's slots past its computed tokens; a sliding window
    frees only slots below them), and each state group's blocks for the drafts' states
    (:func:`state_slack`)."""
    c = s.count
    groups = kv_cache.attention_groups(s) if kv_cache.grouped(s) else 1
    out[1] -= groups * c[SPEC_DEMAND_SLOTS]
    out[2] -= groups * (c[SPEC_SLOTS] - c[SPEC_DEMAND_SLOTS]) + state_slack(s)
    out[SPECULATIVE_SLACK] = groups * c[SPEC_SLOTS] + state_slack(s)


@njit(inline=True)
def state_slack(s):
    """The slots of the state groups' blocks for the drafts' states, K per holder and group
    beside its state's (``kv_cache.state_blocks``): nothing else holds them."""
    return kv_cache.state_blocks_held(s) * s.config[SPEC_TOKENS] * s.config[BLOCK_SIZE]
