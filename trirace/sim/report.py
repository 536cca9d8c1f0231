"""What `trirace simulate` prints and writes: policies side by side, or a ranked sweep of
layouts (a planner: which pp x dp, micro-batching and policy to run)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from ..config import TrainConfig, make_config
from ..errors import ConfigError, UsageError
from .calibration import Calibration
from .cluster import Cluster
from .run import apply_calibration, check, simulate


def _job(cfg: TrainConfig, cluster: Cluster, cal: Calibration | None) -> dict:
    topo = apply_calibration(cluster, cluster.topology(cfg.world_size), cal)
    return {"model": cfg.model, "schedule": cfg.schedule, "pp": cfg.pp, "dp": cfg.dp,
            "micro_batches": cfg.micro_batches, "micro_batch_size": cfg.micro_batch_size, "seq_len": cfg.tokens_seq,
            "steps": cfg.steps, "tokens_per_step": cfg.tokens_per_step,
            "cluster": {"name": cluster.name, "nodes": topo.nodes, "ranks_per_node": topo.ranks_per_node,
                        "intra_Gbit_s": topo.intra.bits_per_s / 1e9, "inter_Gbit_s": topo.inter.bits_per_s / 1e9,
                        "device": cluster.device.name, "shared_cores": cluster.shared_cores},
            "calibration": cal.host if cal else None}


def compare(cfg: TrainConfig, cluster: Cluster, policies: tuple[str, ...], cal: Calibration | None = None,
            trace: Path | None = None) -> dict:
    results = []
    for p in policies:
        # One timeline: of trirace if it runs, else of the only policy.
        want_trace = trace if (p == "trirace" or len(policies) == 1) else None
        results.append(asdict(simulate(cfg, cluster, p, cal, want_trace)))
    ref = next((r for r in results if r["policy"] == "blocking"), results[0])
    for r in results:
        r["vs_blocking"] = ref["iteration_time_s"] / r["iteration_time_s"]
    return {"job": _job(cfg, cluster, cal), "results": results}


def table(payload: dict) -> str:
    j = payload["job"]
    c = j["cluster"]
    lines = [f"{j['model']} {j['schedule']} pp={j['pp']} dp={j['dp']} m={j['micro_batches']} on {c['name']} "
             f"({c['nodes']} x {c['ranks_per_node']} {c['device']}, inter {c['inter_Gbit_s']:.3g} Gbit/s)",
             "| policy | iteration (s) | tokens/s | lower bound (s) | efficiency | vs blocking "
             "| exposed P2P (s) | exposed AllReduce (s) | exposed sparse (s) | peak memory (GB) |",
             "|" + "---|" * 10]
    for r in payload["results"]:
        e = r["exposed_comm_s"]
        lines.append(f"| {r['policy']} | {r['iteration_time_s']:.4g} | {r['tokens_per_s']:.4g} | "
                     f"{r['lower_bound_s']:.4g} ({r['bound_binding']}) | {r['overlap_efficiency']:.2f} | "
                     f"{r['vs_blocking']:.2f}x | {e['p2p']:.3g} | {e['allreduce']:.3g} | {e['sparse']:.3g} | "
                     f"{max(r['memory_gb']):.3g} |")
    r0 = payload["results"][0]
    lines.append(f"stages {r0['partition']}, rank order {r0['rank_order']}, compute from {r0['compute_source']}; "
                 f"{r0['simulated_ranks']} simulated ranks stand for {j['pp'] * j['dp']}; "
                 f"{sum(r['wall_s'] for r in payload['results']):.2f} s to simulate")
    return "\n".join(lines)


def layouts(cfg: TrainConfig) -> list[TrainConfig]:
    """Every pp x dp factorisation of the job's devices that keeps its global batch
    (dp x micro_batches x micro_batch_size sequences) and is valid for its schedule."""
    world, batch = cfg.world_size, cfg.dp * cfg.micro_batches
    out = []
    for pp in range(1, world + 1):
        if world % pp:
            continue
        dp = world // pp
        if batch % dp:
            continue
        try:
            out.append(make_config({**cfg.model_dump(), "pp": pp, "dp": dp, "micro_batches": batch // dp,
                                    "partition": None}))
        except ConfigError:
            continue  # e.g. more stages than layers, or 2bw with fewer micro-batches than stages
    return out


def sweep(cfg: TrainConfig, cluster: Cluster, policies: tuple[str, ...], cal: Calibration | None = None) -> dict:
    jobs = layouts(cfg)
    if not jobs:
        raise UsageError(f"no pp x dp layout of {cfg.world_size} devices keeps a global batch of "
                         f"{cfg.dp * cfg.micro_batches} micro-batches")
    for job in jobs:
        for p in policies:
            check(job, cluster, p, cal)
    rows = []
    limit = cluster.device.memory_bytes / 1e9
    for job in tqdm(jobs, desc="sweep", unit="layout", leave=False):
        for p in policies:
            r = simulate(job, cluster, p, cal)
            rows.append({"pp": job.pp, "dp": job.dp, "micro_batches": job.micro_batches, "policy": p,
                         "iteration_time_s": r.iteration_time_s, "tokens_per_s": r.tokens_per_s,
                         "overlap_efficiency": r.overlap_efficiency, "peak_memory_gb": max(r.memory_gb),
                         "fits": max(r.memory_gb) <= limit, "rank_order": r.rank_order})
    rows.sort(key=lambda r: (not r["fits"], -r["tokens_per_s"]))
    return {"job": _job(cfg, cluster, cal), "memory_limit_gb": limit, "sweep": rows}


def sweep_table(payload: dict) -> str:
    lines = ["| rank | pp | dp | m | policy | tokens/s | iteration (s) | efficiency | peak memory (GB) |",
             "|" + "---|" * 9]
    for i, r in enumerate(payload["sweep"], 1):
        mem = f"{r['peak_memory_gb']:.3g}" + ("" if r["fits"] else " (does not fit)")
        lines.append(f"| {i} | {r['pp']} | {r['dp']} | {r['micro_batches']} | {r['policy']} | "
                     f"{r['tokens_per_s']:.4g} | {r['iteration_time_s']:.4g} | {r['overlap_efficiency']:.2f} | {mem} |")
    return "\n".join(lines)
