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
//   the dynamic shared memory is pa_tc_smem_bytes<HEAD_DIM>() (gpu/paged_attention.py states the
//   same formula: tc_smem_bytes).
//
// One thread block = 4 warps; a partition is walked in tiles of 64 tokens, warp w owning tokens
// [16 w, 16 w + 16) of each tile:
//   1. pipeline: tile X's K and V rows go to shared memory stage X % STAGES with 16-byte cp.async
//      (tokens past the partition zero-filled), STAGES - 1 tiles ahead of the tile computed. The
//      block-table entries a tile spans are staged in shared memory once per block (one tile
//      ahead of its copies), so the 128 threads issuing a tile's copies read no global table.
//   2. S = Q K^T: per warp two 16 x 8 n-tiles (16 tokens) over HEAD_DIM / 16 k-steps of mma.
//   3. online softmax in fp32 per query row (row max over the quad of lanes holding the row,
//      rescale of the running sum and output), P = exp(S - m) kept in registers.
//   4. O += P V: P's D fragments are the A fragment (mma.cuh); P is split in two 16-bit parts
//      (P = hi + lo, two mma) so the probabilities carry ~16 bits, not fp16's 11 or bf16's 8
//      (decode is memory bound: the second mma costs no time, and the error stays the output's
//      rounding, as for the simple kernel); V's B fragment is read from shared memory.
//   5. the 4 warps' (m, l, O) are combined through shared memory and written like the simple
//      kernel: out (one partition) or (max logit, exp sum, normalized partial output).
#include "common.cuh"
#include "mma.cuh"

#define PA_TC_THREADS 128
#define PA_TC_WARPS 4
#define PA_TC_TILE 64  // tokens per tile: 16 per warp
#define PA_TC_ROWS 16  // query heads per block: the mma's M

template <int HEAD_DIM>
struct PATcGeometry {
    static_assert(HEAD_DIM % 16 == 0, "HEAD_DIM must be a multiple of 16 (the mma's K)");
    // 2 stages from head_dim 128: 74.5 KB at 128, under the 99 KB of an sm_86 / sm_89 (L4, A10, 4090)
    static constexpr int STAGES = HEAD_DIM < 128 ? 3 : 2;
    static constexpr int PITCH = HEAD_DIM + 8;  // elements a shared row: 16-byte aligned, banks skewed
    static constexpr int VECS = HEAD_DIM / 8;   // 16-byte vectors per K/V row
    static constexpr int KSTEPS = HEAD_DIM / 16;
    static constexpr int NTILES = HEAD_DIM / 8;  // 8-wide output tiles of P V
    static constexpr int STAGE_ELEMS = 2 * PA_TC_TILE * PITCH;  // K then V of one tile
    static constexpr int TABLE = PA_TC_TILE + 1;                 // block entries a tile can span
};

// Bytes of dynamic shared memory: the K/V stages, the padded queries, the staged table entries.
// The warps' final (m, l, O) reuse the stages (4 * 16 * (HEAD_DIM + 2) floats fit in two stages).
template <int HEAD_DIM>
__host__ __device__ constexpr int pa_tc_smem_bytes() {
    return 2 * (PATcGeometry<HEAD_DIM>::STAGES * PATcGeometry<HEAD_DIM>::STAGE_ELEMS
                + PA_TC_ROWS * PATcGeometry<HEAD_DIM>::PITCH)
         + 4 * PATcGeometry<HEAD_DIM>::STAGES * PATcGeometry<HEAD_DIM>::TABLE;
}

// The 32-bit word of two adjacent 16-bit elements (the lower index in the low half).
__device__ __forceinline__ unsigned int ld_pair(const unsigned short* p) {
    return *reinterpret_cast<const unsigned int*>(p);
}
// Two elements of different rows packed in one word: lo in the low half.
__device__ __forceinline__ unsigned int pair_of(unsigned short lo, unsigned short hi) {
    return (unsigned int)lo | ((unsigned int)hi << 16);
}
// p rounded to T (hi) and the rest (lo), each packed for the A fragment with its neighbour q.
template <typename T>
__device__ __forceinline__ void split_pair(float p, float q, unsigned int& hi, unsigned int& lo) {
    hi = pack2<T>(p, q);
    lo = pack2<T>(p - unpack_half<T>(hi, 0), q - unpack_half<T>(hi, 1));
}

