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
    except UsageError as e:
        print(f"trirace: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trirace: interrupted", file=sys.stderr)
        return 130
    return 0


def _train(args: argparse.Namespace) -> int:
    from .runtime import WorkerFailed, train  # torch is imported only once the flags are sane

    values = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    cfg = make_config(values, config_file=args.config)
    try:
        train(cfg)
    except WorkerFailed as e:
        print(f"trirace: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
