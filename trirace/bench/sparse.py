"""Sparse embedding-gradient exchange: dense vs allgather vs alltoall, and what auto picks.

    python -m trirace.bench.sparse [--reps 3] [--vocab 16384 65536] [--density ...] [--dim 256]

Spawns N local gloo processes (FileStore rendezvous). For each vocab x density every rank
touches `density * vocab` random rows (independently per rank, plus duplicates to coalesce)
and runs each method in interleaved rounds, so drift on a shared machine hits all alike;
the first round is warm-up. Results go into one reused buffer per rank (as a trainer's
gradient would), so no method pays for faulting in a fresh table each call. A round's time
is the slowest rank's (the exchange is done when every rank has its sum); reported is the
median over rounds. Bytes are the largest per-rank count the executor reports. The
alpha-beta model is then fitted to the measurements (least squares over all methods) so
its crossovers can be set against the measured ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..policy.sparse import ALPHA_S, BYTES_PER_S, METHODS, breakdown, crossovers
from ..runtime import allocator, gloo

RUN = (*METHODS, "auto")


def _grad(vocab: int, dim: int, density: float, rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    k = max(1, round(density * vocab))
    rows = torch.randperm(vocab, generator=g)[:k]
    idx = torch.cat([rows, rows[: k // 2]])  # duplicates, as repeated tokens produce
    return torch.sparse_coo_tensor(idx[None], torch.randn(idx.numel(), dim, generator=g), (vocab, dim),
                                   check_invariants=False)


def worker(rank: int, world: int, store: str, out_path: str, cfg: dict) -> None:
    import torch.distributed as dist

    from ..runtime.sparse_exchange import exchange

    # Processes share the cores: one intra-op thread each unless cores are plentiful.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(gloo.backend("gloo"), init_method=f"file://{store}", rank=rank, world_size=world)
    rows = []
    try:
        for ci, (vocab, density) in enumerate((v, d) for v in cfg["vocab"] for d in cfg["density"]):
            grad = _grad(vocab, cfg["dim"], density, rank, ci)
            buf = torch.empty(vocab, cfg["dim"])  # one result buffer, reused, as a trainer would
            times: dict[str, list[float]] = {m: [] for m in RUN}
            stats: dict[str, dict] = {}
            for rnd in range(cfg["warmup"] + cfg["reps"]):
                ref = None
                for m in RUN:
                    dist.barrier()
                    t0 = time.perf_counter()
                    res, st = exchange(grad, None, m, out=buf, alpha_s=cfg["alpha_s"],
                                       bytes_per_s=cfg["bytes_per_s"])
                    dt = torch.tensor([time.perf_counter() - t0, float(st["bytes_sent"])], dtype=torch.float64)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                    if rnd >= cfg["warmup"]:
                        times[m].append(float(dt[0]))
                    stats[m] = {**st, "bytes_sent": float(dt[1])}
                    if rnd == 0:  # a benchmark of wrong answers is worthless
                        if ref is None:
                            ref = res.clone()
                        elif not torch.allclose(res, ref, rtol=1e-5, atol=1e-5):
                            raise AssertionError(f"{m} disagrees with dense at V={vocab} density={density}")
            rows += [{"vocab": vocab, "density": density, "rows": stats[m]["rows"], "method": m,
                      "chosen": stats[m]["method"], "bytes": stats[m]["bytes_sent"],
                      "ms": 1e3 * statistics.median(times[m])} for m in RUN]
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows))


def measure(cfg: dict, workers: int, timeout_s: float) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="trirace-sparse-") as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "trirace.bench.sparse", "--_worker", json.dumps(cfg), str(workers),
               str(Path(tmp) / "store"), str(out)]
        # Freed buffers stay in the heap (as in the training benchmarks): otherwise every method's
        # temporaries are page-faulted in afresh on each call, and that, not the exchange, is timed.
        allocator.use()  # the workers inherit it
        procs = [subprocess.Popen([*cmd, str(r)]) for r in range(workers)]
        deadline = time.monotonic() + timeout_s
        try:
            for r, p in enumerate(procs):
                code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
                if code != 0:
                    raise RuntimeError(f"rank {r} exited with status {code}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return json.loads(out.read_text())


def fit(rows: list[dict], workers: int, dim: int) -> tuple[float, float]:
    """Least-squares (alpha_s, bytes_per_s) of t = steps * alpha + bytes / bw over the
    measured methods, with the model's own step counts."""
    import numpy as np

    a, t = [], []
    for r in rows:
        if r["method"] in METHODS:
            c = breakdown(r["method"], workers, r["vocab"], dim, r["rows"])
            a.append([c.latency_steps, r["bytes"]])
            t.append(r["ms"] / 1e3)
    (alpha, inv_bw), *_ = np.linalg.lstsq(np.array(a, dtype=float), np.array(t), rcond=None)
    return max(float(alpha), 0.0), 1.0 / max(float(inv_bw), 1e-15)


