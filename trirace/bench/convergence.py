"""Does the asynchronous pipeline train as well as the synchronous one, token for token?

    python -m trirace.bench.convergence --steps 120 --out docs/benchmarks/convergence

Trains gpt-tiny on the standard library's text with a held-out tail, under 1f1b (the
synchronous reference: W(t+1) = W(t) - lr g(W(t))), 2bw (one step of weight delay), and
2bw with each delay compensation (optim.py), for adamw, sgd and muon, with the same seed, data,
schedule of learning rates and steps. All runs share one set of local processes. Writes
convergence.json (the settings and every row), convergence.md (validation loss at equal
tokens, and the steps each run needed to reach a target) and convergence.png (the
validation curves). A long set of runs need not start over: --resume keeps the runs
already saved with the same settings and runs only the missing ones; runs saved but not
asked for this time stay in convergence.json, out of the table.

Wall time is not compared here: on loopback the schedules' speed says nothing about a
network. Time to target on an emulated network is steps-to-target times the step time
`trirace bench` measures there (see the README).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from ..config import make_config
from ..runtime.launch import run_local

RUNS = [("1f1b", "none"), ("2bw", "none"), ("2bw", "predict"), ("2bw", "dc")]
# Each optimizer's rate: high enough that a stale gradient matters. Muon shares AdamW's
# (optim.MuonAdamW scales its update to AdamW's RMS).
LR = {"adamw": 3e-3, "sgd": 0.3, "muon": 3e-3}


def label(schedule: str, compensation: str) -> str:
    return schedule if compensation == "none" else f"{schedule}+{compensation}"


def run(steps: int, eval_every: int, optimizers: list[str], seeds: list[int],
        runs: list[tuple[str, str]] = RUNS, lr: float | None = None,
        done: frozenset[tuple[str, str, int]] = frozenset()) -> list[dict]:
    """Every (optimizer, run, seed) not in `done`, as one batch of local jobs."""
    cfgs, names = [], []
    for seed in seeds:
        for opt in optimizers:
            for schedule, comp in runs:
                if (opt, label(schedule, comp), seed) in done:
                    continue
                rate = LR[opt] if lr is None else lr
                cfgs.append(make_config(dict(model="gpt-tiny", data="stdlib", pp=2, dp=2, steps=steps, seed=seed,
                                             schedule=schedule, delay_compensation=comp, optimizer=opt, lr=rate,
                                             lr_schedule="cosine", warmup_steps=max(1, steps // 20),
                                             min_lr=rate / 10, eval_every=eval_every, eval_batches=4,
                                             balance="params", progress=False)))
                names.append((opt, label(schedule, comp), seed))
    if not cfgs:
        return []
    t0 = time.perf_counter()
    results = run_local(cfgs, timeout_s=None)
    print(f"convergence: {len(cfgs)} runs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return [{"optimizer": o, "run": n, "seed": seed, "rows": rows} for (o, n, seed), rows in zip(names, results)]


FORMAT = 1  # convergence.json's "format": what --resume reads


def _key(result: dict) -> tuple[str, str, int]:
    """(optimizer, run, seed): what names one run among a file's results."""
    return result["optimizer"], result["run"], result["seed"]


def previous(path: Path, steps: int, eval_every: int, lr: float | None) -> list[dict]:
    """The results a --resume keeps from an earlier convergence.json: only runs of the same
    length, evaluation interval and learning rate (a mismatch is an error, not a merge)."""
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        found = saved.get("format") if isinstance(saved, dict) else None
        raise ValueError(f"{path} has format {found!r}; this trirace reads format {FORMAT}: use another --out")
    want = {"steps": steps, "eval_every": eval_every, "lr": lr}
    if saved["settings"] != want or any(
            len(r["rows"]) != steps or [x["step"] for x in r["rows"] if x.get("val_loss") is not None]
            != [t for t in range(steps) if (t + 1) % eval_every == 0 or t == steps - 1] for r in saved["results"]):
        raise ValueError(f"{path} holds runs with other settings than {want}; use another --out")
    return saved["results"]


def curves(result: dict) -> list[tuple[int, float]]:
    """(tokens seen, validation loss) after each evaluation."""
    return [(r["tokens_per_s"] * r["step_time_s"] * (r["step"] + 1), r["val_loss"])
            for r in result["rows"] if r.get("val_loss") is not None]


def steps_to(result: dict, target: float) -> int | None:
    return next((r["step"] + 1 for r in result["rows"] if (r.get("val_loss") or 1e9) <= target), None)


