"""`pagesim gpu`: GPU kernel benchmarks and calibration (needs CUDA). (Placeholder: being built.)"""

from __future__ import annotations

from sim.cli import HelpFormatter, example


def register(sub) -> None:
    p = sub.add_parser("gpu", help="GPU kernel benchmarks and calibration (needs CUDA)", formatter_class=HelpFormatter,
                       epilog=example("pagesim gpu --help"))
    p.set_defaults(func=lambda args: print("pagesim gpu: not built yet") or 2)
