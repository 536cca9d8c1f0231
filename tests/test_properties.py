"""Property-based: over small random layouts, schedules and policies, training runs,
terminates, and its losses are those of the blocking policy (bitwise: dp <= 2)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trirace.comm import POLICIES
from trirace.config import make_config
from trirace.runtime import run_local

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1)]


@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(layout=st.sampled_from(LAYOUTS), schedule=st.sampled_from(["2bw", "1f1b", "gpipe"]),
       policy=st.sampled_from([p for p in POLICIES if p != "blocking"]), extra_m=st.integers(0, 2),
       embedding=st.sampled_from(["dense", "auto"]), tie=st.booleans())
def test_any_small_job_matches_blocking(layout, schedule, policy, extra_m, embedding, tie):
    pp, dp = layout
    base = dict(model="gpt-test", data="synthetic", pp=pp, dp=dp, schedule=schedule, steps=3,
                micro_batches=pp + extra_m, micro_batch_size=1, seq_len=16, progress=False, balance="params",
                embedding_comm=embedding, tie_embeddings=tie)
    got, want = run_local([make_config(base, comm_policy=policy), make_config(base, comm_policy="blocking")],
                          timeout_s=180)
    assert len(got) == len(want) == 3
    assert [r["loss"] for r in got] == [r["loss"] for r in want]
