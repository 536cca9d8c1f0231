"""The names and addresses of an emulated cluster; pure, so it can be used without root."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError
from .rate import parse_rate

SUBNET = "10.177.0"  # private /24; node i is SUBNET.(i+1); nothing else is reachable
PREFIX_LEN = 24
MAX_NODES = 250
IFNAME = "eth0"  # the node's veth end; the same name in every node namespace
BRIDGE = "br0"  # lives in the switch namespace, so the root namespace gains nothing
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,23}")


def check_prefix(prefix: str) -> str:
    # No '-' in a prefix: our names are "<prefix>-sw" / "<prefix>-n<i>", so prefix "a" can never
    # match (and delete) the namespaces of prefix "a-b".
    if not _PREFIX.fullmatch(prefix):
        raise UsageError(f"testbed prefix {prefix!r} must be 1-24 letters, digits or '_', starting with a letter or digit")
    return prefix


def namespace_pattern(prefix: str) -> re.Pattern[str]:
    """Exactly the namespace names a testbed with this prefix creates."""
    return re.compile(rf"{re.escape(prefix)}-(?:sw|n\d+)")


@dataclass(frozen=True)
class Testbed:
    __test__ = False  # its name starts with "Test"; keeps pytest from collecting it where imported

    prefix: str
    nodes: int
    ranks_per_node: int
    rate: str
    mtu: int

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        if not 1 <= self.nodes <= MAX_NODES:
            raise UsageError(f"testbed nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        if self.ranks_per_node < 1:
            raise UsageError(f"testbed ranks per node must be at least 1, got {self.ranks_per_node}")
        if not 576 <= self.mtu <= 65535:
            raise UsageError(f"testbed MTU must be between 576 and 65535, got {self.mtu}")
        parse_rate(self.rate)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def link_bits_per_s(self) -> float:
        return parse_rate(self.rate)

    @property
    def switch_namespace(self) -> str:
        return f"{self.prefix}-sw"

    def namespace(self, node: int) -> str:
        return f"{self.prefix}-n{self._node(node)}"

    def ifname(self, node: int) -> str:
        self._node(node)
        return IFNAME

    def switch_port(self, node: int) -> str:
        """The bridge-side veth end of a node (its egress is the node's downlink)."""
        return f"p{self._node(node)}"

    def address(self, node: int) -> str:
        return f"{SUBNET}.{self._node(node) + 1}"

    def node_of_rank(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise UsageError(f"rank {rank} is outside the testbed's world of {self.world_size}")
        return rank // self.ranks_per_node

    def rank_command(self, rank: int) -> list[str]:
        """argv prefix that runs a command inside the rank's node namespace."""
        return ["ip", "netns", "exec", self.namespace(self.node_of_rank(rank))]

    def rank_env(self, rank: int) -> dict[str, str]:
        """Environment for a rank: gloo (and tensorpipe) must bind the node's veth, not lo;
        MASTER_ADDR points env:// rendezvous at node 0, since 127.0.0.1 differs per namespace."""
        node = self.node_of_rank(rank)
        return {
            "GLOO_SOCKET_IFNAME": self.ifname(node),
            "TP_SOCKET_IFNAME": self.ifname(node),
            "MASTER_ADDR": self.address(0),
        }

    def _node(self, node: int) -> int:
        if not 0 <= node < self.nodes:
            raise UsageError(f"node {node} is outside the testbed's {self.nodes} nodes")
        return node
