"""The `trirace` command. Flags are generated from TrainConfig's fields, so a flag and its
YAML key are one declaration with one default and one validation (in config.py).

argparse (standard library) is enough for subcommands; its error() is overridden so that
every bad input ends in one line on stderr and exit status 2, like every UsageError.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path

from .config import TrainConfig, make_config
from .errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"trirace: error: {message}\n")


def _add_config_flags(p: argparse.ArgumentParser, model: type[TrainConfig]) -> None:
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file with the same keys as the flags")
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind = field.annotation
        shown = field.default if field.default is not None else "see below"
        help_ = f"{field.description or name.replace('_', ' ')} (default: {shown})"
        kw: dict = {"dest": name, "default": None, "help": help_ if field.default is not None else field.description}
        if kind is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            continue
        args = typing.get_args(kind)
        if typing.get_origin(kind) is typing.Literal:
            kw["choices"] = list(args)
        elif kind in (int, float) or int in args or float in args:
            kw["type"] = float if (kind is float or float in args) else int
            kw["metavar"] = "N"
        elif name == "partition":
            kw["metavar"] = "N,N,..."
        elif Path in args:
            kw["metavar"] = "FILE"
        p.add_argument(flag, **kw)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trirace", description="Hybrid pipeline x data parallel training with "
                     "multidimensional communication scheduling.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    train = sub.add_parser("train", help="train a model (spawns pp x dp local processes, or runs under torchrun)")
    _add_config_flags(train, TrainConfig)
    bench = sub.add_parser("bench", help="run the communication policies side by side and compare them")
    _add_config_flags(bench, TrainConfig)
    bench.add_argument("--rounds", type=int, default=2, help="interleaved rounds per policy (default: 2)")
    bench.add_argument("--policies", default="blocking,fifo,priority,trirace", help="comma-separated policies")
    bench.add_argument("--json", metavar="FILE", help="write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a bad flag already reported in one line
        return int(e.code or 0)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "bench":
            return _bench(args)
    except UsageError as e:
        print(f"trirace: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trirace: interrupted", file=sys.stderr)
        return 130
    return 0


def _config(args: argparse.Namespace, **defaults) -> TrainConfig:
    values = {k: getattr(args, k) for k in TrainConfig.model_fields}
    return make_config({**defaults, **{k: v for k, v in values.items() if v is not None}}, config_file=args.config)


def _train(args: argparse.Namespace) -> int:
    from .runtime import WorkerFailed, train  # torch is imported only once the flags are sane

    cfg = _config(args)
    try:
        train(cfg)
    except WorkerFailed as e:
        print(f"trirace: {e}", file=sys.stderr)
        return 1
    return 0


def _bench(args: argparse.Namespace) -> int:
    import json

    from .bench import policies as bench
    from .comm import POLICIES

    chosen = tuple(p.strip() for p in args.policies.split(","))
    if bad := [p for p in chosen if p not in POLICIES]:
        raise UsageError(f"unknown policy {bad[0]!r}; choose from {', '.join(POLICIES)}")
    if args.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    cfg = _config(args, steps=8)
    print(f"bench: {cfg.model} {cfg.schedule} pp={cfg.pp} dp={cfg.dp} m={cfg.micro_batches} "
          f"{cfg.tokens_per_step} tokens/step, {args.rounds} rounds x {cfg.steps} steps per policy, loopback",
          flush=True)
    results = bench.run(cfg, chosen, args.rounds)
    print(bench.table(results))
    if args.json:
        payload = {"config": cfg.model_dump(mode="json"), "results": [r.__dict__ for r in results]}
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
