"""Whether a change of the core leaves every record as it was: the feature space's configurations
(``tests/sim/feature_space.py``'s: today's engines' features, Orca's and static batching's
reservations, clusters and disaggregated pools), each run here and in another checkout, the
digests of their request tables, step tables and summaries (its wall time left out) compared.

A refactor of the schedulers (a rule moved into a hook, a branch on a family's traits for one on
its name) must leave the digests equal; a change of a rule shows which configurations it moves.
Each checkout runs in a process of its own (``PYTHONPATH``: a folder holding a link ``pagesim``
to it, as ``--baseline-path`` of ``benchmarks/ten_million.py``), both drawing the configurations
with this checkout's ``feature_space`` (``prepared``, ``served_run``), so that they run the same
ones; a configuration refused before it runs is compared by its refusal's text.
Run: ``python benchmarks/same_records.py --baseline-path DIR [--start 0] [--count 800]``.
Prints the number of configurations that differ, and each; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _import_path import ROOT, import_path

#: run in each checkout: the digests of configurations start..start + count, as JSON on stdout
DIGESTS = """
import hashlib, json, sys
from tests.sim import feature_space as fs

def digest(seed):
    system = fs.case(seed)[0]
    try:
        cfg, trace, served = fs.prepared(seed)
        result = fs.served_run(cfg, trace, served)
    except Exception as error:  # a refusal, or a fault: compared by its text
        return f"{system} {type(error).__name__}: {str(error)[:200]}"
    h = hashlib.sha256(result.requests.to_csv(index=False).encode())
    if result.steps is not None:
        h.update(result.steps.to_csv(index=False).encode())
    h.update(repr(sorted((k, str(v)) for k, v in result.summary.items() if "wall" not in k)).encode())
    return f"{system} {served[0]} {h.hexdigest()[:16]}"

start, count = int(sys.argv[1]), int(sys.argv[2])
print(json.dumps({seed: digest(seed) for seed in range(start, start + count)}))
"""


def digests(path: str, start: int, count: int) -> dict:
    """The digests of configurations ``start..start + count`` run by the checkout that ``path`` (a
    folder holding a link ``pagesim``) imports, drawn by this checkout's ``tests``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, str(ROOT)]))
    env.pop("PAGESIM_JIT", None)
    done = subprocess.run([sys.executable, "-c", DIGESTS, str(start), str(count)], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-path", required=True, metavar="DIR",
                    help="a folder holding a link pagesim to the other checkout")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=800)
    args = ap.parse_args()
    before = digests(str(Path(args.baseline_path).resolve()), args.start, args.count)
    after = digests(import_path(), args.start, args.count)
    ran = sum(1 for text in after.values() if "Error:" not in text)
    differ = [seed for seed in after if before.get(seed) != after[seed]]
    print(f"configurations {args.start}..{args.start + args.count - 1}: {ran} ran, the rest refused; "
          f"{len(differ)} differ from the baseline's")
    for seed in differ:
        print(f"  {seed}: {before.get(seed)}  ->  {after[seed]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
