// The real kernels compiled for the CPU emulation (see emu.h), behind a C ABI for ctypes.
// Launch geometry (grid, threads, dynamic shared memory) is given by the caller, exactly as the
// Python side would launch them on a GPU. Returns 1 for an instantiation not compiled here.
#include "emu.h"
#include "paged_attention.cu"
#include "paged_attention_tc.cu"
#include "cache_ops.cu"
#include "fused_ops.cu"

template <typename T, int D, int H>
static void attn(int gx, int gy, int gz, int smem, void* out, float* es, float* ml, float* tmp, const void* q,
                 const void* k, const void* v, const int* bt, const int* cl, int paged, int nh, int nkvh, int mb,
                 int bs, int shift, int stride, int P, int maxp, float scale) {
    emu_launch(dim3(gx, gy, gz), PA_NUM_THREADS, smem, [&] {
        paged_attention_kernel<T, D, H>((T*)out, es, ml, tmp, (const T*)q, (const T*)k, (const T*)v, bt, cl, paged,
                                        nh, nkvh, mb, bs, shift, stride, P, maxp, scale);
    });
}

#define PAGESIM_EMU_CASE(T, TI, D, H) \
    if (dtype == TI && head_dim == D && heads == H) { \
        attn<T, D, H>(gx, gy, gz, smem, out, es, ml, tmp, q, k, v, bt, cl, paged, nh, nkvh, mb, bs, shift, stride, \
                      P, maxp, scale); \
        return 0; }

// dtype: 0 = fp16, 1 = bf16
extern "C" int emu_attention_main(int dtype, int head_dim, int heads, int gx, int gy, int gz, int threads, int smem,
                                  void* out, float* es, float* ml, float* tmp, const void* q, const void* k,
                                  const void* v, const int* bt, const int* cl, int paged, int nh, int nkvh, int mb,
                                  int bs, int shift, int stride, int P, int maxp, float scale) {
    if (threads != PA_NUM_THREADS) return 2;
    // every instantiation the Python side can launch (gpu.kernels_src.all_instantiations)
#define PAGESIM_EMU_HEADS(T, TI, D) \
    PAGESIM_EMU_CASE(T, TI, D, 1) PAGESIM_EMU_CASE(T, TI, D, 2) PAGESIM_EMU_CASE(T, TI, D, 4) \
    PAGESIM_EMU_CASE(T, TI, D, 8)
#define PAGESIM_EMU_DIMS(T, TI) \
    PAGESIM_EMU_HEADS(T, TI, 64) PAGESIM_EMU_HEADS(T, TI, 80) PAGESIM_EMU_HEADS(T, TI, 96) \
    PAGESIM_EMU_HEADS(T, TI, 128) PAGESIM_EMU_HEADS(T, TI, 256)
#ifdef PAGESIM_EMU_FP16_64_ONLY  // a quick build for injected-bug tests (test_emulated_kernels.py)
    PAGESIM_EMU_HEADS(fp16_t, 0, 64)
#else
    PAGESIM_EMU_DIMS(fp16_t, 0)
    PAGESIM_EMU_DIMS(bf16_t, 1)
#endif
    return 1;
}

template <typename T, int D, int S>
static int attn_tc(int gx, int gy, int gz, int smem, void* out, float* es, float* ml, float* tmp, const void* q,
                   const void* k, const void* v, const int* bt, const int* cl, int paged, int nh, int nkvh, int mb,
                   int bs, int shift, int stride, int P, int maxp, float scale) {
    if (smem < pa_tc_smem_bytes<D, S>()) return 3;  // the launch's shared memory is short of the kernel's
    emu_launch(dim3(gx, gy, gz), PA_TC_THREADS, smem, [&] {
        paged_attention_tc_kernel<T, D, S>((T*)out, es, ml, tmp, (const T*)q, (const T*)k, (const T*)v, bt, cl,
                                           paged, nh, nkvh, mb, bs, shift, stride, P, maxp, scale);
    });
    return 0;
}

// The tensor-core kernel (paged_attention_tc.cu), same arguments as emu_attention_main but no heads,
// and its pipeline's stages.
extern "C" int emu_attention_tc(int dtype, int head_dim, int stages, int gx, int gy, int gz, int threads, int smem,
                                void* out, float* es, float* ml, float* tmp, const void* q, const void* k,
                                const void* v, const int* bt, const int* cl, int paged, int nh, int nkvh, int mb,
                                int bs, int shift, int stride, int P, int maxp, float scale) {
    if (threads != PA_TC_THREADS) return 2;
#define PAGESIM_EMU_TC(T, TI, D, S) \
    if (dtype == TI && head_dim == D && stages == S) \
        return attn_tc<T, D, S>(gx, gy, gz, smem, out, es, ml, tmp, q, k, v, bt, cl, paged, nh, nkvh, mb, bs, \
                                shift, stride, P, maxp, scale);
#define PAGESIM_EMU_TC_DIMS(T, TI, S) \
    PAGESIM_EMU_TC(T, TI, 64, S) PAGESIM_EMU_TC(T, TI, 80, S) PAGESIM_EMU_TC(T, TI, 96, S) \
    PAGESIM_EMU_TC(T, TI, 128, S) PAGESIM_EMU_TC(T, TI, 256, S)
#ifdef PAGESIM_EMU_FP16_64_ONLY
    PAGESIM_EMU_TC(fp16_t, 0, 64, 2)
    PAGESIM_EMU_TC(fp16_t, 0, 64, 3)
#else
    PAGESIM_EMU_TC_DIMS(fp16_t, 0, 2)
    PAGESIM_EMU_TC_DIMS(bf16_t, 1, 2)
    PAGESIM_EMU_TC_DIMS(fp16_t, 0, 3)
    PAGESIM_EMU_TC_DIMS(bf16_t, 1, 3)
#endif
    return 1;
}

