"""The benchmark matrix: every system side by side (bench/side_by_side.py) in every cell of
emulated clusters x link rates, and how trirace fares against the best other in each.

    trirace bench --matrix [--out DIR] [--rounds 3]

Cells: 4 nodes x 1 rank (every stage's reduction crosses the network, next to its P2P)
and 2 nodes x 2 ranks (replicas share a node; P2P crosses), each at 500, 250, 100 and 50
Mbit. A cell's JSON is written as soon as it is measured, so a stopped matrix keeps what
it finished. Per cell: each system's median step and its rounds' spread, trirace over the
best other system (the other's step over trirace's: above 1 trirace is faster), exposed
P2P per policy, and overlap efficiency against the shared lower bound.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..config import TrainConfig
from ..runtime.launch import WorkerFailed
from . import side_by_side
from .side_by_side import Cluster

SHAPES = ((4, 1), (2, 2))
RATES = ("500mbit", "250mbit", "100mbit", "50mbit")


def cells() -> list[Cluster]:
    return [Cluster(nodes, rpn, rate) for nodes, rpn in SHAPES for rate in RATES]


def cell_name(c: Cluster) -> str:
    return f"{c.nodes}x{c.ranks_per_node} @ {c.link}"


def check(base: TrainConfig) -> None:
    for c in cells():
        side_by_side.check(base, c)


def summarize(payload: dict) -> dict:
    """One cell's verdict: trirace against the best other system, and against its bound."""
    res = {r["system"]: r for r in payload["results"]}
    tri = res["trirace"]
    others = {s: r for s, r in res.items() if s != "trirace"}
    best = min(others, key=lambda s: others[s]["step_time_s"])
    spread = lambda r: max(r["round_steps_s"]) - min(r["round_steps_s"])  # noqa: E731
    return {
        "trirace_s": tri["step_time_s"], "trirace_spread_s": spread(tri),
        "best_other": best, "best_other_s": others[best]["step_time_s"], "best_other_spread_s": spread(others[best]),
        "ratio": others[best]["step_time_s"] / tri["step_time_s"],
        "exposed_p2p_s": {s: r["exposed_p2p_s"] for s, r in res.items() if r["exposed_p2p_s"] is not None},
        "efficiency": {s: r["overlap_efficiency"] for s, r in res.items()},
        "bound_s": tri["lower_bound_s"],
        "losses_identical": len({tuple(r["losses"]) for s, r in res.items() if s != "torch-1f1b"}) == 1,
    }


def run(base: TrainConfig, systems: tuple[str, ...], rounds: int, out: Path) -> list[dict]:
    check(base)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.monotonic()
    todo = cells()
    for i, c in enumerate(todo):
        print(f"[{i + 1}/{len(todo)}] {cell_name(c)}: {', '.join(systems)}, {rounds} round(s) "
              f"[{time.monotonic() - t0:.0f} s]", file=sys.stderr, flush=True)
        try:
            payload = side_by_side.run(base, c, systems, rounds)
        except WorkerFailed as e:  # one retry, said out loud: a crash is a bug to report, not to average away
            print(f"    {cell_name(c)}: {e}; running the cell once more", file=sys.stderr, flush=True)
            payload = side_by_side.run(base, c, systems, rounds)
            payload["retried_after"] = str(e)
        row = {"cell": cell_name(c), "cluster": {"nodes": c.nodes, "ranks_per_node": c.ranks_per_node,
                                                  "link": c.link}, **summarize(payload), "payload": payload}
        rows.append(row)
        (out / "matrix.json").write_text(json.dumps(rows, indent=2))  # what is measured stays measured
        print(f"    trirace {row['trirace_s']:.3f} s, best other {row['best_other']} {row['best_other_s']:.3f} s: "
              f"{row['ratio']:.2f}x", file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| cell | trirace (s) | best other (s) | trirace / best other | exposed P2P trirace / fifo (s) | "
            "efficiency trirace | lower bound (s) | losses identical |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        p2p = r["exposed_p2p_s"]
        lines.append(f"| {r['cell']} | {r['trirace_s']:.3f} ± {r['trirace_spread_s'] / 2:.3f} | {r['best_other']} "
                     f"{r['best_other_s']:.3f} ± {r['best_other_spread_s'] / 2:.3f} | {r['ratio']:.2f}x | "
                     f"{p2p.get('trirace', float('nan')):.3f} / {p2p.get('fifo', float('nan')):.3f} | "
                     f"{r['efficiency']['trirace']:.2f} | {r['bound_s']:.3f} | {'yes' if r['losses_identical'] else 'NO'} |")
    lines.append("")
    lines.append("± is half the range of the rounds' medians. Per cell, every system:")
    for r in rows:
        lines += ["", f"### {r['cell']}", "", side_by_side.markdown(r["payload"])]
    return "\n".join(lines)


def heatmap(rows: list[dict], path: Path) -> None:
    """trirace / best other per cell: shapes down, link rates across."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = [f"{n}x{r}" for n, r in SHAPES]
    grid = [[float("nan")] * len(RATES) for _ in shapes]
    for row in rows:
        c = row["cluster"]
        grid[shapes.index(f"{c['nodes']}x{c['ranks_per_node']}")][RATES.index(c["link"])] = row["ratio"]
    fig, ax = plt.subplots(figsize=(6.4, 2.8), dpi=120)
    im = ax.imshow(grid, cmap="RdYlGn", vmin=0.8, vmax=1.2)
    for i, line in enumerate(grid):
        for j, v in enumerate(line):
            ax.text(j, i, "-" if v != v else f"{v:.2f}x", ha="center", va="center", fontsize=10)
    ax.set_xticks(range(len(RATES)), RATES)
    ax.set_yticks(range(len(shapes)), [f"{s} nodes x ranks" for s in shapes])
    ax.set_title("trirace speed over the best other system (>1: trirace faster)", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
