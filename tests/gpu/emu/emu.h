// CPU emulation of the small CUDA subset the pagesim kernels use, so the *real* kernel source
// runs on a machine without a GPU (tests/gpu/test_emulated_kernels.py). One fiber (a ucontext
// with its own stack) per CUDA thread, all on the caller's OS thread and switched round-robin at
// each barrier, thread blocks one after another; __syncthreads is a block barrier and the warp
// shuffles exchange through a buffer between two warp barriers (every lane of a warp must reach
// them, which is also what CUDA requires of __shfl_xor_sync with a full mask). Fibers, not OS
// threads: a barrier is a switch in user space, so a launch costs the same on a loaded machine
// (256 OS threads meeting at futex barriers took 6x longer on 2 cores busy with the suite), and
// the order the threads run in is the same every run.
// Not a performance model; only semantics: indexing, synchronization, reductions, partitions.
// The PTX wrappers of gpu/kernels/mma.cuh are replaced here (PAGESIM_EMULATED_PTX): mma.sync as a
// warp-collective exchange of the 32 lanes' fragment registers (decoded exactly as the PTX ISA
// lays them out), cp.async as a copy deferred to the wait_group that must cover it.
#pragma once
#define PAGESIM_EMULATED_PTX
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __shared__
#define __shared__ static  // blocks run sequentially: one instance per kernel is per-block memory
#define PAGESIM_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(emu_dynamic_smem)

inline unsigned char* emu_dynamic_smem = nullptr;
inline uint3 threadIdx;  // the running fiber's: set by the scheduler before it switches to one
inline uint3 blockIdx;  // written by thread 0 between two block barriers
inline dim3 blockDim;
inline dim3 gridDim;

// ---- fibers: one per CUDA thread, run on one OS thread, switched at barriers --------------------
struct EmuCopy {
    void* dst;
    const void* src;
    bool valid;
};
struct EmuFiber {
    ucontext_t context;
    std::unique_ptr<char[]> stack;
    bool done = false;
    std::vector<EmuCopy> open_group;  // cp.async copies issued since the last commit
    std::deque<std::vector<EmuCopy>> committed;  // committed groups, oldest first
};
inline std::vector<EmuFiber>* emu_fibers = nullptr;
inline int emu_current = 0;
inline ucontext_t emu_scheduler;
inline const std::function<void(int)>* emu_fiber_body = nullptr;
inline constexpr size_t EMU_STACK_BYTES = 256 * 1024;

inline void emu_yield() { swapcontext(&(*emu_fibers)[emu_current].context, &emu_scheduler); }
inline void emu_fiber_entry() {
    (*emu_fiber_body)(emu_current);
    (*emu_fibers)[emu_current].done = true;  // uc_link returns to the scheduler
}

// Every one of `count` fibers must arrive before any leaves; the last to arrive goes on at once.
struct EmuBarrier {
    int count;
    int arrived = 0;
    unsigned phase = 0;
    explicit EmuBarrier(int n) : count(n) {}
    void arrive_and_wait() {
        const unsigned mine = phase;
        if (++arrived == count) {
            arrived = 0;
            ++phase;
            return;
        }
        while (phase == mine) emu_yield();
    }
};

