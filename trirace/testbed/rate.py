"""Link rates written the way tc writes them ("250mbit"), as bits per second."""

from __future__ import annotations

from ..errors import UsageError
from ..plan.topology import parse_rate as topology_rate

def parse_rate(text: str) -> float:
    """Bits per second for "250mbit", "1gbit", "100kbit", "2.5gbit": the topology's parser,
    restricted to tc's bit units (what a link rate is written in) and to sane values."""
    try:
        bits = topology_rate(str(text))
    except UsageError:
        bits = None
    if bits is None or not str(text).strip().lower().endswith("bit"):
        raise UsageError(f"link rate {text!r} is not a rate; write e.g. '250mbit' or '1gbit' (units: bit, kbit, mbit, gbit, tbit)")
    # Below ~1 kbit/s a single jumbo frame takes over a minute: certainly a typo.
    if bits < 1e3:
        raise UsageError(f"link rate {text!r} is too low; use at least 1kbit")
    return bits


def tc_rate(bits_per_s: float) -> str:
    """The rate as tc's exact integer form, so tc never rounds the user's text differently."""
    return f"{int(round(bits_per_s))}bit"
