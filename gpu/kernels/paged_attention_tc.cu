// PagedAttention decode for GQA on tensor cores: the query heads of one KV head's group are the
// rows of one mma.m16n8k16 fragment (the group padded to 16 rows with zero queries), so each K/V
// row read from memory is used for the whole group by one tensor-core instruction instead of a
// dot product per head on CUDA cores (paged_attention.cu, kept as the reference and for MHA).
//
//   out[s, h, :] = softmax(scale * q[s, h, :] . K[s, :ctx_s, h / G, :]) @ V[s, :ctx_s, h / G, :]
//
// Layouts, arguments, partitions and the reduce are those of paged_attention_kernel (the same
// launch arguments; paged_attention_reduce_kernel combines the partitions), except:
//   grid x = kv_head * chunks + chunk with chunks = ceil(G / 16) (16 query heads per block);
//   the dynamic shared memory is pa_tc_smem_bytes<HEAD_DIM, STAGES>() (gpu/paged_attention.py
//   states the same formula: tc_smem_bytes).
//
// One thread block = 4 warps, each walking its own tiles of 16 tokens (warp w: tokens
// [16 (4 i + w), 16 (4 i + w) + 16) of the partition, i = 0, 1, ...) with its own pipeline, so no
// warp waits at a block barrier for another's copies while it walks (one barrier before, one after):
//   1. pipeline: a warp tile's K and V rows go to the warp's stage i % STAGES with 16-byte cp.async
//      (tokens past the partition zero-filled), STAGES - 1 tiles ahead of the tile computed; lane l
//      copies token l % 16's vectors l / 16, l / 16 + 2, ... of K and of V (16 rows x 32 bytes an
//      instruction: whole sectors). The block-table entry each lane's token needs is loaded one
//      tile ahead of its copies into a register, so no copy waits on a global read of the table.
//   2. S = Q K^T: per k-step one ldmatrix of Q (the A fragment) and one of K (two n-tiles' B
//      fragments), two mma.
//   3. online softmax in fp32 per query row (row max over the quad of lanes holding the row,
//      rescale of the running sum and output), P = exp(S - m) kept in registers.
//   4. O += P V: P's D fragments are the A fragment (mma.cuh); P is split in two 16-bit parts
//      (P = hi + lo, two mma) so the probabilities carry ~16 bits, not fp16's 11 or bf16's 8
//      (decode is memory bound: the second mma costs no time, and the error stays the output's
//      rounding, as for the simple kernel); V's B fragments by ldmatrix.trans, two n-tiles each.
//   5. the 4 warps' (m, l, O) are combined through shared memory and written like the simple
//      kernel: out (one partition) or (max logit, exp sum, normalized partial output).
// STAGES (2 or 3) is the host's choice by the device's shared memory (tc_choose_stages): a block's
// copies in flight are (STAGES - 1) warp tiles a warp, its shared memory STAGES of them.
#include "common.cuh"
#include "mma.cuh"

#define PA_TC_THREADS 128
#define PA_TC_WARPS 4
#define PA_TC_WARP_TILE 16  // tokens a warp computes at a time: two n-tiles of S, the k of P V
#define PA_TC_ROWS 16       // query heads per block: the mma's M

template <int HEAD_DIM, int STAGES>
struct PATcGeometry {
    static_assert(HEAD_DIM % 16 == 0, "HEAD_DIM must be a multiple of 16 (the mma's K)");
    static_assert(STAGES >= 2, "a pipeline needs two stages");
    static constexpr int PITCH = HEAD_DIM + 8;  // elements a shared row: 16-byte aligned, banks skewed
    static constexpr int VECS = HEAD_DIM / 8;   // 16-byte vectors per K/V row (even: HEAD_DIM % 16 == 0)
    static constexpr int COPIES = VECS / 2;     // a lane's copies of a warp tile's K (and of its V)
    static constexpr int KSTEPS = HEAD_DIM / 16;
    static constexpr int NTILES = HEAD_DIM / 8;  // 8-wide output tiles of P V (even)
    static constexpr int WARP_STAGE = 2 * PA_TC_WARP_TILE * PITCH;  // a warp tile's K rows, then V rows
};

