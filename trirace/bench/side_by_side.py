"""Every system on the same model, data, seed, stages, testbed and process environment, in
one run: the four trirace policies and torch.distributed.pipelining's Schedule1F1B. A
system `SCHEDULE/POLICY` runs that schedule (the others run the job's), and `SCHEDULE/torch`
runs it on torch's executor (1f1b, and zb-h1 as torch's zero bubble).

Systems run in interleaved rounds (A B C D E A B C D E) so that drift of a shared machine
hits them alike; each run's first steps (warm-up) and last steps (drain) are dropped;
reported figures are medians of the steady steps between (plan/bounds.py: steady_steps).
The lower bound is the batch's physical limit (plan/bounds.py): the links' load is the
same for every system, the compute CPU is what each system measured itself (the peer,
which measures none, gets blocking's).
"""

from __future__ import annotations

import os
import statistics
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..config import TrainConfig
from ..models import layer_param_counts
from ..errors import UsageError
from ..plan.bounds import (DRAIN_STEPS, WARMUP_STEPS, Bound, lower_bound, per_rank_median, plan_link_bytes,
                           steady_steps)
from ..plan.planner import plan_job
from ..plan.topology import DEFAULT_INTRA, Link, Topology, parse_rate
from ..runtime import allocator, run_local
from ..runtime.launch import prepare
from ..runtime.trainer import measure_layers

SYSTEMS = ("blocking", "fifo", "priority", "trirace", "torch-1f1b")
PEER_RUNNER = "trirace.bench.torch_peer:run_peer"  # what each rank runs for torch-1f1b


@dataclass(frozen=True)
class Cluster:
    nodes: int = 4
    ranks_per_node: int = 1
    link: str | None = "250mbit"  # None: everything on this machine's loopback
    mtu: int = 9000

    def describe(self) -> str:
        if self.link is None:
            return "loopback (no testbed)"
        return f"emulated {self.nodes} node(s) x {self.ranks_per_node} rank(s), {self.link} links, MTU {self.mtu}"


@dataclass
class Result:
    system: str
    tokens_per_s: float
    step_time_s: float  # median of every round's steady steps
    round_steps_s: list[float]  # each round's median: the spread
    lower_bound_s: float
    overlap_efficiency: float
    vs_blocking: float
    exposed_p2p_s: float | None
    exposed_allreduce_s: float | None
    losses: list[float]
    compute_cpu_s: list[float] | None = None  # per rank, the median step's compute CPU (the peer measures none)
    cpu_s: list[float] | None = None  # per rank, the median step's CPU, every thread of the rank's process
    wakeups_hz: list[float] | None = None  # per rank, the median step's wake-ups of its other threads per second
    steps_s: list[list[float]] | None = None  # every round's steady steps, in order: what the medians are of
    # beside each of those steps, every rank's CPU summed (all threads): pairs a slow step with its CPU
    steps_cpu_s: list[list[float]] | None = None
    # the reporter's host over the steady steps: each kind's share of all its cores' time
    # (runtime/hostcpu.py); idle and irq are what no rank's CPU counts
    host_cpu_share: dict[str, float] | None = None
    # --emulate PRESET: the simulator's prediction of this emulated run (the testbed's links),
    # and of the real cluster (the preset as it is, real seconds; the run's is step / K)
    simulated_s: float | None = None
    simulated_real_s: float | None = None


@contextmanager
def _testbed(cluster: Cluster):
    """Yield (rank_command, rank_env, topology file) for the cluster; tear it down after."""
    if cluster.link is None:
        yield None, None, None
        return
    from .. import testbed

    with testbed.held_job(cluster.nodes, cluster.ranks_per_node, cluster.link, cluster.mtu) as (tb, topo):
        yield tb.rank_command, tb.rank_env, topo


