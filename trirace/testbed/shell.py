"""Running ip/tc: every command is bounded by `timeout`, and a refusal becomes one UsageError line."""

from __future__ import annotations

import os
import shutil
import subprocess

from ..errors import UsageError

COMMAND_TIMEOUT_S = 20


def require_tools() -> None:
    """Fail early, with the fix, when this machine cannot host a testbed at all."""
    if os.geteuid() != 0:
        raise UsageError("testbed needs root (network namespaces and tc)")
    for tool in ("ip", "tc", "timeout"):
        if shutil.which(tool) is None:
            raise UsageError(f"testbed needs '{tool}' on PATH (install iproute2 / coreutils)")


def run(argv: list[str], *, check: bool = True, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run argv under `timeout`; with check, a failure raises UsageError naming the command and the kernel's reason."""
    proc = subprocess.run(["timeout", "-k", "2", str(timeout_s), *argv], capture_output=True, text=True)
    if check and proc.returncode != 0:
        if proc.returncode in (124, 137):
            reason = f"timed out after {timeout_s:g}s"
        else:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            reason = lines[0] if lines else f"exit status {proc.returncode}"
        raise UsageError(f"testbed: '{' '.join(argv)}' failed: {reason}")
    return proc
