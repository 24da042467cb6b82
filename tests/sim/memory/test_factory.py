"""make_manager: SimConfig presets -> managers; bad configs raise ConfigError naming the parameter."""

import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.memory import (ContiguousManager, KVCacheManager, PagedManager, StaticManager, TokenManager,
                        VAttentionManager, make_manager)
from pagesim.sim.specs import MODELS

OPT = MODELS["opt-13b"]


@pytest.mark.parametrize("system,cls", [
    ("static", StaticManager), ("orca-max", ContiguousManager), ("orca-pow2", ContiguousManager),
    ("orca-oracle", ContiguousManager), ("vllm", PagedManager), ("token", TokenManager),
    ("vattention", VAttentionManager)])
def test_presets(system, cls):
    m = make_manager(SimConfig.for_system(system), 15728, OPT)
    assert type(m) is cls and isinstance(m, KVCacheManager)
    assert m.capacity == 15728 and m.max_seq_len == 2048
    assert m.usage().total == 15728
    m.check()


def test_fields_are_read():
    m = make_manager(SimConfig.for_system("orca-pow2", placement="best-fit", seed=5, max_seq_len=1024), 5000)
    assert m.reservation == "pow2" and m.placement.name == "best-fit" and m.max_seq_len == 1024
    m = make_manager(SimConfig.for_system("vllm", block_size=32, watermark=0.0, prefix_caching=True), 4096, OPT)
    assert m.block_size == 32 and m.watermark_blocks == 0 and m.prefix_caching
    m = make_manager(SimConfig.for_system("vattention", vattention_page_kib=2048), 15728, OPT)
    assert m.page_tokens == 102
    m = make_manager(SimConfig.for_system("static", static_batch_size=3), 15728, OPT)
    assert m.batch_size == 3


def test_bad_configs():
    with pytest.raises(ConfigError, match="max_seq_len"):
        make_manager(SimConfig.for_system("vllm"), 1000, OPT)  # pool < one 2048 request
    with pytest.raises(ConfigError, match="max_seq_len"):
        make_manager(SimConfig.for_system("vllm"), 100000)  # no model to resolve max_seq_len
    with pytest.raises(ConfigError, match="static_batch_size <= 7"):
        make_manager(SimConfig.for_system("static", static_batch_size=8), 15728, OPT)
    with pytest.raises(ConfigError, match="vattention_page_kib"):
        make_manager(SimConfig.for_system("vattention", vattention_page_kib=0), 15728, OPT)
