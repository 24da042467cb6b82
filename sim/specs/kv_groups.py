"""KV cache groups: how vLLM v1 (0.33.0) splits a model's attention layers into groups that
share one block pool, each group with its own block table (``vllm/v1/core/kv_cache_planning.py``).

The rule, for attention layers of one page size (every model here: full and sliding layers
of one model have the same heads and head size):

* layers of the same kind (full attention; sliding window of one size) form a bucket
  (``_get_kv_cache_groups_uniform_page_size``, kv_cache_planning.py:484-507); one bucket is
  one group (``UniformTypeKVCacheSpecs``, :1146-1150: a model whose every layer slides, as
  Mistral-7B's, is one sliding-window group);
* several buckets: the group size is the smallest bucket's layer count, or the largest's when
  that is under 1.5 times the smallest (:522-533); each bucket splits into
  ``ceil(layers / group size)`` groups, the last one padded (:534-556);
* every group's block holds ``block_size`` tokens of ``group size`` layers, and one pool of
  ``kv_bytes // bytes_per_block`` blocks serves all groups (``_get_kv_cache_bytes_per_block``,
  :574-606, ``get_kv_cache_config_from_groups``, :673-675): the page size is the same for every
  group, as vLLM unifies it.

So Gemma-2-27B (23 sliding, 23 full layers) has 2 groups of 23 layers; Gemma-3-27B (52
sliding, 10 full) 7 groups of 10 (6 sliding, 8 padding layers, and 1 full). A request's
tokens take a block in every group; a sliding-window group frees the blocks that fall out of
its window (``sim/core/kv/kv_cache.py``, ``remove_skipped``). vLLM v0 (``--system vllm``) knows
no groups: all attention layers in one table, as full attention.

Mamba and linear-attention layers (a recurrent state per request, ``MambaSpec``) are buckets
too, grouped by the same rule, and their states live in the same pool (vLLM v1; v0 reserved
``max_num_seqs`` states outside it, ``sim/specs/capacity.py``). Without prefix caching
(``mamba_cache_mode`` "none", ``model_executor/models/config.py:780-787``) a state group's block
covers ``max_model_len`` tokens: a request holds one block per state group from its first
allocation to its end (``MambaManager``, single_type_kv_cache_manager.py:1428, through the base
``get_num_blocks_to_allocate``, :214). One layer's state must fit one layer's page, so vLLM
raises the attention block size: the smallest multiple of the kernel's block alignment (16,
FlashAttention's ``MultipleOf(16)``, ``v1/attention/backends/flash_attn.py:367``, or the
configured block size if larger) whose page holds the state, and pads the state to that page
(``Platform._align_hybrid_block_size``, platforms/interface.py:1096-1130). Jamba-1.5-Mini at
TP 1: a Mamba layer keeps 311,296 B, a token of one attention layer 4,096 B, so blocks of 80
tokens (327,680 B pages, the state padded by 5.3 %); 4 attention and 28 Mamba layers make 1
full group and 7 state groups of 4 layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.model import ATTENTION_KINDS, FULL_ATTENTION, RECURRENT_KINDS, SLIDING_ATTENTION, ModelSpec

#: the kernel block alignment vLLM raises a hybrid model's attention block size in: FlashAttention's
#: supported kernel block sizes, ``[MultipleOf(16)]`` (v1/attention/backends/flash_attn.py:367)
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True)
class KVCacheGroups:
    """A model's KV cache groups: ``full_groups`` full-attention groups and ``sliding_groups``
    sliding-window groups (``window`` tokens), each of ``layers_per_group`` layers."""

    full_groups: int
    sliding_groups: int
    layers_per_group: int
    window: int  # 0: no sliding-window group
    state_groups: int = 0  # Mamba / linear-attention groups: one block per request each
    block_size: int = 0  # with state groups, the attention block size vLLM raised (0: as configured)
    state_slots: int = 0  # the tokens' worth of one layer's page its state fills, the rest padding
    # vLLM's group order: a kind's groups in the order its first layer comes (the layer buckets by
    # first appearance, kv_cache_planning.py:484-507, their groups in turn, :534-556): the sliding
    # groups first where the first attention layer slides (Gemma-2, Gemma-3); pagesim's tables put
    # the full groups first, and prefix caching follows vLLM's order where it picks a block
    sliding_first: bool = False
    # the same for a state hybrid: the state groups first where the first layer keeps a state
    # (Jamba's layer 0 is Mamba); prefix caching ("align" mode) lets state blocks go in this order
    state_first: bool = False

    @property
    def num_groups(self) -> int:
        return self.full_groups + self.sliding_groups + self.state_groups

    @property
    def hybrid(self) -> bool:
        """Whether some group frees blocks out of its window or keeps a state (else: one table)."""
        return self.sliding_groups > 0 or self.state_groups > 0

    def bytes_per_block(self, model: ModelSpec, block_size: int, tensor_parallel: int = 1) -> float:
        """One block of the pool: ``block_size`` tokens of one group's layers (padding included)."""
        return self.layers_per_group * block_size * model.kv_bytes_per_layer_token(tensor_parallel)

    def padding_layers(self, model: ModelSpec) -> int:
        return self.num_groups * self.layers_per_group - model.num_attention_layers

    def words(self) -> str:
        """``1 full + 1 sliding(4096) x 23 layers``, ``1 full + 7 state x 4 layers, blocks of 80
        tokens`` (the block size a state raised it to): the groups in a line."""
        parts = [f"{self.full_groups} full"] if self.full_groups else []
        if self.sliding_groups:
            parts.append(f"{self.sliding_groups} sliding({self.window})")
        if self.state_groups:
            parts.append(f"{self.state_groups} state")
        raised = f", blocks of {self.block_size} tokens" if self.state_groups else ""
        return f"{' + '.join(parts)} x {self.layers_per_group} layers{raised}"


