// PagedAttention decode kernel (vLLM v1/v2 style) with FlashDecoding split-K partitions.
//
//   out[s, h, :] = softmax(scale * q[s, h, :] . K[s, :ctx_s, h / G, :]) @ V[s, :ctx_s, h / G, :]
//
// Layouts (row-major, 2-byte elements T = fp16_t or bf16_t, fp32 accumulation):
//   q        [num_seqs, num_heads, HEAD_DIM]
//   k_cache  [num_blocks, block_size, num_kv_heads, HEAD_DIM]       (paged = 1)
//            [num_seqs, kv_seq_stride, num_kv_heads, HEAD_DIM]      (paged = 0: contiguous variant)
//   v_cache  same as k_cache
//   block_tables [num_seqs, max_blocks_per_seq] int32 (only the first ceil(ctx/block_size)
//            entries of a row are ever read), context_lens [num_seqs] int32
//
// Grid: x = kv_head * head_chunks + chunk, y = seq, z = partition. One thread block loads each
// K/V row of its KV head once and uses it for all HEADS query heads of its chunk (GQA/MQA:
// G = num_heads / num_kv_heads query heads per KV head, split into ceil(G / HEADS) chunks, so a
// KV row is read once per KV head when G <= 8, ceil(G / 8) times otherwise).
//
// Phases per block (a partition = `partition_size` consecutive tokens of one sequence):
//   1. QK: a thread group of TG threads owns one token; each thread loads VPT 16-byte vectors
//      of the K row, dots them with the (pre-scaled, fp32, shared-memory) queries of all HEADS
//      heads, and the group reduces with warp shuffles. Logits go to shared memory.
//   2. softmax: one warp per head: max, exp, sum (warp reductions).
//   3. PV: each thread owns one 16-byte vector (8 dims) of V rows for a stride of tokens and
//      accumulates all HEADS heads in registers; rows are reduced through shared memory.
// With one partition (max_parts == 1) the block writes the normalized output directly (v1);
// otherwise it writes (max logit, exp sum, normalized partial output) per partition and
// paged_attention_reduce_kernel combines them:
//   M = max_p m_p;  w_p = l_p * exp(m_p - M);  out = sum_p w_p * o_p / sum_p w_p   (v2)
#include "common.cuh"

#define PA_NUM_THREADS 128
#define PA_NUM_WARPS (PA_NUM_THREADS / PAGESIM_WARP)

template <int HEAD_DIM>
struct PAGeometry {
    static_assert(HEAD_DIM % 8 == 0, "HEAD_DIM must be a multiple of 8 (16-byte vectors)");
    static constexpr int VECS = HEAD_DIM / 8;  // 16-byte vectors per K/V row
    // threads per token in QK: largest power of two <= 8 dividing VECS (shuffle-reducible)
    static constexpr int TG = (VECS % 8 == 0) ? 8 : (VECS % 4 == 0) ? 4 : (VECS % 2 == 0) ? 2 : 1;
    static constexpr int VPT = VECS / TG;                    // vectors per thread in QK
    static constexpr int QK_TOKENS = PA_NUM_THREADS / TG;    // tokens in flight in QK
    static constexpr int PV_ROWS = PA_NUM_THREADS / VECS;    // tokens in flight in PV
    static_assert(PV_ROWS >= 1, "HEAD_DIM too large for PA_NUM_THREADS");
};

// Element offset of token t's row (for KV head kvh) in the cache.
__device__ __forceinline__ long long pa_row_offset(const int* __restrict__ bt, int paged, int seq, int t,
                                                   int block_size, int block_shift, int kv_seq_stride,
                                                   int num_kv_heads, int kvh, int head_dim) {
    long long phys;
    if (paged) {
        const int b = block_shift >= 0 ? (t >> block_shift) : (t / block_size);
        const int off = t - b * block_size;
        phys = (long long)__ldg(bt + b) * block_size + off;
    } else {
        phys = (long long)seq * kv_seq_stride + t;
    }
    return (phys * num_kv_heads + kvh) * head_dim;
}

