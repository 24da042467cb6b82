"""CPU tests of the CUDA sources: includes inline, and nvcc compiles every instantiation the
Python side can launch for sm_90 (to a cubin: front end + ptxas, -Werror all-warnings), plus a
representative set for sm_80 (to PTX; the tensor-core kernel's mma.m16n8k16 bf16 and cp.async need it) and with the NVRTC fallback bf16 type
(-DPAGESIM_NO_CUDA_BF16). Skipped without nvcc. The jobs run in parallel (about 20 s of CPU)."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from pagesim.gpu.kernels_src import KERNEL_DIR, all_instantiations, instantiation_unit, load_source

NVCC = shutil.which("nvcc")
ARCHS = ("sm_80", "sm_90")


def test_load_source_inlines_local_headers():
    src = load_source("paged_attention.cu")
    assert '#include "common.cuh"' not in src
    assert "cvt8<fp16_t>" in src and "#include <cuda_fp16.h>" in src and "#include <cuda_bf16.h>" in src
    assert "#pragma once" not in src
    assert src.count("__device__ __forceinline__ float warp_sum") == 1


def test_instantiation_names_are_in_the_sources():
    for src, names in all_instantiations().items():
        text = (KERNEL_DIR / src).read_text()
        for n in names:
            assert n.split("<")[0] in text


def _compile(src: str, names: list[str], arch: str, tmp_path, extra=(), tag="") -> subprocess.CompletedProcess:
    tag = f"{arch}_{tag}_{src}"
    tu = tmp_path / f"inst_{tag}"
    tu.write_text(instantiation_unit(str(KERNEL_DIR / src), names))
    mode = ["-c", "-o", str(tmp_path / f"{tag}.o")] if arch == "sm_90" else ["--ptx", "-o", str(tmp_path / f"{tag}.ptx")]
    cmd = [NVCC, *mode, "-std=c++17", f"-arch={arch}", "-I", str(KERNEL_DIR), "-Werror", "all-warnings",
           *extra, str(tu)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _representative(names: list[str]) -> list[str]:
    """Per dtype: HEADS 1 and 8 at head_dim 128, HEADS 2 at head_dim 80; the reduce kernels; all cache ops."""
    keep = (", 128, 1>", ", 128, 8>", ", 80, 2>", "reduce_kernel", "reshape_and_cache", "copy_blocks")
    return [n for n in names if any(k in n for k in keep)]


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_nvcc_compiles_every_instantiation(tmp_path):
    inst = all_instantiations()
    attn = inst["paged_attention.cu"]
    tc = inst["paged_attention_tc.cu"]
    jobs = [("paged_attention.cu", [n for n in attn if "fp16_t" in n], "sm_90", ()),
            ("paged_attention.cu", [n for n in attn if "bf16_t" in n], "sm_90", ()),
            ("cache_ops.cu", inst["cache_ops.cu"], "sm_90", ()),
            ("fused_ops.cu", inst["fused_ops.cu"], "sm_90", ()),
            ("paged_attention_tc.cu", tc, "sm_90", ()),
            ("paged_attention.cu", _representative(attn), "sm_80", ()),
            ("fused_ops.cu", inst["fused_ops.cu"], "sm_80", ("-DPAGESIM_NO_CUDA_BF16",)),
            ("cache_ops.cu", inst["cache_ops.cu"], "sm_80", ()),
            # the storage-only bf16 type used when NVRTC cannot find <cuda_bf16.h>
            ("paged_attention.cu", [n for n in _representative(attn) if "bf16_t" in n], "sm_80",
             ("-DPAGESIM_NO_CUDA_BF16",))]
    jobs += [("paged_attention_tc.cu", [n for n in tc if ", 128, " in n], "sm_80", ()),
             ("paged_attention_tc.cu", [n for n in tc if "bf16_t, 128, " in n], "sm_80", ("-DPAGESIM_NO_CUDA_BF16",))]
    assert sorted(n for j in jobs[:5] for n in j[1]) == sorted(n for names in inst.values() for n in names)
    assert all(j[1] for j in jobs), "a job with no instantiation compiles nothing"
    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(lambda ij: (ij[1], _compile(*ij[1][:3], tmp_path, ij[1][3], tag=str(ij[0]))),
                              enumerate(jobs)))
    failed = [f"{j[0]} {j[2]} {j[3]}:\n{r.stderr[-3000:]}" for j, r in results if r.returncode]
    assert not failed, "\n".join(failed)
