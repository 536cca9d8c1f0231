"""Build and remove the emulated cluster.

Layout: one namespace per node holding veth `eth0` (10.177.0.<node+1>/24, no default route);
its peer `p<node>` sits on bridge `br0` in a dedicated switch namespace, so the root namespace
is never touched and deleting the namespaces removes every link. tbf on `eth0` shapes the
node's uplink, tbf on `p<node>` its downlink; traffic between ranks of one node goes through
the kernel's local route and is not shaped.
"""

from __future__ import annotations

import fcntl
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from ..errors import UsageError
from .reachability import verify
from .rate import tc_rate
from .shell import require_tools, run
from .topology import BRIDGE, PREFIX_LEN, Testbed, check_prefix, namespace_pattern

STATE_DIR = Path("/run/trirace")  # tmpfs like /run/netns: both vanish together on reboot
NETNS_DIR = Path("/run/netns")
# 64 KiB holds several jumbo frames and gives ~95% of nominal up to 1gbit; above that tbf's
# timer cannot refill such a small bucket in time (64 KiB: 84% at 5gbit), so the bucket grows
# to 0.5 ms of line rate (97% at 5gbit). Never below two frames: tbf drops a frame over burst.
TBF_MIN_BURST_BYTES = 64 * 1024
TBF_BURST_S = 0.0005
TBF_LATENCY = "50ms"


def tbf_burst_bytes(bits_per_s: float, mtu: int) -> int:
    return int(max(TBF_MIN_BURST_BYTES, bits_per_s * TBF_BURST_S / 8, 2 * (mtu + 14)))


def state_path(prefix: str) -> Path:
    return STATE_DIR / f"{check_prefix(prefix)}.json"


def check(nodes: int, ranks_per_node: int, rate: str, mtu: int = 9000) -> None:
    """Would `up` with these settings start on this machine? (One-line UsageError if not.)"""
    Testbed("trirace", nodes, ranks_per_node, rate, mtu)  # validates sizes, rate and MTU
    require_tools()


def up(nodes: int, ranks_per_node: int, rate: str, mtu: int = 9000, prefix: str = "trirace") -> Testbed:
    """Create the testbed (replacing any with the same prefix), prove it carries traffic, record it."""
    testbed = Testbed(prefix=prefix, nodes=nodes, ranks_per_node=ranks_per_node, rate=rate, mtu=mtu)
    require_tools()
    down(prefix)
    try:
        _build(testbed)
        verify(testbed)
    except BaseException:
        down(prefix)  # never leave a half-built testbed behind
        raise
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state_path(prefix).write_text(json.dumps({"testbed": asdict(testbed)}, indent=1) + "\n")
    return testbed


def down(prefix: str = "trirace") -> int:
    """Delete every namespace named like this prefix's testbed (crashed runs included); return how many.

    Processes still running inside a node keep its namespace alive (unnamed) until they exit."""
    check_prefix(prefix)
    require_tools()
    pattern = namespace_pattern(prefix)
    listed = run(["ip", "netns", "list"]).stdout.splitlines()
    mine = sorted(name for name in (line.split()[0] for line in listed if line.strip()) if pattern.fullmatch(name))
    for name in mine:
        run(["ip", "netns", "del", name])
    state_path(prefix).unlink(missing_ok=True)
    return len(mine)


@contextmanager
def held(nodes: int, ranks_per_node: int, rate: str, mtu: int = 9000) -> Iterator[Testbed]:
    """A testbed for the duration of a `with`, torn down after. One user at a time per
    machine: a second would tear this one down under the first's feet."""
    lock_path = STATE_DIR / "bench.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError("another trirace bench or profile is using the emulated testbed on this machine") from None
        tb = up(nodes, ranks_per_node, rate, mtu=mtu)
        try:
            yield tb
        finally:
            down()


@contextmanager
def held_job(nodes: int, ranks_per_node: int, rate: str, mtu: int = 9000) -> Iterator[tuple[Testbed, Path]]:
    """A testbed held as `held` does, with a topology file that tells a job run on it
    where its ranks are (the link's nominal rate; the job probes the real one)."""
    with held(nodes, ranks_per_node, rate, mtu) as tb, tempfile.TemporaryDirectory(prefix="trirace-job-") as tmp:
        topo = Path(tmp) / "topology.yaml"
        topo.write_text(f"nodes: {nodes}\nranks_per_node: {ranks_per_node}\n"
                        f"inter: {{bandwidth: {rate}, latency: 100us}}\n")
        yield tb, topo


def current(prefix: str = "trirace") -> Testbed | None:
    """The testbed recorded for this prefix, or None when there is none or its namespaces are gone."""
    try:
        testbed = Testbed(**json.loads(state_path(prefix).read_text())["testbed"])
    except (OSError, ValueError, KeyError, TypeError, UsageError):  # absent or unreadable: nothing recorded
        return None
    names = [testbed.switch_namespace, *(testbed.namespace(n) for n in range(testbed.nodes))]
    return testbed if all((NETNS_DIR / name).exists() for name in names) else None


def _build(tb: Testbed) -> None:
    sw, mtu = tb.switch_namespace, str(tb.mtu)
    _namespace(sw)
    # addrgenmode none: no IPv6 link-local addresses, so nothing (gloo included) can pick one.
    run(["ip", "-n", sw, "link", "add", BRIDGE, "mtu", mtu, "type", "bridge"])
    run(["ip", "-n", sw, "link", "set", BRIDGE, "addrgenmode", "none"])
    run(["ip", "-n", sw, "link", "set", BRIDGE, "up"])
    for node in range(tb.nodes):
        ns, dev, port = tb.namespace(node), tb.ifname(node), tb.switch_port(node)
        _namespace(ns)
        # Created inside the switch namespace with the peer placed straight into the node's:
        # no interface ever appears in the root namespace, even if we crash halfway.
        run(["ip", "-n", sw, "link", "add", port, "mtu", mtu, "type", "veth", "peer", "name", dev, "mtu", mtu, "netns", ns])
        run(["ip", "-n", ns, "link", "set", dev, "addrgenmode", "none"])
        run(["ip", "-n", ns, "addr", "add", f"{tb.address(node)}/{PREFIX_LEN}", "dev", dev])
        run(["ip", "-n", ns, "link", "set", dev, "up"])
        run(["ip", "-n", sw, "link", "set", port, "addrgenmode", "none"])
        run(["ip", "-n", sw, "link", "set", port, "master", BRIDGE, "up"])
        _shape(tb, ns, dev)  # uplink
        _shape(tb, sw, port)  # downlink


def _namespace(name: str) -> None:
    run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "up"])


def _shape(tb: Testbed, ns: str, dev: str) -> None:
    run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
         "rate", tc_rate(tb.link_bits_per_s), "burst", str(tbf_burst_bytes(tb.link_bits_per_s, tb.mtu)), "latency", TBF_LATENCY])
