"""KV transfers (sim/core/kv/transfer.py) and their links (sim/specs/links.py), worked by hand."""

import numpy as np
import pytest

from pagesim.sim.core.kv import transfer
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import get_gpu, get_model
from pagesim.sim.specs.links import LINKS, get_link


def test_a_partial_last_block_travels_whole():
    assert transfer.transfer_bytes(32, 16, 1000) == 2 * 16 * 1000
    assert transfer.transfer_bytes(33, 16, 1000) == 3 * 16 * 1000
    assert transfer.transfer_bytes(1, 16, 1000) == 16 * 1000


def test_opt_13b_prompt_over_infiniband_ndr():
    # OPT-13B fp16: 819,200 B a token (the vLLM paper's 800 KiB); 1,000 tokens in blocks of 16
    # are 63 blocks = 1,008 slots = 825,753,600 B; at 50 GB/s that is 16.515 ms, plus 2 us
    per_token = get_model("opt-13b").kv_bytes_per_token()
    assert per_token == 819_200
    num_bytes = transfer.transfer_bytes(1000, 16, per_token)
    assert num_bytes == 825_753_600
    link = get_link("ib-ndr", get_gpu("a100-80gb"))
    free_at = np.zeros(1)
    start, end = transfer.start_transfer(free_at, 0, 1.0, num_bytes, link.bandwidth, link.latency)
    assert start == 1.0
    assert end == pytest.approx(1.0 + 0.016515072 + 2e-6, rel=1e-12)


def test_one_link_is_a_queue_latencies_overlap():
    free_at = np.zeros(2)
    # 10 ms of bytes each, asked at 0 and 1 ms on link 0, latency 1 ms
    a = transfer.start_transfer(free_at, 0, 0.0, 1e9, 1e11, 1e-3)
    b = transfer.start_transfer(free_at, 0, 0.001, 1e9, 1e11, 1e-3)
    assert a == pytest.approx((0.0, 0.011))
    assert b == pytest.approx((0.010, 0.021))  # waits for a's bytes, not for a's latency
    # another link is its own queue; an idle link starts at once
    c = transfer.start_transfer(free_at, 1, 0.002, 1e9, 1e11, 1e-3)
    assert c == pytest.approx((0.002, 0.013))
    d = transfer.start_transfer(free_at, 0, 0.5, 1e9, 1e11, 1e-3)
    assert d == pytest.approx((0.5, 0.511))


def test_tensor_parallel_pairs_send_at_once():
    assert transfer.pair_bandwidth(50e9, 2, 4) == 100e9
    assert transfer.pair_bandwidth(50e9, 8, 1) == 50e9


def test_link_presets():
    h100, a100 = get_gpu("h100-80gb"), get_gpu("a100-80gb")
    assert get_link("ib-ndr", h100).bandwidth == 50e9
    assert get_link("ib-hdr", h100).bandwidth == 25e9
    assert get_link("roce-100", h100).bandwidth == 12.5e9
    assert get_link("nvlink", h100).bandwidth == 450e9  # the GPU's own, per direction
    assert get_link("nvlink", a100).bandwidth == 300e9
    assert get_link("pcie", a100).bandwidth == a100.pcie_bw
    assert get_link("ib-ndr", h100, gbps=100).bandwidth == 12.5e9
    assert set(LINKS) == {"ib-ndr", "ib-hdr", "roce-400", "roce-200", "roce-100", "nvlink", "pcie"}


@pytest.mark.parametrize("name, gbps, message", [
    ("ethernet", None, "--kv-link: unknown link 'ethernet'"),
    ("ib-ndr", 0.0, "--kv-link-gbps must be positive"),
    ("ib-ndr", float("nan"), "--kv-link-gbps must be positive"),
])
def test_bad_links_refused_in_one_line(name, gbps, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        get_link(name, get_gpu("h100-80gb"), gbps)
