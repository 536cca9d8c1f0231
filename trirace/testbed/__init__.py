"""An emulated multi-node cluster on one machine: network namespaces joined by rate-limited links.

    tb = up(nodes=2, ranks_per_node=2, rate="250mbit")   # root; replaces a testbed of the same prefix
    argv = [*tb.rank_command(rank), sys.executable, "-m", "trirace.runtime.worker", ...]
    env = {**os.environ, **tb.rank_env(rank)}
    down()                                               # -> namespaces removed
"""

from .cluster import check, current, down, held, held_job, up
from .rate import parse_rate
from .topology import Testbed

__all__ = ["Testbed", "check", "current", "down", "held", "held_job", "parse_rate", "up"]