def kv_cache_groups(model: ModelSpec, block_size: int = 16, tensor_parallel: int = 1) -> KVCacheGroups:
    """vLLM v1's groups for ``model`` (module docstring) at a configured ``block_size``. A model
    with recurrent (Mamba, linear-attention) layers beside sliding ones is refused: not modelled."""
    kinds = model.kinds
    full = sum(k == FULL_ATTENTION for k in kinds)
    sliding = sum(k == SLIDING_ATTENTION for k in kinds) if model.sliding_window else 0
    recurrent = [k for k in kinds if k in RECURRENT_KINDS]
    if recurrent:
        if sliding:
            raise ConfigError(f"{model.name}: sliding-window groups beside Mamba or linear-attention layers are not "
                              "modelled with vllm-v1; use --system vllm (full-attention sizing)")
        if not full:  # the groups' sizes and the block size are the attention layers'
            raise ConfigError(f"{model.name}: no full-attention layer beside its Mamba or linear-attention layers; "
                              "a state-only model is not modelled with vllm-v1")
        # one bucket per kind of state (its own MambaSpec); the page fits the largest state
        buckets = [full] + [recurrent.count(k) for k in sorted(set(recurrent))]
        state = max(model.state_bytes_per_layer(k, tensor_parallel) for k in recurrent)
        size = group_size(buckets)
        first = next(k for k in kinds if k in ATTENTION_KINDS or k in RECURRENT_KINDS)
        return KVCacheGroups(-(-full // size), 0, size, 0, sum(-(-n // size) for n in buckets[1:]),
                             state_block_size(model, state, block_size, tensor_parallel),
                             int(state // model.kv_bytes_per_layer_token(tensor_parallel)),
                             state_first=first in RECURRENT_KINDS)
    full += sum(k == SLIDING_ATTENTION for k in kinds) - sliding  # no window given: full attention
    if not sliding:
        return KVCacheGroups(1, 0, full, 0)
    if not full:  # one bucket, one group (kv_cache_planning.py:1146-1150)
        return KVCacheGroups(0, 1, sliding, model.sliding_window)
    size = group_size([full, sliding])
    first = next(k for k in kinds if k in ATTENTION_KINDS)
    return KVCacheGroups(-(-full // size), -(-sliding // size), size, model.sliding_window,
                         sliding_first=first == SLIDING_ATTENTION)


def group_size(buckets: list[int]) -> int:
    """Layers per group over buckets of these layer counts: the smallest bucket's, or the
    largest's when that is under 1.5 times the smallest (kv_cache_planning.py:522-533)."""
    smallest, largest = min(buckets), max(buckets)
    return largest if largest < smallest * 1.5 else smallest


def state_block_size(model: ModelSpec, state_bytes: int, block_size: int, tensor_parallel: int) -> int:
    """The attention block size vLLM raises a hybrid model's to, so one layer's page holds one
    layer's state (``_align_hybrid_block_size``, platforms/interface.py:1066-1109): the alignment
    is the kernel's (16) or the configured size if larger, the block the fewest aligned units
    whose page holds the state; a configured size larger still stays."""
    alignment = max(KERNEL_BLOCK_ALIGNMENT, block_size)
    per_token = int(model.kv_bytes_per_layer_token(tensor_parallel))
    raised = alignment * -(-state_bytes // (alignment * per_token))
    raised = KERNEL_BLOCK_ALIGNMENT * -(-raised // KERNEL_BLOCK_ALIGNMENT)
    return max(block_size, raised)


def window_cap_blocks(window: int, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int:
    """The blocks a sliding-window group may hold for one request, its admission cap (vLLM
    0.33.0 ``SlidingWindowSpec.max_admission_blocks_per_request``, kv_cache_interface.py:918-944):
    the window's last ``window - 1`` tokens and the tokens in flight, one block more for a window
    that starts inside a block. ``max_in_flight_tokens`` is ``max_num_batched_tokens`` times the
    batches in flight (2 under async scheduling: config/vllm.py:588-609)."""
    tokens = min(window - 1 + max_in_flight_tokens, max_model_len)
    return -(-tokens // block_size) + 1


def request_layer_blocks(model: ModelSpec, block_size: int, max_in_flight_tokens: int, max_model_len: int,
                         num_speculative_tokens: int = 0, mamba_align: bool = False) -> int:
    """One ``max_model_len`` request's blocks summed over the attention layers, as vLLM 0.33.0
    checks at start that the pool holds one (``check_enough_kv_cache_memory``,
    kv_cache_planning.py:151-184; ``max_memory_usage_bytes``, :90-94): a full-attention layer
    ``cdiv(max_model_len, block_size)`` (kv_cache_interface.py:643-648), a sliding one its
    admission cap (:946-955), a state layer one page and one per draft
    (``MambaSpec.max_memory_usage_bytes``, kv_cache_interface.py:1135-1141; with prefix caching,
    ``mamba_align``, two: its state and the one it is copied from, :1135-1141). Per layer, so
    padding layers count nothing; the pool must hold this many blocks of one layer:
    ``layers_per_group`` of them per block."""
    if not model.sliding_window:  # no window: its sliding layers are full attention (kv_cache_groups)
        full, sliding = sum(k in ATTENTION_KINDS for k in model.kinds), 0
    else:
        full, sliding = sum(k == FULL_ATTENTION for k in model.kinds), sum(k == SLIDING_ATTENTION for k in model.kinds)
    states = sum(k in RECURRENT_KINDS for k in model.kinds)
    cap = window_cap_blocks(model.sliding_window, block_size, max_in_flight_tokens, max_model_len) if sliding else 0
    return (full * -(-max_model_len // block_size) + sliding * cap
            + states * (1 + int(mamba_align) + num_speculative_tokens))


def vllm_kv_cache_size(groups: KVCacheGroups, num_blocks: int, block_size: int, max_in_flight_tokens: int,
                       max_model_len: int, num_speculative_tokens: int = 0,
                       mamba_align: bool = False) -> tuple[int, float]:
    """The KV cache size in tokens and the maximum concurrency vLLM 0.33.0 logs at start ("GPU KV
    cache size: N tokens, Maximum concurrency for M tokens per request: Cx",
    ``update_kv_cache_capacity``, v1/core/kv_cache_utils.py:1136-1154, called by the engine core,
    v1/engine/core.py:352): C is the pool's blocks
    over one ``max_model_len`` request's blocks summed over the groups
    (``get_max_concurrency_for_kv_cache_config``, :1061-1093; each group's
    ``max_memory_usage_bytes`` over its page: a full group ``cdiv(max_model_len, block_size)``,
    a sliding one its admission cap, a state group one page and one per draft, two with prefix
    caching: kv_cache_interface.py:643-648, :946-955, :1135-1141), and N is ``int(C x M)``
    (``get_kv_cache_capacity``, :1120-1128). With several groups a token takes a block in each,
    so N is far below the pool's slots (a slot: a token of one group's layers)."""
    per_request = (groups.full_groups * -(-max_model_len // block_size)
                   + groups.sliding_groups * (window_cap_blocks(groups.window, block_size, max_in_flight_tokens,
                                                                max_model_len) if groups.sliding_groups else 0)
                   + groups.state_groups * (1 + int(mamba_align) + num_speculative_tokens))
    concurrency = num_blocks / per_request
    return int(concurrency * max_model_len), concurrency
