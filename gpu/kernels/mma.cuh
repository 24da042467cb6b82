// Tensor-core and asynchronous-copy primitives, one small device function per PTX instruction.
//
// On CUDA each body is one inline-PTX `asm volatile`. The CPU emulation (tests/gpu/emu/emu.h)
// defines PAGESIM_EMULATED_PTX and its own versions of these functions, so the kernels that call
// them run unchanged in the emulator. Needs sm_80 or newer (mma.m16n8k16 with .bf16, cp.async).
#pragma once

#include "common.cuh"

// ---- fragments of mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 -------------
// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (the warp-level matrix
// instructions' mma section; the same layout as CUTLASS's SM80_16x8x16 traits). With groupID = lane >> 2 and tig = lane % 4 (thread in group):
//   A (16 x 16, row-major), 4 .b32 registers of two 16-bit values each (lower index in the low half):
//     a[0] = A[groupID    ][2 tig, 2 tig + 1]      a[1] = A[groupID + 8][2 tig, 2 tig + 1]
//     a[2] = A[groupID    ][2 tig + 8, + 9]        a[3] = A[groupID + 8][2 tig + 8, + 9]
//   B (16 x 8, "col": element (k, n)), 2 .b32 registers:
//     b[0] = B[2 tig, 2 tig + 1][groupID]          b[1] = B[2 tig + 8, 2 tig + 9][groupID]
//   C, D (16 x 8, fp32), 4 registers:
//     c[0], c[1] = C[groupID][2 tig, 2 tig + 1]    c[2], c[3] = C[groupID + 8][2 tig, 2 tig + 1]
// So the D fragments of two adjacent n-tiles (columns 0-7 and 8-15) are, packed in pairs, exactly
// the A fragment of a 16 x 16 matrix: d0[0,1] -> a[0], d0[2,3] -> a[1], d1[0,1] -> a[2],
// d1[2,3] -> a[3] (how the kernel feeds the softmax probabilities P into P V without shared memory).

// Two floats -> one .b32 register of two 16-bit values, `lo` in the low half (round to nearest even).
template <typename T> __device__ __forceinline__ unsigned int pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned int pack2<fp16_t>(float lo, float hi) {
    fp16_t a, b;
    store_float(&a, lo);
    store_float(&b, hi);
    return (unsigned int)*reinterpret_cast<unsigned short*>(&a)
         | ((unsigned int)*reinterpret_cast<unsigned short*>(&b) << 16);
}
template <> __device__ __forceinline__ unsigned int pack2<bf16_t>(float lo, float hi) {
    bf16_t a, b;
    store_float(&a, lo);
    store_float(&b, hi);
    return (unsigned int)*reinterpret_cast<unsigned short*>(&a)
         | ((unsigned int)*reinterpret_cast<unsigned short*>(&b) << 16);
}
// The low (`half` = 0) or high 16-bit value of a packed register, as a float.
template <typename T> __device__ __forceinline__ float unpack_half(unsigned int r, int half) {
    const unsigned short bits = (unsigned short)(half ? (r >> 16) : (r & 0xffffu));
    return to_float(*reinterpret_cast<const T*>(&bits));
}

#ifndef PAGESIM_EMULATED_PTX
// d += A B for one warp (every lane must call it, converged: .aligned).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float* d, const unsigned int* a, const unsigned int* b);

template <>
__device__ __forceinline__ void mma_m16n8k16<fp16_t>(float* d, const unsigned int* a,
                                                     const unsigned int* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_m16n8k16<bf16_t>(float* d, const unsigned int* a,
                                                     const unsigned int* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, warp-level matrix load) -------
// Four 8 x 8 matrices of 16-bit elements from shared memory, one row (16 bytes, 16-byte aligned)
// addressed by each lane: lanes 8 q .. 8 q + 7 give rows 0-7 of matrix q. Lane l receives in r[q]
// matrix q's elements (row l / 4; columns 2 (l % 4), 2 (l % 4) + 1), or with .trans its elements
// (rows 2 (l % 4), 2 (l % 4) + 1; column l / 4), the lower index in the low half: exactly an mma
// A or B fragment register (above) for a matrix stored row by row, or transposed.
__device__ __forceinline__ void ldmatrix_x4(unsigned int* r, const void* row) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int* r, const void* row) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// ---- cp.async (PTX ISA, data movement: cp.async): 16 bytes global -> shared, bypassing L1 (.cg)
// `valid` false: no global read, the 16 shared bytes are zero-filled (src-size 0).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, bool valid) {
    const unsigned int dst = (unsigned int)__cvta_generic_to_shared(smem_dst);
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
                 : "memory");
}
// Close the group of this thread's cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N of this thread's committed groups are still in flight (the newest ones).
// Other threads' copies are visible only after a __syncthreads() that follows.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif
