"""`pagesim trace`: Inspect, synthesize and convert request traces. (Placeholder: being built.)"""

from __future__ import annotations

from sim.cli import HelpFormatter, example


def register(sub) -> None:
    p = sub.add_parser("trace", help="Inspect, synthesize and convert request traces", formatter_class=HelpFormatter,
                       epilog=example("pagesim trace --help"))
    p.set_defaults(func=lambda args: print("pagesim trace: not built yet") or 2)
