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

from .policy.policies import POLICIES as POLICY_NAMES
from . import preflight
from .config import FLAGS, TOP_LEVEL, TrainConfig, make_config
from .errors import Diverged, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"trirace: error: {message}\n")


def _add_config_flags(p: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """One flag per option of TrainConfig (config.FLAGS), grouped by its section in --help."""
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file with the same keys as the flags")
    options = [(name, "run", TrainConfig.model_fields[name]) for name in TOP_LEVEL]
    options += [(name, section, info) for name, (section, _, info) in FLAGS.items()]
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, section, field in options:
        if (only is not None and name not in only) or name == "layer_model":  # layer_model: Python API only
            continue
        if section not in groups:
            groups[section] = p.add_argument_group(f"{section} options")
        _add_flag(groups[section], name, field)


def _add_flag(p: argparse._ArgumentGroup, name: str, field) -> None:
    flag = "--" + name.replace("_", "-")
    kind = field.annotation
    shown = field.default if field.default is not None else "see below"
    help_ = f"{field.description or name.replace('_', ' ')} (default: {shown})"
    kw: dict = {"dest": name, "default": None, "help": help_ if field.default is not None else field.description}
    if kind is bool:
        p.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        return
    if name == "resume":  # a bare --resume means auto
        p.add_argument(flag, nargs="?", const="auto", choices=typing.get_args(kind), **kw)
        return
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Literal:
        kw["choices"] = list(args)
    elif kind in (int, float) or int in args or float in args:
        kw["type"] = float if (kind is float or float in args) else int
        kw["metavar"] = "N"
    elif name == "partition":
        kw["metavar"] = "N,N,..."
    elif Path in args:
        kw["metavar"] = "DIR" if name in ("checkpoint_dir", "trace_out", "comm_log", "export_hf") else "FILE"
    p.add_argument(flag, **kw)


SYSTEMS = ("blocking", "fifo", "priority", "trirace", "torch-1f1b")
# What shapes a job's time: the flags simulate and profile share with train.
JOB_FIELDS = ("model", "pp", "dp", "schedule", "micro_batches", "micro_batch_size", "seq_len", "steps", "optimizer",
              "data", "data_dtype", "partition", "balance", "rank_order", "tie_embeddings", "embedding_comm", "partition_mb",
              "credit_mb", "seed", "precision", "recompute", "grad_comm_dtype")


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=4, help="emulated nodes (default: 4)")
    p.add_argument("--ranks-per-node", type=int, default=1, help="ranks per node (default: 1)")
    p.add_argument("--link", help="each node's link rate, or 'none' for plain loopback (default: 250mbit, where "
                   "communication is comparable to computation here; under --emulate PRESET, the preset's "
                   "inter-node rate / (dilation x byte scale))")
    p.add_argument("--mtu", type=int, default=9000, help="MTU of the emulated links (default: 9000)")


