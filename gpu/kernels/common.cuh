// pagesim GPU kernels: shared helpers (dtype conversion, 16-byte vector loads, reductions).
//
// Compiles with nvcc and with NVRTC (CuPy RawModule). Only <cuda_fp16.h> / <cuda_bf16.h> are
// included, no C/C++ standard headers (NVRTC may not provide them). If <cuda_bf16.h> cannot be
// found by NVRTC, the loader retries with -DPAGESIM_NO_CUDA_BF16 and a storage-only bf16 type.
#pragma once

#include <cuda_fp16.h>
#ifndef PAGESIM_NO_CUDA_BF16
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16_t;
#else
struct __align__(2) pagesim_bf16_storage { unsigned short bits; };
typedef pagesim_bf16_storage bf16_t;
#endif
typedef __half fp16_t;

// Dynamic shared memory declaration (overridable by the CPU emulation used in the tests).
#ifndef PAGESIM_DYNAMIC_SMEM
#define PAGESIM_DYNAMIC_SMEM(type, name) extern __shared__ type name[]
#endif

#define PAGESIM_WARP 32
#define PAGESIM_FULL_MASK 0xffffffffu
#define PAGESIM_NEG_INF __int_as_float(0xff800000)  // no <math.h> under NVRTC

// ---- scalar conversions (fp32 accumulation everywhere) ----------------------------------
__device__ __forceinline__ float to_float(fp16_t x) { return __half2float(x); }
__device__ __forceinline__ float to_float(bf16_t x) {
    unsigned short b = *reinterpret_cast<const unsigned short*>(&x);
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ void store_float(fp16_t* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void store_float(bf16_t* p, float x) {
    // round to nearest even; NaN stays NaN (bit-exact with torch/numpy reference rounding)
    unsigned int u = __float_as_uint(x);
    unsigned short b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b = 0x7fc0;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        b = (unsigned short)(u >> 16);
    }
    *reinterpret_cast<unsigned short*>(p) = b;
}

// ---- 16-byte vectors: 8 x 2-byte elements -> 8 floats -----------------------------------
template <typename T> __device__ __forceinline__ void cvt8(const uint4& v, float* f);

template <> __device__ __forceinline__ void cvt8<fp16_t>(const uint4& v, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 t = __half22float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

template <> __device__ __forceinline__ void cvt8<bf16_t>(const uint4& v, float* f) {
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// ---- reductions -------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int m = PAGESIM_WARP / 2; m >= 1; m >>= 1) x += __shfl_xor_sync(PAGESIM_FULL_MASK, x, m);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int m = PAGESIM_WARP / 2; m >= 1; m >>= 1) x = fmaxf(x, __shfl_xor_sync(PAGESIM_FULL_MASK, x, m));
    return x;
}
// Block-wide reductions; every thread of the block must call them; result in every thread.
// `buf` holds >= 32 floats of shared memory; reusable after the call returns.
__device__ __forceinline__ float block_sum(float x, float* buf) {
    const int lane = threadIdx.x % PAGESIM_WARP, warp = threadIdx.x / PAGESIM_WARP;
    const int nwarps = (blockDim.x + PAGESIM_WARP - 1) / PAGESIM_WARP;
    x = warp_sum(x);
    __syncthreads();
    if (lane == 0) buf[warp] = x;
    __syncthreads();
    x = lane < nwarps ? buf[lane] : 0.f;
    return warp_sum(x);
}
__device__ __forceinline__ float block_max(float x, float* buf) {
    const int lane = threadIdx.x % PAGESIM_WARP, warp = threadIdx.x / PAGESIM_WARP;
    const int nwarps = (blockDim.x + PAGESIM_WARP - 1) / PAGESIM_WARP;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) buf[warp] = x;
    __syncthreads();
    x = lane < nwarps ? buf[lane] : PAGESIM_NEG_INF;
    return warp_max(x);
}
