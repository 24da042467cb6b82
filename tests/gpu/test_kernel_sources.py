"""CPU tests of the CUDA sources: includes inline, and nvcc compiles every instantiation the
Python side can launch for sm_90 (to a cubin: front end + ptxas) and sm_80 (to PTX: front end
only, to keep the test under a minute) (skipped without nvcc)."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpu.kernels_src import KERNEL_DIR, all_instantiations, instantiation_unit, load_source

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


def _compile(src: str, names: list[str], arch: str, tmp_path, extra=()) -> subprocess.CompletedProcess:
    tag = f"{arch}_{len(extra)}_{src}"
    tu = tmp_path / f"inst_{tag}"
    tu.write_text(instantiation_unit(str(KERNEL_DIR / src), names))
    mode = ["-c", "-o", str(tmp_path / f"{tag}.o")] if arch == "sm_90" else ["--ptx", "-o", str(tmp_path / f"{tag}.ptx")]
    cmd = [NVCC, *mode, "-std=c++17", f"-arch={arch}", "-I", str(KERNEL_DIR), "-Werror", "all-warnings",
           *extra, str(tu)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_nvcc_compiles_every_instantiation(tmp_path):
    jobs = [(src, names, arch, ()) for src, names in all_instantiations().items() for arch in ARCHS]
    # the fallback bf16 type used when NVRTC cannot find <cuda_bf16.h>
    jobs.append(("cache_ops.cu", all_instantiations()["cache_ops.cu"], "sm_80", ("-DPAGESIM_NO_CUDA_BF16",)))
    jobs.append(("paged_attention.cu", [n for n in all_instantiations()["paged_attention.cu"] if "bf16_t, 128, 8>" in n
                                        or "reduce_kernel<bf16_t>" in n], "sm_80", ("-DPAGESIM_NO_CUDA_BF16",)))
    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(lambda j: (j, _compile(j[0], j[1], j[2], tmp_path, j[3])), jobs))
    failed = [f"{j[0]} {j[2]} {j[3]}:\n{r.stderr[-3000:]}" for j, r in results if r.returncode]
    assert not failed, "\n".join(failed)
