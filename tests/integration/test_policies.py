"""Communication policies on real gloo processes: scheduling never changes the math, never
deadlocks, survives a straggler, and leaves a readable timeline."""

import json
from pathlib import Path

import pytest

from trirace.policy import POLICIES
from trirace.config import make_config
from trirace.runtime import run_local

BASE = dict(model="gpt-test", data="synthetic", micro_batch_size=1, seq_len=16, progress=False, balance="params")


def _losses(results):
    return [[row["loss"] for row in rows] for rows in results]


@pytest.fixture(scope="module")
def pp2dp2():
    """One set of 4 processes: every policy on 2bw, then the straggler runs. (Every policy on
    every schedule, against the losses pre-change main recorded: test_nccl_rules.py.)"""
    base = dict(BASE, pp=2, dp=2, steps=6, micro_batches=3, micro_batch_size=2)
    cfgs = [make_config(base, schedule="2bw", comm_policy=p) for p in POLICIES]
    cfgs += [make_config(base, schedule="2bw", comm_policy=p, straggler="1:0.02") for p in POLICIES]
    cfgs += [make_config(base, schedule="2bw", comm_policy="trirace", autotune=True, steps=30, straggler="2:0.002"),
             make_config(base, schedule="2bw", comm_policy="blocking", steps=30)]
    res = run_local(cfgs, timeout_s=300)
    return cfgs, res


def test_losses_bitwise_identical_across_policies(pp2dp2):
    cfgs, res = pp2dp2
    got = {c.comm.policy: losses for c, losses in zip(cfgs[:4], _losses(res[:4]))}
    assert set(got) == set(POLICIES)
    assert all(len(v) == 6 for v in got.values())
    for p in POLICIES:
        assert got[p] == got["blocking"], p  # exact equality, not a tolerance
    assert got["blocking"][-1] < got["blocking"][0]


def test_straggler_replica_keeps_the_math(pp2dp2):
    """Rank 1 (stage 0, replica 1) computes slower: launch times differ between the replicas,
    the agreed order of their collectives does not, so nothing hangs or mixes."""
    cfgs, res = pp2dp2
    reference = _losses(res[:1])[0]
    assert len(reference) == 6
    for c, losses in zip(cfgs[4:8], _losses(res[4:8]), strict=True):
        assert losses == reference, c.comm.policy


def test_autotune_agrees_on_every_rank_and_keeps_the_math(pp2dp2):
    """Trials change the chunking step by step; replicas that disagreed would all-reduce
    different slices (a hang or an error), and a wrong tuner would change the losses."""
    from trirace.policy.autotune import TRIALS, Tuner
    from trirace.policy import make_policy

    cfgs, res = pp2dp2
    tuned, blocking = res[8], res[9]
    assert [r["loss"] for r in tuned] == [r["loss"] for r in blocking]
    tuner = Tuner(make_policy("trirace"), lag=2)
    sizes = [(r["partition_mb"], r["credit_mb"]) for r in tuned]
    for i, trial in enumerate(TRIALS):
        assert sizes[tuner.first + i * tuner.per_trial] == trial
    final = sizes[tuner.apply_from:]
    assert len(final) >= 2 and len(set(final)) == 1 and final[0] in TRIALS


