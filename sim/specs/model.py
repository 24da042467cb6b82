"""A model's architecture and the rules that turn it into memory and work.

Every rule below is stated once, here; the config reader (``hf_config.py``) only maps a
Hugging Face ``config.json`` onto these fields, and the presets (``presets.py``) fill them in
from the public configs.

Layers
------
Each layer has a token mixer (its kind) and an MLP. Kinds:

==================  ====================================================  ====================
kind                mixer                                                 keeps per sequence
==================  ====================================================  ====================
full_attention      softmax attention                                     K and V per token
sliding_attention   softmax attention over the last ``sliding_window``    K and V per token
mamba               Mamba selective scan (Jamba)                          a fixed-size state
mamba2              Mamba-2 state-space duality (Nemotron-H, Granite-4)   a fixed-size state
gated_delta_net     gated delta rule (Qwen3-Next's linear attention)      a fixed-size state
linear_attention    lightning attention (MiniMax-Text-01)                 a fixed-size state
mlp                 none: the layer is an MLP alone (Nemotron-H's ``-``)  nothing
==================  ====================================================  ====================

A layer has an MLP beside its mixer unless ``mixers_have_mlp`` is false: then each layer is a
mixer or an MLP alone (Nemotron-H's ``hybrid_override_pattern``).

KV bytes per token, per GPU of a tensor-parallel group of ``tp`` (vLLM's cache layout)::

    attention layer:  2 * max(1, kv_heads // tp) * head_dim * kv_cache_dtype_bytes     (K and V)
    latent (MLA):     (kv_lora_rank + qk_rope_head_dim) * kv_cache_dtype_bytes          (one latent, every GPU)
    kv_bytes_per_token = sum over the attention layers (full and sliding)

``kv_cache_dtype_bytes`` is the model's ``dtype_bytes`` under vLLM's default ``--kv-cache-dtype
auto`` and 1 under ``fp8`` (``fp8_e4m3``, ``fp8_e5m2``: ``STR_DTYPE_TO_TORCH_DTYPE`` in
vllm/utils/__init__.py maps each to a one-byte uint8 cache); activations, all-reduces and
recurrent states keep ``dtype_bytes``.

KV heads are replicated when ``tp`` exceeds them: each GPU keeps at least one (vLLM's
``ModelConfig.get_num_kv_heads`` in ``vllm/config.py``: ``max(1, total_num_kv_heads //
tensor_parallel_size)``). DeepSeek's multi-head latent attention caches one compressed latent
per token and layer, the same on every GPU (vLLM's ``get_head_size`` returns
``kv_lora_rank + qk_rope_head_dim`` and ``get_num_kv_heads`` returns 1 for MLA; its MLA cache
holds no separate V, hence no factor 2).

Sliding-window layers are counted as if they kept the whole context, which is what vLLM v0
does for models that interleave sliding and full layers ("the scheduler and the model treat
it as full attention (i.e., not dropping any tokens outside the window)", ``ModelConfig``
in ``vllm/config.py``). vLLM v1 (``--system vllm-v1``) keeps them in KV cache groups and frees
their blocks as they leave the window (``sim/specs/kv_groups.py``, ``sim/core/kv/kv_cache.py``);
the other systems do not, so beyond ``sliding_window`` tokens their KV memory is an upper
bound; decode reads are priced as full attention everywhere.

Recurrent state per sequence (Mamba and linear-attention layers), per GPU::

    mamba:            d_inner / tp * (d_conv - 1 + d_state) * dtype_bytes   (conv + SSM state)
    mamba2:           (d_inner + 2 * groups * d_state) / tp * (d_conv - 1) * dtype_bytes     (conv)
                      + heads / tp * head_dim * d_state * ssm_bytes                         (SSM)
    gated_delta_net:  (2 * k_heads * k_dim + v_heads * v_dim) / tp * (d_conv - 1) * dtype_bytes
                      + v_heads / tp * v_dim * k_dim * ssm_bytes
    linear_attention: heads / tp * head_dim * head_dim * dtype_bytes        (the KV outer-product state)

(vLLM 0.33.0's ``MambaStateShapeCalculator``, model_executor/layers/mamba/mamba_utils.py:171-294:
``mamba2_state_shape`` widens the groups to ``tp`` when ``tp`` does not divide them, each head
shard keeping its group; ``ssm_bytes`` is the SSM state's dtype, the model's unless the model
sets it: Nemotron-H keeps it in float32, ``NemotronHForCausalLMConfig``,
model_executor/models/config.py:812-832.)

vLLM reserves one state slot per ``max_num_seqs`` before sizing the KV pool (``MambaCacheManager``
in ``vllm/model_executor/models/jamba.py``, ``MinimaxCacheManager`` in ``minimax_text_01.py``:
``cache_shape = (linear_layers, max_num_seqs, heads // tp, head_dim, head_dim)``).

Parameters (biases and norms are not counted: under 0.1 % of any model here)::

    attention        h*q + 2*h*kv + q*h           q = heads*head_dim, kv = kv_heads*head_dim
    latent attention h*r_q + r_q*heads*d_qk  (or h*heads*d_qk without r_q)
                     + h*(r_kv + d_rope) + r_kv*heads*(d_nope + d_v) + heads*d_v*h
    mamba            h*2*d_inner + d_inner*d_conv + d_inner*(dt_rank + 2*d_state)
                     + dt_rank*d_inner + d_inner*d_state + d_inner*h
    linear attention 3*h*q + h*q + q*h            (qkv, output gate, output projection)
    mamba2           h*(2*d_inner + 2*groups*d_state + heads) + conv_dim*d_conv + d_inner*h
                     (in_proj: z, x, B, C, dt; the causal conv over x, B, C; out_proj)
    gated_delta_net  h*(2*k + 2*v) + h*2*v_heads + conv_dim*d_conv + v*h
                     (in_proj_qkvz, in_proj_ba, the conv over q, k, v, out_proj; k = k_heads*k_dim)
    gated attention  attention with q doubled (Qwen3-Next's output gate, ``attn_output_gate``)
    dense MLP        (3 if gated else 2) * h * intermediate
    MoE MLP          E * 3*h*i_expert + 3*h*i_shared + E*h      (experts, shared expert, router)
    active MoE MLP   k * 3*h*i_expert + 3*h*i_shared + E*h      (the k experts a token visits)

Memory holds every expert (``num_params``, ``weight_bytes``); a token's work multiplies only
the active ones (``active_params``). A step reads the weights outside the routed experts
(``unrouted_weight_bytes``) and each routed expert any of its tokens visits
(``routed_expert_weight_bytes`` per distinct expert; the expectation is in
``sim/cost/roofline.py``). ``num_params`` adds the embedding, an untied LM head and a vision
encoder; ``active_params`` adds the LM head (``vocab * h``, tied or not) and no embedding (a
lookup, not a GEMM).

Weight bytes: the layers' weights at the checkpoint's quantized width (``Quantization``);
embedding, LM head and vision encoder at ``dtype_bytes`` (AWQ, GPTQ and FP8 checkpoints leave
them unquantized). Tensor parallelism splits all weights evenly; the few projections vLLM
replicates on every GPU (MLA's down-projections, MoE routers, KV projections of replicated
heads: 1-2 % of a model) are not added.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagesim.sim.errors import ConfigError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
MAMBA = "mamba"
MAMBA2 = "mamba2"
GATED_DELTA_NET = "gated_delta_net"
LINEAR_ATTENTION = "linear_attention"
MLP_ONLY = "mlp"
LAYER_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION, MAMBA, MAMBA2, GATED_DELTA_NET, LINEAR_ATTENTION, MLP_ONLY)
ATTENTION_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION)  # the layers that keep K and V per token
RECURRENT_KINDS = (MAMBA, MAMBA2, GATED_DELTA_NET, LINEAR_ATTENTION)  # the layers that keep a state
#: vLLM's --kv-cache-dtype values simulated: "auto" (the model's dtype) and FP8 under its names
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def interleaved_sliding(num_layers: int, full_every: int) -> tuple[str, ...]:
    """Layer kinds of a model whose every ``full_every``-th layer is full attention and the
    rest sliding-window (Gemma-2: 2, Gemma-3: 6; Hugging Face's
    ``(i + 1) % sliding_window_pattern``)."""
    return tuple(FULL_ATTENTION if (i + 1) % full_every == 0 else SLIDING_ATTENTION for i in range(num_layers))


@dataclass(frozen=True)
class LatentAttention:
    """DeepSeek's multi-head latent attention (MLA) dimensions."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0  # 0: queries projected from the hidden state directly (DeepSeek-V2-Lite)