def table(results: list[dict]) -> str:
    """Per seed and optimizer: each run's final validation loss against 1f1b's, and the
    steps it took to reach 1f1b's loss three quarters of the way through (a target every
    run has a fair chance to reach); then, over seeds, the mean difference and its range."""
    opts = list(dict.fromkeys(r["optimizer"] for r in results))
    across = "adamw" in opts and len(opts) > 1  # also hold every run against 1f1b with adamw, the usual baseline
    lines = ["| seed | optimizer | run | final validation loss | vs 1f1b | steps to the target |"
             + (" vs 1f1b adamw | steps to its target |" if across else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if across else "")]
    diffs: dict[tuple[str, str], list[float]] = {}

    def reference(rs: list[dict]) -> tuple[float, float]:
        """1f1b's final validation loss, and its loss three quarters of the way through."""
        evals = [v for _, v in curves(next(r for r in rs if r["run"] == "1f1b"))]
        return evals[-1], evals[(3 * len(evals)) // 4]

    def reached(r: dict, target: float) -> str:
        s = steps_to(r, target)
        return f"{s if s is not None else 'not reached'} (target {target:.4f})"

    for seed in dict.fromkeys(r["seed"] for r in results):
        base = reference([r for r in results if r["optimizer"] == "adamw" and r["seed"] == seed]) \
            if across else None
        for opt in opts:
            mine = [r for r in results if r["optimizer"] == opt and r["seed"] == seed]
            ref_final, target = reference(mine)
            for r in mine:
                final = curves(r)[-1][1]
                diffs.setdefault((opt, r["run"]), []).append(final / ref_final - 1)
                row = f"| {seed} | {opt} | {r['run']} | {final:.4f} | {100 * (final / ref_final - 1):+.2f}% | " \
                      f"{reached(r, target)} |"
                if base:
                    row += f" {100 * (final / base[0] - 1):+.2f}% | {reached(r, base[1])} |"
                lines.append(row)
    if len({r["seed"] for r in results}) > 1:
        lines += ["", "| optimizer | run | mean vs 1f1b over seeds | range |", "|---|---|---|---|"]
        for (opt, name), d in diffs.items():
            lines.append(f"| {opt} | {name} | {100 * sum(d) / len(d):+.2f}% | "
                         f"{100 * min(d):+.2f}% .. {100 * max(d):+.2f}% |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opts = list(dict.fromkeys(r["optimizer"] for r in results))
    seeds = list(dict.fromkeys(r["seed"] for r in results))
    colors = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(r["run"] for r in results))}
    fig, axes = plt.subplots(1, len(opts), figsize=(6 * len(opts), 4), squeeze=False)
    for ax, opt in zip(axes[0], opts):
        for r in results:
            if r["optimizer"] == opt:
                xs, ys = zip(*curves(r))
                i = seeds.index(r["seed"])
                ax.plot([x / 1e6 for x in xs], ys, marker=".", color=colors[r["run"]],
                        ls=("-", "--", ":", "-.")[i % 4],
                        label=r["run"] if len(seeds) == 1 else f"{r['run']}, seed {seeds[i]}")
        ax.set_title(f"gpt-tiny, pp=2 x dp=2, {opt}")
        ax.set_xlabel("tokens (millions)")
        ax.set_ylabel("validation loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=120, help="optimizer steps per run (default: 120)")
    p.add_argument("--eval-every", type=int, default=10, help="steps between evaluations (default: 10)")
    p.add_argument("--optimizers", default="adamw,sgd", help="comma-separated among adamw, sgd, muon (default: adamw,sgd)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, each a full set of runs (default: 0)")
    p.add_argument("--runs", default=",".join(label(*r) for r in RUNS),
                   help="comma-separated among " + ", ".join(label(*r) for r in RUNS) + " (1f1b is always run)")
    p.add_argument("--lr", type=float, help="peak learning rate for every optimizer (default: adamw and muon 3e-3, sgd 0.3)")
    p.add_argument("--out", default="docs/benchmarks/convergence", help="output directory")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs already in OUT/convergence.json (same settings) and run only the missing ones")
    args = p.parse_args(argv)
    opts = [o for o in args.optimizers.split(",") if o]
    known = {label(*r): r for r in RUNS}
    names = ["1f1b"] + [n for n in args.runs.split(",") if n and n != "1f1b"]
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x]
    except ValueError:
        seeds = []
    if args.steps < 2 * args.eval_every or (args.lr is not None and not args.lr > 0) or not opts or any(o not in LR for o in opts) or not seeds \
            or any(n not in known for n in names):
        print("convergence: error: need steps >= 2 x eval-every, a positive lr, optimizers among adamw, sgd, muon, integer seeds and "
              f"runs among {', '.join(known)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        kept = previous(out / "convergence.json", args.steps, args.eval_every, args.lr) if args.resume else []
    except ValueError as e:
        print(f"convergence: error: {e}", file=sys.stderr)
        return 2
    order = {(o, n, s): i for i, (s, o, n) in enumerate(itertools.product(seeds, opts, names))}
    wanted = [r for r in kept if _key(r) in order]
    new = run(args.steps, args.eval_every, opts, seeds, [known[n] for n in names], args.lr,
              frozenset(map(_key, wanted)))
    results = sorted(wanted + new, key=lambda r: order[_key(r)])
    others = [r for r in kept if _key(r) not in order]  # saved, not asked for now
    (out / "convergence.json").write_text(json.dumps(  # the file keeps every run; the table and plot show these
        {"format": FORMAT, "settings": {"steps": args.steps, "eval_every": args.eval_every, "lr": args.lr}, "results": results + others}))
    command = f"python -m trirace.bench.convergence --steps {args.steps} --eval-every {args.eval_every} " \
              f"--optimizers {','.join(opts)} --seeds {','.join(map(str, seeds))} --runs {','.join(names)} " \
              + (f"--lr {args.lr:g} " if args.lr is not None else "") + f"--out {args.out}" \
              + (" --resume" if args.resume else "")
    text = f"`{command}`\n\n{table(results)}\n"
    (out / "convergence.md").write_text(text)
    plot(results, out / "convergence.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