def _add_dry_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="check every flag, input file and output path, "
                   "say what would run, and start nothing")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trirace", description="Hybrid pipeline x data parallel training with "
                     "multidimensional communication scheduling.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    train = sub.add_parser("train", help="train a model (spawns pp x dp local processes, or runs under torchrun)")
    _add_config_flags(train)
    _add_dry_run(train)
    bench = sub.add_parser("bench", help="every communication policy and the torch.distributed.pipelining peer, "
                           "side by side on an emulated cluster")
    _add_config_flags(bench)
    _add_cluster_flags(bench)
    bench.add_argument("--rounds", type=int, default=3, help="interleaved rounds per system; the table shows each "
                       "round's median as the spread (default: 3)")
    bench.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated (default: {','.join(SYSTEMS)})")
    bench.add_argument("--schedules", metavar="LIST", help="comma-separated schedules (e.g. 1f1b,zb-h1): every "
                       "policy of --systems runs each, as the system SCHEDULE/POLICY, and torch-1f1b becomes "
                       "SCHEDULE/torch, torch's executor of 1f1b and zb-h1 (default: --schedule alone)")
    bench.add_argument("--matrix", action="store_true", help="every system in every cell of 4x1 and 2x2 nodes x "
                       "ranks at 500, 250, 100 and 50 Mbit (the cluster flags are not used); writes matrix.json, "
                       "matrix.md and matrix.png to --out")
    bench.add_argument("--out", default="bench-out", metavar="DIR", help="bench.json, bench.md, bench.png (default: bench-out)")
    bench.add_argument("--json", metavar="FILE", help="also write the JSON here")
    _add_dry_run(bench)
    plan = sub.add_parser("plan", help="print the job plan a train command would run (partition, placement, "
                          "policies, schedule, reduction), without training")
    _add_config_flags(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    check = sub.add_parser("commcheck", help="replay the logs of --comm-log DIR under NCCL's rules: "
                           "exit 0 when clean, 1 naming the first deadlock or mismatch")
    check.add_argument("dir", metavar="DIR", help="the directory train --comm-log wrote (rank-R.jsonl files)")
    check.add_argument("--model", choices=("strict", "streams"), default="strict",
                       help="strict: each rank's device runs one kernel at a time, in launch order across its "
                            "communicators and compute (what NCCL can do); streams: one in-order stream per "
                            "communicator and rank, device syncs ignored (default: strict)")
    gen = sub.add_parser("generate", help="sample text from a trained model (a checkpoint or a Hugging Face "
                         "directory) on one process")
    gen.add_argument("--checkpoint", required=True, metavar="DIR",
                     help="a --checkpoint-dir (its newest complete step) or an --export-hf / Hugging Face directory")
    gen.add_argument("--prompt", required=True, help="the text to continue")
    gen.add_argument("--max-new-tokens", type=int, default=32, help="tokens to add (default: 32)")
    gen.add_argument("--top-k", type=int, default=1, help="sample among the k likeliest tokens (default 1: greedy)")
    gen.add_argument("--temperature", type=float, default=1.0, help="softmax temperature for top-k (default: 1)")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    gen.add_argument("--data", default="stdlib", help="the data the model was trained on, for its tokenizer when "
                     "the directory has no tokenizer.json (default: stdlib)")
    ck = sub.add_parser("checkpoint", help="inspect a checkpoint directory")
    csub = ck.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser, required=True)
    ck_info = csub.add_parser("info", help="print what a checkpoint holds: its step, model, optimizer, weight "
                              "versions, layer files and their sizes, and whether it is complete")
    ck_info.add_argument("dir", metavar="DIR", help="a --checkpoint-dir (its newest complete step) or one step-NNNNNN "
                         "directory in it")
    sim = sub.add_parser("simulate", help="predict iteration time, overlap and memory of a job on a cluster, "
                         "without running it (same schedules and policies, simulated executor)")
    _add_config_flags(sim, JOB_FIELDS)
    sim.add_argument("--cluster", default="testbed", help="preset (see --list-clusters) or YAML file (default: testbed)")
    sim.add_argument("--nodes", type=int, help="nodes (default: as many as pp x dp needs)")
    sim.add_argument("--ranks-per-node", type=int, help="devices per node (default: the preset's)")
    sim.add_argument("--link", help="inter-node rate per node, e.g. 250mbit, 100gbit, 25GB/s (default: the preset's)")
    sim.add_argument("--calibration", metavar="FILE", help="measurements from trirace profile (default: FLOP model)")
    sim.add_argument("--policy", default="all", choices=[*POLICY_NAMES, "all"], help="communication policy (default: all)")
    sim.add_argument("--sweep", action="store_true", help="rank every pp x dp layout (same global batch) and policy, then chunk sizes for the best")
    sim.add_argument("--json", metavar="FILE", help="write the results as JSON")
    sim.add_argument("--trace-out", metavar="DIR", help="write a Chrome/Perfetto timeline of the simulated run")
    sim.add_argument("--list-clusters", action="store_true", help="list the cluster presets and exit")
    prof = sub.add_parser("profile", help="measure per-layer compute, links and data here; write a calibration file "
                          "for trirace simulate",
                          description="Time each layer and the optimizer on the job's device, probe the loopback "
                          "link, count the rows the data touches; write a calibration file for trirace simulate "
                          "--calibration and print what was measured. About a minute for a small model. --link adds "
                          "an emulated inter-node link (root); --contention adds what ranks sharing this host's cores "
                          "cost each other (several minutes).")
    _add_config_flags(prof, JOB_FIELDS)
    prof.add_argument("--out", default="calibration.json", metavar="FILE", help="(default: calibration.json)")
    prof.add_argument("--cluster", default="testbed", help="the cluster preset this machine stands for (default: testbed)")
    prof.add_argument("--link", help="also measure an emulated inter-node link of this rate (root; e.g. 250mbit)")
    prof.add_argument("--mtu", type=int, default=9000, help="MTU of that emulated link (default: 9000)")
    prof.add_argument("--contention", action="store_true",
                      help="also measure what ranks sharing this host's cores cost each other: the contention of "
                      "k ranks computing at once and the CPU a transfer takes from them, beside a short real run's "
                      "wake-ups (only for a cluster whose ranks share cores, the testbed; takes several minutes). "
                      "Without it the simulator takes the cores as ideal and transfers as free of CPU")
    prof.add_argument("--rounds", type=int, default=3, help="with --contention: read its probes this many times, "
                      "spread over the profile, and keep the medians (default: 3)")
    prof.add_argument("--probe-seconds", type=float, default=4.0, metavar="S",
                      help="with --contention: each contention window's length (default: 4)")
    _add_dry_run(prof)
    data = sub.add_parser("data", help="prepare a corpus: tokenise it once into shards that training reads by "
                          "memory map (--data DIR)")
    dsub = data.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser, required=True)
    prep = dsub.add_parser("prepare", help="tokenise a text file, a directory of text, or JSON lines into token "
                           "shards and an index",
                           description="Tokenise SRC (a text file, a directory of text files, or .jsonl files of "
                           "one document per line) into shards of uint16 or uint32 token ids plus index.json, in "
                           "parallel over the source's pieces. Train on the result with --data DIR. Interrupted, the "
                           "same command goes on from the shards already written.")
    prep.add_argument("src", metavar="SRC", help="a text file, a directory of text files, or JSON lines (.jsonl)")
    prep.add_argument("--out", required=True, metavar="DIR", help="the prepared corpus's directory (new, or one an "
                      "earlier prepare wrote)")
    tok = prep.add_mutually_exclusive_group()
    default_vocab = TrainConfig().spec.vocab_size
    tok.add_argument("--vocab", type=int, metavar="N", help="train a byte-level BPE of N tokens on the corpus, as "
                     f"--data FILE does for a model of that vocabulary (default: {default_vocab}, the default "
                     "model's)")
    tok.add_argument("--tokenizer", metavar="hf:DIR", help="use a Hugging Face model's tokenizer.json (a directory "
                     "or the file) instead")
    prep.add_argument("--field", metavar="NAME", help="the text field of each JSON line (default: text)")
    prep.add_argument("--dtype", choices=("uint16", "uint32"), help="the ids' type (default: uint16 for a vocabulary "
                      "of up to 65536 tokens, else uint32)")
    prep.add_argument("--workers", type=int, metavar="N", help="processes encoding at once (default: one per core)")
    prep.add_argument("--shard-mb", type=float, default=16.0, metavar="MB",
                      help="source text per shard, in MB (default: 16)")
    prep.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                      help="show a progress bar (default: on)")
    testbed = sub.add_parser("testbed", help="build or remove an emulated multi-node cluster (root)")
    tsub = testbed.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser, required=True)
    _add_cluster_flags(tsub.add_parser("up", help="namespaces, veth pairs to a bridge, tbf-shaped links"))
    tsub.add_parser("down", help="remove every namespace the testbed made")
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
        if args.command == "testbed":
            return _testbed(args)
        if args.command == "data":
            return _data(args)
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "profile":
            return _profile(args)
        if args.command == "plan":
            return _plan(args)
        if args.command == "generate":
            from .generate import main as generate

            return generate(args.checkpoint, args.prompt, args.max_new_tokens, args.top_k, args.temperature,
                            args.seed, args.data)
        if args.command == "checkpoint":
            from .runtime.checkpoint import info

            print("\n".join(info(Path(args.dir))))
            return 0
        if args.command == "commcheck":
            from .obs.commcheck import main as commcheck

            if not Path(args.dir).is_dir():
                raise UsageError(f"{args.dir} is not a directory (give the --comm-log DIR of a train run)")
            return commcheck(args.dir, args.model)
    except UsageError as e:
        print(f"trirace: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trirace: interrupted", file=sys.stderr)
        return 130
    return 0


