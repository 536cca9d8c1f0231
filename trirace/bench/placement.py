"""Does auto placement pick the fastest rank order? Over a grid of cluster presets, models
and pp x dp layouts (dp and pp larger than a node included), simulate every candidate
order explicitly and compare auto's pick with the best; check that no simulated policy
beats the lower bound.

    python -m trirace.bench.placement [--out docs/benchmarks/placement] [--steps 6]

Auto's pick is what `plan_job` chooses for the job (its analytic prediction); its time is
the simulated time of that order, so the table says how much the prediction leaves on the
table against an exhaustive simulated search.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..policy.policies import POLICIES
from ..config import TrainConfig, make_config
from ..plan.planner import plan_job
from ..plan.placement import candidates
from ..plan.topology import INTER
from ..sim.cluster import Cluster, load_cluster
from ..sim.compute import ComputeModel
from ..sim.simulate import simulate

# (preset, ranks per node or None for the preset's, model, pp, dp, micro-batches, micro-batch size)
GRID = [
    ("a100-roce", None, "gpt2-xl", 8, 16, 16, 1),
    ("a100-roce", None, "gpt2-medium", 4, 16, 8, 2),
    ("a100-roce", None, "gpt2-medium", 16, 2, 16, 2),
    ("a100-ib", None, "gpt2-xl", 8, 16, 16, 1),
    ("a100-ib", None, "gpt2-medium", 4, 32, 8, 2),
    ("h100-ib", None, "gpt2-xl", 16, 4, 16, 1),
    ("h100-ib", None, "gpt2-medium", 2, 16, 8, 2),
    ("testbed", 2, "gpt2-medium", 4, 4, 4, 1),
    ("testbed", 4, "gpt2-xl", 8, 2, 8, 1),
]


def cell_config(model: str, pp: int, dp: int, m: int, mbs: int, steps: int, **kw) -> TrainConfig:
    return make_config(dict(model=model, pp=pp, dp=dp, micro_batches=m, micro_batch_size=mbs, seq_len=1024,
                            steps=steps, data="synthetic", **kw))


def auto_order(cfg: TrainConfig, cluster: Cluster) -> str:
    """The order plan_job picks for `cfg` on `cluster`, from the simulator's compute model."""
    compute = ComputeModel.build(cfg.spec, cfg.parallel.micro_batch_size, cfg.tokens_seq, cluster.device, cfg.optim.optimizer)
    times = [f + b for f, b in zip(compute.forward_s, compute.backward_s)]
    return plan_job(cfg, cluster.topology(cfg.world_size), lambda: times,
                    collective_factor=cluster.collective_factor(INTER)).layout.order


def run_cell(preset: str, rpn: int | None, model: str, pp: int, dp: int, m: int, mbs: int, steps: int = 6,
             policies: tuple[str, ...] = ("trirace",)) -> dict:
    """Simulated time of every candidate order (and every policy of `policies` on it)."""
    cluster = load_cluster(preset, ranks_per_node=rpn)
    cfg = cell_config(model, pp, dp, m, mbs, steps)
    topo = cluster.topology(cfg.world_size)
    times: dict[str, float] = {}
    beaten = []
    for order in candidates(pp, dp, topo):
        for policy in policies:
            r = simulate(cfg.with_(rank_order=order), cluster, policy)
            if policy == "trirace":
                times[order] = r.iteration_time_s
            if r.iteration_time_s < r.lower_bound_s * (1 - 1e-9):
                beaten.append(f"{order}/{policy}: {r.iteration_time_s:.4f} s < bound {r.lower_bound_s:.4f} s")
    auto = auto_order(cfg, cluster)
    best = min(times, key=times.get)
    return {"cell": f"{preset}{f' x{rpn}' if rpn else ''} {model} pp={pp} dp={dp} m={m}", "auto": auto,
            "auto_s": times[auto], "best": best, "best_s": times[best], "times": times,
            "auto_over_best": times[auto] / times[best], "bound_beaten": beaten}


def markdown(rows: list[dict]) -> str:
    lines = ["| cell | auto picks | auto (s) | best order | best (s) | auto / best | candidates (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        cands = ", ".join(f"{o} {t:.3f}" for o, t in sorted(r["times"].items(), key=lambda kv: kv[1]))
        lines.append(f"| {r['cell']} | {r['auto']} | {r['auto_s']:.3f} | {r['best']} | {r['best_s']:.3f} | "
                     f"{r['auto_over_best']:.3f} | {cands} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/benchmarks/placement", help="where placement.md goes")
    ap.add_argument("--steps", type=int, default=6, help="simulated steps per run (default: 6)")
    ap.add_argument("--all-policies", action="store_true", help="check the bound under every policy, not only trirace")
    args = ap.parse_args(argv)
    rows = []
    t0 = time.monotonic()
    for cell in GRID:
        rows.append(run_cell(*cell, steps=args.steps,
                             policies=POLICIES if args.all_policies else ("trirace",)))
        r = rows[-1]
        print(f"{r['cell']}: auto {r['auto']} {r['auto_s']:.3f} s, best {r['best']} {r['best_s']:.3f} s "
              f"({r['auto_over_best']:.3f}x){' BOUND BEATEN: ' + '; '.join(r['bound_beaten']) if r['bound_beaten'] else ''}"
              f" [{time.monotonic() - t0:.0f} s]", file=sys.stderr, flush=True)
    table = markdown(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "placement.md").write_text(f"`python -m trirace.bench.placement --steps {args.steps}`\n\n{table}\n")
    print(table)
    worst = max(r["auto_over_best"] for r in rows)
    beaten = sum(len(r["bound_beaten"]) for r in rows)
    print(f"\nworst auto / best: {worst:.3f}; runs beating the bound: {beaten}")
    return 0 if worst <= 1.01 and not beaten else 1


if __name__ == "__main__":
    sys.exit(main())