def test_metrics_report_exposed_communication(pp2dp2):
    cfgs, res = pp2dp2
    for c, rows in zip(cfgs[:4], res[:4], strict=True):
        assert len(rows) == c.steps
        for r in rows:
            assert r["comm_policy"] == c.comm.policy
            assert r["exposed_p2p_s"] >= 0 and r["exposed_allreduce_s"] >= 0
            assert r["transfers"] > 0
        # Exposed time is attributed to the step that owns the data, step time is a window:
        # they compare over the whole run.
        exposed = sum(r["exposed_p2p_s"] + r["exposed_allreduce_s"] for r in rows)
        assert exposed < sum(r["step_time_s"] for r in rows)
        # CPU per rank over the run: the process (every thread) holds the engine thread,
        # which holds its compute; each rank's own slot is filled
        for i in range(c.world_size):
            compute, engine, process = (sum(r[k][i] for r in rows)
                                        for k in ("rank_compute_cpu_s", "rank_engine_cpu_s", "rank_cpu_s"))
            assert 0 < compute <= engine <= process, (c.comm.policy, i, compute, engine, process)
            # its communication threads (gloo's loops at least) woke while it trained
            assert not Path("/proc/self/task").is_dir() or sum(r["rank_wakeups"][i] for r in rows) > 0, \
                (c.comm.policy, i)
        # where the reporter's host spent its cores' time in each step, all of it accounted
        shares = [r["host_cpu_share"] for r in rows if r["host_cpu_share"] is not None]
        assert len(shares) >= (len(rows) // 2 if Path("/proc/stat").exists() else 0)  # (None: no tick passed)
        assert all(sum(s.values()) == pytest.approx(1.0) for s in shares)
        # a 50 ms step spans a few 10 ms ticks, which may all land in system or idle time
        # (stop 44's CI saw one); over the run, the ranks computed
        assert not shares or sum(s["user"] for s in shares) > 0
    blocking = res[0]
    assert sum(r["exposed_allreduce_s"] for r in blocking) > 0  # blocking waits for every reduction


# 1x2, 2x1, 2x2, 4x1 and 2x4 run every schedule x policy in test_nccl_rules.py; 3x2 stands
# for deeper pipelines with replicas (4x2 would cost 8 more processes for little more).
LAYOUTS = [(1, 1), (3, 1), (3, 2)]


@pytest.mark.parametrize("pp, dp", LAYOUTS)
def test_no_deadlock_across_layouts_and_policies(pp, dp, tmp_path):
    """Every policy on 2bw (math checked against blocking), plus 1f1b with fewer micro-batches
    than stages and gpipe, all within a bounded time and clean under NCCL's rules."""
    from trirace.obs.commcheck import check

    base = dict(BASE, pp=pp, dp=dp, steps=2)
    cfgs = [make_config(base, schedule="2bw", micro_batches=max(pp, 2), comm_policy=p) for p in POLICIES]
    cfgs.append(make_config(base, schedule="1f1b", micro_batches=1, comm_policy="trirace"))
    cfgs.append(make_config(base, schedule="gpipe", micro_batches=3, comm_policy="fifo"))
    cfgs = [c.with_(comm_log=tmp_path / str(i)) for i, c in enumerate(cfgs)]
    res = run_local(cfgs, timeout_s=240)
    losses = _losses(res)
    assert all(len(x) == 2 for x in losses)
    for p, got in zip(POLICIES, losses, strict=False):  # the policies' runs come first
        assert got == losses[0], p
    # Per communicator (streams): today's runtime posts receives ahead of its sends and
    # syncs the device after compute, a deadlock on a strict device for pp >= 2
    # (tests/integration/test_commcheck_device.py); it is rebuilt to pass strict (issue 51).
    for c in cfgs:
        report = check(c.observe.comm_log, model="streams")
        assert report.ok and report.ranks == pp * dp, report.summary()


def test_timeline(tmp_path):
    cfg = make_config(BASE, pp=2, dp=2, steps=3, micro_batches=2, comm_policy="trirace", trace_out=tmp_path)
    run_local([cfg], timeout_s=240)
    trace = json.loads((tmp_path / "trace.json").read_text())
    ev = trace["traceEvents"]
    spans = [e for e in ev if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1, 2, 3}
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "p2p send", "p2p recv", "allreduce"} <= names
    # Slices on one track never partially overlap (they must nest).
    by_track: dict = {}
    for e in spans:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for track in by_track.values():
        track.sort()
        for (a0, a1), (b0, b1) in zip(track, track[1:]):
            assert b0 >= a1 - 1e-3 or b1 <= a1 + 1e-3, track
    starts = [e for e in ev if e["ph"] == "s"]
    ends = [e for e in ev if e["ph"] == "f"]
    assert starts and {e["id"] for e in starts} == {e["id"] for e in ends}
    compute = {(e["pid"], e["name"]) for e in spans if e["tid"] == 0}
    assert (1, "F0") in compute and (0, "OPT2") in compute
    # each computation says what CPU its thread used: some, and no more than its wall time
    cpu = [(e["args"]["cpu_s"], e["dur"] / 1e6) for e in spans if e["tid"] == 0]
    assert all(0 < c <= d + 1e-3 for c, d in cpu), cpu