def check(base: TrainConfig, cluster: Cluster) -> None:
    """What would stop a bench before it measures anything, found before it starts."""
    if len(steady_steps(base.steps)) < 2:
        raise UsageError(f"bench needs at least {WARMUP_STEPS + DRAIN_STEPS + 2} steps per run (the first "
                         f"{WARMUP_STEPS} and the last {DRAIN_STEPS} are not steady)")
    if cluster.link is None:
        return
    from .. import testbed

    testbed.check(cluster.nodes, cluster.ranks_per_node, cluster.link, cluster.mtu)
    if base.world_size != cluster.nodes * cluster.ranks_per_node:
        raise UsageError(f"pp x dp = {base.world_size} but the cluster has {cluster.nodes} x "
                         f"{cluster.ranks_per_node} ranks")


def run(base: TrainConfig, cluster: Cluster, systems: tuple[str, ...] = SYSTEMS, rounds: int = 3,
        emulated: str | None = None) -> dict:
    """`emulated`: the cluster preset an --emulate job stands for; the simulator's
    prediction of it (times the dilation) goes beside each policy's measured step."""
    check(base, cluster)
    allocator.use()  # before the workers start: every system's worker inherits it
    with _testbed(cluster) as (rank_command, rank_env, topo_file):
        nominal = _nominal_topology(cluster, base.world_size)
        base = prepare(base.with_(topology=topo_file, progress=False, metrics_out=None, trace_out=None,
                                  tensorboard=None))
        # One placement and partition for every system (the peer included): what trirace's
        # planner picks.
        picked = plan_job(base, nominal, lambda: measure_layers(base))
        base = base.with_(rank_order=picked.layout.order, partition=[len(st.layers) for st in picked.stages])
        cfgs, names = [], []
        for _ in range(rounds):
            for sysname in systems:
                schedule, policy = split_system(sysname, base.parallel.schedule)
                if is_peer(sysname):  # torch-1f1b: 1f1b; SCHEDULE/torch: that schedule, torch's own
                    policy, schedule = "blocking", "1f1b" if sysname == "torch-1f1b" else schedule
                cfgs.append(base.with_(comm_policy=policy, schedule=schedule))
                names.append(sysname)
        runs = run_local(cfgs, systems=[PEER_RUNNER if is_peer(n) else "trirace" for n in names],
                         rank_command=rank_command, rank_env=rank_env)
    rows: dict[str, list[dict]] = {s: [] for s in systems}
    every: dict[str, list[list[float]]] = {s: [] for s in systems}  # each round's steady step times
    every_cpu: dict[str, list[list[float]]] = {s: [] for s in systems}  # and each one's CPU, all ranks
    losses: dict[str, list[float]] = {}
    for name, res in zip(names, runs):
        kept = steady_steps(len(res))
        steady = res[kept.start:kept.stop]
        rows[name] += steady
        every[name].append([r["step_time_s"] for r in steady])
        if steady and "rank_cpu_s" in steady[0]:  # (the peer measures none)
            every_cpu[name].append([sum(r["rank_cpu_s"]) for r in steady])
        losses.setdefault(name, [r["loss"] for r in res])
    measured = [s for s in ("blocking", *systems) if s in rows and "rank_compute_cpu_s" in rows[s][0]]
    if not measured:
        raise UsageError("bench needs at least one trirace policy among the systems (for the lower bound)")
    # Each system's bound from the compute CPU it measured itself (overlap changes what the
    # shared cores spend on compute); the peer, which measures none, gets the reference's.
    load = _link_load(base, nominal, rows[measured[0]])
    reference = _bound(base, nominal, rows[measured[0]], load)
    bounds = {s: _bound(base, nominal, rows[s], load) if s in measured else reference for s in systems}
    step = {s: statistics.median(r["step_time_s"] for r in rows[s]) for s in systems}
    ref = step.get("blocking", next(iter(step.values())))
    results = []
    for s in systems:
        med = lambda k: statistics.median(r[k] for r in rows[s]) if k in rows[s][0] else None  # noqa: E731
        b = bounds[s].seconds
        per_round = [statistics.median(steps) for steps in every[s]]
        results.append(Result(s, base.tokens_per_step / step[s], step[s], per_round, b, b / step[s],
                              ref / step[s], med("exposed_p2p_s"), med("exposed_allreduce_s"), losses[s],
                              per_rank_median(rows[s], "rank_compute_cpu_s") if s in measured else None,
                              per_rank_median(rows[s], "rank_cpu_s") if s in measured else None,
                              per_rank_median(rows[s], "rank_wakeups", per_second=True) if s in measured else None,
                              every[s], every_cpu[s] or None, host_share(rows[s])))
    if emulated is not None:
        ours = [s for s in systems if not is_peer(s)]
        run_here, real = simulated(base, cluster, emulated, ours, True), simulated(base, cluster, emulated, ours, False)
        for r in results:
            r.simulated_s, r.simulated_real_s = run_here.get(r.system), real.get(r.system)
    return {"config": {**{k: v for k, v in base.flat(mode="json").items() if k != "topology"}, "cluster": asdict(cluster),
                       "rounds": rounds, "warmup_steps": WARMUP_STEPS, "drain_steps": DRAIN_STEPS,
                       "lower_bound": {**asdict(reference), "binding": reference.binding,
                                       "of": measured[0]},
                       "emulation": None if base.emulation is None else
                       {"preset": emulated, "device": base.emulation.device, "dilation": base.emulation.dilation,
                        "byte_scale": base.emulation.byte_scale}},
            "results": [asdict(r) for r in results]}