def _config(args: argparse.Namespace, **defaults) -> TrainConfig:
    values = {k: getattr(args, k, None) for k in (*TOP_LEVEL, *FLAGS)}
    return make_config({**defaults, **{k: v for k, v in values.items() if v is not None}}, config_file=args.config)


def _train(args: argparse.Namespace) -> int:
    from .runtime import WorkerFailed, train  # torch is imported only once the flags are sane
    from .runtime.launch import quit_now, under_torchrun

    cfg = _config(args)
    if args.dry_run:
        return _show_plan(cfg, as_json=False)
    from .runtime import allocator

    allocator.use()  # the launcher times layers for the partition as the ranks will run them
    try:
        train(cfg)
        if under_torchrun():  # this process is a rank: done, so skip the interpreter's teardown
            quit_now(0)
    except WorkerFailed as e:
        print(f"trirace: {e}", file=sys.stderr)
        return 1
    except Diverged as e:
        print(f"trirace: {e}", file=sys.stderr)
        return Diverged.EXIT_STATUS
    return 0


def _plan(args: argparse.Namespace) -> int:
    return _show_plan(_config(args), as_json=args.json)


def _show_plan(cfg: TrainConfig, as_json: bool) -> int:
    """What train would run, after every check train makes before it starts a process."""
    import json

    from .plan.planner import plan_job
    from .plan.memory import GiB, estimate, host_budget, retained_factor
    from .plan.topology import load_topology, single_node
    from .runtime.checkpoint import resume_line, resume_point
    from .runtime.device import resolve_backend
    from .runtime.launch import prepare
    from .runtime.trainer import measure_layers

    cfg = prepare(cfg)  # what train does before spawning: paths and data checked, partition fixed
    topo = load_topology(cfg.comm.topology) if cfg.comm.topology else single_node(cfg.world_size)
    plan = plan_job(cfg, topo, lambda: measure_layers(cfg))  # auto placement weighs layer times too
    if as_json:
        print(json.dumps(plan.to_dict(), indent=2))
        return 0
    print(plan.describe())
    on_gpu = resolve_backend(cfg.comm.backend, cfg.world_size) == "nccl"
    est = estimate(cfg, *host_budget(cfg.world_size, on_gpu))
    kept = f" (up to {retained_factor(on_gpu)}x with the heap the allocator keeps)" if not on_gpu else ""
    print(f"memory: about {', '.join(f'{x / GiB:.2f}' for x in est.per_rank)} GiB per rank at the peak, by stage"
          f"{kept}; {est.where} is {est.budget / GiB:.1f} GiB")
    if cfg.comm.probe:
        print("(links as given; train probes them at start-up, which can change trirace's chunk size)")
    if line := resume_line(cfg, *resume_point(cfg)):
        print(line)
    return 0