// Bytes of dynamic shared memory: the padded queries, then each warp's stages. The warps' final
// (m, l, O) reuse it all (4 * 16 * (HEAD_DIM + 2) floats fit in two stages of the 4 warps).
template <int HEAD_DIM, int STAGES>
__host__ __device__ constexpr int pa_tc_smem_bytes() {
    return 2 * (PA_TC_ROWS * PATcGeometry<HEAD_DIM, STAGES>::PITCH
                + PA_TC_WARPS * STAGES * PATcGeometry<HEAD_DIM, STAGES>::WARP_STAGE);
}

// p rounded to T (hi) and the rest (lo), each packed for the A fragment with its neighbour q.
template <typename T>
__device__ __forceinline__ void split_pair(float p, float q, unsigned int& hi, unsigned int& lo) {
    hi = pack2<T>(p, q);
    lo = pack2<T>(p - unpack_half<T>(hi, 0), q - unpack_half<T>(hi, 1));
}

template <typename T, int HEAD_DIM, int STAGES>
__global__ void __launch_bounds__(PA_TC_THREADS)
paged_attention_tc_kernel(T* __restrict__ out,
                          float* __restrict__ exp_sums,
                          float* __restrict__ max_logits,
                          float* __restrict__ tmp_out,
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
                          const int block_shift,
                          const int kv_seq_stride,
                          const int partition_size,
                          const int max_parts,
                          const float scale) {
    typedef PATcGeometry<HEAD_DIM, STAGES> G;
    PAGESIM_DYNAMIC_SMEM(float4, tc_smem);  // float4: 16-byte aligned for cp.async and ldmatrix
    unsigned short* q_s = reinterpret_cast<unsigned short*>(tc_smem);  // [16][PITCH]

    const int tid = threadIdx.x, warp = tid / PAGESIM_WARP, lane = tid % PAGESIM_WARP;
    const int gid = lane >> 2, tig = lane & 3;  // the fragment coordinates (mma.cuh)
    const int group = num_heads / num_kv_heads;
    const int chunks = (group + PA_TC_ROWS - 1) / PA_TC_ROWS;
    const int kvh = blockIdx.x / chunks;
    const int chunk = blockIdx.x - kvh * chunks;
    const int head0 = kvh * group + chunk * PA_TC_ROWS;
    const int nh = min(PA_TC_ROWS, group - chunk * PA_TC_ROWS);
    const int seq = blockIdx.y, part = blockIdx.z;
    const int ctx = context_lens[seq];
    const int start = part * partition_size;

    if (start >= ctx) {  // as paged_attention_kernel: zeros for an empty sequence (one partition)
        if (max_parts == 1 && part == 0) {
            for (int i = tid; i < nh * HEAD_DIM; i += PA_TC_THREADS) {
                const int g = i / HEAD_DIM, d = i - g * HEAD_DIM;
                store_float(out + ((long long)seq * num_heads + head0 + g) * HEAD_DIM + d, 0.f);
            }
        }
        return;
    }
    const int n = min(start + partition_size, ctx) - start;
    const int* bt = block_tables + (paged ? (long long)seq * max_blocks_per_seq : 0);
    unsigned short* stages = q_s + PA_TC_ROWS * G::PITCH + warp * STAGES * G::WARP_STAGE;  // this warp's

    // this warp's tiles: warp tile x = 4 i + w covers tokens [16 x, 16 x + 16) of the partition
    const int warp_tiles = (n + PA_TC_WARP_TILE - 1) / PA_TC_WARP_TILE;
    const int num_it = warp < warp_tiles ? (warp_tiles - warp + PA_TC_WARPS - 1) / PA_TC_WARPS : 0;
    const int my_tok = lane & 15, my_vec = lane >> 4;  // the token and first vector this lane copies
    const int lm_row = lane & 7, lm_mat = lane >> 3;    // the row and matrix this lane addresses (ldmatrix)

    // This lane's token in the warp's tile i (partition-relative), and the logical block of token t
    auto token_of = [&](int i) { return (PA_TC_WARPS * i + warp) * PA_TC_WARP_TILE + my_tok; };
    auto block_of = [&](int t) { return block_shift >= 0 ? (t >> block_shift) : (t / block_size); };
    // The table entry of this lane's token in the warp's tile i (unused: -1); the read is issued
    // here and its value first needed a tile later (load_tile), so no lane waits on it.
    auto entry_of = [&](int i) -> int {
        const int tok = token_of(i);
        if (!paged || i >= num_it || tok >= n) return -1;
        return __ldg(bt + block_of(start + tok));
    };
    // Issue the copies of the warp's tile i into its stage i % STAGES (``entry``: entry_of(i)).
    auto load_tile = [&](int i, int entry) {
        if (i >= num_it) return;
        unsigned short* stage = stages + (i % STAGES) * G::WARP_STAGE;
        const int tok = token_of(i);
        const bool valid = tok < n;
        long long row = 0;  // never read when !valid (src-size 0)
        if (valid) {
            const int t = start + tok;
            long long phys;
            if (paged) {
                phys = (long long)entry * block_size + (t - block_of(t) * block_size);
            } else {
                phys = (long long)seq * kv_seq_stride + t;
            }
            row = (phys * num_kv_heads + kvh) * HEAD_DIM;
        }
#pragma unroll
        for (int c = 0; c < G::COPIES; ++c) {
            const int vec = my_vec + 2 * c;
            unsigned short* dst = stage + my_tok * G::PITCH + vec * 8;
            cp_async16(dst, k_cache + row + vec * 8, valid);
            cp_async16(dst + PA_TC_WARP_TILE * G::PITCH, v_cache + row + vec * 8, valid);
        }
    };

    // queries of the chunk as 16-bit rows; rows past nh are zero (computed, never written)
    for (int i = tid; i < PA_TC_ROWS * HEAD_DIM; i += PA_TC_THREADS) {
        const int g = i / HEAD_DIM, d = i - g * HEAD_DIM;
        const T* src = q + ((long long)seq * num_heads + head0 + g) * HEAD_DIM + d;
        const unsigned short bits = g < nh ? *reinterpret_cast<const unsigned short*>(src) : 0;
        q_s[g * G::PITCH + d] = bits;
    }
    // prologue: copies of tiles 0 .. STAGES - 2 (one group each, empty groups included, so that
    // wait_group<STAGES - 2> below always means "tile i landed"), then tile STAGES - 1's entry
    {
        int entries[STAGES - 1];
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) entries[i] = entry_of(i);
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) {
            load_tile(i, entries[i]);
            cp_async_commit();
        }
    }
    int pending = entry_of(STAGES - 1);
    __syncthreads();  // the queries

    float m_run[2] = {PAGESIM_NEG_INF, PAGESIM_NEG_INF};  // rows gid, gid + 8
    float l_run[2] = {0.f, 0.f};                          // this lane's share of the row sums
    float o_acc[G::NTILES][4];
