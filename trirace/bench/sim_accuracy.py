"""How well the simulator predicts real runs: calibrate on the emulated testbed, measure
every policy with `trirace bench`, simulate the same configuration, and print predicted
vs measured step time and the error per policy.

    sudo .venv/bin/python -m trirace.bench.sim_accuracy [--link 250mbit] [--out docs/bench/sim-accuracy]

The simulation gets what the bench's runs decided (the partition and the rank order) and
the calibration (per-layer times, the link as measured, the data's touched rows); nothing
is fitted to the measured step times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import make_config
from ..runtime.calibrate import profile
from ..sim.cluster import load_cluster
from ..sim.run import simulate
from . import side_by_side

POLICIES = ("blocking", "fifo", "priority", "trirace")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--link", default="250mbit")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default="docs/bench/sim-accuracy")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = make_config({"steps": args.steps})
    print("calibrating ...", file=sys.stderr, flush=True)
    cal = profile(cfg, "testbed", args.link, intra=args.ranks_per_node > 1)
    cal.save(out / "calibration.json")
    print("measuring (trirace bench) ...", file=sys.stderr, flush=True)
    cluster = side_by_side.Cluster(args.nodes, args.ranks_per_node, args.link)
    measured = side_by_side.run(cfg, cluster, POLICIES, args.rounds)
    got = measured["config"]
    job = cfg.model_copy(update={"partition": got["partition"], "rank_order": got["rank_order"]})
    sim_cluster = load_cluster("testbed", args.nodes, args.ranks_per_node, args.link)
    rows = []
    for r in measured["results"]:
        pred = simulate(job, sim_cluster, r["system"], cal)
        rows.append({"policy": r["system"], "measured_s": r["step_time_s"], "predicted_s": pred.iteration_time_s,
                     "error": pred.iteration_time_s / r["step_time_s"] - 1,
                     "measured_exposed_p2p_s": r["exposed_p2p_s"], "predicted_exposed_p2p_s": pred.exposed_comm_s["p2p"],
                     "measured_exposed_allreduce_s": r["exposed_allreduce_s"],
                     "predicted_exposed_allreduce_s": pred.exposed_comm_s["allreduce"] + pred.exposed_comm_s["sparse"]})
    payload = {"config": got, "calibration": str(out / "calibration.json"), "results": rows}
    (out / "accuracy.json").write_text(json.dumps(payload, indent=2) + "\n")
    table = markdown(payload)
    (out / "accuracy.md").write_text(table + "\n")
    print(table)
    return 0


def markdown(payload: dict) -> str:
    c = payload["config"]
    lines = [f"{c['model']} {c['schedule']} pp={c['pp']} dp={c['dp']} m={c['micro_batches']}, "
             f"{c['cluster']['nodes']}x{c['cluster']['ranks_per_node']} @ {c['cluster']['link']}",
             "| policy | measured step (s) | predicted step (s) | error | exposed P2P measured / predicted (s) "
             "| exposed AllReduce measured / predicted (s) |", "|" + "---|" * 6]
    for r in payload["results"]:
        lines.append(f"| {r['policy']} | {r['measured_s']:.3f} | {r['predicted_s']:.3f} | {100 * r['error']:+.1f}% | "
                     f"{r['measured_exposed_p2p_s']:.3f} / {r['predicted_exposed_p2p_s']:.3f} | "
                     f"{r['measured_exposed_allreduce_s']:.3f} / {r['predicted_exposed_allreduce_s']:.3f} |")
    worst = max(abs(r["error"]) for r in payload["results"])
    lines.append(f"worst error {100 * worst:.1f}% (target: within 10%)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
