"""The package's build backend: setuptools', asking for numba, numpy, pandas and pyarrow where a wheel is
built (``pip install .``, ``pip wheel .``), as ``setup.py`` compiles the simulator's core into
it then; an editable install (``pip install -e .``) compiles nothing at build time and asks for
nothing more."""

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403 - the rest of the interface, as setuptools has it

#: what sim/precompile.py imports to compile the core (a small run of each family)
CORE_BUILD_REQUIRES = ["numba>=0.59", "numpy>=1.24", "pandas>=2.0", "pyarrow>=14", 'tomli>=2.0; python_version < "3.11"']


def get_requires_for_build_wheel(config_settings=None):
    return build_meta.get_requires_for_build_wheel(config_settings) + CORE_BUILD_REQUIRES
