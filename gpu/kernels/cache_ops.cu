// KV-cache companion kernels: reshape_and_cache (scatter new K/V rows into their slots) and
// copy_blocks (copy-on-write block copies). Element-type agnostic: rows are moved in units U
// (uint4 = 16 bytes when the row size allows it, else unsigned short = one 2-byte element).
#include "common.cuh"

// key/value: [num_tokens, row_units] with row stride key_stride / value_stride (units);
// caches: [num_blocks * block_size, row_units] (= [num_blocks, block_size, num_kv_heads, head_dim]).
// slot = block * block_size + offset; negative slots are skipped (padding tokens).
// grid: num_tokens blocks.
template <typename U, typename IDX>
__global__ void reshape_and_cache_kernel(const U* __restrict__ key,
                                         const U* __restrict__ value,
                                         U* __restrict__ key_cache,
                                         U* __restrict__ value_cache,
                                         const IDX* __restrict__ slot_mapping,
                                         const long long row_units,
                                         const long long key_stride,
                                         const long long value_stride) {
    const long long token = blockIdx.x;
    const long long slot = (long long)slot_mapping[token];
    if (slot < 0) return;
    const U* k = key + token * key_stride;
    const U* v = value + token * value_stride;
    U* kc = key_cache + slot * row_units;
    U* vc = value_cache + slot * row_units;
    for (long long i = threadIdx.x; i < row_units; i += blockDim.x) {
        kc[i] = k[i];
        vc[i] = v[i];
    }
}

// mapping: [num_pairs, 2] int64 (src block, dst block); destinations must be distinct and
// never a source of the same call (checked on the host). grid: num_pairs blocks.
template <typename U>
__global__ void copy_blocks_kernel(U* __restrict__ key_cache,
                                   U* __restrict__ value_cache,
                                   const long long* __restrict__ mapping,
                                   const long long block_units) {
    const long long src = mapping[2 * (long long)blockIdx.x];
    const long long dst = mapping[2 * (long long)blockIdx.x + 1];
    const U* ks = key_cache + src * block_units;
    const U* vs = value_cache + src * block_units;
    U* kd = key_cache + dst * block_units;
    U* vd = value_cache + dst * block_units;
    for (long long i = threadIdx.x; i < block_units; i += blockDim.x) {
        kd[i] = ks[i];
        vd[i] = vs[i];
    }
}
