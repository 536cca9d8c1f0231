"""Soak: a long run whose resident memory must stay flat.

`python -m trirace.bench.soak [--steps N] [--policy P]` trains gpt-test on synthetic data for
N steps (pp=2 x dp=2, 2BW) and prints each rank's resident memory after warm-up and at the
end, and the growth. Not part of the test suite: it takes minutes.
"""

from __future__ import annotations

import argparse
import statistics

from ..config import make_config
from ..runtime import run_local

WARMUP = 20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trirace.bench.soak")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--policy", default="trirace")
    p.add_argument("--model", default="gpt-test")
    args = p.parse_args(argv)
    cfg = make_config(dict(model=args.model, data="synthetic", steps=args.steps, comm_policy=args.policy,
                           progress=False, balance="params", micro_batches=4, micro_batch_size=2, seq_len=64))
    rows = run_local([cfg])[0]
    first, last = rows[WARMUP]["rank_rss_mb"], rows[-1]["rank_rss_mb"]
    print(f"soak: {cfg.model.name} {cfg.parallel.schedule} {cfg.comm.policy} pp={cfg.parallel.pp} dp={cfg.parallel.dp}, {len(rows)} steps, "
          f"median step {statistics.median(r['step_time_s'] for r in rows):.3f} s")
    print("| rank | RSS after warm-up (MB) | RSS at end (MB) | growth |")
    print("|---|---|---|---|")
    for r, (a, b) in enumerate(zip(first, last)):
        print(f"| {r} | {a:.1f} | {b:.1f} | {100 * (b - a) / a:+.2f}% |")
    worst = max((b - a) / a for a, b in zip(first, last))
    print(f"worst growth {100 * worst:+.2f}% ({'flat' if worst < 0.05 else 'GROWING'}: the bound is 5%)")
    return 0 if worst < 0.05 else 1


if __name__ == "__main__":
    raise SystemExit(main())