#pragma unroll
    for (int j = 0; j < G::NTILES; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[j][e] = 0.f;

    for (int it = 0; it < num_it; ++it) {
        cp_async_wait<STAGES - 2>();  // this lane's copies of tile it landed
        __syncwarp();  // every lane's did, and every lane is done with tile it - 1 (its stage is free)
        load_tile(it + STAGES - 1, pending);  // into tile it - 1's stage
        cp_async_commit();
        pending = entry_of(it + STAGES);

        const int tok0 = (PA_TC_WARPS * it + warp) * PA_TC_WARP_TILE;  // < n: the tile's first token
        const unsigned short* ks = stages + (it % STAGES) * G::WARP_STAGE;
        const unsigned short* vs = ks + PA_TC_WARP_TILE * G::PITCH;

        // ---- S = Q K^T. Q's A fragment: matrices (rows 0-7 | 8-15) x (dims 0-7 | 8-15) of the
        // k-step, in a[0..3]'s order; K's B fragments: (tokens 0-7 | 8-15) x (dims 0-7 | 8-15),
        // b[0], b[1] n-tile 0 (tokens 0-7), b[2], b[3] n-tile 1 (mma.cuh)
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < G::KSTEPS; ++kk) {
            unsigned int a[4], b[4];
            ldmatrix_x4(a, q_s + ((lm_mat & 1) * 8 + lm_row) * G::PITCH + kk * 16 + (lm_mat >> 1) * 8);
            ldmatrix_x4(b, ks + ((lm_mat >> 1) * 8 + lm_row) * G::PITCH + kk * 16 + (lm_mat & 1) * 8);
            mma_m16n8k16<T>(s[0], a, b);
            mma_m16n8k16<T>(s[1], a, b + 2);
        }
        // ---- online softmax: s[j][e] is row gid + 8 (e >> 1), token tok0 + 8 j + 2 tig + (e & 1)
        float tile_max[2] = {PAGESIM_NEG_INF, PAGESIM_NEG_INF};
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool valid = tok0 + j * 8 + 2 * tig + (e & 1) < n;
                s[j][e] = valid ? s[j][e] * scale : PAGESIM_NEG_INF;
                tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[j][e]);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // the 4 lanes of a quad hold one row
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(PAGESIM_FULL_MASK, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(PAGESIM_FULL_MASK, tile_max[r], 2));
            const float m_new = fmaxf(m_run[r], tile_max[r]);  // finite: token tok0 is valid
            alpha[r] = __expf(m_run[r] - m_new);                 // 0 on the first tile (-inf)
            m_run[r] = m_new;
            l_run[r] *= alpha[r];
        }
        unsigned int p_hi[4], p_lo[4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                p[e] = __expf(s[j][e] - m_run[e >> 1]);  // masked: exp(-inf) = 0
                l_run[e >> 1] += p[e];
            }
            // D fragments of n-tiles 0 and 1 -> A fragment (mma.cuh): rows gid / gid + 8, k = tokens
            split_pair<T>(p[0], p[1], p_hi[2 * j], p_lo[2 * j]);
            split_pair<T>(p[2], p[3], p_hi[2 * j + 1], p_lo[2 * j + 1]);
        }
        // ---- O = alpha O + P V. V's B fragments by ldmatrix.trans: (tokens 0-7 | 8-15) x (dims of
        // n-tile jn | jn + 1), b[0], b[1] for n-tile jn, b[2], b[3] for jn + 1
