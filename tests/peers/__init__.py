"""Peer engines' own code driven beside pagesim (README.md here).

pagesim runs interpreted in these modules unless the user says otherwise, set here once, before
any of them imports pagesim: a peer test or ``python -m tests.peers.compare`` run alone then
compiles nothing, and the rules the tests put back at run time and the radix calls they wrap are
plain module attributes only in CPython. The whole suite puts the user's setting back once every
module is collected (tests/conftest.py), so the processes its tests start inherit that."""

import os

os.environ.setdefault("PAGESIM_JIT", "0")
