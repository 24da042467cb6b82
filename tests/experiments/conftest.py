import pytest

from pagesim.experiments.figures import SweepOptions
from tests.experiments.fakes import fake_run


@pytest.fixture
def fake_opts(tmp_path):
    """Sweep options that use the fake engine, one worker, a private cache, no progress bar."""
    return SweepOptions(workers=1, cache_dir=tmp_path / "cache", progress=False, run_fn=fake_run)
