"""GPU presets: the datasheet ceilings the cost model and the KV sizing read.

Conventions, for every entry:

- ``mem_bytes``: what ``nvidia-smi`` (``rocm-smi`` on AMD) reports as total memory, which is
  what vLLM's ``gpu_memory_utilization`` multiplies;
- ``peak_flops``: dense (no 2:4 sparsity) FP16/BF16 tensor-core FLOP/s; ``peak_fp8_flops``:
  dense FP8, ``None`` where the GPU has no FP8 tensor cores (A100);
- ``mem_bw``: peak HBM (GDDR on L40S, A40 and the RTX cards) bytes/s from the datasheet;
- ``interconnect_bw``: GPU-to-GPU bytes/s per direction (NVLink, AMD Infinity Fabric, or PCIe
  where there is none), for the TP all-reduce;
- ``pcie_bw``: host <-> device bytes/s per direction for swapping: about 78 % of the link's
  peak (25 GB/s of PCIe 4.0 x16's 32, 50 GB/s of PCIe 5.0 x16's 64), what copies reach.

Sources (vendor datasheets):

- A100 40/80 GB: NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOPS FP16, 1,555 / 2,039
  GB/s, NVLink 600 GB/s bidirectional.
- H100 SXM: NVIDIA H100 Tensor Core GPU datasheet (2023): 989 TFLOPS FP16/BF16 dense (1,979
  with sparsity), FP8 1,979 dense (3,958 sparse), 3.35 TB/s, NVLink 900 GB/s; nvidia-smi
  81,559 MiB (the preset keeps 80 GiB).
- H200 SXM: NVIDIA H200 Tensor Core GPU datasheet (2024): same compute as H100, 141 GB HBM3e
  (nvidia-smi 143,771 MiB = 140.4 GiB), 4.8 TB/s.
- L40S: NVIDIA L40S datasheet (2023): 362.05 TFLOPS FP16 tensor, 733 FP8 (dense), 48 GB GDDR6
  (nvidia-smi 46,068 MiB = 45 GiB), 864 GB/s, PCIe 4.0 x16 and no NVLink.
- B200: NVIDIA HGX B200 / DGX B200 datasheets (2024): per GPU 2.25 PFLOPS FP16/BF16 dense
  (4.5 sparse), 4.5 PFLOPS FP8 dense (9 sparse), 180 GB HBM3e (nvidia-smi 183,359 MiB),
  8 TB/s, NVLink 5 at 1.8 TB/s bidirectional, PCIe 5.0.
- MI300X: AMD Instinct MI300X data sheet (2023): 1,307.4 TFLOPS FP16/BF16 dense, 2,614.9 FP8
  dense, 192 GB HBM3 (rocm-smi 205,822,885,888 B), 5.3 TB/s, seven Infinity Fabric links of
  64 GB/s per direction (448 GB/s in all), PCIe 5.0.
- A40: NVIDIA A40 datasheet (2020): 149.7 TFLOPS FP16 tensor dense (299.4 sparse), 48 GB GDDR6
  (nvidia-smi 46,068 MiB = 45 GiB), 696 GB/s, NVLink bridge 112.5 GB/s bidirectional, PCIe 4.0;
  the GPU of Vidur's A40 profiling tables (sim/cost/measured.py).
- H20: NVIDIA H20 product brief (China-market Hopper, 2023; NVIDIA publishes no web
  datasheet): 148 TFLOPS FP16/BF16 dense, 296 FP8 dense, 96 GB HBM3 (nvidia-smi 97,871 MiB),
  4.0 TB/s, NVLink 900 GB/s, PCIe 5.0.
- RTX 4090: NVIDIA Ada GPU architecture whitepaper (v2.1, 2023, appendix table "GeForce RTX
  4090"; https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf):
  165.2 TFLOPS BF16 tensor dense with FP32 accumulate (330.4 sparse; GeForce runs FP16/BF16 with
  FP32 accumulate at half the FP16-accumulate rate, and vLLM's GEMMs accumulate in FP32), 330.3
  FP8 dense with FP32 accumulate, 24 GB GDDR6X (nvidia-smi 24,564 MiB), 1,008 GB/s, PCIe 4.0 x16
  and no NVLink. The GPU of LLMServingSim's RTX4090 run (bench/examples, vLLM 0.19.0).
- RTX PRO 6000 Blackwell Server Edition: NVIDIA datasheet (2025;
  https://www.nvidia.com/en-us/data-center/rtx-pro-6000-blackwell-server-edition/): 96 GB GDDR7
  with ECC (nvidia-smi 97,887 MiB), 1,597 GB/s (the Workstation Edition: 1,792), PCIe 5.0 x16
  and no NVLink, 4 PFLOPS FP4 with sparsity; dense BF16 (FP32 accumulate) 503.8 TFLOPS and FP8
  1,007.6, from the NVIDIA RTX Blackwell GPU architecture whitepaper (2025, appendix table "RTX
  PRO 6000 Blackwell": 188 SMs; 4 PFLOPS FP4 sparse = 8 x 503.8). The GPU of LLMServingSim's
  RTXPRO6000 runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.sim.errors import ConfigError

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet ceilings (conventions in the module docstring)."""

    name: str
    mem_bytes: int
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s
    mem_bw: float  # HBM bytes/s
    interconnect_bw: float  # NVLink (or PCIe if none) bytes/s per direction, for all-reduce
    pcie_bw: float  # host <-> device bytes/s per direction, for swapping
    peak_fp8_flops: float | None = None  # dense fp8 tensor-core FLOP/s; None: no fp8 tensor cores


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("a100-40gb", 40 * GiB, 312e12, 1555e9, 300e9, 25e9),
        GPUSpec("a100-80gb", 80 * GiB, 312e12, 2039e9, 300e9, 25e9),
        GPUSpec("h100-80gb", 80 * GiB, 989e12, 3350e9, 450e9, 50e9, peak_fp8_flops=1979e12),
        GPUSpec("h200-141gb", int(140.4 * GiB), 989e12, 4800e9, 450e9, 50e9, peak_fp8_flops=1979e12),
        GPUSpec("l40s", 45 * GiB, 362e12, 864e9, 25e9, 25e9, peak_fp8_flops=733e12),
        GPUSpec("b200-180gb", 183_359 * MiB, 2250e12, 8000e9, 900e9, 50e9, peak_fp8_flops=4500e12),
        GPUSpec("mi300x-192gb", 205_822_885_888, 1307.4e12, 5300e9, 448e9, 50e9, peak_fp8_flops=2614.9e12),
        GPUSpec("h20-96gb", 97_871 * MiB, 148e12, 4000e9, 450e9, 50e9, peak_fp8_flops=296e12),
        GPUSpec("a40", 46_068 * MiB, 149.7e12, 696e9, 56.25e9, 25e9),
        GPUSpec("rtx-4090", 24_564 * MiB, 165.2e12, 1008e9, 25e9, 25e9, peak_fp8_flops=330.3e12),
        GPUSpec("rtx-pro-6000", 97_887 * MiB, 503.8e12, 1597e9, 50e9, 50e9, peak_fp8_flops=1007.6e12),
    ]
}

GPU_ALIASES = {"a100": "a100-40gb", "h100": "h100-80gb", "h200": "h200-141gb", "l40s-48gb": "l40s",
               "b200": "b200-180gb", "mi300x": "mi300x-192gb", "h20": "h20-96gb", "rtx4090": "rtx-4090",
               "rtxpro6000": "rtx-pro-6000", "rtx-pro-6000-blackwell": "rtx-pro-6000"}


def get_gpu(name: str) -> GPUSpec:
    key = name.lower()
    key = GPU_ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    raise ConfigError(f"unknown GPU '{name}'; valid GPUs: {', '.join(GPUS)}")
