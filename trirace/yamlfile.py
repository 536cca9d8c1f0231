"""Reading a YAML mapping from a file the user named, with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import UsageError


def read_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """The file's top-level mapping ({} for an empty file); `what` names it in errors."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} not found: {p}")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{what} {p} is not readable text: {getattr(e, 'strerror', None) or e.reason}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"malformed YAML in {what} {p}{where}: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{what} {p}: expected a mapping of keys to values, got {type(data).__name__}")
    return data