def is_peer(name: str) -> bool:
    """torch.distributed.pipelining's executor: `torch-1f1b`, or `SCHEDULE/torch`."""
    return name == "torch-1f1b" or name.endswith("/torch")


def split_system(name: str, schedule: str) -> tuple[str, str]:
    """(schedule, policy) of a system: `POLICY` runs `schedule`, `SCHEDULE/POLICY` its own."""
    own, _, policy = name.rpartition("/")
    return own or schedule, policy


def simulated(cfg: TrainConfig, cluster: Cluster, preset: str, systems: list[str], testbed: bool) -> dict[str, float]:
    """The simulator's step for each system, with the same partition, placement and device
    times, and no shared cores (the ranks sleep).

    `testbed`: the emulated run itself, in its seconds (times the dilation). Its links are
    the preset's nominal rate / (K x s), which gloo's ring all-reduce gets in full over a
    tbf link, two collectives of a group at once; so the preset's collective figures
    (what NCCL achieves on the real fabric, for 100 GbE over TCP half the nominal rate)
    are left out. Else: the real cluster, in its seconds, the preset as it is."""
    from ..sim.cluster import load_cluster
    from ..sim.simulate import simulate

    em = cfg.emulation
    real = cfg.with_(emulate=None, dilation=None, byte_scale=None, topology=None)
    target = load_cluster(preset, nodes=cluster.nodes, ranks_per_node=cluster.ranks_per_node)
    if testbed:
        target = replace(target, collective={}, collective_streams=2)
    scale = em.dilation if testbed else 1.0
    out = {}
    for name in systems:
        schedule, policy = split_system(name, cfg.parallel.schedule)
        out[name] = scale * simulate(real.with_(schedule=schedule), target, policy).iteration_time_s
    return out


def host_share(rows: list[dict]) -> dict[str, float] | None:
    """Each kind's share of the host's core time over metrics rows, weighted by their step
    times (the shares of the whole window); None where no row has it (no /proc, or the peer)."""
    got = [(r["host_cpu_share"], r["step_time_s"]) for r in rows if r.get("host_cpu_share")]
    if not got:
        return None
    total = sum(t for _, t in got)
    return {k: sum(share[k] * t for share, t in got) / total for k in got[0][0]}


def _nominal_topology(cluster: Cluster, world: int) -> Topology:
    if cluster.link is None:
        return Topology(1, world, DEFAULT_INTRA, DEFAULT_INTRA)
    return Topology(cluster.nodes, cluster.ranks_per_node, DEFAULT_INTRA, Link(parse_rate(cluster.link), 1e-4))


