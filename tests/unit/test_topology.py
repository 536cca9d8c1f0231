"""Topology model, placement, link-aware hold-back, and the hierarchical all-reduce."""

import pytest

from trirace.policy import make_policy
from trirace.policy.policies import MiB
from trirace.config import make_config
from trirace.errors import UsageError
from trirace.plan.topology import (INTER, INTRA, Link, Topology, hierarchical_pays,
                                   load_topology, parse_rate, parse_time)
from trirace.plan.transfers import plan_reduction
from trirace.runtime import run_local


def test_parse_rates_and_times():
    assert parse_rate("250mbit") == 250e6
    assert parse_rate("1gbit") == 1e9
    assert parse_rate("25GB/s") == 200e9
    assert parse_rate(3e9) == 3e9
    assert parse_time("5us") == pytest.approx(5e-6)
    assert parse_time("2ms") == pytest.approx(2e-3)
    for junk in ("fast", "10 parsecs", ""):
        with pytest.raises(UsageError):
            parse_rate(junk)


def test_load_topology(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("nodes: 4\nranks_per_node: 8\nintra: {bandwidth: 300GB/s, latency: 2us}\n"
                 "inter: {bandwidth: 200gbit, latency: 5us}\n")
    t = load_topology(f)
    assert (t.nodes, t.ranks_per_node, t.world_size) == (4, 8, 32)
    assert t.intra.bytes_per_s == 300e9 and t.inter.bits_per_s == 200e9
    assert t.node_of(7) == 0 and t.node_of(8) == 1
    assert t.link_between(0, 7) == INTRA and t.link_between(7, 8) == INTER
    assert t.group_link([0, 1, 2]) == INTRA and t.group_link([0, 9]) == INTER


@pytest.mark.parametrize("text, needle", [
    ("nodes: 2\n", "ranks_per_node"),
    ("nodes: 0\nranks_per_node: 2\n", "at least 1"),
    ("nodes: 2\nranks_per_node: 2\nwarp: 9\n", "unknown key"),
    ("nodes: 2\nranks_per_node: 2\ninter: {bandwidth: lots}\n", "not a rate"),
    ("nodes: [2\n", "malformed YAML"),
    ("- 1\n", "expected a mapping"),
])
def test_bad_topology_files(tmp_path, text, needle):
    f = tmp_path / "t.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match=needle):
        load_topology(f)


FAST, SLOW = Link(100e9, 2e-6), Link(250e6, 1e-4)


def test_hierarchical_pays_only_when_the_group_spans_and_shares_nodes():
    t = Topology(2, 2, FAST, SLOW)
    assert hierarchical_pays(t, [0, 1, 2, 3], 30e6)
    assert not hierarchical_pays(t, [0, 2], 30e6)  # one member per node: nothing to gain
    assert not hierarchical_pays(t, [0, 1], 30e6)  # inside one node
    assert not hierarchical_pays(Topology(2, 2, SLOW, SLOW), [0, 1, 2, 3], 30e6)  # no faster inner link


def test_topology_must_match_the_job(tmp_path):
    topo = tmp_path / "topo.yaml"
    topo.write_text("nodes: 3\nranks_per_node: 2\n")
    cfg = make_config(dict(model="gpt-test", data="synthetic", steps=1, progress=False, topology=topo))
    with pytest.raises(UsageError, match="topology has 3 x 2 = 6 ranks but the job has 4"):
        run_local([cfg], timeout_s=120)


@pytest.mark.parametrize("rate", ["100mbit", "250mbit", "1gbit", "10gbit", "100gbit"])
def test_trirace_chunks_bound_how_long_an_overtaking_p2p_waits(rate):
    """A P2P that arrives while a chunk is on the wire waits for at most that chunk: its
    size follows the link so the wait stays near 100 ms on slow links and far below on fast."""
    from trirace.policy.policies import sized_for_link

    bw = parse_rate(rate) / 8
    p = sized_for_link(make_policy("trirace"), bw)
    assert 256 * 1024 <= p.partition_bytes <= 8 * MiB
    assert p.partition_bytes / bw <= 0.1 + 1e-9 or p.partition_bytes == 256 * 1024
    assert p.credit_bytes == 2 * p.partition_bytes


def test_trirace_chunks_grow_with_the_replicas_they_ring_over():
    """A ring over n members pays 2(n - 1) latencies per chunk: at thousands of replicas a
    chunk sized for the link alone would be mostly latency, so it grows to keep that a
    small share; at a few replicas the link alone sizes it."""
    from trirace.policy.policies import LATENCY_SHARE, sized_for_link

    slow = parse_rate("250mbit") / 8  # the testbed: 4 replicas, 100 us
    assert sized_for_link(make_policy("trirace"), slow, group_size=4, latency_s=1e-4).partition_bytes == \
        sized_for_link(make_policy("trirace"), slow).partition_bytes
    bw, lat = 200e9, 5e-6  # InfiniBand-class
    many = sized_for_link(make_policy("trirace"), bw, group_size=2048, latency_s=lat)
    assert many.partition_bytes >= 2048 * lat * bw / LATENCY_SHARE - 64 * 1024
    ring_latency = 2 * 2047 * lat
    ring_bytes = 2 * 2047 / 2048 * many.partition_bytes / bw
    assert ring_latency <= LATENCY_SHARE * ring_bytes * 1.01
