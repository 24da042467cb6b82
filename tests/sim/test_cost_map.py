"""The cost models' map (sim/cost/__init__.py's docstring) names every file of the subpackage."""

from pathlib import Path

import pagesim.sim.cost as cost


def test_every_cost_file_is_on_the_map():
    here = Path(cost.__file__).parent
    missing = [p.name for p in sorted(here.glob("*.py"))
               if p.name != "__init__.py" and p.name not in cost.__doc__]
    assert not missing, f"sim/cost/__init__.py's map leaves out {missing}"
