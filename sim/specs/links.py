"""KV-transfer links: what carries a prompt's KV from a prefill GPU to a decode GPU.

Disaggregated serving (vLLM's NIXL connector, SGLang's PD disaggregation, Mooncake's transfer
engine) moves each request's KV blocks from the prefill replica's GPUs to the decode replica's
over RDMA (InfiniBand or RoCE NICs, one per GPU on DGX/HGX nodes), NVLink inside a node, or
PCIe through host memory. A link is priced as ``latency + bytes / bandwidth``
(``sim/core/kv/transfer.py``), so each preset gives both, per GPU and per direction:

- ``bandwidth``: the datasheet line rate, bytes/s per direction per GPU: an upper bound (RDMA
  reaches most of it for the MB-sized messages of KV blocks; ``--kv-link-gbps`` sets a
  measured one instead);
- ``latency``: one transfer's fixed cost before its bytes flow, seconds. Datasheets give the
  wire's (a microsecond or two); what dominates in an engine is when it notices a transfer
  ended, at its next step, which the simulation's steps already price. The presets keep the
  wire's figure, stated per link.

Sources:

- InfiniBand NDR 400 Gb/s (NVIDIA ConnectX-7 datasheet, 2022; the DGX H100's eight compute
  NICs, one per GPU): 50 GB/s per direction; HDR 200 Gb/s (ConnectX-6 datasheet; DGX A100):
  25 GB/s. Latency: ConnectX-7 / Quantum-2 datasheets quote sub-microsecond port-to-port
  figures; 2 us end to end is taken, an RDMA write's usual measured order.
- RoCE over 400/200/100 GbE (ConnectX-7 / ConnectX-6 Dx datasheets): 50 / 25 / 12.5 GB/s per
  direction; 3 us (a switch hop more than InfiniBand's cut-through, taken).
- NVLink (prefill and decode GPUs in one node): the GPU's own per-direction NVLink bandwidth
  (``GPUSpec.interconnect_bw``: H100 450 GB/s, A100 300 GB/s); 2 us, taken.
- PCIe through host memory (no RDMA): the GPU's ``GPUSpec.pcie_bw`` (what copies reach, the
  swap's figure), crossed twice (device to host on one side, host to device on the other,
  pipelined: the slower hop sets the rate); 10 us, taken (two copies' launches).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.gpus import GPUSpec

GB = 1e9


@dataclass(frozen=True)
class LinkSpec:
    """One link's price of a transfer (the module docstring's conventions)."""

    name: str
    bandwidth: float  # bytes/s per direction per GPU
    latency: float  # seconds per transfer


# fixed-rate links: NICs, whatever the GPU
FIXED = {
    "ib-ndr": (400 / 8 * GB, 2e-6),
    "ib-hdr": (200 / 8 * GB, 2e-6),
    "roce-400": (400 / 8 * GB, 3e-6),
    "roce-200": (200 / 8 * GB, 3e-6),
    "roce-100": (100 / 8 * GB, 3e-6),
}
# links whose rate is the GPU's own
OF_GPU = {"nvlink": 2e-6, "pcie": 10e-6}
LINKS = tuple(FIXED) + tuple(OF_GPU)


def get_link(name: str, gpu: GPUSpec, gbps: float | None = None) -> LinkSpec:
    """The link ``name`` on ``gpu`` (the decode side's: the rate it receives at), with
    ``gbps`` (gigabits per second, as NICs are sold) in place of the preset's rate if given."""
    if name in FIXED:
        bandwidth, latency = FIXED[name]
    elif name == "nvlink":
        bandwidth, latency = gpu.interconnect_bw, OF_GPU[name]
    elif name == "pcie":
        bandwidth, latency = gpu.pcie_bw, OF_GPU[name]
    else:
        raise ConfigError(f"--kv-link: unknown link {name!r} (choose from {', '.join(LINKS)})")
    if gbps is not None:
        if not gbps > 0:
            raise ConfigError(f"--kv-link-gbps must be positive (got {gbps})")
        bandwidth = gbps / 8 * GB
    return LinkSpec(name, bandwidth, latency)
