"""The four communication policies side by side, in one set of processes.

Policies run in interleaved rounds (A B C D A B C D ...) so that drift of a shared machine
hits them alike; the first step of every run is warm-up and is dropped. Reported numbers
are medians over the kept steps, and ratios to `blocking`.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from ..comm import POLICIES
from ..config import TrainConfig
from ..runtime import run_local

# Whatever one system gets, all get (design.md 4): glibc malloc churn otherwise costs
# page faults per step. Set before the workers start, so every worker inherits them.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "17179869184",
              "MALLOC_TOP_PAD_": "268435456"}


@dataclass
class PolicyResult:
    policy: str
    step_time_s: float
    tokens_per_s: float
    exposed_p2p_s: float
    exposed_allreduce_s: float
    exposed_sparse_s: float
    compute_s: float
    cpu_us_per_transfer: float
    losses: list[float]


def run(base: TrainConfig, policies: tuple[str, ...] = POLICIES, rounds: int = 2) -> list[PolicyResult]:
    os.environ.update(MALLOC_ENV)
    cfgs = [base.model_copy(update={"comm_policy": p, "progress": False, "metrics_out": None})
            for _ in range(rounds) for p in policies]
    results = run_local(cfgs)
    rows: dict[str, list[dict]] = {p: [] for p in policies}
    losses: dict[str, list[float]] = {}
    for cfg, res in zip(cfgs, results):
        rows[cfg.comm_policy] += res[1:] or res
        losses.setdefault(cfg.comm_policy, [r["loss"] for r in res])
    out = []
    for p in policies:
        med = lambda k: statistics.median(r[k] for r in rows[p])  # noqa: E731
        out.append(PolicyResult(p, med("step_time_s"), base.tokens_per_step / med("step_time_s"),
                                med("exposed_p2p_s"), med("exposed_allreduce_s"), med("exposed_sparse_s"),
                                med("compute_s"), med("comm_cpu_us_per_transfer"), losses[p]))
    return out


def table(results: list[PolicyResult]) -> str:
    base = next((r for r in results if r.policy == "blocking"), results[0])
    head = ("| policy | tokens/s | step (s) | vs blocking | exposed P2P (s) | exposed AllReduce (s) "
            "| compute/rank (s) | comm CPU per transfer (µs) |")
    lines = [head, "|" + "---|" * 8]
    for r in results:
        lines.append(f"| {r.policy} | {r.tokens_per_s:.0f} | {r.step_time_s:.3f} | "
                     f"{r.tokens_per_s / base.tokens_per_s:.2f}x | {r.exposed_p2p_s:.3f} | "
                     f"{r.exposed_allreduce_s:.3f} | {r.compute_s:.3f} | {r.cpu_us_per_transfer:.0f} |")
    return "\n".join(lines)
