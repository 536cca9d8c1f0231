"""What `trirace simulate` prints and writes: policies side by side, or a ranked sweep of
layouts, policies and chunk sizes (a planner: which pp x dp, micro-batching, policy and
chunking to run), with why the best one runs at its speed."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from ..policy.policies import make_policy
from ..config import TrainConfig, make_config
from ..errors import ConfigError, UsageError
from .calibration import Calibration
from .cluster import Cluster
from .simulate import SimResult, apply_calibration, check, chunk_choices, simulate


def _job(cfg: TrainConfig, cluster: Cluster, cal: Calibration | None) -> dict:
    topo = apply_calibration(cluster, cluster.topology(cfg.world_size), cal)
    return {"model": cfg.model.name, "schedule": cfg.parallel.schedule, "pp": cfg.parallel.pp, "dp": cfg.parallel.dp,
            "micro_batches": cfg.parallel.micro_batches, "micro_batch_size": cfg.parallel.micro_batch_size, "seq_len": cfg.tokens_seq,
            "steps": cfg.steps, "tokens_per_step": cfg.tokens_per_step,
            "cluster": {"name": cluster.name, "nodes": topo.nodes, "ranks_per_node": topo.ranks_per_node,
                        "intra_Gbit_s": topo.intra.bits_per_s / 1e9, "inter_Gbit_s": topo.inter.bits_per_s / 1e9,
                        "device": cluster.device.name, "shared_cores": cluster.shared_cores},
            "calibration": cal.host if cal else None}


def compare(cfg: TrainConfig, cluster: Cluster, policies: tuple[str, ...], cal: Calibration | None = None,
            trace: Path | None = None) -> dict:
    runs = []
    for p in policies:
        # One timeline: of trirace if it runs, else of the only policy.
        want_trace = trace if (p == "trirace" or len(policies) == 1) else None
        runs.append(simulate(cfg, cluster, p, cal, want_trace))
    results = [asdict(r) for r in runs]
    ref = next((r for r in results if r["policy"] == "blocking"), results[0])
    for r in results:
        r["vs_blocking"] = ref["iteration_time_s"] / r["iteration_time_s"]
    best = min(runs, key=lambda r: r.iteration_time_s)
    return {"job": _job(cfg, cluster, cal), "results": results, "why": explain(best)}


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
    runs = f" (the median of {r0['runs']} runs, compute times drawn as measured)" if r0["runs"] > 1 else ""
    lines.append(f"stages {r0['partition']}, rank order {r0['rank_order']}, compute from {r0['compute_source']}; "
                 f"{r0['simulated_ranks']} simulated ranks stand for {j['pp'] * j['dp']}{runs}; "
                 f"{sum(r['wall_s'] for r in payload['results']):.2f} s to simulate")
    return "\n".join(lines) + "\n\n" + why_text(payload["why"])


def layouts(cfg: TrainConfig) -> list[TrainConfig]:
    """Every pp x dp factorisation of the job's devices that keeps its global batch
    (dp x micro_batches x micro_batch_size sequences) and is valid for its schedule."""
    world, batch = cfg.world_size, cfg.parallel.dp * cfg.parallel.micro_batches
    out = []
    for pp in range(1, world + 1):
        if world % pp:
            continue
        dp = world // pp
        if batch % dp:
            continue
        try:
            out.append(make_config({**cfg.flat(), "pp": pp, "dp": dp, "micro_batches": batch // dp,
                                    "partition": None}))
        except ConfigError:
            continue  # e.g. more stages than layers, or 2bw with fewer micro-batches than stages
    return out


CHUNK_SWEEP_TOP = 3  # (layout, policy) pairs whose chunk sizes the sweep tries


def sweep(cfg: TrainConfig, cluster: Cluster, policies: tuple[str, ...], cal: Calibration | None = None) -> dict:
    jobs = layouts(cfg)
    if not jobs:
        raise UsageError(f"no pp x dp layout of {cfg.world_size} devices keeps a global batch of "
                         f"{cfg.parallel.dp * cfg.parallel.micro_batches} micro-batches")
    for job in jobs:
        for p in policies:
            check(job, cluster, p, cal)
    limit = cluster.device.memory_bytes / 1e9

    def row(job: TrainConfig, p: str, credit: float | None, r: SimResult) -> dict:
        if credit is None:  # the policy's own cap on chunk bytes in flight (None: no cap)
            own = make_policy(p).credit_bytes
            credit = own / 2**20 if own else None
        return {"pp": job.parallel.pp, "dp": job.parallel.dp, "micro_batches": job.parallel.micro_batches, "policy": p,
                "chunk_mb": r.chunk_mb, "credit_mb": credit, "iteration_time_s": r.iteration_time_s,
                "tokens_per_s": r.tokens_per_s, "overlap_efficiency": r.overlap_efficiency,
                "peak_memory_gb": max(r.memory_gb), "fits": max(r.memory_gb) <= limit, "rank_order": r.rank_order,
                "result": r}

    def rank(rows: list[dict]) -> None:
        rows.sort(key=lambda r: (not r["fits"], -r["tokens_per_s"]))

    # Layouts x policies at the job's chunk sizes (each policy's default unless given) ...
    rows = [row(job, p, cfg.comm.credit_mb, simulate(job, cluster, p, cal))
            for job, p in tqdm([(j, p) for j in jobs for p in policies], desc="sweep", unit="job", leave=False)]
    rank(rows)
    # ... then chunk sizes (autotune's trials) for the best few that have chunks to size.
    given = cfg.comm.partition_mb is not None or cfg.comm.credit_mb is not None or cfg.comm.autotune
    leaders = [] if given else [r for r in rows if r["policy"] != "blocking"][:CHUNK_SWEEP_TOP]
    runs = [(lead, part, credit) for lead in leaders for part, credit in chunk_choices(lead["policy"])[1:]]
    for lead, part, credit in tqdm(runs, desc="chunk sizes", unit="job", leave=False):
        job = next(j for j in jobs if (j.parallel.pp, j.parallel.dp) == (lead["pp"], lead["dp"]))
        r = simulate(job.with_(partition_mb=part, credit_mb=credit), cluster, lead["policy"], cal)
        rows.append(row(job, lead["policy"], credit, r))
    rank(rows)
    best = rows[0]["result"]
    for r in rows:
        del r["result"]
    return {"job": _job(cfg, cluster, cal), "memory_limit_gb": limit, "sweep": rows,
            "why": explain(best)}


def sweep_table(payload: dict, top: int = 20) -> str:
    rows = payload["sweep"]
    lines = ["| rank | pp | dp | m | policy | chunk (MiB) | in flight (MiB) | tokens/s | iteration (s) | efficiency "
             "| peak memory (GB) |", "|" + "---|" * 11]
    for i, r in enumerate(rows[:top], 1):
        mem = f"{r['peak_memory_gb']:.3g}" + ("" if r["fits"] else " (does not fit)")
        chunk = "-" if r["chunk_mb"] is None else f"{r['chunk_mb']:.3g}"
        credit = "-" if r["credit_mb"] is None else f"{r['credit_mb']:.3g}"
        lines.append(f"| {i} | {r['pp']} | {r['dp']} | {r['micro_batches']} | {r['policy']} | {chunk} | {credit} | "
                     f"{r['tokens_per_s']:.4g} | {r['iteration_time_s']:.4g} | {r['overlap_efficiency']:.2f} | {mem} |")
    if len(rows) > top:
        lines.append(f"({len(rows) - top} more in --json)")
    return "\n".join(lines) + "\n\n" + why_text(payload["why"])


_RESOURCE = {"compute": "the slowest stage's computation", "cpu": "the shared cores (every rank's computation)",
             "link": "the busiest inter-node link"}
_MOVE = {
    "compute": "a better balanced partition (--balance time), more pipeline stages, or, where --recompute is on, --no-recompute",
    "cpu": "more cores per host, or fewer ranks sharing them",
    "link": "a faster inter-node link, or fewer bytes on it: --grad-comm-dtype bf16 halves gradient bytes, "
            "a rank order that keeps reductions inside nodes, fewer replicas across nodes",
}


def explain(r: SimResult) -> dict:
    """Why the chosen plan runs at its speed: the resource that bounds any schedule of it,
    how far the simulated run is from that bound and which communication is exposed, and
    what the bound would need to move."""
    parts = r.bound_parts
    order = sorted(parts, key=parts.get, reverse=True)
    binding, nxt = order[0], order[1]
    exposed = {k: v for k, v in r.exposed_comm_s.items() if v > 0}
    return {"policy": r.policy, "chunk_mb": r.chunk_mb, "partition": r.partition, "rank_order": r.rank_order,
            "iteration_s": r.iteration_time_s, "binding": binding, "bound_s": parts[binding], "next": nxt,
            "next_s": parts[nxt], "bound_parts": parts, "exposed_s": exposed,
            "to_move": _MOVE[binding],
            # the binding resource must get this much faster before the next one binds
            "speedup_to_next": parts[binding] / parts[nxt] if parts[nxt] > 0 else None}


def why_text(w: dict) -> str:
    chunk = "" if w["chunk_mb"] is None else f", {w['chunk_mb']:.3g} MiB chunks"
    lines = [f"Why: the best plan ({w['policy']}{chunk}, stages {w['partition']}, rank order {w['rank_order']}) "
             f"steps in {w['iteration_s']:.4g} s.",
             f"- Bound: {_RESOURCE[w['binding']]} needs {w['bound_s']:.4g} s per step "
             f"({100 * w['bound_s'] / w['iteration_s']:.0f}% of the step); next is {_RESOURCE[w['next']]} at "
             f"{w['next_s']:.4g} s."]
    if w["exposed_s"]:
        kinds = ", ".join(f"{k} {v:.3g} s" for k, v in sorted(w["exposed_s"].items(), key=lambda kv: -kv[1]))
        lines.append(f"- Exposed communication per rank and step: {kinds}.")
    else:
        lines.append("- No communication is exposed: the step is computation and pipeline bubbles.")
    ratio = w["speedup_to_next"]
    gain = f"; {ratio:.2f}x on it before the next binds" if ratio and ratio > 1.0001 else ""
    lines.append(f"- To move the bound: {w['to_move']}{gain}.")
    return "\n".join(lines)
