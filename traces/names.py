"""Names the command-line parsers need, importable without numpy/pandas (keeps ``pagesim --help`` fast)."""

FORMATS = ("azure", "mooncake", "burstgpt", "lengths", "canonical", "generic")
ARRIVALS = ("poisson", "gamma")
PAPER_WORKLOAD_NAMES = ("sharegpt", "alpaca")
WORKLOADS = (*PAPER_WORKLOAD_NAMES, "custom")
DISTS = ("constant", "uniform", "lognormal", "exponential", "empirical")
#: units of numeric timestamps (``--time-unit``), as seconds per unit
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
