"""The core's map (sim/core/__init__.py's docstring) names every file of the core."""

from pathlib import Path

import pagesim.sim.core as core


def test_every_core_file_is_on_the_map():
    here = Path(core.__file__).parent
    missing = [p.name for p in sorted(here.rglob("*.py"))
               if "__pycache__" not in p.parts and p.name != "__init__.py" and p.name not in core.__doc__]
    assert not missing, f"sim/core/__init__.py's map leaves out {missing}"
