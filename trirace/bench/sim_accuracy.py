"""How well the simulator predicts real runs: calibrate on the emulated testbed once per
link rate, measure every policy with `trirace bench`, simulate the same configuration,
and report predicted against measured step time, and exposed time per kind, per policy.

    python -m trirace.bench.sim_accuracy [--link 250mbit] [--layout 4x1]
                                              one cell (root)
    python -m trirace.bench.sim_accuracy --matrix             the bench matrix's 8 cells,
                                              each rate's two after its calibration
    python -m trirace.bench.sim_accuracy --resimulate DIR/accuracy.json
                                              predict again from the saved measurements

The simulation gets what the bench's runs decided (the partition and the rank order) and
the calibration (per-layer times, the links as measured, the shared cores' throughput
and spread, the CPU cost of transfers, the data's touched rows); nothing is fitted to the
measured step times. Each row also gives the prediction with the replicas folded.
Measurements are saved as each cell finishes, so a stopped matrix keeps what it measured,
and `--resimulate` re-predicts them after a simulator change without measuring again.

The host drifts: a cell measured while it runs slower than at its calibration is
predicted too fast. So each cell also records the host as it was there: one micro-batch's
compute before and after it, measured as the calibration measures it, one thread's memory
copying speed (as beside the calibration's compute timings), and the shared cores'
contention curve after it; a column predicts with the host re-measured, to tell the
host's drift from the model's error.
Beside each prediction stand the CPU seconds per step every rank's process used (all its
threads; each rank's median steady step, summed) and what the simulator charged the
shared cores (computation and transfers; the mean of its steady steps): where the cores
bind, a step cannot be predicted closer than that CPU is.
Step times on shared cores spread widely, so a median of a few steps is itself uncertain
by a few percent. So every steady step is kept, and each measured median comes with a 95%
bootstrap interval: a miss whose prediction is within 5% of some value in that interval
cannot be told from the measurement's own uncertainty.
Writes accuracy.json, accuracy.md and accuracy.png (predicted against measured) to --out.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from ..calibrate.layers import compute_now, copy_rate
from ..calibrate.profile import profile
from ..calibrate.testbed_contention import in_unit, steady_contention
from ..config import TrainConfig, make_config
from ..saved import load_versioned
from ..errors import UsageError
from ..runtime import allocator
from ..sim.calibration import Calibration, load_calibration
from ..sim.cluster import load_cluster
from ..sim.simulate import simulate
from . import matrix, side_by_side

POLICIES = ("blocking", "fifo", "priority", "trirace")
TARGET = 0.05  # |predicted - measured| / measured: the simulator's goal
VERSION = 1  # accuracy.json's format: --resimulate refuses any other


def load_accuracy(path: Path) -> dict:
    """A saved accuracy.json, refused in one line (UsageError) where it is not one of this format."""
    return load_versioned(path, f"sim-accuracy file {path}", "version", VERSION, "measure again")


def _layout(text: str) -> tuple[int, int]:
    """--layout's NODESxRANKS: (nodes, ranks per node)."""
    if not (m := re.fullmatch(r"([1-9]\d*)x([1-9]\d*)", text)):
        raise argparse.ArgumentTypeError(f"{text!r}: want NODESxRANKS, like 4x1 or 2x2")
    return int(m[1]), int(m[2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--link", default="250mbit", help="the one cell's rate; ignored with --matrix")
    ap.add_argument("--layout", type=_layout, default="4x1", metavar="NODESxRANKS",
                    help="the one cell's nodes x ranks per node; ignored with --matrix")
    ap.add_argument("--matrix", action="store_true", help="every cell of trirace bench --matrix")
    ap.add_argument("--resimulate", metavar="JSON", help="predict again from a saved accuracy.json")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12, help="per run: the first 2 and the last 2 are not steady")
    ap.add_argument("--out", default="docs/benchmarks/sim-accuracy")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.resimulate:
        saved = Path(args.resimulate)
        try:
            payload = load_accuracy(saved)
            for cell in payload["cells"]:  # the calibrations travel with the measurements, into --out
                if not (out / cell["calibration"]).exists():
                    shutil.copyfile(saved.parent / cell["calibration"], out / cell["calibration"])
                cell["results"] = predict(cell, out)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        allocator.use()  # the runs' allocator for the calibration and compute_now too (they time in this process)
        cfg = make_config({"steps": args.steps})
        cells = by_rate(matrix.cells()) if args.matrix else [side_by_side.Cluster(*args.layout, args.link)]
        for c in cells:
            try:
                side_by_side.check(cfg, c)
            except UsageError as e:
                ap.error(str(e))
        payload = {"version": VERSION, "rounds": args.rounds, "steps": args.steps, "cells": []}
        calibrations: dict[str, str] = {}
        for i, c in enumerate(cells):
            if c.link not in calibrations:  # once per rate, for every cell at that rate
                print(f"calibrating at {c.link} ...", file=sys.stderr, flush=True)
                path = out / f"calibration-{c.link}.json"
                profile(cfg, "testbed", c.link, contention=True).save(path)
                calibrations[c.link] = path.name  # beside accuracy.json
            print(f"[{i + 1}/{len(cells)}] measuring {matrix.cell_name(c)} ...", file=sys.stderr, flush=True)
            # the host's speed before and after, against its calibration's (it drifts)
            cal = load_calibration(out / calibrations[c.link])
            before, copy_before = compute_now(cfg, cal.threads), copy_rate()
            measured = side_by_side.run(cfg, c, POLICIES, args.rounds)
            after, copy_after = compute_now(cfg, cal.threads), copy_rate()
            # the shared cores as the cell left them, beside the calibration's wake-ups
            contention, refused = steady_contention(
                cfg, cal.threads, wake_hz=cal.comm_wakeups_hz,
                say=lambda w: print(f"after the cell: {w}", file=sys.stderr))
            cell = {"name": matrix.cell_name(c), "cluster": [c.nodes, c.ranks_per_node, c.link],
                    "config": measured["config"], "calibration": calibrations[c.link],
                    "compute_s": [before, after], "copy_bytes_per_s": [copy_before, copy_after],
                    "contention_after": {"throughput": contention.throughput, "spread": contention.spread,
                                         "unit_s": contention.best_s, "refused": refused},
                    "measured": [{k: r[k] for k in ("system", "step_time_s", "round_steps_s", "exposed_p2p_s",
                                                      "exposed_allreduce_s", "compute_cpu_s", "cpu_s", "wakeups_hz",
                                                      "steps_s", "steps_cpu_s", "host_cpu_share")}
                                 for r in measured["results"]]}
            cell["results"] = predict(cell, out)
            payload["cells"].append(cell)
            (out / "accuracy.json").write_text(json.dumps(payload, indent=2) + "\n")  # kept if a later cell fails
    (out / "accuracy.json").write_text(json.dumps(payload, indent=2) + "\n")
    table = markdown(payload, out)
    (out / "accuracy.md").write_text(table + "\n")
    scatter(payload, out / "accuracy.png")
    print(table)
    return 0


def by_rate(cells: list[side_by_side.Cluster]) -> list[side_by_side.Cluster]:
    """The cells in the order to measure them: each rate's right after its calibration, the
    layouts alternating which goes first from one rate to the next, so neither layout's
    cells are always the older. In the bench's order (every 4x1 cell, then every 2x2 one)
    each 2x2 cell would run long after its calibration and each 4x1 one right after, and
    the host drifts in between."""
    rates = list(dict.fromkeys(c.link for c in cells))
    out = []
    for i, rate in enumerate(rates):
        here = [c for c in cells if c.link == rate]
        out += here[::-1] if i % 2 else here
    return out


def predict(cell: dict, where: Path) -> list[dict]:
    """Simulate every measured policy of a cell with the cell's own plan and calibration
    (a file in `where`)."""
    nodes, rpn, link = cell["cluster"]
    job = cell_job(cell)
    cal = load_calibration(where / cell["calibration"])
    cluster = load_cluster("testbed", nodes, rpn, link)
    rows = []
    for m in cell["measured"]:
        pred = simulate(job, cluster, m["system"], cal)
        # the lockstep fold beside it: what simulating the replicas themselves changes
        folded = simulate(job, cluster, m["system"], cal, unfold=False)
        at_host, speed = at_host_speed(cal, statistics.mean(cell["compute_s"]), cell["contention_after"])
        row = {"host_compute": speed,
               "host_compute_error": simulate(job, cluster, m["system"], at_host).iteration_time_s / m["step_time_s"] - 1,
               "measured_cpu_s": sum(m["cpu_s"])}
        if m.get("wakeups_hz"):  # none where the host has no /proc
            row["measured_wakeups_hz"] = statistics.fmean(m["wakeups_hz"])
        if m.get("host_cpu_share"):  # none where the host has no /proc, or no tick passed
            row["measured_host_cpu_share"] = m["host_cpu_share"]
        if cluster.shared_cores:  # the cores' time the simulation left to no rank
            row["predicted_idle_share"] = max(
                1 - sum(pred.cpu_s_per_step.values()) / (cluster.shared_cores * pred.iteration_time_s), 0.0)
        row["predicted_cpu_s"] = pred.cpu_s_per_step
        rows.append({"policy": m["system"], "measured_s": m["step_time_s"], "predicted_s": pred.iteration_time_s,
                     "error": pred.iteration_time_s / m["step_time_s"] - 1,
                     "folded_error": folded.iteration_time_s / m["step_time_s"] - 1, **row,
                     "rounds_s": m["round_steps_s"],
                     "interval_s": median_interval(m["steps_s"]),
                     "measured_exposed_p2p_s": m["exposed_p2p_s"], "predicted_exposed_p2p_s": pred.exposed_comm_s["p2p"],
                     "measured_exposed_allreduce_s": m["exposed_allreduce_s"],
                     "predicted_exposed_allreduce_s": pred.exposed_comm_s["allreduce"] + pred.exposed_comm_s["sparse"]})
    return rows


def median_interval(rounds: list[list[float]], draws: int = 2000, seed: int = 0) -> list[float]:
    """95% interval of the median of every round's steps pooled: a bootstrap that draws
    each round's steps again from that round (rounds run minutes apart: the host drifts
    between them, not within one), seeded so a report is repeatable."""
    rng = random.Random(seed)
    got = sorted(statistics.median([x for r in rounds for x in rng.choices(r, k=len(r))]) for _ in range(draws))
    return [got[int(0.025 * draws)], got[int(0.975 * draws) - 1]]


def consistent(r: dict) -> bool:
    """Whether a prediction is within the target of some value in its measured interval."""
    lo, hi = r["interval_s"]
    return (1 - TARGET) * lo <= r["predicted_s"] <= (1 + TARGET) * hi


def cell_job(cell: dict) -> TrainConfig:
    """The job a cell ran: its recorded plan (the partition and rank order the bench chose)."""
    got = cell["config"]
    return make_config({k: got[k] for k in ("model", "pp", "dp", "schedule", "micro_batches", "micro_batch_size",
                                            "seq_len", "steps", "partition", "rank_order", "seed", "optimizer")})


def at_host_speed(cal: Calibration, seconds: float, contention: dict) -> tuple[Calibration, float]:
    """`cal` as the host was at the cell: every layer's time scaled so that one
    micro-batch's forward and backward takes `seconds` (the calibration's compute measured
    again, alone and the same way, before and after the cell: their mean), and the shared
    cores' contention curve and spread measured again after it, counted in the re-measured
    iteration; and the compute's ratio to the calibration's."""
    scale = seconds / cal.iteration_s
    cal = replace(cal, cpu_throughput=in_unit(contention["throughput"], contention["unit_s"], seconds),
                  compute_spread=list(contention["spread"]))
    return replace(cal, forward_s=[t * scale for t in cal.forward_s],
                   backward_s=[t * scale for t in cal.backward_s]), scale


def markdown(payload: dict, where: Path) -> str:
    c0 = payload["cells"][0]["config"]
    lines = [f"{c0['model']} {c0['schedule']} pp={c0['pp']} dp={c0['dp']} m={c0['micro_batches']}, "
             f"{payload['rounds']} rounds x {payload['steps']} steps per policy per cell; error = predicted / "
             "measured - 1",
             "", "| cell | policy | measured step (s) [its 95% interval] | rounds' medians (s) | predicted step (s) | error "
             "| error, replicas folded | error, host re-measured at the cell (compute: its / calibration's) "
             "| CPU per step, all ranks: measured / simulated (s) "
             "| exposed P2P measured / predicted (s) | exposed AllReduce measured / predicted (s) |",
             "|" + "---|" * 11]
    errors, folded, at_host, cpu_ratio, woke = [], [], [], [], {}
    for cell in payload["cells"]:
        for r in cell["results"]:
            errors.append(abs(r["error"]))
            folded.append(abs(r["folded_error"]))
            at_host.append(abs(r["host_compute_error"]))
            host = f"{100 * r['host_compute_error']:+.1f}% ({r['host_compute']:.2f}x)"
            run = "-"
            if r["predicted_cpu_s"]:  # none where the ranks do not share cores
                sim_cpu, ran = sum(r["predicted_cpu_s"].values()), r["measured_cpu_s"]
                run = f"{ran:.2f} / {sim_cpu:.2f}"
                cpu_ratio.append(sim_cpu / ran)
            if "measured_wakeups_hz" in r:
                woke.setdefault(r["policy"], []).append(r["measured_wakeups_hz"])
            interval = f" [{r['interval_s'][0]:.3f}-{r['interval_s'][1]:.3f}]"
            lines.append(f"| {cell['name']} | {r['policy']} | {r['measured_s']:.3f}{interval} | "
                         f"{' '.join(f'{x:.3f}' for x in r['rounds_s'])} | {r['predicted_s']:.3f} | "
                         f"{100 * r['error']:+.1f}% | {100 * r['folded_error']:+.1f}% | {host} | {run} | "
                         f"{r['measured_exposed_p2p_s']:.3f} / "
                         f"{r['predicted_exposed_p2p_s']:.3f} | {r['measured_exposed_allreduce_s']:.3f} / "
                         f"{r['predicted_exposed_allreduce_s']:.3f} |")
    lines += ["", summary(errors), misses(payload), f"With the replicas folded into one per stage: {summary(folded)}"]
    lines.append(f"With the host re-measured at each cell: {summary(at_host)}")
    if cpu_ratio:
        cpu_ratio.sort()
        lines.append(f"The simulated CPU per step over the measured (every thread of every rank): median "
                     f"{statistics.median(cpu_ratio):.2f}, {cpu_ratio[0]:.2f}-{cpu_ratio[-1]:.2f}")
    if woke:
        lines.append("A rank's other threads (its communication) woke (per second, the ranks' mean, over the cells): " + "; ".join(
            f"{p} {min(v):.0f}-{max(v):.0f}" for p, v in woke.items()) + " (the calibrations' job: below)")
    return "\n".join(lines + miss_reasons(payload, where)
                     + ["", calibrations(payload, where)] + host_speed(payload, where))


def host_speed(payload: dict, where: Path) -> list[str]:
    """One micro-batch's compute before and after each cell, against its calibration's: a
    cell measured while the host ran slower than at calibration is predicted too fast. And
    the host's memory copying speed the same way."""
    lines = ["", "| cell | compute per micro-batch at calibration / before / after the cell (s) "
             "| one thread's memory copy at calibration (its timings' median) / before / after (GB/s) |",
             "|---|---|---|"]
    for c in payload["cells"]:
        cal = load_calibration(where / c["calibration"])
        before, after = c["compute_s"]
        copied = c["copy_bytes_per_s"]
        lines.append(f"| {c['name']} | {cal.iteration_s:.3f} / {before:.3f} / {after:.3f} | "
                     f"{statistics.median(cal.copy_draws_bytes_per_s) / 1e9:.1f} / {copied[0] / 1e9:.1f} / "
                     f"{copied[1] / 1e9:.1f} |")
    return lines


def summary(errors: list[float]) -> str:
    errors = sorted(errors)
    return (f"{sum(e <= TARGET for e in errors)} of {len(errors)} predictions within {100 * TARGET:.0f}%; mean "
            f"|error| {100 * sum(errors) / len(errors):.1f}%, median {100 * errors[len(errors) // 2]:.1f}%, "
            f"worst {100 * errors[-1]:.1f}%")


def misses(payload: dict) -> str:
    """Which misses the measurement's own spread covers: the prediction lies between the
    fastest and the slowest of the policy's rounds in that cell."""
    rows = [(c["name"], r) for c in payload["cells"] for r in c["results"] if abs(r["error"]) > TARGET]
    if not rows:
        return "No prediction misses."
    covered = [f"{name} {r['policy']}" for name, r in rows if min(r["rounds_s"]) <= r["predicted_s"] <= max(r["rounds_s"])]
    under = sum(r["error"] < 0 for c in payload["cells"] for r in c["results"])
    line = (f"Of the {len(rows)} misses, {len(covered)} lie within their rounds' range ({', '.join(covered) or 'none'}); "
            f"{under} of {sum(len(c['results']) for c in payload['cells'])} predictions are under.")
    beyond = [f"{name} {r['policy']} ({100 * r['error']:+.1f}%)" for name, r in rows if not consistent(r)]
    line += (f" {len(rows) - len(beyond)} of the misses are within {100 * TARGET:.0f}% of their measured median's 95% "
             f"interval; beyond it: {', '.join(beyond) or 'none'}.")
    return line


def why_missed(cell: dict, r: dict, cal: Calibration) -> list[str]:
    """What the record says about one miss, from measured figures only: the host re-measured
    at the cell (its compute and its cores' contention after it, against the calibration's),
    the measurement's own interval, and the exposed time of each kind against the
    prediction's where that gap carries at least half the error, with its sign."""
    out, under = [], r["error"] < 0  # a host slower at the cell than at calibration is predicted under
    if abs(r["host_compute_error"]) <= TARGET:
        out.append(f"the host moved: re-measured at the cell {100 * r['host_compute_error']:+.1f}%")
    if abs(r["host_compute"] - 1) > 0.03 and (r["host_compute"] > 1) == under:
        out.append(f"one rank's compute took {r['host_compute']:.2f}x its calibration's time at the cell")
    after = cell["contention_after"]  # in the calibration's unit, to compare
    after = in_unit(after["throughput"], after["unit_s"], cal.iteration_s)
    if after and cal.cpu_throughput and abs(after[-1] / cal.cpu_throughput[-1] - 1) > TARGET \
            and (after[-1] < cal.cpu_throughput[-1]) == under:
        out.append(f"{len(after)} ranks on the shared cores did {after[-1]:.2f} after the cell, "
                   f"{cal.cpu_throughput[-1]:.2f} at calibration")
    rounds = [in_unit(x["cpu_throughput"], x["unit_s"], cal.iteration_s)[-1] for x in cal.probe_rounds]
    if len(rounds) > 1 and (max(rounds) - min(rounds)) > 2 * TARGET * statistics.median(rounds):
        out.append(f"the calibration's rounds read the {len(after or cal.cpu_throughput)}-rank point "
                   f"{min(rounds):.2f}-{max(rounds):.2f}")
    share, idle = r.get("measured_host_cpu_share"), r.get("predicted_idle_share")
    if share and idle is not None and under and share["idle"] + share["irq"] > idle + 0.02:
        out.append(f"the host's cores were idle {100 * share['idle']:.0f}% and in interrupts "
                   f"{100 * share['irq']:.0f}% of the steady steps, where the simulation left "
                   f"{100 * idle:.0f}% to no rank")
    if consistent(r):
        out.append("within 5% of its measured median's 95% interval")
    gap = r["predicted_s"] - r["measured_s"]
    for kind, key in (("P2P", "p2p"), ("AllReduce", "allreduce")):
        d = r[f"predicted_exposed_{key}_s"] - r[f"measured_exposed_{key}_s"]
        if d * gap > 0 and abs(d) >= abs(gap) / 2:
            out.append(f"exposed {kind} {r[f'predicted_exposed_{key}_s']:.3f} s predicted, "
                       f"{r[f'measured_exposed_{key}_s']:.3f} s measured")
    return out or ["none of these: the gap is in computation on the shared cores, not in exposed transfers"]


def miss_reasons(payload: dict, where: Path) -> list[str]:
    """A line per miss with what the record says about it (why_missed): the issue asks
    that a cell that misses be reported with its reason."""
    rows = []
    for c in payload["cells"]:
        cal = load_calibration(where / c["calibration"])
        rows += [f"- {c['name']} {r['policy']} ({100 * r['error']:+.1f}%): {'; '.join(why_missed(c, r, cal))}"
                 for r in c["results"] if abs(r["error"]) > TARGET]
    return ["", "Each miss, and what the record says about it:", *rows] if rows else []


def calibrations(payload: dict, where: Path) -> str:
    """What each rate's calibration measured. They are taken minutes apart on the same
    host with the same model: their spread is the host's own drift, which no prediction
    from one of them can be closer than."""
    lines = ["| calibration | forward + backward per micro-batch (s) (its timings) | work done by 1..k ranks at once "
             "(x one rank's timed work) | an iteration's spread with 1..k at once | inter-node transfer CPU per message "
             "(ms) / per MB beside computation (ms): sent, all-reduced | loopback's per MB: sent, all-reduced (ms) "
             "| first of two activations' share of the uplink | queued ahead on a busy uplink (KiB) "
             "| the job's wake-ups per rank per second, measured beside |",
             "|---|---|---|---|---|---|---|---|---|"]

    def per_mb(cost: dict) -> str:
        return " ".join(f"{1e9 * cost[k]:.2f}" for k in ("per_byte_s", "per_byte_collective_s") if k in cost) or "-"
    for name in dict.fromkeys(cell["calibration"] for cell in payload["cells"]):
        cal = load_calibration(where / name)
        inter = cal.transfer_cpu.get("inter", {})
        draws = f" ({' '.join(f'{x:.3f}' for x in cal.compute_draws_s)})" if cal.compute_draws_s else ""
        lines.append(f"| {name} | {cal.iteration_s:.3f}{draws} | "
                     f"{' '.join(f'{x:.2f}' for x in cal.cpu_throughput)} | "
                     f"{' '.join(f'{x:.0%}' for x in cal.compute_spread) or '-'} | "
                     f"{1e3 * inter.get('per_message_s', 0):.2f} / {per_mb(inter)} | "
                     f"{per_mb(cal.transfer_cpu.get('intra', {}))} | "
                     + (f"{cal.link_share['inter']:.2f} |" if "inter" in cal.link_share else "- |")
                     + (f" {cal.link_queue['inter'] / 1024:.0f} |" if "inter" in cal.link_queue else " - |")
                     + (f" {cal.comm_wakeups_hz:.0f} |" if cal.comm_wakeups_hz else " - |"))
    return "\n".join(lines)


def scatter(payload: dict, path: Path) -> None:
    """Predicted against measured step time, one marker per policy, with the ±5% band; a
    bar through each marker spans its measured median's 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 5), dpi=120)
    marks = {"blocking": "s", "fifo": "o", "priority": "^", "trirace": "D"}
    top = 0.0
    for p in POLICIES:
        rows = [r for c in payload["cells"] for r in c["results"] if r["policy"] == p]
        if rows:
            x, y = [r["measured_s"] for r in rows], [r["predicted_s"] for r in rows]
            span = [r["interval_s"] for r in rows]
            spread = [[max(m - lo, 0.0) for m, (lo, _) in zip(x, span)], [max(hi - m, 0.0) for m, (_, hi) in zip(x, span)]]
            ax.errorbar(x, y, xerr=spread, fmt=marks[p], label=p, ms=5, elinewidth=0.8, alpha=0.85)
            top = max(top, *y, *(hi for _, hi in span))
    top *= 1.08
    ax.plot([0, top], [0, top], color="#2e4057", lw=1)
    ax.fill_between([0, top], [0, top * (1 - TARGET)], [0, top * (1 + TARGET)], color="#2e4057", alpha=0.12,
                    label=f"±{100 * TARGET:.0f}%")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step (s)")
    ax.set_ylabel("predicted step (s)")
    ax.set_title("simulator against the testbed", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
