"""Corpora that do not fit in memory: how fast one prepares, and what training on one costs
each rank in memory.

    python -m trirace.bench.data_scale --work /tmp/data-scale

1. Writes a text corpus of --text-mb MB (seeded lines of words) and runs `trirace data
   prepare` on it as a user would; its own line gives the throughput. The bench fails when it
   takes longer than --prepare-limit-s.
2. Writes a prepared corpus of --tokens token ids (uniform ids and a document end every
   1000, straight to shards: encoding that much text here would take long and measure
   nothing new), then trains the same job on it and on `--data synthetic`, and prints each
   run's highest peak resident memory over its ranks. The bench fails when the prepared
   corpus's is 1.5 times the synthetic run's or more: reading by memory map, a rank holds
   only the pages of the windows it draws.

Exit status 0 when both hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..data.prepare import write_shard
from ..data.shards import FORMAT, INDEX, VERSION

JOB = ["--model", "gpt-test", "--pp", "2", "--dp", "2", "--micro-batches", "4", "--micro-batch-size", "4",
       "--seq-len", "64", "--balance", "params", "--no-progress"]
SHARD_TOKENS = 1 << 24
VOCAB = 2048  # gpt-test's


def text_corpus(path: Path, megabytes: float, seed: int = 0) -> None:
    """Lines of Zipf-weighted words: 4 MB generated, then written again in other line orders."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(30_000)]
    weights = [1 / (i + 1) for i in range(len(words))]
    lines, size = [], 0
    while size < 4_000_000:
        lines.append(" ".join(rng.choices(words, weights, k=rng.randint(4, 20))) + rng.choice(".,;:!?"))
        size += len(lines[-1]) + 1
    target, written = int(megabytes * 1e6), 0
    with open(path, "w") as f:
        while written < target:
            rng.shuffle(lines)
            block = "\n".join(lines) + "\n"
            block = block[:target - written]
            f.write(block)
            written += len(block)


def token_corpus(out: Path, tokens: int, seed: int = 0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shards, left, n = [], tokens, 0
    while left > 0:
        ids = rng.integers(3, VOCAB, min(left, SHARD_TOKENS), dtype=np.uint16)
        ids[999::1000] = 0  # a document ends
        entry = write_shard(out, n, ids, "uint16")
        entry.update(documents=int((ids == 0).sum()) + (n == 0), key="synthetic", source=[])
        shards.append(entry)
        left, n = left - len(ids), n + 1
    index = {"format": FORMAT, "version": VERSION, "dtype": "uint16", "tokens": tokens,
             "documents": sum(e["documents"] for e in shards), "field": None,
             "tokenizer": {"source": "uniform ids written by trirace.bench.data_scale", "vocab_size": VOCAB,
                           "eot_id": 0, "sha256": "", "recipe": None}, "shards": shards}
    (out / INDEX).write_text(json.dumps(index, indent=1))


def _trirace(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trirace", *argv], capture_output=True, text=True)


def peak_rss_mb(data: str, steps: int, metrics: Path) -> float:
    p = _trirace("train", *JOB, "--steps", str(steps), "--data", data, "--metrics-out", str(metrics))
    if p.returncode:
        sys.exit(f"training on {data} failed: {p.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return max(max(r["rank_peak_rss_mb"]) for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="where the corpora go (about 1 GB)")
    ap.add_argument("--text-mb", type=float, default=100.0, help="text to prepare, in MB (default: 100)")
    ap.add_argument("--prepare-limit-s", type=float, default=60.0, help="(default: 60)")
    ap.add_argument("--tokens", type=float, default=200e6, help="ids in the prepared corpus (default: 2e8)")
    ap.add_argument("--steps", type=int, default=20, help="training steps of each run (default: 20)")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    ok = True

    text = args.work / "text.txt"
    if not text.exists() or text.stat().st_size != int(args.text_mb * 1e6):
        text_corpus(text, args.text_mb)
    out = args.work / "text-prepared"
    shutil.rmtree(out, ignore_errors=True)  # the whole prepare is timed, not a rerun's check
    t0 = time.perf_counter()
    p = _trirace("data", "prepare", str(text), "--out", str(out), "--no-progress")
    took = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"prepare failed: {p.stderr.strip()}")
    print(p.stdout.strip())
    ok &= took < args.prepare_limit_s
    print(f"prepare: {args.text_mb:.0f} MB of text in {took:.1f} s, the command's whole run (limit "
          f"{args.prepare_limit_s:.0f} s): {'ok' if took < args.prepare_limit_s else 'FAIL'}")

    tokens = args.work / "tokens-prepared"
    if not (tokens / INDEX).is_file() or json.loads((tokens / INDEX).read_text())["tokens"] != int(args.tokens):
        token_corpus(tokens, int(args.tokens))
    on_disk = peak_rss_mb(str(tokens), args.steps, args.work / "prepared.jsonl")
    synthetic = peak_rss_mb("synthetic", args.steps, args.work / "synthetic.jsonl")
    ratio = on_disk / synthetic
    ok &= ratio < 1.5
    print(f"peak resident memory per rank, gpt-test pp=2 dp=2, {args.steps} steps: {on_disk:.0f} MB on "
          f"{int(args.tokens):,} prepared tokens ({tokens}), {synthetic:.0f} MB on --data synthetic: "
          f"{ratio:.2f}x (limit 1.5x): {'ok' if ratio < 1.5 else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
