"""Write docs/cli.md, the reference of every `trirace` subcommand and flag, from the CLI's
own argparse parser, so the page lists exactly the flags the command takes.

    python scripts/gen_cli_doc.py            # writes docs/cli.md
    python scripts/gen_cli_doc.py --check    # exit 1 when docs/cli.md is out of date

A flag's meaning is its --help text, or the longer note in NOTES below where one exists.
Its default is the one in DEFAULTS, else the "(default: ...)" that ends its --help text,
else argparse's default.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trirace.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"

# Subcommands in the order a user meets them.
ORDER = ("train", "data", "plan", "simulate", "profile", "bench", "testbed", "commcheck", "checkpoint", "generate")

# Longer notes than --help has room for, keyed by "--flag" for train's job flags (wherever
# a command shares them) or by "command --flag". --help's text serves every flag not here.
NOTES = {
    "profile --out": "the calibration file to write, for `trirace simulate --calibration`",
    "--config": "a YAML file whose keys are the flag names (`micro_batches` or `micro-batches`); "
                "flags given on the command line win over it",
    "--model": "a preset: `gpt-test`, `gpt-tiny`, `gpt2-small`, `gpt2-medium`, `gpt2-xl`, `bert-test`, "
               "`bert-base`, `bert-large`, `llama-test`, `llama-tiny`, `llama-1b` (TinyLlama's shape), "
               "`llama-7b` (Llama-2-7B's); a shape file `my.yaml` (`arch: gpt|bert|llama`, `vocab_size`, "
               "`d_model`, `n_layers`, `n_heads`, `n_kv_heads`, `d_ff`, `max_seq_len`, `tie_embeddings`); "
               "or `hf:DIR`, a local Hugging Face GPT-2 or Llama directory (its weights when it has "
               "safetensors, each stage reading only its own tensors; its `tokenizer.json` when it has one; "
               "never a download; needs the `hf` extra)",
    "--pp": "pipeline depth: the number of stages",
    "--dp": "data-parallel width: replicas of each stage",
    "--schedule": "`2bw` (PipeDream-2BW: no flush, one-step weight delay), `1f1b` (PipeDream-Flush, "
                  "synchronous), `zb-h1` (synchronous, 1F1B's peak memory, each backward split into its "
                  "input-gradient part and its weight-gradient part, which fills the bubbles), `gpipe` "
                  "(all forwards, then all backwards)",
    "--micro-batches": "micro-batches per step, per replica",
    "--lr": "peak learning rate (after warm-up)",
    "--optimizer": "`adam`, `adamw` (decoupled decay), `sgd`, or `muon` (torch's Muon on the hidden "
                   "layers' weight matrices, AdamW on embeddings, head, norms and biases, one learning rate "
                   "for both; the optimizer to use with 2bw)",
    "--weight-decay": "decoupled for adamw and muon; L2 for adam and sgd",
    "--lr-schedule": "`constant`, `cosine` or `linear`: after the linear warm-up, decay to `--min-lr` at "
                     "the last step",
    "--delay-compensation": "2bw only: `none`; `predict` (weight prediction: the optimizer publishes "
                            "2 W(t+1) - W(t), so a step's gradient is taken near the weights it will update); "
                            "`dc` (DC-ASGD-a: the stale gradient corrected to first order). Both keep two "
                            "weight buffers, and losses still agree bitwise across policies",
    "--clip-grad": "clip the global gradient norm, over every stage and replica, of the gradient each "
                   "update applies (under 2bw, the delayed one)",
    "--on-nonfinite": "on a non-finite loss or gradient norm: `stop` at that update, before applying it, "
                      "with one line and exit status 3; or `skip` that update on every rank",
    "--precision": "`fp32`, or `bf16`: autocast compute, with fp32 master weights, loss and stage boundaries",
    "--grad-comm-dtype": "what gradients cross the data-parallel links in; `bf16` halves the bytes",
    "--recompute": "each transformer block keeps only its input and recomputes its activations in "
                   "backward: 2bw's main memory lever",
    "--eval-every": "held-out loss and perplexity after every N steps and after the last (0: off). The "
                    "held-out part is fixed by the corpus and never trains, evaluation on or off: `synthetic`'s "
                    "own second draw, a `.bin` file's `val.bin` sibling, else the corpus's last 5% of tokens",
    "--memory-check": "refuse, before any process starts, a job whose estimated per-rank peak exceeds the "
                      "memory here (host RAM / local ranks, or the GPU's); `--no-memory-check` skips it",
    "--data": "`stdlib` (the Python standard library's own sources), `synthetic`, or a file or directory "
              "of text, tokenised with a BPE vocabulary trained on the spot and cached in `~/.cache/trirace`; "
              "or, read by memory map without loading, a directory `trirace data prepare` wrote or a flat "
              "`.bin` file of token ids (nanoGPT's `train.bin`, see `--data-dtype`)",
    "--partition": "layers per stage, e.g. `3,4`; without it the partitioner balances (see `--balance`)",
    "--balance": "what the partitioner balances: each layer's measured `time`, or `params`",
    "--rank-order": "`auto` (the fastest candidate by prediction, shown by `trirace plan` and at start-up), "
                    "`dp-inner` (replicas of a stage on adjacent ranks), `pp-inner`, or the mixes "
                    "`dp-blocks-K` / `pp-blocks-K` (K replicas, or K stages, adjacent)",
    "--topology": "a YAML file of nodes, ranks per node and link figures; without it, detected",
    "--embedding-comm": "how replicas exchange the token table's gradient: `dense` all-reduce, `allgather` "
                        "or `alltoall` of the touched rows, or `auto` (picks by a cost model)",
    "--tie-embeddings": "share the token table with the output head, across stages too",
    "--comm-policy": "`blocking` (PipeDream-2BW's one flattened all-reduce), `fifo` (DDP-like buckets), "
                     "`priority` (ByteScheduler-like chunks), `trirace` (P2P first, gradient chunks by "
                     "deadline, fitted into the gaps between P2P transfers)",
    "--partition-mb": "all-reduce chunk size in MiB",
    "--credit-mb": "bound on all-reduce MiB in flight",
    "--autotune": "tune chunk and credit sizes in the first steps; every rank takes the same decision",
    "--metrics-out": "one JSON object per step: loss, step time, tokens/s, exposed communication per kind, "
                     "gradient norm, learning rate, validation loss, peak memory per rank, each rank's CPU "
                     "and wake-ups, and how the reporting rank's host spent its cores' time",
    "--trace-out": "`DIR/trace.json`, a Chrome/Perfetto timeline of every rank; each computation carries "
                   "its thread's CPU seconds (`cpu_s`), below its wall time where cores were shared",
    "--comm-log": "`DIR/rank-R.jsonl`: every op each rank issues and every host wait, in issue order, "
                  "for `trirace commcheck DIR`",
    "--backend": "`auto` (nccl where every local rank has a CUDA device of its own, else gloo), `gloo`, `nccl`",
    "--checkpoint-dir": "checkpoints go here: per step, a manifest and one atomically written file per layer "
                        "(`trirace checkpoint info DIR` shows what one holds)",
    "--resume": "continue from the newest complete checkpoint in `--checkpoint-dir`, at any pp, dp, partition "
                "or rank order (bitwise at the layout that wrote it); with none "
                "there, `auto` (what a bare `--resume` means) says so and starts from step 0, and `require` "
                "stops with exit status 2",
    "--fail-timeout-s": "a rank waiting this long (seconds) on a peer gives up, saying where",
    "--straggler": "fault injection, `RANK:SECONDS`: that rank sleeps after every forward",
    "--kill": "fault injection, `RANK:STEP`: that rank is killed when the step starts (first attempt only)",
    "--export-hf": "after the last step, write a Hugging Face directory (config.json, one safetensors "
                   "shard per stage and their index, the tokenizer) that `transformers` loads; needs the "
                   "`hf` extra",
    "--overwrite": "let `--export-hf` replace a directory that is not empty",
}

# Defaults that depend on other flags, where --help says so in prose.
DEFAULTS = {
    "--lr": "1e-3; sgd: 0.1",
    "--weight-decay": "adamw, muon: 0.01; adam, sgd: 0",
}

INTRO = """\
# trirace command line

