// Fused element-wise kernels of a decoder layer, where serving engines fuse them (one launch each
// instead of the ~8 torch ops of an RMSNorm, ~9 of a rotary embedding and 3 of a SiLU-and-mul):
//
//   fused_add_rms_norm_kernel   residual += input; input = RMSNorm(residual) * weight  (vLLM's
//                               fused_add_rms_norm; with add = 0 a plain RMSNorm that also copies
//                               input into residual, the first layer's norm)
//   rotary_cache_kernel         neox rotary on q and k in place in the fused QKV rows, and the
//                               rotated k and the v rows written to their KV-cache slots (SGLang's
//                               rotary with fused_set_kv_buffer; vLLM runs the rotary and the cache
//                               write as two kernels, see gpu/fused_ops.py)
//   silu_and_mul_kernel         out = silu(x[:d]) * x[d:]  (vLLM's silu_and_mul)
//
// fp32 arithmetic, one rounding to the storage type where the engines round (see each kernel).
// Element-wise 2-byte accesses (any hidden size or head_dim: odd sizes included). grid: one
// block per token.
#include "common.cuh"

// x rounded to the storage type T and back
template <typename T> __device__ __forceinline__ float round_trip(float x) {
    T t;
    store_float(&t, x);
    return to_float(t);
}

// input, residual: [num_tokens, hidden] with row strides input_stride / residual_stride (elements).
// z = input + residual (fp32), residual = z rounded; the variance is the mean of z^2 over the
// rounded z (what the next layer reads); input = (z * rsqrt(variance + eps)) rounded, times weight,
// rounded again: vLLM's rounding (csrc/layernorm_kernels.cu, fused_add_rms_norm_kernel), which is
// also the eager runner's `(x * rsqrt).to(dtype) * w`. needs >= 32 floats of shared memory.
template <typename T>
__global__ void fused_add_rms_norm_kernel(T* __restrict__ input, T* __restrict__ residual,
                                          const T* __restrict__ weight, const float epsilon, const int hidden,
                                          const long long input_stride, const long long residual_stride,
                                          const int add) {
    __shared__ float red[PAGESIM_WARP];
    T* x = input + blockIdx.x * input_stride;
    T* r = residual + blockIdx.x * residual_stride;
    float sum_sq = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float z = add ? to_float(x[i]) + to_float(r[i]) : to_float(x[i]);
        store_float(&r[i], z);
        const float zr = to_float(r[i]);
        sum_sq += zr * zr;
    }
    const float inv = rsqrtf(block_sum(sum_sq, red) / (float)hidden + epsilon);
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float normed = round_trip<T>(to_float(r[i]) * inv);
        store_float(&x[i], normed * to_float(weight[i]));
    }
}

// qkv: [num_tokens, (num_heads + 2 num_kv_heads) head_dim] rows of stride qkv_stride (elements),
// q heads first, then k, then v. positions: [num_tokens]; cos, sin: [max_position, head_dim / 2].
// Rotates pairs (i, i + head_dim / 2) of every q and k head in place:
//   x' = x cos - y sin,  y' = y cos + x sin     (fp32, one rounding: vLLM's rotary_embedding_kernel)
// and writes the rotated k and the v rows to slot `slots[token]` of the caches
// [num_blocks, block_size, num_kv_heads, head_dim] (a negative slot: no write, a padding token).
template <typename T, typename IDX>
__global__ void rotary_cache_kernel(T* __restrict__ qkv, const long long qkv_stride,
                                    const long long* __restrict__ positions, const T* __restrict__ cos_table,
                                    const T* __restrict__ sin_table, const int num_heads, const int num_kv_heads,
                                    const int head_dim, T* __restrict__ key_cache, T* __restrict__ value_cache,
                                    const IDX* __restrict__ slots) {
    const long long token = blockIdx.x;
    const int half = head_dim / 2;
    const long long pos = positions[token];
    const long long slot = (long long)slots[token];
    const long long kv_row = (long long)num_kv_heads * head_dim;
    T* row = qkv + token * qkv_stride;
    const T* c = cos_table + pos * half;
    const T* s = sin_table + pos * half;
    const int pairs = (num_heads + num_kv_heads) * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int head = p / half, i = p % half;
        T* h = row + (long long)head * head_dim;
        const float x = to_float(h[i]), y = to_float(h[i + half]);
        const float cs = to_float(c[i]), sn = to_float(s[i]);
        store_float(&h[i], x * cs - y * sn);
        store_float(&h[i + half], y * cs + x * sn);
        if (head >= num_heads && slot >= 0) {  // a key head: its rotated pair goes to the cache too
            T* dst = key_cache + slot * kv_row + (long long)(head - num_heads) * head_dim;
            dst[i] = h[i];
            dst[i + half] = h[i + half];
        }
    }
    if (slot < 0) return;
    const T* v = row + (long long)(num_heads + num_kv_heads) * head_dim;
    for (long long e = threadIdx.x; e < kv_row; e += blockDim.x) value_cache[slot * kv_row + e] = v[e];
}

// input: [num_tokens, 2 d] rows of stride in_stride, out: [num_tokens, d] of stride out_stride.
// out = round(silu(gate)) * up, rounded: vLLM's act_and_mul_kernel computes silu in fp32, returns
// it in the storage type and multiplies it by up (csrc/activation_kernels.cu).
template <typename T>
__global__ void silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ input, const int d,
                                    const long long in_stride, const long long out_stride) {
    const T* x = input + blockIdx.x * in_stride;
    T* o = out + blockIdx.x * out_stride;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float g = to_float(x[i]);
        const float act = round_trip<T>(g / (1.f + expf(-g)));
        store_float(&o[i], act * to_float(x[d + i]));
    }
}