def _switches(xs: list[tuple[float, str]]) -> str:
    return ", ".join(f"{m} from {d:.4g}" if i else m for i, (d, m) in enumerate(xs))


def report(rows: list[dict], workers: int, dim: int, alpha_s: float, bytes_per_s: float) -> str:
    alpha_fit, bw_fit = fit(rows, workers, dim)
    lines = [f"N={workers} gloo processes, d={dim}, float32; ms = median of the slowest rank; "
             f"model fit: alpha={alpha_fit * 1e6:.0f} us/step, {bw_fit / 1e9:.2f} GB/s",
             "", "| vocab | density | rows/rank | method | MB sent/worker | ms | model ms (fit) | auto's choice |",
             "|---|---|---|---|---|---|---|---|"]
    configs = sorted({(r["vocab"], r["density"]) for r in rows})
    measured: dict[int, list[tuple[float, str]]] = {}
    for v, d in configs:
        group = {r["method"]: r for r in rows if (r["vocab"], r["density"]) == (v, d)}
        fastest = min(METHODS, key=lambda m: group[m]["ms"])
        measured.setdefault(v, []).append((d, fastest))
        for m in RUN:
            r = group[m]
            model = "" if m not in METHODS else \
                f"{breakdown(m, workers, v, dim, r['rows'], alpha_s=alpha_fit, bytes_per_s=bw_fit).seconds * 1e3:.1f}"
            name = f"**{m}**" if m == fastest else m
            lines.append(f"| {v} | {d:g} | {r['rows']} | {name} | {r['bytes'] / 1e6:.3f} | {r['ms']:.1f} | "
                         f"{model} | {group['auto']['chosen']} |")
    lines += ["", "Bold: fastest measured. Where the choice switches (density, scanning k = 1..V):"]
    for v in sorted(measured):
        auto = crossovers(workers, v, dim, alpha_s=alpha_s, bytes_per_s=bytes_per_s)
        fitted = crossovers(workers, v, dim, alpha_s=alpha_fit, bytes_per_s=bw_fit)
        lines.append(f"- V={v}: auto (alpha={alpha_s * 1e6:g} us, {bytes_per_s / 1e9:g} GB/s): {_switches(auto)}; "
                     f"model fitted here: {_switches(fitted)}; measured fastest: "
                     + ", ".join(f"{d:g}: {m}" for d, m in measured[v]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--_worker":
        cfg, world, store, out, rank = json.loads(argv[1]), int(argv[2]), argv[3], argv[4], int(argv[5])
        worker(rank, world, store, out, cfg)
        return 0
    p = argparse.ArgumentParser(prog="python -m trirace.bench.sparse", description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--vocab", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--density", type=float, nargs="+", default=[0.001, 0.01, 0.05, 0.2, 0.5])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--reps", type=int, default=3, help="measured rounds (after --warmup)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--alpha-s", type=float, default=ALPHA_S, help="latency per collective step auto assumes")
    p.add_argument("--bytes-per-s", type=float, default=BYTES_PER_S, help="link bandwidth auto assumes")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the workers are killed")
    p.add_argument("--json", type=Path, help="also write the raw rows here")
    a = p.parse_args(argv)
    cfg = {"vocab": a.vocab, "density": a.density, "dim": a.dim, "reps": a.reps, "warmup": a.warmup,
           "alpha_s": a.alpha_s, "bytes_per_s": a.bytes_per_s}
    t0 = time.monotonic()
    rows = measure(cfg, a.workers, a.timeout)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    print(report(rows, a.workers, a.dim, a.alpha_s, a.bytes_per_s))
    print(f"\n({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