def _bench(args: argparse.Namespace) -> int:
    import json

    from .bench import side_by_side as bench
    from .runtime.launch import prepare

    systems = tuple(x.strip() for x in args.systems.split(","))
    if bad := [x for x in systems if x not in SYSTEMS]:
        raise UsageError(f"unknown system {bad[0]!r}; choose from {', '.join(SYSTEMS)}")
    if args.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    schedules = [x.strip() for x in args.schedules.split(",")] if args.schedules else []
    if schedules:
        from .plan import KINDS
        if bad := [x for x in schedules if x not in KINDS]:
            raise UsageError(f"unknown schedule {bad[0]!r} in --schedules; choose from {', '.join(KINDS)}")
        if args.matrix:
            raise UsageError("--schedules compares schedules in one cell: it does not combine with --matrix")
        from .bench.torch_peer import SCHEDULES as PEER_SCHEDULES
        peer = "torch-1f1b" in systems
        systems = tuple(f"{sc}/{p}" for sc in schedules for p in systems if p != "torch-1f1b") + \
            tuple(f"{sc}/torch" for sc in schedules if peer and sc in PEER_SCHEDULES)
    preset = _emulated_preset(args)
    cfg = _config(args, steps=8)
    if schedules:  # the placement and the header follow the first schedule listed
        cfg = cfg.with_(schedule=schedules[0])
    link = args.link or "250mbit"
    if preset is not None and args.link is None:
        link = _emulated_link(cfg, preset)
    cluster = bench.Cluster(args.nodes, args.ranks_per_node, None if link == "none" else link, args.mtu)
    out = Path(args.out)
    if args.matrix:
        return _bench_matrix(args, cfg, systems, out)
    bench.check(cfg, cluster)
    preflight.output_dir(out, "--out")
    if args.json:
        preflight.output_file(args.json, "--json")
    if args.dry_run:
        prepare(cfg)
        print(f"dry run: would bench {', '.join(systems)} on {cluster.describe()}, {args.rounds} round(s)")
        return 0
    print(f"bench: {cfg.model.name} {args.schedules or cfg.parallel.schedule} pp={cfg.parallel.pp} dp={cfg.parallel.dp} m={cfg.parallel.micro_batches}, "
          f"{cfg.tokens_per_step} tokens/step; {cluster.describe()}; {args.rounds} round(s) x {cfg.steps} steps "
          f"per system: {', '.join(systems)}", file=sys.stderr, flush=True)
    payload = bench.run(cfg, cluster, systems, args.rounds, emulated=preset.name if preset is not None else None)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=2)
    (out / "bench.json").write_text(text)
    if args.json:
        Path(args.json).write_text(text)
    table = bench.markdown(payload)
    (out / "bench.md").write_text(table + "\n")
    for r in payload["results"]:
        if r["overlap_efficiency"] > 1.02:  # a run under its physical limit: the count is wrong
            print(f"warning: {r['system']} ran {(r['overlap_efficiency'] - 1) * 100:.0f}% under the lower bound "
                  f"({r['step_time_s']:.3f} s < {r['lower_bound_s']:.3f} s): the bound counts work the run does "
                  "not do", file=sys.stderr)
    bench.chart(payload, out / "bench.png")
    print(table)
    print(f"wrote {out}/bench.json, bench.md, bench.png", file=sys.stderr)
    return 0


