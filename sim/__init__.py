"""pagesim: a discrete-event simulator of LLM serving and its KV-cache memory.

Packages:
  sim/          specs, memory managers, schedulers, cost models, the SimPy engine, metrics, CLI
  traces/       trace loaders, synthetic workloads, transformations (canonical DataFrame)
  gpu/          CuPy RawKernel paged attention, calibration, the real (GPU) executor
  experiments/  paper reproductions, sweeps with an on-disk cache, capacity planning
  reports/      plotly figures and self-contained HTML reports
"""

__version__ = "0.1.0"