// Dynamic shared memory: floats [HEADS * HEAD_DIM] (queries) +
//                        max(HEADS * partition_size, PV_ROWS * HEADS * HEAD_DIM) (logits / PV partials)
template <typename T, int HEAD_DIM, int HEADS>
__global__ void __launch_bounds__(PA_NUM_THREADS)
paged_attention_kernel(T* __restrict__ out,              // [num_seqs, num_heads, HEAD_DIM] (max_parts == 1)
                       float* __restrict__ exp_sums,     // [num_seqs, num_heads, max_parts] (max_parts > 1)
                       float* __restrict__ max_logits,   // [num_seqs, num_heads, max_parts]
                       float* __restrict__ tmp_out,      // [num_seqs, num_heads, max_parts, HEAD_DIM]
                       const T* __restrict__ q,
                       const T* __restrict__ k_cache,
                       const T* __restrict__ v_cache,
                       const int* __restrict__ block_tables,
                       const int* __restrict__ context_lens,
                       const int paged,
                       const int num_heads,
                       const int num_kv_heads,
                       const int max_blocks_per_seq,
                       const int block_size,
                       const int block_shift,      // log2(block_size) if a power of two, else -1
                       const int kv_seq_stride,    // contiguous variant: tokens per sequence slot
                       const int partition_size,
                       const int max_parts,
                       const float scale) {
    typedef PAGeometry<HEAD_DIM> G;
    PAGESIM_DYNAMIC_SMEM(float, pa_smem);
    float* q_s = pa_smem;                     // [HEADS][HEAD_DIM]
    float* work = pa_smem + HEADS * HEAD_DIM; // logits [HEADS][partition_size], then PV partials
    __shared__ float red_m[HEADS];
    __shared__ float red_l[HEADS];

    const int tid = threadIdx.x;
    const int group = num_heads / num_kv_heads;
    const int chunks = (group + HEADS - 1) / HEADS;
    const int kvh = blockIdx.x / chunks;
    const int chunk = blockIdx.x - kvh * chunks;
    const int head0 = kvh * group + chunk * HEADS;
    const int nh = min(HEADS, group - chunk * HEADS);
    const int seq = blockIdx.y;
    const int part = blockIdx.z;
    const int ctx = context_lens[seq];
    const int start = part * partition_size;

    if (start >= ctx) {
        // Nothing to attend to. v1: sequence with ctx == 0 gets zeros. v2: the reduce kernel
        // only reads partitions < ceil(ctx / partition_size) and writes zeros when ctx == 0.
        if (max_parts == 1 && part == 0) {
            for (int i = tid; i < nh * HEAD_DIM; i += PA_NUM_THREADS) {
                const int g = i / HEAD_DIM, d = i - g * HEAD_DIM;
                store_float(out + ((long long)seq * num_heads + head0 + g) * HEAD_DIM + d, 0.f);
            }
        }
        return;
    }
    const int n = min(start + partition_size, ctx) - start;
    const int* bt = block_tables + (paged ? (long long)seq * max_blocks_per_seq : 0);

    // queries of this chunk, pre-scaled, fp32; heads past nh are zero (computed, never written)
    for (int i = tid; i < HEADS * HEAD_DIM; i += PA_NUM_THREADS) {
        const int g = i / HEAD_DIM, d = i - g * HEAD_DIM;
        q_s[i] = g < nh ? to_float(q[((long long)seq * num_heads + head0 + g) * HEAD_DIM + d]) * scale : 0.f;
    }
    __syncthreads();

    // ---- 1. QK -----------------------------------------------------------------------------
    {
        const int tg = tid / G::TG, lt = tid - tg * G::TG;
        // the loop bound is uniform over the block so every lane reaches the shuffles
        for (int base = 0; base < n; base += G::QK_TOKENS) {
            const int i = base + tg;
            const bool valid = i < n;
            float kf[G::VPT * 8];
            if (valid) {
                const uint4* kp = reinterpret_cast<const uint4*>(
                    k_cache + pa_row_offset(bt, paged, seq, start + i, block_size, block_shift, kv_seq_stride,
                                            num_kv_heads, kvh, HEAD_DIM));
#pragma unroll
                for (int v = 0; v < G::VPT; ++v) cvt8<T>(__ldg(kp + lt + v * G::TG), kf + v * 8);
            } else {
#pragma unroll
                for (int e = 0; e < G::VPT * 8; ++e) kf[e] = 0.f;
            }
#pragma unroll
            for (int g = 0; g < HEADS; ++g) {
                float acc = 0.f;
#pragma unroll
                for (int v = 0; v < G::VPT; ++v) {
                    const float4* qv = reinterpret_cast<const float4*>(q_s + g * HEAD_DIM + (lt + v * G::TG) * 8);
                    const float4 a = qv[0], b = qv[1];
                    const float* k8 = kf + v * 8;
                    acc += a.x * k8[0] + a.y * k8[1] + a.z * k8[2] + a.w * k8[3]
                         + b.x * k8[4] + b.y * k8[5] + b.z * k8[6] + b.w * k8[7];
                }
#pragma unroll
                for (int m = G::TG / 2; m >= 1; m >>= 1) acc += __shfl_xor_sync(PAGESIM_FULL_MASK, acc, m);
                if (valid && lt == 0) work[g * partition_size + i] = acc;
            }
        }
    }
    __syncthreads();

    // ---- 2. softmax over the partition, one warp per head ------------------------------------
    {
        const int warp = tid / PAGESIM_WARP, lane = tid - warp * PAGESIM_WARP;
        for (int g = warp; g < HEADS; g += PA_NUM_WARPS) {
            float* lg = work + g * partition_size;
            float m = PAGESIM_NEG_INF;
            for (int i = lane; i < n; i += PAGESIM_WARP) m = fmaxf(m, lg[i]);
            m = warp_max(m);
            float s = 0.f;
            for (int i = lane; i < n; i += PAGESIM_WARP) {
                const float p = __expf(lg[i] - m);
                lg[i] = p;
                s += p;
            }
            s = warp_sum(s);
            if (lane == 0) {
                red_m[g] = m;
                red_l[g] = s;
            }
        }
    }
    __syncthreads();

    // ---- 3. PV --------------------------------------------------------------------------------
    const int row = tid / G::VECS, vec = tid - row * G::VECS;
    float acc[HEADS][8];
#pragma unroll
    for (int g = 0; g < HEADS; ++g)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
    if (row < G::PV_ROWS) {
        for (int i = row; i < n; i += G::PV_ROWS) {
            const uint4* vp = reinterpret_cast<const uint4*>(
                v_cache + pa_row_offset(bt, paged, seq, start + i, block_size, block_shift, kv_seq_stride,
                                        num_kv_heads, kvh, HEAD_DIM));
            float vf[8];
            cvt8<T>(__ldg(vp + vec), vf);
#pragma unroll
            for (int g = 0; g < HEADS; ++g) {
                const float p = work[g * partition_size + i];
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[e];
            }
        }
    }
    __syncthreads();  // logits are dead: reuse `work` for the per-row partials
    if (row < G::PV_ROWS) {
#pragma unroll
        for (int g = 0; g < HEADS; ++g) {
            float4* dst = reinterpret_cast<float4*>(work + (row * HEADS + g) * HEAD_DIM + vec * 8);
            dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
            dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
        }
    }
    __syncthreads();
    for (int i = tid; i < nh * HEAD_DIM; i += PA_NUM_THREADS) {
        const int g = i / HEAD_DIM, d = i - g * HEAD_DIM;
        float o = 0.f;
#pragma unroll 4
        for (int r = 0; r < G::PV_ROWS; ++r) o += work[(r * HEADS + g) * HEAD_DIM + d];
        o = o / red_l[g];
        const long long sh = (long long)seq * num_heads + head0 + g;
        if (max_parts == 1) {
            store_float(out + sh * HEAD_DIM + d, o);
        } else {
            tmp_out[(sh * max_parts + part) * HEAD_DIM + d] = o;
            if (d == 0) {
                max_logits[sh * max_parts + part] = red_m[g];
                exp_sums[sh * max_parts + part] = red_l[g];
            }
        }
    }
}

