"""`pagesim reproduce`: Reproduce the vLLM paper's figures. (Placeholder: being built.)"""

from __future__ import annotations

from sim.cli import HelpFormatter, example


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="Reproduce the vLLM paper's figures", formatter_class=HelpFormatter,
                       epilog=example("pagesim reproduce --help"))
    p.set_defaults(func=lambda args: print("pagesim reproduce: not built yet") or 2)
