"""Reading the JSON files trirace saves: each carries its format number, and a file of
another format, or not one of ours at all, is refused in one line (UsageError) that says
what to do, instead of being half-read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import UsageError


def load_versioned(path: str | Path, what: str, key: str, version: int, again: str,
                   missing: str = "") -> dict[str, Any]:
    """The JSON object at `path`, whose `key` must equal `version`. `what` names the file in
    messages ("calibration file x.json"); `again` says how to make a current one;
    `missing` is added when the file does not exist."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"{what} does not exist{missing}") from None
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, or not JSON
        raise UsageError(f"{what}: not one trirace wrote ({e})") from None
    if not isinstance(data, dict) or key not in data:
        raise UsageError(f"{what}: not one trirace wrote (no format {key})")
    if data[key] != version:
        raise UsageError(f"{what}: format {key} {data[key]!r}, this trirace reads {key} {version}: {again}")
    return data