def _link_load(cfg: TrainConfig, topo: Topology, rows: list[dict]) -> dict[tuple[int, str], float]:
    """The bytes every link carries under the job's plan (the same for every system), the
    token table at the bytes the run measured sending."""
    plan = plan_job(cfg, topo)
    sent = statistics.median(r["embedding_bytes"] for r in rows) if plan.stages[0].sparse_param is not None else None
    return plan_link_bytes(plan, cfg.parallel.micro_batches, cfg.activation_bytes, sent)


def _bound(cfg: TrainConfig, topo: Topology, rows: list[dict], load: dict[tuple[int, str], float]) -> Bound:
    """From one system's own per-rank compute CPU time and the links' load; emulated
    (--emulate), from each rank's device time, on a device of its own."""
    if cfg.emulation is not None:
        return lower_bound(emulated_compute(cfg, topo), cfg.world_size, load, topo)
    return lower_bound(per_rank_median(rows, "rank_compute_cpu_s"), os.cpu_count() or 1, load, topo)


def emulated_compute(cfg: TrainConfig, topo: Topology) -> list[float]:
    """Each rank's computation per step under --emulate: its stage's dilated device time."""
    em, plan = cfg.emulation, plan_job(cfg, topo)
    counts = layer_param_counts(cfg.real_spec)
    per_stage = [em.dilation * (cfg.parallel.micro_batches * sum(em.times.forward_s[i] + em.times.backward_s[i]
                                                                 for i in st.layers)
                                + em.times.optimizer_s_per_param * sum(counts[i] for i in st.layers))
                 for st in plan.stages]
    return [per_stage[plan.layout.coords(r)[0]] for r in range(cfg.world_size)]


def markdown(payload: dict) -> str:
    head = ("| system | tokens/s | step (s) | rounds' medians (s) | lower bound (s) | overlap efficiency | vs blocking "
            "| exposed P2P (s) | exposed AllReduce (s) |")
    sim = any(r.get("simulated_s") is not None for r in payload["results"])
    k = (payload.get("config", {}).get("emulation") or {}).get("dilation", 1.0)
    if sim:
        head += f" simulated (s) | on the real cluster: step / {k:g} (s) | the real cluster, simulated (s) |"
    lines = [head, "|" + "---|" * (12 if sim else 9)]
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    fmt4 = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    for r in payload["results"]:
        spread = " ".join(f"{x:.3f}" for x in r["round_steps_s"])
        lines.append(f"| {r['system']} | {r['tokens_per_s']:.0f} | {r['step_time_s']:.3f} | {spread} | "
                     f"{r['lower_bound_s']:.3f} | {r['overlap_efficiency']:.2f} | {r['vs_blocking']:.2f}x | "
                     f"{fmt(r['exposed_p2p_s'])} | {fmt(r['exposed_allreduce_s'])} |"
                     + (f" {fmt(r.get('simulated_s'))} | {r['step_time_s'] / k:.4f} | "
                        f"{fmt4(r.get('simulated_real_s'))} |" if sim else ""))
    return "\n".join(lines)


def chart(payload: dict, path: Path) -> None:
    """A bar chart of tokens/s per system, with the lower bound's tokens/s as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = payload["results"]
    cfg = payload["config"]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    names = [r["system"] for r in res]
    bars = ax.bar(names, [r["tokens_per_s"] for r in res],
                  color=["#9aa5b1" if n != "trirace" else "#d1495b" for n in names])
    for b, r in zip(bars, res):
        ax.annotate(f"{r['vs_blocking']:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=9)
    tokens = res[0]["tokens_per_s"] * res[0]["step_time_s"]
    limit = tokens / res[0]["lower_bound_s"]
    ax.axhline(limit, color="#2e4057", ls="--", lw=1, label="lower bound")
    ax.set_ylim(0, 1.15 * max(limit, *(r["tokens_per_s"] for r in res)))
    c = cfg["cluster"]
    where = "loopback" if c["link"] is None else f"{c['nodes']}x{c['ranks_per_node']} @ {c['link']}"
    ax.set_title(f"{cfg['model']} {cfg['schedule']} pp={cfg['pp']} dp={cfg['dp']}, {where}", fontsize=10)
    ax.set_ylabel("tokens/s")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
