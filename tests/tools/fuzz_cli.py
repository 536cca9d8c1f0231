"""Fuzz the command line: every case must end in exit 0, or in exit 2 with exactly one line on
stderr, no traceback, and no file left behind.

    python tests/tools/fuzz_cli.py [--cases 1000] [--seed 0]

hypothesis draws a command (train, plan, simulate, bench, profile), a handful of its flags
with values drawn from each flag's own grammar, valid, edge and wrong (a RANK:STEP pair of
--kill from ranks and steps that are negative, zero, inside and outside the job, and the
separator missing or doubled; a rank order from its dp-blocks-K form with every K; a rate
from numbers and units), and the contents of the files
those flags name: YAML configs, topologies and clusters with known and unknown keys and
values of every type, calibrations, text, binary and empty files, directories, paths under
/proc and under a file. train, bench and profile run with --dry-run (every check made
before a process starts, then nothing starts); plan and simulate run for real. Cases run
in-process, each in a fresh directory that is its working directory, so relative outputs
land there and leftovers are seen.

Sizes are drawn small (pp, dp, micro-batches, steps up to 8): a valid case is real work,
and large values are the memory and speed checks' business, not this one's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from trirace.cli import main as cli_main
from trirace.config import FLAGS, TOP_LEVEL, TrainConfig

CASE_TIMEOUT_S = 120  # one case of small sizes taking this long is a finding too

SMALL_INTS = ["-1", "0", "1", "2", "3", "4", "8", "x", "2.5", "", "1e3"]
FLOATS = ["-1", "0", "1e-30", "0.01", "0.5", "2", "1e30", "inf", "nan", "x", ""]
PATHS = ["missing.yaml", "dir", "text.txt", "blob.bin", "empty.txt", "gen.yaml", "cal.json", "new/sub/out",
         "text.txt/under", "/proc/trirace-fuzz", "", "."]
SMALL_MODELS = ["gpt-test", "gpt-tiny", "bert-test", "gpt-9000", ""]
# The parts of the fault-injection pairs: jobs have up to 8 x 8 ranks and 8 steps, so 4, 9 and
# 99 can fall outside one; 86400 s is the longest straggler there is.
RANKS = ["-1", "0", "1", "3", "4", "9", "x", "1.5", ""]
STEPS = ["-3", "-1", "0", "1", "7", "8", "99", "1.5", "x", ""]
SECONDS = ["-0.5", "-0", "0", "0.001", "0.05", "86400", "86401", "1e30", "inf", "nan", "x", ""]
PAIR_SHAPES = ["", "1", ":", "1:2:3", "1;2", " 1 : 2 "]  # the separator missing, doubled, alone
RATE_NUMBERS = ["-5", "0", "0.5", "1", "250", "1e30", "inf", "nan", "x", ""]
RATE_UNITS = ["mbit", "gbit", "kbit", "bit", "GB/s", "MB/s", "mbps", "", "furlongs"]
TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(400))
# Keys of the files the flags name, with values of every type: the loaders see them all.
TOPOLOGY_KEYS = ["nodes", "ranks_per_node", "intra", "inter", "bandwidth", "latency"]
CLUSTER_KEYS = ["base", "name", "nodes", "ranks_per_node", "intra", "inter", "device", "shared_cores",
                "collective_streams", "description", "peak_flops", "memory"]
CALIBRATION_KEYS = ["version", "model", "micro_batch_size", "seq_len", "threads", "forward_s", "backward_s",
                    "optimizer_s_per_param", "cluster", "links", "rows_touched", "host"]


def _scalars() -> st.SearchStrategy:
    return st.one_of(st.none(), st.booleans(), st.integers(-3, 9), st.sampled_from([1e30, -0.5, 0.25, 1e-9]),
                     st.sampled_from(["", "x", "250mbit", "5us", "a100-ib", "gpt-test", "2bw", "1,2", "nan", "inf"]),
                     st.text(max_size=6))


def _values() -> st.SearchStrategy:
    return st.recursive(_scalars(), lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.sampled_from(TOPOLOGY_KEYS), inner,
                                                                            max_size=3)), max_leaves=6)


def _mapping(keys: list[str]) -> st.SearchStrategy:
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(min_size=1, max_size=5)), _values(), max_size=5)


def _file_text(keys: list[str]) -> st.SearchStrategy:
    """A YAML document: mostly a mapping of plausible keys, sometimes anything at all."""
    return st.one_of(_mapping(keys).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
                     st.sampled_from(["", "- a\n- b\n", "pp: [1, 2\n", "{{{", "42\n", "\x00\x01"]),
                     st.text(max_size=40))


def _pair(values: list[str]) -> st.SearchStrategy:
    """RANK:VALUE, each part from its own pool, or a pair of the wrong shape."""
    return st.one_of(st.builds("{}:{}".format, st.sampled_from(RANKS), st.sampled_from(values)),
                     st.sampled_from(PAIR_SHAPES))


def _rate(extra: list[str]) -> st.SearchStrategy:
    """A link rate: a number and a unit, or a word."""
    return st.one_of(st.builds("{}{}".format, st.sampled_from(RATE_NUMBERS), st.sampled_from(RATE_UNITS)),
                     st.sampled_from(["fast", *extra]))


def _flag_value(name: str, field) -> st.SearchStrategy:
    """Pools per config field, by what the field is."""
    import typing

    kind = field.annotation
    args = typing.get_args(kind)
    if name == "model":
        return st.sampled_from(SMALL_MODELS)
    if name == "data":
        return st.sampled_from(["synthetic", "text.txt", "dir", "blob.bin", "empty.txt", "missing", ""])
    if name == "partition":  # layers per stage: a comma-separated list of counts
        return st.lists(st.sampled_from(["-1", "0", "1", "2", "3", "4", "6", "7", "x", ""]), min_size=1,
                        max_size=8).map(",".join)
    if name == "kill":  # RANK:STEP
        return _pair(STEPS)
    if name == "straggler":  # RANK:SECONDS
        return _pair(SECONDS)
    if name == "rank_order":  # auto, dp-inner, pp-inner, dp-blocks-K or pp-blocks-K
        return st.one_of(st.sampled_from(["auto", "dp-inner", "pp-inner", "inner", "random", ""]),
                         st.builds("{}-blocks-{}".format, st.sampled_from(["dp", "pp", "tp"]),
                                   st.sampled_from(["-1", "0", "1", "2", "3", "8", "x", ""])))
    if kind is bool:
        return st.just(None)  # a switch: --flag or --no-flag, drawn by the caller
    if typing.get_origin(kind) is typing.Literal:
        return st.sampled_from([*args, "bogus", ""])
    if name == "resume":
        return st.sampled_from(["off", "auto", "require", None])
    if Path in args:
        return st.sampled_from(PATHS)
    if kind is float or float in args:
        return st.sampled_from(FLOATS)
    return st.sampled_from(SMALL_INTS)


CONFIG_FIELDS = {name: f for name, f in [*((n, TrainConfig.model_fields[n]) for n in TOP_LEVEL),
                                          *((n, info) for n, (_, _, info) in FLAGS.items())]
                 if name not in ("progress", "layer_model")}
JOB_FIELDS = ("model", "pp", "dp", "schedule", "micro_batches", "micro_batch_size", "seq_len", "steps", "optimizer",
              "data", "partition", "balance", "rank_order", "tie_embeddings", "embedding_comm", "partition_mb",
              "credit_mb", "seed")
EXTRA_FLAGS = {
    "simulate": {"--cluster": st.sampled_from(["testbed", "a100-ib", "h100-ib", "a100-roce", "bogus", "gen.yaml",
                                               "missing.yaml", "blob.bin", "dir"]),
                 "--nodes": st.sampled_from(SMALL_INTS), "--ranks-per-node": st.sampled_from(SMALL_INTS),
                 "--link": _rate([]),
                 "--calibration": st.sampled_from(PATHS), "--policy": st.sampled_from(["all", "trirace", "bogus"]),
                 "--sweep": st.just(None), "--json": st.sampled_from(PATHS), "--trace-out": st.sampled_from(PATHS),
                 "--list-clusters": st.just(None)},
    "bench": {"--nodes": st.sampled_from(SMALL_INTS), "--ranks-per-node": st.sampled_from(SMALL_INTS),
              "--link": _rate(["none"]),
              "--mtu": st.sampled_from(["9000", "1500", "100", "70000", "x"]),
              "--rounds": st.sampled_from(SMALL_INTS), "--systems": st.sampled_from(["fifo", "trirace,torch-1f1b",
                                                                                    "bogus", "", ","]),
              "--out": st.sampled_from(PATHS), "--json": st.sampled_from(PATHS), "--matrix": st.just(None)},
    "profile": {"--out": st.sampled_from(PATHS), "--cluster": st.sampled_from(["testbed", "a100-ib", "bogus", ""]),
                "--link": _rate([]), "--mtu": st.sampled_from(["9000", "100", "x"]),
                "--rounds": st.sampled_from(SMALL_INTS), "--probe-seconds": st.sampled_from(FLOATS)},
    "plan": {"--json": st.just(None)},
    "train": {},
}
DRY = ("train", "bench", "profile")


def _config_flags(command: str) -> dict[str, st.SearchStrategy]:
    names = JOB_FIELDS if command in ("simulate", "profile") else CONFIG_FIELDS
    return {"--" + n.replace("_", "-"): _flag_value(n, CONFIG_FIELDS[n]) for n in names} | {
        "--config": st.sampled_from(["gen.yaml", "cfg.yaml", "missing.yaml", "blob.bin", "dir", ""])}


@st.composite
def cases(draw) -> tuple[list[str], dict[str, str]]:
    """(argv, {file name: YAML text}) for one case."""
    command = draw(st.sampled_from(list(EXTRA_FLAGS)))
    pool = _config_flags(command) | EXTRA_FLAGS[command]
    names = draw(st.lists(st.sampled_from(sorted(pool)), max_size=6, unique=True))
    argv = [command]
    for flag in names:
        value = draw(pool[flag])
        bool_field = CONFIG_FIELDS.get(flag[2:].replace("-", "_"))
        if value is None:  # a switch
            negate = bool_field is not None and bool_field.annotation is bool and draw(st.booleans())
            if flag == "--resume":
                argv.append(flag)
            else:
                argv.append("--no-" + flag[2:] if negate else flag)
        else:
            argv.append(f"{flag}={value}" if value.startswith("-") else flag)
            if not value.startswith("-"):
                argv.append(value)
    if command in DRY:
        argv.append("--dry-run")
    if command != "simulate" and "--data" not in names and draw(st.booleans()):
        argv += ["--data", "synthetic"]  # keep most cases off the stdlib tokenizer's first build
    if command != "simulate" and "--model" not in names and draw(st.booleans()):
        argv += ["--model", "gpt-test"]  # and off the default model's layer timing (seconds a case)
    files = {"gen.yaml": draw(_file_text(TOPOLOGY_KEYS + CLUSTER_KEYS + list(CONFIG_FIELDS))),
             "cfg.yaml": yaml.safe_dump(draw(_mapping(list(CONFIG_FIELDS)))),
             "cal.json": json.dumps(draw(st.dictionaries(st.sampled_from(CALIBRATION_KEYS), _values(), max_size=8)))}
    return argv, files


@dataclass
class Finding:
    argv: list[str]
    why: str
    stderr: str


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _alarm(signum, frame):
    raise TimeoutError(f"case ran past {CASE_TIMEOUT_S} s")


def run_case(argv: list[str], files: dict[str, str]) -> tuple[int | None, Finding | None]:
    """Run one case in a fresh directory: (exit status, a Finding when it broke the rules)."""
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="trirace-fuzz-") as tmp:
        root = Path(tmp)
        for name, text in files.items():
            (root / name).write_text(text)
        (root / "text.txt").write_text(TEXT)
        (root / "empty.txt").write_text("")
        (root / "blob.bin").write_bytes(bytes(range(256)) * 8)
        (root / "dir").mkdir()
        before = _tree(root)
        out, err = io.StringIO(), io.StringIO()
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(CASE_TIMEOUT_S)
        try:
            os.chdir(root)
            with redirect_stdout(out), redirect_stderr(err):
                try:
                    code = cli_main(argv)
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - whatever escapes main is the finding
            return None, Finding(argv, "exception escaped main", traceback.format_exc())
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
            os.chdir(cwd)
        text = err.getvalue()
        lines = text.strip().splitlines()
        if "Traceback" in text:
            return code, Finding(argv, f"traceback (exit {code})", text)
        if code not in (0, 2):
            return code, Finding(argv, f"exit status {code}", text)
        if code == 2:
            if len(lines) != 1 or not lines[0].startswith("trirace: error: "):
                return code, Finding(argv, f"exit 2 with {len(lines)} stderr line(s)", text)
            if left := sorted(_tree(root) - before):
                return code, Finding(argv, f"exit 2 left {', '.join(left[:3])} behind", text)
        if code == 0 and argv[0] == "train" and (why := _fault_accepted_wrongly(argv, out.getvalue())):
            return code, Finding(argv, why, out.getvalue())
    return code, None


def _fault_accepted_wrongly(argv: list[str], stdout: str) -> str | None:
    """What an accepted fault flag must mean: a rank of the job, a step it runs (a kill at
    another never fires), a sleep a rank can take. The job is the one the dry run printed."""
    job = re.search(r"^job: \S+ pp=(\d+) dp=(\d+) micro-batches=\d+ steps=(\d+)", stdout, re.M)
    if job is None:
        return None
    world, steps = int(job[1]) * int(job[2]), int(job[3])
    for flag, top in (("--kill", steps - 1), ("--straggler", 86400)):
        given = [a.partition("=")[2] if a.startswith(flag + "=") else argv[i + 1]
                 for i, a in enumerate(argv) if a == flag or a.startswith(flag + "=")]
        if not given:
            continue
        rank, _, part = given[-1].partition(":")
        try:
            r, v = int(rank), float(part)
        except ValueError:
            return f"{flag} {given[-1]!r} accepted, which is not RANK:VALUE"
        if not (0 <= r < world and 0 <= v <= top):
            return f"{flag} {given[-1]} accepted for a job of {world} ranks and {steps} steps"
    return None


def fuzz(n_cases: int, seed_value: int = 0, log=print) -> tuple[int, list[Finding], dict]:
    """Run `n_cases` cases; stop at the first finding (hypothesis shrinks it first). Returns
    (cases run, the finding if any, {(command, exit status): cases})."""
    counts = {"cases": 0}
    outcomes: dict[tuple[str, int | None], int] = {}
    findings: list[Finding] = []
    seen: set[tuple] = set()
    t0 = time.monotonic()

    @seed(seed_value)
    @settings(max_examples=n_cases, deadline=None, database=None, print_blob=False, report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def one(case):
        argv, files = case
        counts["cases"] += 1
        # A case that names none of its files is the same case as any other with its argv.
        key = (tuple(argv), *(sorted(files.items()) if any(n in a for a in argv for n in files) else ()))
        if key in seen:
            return
        seen.add(key)
        code, found = run_case(argv, files)
        outcomes[(argv[0], code)] = outcomes.get((argv[0], code), 0) + 1
        if found is not None:
            findings.append(found)
            raise AssertionError(found.why)
        if counts["cases"] % 50 == 0:
            log(f"fuzz_cli: {counts['cases']} cases, {time.monotonic() - t0:.0f} s, nothing found")

    try:
        one()
    except AssertionError:
        pass
    return counts["cases"], findings[-1:], outcomes  # the last finding is the shrunk one


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tests/tools/fuzz_cli.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000, help="cases to run (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed (default: 0)")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    n, findings, outcomes = fuzz(args.cases, args.seed, log=lambda s: print(s, file=sys.stderr, flush=True))
    took = time.monotonic() - t0
    for command in EXTRA_FLAGS:
        print(f"  {command:9s} " + ", ".join(f"exit {code}: {k}" for (c, code), k in sorted(
            outcomes.items(), key=lambda kv: str(kv[0])) if c == command))
    if findings:
        f = findings[0]
        print(f"fuzz_cli: FOUND after {n} cases ({took:.0f} s): {f.why}\n  trirace {' '.join(f.argv)}\n{f.stderr}")
        return 1
    print(f"fuzz_cli: {n} cases in {took:.0f} s, nothing found (seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
