"""The package's build (its metadata is setup.cfg's): a wheel or ``pip install .`` also carries
the simulator's compiled core, every scheduler family's extension module, built here by
``sim/precompile.py`` into ``sim/core/compiled/``, so that an installed pagesim's first run
compiles nothing. An editable install (``pip install -e .``) builds nothing here: its first run
of each family compiles that family and writes its module beside numba's cache. Where the core
cannot be built (no C compiler), the package is built without it and says so;
``PAGESIM_PRECOMPILE=0`` skips it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution


class BuildWithCompiledCore(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False) or os.environ.get("PAGESIM_PRECOMPILE") == "0":
            return
        into = Path(self.build_lib, "pagesim", "sim", "core", "compiled")
        shutil.rmtree(into, ignore_errors=True)  # a module of an earlier build of other sources: never loaded
        path = os.pathsep.join(filter(None, [str(Path(self.build_lib).resolve()), os.environ.get("PYTHONPATH")]))
        subprocess.run([sys.executable, "-m", "pagesim.sim.precompile", str(into)],
                       env=dict(os.environ, PYTHONPATH=path), check=False)


class CompiledDistribution(Distribution):
    def has_ext_modules(self):
        """The wheel holds machine code (the compiled core): tagged for this platform and Python."""
        return True


setup(cmdclass={"build_py": BuildWithCompiledCore}, distclass=CompiledDistribution)