Generated from the CLI's parser by `python scripts/gen_cli_doc.py`; do not edit by hand.
`trirace COMMAND --help` prints the same flags.

Every bad input ends in one line on stderr and exit status 2, before any process starts:
flags, YAML and JSON files, and output paths (proven writable without creating them).
`train`, `bench` and `profile` take `--dry-run`, which runs those checks and starts nothing.

Many commands share the job flags of `train` (`--model`, `--pp`, `--dp` and so on); their
sections list only the flags of their own and name the shared ones.
"""


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _summaries(p: argparse.ArgumentParser) -> dict[str, str]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return {c.dest: c.help or "" for c in a._choices_actions}
    return {}


def _flag(a: argparse.Action) -> str:
    if not a.option_strings:
        return f"`{a.metavar or a.dest}`"
    names = [s for s in a.option_strings if s.startswith("--")]
    if isinstance(a, argparse.BooleanOptionalAction):
        return f"`--[no-]{names[0][2:]}`"
    name = names[0]
    if a.nargs == 0:
        return f"`{name}`"
    if a.choices:
        shown = "|".join(str(c) for c in a.choices)
        return f"`{name} [{shown}]`" if a.nargs == "?" else f"`{name} {shown}`"
    return f"`{name} {a.metavar or a.dest.upper()}`"


def _split_default(text: str) -> tuple[str, str | None]:
    """'pipeline depth (default: 2)' -> ('pipeline depth', '2')."""
    mark = "(default: "
    if text.endswith(")") and mark in text:
        i = text.rfind(mark)
        return text[:i].rstrip(), text[i + len(mark):-1]
    return text, None


def _row(cmd: str, a: argparse.Action, shared: bool) -> tuple[str, str, str]:
    meaning, default = _split_default(a.help or "")
    name = next((s for s in a.option_strings if s.startswith("--")), None)
    if name:
        meaning = NOTES.get(f"{cmd} {name}") or (NOTES.get(name) if shared else None) or meaning
        if shared and DEFAULTS.get(name):
            default = DEFAULTS[name]
    if default is None and a.default not in (None, False, argparse.SUPPRESS) and a.nargs != 0:
        default = str(a.default)
    if default is not None:
        default = default.split(", where ")[0]  # "250mbit, where ... here" -> "250mbit"
    if default in ("True", "False"):
        default = "on" if default == "True" else "off"
    if a.nargs == 0 and default is None:
        default = "off"
    if a.required:
        default = "required"
    cells = (_flag(a), meaning, f"`{default}`" if default else "none")
    return tuple(c.replace("|", "\\|") for c in cells)


def _shown(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _section(name: str, summary: str, p: argparse.ArgumentParser, shared: dict[str, str], depth: int = 2) -> list[str]:
    lines = [f"{'#' * depth} `trirace {name}`", "", summary[0].upper() + summary[1:] + ".", ""]
    own, common = [], []
    for a in _shown(p):
        key = a.option_strings[0] if a.option_strings else None
        is_shared = key in shared and shared[key] == (a.help or "")
        if name != "train" and is_shared:
            common.append(key)
        else:
            own.append((a, is_shared))
    if common:
        lines += ["The job flags of `train`: " + ", ".join(f"`{k}`" for k in common) + ".", ""]
    if own:
        lines += ["| flag | meaning | default |", "|---|---|---|"]
        lines += ["| " + " | ".join(_row(name, a, is_shared)) + " |" for a, is_shared in own]
        lines.append("")
    for sub, sp in _subparsers(p).items():
        lines += _section(f"{name} {sub}", _summaries(p)[sub], sp, shared, depth + 1)
    return lines


def render() -> str:
    parser = build_parser()
    subs, summaries = _subparsers(parser), _summaries(parser)
    train = subs["train"]
    shared = {a.option_strings[0]: a.help or "" for a in _shown(train) if a.option_strings}
    names = [n for n in ORDER if n in subs] + [n for n in subs if n not in ORDER]
    lines = [INTRO, "| command | what it does |", "|---|---|"]
    lines += [f"| [`{n}`](#trirace-{n}) | {summaries[n]} |" for n in names]
    lines.append("")
    for n in names:
        lines += _section(n, summaries[n], subs[n], shared)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md differs from the parser")
    args = ap.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/gen_cli_doc.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