@dataclass(frozen=True)
class MixtureOfExperts:
    """Routed experts (gated MLPs) in the layers listed; the other layers keep a dense MLP."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    layers: tuple[int, ...]
    shared_intermediate_size: int = 0  # always-active shared expert(s), their sizes summed


@dataclass(frozen=True)
class MambaMixer:
    """Jamba's Mamba layer dimensions (``d_inner = mamba_expand * hidden_size``)."""

    d_inner: int
    d_state: int
    d_conv: int
    dt_rank: int


@dataclass(frozen=True)
class Mamba2Mixer:
    """A Mamba-2 layer's dimensions (``d_inner``: the conv's and the projections' inner width,
    ``heads * head_dim`` in every model here); ``ssm_dtype_bytes`` 0: the SSM state at the
    model's dtype."""

    d_inner: int
    num_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    d_conv: int
    ssm_dtype_bytes: int = 0

    def state_bytes(self, tensor_parallel: int, dtype_bytes: int) -> int:
        """One sequence's conv and SSM state in one layer on one GPU (module docstring)."""
        groups = self.n_groups if self.n_groups % tensor_parallel == 0 else tensor_parallel
        conv = _divide(self.d_inner + 2 * groups * self.d_state, tensor_parallel) * (self.d_conv - 1)
        ssm = _divide(self.num_heads, tensor_parallel) * self.head_dim * self.d_state
        return conv * dtype_bytes + ssm * (self.ssm_dtype_bytes or dtype_bytes)

    def params(self, hidden: int) -> int:
        conv_dim = self.d_inner + 2 * self.n_groups * self.d_state
        return hidden * (conv_dim + self.d_inner + self.num_heads) + conv_dim * self.d_conv + self.d_inner * hidden


