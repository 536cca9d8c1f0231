"""Benchmark this tree against an earlier revision: `trirace bench` of each, alternately
(old new new old old new ...), one round per invocation, and a table of medians, ranges
and ratios. Run as root (the bench builds the emulated testbed):

    sudo .venv/bin/python scripts/bench_against.py 1b3ad4c --rounds 3 --systems fifo,priority,trirace

The revision is checked out into a temporary git worktree and imported from there by this
tree's interpreter (PYTHONPATH), so both run with the same torch and packages. Extra
arguments after `--` go to both benches (e.g. `-- --nodes 2 --ranks-per-node 2`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def bench(root: Path, out: Path, systems: str, extra: list[str]) -> dict[str, float]:
    cmd = ["timeout", "1800", sys.executable, "-m", "trirace.cli", "bench", "--rounds", "1",
           "--systems", systems, "--out", str(out), *extra]
    run = subprocess.run(cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"bench in {root} failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:]}")
    return {r["system"]: r["step_time_s"] for r in json.loads((out / "bench.json").read_text())["results"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revision", help="the git revision to compare against (e.g. a commit)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per tree (default: 3)")
    p.add_argument("--systems", default="blocking,fifo,priority,trirace", help="as for trirace bench")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    times: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="trirace-against-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), args.revision], cwd=HERE, check=True,
                       capture_output=True)
        try:
            for r in range(args.rounds):
                for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    root = old if name == "before" else HERE
                    got = bench(root, Path(tmp) / f"{name}-{r}", args.systems, extra)
                    for system, t in got.items():
                        times[name].setdefault(system, []).append(t)
                    print(f"round {r} {name}: " + ", ".join(f"{s} {t:.3f} s" for s, t in got.items()), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=HERE, capture_output=True)
    print(f"\n| system | {args.revision} step (s) | this tree step (s) | this tree / {args.revision} |")
    print("|---|---|---|---|")
    for s, before in times["before"].items():
        after = times["after"][s]
        mb, ma = statistics.median(before), statistics.median(after)
        print(f"| {s} | {mb:.3f} ({min(before):.3f}-{max(before):.3f}) | {ma:.3f} ({min(after):.3f}-{max(after):.3f}) "
              f"| {ma / mb:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
