"""The emulated cluster: namespaces with jumbo MTU and no way out, tbf on both directions of every
link, shaping that holds under real TCP (and not between ranks of one node), gloo across nodes."""

import os
import shutil

import pytest

from trirace.errors import UsageError
from trirace.testbed import Testbed, parse_rate, up


PREFIX = "trtest"  # never a user's testbed ("trirace")


@pytest.mark.parametrize("text, bits", [("250mbit", 250e6), ("1gbit", 1e9), ("100kbit", 1e5), ("2.5gbit", 2.5e9),
                                        (" 10 MBit ", 10e6), ("800bit", None)])
def test_parse_rate(text, bits):
    if bits is None:
        with pytest.raises(UsageError, match="too low"):
            parse_rate(text)
    else:
        assert parse_rate(text) == bits


@pytest.mark.parametrize("junk", ["", "fast", "100", "100mbps", "-5mbit", "1e9bit", "mbit", "10 m bit"])
def test_parse_rate_refuses_junk(junk):
    with pytest.raises(UsageError) as info:
        parse_rate(junk)
    assert "\n" not in str(info.value)


def test_layout_names_and_ranks():
    tb = Testbed(prefix="x", nodes=2, ranks_per_node=3, rate="250mbit", mtu=9000)
    assert [tb.node_of_rank(r) for r in range(6)] == [0, 0, 0, 1, 1, 1]
    assert tb.address(1) == "10.177.0.2" and tb.namespace(1) == "x-n1"
    assert tb.rank_command(4) == ["ip", "netns", "exec", "x-n1"]
    assert tb.rank_env(4)["GLOO_SOCKET_IFNAME"] == tb.ifname(1)
    assert tb.link_bits_per_s == 250e6
    for bad in (lambda: tb.node_of_rank(6), lambda: tb.address(2),
                lambda: Testbed("a-b", 1, 1, "1gbit", 9000), lambda: Testbed("x", 0, 1, "1gbit", 9000)):
        with pytest.raises(UsageError):
            bad()


def test_tbf_bucket_grows_with_rate_and_frames():
    from trirace.testbed.cluster import tbf_burst_bytes
    assert tbf_burst_bytes(100e6, 9000) == 64 * 1024  # the measured setting up to 1gbit
    assert tbf_burst_bytes(5e9, 9000) == 312_500  # 0.5 ms of line rate
    assert tbf_burst_bytes(100e6, 65535) > 2 * 65535  # never smaller than a frame


def test_up_refuses_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UsageError, match=r"^testbed needs root \(network namespaces and tc\)$"):
        up(nodes=2, ranks_per_node=1, rate="1gbit", prefix=PREFIX)


def test_up_refuses_without_tc(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "tc" else real(name, *a, **k))
    with pytest.raises(UsageError, match="'tc'"):
        up(nodes=2, ranks_per_node=1, rate="1gbit", prefix=PREFIX)
