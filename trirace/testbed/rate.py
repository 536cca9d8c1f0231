"""Link rates written the way tc writes them ("250mbit"), as bits per second."""

from __future__ import annotations

import re

from ..errors import UsageError

# tc's decimal units; "bps" suffixes are refused because tc reads them as BYTES per second,
# which is almost never what someone typing "100mbps" means.
_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_PATTERN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*", re.IGNORECASE)


def parse_rate(text: str) -> float:
    """Bits per second for "250mbit", "1gbit", "100kbit", "2.5gbit"."""
    match = _PATTERN.fullmatch(str(text))
    if match is None or match.group(2).lower() not in _UNITS:
        raise UsageError(f"link rate {text!r} is not a rate; write e.g. '250mbit' or '1gbit' (units: bit, kbit, mbit, gbit, tbit)")
    bits = float(match.group(1)) * _UNITS[match.group(2).lower()]
    # Below ~1 kbit/s a single jumbo frame takes over a minute: certainly a typo.
    if bits < 1e3:
        raise UsageError(f"link rate {text!r} is too low; use at least 1kbit")
    return bits


def tc_rate(bits_per_s: float) -> str:
    """The rate as tc's exact integer form, so tc never rounds the user's text differently."""
    return f"{int(round(bits_per_s))}bit"