#pragma unroll
        for (int jn = 0; jn < G::NTILES; jn += 2) {
            unsigned int b[4];
            ldmatrix_x4_trans(b, vs + ((lm_mat & 1) * 8 + lm_row) * G::PITCH + (jn + (lm_mat >> 1)) * 8);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                o_acc[jn + h][0] *= alpha[0];
                o_acc[jn + h][1] *= alpha[0];
                o_acc[jn + h][2] *= alpha[1];
                o_acc[jn + h][3] *= alpha[1];
                mma_m16n8k16<T>(o_acc[jn + h], p_hi, b + 2 * h);
                mma_m16n8k16<T>(o_acc[jn + h], p_lo, b + 2 * h);
            }
        }
    }

    // ---- combine the 4 warps: (m, l, O) per warp and row through shared memory -----------------
    cp_async_wait<0>();  // the (empty) trailing groups: nothing may land in the stages reused below
    __syncthreads();
    float* red_o = reinterpret_cast<float*>(tc_smem);          // [WARPS][16][HEAD_DIM]
    float* red_m = red_o + PA_TC_WARPS * PA_TC_ROWS * HEAD_DIM;  // [WARPS][16]
    float* red_l = red_m + PA_TC_WARPS * PA_TC_ROWS;             // [WARPS][16]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l_run[r] += __shfl_xor_sync(PAGESIM_FULL_MASK, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(PAGESIM_FULL_MASK, l_run[r], 2);
        if (tig == 0) {
            red_m[warp * PA_TC_ROWS + gid + 8 * r] = m_run[r];
            red_l[warp * PA_TC_ROWS + gid + 8 * r] = l_run[r];
        }
    }
#pragma unroll
    for (int jn = 0; jn < G::NTILES; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            red_o[(warp * PA_TC_ROWS + gid + 8 * (e >> 1)) * HEAD_DIM + jn * 8 + 2 * tig + (e & 1)] =
                o_acc[jn][e];
    __syncthreads();
    for (int i = tid; i < nh * HEAD_DIM; i += PA_TC_THREADS) {
        const int g = i / HEAD_DIM, d = i - g * HEAD_DIM;
        float m = PAGESIM_NEG_INF;
#pragma unroll
        for (int w = 0; w < PA_TC_WARPS; ++w) m = fmaxf(m, red_m[w * PA_TC_ROWS + g]);
        float l = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < PA_TC_WARPS; ++w) {
            // a warp without tokens has m = -inf, l = 0, O = 0: weight 0
            const float wgt = __expf(red_m[w * PA_TC_ROWS + g] - m);
            l += red_l[w * PA_TC_ROWS + g] * wgt;
            o += red_o[(w * PA_TC_ROWS + g) * HEAD_DIM + d] * wgt;
        }
        o = o / l;
        const long long sh = (long long)seq * num_heads + head0 + g;
        if (max_parts == 1) {
            store_float(out + sh * HEAD_DIM + d, o);
        } else {
            tmp_out[(sh * max_parts + part) * HEAD_DIM + d] = o;
            if (d == 0) {
                max_logits[sh * max_parts + part] = m;
                exp_sums[sh * max_parts + part] = l;
            }
        }
    }
}
