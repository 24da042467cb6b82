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
its window (``sim/core/kv_cache.py``, ``remove_skipped``). vLLM v0 (``--system vllm``) knows
no groups: all attention layers in one table, as full attention.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.model import ATTENTION_KINDS, FULL_ATTENTION, SLIDING_ATTENTION, ModelSpec


@dataclass(frozen=True)
class KVCacheGroups:
    """A model's KV cache groups: ``full_groups`` full-attention groups and ``sliding_groups``
    sliding-window groups (``window`` tokens), each of ``layers_per_group`` layers."""

    full_groups: int
    sliding_groups: int
    layers_per_group: int
    window: int  # 0: no sliding-window group

    @property
    def num_groups(self) -> int:
        return self.full_groups + self.sliding_groups

    @property
    def hybrid(self) -> bool:
        """Whether some group frees blocks out of its window (else: one table, as before)."""
        return self.sliding_groups > 0

    def bytes_per_block(self, model: ModelSpec, block_size: int, tensor_parallel: int = 1) -> float:
        """One block of the pool: ``block_size`` tokens of one group's layers (padding included)."""
        return self.layers_per_group * block_size * model.kv_bytes_per_layer_token(tensor_parallel)

    def padding_layers(self, model: ModelSpec) -> int:
        return self.num_groups * self.layers_per_group - model.num_attention_layers

    def words(self) -> str:
        """``1 full + 1 sliding(4096) x 23 layers``: the groups in a line."""
        parts = [f"{self.full_groups} full"] if self.full_groups else []
        if self.sliding_groups:
            parts.append(f"{self.sliding_groups} sliding({self.window})")
        return f"{' + '.join(parts)} x {self.layers_per_group} layers"


def kv_cache_groups(model: ModelSpec) -> KVCacheGroups:
    """vLLM v1's groups for ``model`` (module docstring). A model with recurrent (Mamba,
    linear-attention) layers beside sliding ones is refused: not modelled."""
    kinds = model.kinds
    full = sum(k == FULL_ATTENTION for k in kinds)
    sliding = sum(k == SLIDING_ATTENTION for k in kinds)
    if not sliding or not model.sliding_window:
        return KVCacheGroups(1, 0, full + sliding, 0)
    if any(k not in ATTENTION_KINDS for k in kinds):
        raise ConfigError(f"{model.name}: sliding-window groups beside Mamba or linear-attention layers are not "
                          "modelled with vllm-v1; use --system vllm (full-attention sizing)")
    if not full:  # one bucket, one group (kv_cache_planning.py:1146-1150)
        return KVCacheGroups(0, 1, sliding, model.sliding_window)
    smallest, largest = min(full, sliding), max(full, sliding)
    size = largest if largest < smallest * 1.5 else smallest  # kv_cache_planning.py:522-533
    return KVCacheGroups(-(-full // size), -(-sliding // size), size, model.sliding_window)


def window_cap_blocks(window: int, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int:
    """The blocks a sliding-window group may hold for one request, its admission cap (vLLM
    0.33.0 ``SlidingWindowSpec.max_admission_blocks_per_request``, kv_cache_interface.py:918-944):
    the window's last ``window - 1`` tokens and the tokens in flight, one block more for a window
    that starts inside a block. ``max_in_flight_tokens`` is ``max_num_batched_tokens`` times the
    batches in flight (2 under async scheduling: config/vllm.py:588-609)."""
    tokens = min(window - 1 + max_in_flight_tokens, max_model_len)
    return -(-tokens // block_size) + 1


def request_layer_blocks(model: ModelSpec, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int:
    """One ``max_model_len`` request's blocks summed over the attention layers, as vLLM 0.33.0
    checks at start that the pool holds one (``check_enough_kv_cache_memory``,
    kv_cache_planning.py:151-184; ``max_memory_usage_bytes``, :90-94): a full-attention layer
    ``cdiv(max_model_len, block_size)`` (kv_cache_interface.py:643-648), a sliding one its
    admission cap (:946-955). Per layer, so padding layers count nothing; the pool must hold
    this many blocks of one layer: ``layers_per_group`` of them per block."""
    full = sum(k == FULL_ATTENTION for k in model.kinds)
    sliding = sum(k == SLIDING_ATTENTION for k in model.kinds)
    cap = window_cap_blocks(model.sliding_window, block_size, max_in_flight_tokens, max_model_len)
    return full * -(-max_model_len // block_size) + sliding * cap
