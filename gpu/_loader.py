"""Compile the kernels with CuPy (NVRTC) on first use and cache the functions.

One ``cupy.RawModule`` per (source, name expression) so only what is launched is compiled
(about a second each, then cached by CuPy on disk). Options: ``--std=c++14 -lineinfo`` (source
lines in the SASS, so compute-sanitizer and Nsight Compute name the kernel's line; no change to
the generated code); if NVRTC cannot
find ``<cuda_bf16.h>`` the module is rebuilt with ``-DPAGESIM_NO_CUDA_BF16`` (a storage-only
bf16 type; the kernels convert bf16 with bit operations either way, so results are identical).
"""

from __future__ import annotations

import functools

from pagesim.gpu.device import require_cupy
from pagesim.gpu.kernels_src import load_source

BASE_OPTIONS = ("--std=c++14", "-lineinfo")


@functools.lru_cache(maxsize=None)
def _source(name: str) -> str:
    return load_source(name)


@functools.lru_cache(maxsize=None)
def get_kernel(source: str, name_expression: str):
    """The compiled ``cupy.RawKernel`` for a template instantiation of ``kernels/<source>``."""
    cp = require_cupy("the CUDA kernels")
    last = None
    for extra in ((), ("-DPAGESIM_NO_CUDA_BF16",)):
        try:
            mod = cp.RawModule(code=_source(source), options=BASE_OPTIONS + extra,
                               name_expressions=(name_expression,))
            return mod.get_function(name_expression)
        except cp.cuda.compiler.CompileException as e:
            last = e
            if "cuda_bf16" not in str(e):
                raise
    raise last  # pragma: no cover
