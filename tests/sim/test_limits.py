"""Memory a run cannot have is refused in one line before anything is allocated: KV memory the
GPU cannot hold beside the weights (``specs.capacity.kv_capacity``), manager tables this machine
cannot hold (``limits.check_pool``) and prefill token pairs beyond int64 (``check_token_pairs``).
From the command line the first refusal comes first (tests/test_bad_inputs.py); the other two
are reached here directly, as a larger GPU or a smaller model would reach them."""

import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.limits import check_pool
from pagesim.sim.specs import GiB, get_gpu, get_model, kv_capacity


def test_kv_memory_beyond_what_the_gpu_holds_beside_the_weights_is_refused():
    opt, a100 = get_model("opt-13b"), get_gpu("a100-40gb")
    room = (a100.mem_bytes - opt.weight_bytes) / GiB  # 40 GiB less 23.9 GiB of weights: 16.1 GiB
    assert room == pytest.approx(16.08, abs=0.01)
    assert kv_capacity(opt, a100, kv_bytes=16 * GiB).capacity_tokens == 16 * GiB // opt.kv_bytes_per_token(1)
    with pytest.raises(ConfigError, match="--kv-gib 16.5 does not fit on a100-40gb: .* at most 16.1 GiB of KV"):
        kv_capacity(opt, a100, kv_bytes=16.5 * GiB)
    # at TP 2 each GPU holds half the weights: 28 GiB of KV per GPU fits (40 - 12 = 28.03)
    assert kv_capacity(opt, a100, kv_bytes=28 * GiB, tensor_parallel=2).capacity_tokens > 0
    with pytest.raises(ConfigError, match="at most 28.0 GiB"):
        kv_capacity(opt, a100, kv_bytes=28.1 * GiB, tensor_parallel=2)
    assert kv_capacity(opt, kv_bytes=1e6 * GiB).capacity_tokens > 0  # no GPU named: nothing to check against


@pytest.mark.parametrize("system, unit", [("vllm", "blocks of 16"), ("token", "blocks of 1,"),
                                          ("vattention", "pages of"), ("static", "static slots")])
def test_manager_tables_beyond_this_machines_memory_are_refused(system, unit):
    cfg, model = SimConfig.for_system(system, max_seq_len=2048), get_model("opt-13b")
    with pytest.raises(ConfigError, match=f"a KV pool of 1e\\+13 tokens \\(given\\) in .* {unit}.*--kv-gib"):
        check_pool(cfg, model, 10**13, "given")
    check_pool(cfg, model, 15_728, "given")  # the paper's pool: fine


def test_prefill_token_pairs_beyond_int64_are_refused():
    chunked = SimConfig.for_system("vllm", chunked_prefill=True, chunk_budget=2_000_000_000)
    with pytest.raises(ConfigError, match=r"max_seq_len=3000000000 with up to 2000000000 prompt tokens per "
                                          r"iteration \(chunk_budget\) overflows"):
        chunked.check_token_pairs(3_000_000_000, 10**12)
    with pytest.raises(ConfigError, match=r"prompt tokens per iteration \(the KV pool's tokens \(a static batch's "
                                          r"padded prefill\)\) overflows"):
        SimConfig.for_system("static").check_token_pairs(3_000_000_000, 1_310_000_000_000)