extern "C" int emu_attention_reduce(int dtype, int gx, int gy, int threads, int smem, void* out, const float* es,
                                    const float* ml, const float* tmp, const int* cl, int nh, int hd, int P,
                                    int maxp) {
    if (dtype == 0)
        emu_launch(dim3(gx, gy, 1), threads, smem, [&] {
            paged_attention_reduce_kernel<fp16_t>((fp16_t*)out, es, ml, tmp, cl, nh, hd, P, maxp);
        });
    else
        emu_launch(dim3(gx, gy, 1), threads, smem, [&] {
            paged_attention_reduce_kernel<bf16_t>((bf16_t*)out, es, ml, tmp, cl, nh, hd, P, maxp);
        });
    return 0;
}

template <typename U, typename I>
static void rc(int n, int threads, const void* key, const void* value, void* kc, void* vc, const void* slots,
               long long ru, long long ks, long long vs) {
    emu_launch(dim3(n, 1, 1), threads, 0, [&] {
        reshape_and_cache_kernel<U, I>((const U*)key, (const U*)value, (U*)kc, (U*)vc, (const I*)slots, ru, ks, vs);
    });
}

// unit16: 1 = uint4 units, 0 = unsigned short; idx64: 1 = long long slots, 0 = int
extern "C" int emu_reshape_and_cache(int unit16, int idx64, int n, int threads, const void* key, const void* value,
                                     void* kc, void* vc, const void* slots, long long ru, long long ks, long long vs) {
    if (unit16 && idx64) rc<uint4, long long>(n, threads, key, value, kc, vc, slots, ru, ks, vs);
    else if (unit16) rc<uint4, int>(n, threads, key, value, kc, vc, slots, ru, ks, vs);
    else if (idx64) rc<unsigned short, long long>(n, threads, key, value, kc, vc, slots, ru, ks, vs);
    else rc<unsigned short, int>(n, threads, key, value, kc, vc, slots, ru, ks, vs);
    return 0;
}

extern "C" int emu_copy_blocks(int unit16, int n, int threads, void* kc, void* vc, const long long* mapping,
                               long long block_units) {
    if (unit16)
        emu_launch(dim3(n, 1, 1), threads, 0, [&] {
            copy_blocks_kernel<uint4>((uint4*)kc, (uint4*)vc, mapping, block_units);
        });
    else
        emu_launch(dim3(n, 1, 1), threads, 0, [&] {
            copy_blocks_kernel<unsigned short>((unsigned short*)kc, (unsigned short*)vc, mapping, block_units);
        });
    return 0;
}

// ---- fused element-wise kernels (fused_ops.cu); dtype: 0 = fp16, 1 = bf16
template <typename T>
static void rms(int n, int threads, void* x, void* r, const void* w, float eps, int hidden, long long xs, long long rs,
                int add) {
    emu_launch(dim3(n, 1, 1), threads, 0, [&] {
        fused_add_rms_norm_kernel<T>((T*)x, (T*)r, (const T*)w, eps, hidden, xs, rs, add);
    });
}

extern "C" int emu_fused_add_rms_norm(int dtype, int n, int threads, void* x, void* r, const void* w, float eps,
                                      int hidden, long long xs, long long rs, int add) {
    if (dtype == 0) rms<fp16_t>(n, threads, x, r, w, eps, hidden, xs, rs, add);
    else rms<bf16_t>(n, threads, x, r, w, eps, hidden, xs, rs, add);
    return 0;
}

template <typename T, typename I>
static void rope(int n, int threads, void* qkv, long long stride, const long long* pos, const void* c, const void* s,
                 int nh, int nkvh, int hd, void* kc, void* vc, const void* slots) {
    emu_launch(dim3(n, 1, 1), threads, 0, [&] {
        rotary_cache_kernel<T, I>((T*)qkv, stride, pos, (const T*)c, (const T*)s, nh, nkvh, hd, (T*)kc, (T*)vc,
                                  (const I*)slots);
    });
}

// idx64: 1 = long long slots, 0 = int
extern "C" int emu_rotary_cache(int dtype, int idx64, int n, int threads, void* qkv, long long stride,
                                const long long* pos, const void* c, const void* s, int nh, int nkvh, int hd, void* kc,
                                void* vc, const void* slots) {
    if (dtype == 0 && idx64) rope<fp16_t, long long>(n, threads, qkv, stride, pos, c, s, nh, nkvh, hd, kc, vc, slots);
    else if (dtype == 0) rope<fp16_t, int>(n, threads, qkv, stride, pos, c, s, nh, nkvh, hd, kc, vc, slots);
    else if (idx64) rope<bf16_t, long long>(n, threads, qkv, stride, pos, c, s, nh, nkvh, hd, kc, vc, slots);
    else rope<bf16_t, int>(n, threads, qkv, stride, pos, c, s, nh, nkvh, hd, kc, vc, slots);
    return 0;
}

template <typename T>
static void silu(int n, int threads, void* out, const void* x, int d, long long xs, long long os) {
    emu_launch(dim3(n, 1, 1), threads, 0, [&] { silu_and_mul_kernel<T>((T*)out, (const T*)x, d, xs, os); });
}

extern "C" int emu_silu_and_mul(int dtype, int n, int threads, void* out, const void* x, int d, long long xs,
                                long long os) {
    if (dtype == 0) silu<fp16_t>(n, threads, out, x, d, xs, os);
    else silu<bf16_t>(n, threads, out, x, d, xs, os);
    return 0;
}