template <typename T, int HEAD_DIM>
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
    typedef PATcGeometry<HEAD_DIM> G;
    PAGESIM_DYNAMIC_SMEM(float4, tc_smem);  // float4: 16-byte aligned for cp.async
    unsigned short* kv_s = reinterpret_cast<unsigned short*>(tc_smem);  // [STAGES][K, V][TILE][PITCH]
    unsigned short* q_s = kv_s + G::STAGES * G::STAGE_ELEMS;            // [16][PITCH]
    int* table_s = reinterpret_cast<int*>(q_s + PA_TC_ROWS * G::PITCH);  // [STAGES][TABLE]

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
    const int num_tiles = (n + PA_TC_TILE - 1) / PA_TC_TILE;
    const int* bt = block_tables + (paged ? (long long)seq * max_blocks_per_seq : 0);

    // The first logical block tile X spans; its entries are table_s[X % STAGES][0 ...].
    auto first_block = [&](int x) {
        const int t = start + x * PA_TC_TILE;
        return block_shift >= 0 ? (t >> block_shift) : (t / block_size);
    };
    // Stage the entries of tile x (only the used ones: tokens < n, as the simple kernel reads).
    auto stage_table = [&](int x) {
        if (!paged || x >= num_tiles) return;
        const int last_tok = start + min((x + 1) * PA_TC_TILE, n) - 1;
        const int last = block_shift >= 0 ? (last_tok >> block_shift) : (last_tok / block_size);
        const int b0 = first_block(x);
        for (int i = tid; i <= last - b0; i += PA_TC_THREADS)
            table_s[(x % G::STAGES) * G::TABLE + i] = __ldg(bt + b0 + i);
    };
    // Issue tile x's K/V copies into stage x % STAGES (its table entries staged and visible).
    auto load_tile = [&](int x) {
        if (x >= num_tiles) return;
        unsigned short* stage = kv_s + (x % G::STAGES) * G::STAGE_ELEMS;
        const int* tab = table_s + (x % G::STAGES) * G::TABLE;
        const int b0 = paged ? first_block(x) : 0;
        for (int i = tid; i < 2 * PA_TC_TILE * G::VECS; i += PA_TC_THREADS) {
            const int which = i / (PA_TC_TILE * G::VECS);  // 0: K, 1: V
            const int r = (i / G::VECS) % PA_TC_TILE, c = i % G::VECS;
            const int tok = x * PA_TC_TILE + r;  // partition-relative
            const bool valid = tok < n;
            const T* cache = which ? v_cache : k_cache;
            const T* src = cache;  // never read when !valid (src-size 0)
            if (valid) {
                const int t = start + tok;
                long long phys;
                if (paged) {
                    const int b = block_shift >= 0 ? (t >> block_shift) : (t / block_size);
                    phys = (long long)tab[b - b0] * block_size + (t - b * block_size);
                } else {
                    phys = (long long)seq * kv_seq_stride + t;
                }
                src = cache + (phys * num_kv_heads + kvh) * HEAD_DIM + c * 8;
            }
            cp_async16(stage + (which * PA_TC_TILE + r) * G::PITCH + c * 8, src, valid);
        }
    };

    // queries of the chunk as 16-bit rows; rows past nh are zero (computed, never written)
    for (int i = tid; i < PA_TC_ROWS * HEAD_DIM; i += PA_TC_THREADS) {
        const int g = i / HEAD_DIM, d = i - g * HEAD_DIM;
        const T* src = q + ((long long)seq * num_heads + head0 + g) * HEAD_DIM + d;
        const unsigned short bits = g < nh ? *reinterpret_cast<const unsigned short*>(src) : 0;
        q_s[g * G::PITCH + d] = bits;
    }
    // prologue: tables of tiles 0 .. STAGES - 1, copies of tiles 0 .. STAGES - 2 (one group each,
    // empty groups included, so that wait_group<STAGES - 2> below always means "tile it landed")
    for (int x = 0; x < G::STAGES; ++x) stage_table(x);
    __syncthreads();
    for (int x = 0; x < G::STAGES - 1; ++x) {
        load_tile(x);
        cp_async_commit();
    }

    float m_run[2] = {PAGESIM_NEG_INF, PAGESIM_NEG_INF};  // rows gid, gid + 8
    float l_run[2] = {0.f, 0.f};                          // this lane's share of the row sums
    float o_acc[G::NTILES][4];
#pragma unroll
    for (int j = 0; j < G::NTILES; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[j][e] = 0.f;

    for (int it = 0; it < num_tiles; ++it) {
        cp_async_wait<G::STAGES - 2>();  // this thread's copies of tile it landed
        __syncthreads();  // everyone's did, every warp is done with tile it - 1 (its stage is free)
        load_tile(it + G::STAGES - 1);  // into tile it - 1's stage; its table was staged before
        cp_async_commit();
        stage_table(it + G::STAGES);  // into tile it's table slot: its copies were issued already

        const int tok0 = it * PA_TC_TILE + warp * 16;  // the warp's first token (partition-relative)
        if (tok0 >= n) continue;  // warp-uniform: no token of this warp in the tile
        const unsigned short* ks = kv_s + (it % G::STAGES) * G::STAGE_ELEMS + warp * 16 * G::PITCH;
        const unsigned short* vs = ks + PA_TC_TILE * G::PITCH;

        // ---- S = Q K^T: B[k][n] = K[token n][dim k] -> two adjacent dims of one K row per register
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < G::KSTEPS; ++kk) {
            unsigned int a[4];
            const unsigned short* qa = q_s + gid * G::PITCH + kk * 16 + 2 * tig;
            a[0] = ld_pair(qa);
            a[1] = ld_pair(qa + 8 * G::PITCH);
            a[2] = ld_pair(qa + 8);
            a[3] = ld_pair(qa + 8 * G::PITCH + 8);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const unsigned short* kb = ks + (j * 8 + gid) * G::PITCH + kk * 16 + 2 * tig;
                unsigned int b[2] = {ld_pair(kb), ld_pair(kb + 8)};
                mma_m16n8k16<T>(s[j], a, b);
            }
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
        // ---- O = alpha O + P V: B[k][n] = V[token k][dim n], two rows of one column per register
#pragma unroll
        for (int jn = 0; jn < G::NTILES; ++jn) {
            o_acc[jn][0] *= alpha[0];
            o_acc[jn][1] *= alpha[0];
            o_acc[jn][2] *= alpha[1];
            o_acc[jn][3] *= alpha[1];
            const unsigned short* vb = vs + (2 * tig) * G::PITCH + jn * 8 + gid;
            unsigned int b[2] = {pair_of(vb[0], vb[G::PITCH]),
                                 pair_of(vb[8 * G::PITCH], vb[9 * G::PITCH])};
            mma_m16n8k16<T>(o_acc[jn], p_hi, b);
            mma_m16n8k16<T>(o_acc[jn], p_lo, b);
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