def _emulated_preset(args: argparse.Namespace):
    """--emulate names a GPU (h100) or a cluster preset (h100-100gbe): for a preset, the
    job emulates its device and the testbed its links (the preset is returned)."""
    from .sim.cluster import PRESETS

    if args.emulate is None or args.emulate not in PRESETS:
        return None
    preset = PRESETS[args.emulate]
    if preset.device.name == "cpu-core":
        raise UsageError(f"--emulate {args.emulate}: that preset is this machine, not a GPU cluster")
    args.emulate = preset.device.name
    return preset


def _emulated_link(cfg, preset) -> str:
    """The testbed's inter-node rate for an emulated preset: the preset's / (K x s), so a
    transfer of 1/s of the bytes takes K times its real time."""
    from .testbed.rate import tc_rate

    em = cfg.emulation
    bits = preset.inter.bytes_per_s * 8 / (em.dilation * em.byte_scale)
    intra = preset.intra.bytes_per_s * 8 / (em.dilation * em.byte_scale)
    print(f"emulating {preset.name}: {em.device} at {em.dilation:g}x its time, 1/{em.byte_scale} of the bytes; "
          f"inter-node links {bits / 1e6:.0f} Mbit/s; intra-node traffic runs on this machine's loopback, "
          f"not at {intra / 1e9:.1f} Gbit/s (NVLink / (K x s))", file=sys.stderr)
    return tc_rate(bits)


def _bench_matrix(args: argparse.Namespace, cfg, systems: tuple[str, ...], out: Path) -> int:
    from .bench import matrix
    from .runtime.launch import prepare

    if "trirace" not in systems:
        raise UsageError("--matrix compares trirace with the others: keep trirace in --systems")
    if len(systems) < 2:
        raise UsageError("--matrix needs trirace and at least one other system")
    matrix.check(cfg)
    preflight.output_dir(out, "--out")
    if args.json:
        preflight.output_file(args.json, "--json")
    if args.dry_run:
        prepare(cfg)
        print(f"dry run: would bench {', '.join(systems)} in {len(matrix.cells())} cells "
              f"({', '.join(map(matrix.cell_name, matrix.cells()))}), {args.rounds} round(s) each")
        return 0
    rows = matrix.run(cfg, systems, args.rounds, out)
    if args.json:
        Path(args.json).write_text((out / "matrix.json").read_text())
    table = matrix.markdown(rows)
    command = f"trirace bench --matrix --rounds {args.rounds} --systems {','.join(systems)} --out {out}"
    (out / "matrix.md").write_text(f"`{command}`\n\n{table}\n")
    matrix.heatmap(rows, out / "matrix.png")
    print(table)
    print(f"wrote {out}/matrix.json, matrix.md, matrix.png", file=sys.stderr)
    return 0


