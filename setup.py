"""Build the one compiled part: ``sim._replay``, the compiled replay of the vLLM default
configuration (see ``sim/compiled.py``). It is optional: without a C compiler the install
still succeeds and every run takes the Python engine."""

import sys

from setuptools import Extension, setup

# no FP contraction (FMA): every expression must round as the Python cost model's does
flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]
setup(ext_modules=[Extension("sim._replay", ["sim/_replay.c"], extra_compile_args=flags, optional=True)])
