"""The benchmark matrix's verdict per cell, from a bench payload: pure, no testbed."""

from trirace.bench import matrix


def result(system, step, rounds, p2p, losses=(9.0, 8.5)):
    return {"system": system, "step_time_s": step, "round_steps_s": rounds, "lower_bound_s": 1.0,
            "overlap_efficiency": 1.0 / step, "exposed_p2p_s": p2p, "losses": list(losses)}


def payload(**over):
    rows = [result("fifo", 2.0, [1.9, 2.0, 2.2], 0.4), result("priority", 1.6, [1.5, 1.6, 1.7], 0.3),
            result("trirace", 1.5, [1.45, 1.5, 1.6], 0.1), result("torch-1f1b", 1.55, [1.5, 1.55, 1.6], None, (7.0,))]
    return {"results": [dict(r, **over.get(r["system"], {})) for r in rows]}


def test_a_cell_compares_trirace_with_the_fastest_other_system():
    s = matrix.summarize(payload())
    assert s["best_other"] == "torch-1f1b" and s["ratio"] == 1.55 / 1.5
    assert s["trirace_spread_s"] == 1.6 - 1.45
    assert s["exposed_p2p_s"] == {"fifo": 0.4, "priority": 0.3, "trirace": 0.1}  # the peer measures none
    assert s["losses_identical"]  # the peer runs another schedule: not compared


def test_a_policy_with_other_losses_is_flagged():
    s = matrix.summarize(payload(priority={"losses": [9.0, 8.6]}))
    assert not s["losses_identical"]


def test_table_and_heatmap(tmp_path):
    c = matrix.cells()[2]
    p = payload()
    rows = [{"cell": matrix.cell_name(c), "cluster": {"nodes": c.nodes, "ranks_per_node": c.ranks_per_node,
                                                       "link": c.link}, **matrix.summarize(p), "payload": p}]
    for r in p["results"]:
        r.update(tokens_per_s=1.0, vs_blocking=1.0, exposed_allreduce_s=None)
    text = matrix.markdown(rows)
    assert "| 4x1 @ 100mbit | 1.500 ± 0.075 | torch-1f1b 1.550 ± 0.050 | 1.03x |" in text
    matrix.heatmap(rows, tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"
