"""Build the CPU emulation of the kernels (emu_kernels.cpp) into a shared library for ctypes."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

from pagesim.gpu.kernels_src import KERNEL_DIR

HERE = Path(__file__).resolve().parent


def cuda_include() -> Path | None:
    cands = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent.parent))
    for c in cands:
        if c and (Path(c) / "include" / "cuda_fp16.h").exists():
            return Path(c) / "include"
    return None


def build(out_dir: Path, kernel_dir: Path = KERNEL_DIR, defines: tuple[str, ...] = (),
          reuse: bool = False) -> tuple[ctypes.CDLL | None, str]:
    """(library, '') or (None, why not). ``kernel_dir``: where the kernel sources are read from (a
    mutated copy, for injected-bug tests); ``defines``: extra -D macros (``PAGESIM_EMU_FP16_64_ONLY``);
    ``reuse``: load the library ``out_dir`` holds already, where it does (tests/gpu/conftest.py)."""
    gxx, inc = shutil.which("g++"), cuda_include()
    if gxx is None or inc is None:
        return None, "needs g++ and the CUDA headers (cuda_fp16.h)"
    so = Path(out_dir) / "emu.so"
    if reuse and so.exists():
        return _load(so), ""
    cmd = [gxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-w", f"-I{inc}", f"-I{kernel_dir}",
           *(f"-D{d}" for d in defines), str(HERE / "emu_kernels.cpp"), "-o", str(so)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"emulation build failed:\n{r.stderr[-4000:]}")
    return _load(so), ""


def _load(so: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(so))
    for f in ("emu_attention_main", "emu_attention_tc", "emu_attention_reduce", "emu_reshape_and_cache", "emu_copy_blocks",
              "emu_fused_add_rms_norm", "emu_rotary_cache", "emu_silu_and_mul"):
        getattr(lib, f).restype = ctypes.c_int
    return lib