struct EmuBlock {
    EmuBarrier block;
    std::vector<std::unique_ptr<EmuBarrier>> warps;
    std::vector<float> shfl;
    std::vector<unsigned int> frag_a, frag_b;  // each lane's mma fragments: 4 and 2 registers
    std::vector<const unsigned short*> rows;    // each lane's ldmatrix row
    explicit EmuBlock(int threads)
        : block(threads), shfl(threads), frag_a(4 * threads), frag_b(2 * threads), rows(threads) {
        for (int w = 0; w < threads / 32; ++w) warps.emplace_back(new EmuBarrier(32));
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

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: the layouts of gpu/kernels/mma.cuh --------
template <typename T> inline float emu_half_bits_to_float(unsigned short bits) {
    if constexpr (std::is_same_v<T, __half>) {
        __half_raw r;
        r.x = bits;
        return __half2float(__half(r));
    } else {
        unsigned int u = (unsigned int)bits << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
}
template <typename T> inline float emu_elem(unsigned int reg, int k) {  // k & 1: the high half
    return emu_half_bits_to_float<T>((unsigned short)((k & 1) ? reg >> 16 : reg & 0xffffu));
}
// A[r][k] of the warp's 16 x 16 A operand, from the lane and register the PTX ISA puts it in
template <typename T> inline float emu_a(const unsigned int* a, int r, int k) {
    const int lane = (r % 8) * 4 + (k % 8) / 2, reg = (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return emu_elem<T>(a[4 * lane + reg], k);
}
// B[k][n] of the 16 x 8 B operand
template <typename T> inline float emu_b(const unsigned int* b, int k, int n) {
    const int lane = n * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
    return emu_elem<T>(b[2 * lane + reg], k);
}
template <typename T>
inline void mma_m16n8k16(float* d, const unsigned int* a, const unsigned int* b) {
    const int t = threadIdx.x, lane = t % 32, w = t / 32;
    unsigned int* fa = emu_block->frag_a.data() + 4 * 32 * w;
    unsigned int* fb = emu_block->frag_b.data() + 2 * 32 * w;
    for (int i = 0; i < 4; ++i) fa[4 * lane + i] = a[i];
    for (int i = 0; i < 2; ++i) fb[2 * lane + i] = b[i];
    emu_block->warps[w]->arrive_and_wait();  // every lane's fragments are in
    const int gid = lane >> 2, tig = lane & 3;
    for (int e = 0; e < 4; ++e) {  // d[e] = D[gid + 8 (e >> 1)][2 tig + (e & 1)], fp32 products and sums
        const int r = gid + 8 * (e >> 1), n = 2 * tig + (e & 1);
        float acc = 0.f;
        for (int k = 0; k < 16; ++k) acc += emu_a<T>(fa, r, k) * emu_b<T>(fb, k, n);
        d[e] += acc;
    }
    emu_block->warps[w]->arrive_and_wait();  // nobody overwrites the fragments before all read them
}

// ---- ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: each lane's row address through a buffer;
// lane l gets matrix q's (row l / 4; columns 2 (l % 4), + 1), or transposed (rows 2 (l % 4), + 1;
// column l / 4), the lower index in the low half (gpu/kernels/mma.cuh)
// An address the hardware would fault on (ldmatrix's rows, cp.async's 16 bytes: 16-byte aligned)
// stops the emulation, naming it, rather than reading past it.
inline void emu_aligned16(const void* p, const char* what) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16) {
        std::fprintf(stderr, "emulation: %s at %p is not 16-byte aligned\n", what, p);
        std::abort();
    }
}
inline void emu_ldmatrix_x4(unsigned int* r, const void* row, bool trans) {
    emu_aligned16(row, "an ldmatrix row");
    const int t = threadIdx.x, lane = t % 32, w = t / 32;
    const unsigned short** rows = emu_block->rows.data() + 32 * w;
    rows[lane] = static_cast<const unsigned short*>(row);
    emu_block->warps[w]->arrive_and_wait();  // every lane's row is in
    for (int q = 0; q < 4; ++q) {
        const unsigned short* m[8];
        for (int i = 0; i < 8; ++i) m[i] = rows[8 * q + i];
        const int a = lane / 4, b = 2 * (lane % 4);
        const unsigned short lo = trans ? m[b][a] : m[a][b], hi = trans ? m[b + 1][a] : m[a][b + 1];
        r[q] = (unsigned int)lo | ((unsigned int)hi << 16);
    }
    emu_block->warps[w]->arrive_and_wait();  // nobody overwrites the rows before all read them
}
inline void ldmatrix_x4(unsigned int* r, const void* row) { emu_ldmatrix_x4(r, row, false); }
inline void ldmatrix_x4_trans(unsigned int* r, const void* row) { emu_ldmatrix_x4(r, row, true); }
// __syncwarp: the warp's barrier (lanes' shared-memory writes before it are seen after it)
inline void __syncwarp(unsigned = 0xffffffffu) {
    emu_block->warps[threadIdx.x / 32]->arrive_and_wait();
}

// ---- cp.async: a copy deferred to the cp.async.wait_group that covers it (the latest moment the
// hardware may complete it), so a read of shared memory without the wait sees the old bytes.
inline EmuFiber& emu_me() { return (*emu_fibers)[emu_current]; }
inline void emu_async_reset() {  // a new block: copies a previous block left in flight are dropped
    emu_me().open_group.clear();
    emu_me().committed.clear();
}
inline void cp_async16(void* smem_dst, const void* gmem_src, bool valid) {
    emu_aligned16(smem_dst, "a cp.async destination");
    if (valid) emu_aligned16(gmem_src, "a cp.async source");
    emu_me().open_group.push_back({smem_dst, gmem_src, valid});
}
inline void cp_async_commit() {
    emu_me().committed.push_back(std::move(emu_me().open_group));
    emu_me().open_group.clear();
}
template <int N> inline void cp_async_wait() {
    auto& committed = emu_me().committed;
    while ((int)committed.size() > N) {
        for (const EmuCopy& c : committed.front()) {
            if (c.valid) std::memcpy(c.dst, c.src, 16);
            else std::memset(c.dst, 0, 16);
        }
        committed.pop_front();
    }
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
// The same `threads` fibers run every block in turn; a block barrier separates blocks so
// (static) shared memory is never used by two blocks at once. Shared memory starts as NaNs.
template <typename F>
void emu_launch(dim3 grid, int threads, size_t smem, F&& body) {
    std::vector<float4> dyn(smem / sizeof(float4) + 1);  // 16-byte aligned
    emu_dynamic_smem = reinterpret_cast<unsigned char*>(dyn.data());
    gridDim = grid;
    blockDim = dim3(threads, 1, 1);
    EmuBlock blk(threads);
    emu_block = &blk;
    const std::function<void(int)> run = [&body, &dyn, grid](int t) {
        for (unsigned z = 0; z < grid.z; ++z)
            for (unsigned y = 0; y < grid.y; ++y)
                for (unsigned x = 0; x < grid.x; ++x) {
                    if (t == 0) {
                        blockIdx.x = x; blockIdx.y = y; blockIdx.z = z;
                        std::memset(dyn.data(), 0xFF, dyn.size() * sizeof(float4));
                    }
                    emu_block->block.arrive_and_wait();  // block (x, y, z) starts
                    emu_async_reset();
                    body();
                    emu_block->block.arrive_and_wait();  // every thread left the block
                }
    };
    std::vector<EmuFiber> fibers(threads);
    emu_fibers = &fibers;
    emu_fiber_body = &run;
    for (auto& f : fibers) {
        f.stack.reset(new char[EMU_STACK_BYTES]);
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack.get();
        f.context.uc_stack.ss_size = EMU_STACK_BYTES;
        f.context.uc_link = &emu_scheduler;
        makecontext(&f.context, emu_fiber_entry, 0);
    }
    for (int left = threads; left > 0;) {  // round-robin until every fiber has returned
        left = 0;
        for (int t = 0; t < threads; ++t) {
            if (fibers[t].done) continue;
            emu_current = t;
            threadIdx.x = t; threadIdx.y = 0; threadIdx.z = 0;
            swapcontext(&emu_scheduler, &fibers[t].context);
            left += fibers[t].done ? 0 : 1;
        }
    }
    emu_fibers = nullptr;
}
