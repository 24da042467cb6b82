"""A tiny stand-in for CuPy on the CPU: numpy arrays as "device" arrays, and RawModule kernels
that run the real kernel sources through the CPU emulation (tests/gpu/emu).

Only what ``gpu.paged_attention`` / ``gpu.cache_ops`` / ``gpu._loader`` touch is provided, so
their Python paths (validation, launch geometry, argument order, split-K reduce launch, cache-op
units and strides) run end to end without a GPU.
"""

from __future__ import annotations

import ctypes
import re
import types

import numpy as np

float16, float32, uint16, int16, int32, int64, uint8, uint32 = (np.float16, np.float32, np.uint16, np.int16,
                                                                 np.int32, np.int64, np.uint8, np.uint32)
__version__ = "fake"


class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


class ndarray(np.ndarray):
    @property
    def data(self):  # CuPy's MemoryPointer-like .data.ptr
        return _Ptr(self.ctypes.data)


def _dev(a):
    return np.asarray(a).view(ndarray)


def asarray(a, dtype=None):
    return np.array(a, dtype=dtype, copy=True).view(ndarray) if not isinstance(a, ndarray) else \
        (a if dtype is None else a.astype(dtype))


def ascontiguousarray(a, dtype=None):
    return np.ascontiguousarray(a, dtype=dtype).view(ndarray)


def asnumpy(a):
    return np.array(a, copy=True).view(np.ndarray)


def empty(shape, dtype=np.float32):
    return np.full(shape, 0xFF, dtype=np.uint8).view(dtype).reshape(shape).view(ndarray) \
        if np.dtype(dtype).itemsize == 1 else np.empty(shape, dtype=dtype).view(ndarray)


def empty_like(a):
    return np.empty_like(a).view(ndarray)


def zeros(shape, dtype=np.float32):
    return np.zeros(shape, dtype=dtype).view(ndarray)


def zeros_like(a):
    return np.zeros_like(a).view(ndarray)


class CompileException(Exception):
    pass


class _Kernel:
    def __init__(self, lib, name):
        self.lib, self.name = lib, name
        self.max_dynamic_shared_size_bytes = 0
        self.calls = []
        self.kernel = types.SimpleNamespace(ptr=0)  # CuPy's Function (the occupancy query takes its ptr)

    @staticmethod
    def _c(a):
        if isinstance(a, np.ndarray):
            return ctypes.c_void_p(a.ctypes.data)
        if isinstance(a, np.int32):
            return ctypes.c_int(int(a))
        if isinstance(a, np.int64):
            return ctypes.c_longlong(int(a))
        if isinstance(a, np.float32):
            return ctypes.c_float(float(a))
        raise TypeError(f"kernel argument of type {type(a).__name__} (CuPy would not pack it either)")

    def __call__(self, grid, block, args, shared_mem=0):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        (threads,) = block
        self.calls.append((grid, block, shared_mem))
        if shared_mem > 48 * 1024:
            assert self.max_dynamic_shared_size_bytes >= shared_mem, "opt-in shared memory not set"
        c = [self._c(a) for a in args]
        m = re.fullmatch(r"paged_attention_kernel<(\w+), (\d+), (\d+)>", self.name)
        if m:
            dt = 0 if m.group(1) == "fp16_t" else 1
            rc = self.lib.emu_attention_main(dt, int(m.group(2)), int(m.group(3)), *grid, threads, shared_mem, *c)
            if rc == 1:
                raise NotImplementedError(f"{self.name} not instantiated in the emulation")
            assert rc == 0, rc
            return
        m = re.fullmatch(r"paged_attention_tc_kernel<(\w+), (\d+), (\d+)>", self.name)
        if m:
            dt = 0 if m.group(1) == "fp16_t" else 1
            rc = self.lib.emu_attention_tc(dt, int(m.group(2)), int(m.group(3)), *grid, threads, shared_mem, *c)
            assert rc == 0, rc
            return
        m = re.fullmatch(r"paged_attention_reduce_kernel<(\w+)>", self.name)
        if m:
            assert grid[2] == 1
            self.lib.emu_attention_reduce(0 if m.group(1) == "fp16_t" else 1, grid[0], grid[1], threads, shared_mem,
                                          *c)
            return
        m = re.fullmatch(r"reshape_and_cache_kernel<(uint4|unsigned short), (int|long long)>", self.name)
        if m:
            self.lib.emu_reshape_and_cache(int(m.group(1) == "uint4"), int(m.group(2) == "long long"), grid[0],
                                           threads, *c)
            return
        m = re.fullmatch(r"copy_blocks_kernel<(uint4|unsigned short)>", self.name)
        if m:
            self.lib.emu_copy_blocks(int(m.group(1) == "uint4"), grid[0], threads, *c)
            return
        m = re.fullmatch(r"(fused_add_rms_norm|silu_and_mul|rotary_cache)_kernel<(\w+)(, (int|long long))?>",
                         self.name)
        if m:
            dt = 0 if m.group(2) == "fp16_t" else 1
            if m.group(1) == "rotary_cache":
                self.lib.emu_rotary_cache(dt, int(m.group(4) == "long long"), grid[0], threads, *c)
            else:
                getattr(self.lib, f"emu_{m.group(1)}")(dt, grid[0], threads, *c)
            return
        raise NotImplementedError(self.name)


def make(lib, sm_count=132, smem_optin=227 * 1024) -> types.ModuleType:
    """A module object to install as ``sys.modules['cupy']``."""
    mod = types.ModuleType("cupy")
    for k, v in dict(globals()).items():
        if not k.startswith("__") or k == "__version__":
            setattr(mod, k, v)
    compiled = []

    class RawModule:
        def __init__(self, code, options=(), name_expressions=()):
            assert "#include \"" not in code, "local includes must be inlined"
            compiled.append((name_expressions, options))
            self.names = name_expressions

        def get_function(self, name):
            assert name in self.names
            return _Kernel(lib, name)

    class _Stream:
        ptr = 0

        def synchronize(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def memcpy_async(dst, src, size, kind, stream):
        ctypes.memmove(dst, src, size)

    mod.RawModule = RawModule
    mod.compiled = compiled
    mod.cuda = types.SimpleNamespace(
        compiler=types.SimpleNamespace(CompileException=CompileException),
        Device=lambda *a: types.SimpleNamespace(id=0),
        get_current_stream=lambda: _Stream(),
        runtime=types.SimpleNamespace(
            getDeviceCount=lambda: 1, memcpyDefault=4, memcpyAsync=memcpy_async,
            getDeviceProperties=lambda i: {"multiProcessorCount": sm_count, "sharedMemPerBlockOptin": smem_optin,
                                           "name": b"Fake GPU", "major": 9, "minor": 0}),
        # an H100's 228 KiB of shared memory per SM, 1 KiB reserved per block; registers not modelled
        driver=types.SimpleNamespace(occupancyMaxActiveBlocksPerMultiprocessor=lambda f, threads, smem:
                                     min(16, 228 * 1024 // (smem + 1024))),
    )
    return mod
