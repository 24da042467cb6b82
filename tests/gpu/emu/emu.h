// CPU emulation of the small CUDA subset the pagesim kernels use, so the *real* kernel source
// runs on a machine without a GPU (tests/gpu/test_emulated_kernels.py). One std::thread per
// CUDA thread, thread blocks run one after another; __syncthreads is a block barrier and the
// warp shuffles exchange through a buffer between two warp barriers (every lane of a warp must
// reach them, which is also what CUDA requires of __shfl_xor_sync with a full mask).
// Not a performance model; only semantics: indexing, synchronization, reductions, partitions.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __shared__
#define __shared__ static  // blocks run sequentially: one instance per kernel is per-block memory
#define PAGESIM_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(emu_dynamic_smem)

inline unsigned char* emu_dynamic_smem = nullptr;
inline thread_local uint3 threadIdx;
inline uint3 blockIdx;  // written by thread 0 between two block barriers
inline dim3 blockDim;
inline dim3 gridDim;

struct EmuBlock {
    std::barrier<> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<float> shfl;
    explicit EmuBlock(int threads) : block(threads), shfl(threads) {
        for (int w = 0; w < threads / 32; ++w) warps.emplace_back(new std::barrier<>(32));
    }
};
inline EmuBlock* emu_block = nullptr;

inline void __syncthreads() { emu_block->block.arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int m) {
    const int t = threadIdx.x, lane = t % 32, w = t / 32;
    emu_block->shfl[t] = v;
    emu_block->warps[w]->arrive_and_wait();
    const float r = emu_block->shfl[w * 32 + (lane ^ m)];
    emu_block->warps[w]->arrive_and_wait();
    return r;
}
template <typename T> inline T __ldg(const T* p) { return *p; }
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float expf_emu(float x) { return std::exp(x); }
#define expf expf_emu
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
using std::fmaxf;
using std::min;

// Launch: grid of blocks, `threads` threads each, `smem` bytes of dynamic shared memory.
// The same `threads` OS threads run every block in turn; a block barrier separates blocks so
// (static) shared memory is never used by two blocks at once. Shared memory starts as NaNs.
template <typename F>
void emu_launch(dim3 grid, int threads, size_t smem, F&& body) {
    std::vector<float4> dyn(smem / sizeof(float4) + 1);  // 16-byte aligned
    emu_dynamic_smem = reinterpret_cast<unsigned char*>(dyn.data());
    gridDim = grid;
    blockDim = dim3(threads, 1, 1);
    EmuBlock blk(threads);
    emu_block = &blk;
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([t, &body, &dyn, grid] {
            threadIdx.x = t; threadIdx.y = 0; threadIdx.z = 0;
            for (unsigned z = 0; z < grid.z; ++z)
                for (unsigned y = 0; y < grid.y; ++y)
                    for (unsigned x = 0; x < grid.x; ++x) {
                        if (t == 0) {
                            blockIdx.x = x; blockIdx.y = y; blockIdx.z = z;
                            std::memset(dyn.data(), 0xFF, dyn.size() * sizeof(float4));
                        }
                        emu_block->block.arrive_and_wait();  // block (x, y, z) starts
                        body();
                        emu_block->block.arrive_and_wait();  // every thread left the block
                    }
        });
    for (auto& th : ts) th.join();
}