def _simulate(args: argparse.Namespace) -> int:
    import json

    from .sim import report
    from .sim.calibration import load_calibration
    from .sim.cluster import PRESETS, load_cluster

    if args.list_clusters:
        for name, c in PRESETS.items():
            print(f"{name:10s} {c.description}")
        return 0
    cfg = _config(args, steps=8)
    cluster = load_cluster(args.cluster, args.nodes, args.ranks_per_node, args.link)
    cal = load_calibration(args.calibration) if args.calibration else None
    if args.json:
        preflight.output_file(args.json, "--json")
    if args.trace_out:
        preflight.output_dir(args.trace_out, "--trace-out")
    policies = POLICY_NAMES if args.policy == "all" else (args.policy,)
    trace = Path(args.trace_out) / "trace.json" if args.trace_out else None
    if args.sweep:
        payload = report.sweep(cfg, cluster, policies, cal)
        print(report.sweep_table(payload), flush=True)
    else:
        payload = report.compare(cfg, cluster, policies, cal, trace)
        print(report.table(payload), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if trace and not args.sweep:
        print(f"wrote {trace}", file=sys.stderr)
    return 0


def _profile(args: argparse.Namespace) -> int:
    from .calibrate.profile import check_contention, check_probe_settings, run
    from .sim.cluster import PRESETS

    if args.cluster not in PRESETS:
        raise UsageError(f"unknown cluster {args.cluster!r}; choose from {', '.join(PRESETS)}")
    cfg = _config(args)
    preflight.output_file(args.out, "--out")
    check_probe_settings(args.rounds, args.probe_seconds)
    if args.contention:
        check_contention(args.cluster)
    if args.link is not None:
        from .testbed import check

        check(2, 1, args.link, args.mtu)
    if args.dry_run:
        from .runtime.launch import prepare

        prepare(cfg)
        print(f"dry run: would profile {cfg.model.name} and write {args.out}")
        return 0
    run(cfg, args.out, args.cluster, args.link, args.mtu, args.contention, args.rounds, args.probe_seconds)
    return 0


def _data(args: argparse.Namespace) -> int:
    from .data.prepare import prepare

    vocab = args.vocab if args.vocab is not None or args.tokenizer else TrainConfig().spec.vocab_size
    done = prepare(args.src, args.out, vocab=vocab, tokenizer=args.tokenizer, field=args.field, dtype=args.dtype,
                   workers=args.workers, shard_bytes=int(args.shard_mb * 1e6), progress=args.progress)
    index, mb = done.index, done.source_bytes / 1e6
    kept = f"; {done.kept} shard(s) kept from an earlier run" if done.kept else ""
    print(f"prepared {index['tokens']:,} {index['dtype']} tokens, {index['documents']:,} documents, in "
          f"{len(index['shards'])} shard(s) from {mb:.1f} MB in {done.seconds:.1f} s ({mb / done.seconds:.1f} MB/s, "
          f"{index['tokens'] / done.seconds:,.0f} tokens/s){kept}: train with --data {args.out}")
    return 0


def _testbed(args: argparse.Namespace) -> int:
    from . import testbed

    if args.action == "up":
        link = None if args.link == "none" else (args.link or "250mbit")
        if link is None:
            raise UsageError("testbed up needs a link rate, e.g. --link 250mbit")
        tb = testbed.up(args.nodes, args.ranks_per_node, link, mtu=args.mtu)
        print(f"testbed up: {tb.nodes} node(s) x {tb.ranks_per_node} rank(s), {tb.rate} links, MTU {tb.mtu}; "
              f"namespaces {', '.join(tb.namespace(i) for i in range(tb.nodes))}")
    else:
        print(f"testbed down: removed {testbed.down()} namespace(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
