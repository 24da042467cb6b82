"""`pagesim validate`: Run a trace on the GPU and validate the simulator (needs CUDA). (Placeholder: being built.)"""

from __future__ import annotations

from sim.cli import HelpFormatter, example


def register(sub) -> None:
    p = sub.add_parser("validate", help="Run a trace on the GPU and validate the simulator (needs CUDA)", formatter_class=HelpFormatter,
                       epilog=example("pagesim validate --help"))
    p.set_defaults(func=lambda args: print("pagesim validate: not built yet") or 2)
