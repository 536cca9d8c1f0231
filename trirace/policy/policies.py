"""Communication policies: pure decisions about order, chunking and launch time.

A policy sees transfers and a snapshot of what is in flight; it never touches a process
group, so the real runtime and the simulator run the very same objects.

Where each chunk launches is policy/launch_plan.py's pure function of the plan, so every
replica of a stage launches alike (NCCL's order rule).

- blocking: PipeDream-2BW as published. P2P blocks in schedule order; one flattened
  all-reduce per stage at its AR; no overlap.
- fifo: everything asynchronous: every bucket as soon as the step's backward ends
  (DDP-style buckets), no priorities, no bound on bytes in flight.
- priority: ByteScheduler for data parallelism: chunks in forward-layer order, at most a
  credit of bytes launched per slot of the action list; P2P gets no special treatment.
- trirace: schedule-aware and link-aware. P2P is on the critical path, so chunks fill the
  gaps between the P2P transfers on their link: a slot takes the chunks that cross within
  the compute predicted before the next transfer on that link, unless the step has no
  slack left before its deadline. Chunks go in the order backward readies them, sized from
  the link so that gaps fit them; 2BW's one-step delay is the slack they wait in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UsageError

MiB = 1 << 20


@dataclass(frozen=True)
class Policy:
    name: str
    partition_bytes: int | None  # chunk size; None = the whole flat gradient in one piece
    credit_bytes: int | None  # bound on chunk bytes launched per slot (priority); None = unbounded
    chunk_order: str  # "ready" (backward order) or "front" (forward order)
    blocking: bool = False  # P2P and reduction block the engine where the schedule puts them
    fills_gaps: bool = False  # launch chunks into the predicted gaps between P2P transfers on their link
    defer_updates: bool = True  # run each OPT at its deadline, not right after the backward
    hierarchical: bool = False  # reduce groups that span nodes hierarchically where that pays


POLICIES = ("blocking", "fifo", "priority", "trirace")


def make_policy(name: str, partition_mb: float | None = None, credit_mb: float | None = None) -> Policy:
    """The named policy; partition/credit in MiB override its defaults (see bench results)."""
    def mib(x: float | None, default: float | None) -> int | None:
        v = default if x is None else x
        return None if v is None else int(v * MiB)

    if name == "blocking":
        return Policy(name, None, None, "front", blocking=True, defer_updates=False)
    if name == "fifo":
        # DDP's default bucket is 25 MiB; its cap on concurrency is none.
        return Policy(name, mib(partition_mb, 25), mib(credit_mb, None), "ready")
    if name == "priority":
        return Policy(name, mib(partition_mb, 4), mib(credit_mb, 16), "front")
    if name == "trirace":
        return Policy(name, mib(partition_mb, 2), mib(credit_mb, 4), "ready", fills_gaps=True,
                      hierarchical=True)
    raise UsageError(f"unknown communication policy {name!r}; choose from {', '.join(POLICIES)}")


# A chunk's ring all-reduce pays 2(n - 1) link latencies beside its 2(n - 1)/n bytes per
# byte; chunks are made large enough that the latencies take at most this share of the
# bytes' time.
LATENCY_SHARE = 0.25


def sized_for_link(policy: Policy, bytes_per_s: float, max_wait_s: float = 0.1, group_size: int = 2,
                   latency_s: float = 0.0) -> Policy:
    """trirace's chunk size follows the link: a P2P transfer that arrives behind a chunk
    waits at most about `max_wait_s`; and it follows the group: over n members a chunk
    needs n * latency * bandwidth / LATENCY_SHARE bytes for its ring's 2(n - 1) latencies
    to stay a small part of its time, which at thousands of replicas means the whole
    gradient in one piece (at 2048 replicas over 5 us links of 200 GB/s, 8 GB). Callers
    pass figures every member of the group agrees on (the broadcast probe), since chunking
    must be identical across the group."""
    chunk = min(max(bytes_per_s * max_wait_s, 256 * 1024), 8 * MiB)
    chunk = max(chunk, group_size * latency_s * bytes_per_s / LATENCY_SHARE)
    chunk = int(chunk) // (64 * 1024) * (64 * 1024)
    return replace(policy, partition_bytes=chunk, credit_bytes=2 * chunk)


def stage_policy(name: str, partition_mb: float | None, credit_mb: float | None, group_link_bytes_per_s: float,
                 group_size: int = 2, group_link_latency_s: float = 0.0) -> Policy:
    """The policy one stage runs, as both executors build it: the named policy with the
    flags' sizes, or, for trirace without explicit sizes, chunks sized for the link the
    stage's gradient reduction crosses and the replicas it spans."""
    policy = make_policy(name, partition_mb, credit_mb)
    if name == "trirace" and partition_mb is None and credit_mb is None:
        policy = sized_for_link(policy, group_link_bytes_per_s, group_size=group_size,
                                latency_s=group_link_latency_s)
    return policy
