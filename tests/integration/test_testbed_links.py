"""The testbed on real processes: shaped links between emulated nodes, gloo across them."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from trirace.errors import UsageError
from trirace.testbed import Testbed, current, down, up


HAVE_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None

needs_root = pytest.mark.skipif(not HAVE_NETNS, reason="testbed needs root with 'ip' and 'tc' (network namespaces)")

PREFIX = "trtest"  # never a user's testbed ("trirace")

SHAPED_RATE = "100mbit"

# Receiver: accept `n` connections, count bytes until every one closes; prints bits/s measured
# from first byte to last EOF, so data still queued when a sender stops is counted too.
_RECEIVER = r"""
import json, socket, sys, threading, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr, port)); srv.listen(n); print("listening", flush=True)
totals, first, last = [], [], []
def drain(conn):
    buf, got = bytearray(1 << 20), 0
    while (k := conn.recv_into(buf)):
        if not got: first.append(time.monotonic())
        got += k
    last.append(time.monotonic()); totals.append(got)
conns = [srv.accept()[0] for _ in range(n)]
threads = [threading.Thread(target=drain, args=(c,)) for c in conns]
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps({"bits_per_s": 8 * sum(totals) / (max(last) - min(first)), "bytes": sum(totals)}))
"""

_SENDER = r"""
import socket, sys, time
addr, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection((addr, port), timeout=10)
chunk, end = b"x" * (1 << 20), time.monotonic() + seconds
while time.monotonic() < end:
    s.sendall(chunk)
s.close()
"""

_GLOO = r"""
import sys, torch, torch.distributed as dist
rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
t = torch.full((1 << 20,), float(rank + 1))
dist.all_reduce(t)
print(t.min().item(), t.max().item())
dist.destroy_process_group()
"""


def _in_ns(tb: Testbed, rank: int, script: str, *args: object, timeout_s: int = 30) -> list[str]:
    return ["timeout", "-k", "2", str(timeout_s), *tb.rank_command(rank), sys.executable, "-c", script, *map(str, args)]


def _throughput(tb: Testbed, senders: list[int], receiver: int, seconds: float) -> float:
    """Bits/s into `receiver`'s node address from concurrent senders (testbed ranks)."""
    addr, port = tb.address(tb.node_of_rank(receiver)), 47300
    recv = subprocess.Popen(_in_ns(tb, receiver, _RECEIVER, addr, port, len(senders)), stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "listening"
        sends = [subprocess.Popen(_in_ns(tb, s, _SENDER, addr, port, seconds)) for s in senders]
        assert all(p.wait(timeout=seconds + 20) == 0 for p in sends)
        out, _ = recv.communicate(timeout=20)
    finally:
        recv.kill()
    assert recv.returncode == 0
    return json.loads(out)["bits_per_s"]


def _tc_sent_bytes(ns: str, dev: str) -> int:
    out = subprocess.run(["timeout", "5", "tc", "-s", "-n", ns, "qdisc", "show", "dev", dev],
                         capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Sent (\d+) bytes", out).group(1))


@pytest.fixture(scope="module")
def shaped():
    """3 nodes x 2 ranks at 100mbit, torn down whatever happens."""
    try:
        tb = up(nodes=3, ranks_per_node=2, rate=SHAPED_RATE, prefix=PREFIX)
    except UsageError as e:
        if "not permitted" in str(e):
            pytest.skip(f"kernel refuses network namespaces here: {e}")
        raise
    yield tb
    down(PREFIX)


def _sh(*argv: str) -> str:
    return subprocess.run(["timeout", "5", *argv], capture_output=True, text=True, check=True).stdout


def _ours(prefix: str) -> list[str]:
    return [line.split()[0] for line in _sh("ip", "netns", "list").splitlines()
            if re.fullmatch(rf"{prefix}-(sw|n\d+)", line.split()[0])]


@needs_root
def test_structure_idempotent_and_teardown():
    prefix = "trtestb"
    # A bystander with a look-alike name must survive our down().
    _sh("ip", "netns", "add", f"{prefix}x-n0")
    try:
        up(nodes=3, ranks_per_node=1, rate="200mbit", prefix=prefix)
        tb = up(nodes=3, ranks_per_node=1, rate="200mbit", prefix=prefix)  # twice: replaces the first
        assert current(prefix) == tb
        assert sorted(_ours(prefix)) == sorted([tb.switch_namespace, *(tb.namespace(n) for n in range(3))])
        for node in range(3):
            ns, dev = tb.namespace(node), tb.ifname(node)
            assert "mtu 9000" in _sh("ip", "-n", ns, "link", "show", dev)
            assert "default" not in _sh("ip", "-n", ns, "route")
            assert "default" not in _sh("ip", "-n", ns, "-6", "route")
            assert "LOOPBACK,UP" in _sh("ip", "-n", ns, "link", "show", "lo")
            for qns, qdev in ((ns, dev), (tb.switch_namespace, tb.switch_port(node))):  # uplink, downlink
                assert re.search(r"qdisc tbf \S+ root .*rate 200Mbit", _sh("tc", "-n", qns, "qdisc", "show", "dev", qdev))
        assert down(prefix) == 4  # 3 nodes + the switch
        assert _ours(prefix) == [] and current(prefix) is None
        assert down(prefix) == 0
        assert f"{prefix}x-n0" in _sh("ip", "netns", "list")
    finally:
        down(prefix)
        subprocess.run(["timeout", "5", "ip", "netns", "del", f"{prefix}x-n0"], capture_output=True)


@needs_root
def test_link_is_shaped(shaped):
    nominal = shaped.link_bits_per_s
    achieved = _throughput(shaped, senders=[0], receiver=2, seconds=2.5)  # node 0 -> node 1
    print(f"link: nominal {nominal / 1e6:.0f} Mbit/s, achieved {achieved / 1e6:.1f} Mbit/s")
    assert 0.70 * nominal <= achieved <= 1.05 * nominal


@needs_root
def test_downlink_is_shaped(shaped):
    """Two nodes sending into a third share its one downlink."""
    nominal = shaped.link_bits_per_s
    achieved = _throughput(shaped, senders=[0, 2], receiver=4, seconds=2.0)
    print(f"incast 2->1: nominal {nominal / 1e6:.0f} Mbit/s, achieved {achieved / 1e6:.1f} Mbit/s")
    assert 0.70 * nominal <= achieved <= 1.05 * nominal


@needs_root
def test_same_node_is_not_shaped(shaped):
    achieved = _throughput(shaped, senders=[1], receiver=0, seconds=1.0)  # both on node 0
    print(f"loopback: {achieved / 1e6:.0f} Mbit/s vs link {shaped.link_bits_per_s / 1e6:.0f} Mbit/s")
    assert achieved >= 3 * shaped.link_bits_per_s


@needs_root
def test_gloo_all_reduce_across_nodes(shaped, tmp_path):
    ranks = [0, shaped.ranks_per_node]  # first rank of node 0 and of node 1
    store = tmp_path / "store"
    before = _tc_sent_bytes(shaped.namespace(0), shaped.ifname(0))
    procs = [subprocess.Popen(_in_ns(shaped, tb_rank, _GLOO, r, len(ranks), store, timeout_s=60),
                              env={**os.environ, **shaped.rank_env(tb_rank)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r, tb_rank in enumerate(ranks)]
    outs = [p.communicate(timeout=70) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.split() == ["3.0", "3.0"]
    # 4 MiB of float32 had to leave node 0 through its shaped uplink, not some other path.
    assert _tc_sent_bytes(shaped.namespace(0), shaped.ifname(0)) - before >= 2 << 20