@dataclass(frozen=True)
class GatedDeltaNet:
    """A gated-delta-rule linear-attention layer's dimensions (Qwen3-Next's ``linear_*`` keys)."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    d_conv: int
    ssm_dtype_bytes: int = 0

    def state_bytes(self, tensor_parallel: int, dtype_bytes: int) -> int:
        conv_dim = 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim
        conv = _divide(conv_dim, tensor_parallel) * (self.d_conv - 1)
        recurrent = _divide(self.num_v_heads, tensor_parallel) * self.head_v_dim * self.head_k_dim
        return conv * dtype_bytes + recurrent * (self.ssm_dtype_bytes or dtype_bytes)

    def params(self, hidden: int) -> int:
        k, v = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        return hidden * (2 * k + 2 * v) + hidden * 2 * self.num_v_heads + (2 * k + v) * self.d_conv + v * hidden


def _divide(numerator: int, denominator: int) -> int:
    """vLLM's ``divide``: a state's dimension splits evenly over the TP group, or the model does
    not run at that TP."""
    if numerator % denominator:
        raise ConfigError(f"a recurrent state's dimension {numerator} does not split over tensor parallel "
                          f"{denominator}")
    return numerator // denominator


@dataclass(frozen=True)
class Quantization:
    """Width of the quantized layer weights.

    ``group_size > 0``: every group of weights also stores one fp16 scale and, with
    ``zero_point``, one ``bits``-wide zero point (AWQ, GPTQ as stored in the checkpoint).
    FP8's per-tensor, per-channel or 128x128-block scales are under 0.03 % and not counted.
    ``fp8_compute``: activations are quantized too (W8A8 FP8), so GEMMs run at the GPU's FP8
    peak where it has one; weight-only schemes compute in 16 bits.
    """

    method: str
    bits: int
    group_size: int = 0
    zero_point: bool = False
    fp8_compute: bool = False

    def bytes_of(self, params: int) -> int:
        bits = params * self.bits
        if self.group_size > 0:
            bits += (params // self.group_size) * (16 + (self.bits if self.zero_point else 0))
        return bits // 8


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only model's architecture (see the module docstring for the rules)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int  # total KV heads (1 for multi-query and latent attention)
    head_dim: int
    intermediate_size: int  # dense MLP width
    vocab_size: int
    max_seq_len: int
    gated_mlp: bool = True  # LLaMA-style SwiGLU (3 matrices) vs OPT-style (2 matrices)
    dtype_bytes: int = 2  # activations, and the KV cache under kv_cache_dtype "auto"
    tie_word_embeddings: bool = True  # False: the LM head is a second vocab x hidden matrix
    layer_kinds: tuple[str, ...] = ()  # one of LAYER_KINDS per layer; () = all full attention
    sliding_window: int | None = None  # tokens a sliding_attention layer attends to
    latent_attention: LatentAttention | None = None
    moe: MixtureOfExperts | None = None
    mamba: MambaMixer | None = None
    mamba2: Mamba2Mixer | None = None
    delta_net: GatedDeltaNet | None = None
    mixers_have_mlp: bool = True  # False: a layer is a mixer or (kind "mlp") an MLP alone (Nemotron-H)
    attention_output_gate: bool = False  # q_proj doubled for a gate (Qwen3-Next)
    quantization: Quantization | None = None
    vision_params: int = 0  # a multimodal model's vision encoder (memory only)
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES (vLLM's --kv-cache-dtype)
    mtp_layers: int = 0  # multi-token-prediction modules the checkpoint ships (num_nextn_predict_layers)

    @property
    def kv_cache_dtype_bytes(self) -> int:
        """Bytes of one cached K, V or latent element: ``dtype_bytes`` under "auto", 1 under fp8."""
        return self.dtype_bytes if self.kv_cache_dtype == "auto" else 1

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.layer_kinds or (FULL_ATTENTION,) * self.num_layers

    @property
    def num_attention_layers(self) -> int:
        return sum(kind in ATTENTION_KINDS for kind in self.kinds)

    def kv_heads_per_gpu(self, tensor_parallel: int = 1) -> int:
        return max(1, self.num_kv_heads // tensor_parallel)

    def kv_bytes_per_layer_token(self, tensor_parallel: int = 1) -> float:
        """Bytes one token keeps in one attention layer on one GPU of the TP group."""
        mla = self.latent_attention
        if mla is not None:
            return float((mla.kv_lora_rank + mla.qk_rope_head_dim) * self.kv_cache_dtype_bytes)
        return float(2 * self.kv_heads_per_gpu(tensor_parallel) * self.head_dim * self.kv_cache_dtype_bytes)

    def kv_bytes_per_token(self, tensor_parallel: int = 1) -> float:
        """Bytes of KV for one token across all attention layers on one GPU of a TP group."""
        return self.num_attention_layers * self.kv_bytes_per_layer_token(tensor_parallel)

    def state_bytes_per_seq(self, tensor_parallel: int = 1) -> int:
        """Recurrent state one sequence keeps on one GPU (Mamba and linear-attention layers)."""
        return sum(self.state_bytes_per_layer(kind, tensor_parallel) for kind in self.kinds)

    def state_bytes_per_layer(self, kind: str, tensor_parallel: int = 1) -> int:
        """Recurrent state one sequence keeps in one layer of ``kind`` on one GPU (0: attention)."""
        if kind == MAMBA:
            m = self.mamba
            return m.d_inner // tensor_parallel * (m.d_conv - 1 + m.d_state) * self.dtype_bytes
        if kind == MAMBA2:
            return self.mamba2.state_bytes(tensor_parallel, self.dtype_bytes)
        if kind == GATED_DELTA_NET:
            return self.delta_net.state_bytes(tensor_parallel, self.dtype_bytes)
        if kind == LINEAR_ATTENTION:
            return self.num_heads // tensor_parallel * self.head_dim * self.head_dim * self.dtype_bytes
        return 0

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of QK^T and PV for one (query, key) pair, summed over heads and attention layers."""
        mla = self.latent_attention
        if mla is not None:  # prefill attends with the decompressed per-head keys and values
            qk, v = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
        else:
            qk, v = self.head_dim, self.head_dim
        return self.num_attention_layers * 2 * self.num_heads * (qk + v)

    def _mixer_params(self, kind: str) -> int:
        h, mla = self.hidden_size, self.latent_attention
        if kind == MAMBA:
            m = self.mamba
            return (h * 2 * m.d_inner + m.d_inner * m.d_conv + m.d_inner * (m.dt_rank + 2 * m.d_state)
                    + m.dt_rank * m.d_inner + m.d_inner * m.d_state + m.d_inner * h)
        if kind == MAMBA2:
            return self.mamba2.params(h)
        if kind == GATED_DELTA_NET:
            return self.delta_net.params(h)
        if kind == MLP_ONLY:
            return 0
        q = self.num_heads * self.head_dim
        if kind == LINEAR_ATTENTION:
            return 3 * h * q + h * q + q * h
        if mla is not None:
            d_qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
            queries = (h * mla.q_lora_rank + mla.q_lora_rank * self.num_heads * d_qk if mla.q_lora_rank
                       else h * self.num_heads * d_qk)
            return (queries + h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
                    + mla.kv_lora_rank * self.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
                    + self.num_heads * mla.v_head_dim * h)
        kv = self.num_kv_heads * self.head_dim
        return h * q * (2 if self.attention_output_gate else 1) + 2 * h * kv + q * h

    def _mlp_params(self, layer: int, kind: str, routed_experts: int) -> int:
        h, moe = self.hidden_size, self.moe
        if kind != MLP_ONLY and not self.mixers_have_mlp:
            return 0
        if moe is not None and layer in moe.layers:
            return (routed_experts * 3 * h * moe.expert_intermediate_size + 3 * h * moe.shared_intermediate_size
                    + moe.num_experts * h)
        return (3 if self.gated_mlp else 2) * h * self.intermediate_size

    def _layer_params(self, active: bool, routed_experts: int | None = None) -> int:
        """The layers' parameters with every expert (``active=False``), a token's ``k``
        (``active=True``), or ``routed_experts`` routed experts per MoE layer when given."""
        moe = self.moe
        if routed_experts is None:
            routed_experts = 0 if moe is None else moe.experts_per_token if active else moe.num_experts
        return sum(self._mixer_params(kind) + self._mlp_params(i, kind, routed_experts)
                   for i, kind in enumerate(self.kinds))

    def _layer_weight_bytes(self, params: int) -> int:
        q = self.quantization
        return q.bytes_of(params) if q is not None else params * self.dtype_bytes

    @property
    def _embedding_params(self) -> int:
        """The token embedding, plus the LM head when it is a matrix of its own."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        """Every parameter held in memory: all experts, embedding, untied LM head, vision encoder."""
        return self._layer_params(active=False) + self._embedding_params + self.vision_params

    @property
    def active_params(self) -> int:
        """Parameters one token multiplies: the active experts' layers and the LM head."""
        return self._layer_params(active=True) + self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights in GPU memory (the whole TP group)."""
        return (self._layer_weight_bytes(self._layer_params(active=False))
                + (self._embedding_params + self.vision_params) * self.dtype_bytes)

    def weight_bytes_per_gpu(self, tensor_parallel: int = 1, expert_group: int = 1) -> float:
        """Bytes of weights on the fullest GPU: 1/TP of every weight, or, with the routed experts
        split whole over ``expert_group`` GPUs (expert parallel), 1/TP of the rest and
        ceil(E / expert_group) whole experts (vLLM gives each rank its experts whole and the
        remainder's to the first ranks: ``determine_expert_map``, fused_moe/expert_map_manager.py of
        vLLM 0.33.0, lines 66-69; each engine sizes its KV pool on its fullest GPU)."""
        if expert_group <= 1 or self.moe is None:
            return self.weight_bytes / tensor_parallel
        experts = self.moe.num_experts
        routed = experts * self.routed_expert_weight_bytes
        return ((self.weight_bytes - routed) / tensor_parallel
                + -(-experts // expert_group) * self.routed_expert_weight_bytes)

    @property
    def active_weight_bytes(self) -> int:
        """Bytes of weights one token's forward pass reads (the whole TP group)."""
        return (self._layer_weight_bytes(self._layer_params(active=True))
                + self.vocab_size * self.hidden_size * self.dtype_bytes)

    @property
    def num_moe_layers(self) -> int:
        moe = self.moe
        return 0 if moe is None else sum(i in moe.layers for i in range(self.num_layers))

    @property
    def unrouted_weight_bytes(self) -> int:
        """Bytes of weights every forward pass reads whatever its tokens' routing (the whole TP
        group): all but the routed experts (attention, dense MLPs, shared experts, routers, LM
        head). ``active_weight_bytes`` for a dense model."""
        return (self._layer_weight_bytes(self._layer_params(active=True, routed_experts=0))
                + self.vocab_size * self.hidden_size * self.dtype_bytes)

    @property
    def unrouted_params(self) -> int:
        """Parameters one token multiplies whatever its routing: ``active_params`` but the routed
        experts it visits (attention, dense MLPs, shared experts, routers, LM head)."""
        return self._layer_params(active=True, routed_experts=0) + self.vocab_size * self.hidden_size

    @property
    def routed_expert_params(self) -> int:
        """Parameters of one routed expert (a gated MLP of ``expert_intermediate_size``) in each
        MoE layer, summed over those layers; 0 for a dense model."""
        moe = self.moe
        return 0 if moe is None else self.num_moe_layers * 3 * self.hidden_size * moe.expert_intermediate_size

    @property
    def routed_expert_weight_bytes(self) -> int:
        """Bytes of one routed expert (a gated MLP of ``expert_intermediate_size``) in each MoE
        layer, summed over those layers (the whole TP group); 0 for a dense model."""
        moe = self.moe
        if moe is None:
            return 0
        return self.num_moe_layers * self._layer_weight_bytes(3 * self.hidden_size * moe.expert_intermediate_size)


def with_max_seq_len(model: ModelSpec, max_seq_len: int | None) -> ModelSpec:
    return model if max_seq_len is None else replace(model, max_seq_len=int(max_seq_len))


def with_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str | None) -> ModelSpec:
    """``model`` caching K and V as ``kv_cache_dtype`` (None or "auto": at its dtype)."""
    if kv_cache_dtype in (None, "auto"):
        return model
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    return replace(model, kv_cache_dtype=kv_cache_dtype)
