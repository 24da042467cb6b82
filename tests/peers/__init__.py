"""Peer engines' own code driven beside pagesim (README.md here).

pagesim runs interpreted in these modules unless the user says otherwise ("1"), set here once,
before any of them imports pagesim: a peer test or ``python -m tests.peers.compare`` run alone then
compiles nothing, and the rules the tests put back at run time and the radix calls they wrap are
plain module attributes only in CPython. The whole suite puts the user's setting back once every
module is collected (tests/conftest.py), so the processes its tests start inherit that."""

import os

# "numba" (numba's dispatcher, no extension module) is the whole suite's where the user set none
# (tests/conftest.py), not a choice of how the peers run
if os.environ.get("PAGESIM_JIT", "numba") == "numba":
    os.environ["PAGESIM_JIT"] = "0"