// Combine the partitions of one (sequence, head): grid (num_heads, num_seqs), any block size
// that is a multiple of 32; dynamic shared memory: max_parts floats.
template <typename T>
__global__ void paged_attention_reduce_kernel(T* __restrict__ out,
                                              const float* __restrict__ exp_sums,
                                              const float* __restrict__ max_logits,
                                              const float* __restrict__ tmp_out,
                                              const int* __restrict__ context_lens,
                                              const int num_heads,
                                              const int head_dim,
                                              const int partition_size,
                                              const int max_parts) {
    PAGESIM_DYNAMIC_SMEM(float, w_s);  // [max_parts]
    __shared__ float red[PAGESIM_WARP];
    const int h = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
    const long long sh = (long long)seq * num_heads + h;
    const int ctx = context_lens[seq];
    const int np = min((ctx + partition_size - 1) / partition_size, max_parts);
    if (np <= 0) {
        for (int d = tid; d < head_dim; d += blockDim.x) store_float(out + sh * head_dim + d, 0.f);
        return;
    }
    float m = PAGESIM_NEG_INF;
    for (int p = tid; p < np; p += blockDim.x) m = fmaxf(m, max_logits[sh * max_parts + p]);
    m = block_max(m, red);
    float s = 0.f;
    for (int p = tid; p < np; p += blockDim.x) {
        const float w = exp_sums[sh * max_parts + p] * __expf(max_logits[sh * max_parts + p] - m);
        w_s[p] = w;
        s += w;
    }
    s = block_sum(s, red);  // contains __syncthreads(): w_s is visible afterwards
    const float inv = 1.f / s;
    for (int d = tid; d < head_dim; d += blockDim.x) {
        float o = 0.f;
        for (int p = 0; p < np; ++p) o += w_s[p] * tmp_out[(sh * max_parts + p) * head_dim + d];
        store_float(out + sh * head_dim + d, o * inv);
    }
}
