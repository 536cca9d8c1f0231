"""How much memory a rank will hold, estimated from shapes alone (no tensors), and the
pre-check that refuses a job that cannot fit before any process starts.

The simulator reports the same figures (sim/simulate.py): one function, two users.

What a rank of stage s holds at its peak:
- weights: one fp32 copy per weight version (two under 2BW), and as many gradient buffers;
- the optimizer: an fp32 master copy, plus Adam's two moments;
- activations autograd keeps for backward, for each micro-batch in flight (counted on
  the real layers with saved-tensor hooks, tests/unit/test_memory_model.py): a GPT or BERT
  block keeps 8*b*s*d + 2*b*s*d_ff values, a Llama block 8*b*s*d + 2*b*s*kv + 4*b*s*d_ff
  (fused attention keeps no b*h*s^2 scores), a norm its input and output, the token
  table only the ids, the head its input and the log-softmax. With recomputation a block
  keeps only its input, and one micro-batch's block is rebuilt at a time. Under bf16
  autocast the block's values are 2 bytes, and its matrices' bf16 casts stay with each
  micro-batch in flight;
- the largest transient on top: the head's backward (the loss gradient and the
  log-softmax's own, two more b*s*V), a dense table or head gradient before it is added
  to its buffer, or the optimizer's temporaries (parameter-sized: torch's Adam on CUDA);
- the process itself (interpreter, torch, communicator buffers): RUNTIME_BYTES, measured as
  the resident size of a gpt-test rank here.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..errors import UsageError
from ..models import ModelSpec, layer_names
from ..models.build import layer_flops, layer_param_counts
from ..optim import STATE_VALUES
from .partition import balance, stage_ranges

RUNTIME_BYTES = 400 * 2**20
GiB = 2**30
# The estimate counts live tensors. The ranks' allocator settings (runtime/allocator.py: no
# mmap, no trim below 1 GiB) keep freed memory in the process, and a stage that frees and
# re-allocates large buffers every micro-batch fragments its heap: a stage that holds the
# head (32-64 MiB of logits per micro-batch for gpt-tiny) peaks well above its live tensors,
# by up to RETAINED_UP_TO with the settings and RETAINED_MALLOC_OFF without them (the
# factors tests/unit/test_memory_model.py bounds). No model of glibc's fragmentation is
# attempted: a job within this factor of its budget is warned.
# (On GPUs the device memory is torch's caching allocator's, not measured here: no warning.)
RETAINED_UP_TO = 1.75
RETAINED_MALLOC_OFF = 1.3


def retained_factor(on_gpu: bool) -> float:
    """Peak resident memory over the estimate the ranks' allocator may reach here."""
    if on_gpu:
        return 1.0
    return RETAINED_MALLOC_OFF if os.environ.get("TRIRACE_MALLOC") == "off" else RETAINED_UP_TO


def block_values(spec: ModelSpec, batch: int, seq: int) -> int:
    """Values one transformer block keeps for backward per micro-batch."""
    tokens, d = batch * seq, spec.d_model
    if spec.arch == "llama":
        return tokens * (8 * d + 2 * spec.kv_heads * (d // spec.n_heads) + 4 * spec.d_ff)
    return tokens * (8 * d + 2 * spec.d_ff)


def stage_memory(spec: ModelSpec, layers: range, batch: int, seq: int, in_flight: int, versions: int,
                 optimizer: str = "adam", precision: str = "fp32", recompute: bool = False) -> dict[str, float]:
    """Peak bytes of one rank of the stage, by part, and their "total" (without the runtime)."""
    counts = layer_param_counts(spec)
    params = sum(counts[i] for i in layers)
    d, v, tokens = spec.d_model, spec.vocab_size, batch * seq
    block_bytes = 2 if precision == "bf16" else 4
    names = layer_names(spec)
    kept = rebuilt = 0.0  # bytes per micro-batch in flight; one block rebuilt in backward
    transient = 4.0 * params  # the optimizer's temporaries
    for i in layers:
        if names[i].startswith("block"):
            full = block_values(spec, batch, seq) * block_bytes + (2 * counts[i] if precision == "bf16" else 0)
            kept += 4 * tokens * d if recompute else full
            rebuilt = max(rebuilt, full if recompute else 0.0)
        elif names[i].endswith("head"):
            kept += 4 * tokens * (v + 2 * d) + 8 * tokens  # log-softmax, input (bert: its dense's too), targets
            transient = max(transient, 8.0 * tokens * v, 4.0 * d * v)
        elif names[i] == "embedding":
            kept += 8 * tokens  # the ids
            transient = max(transient, 4.0 * d * v)
        elif names[i] == "final_norm":  # its input and statistics (RMSNorm, written out: its output too)
            kept += 4 * tokens * d * (2 if spec.arch == "llama" else 1) + 8 * tokens
        else:
            kept += 8 * tokens * d  # a custom layer: its output, twice over
    out = {"weights": 4.0 * params * versions, "gradients": 4.0 * params * versions,
           "optimizer": 4.0 * params * (1 + STATE_VALUES[optimizer]), "activations": kept * in_flight + rebuilt,
           "transient": transient}
    out["total"] = sum(out.values())
    return out


def peak_in_flight(schedule: str, n_stages: int, stage: int, micro_batches: int) -> int:
    """Micro-batches whose activations a stage holds at once: all of them under GPipe,
    the warm-up depth plus one under 1F1B and 2BW, and under ZB-H1, which holds each from
    its F to its W, up to the pipeline's depth on every stage (1F1B's first stage)."""
    if schedule == "gpipe":
        return micro_batches
    return min(n_stages if schedule == "zb-h1" else n_stages - stage, micro_batches)


@dataclass(frozen=True)
class Estimate:
    per_rank: list[float]  # bytes, per stage (every replica of a stage holds the same)
    budget: float  # bytes a rank may use here
    where: str  # what the budget is

    @property
    def peak(self) -> float:
        return max(self.per_rank)

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    def tight(self, retained: float) -> bool:
        """Fits as estimated, but not with the heap the allocator may keep (`retained` times it)."""
        return self.fits and self.peak * retained > self.budget


def estimate(cfg, budget: float, where: str, **changes) -> Estimate:
    """Per-rank peak of `cfg` (a TrainConfig) with `changes` applied (e.g. recompute=True)."""
    get = lambda k: changes.get(k, cfg.get(k))  # noqa: E731
    pp = get("pp")
    sizes = list(cfg.parallel.partition) if cfg.parallel.partition is not None and pp == cfg.parallel.pp else balance(_layer_costs(cfg), pp)
    versions = 2 if cfg.parallel.schedule == "2bw" else 1
    per = [stage_memory(cfg.spec, layers, cfg.parallel.micro_batch_size, cfg.tokens_seq,
                        peak_in_flight(cfg.parallel.schedule, pp, s, cfg.parallel.micro_batches), versions, cfg.optim.optimizer,
                        get("precision"), get("recompute"))["total"] + RUNTIME_BYTES
           for s, layers in enumerate(stage_ranges(sizes))]
    return Estimate(per, budget, where)


def _layer_costs(cfg) -> list[float]:
    """What the job's partitioner balances, before anything is measured: parameters, or for
    --balance time (measured at start-up) the FLOPs that set those times, so the estimate
    sizes the stages the job will run (gpt-tiny, pp 2: 6,1 by time, 3,4 by parameters)."""
    if cfg.parallel.balance == "time" and cfg.spec.custom is None:
        return layer_flops(cfg.spec, cfg.parallel.micro_batch_size, cfg.tokens_seq)
    return [float(n) for n in layer_param_counts(cfg.spec)]


def host_budget(local_ranks: int, on_gpu: bool) -> tuple[float, str]:
    """(bytes per rank, what that is) on this machine: a CUDA device's capacity when ranks
    run on GPUs (read without creating a context, which would hold memory on the device
    for the whole job), else the host's available memory shared by its local ranks."""
    if on_gpu:
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory), "the memory of a CUDA device"
    available = _meminfo("MemAvailable") or float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return available / local_ranks, f"available host memory / {local_ranks} local rank(s)"


def _meminfo(key: str) -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(cfg, local_ranks: int, on_gpu: bool, budget: tuple[float, str] | None = None) -> Estimate:
    """Raise UsageError (one line) when the job's estimated peak per rank exceeds what a
    rank has here (`on_gpu`: its ranks run on CUDA devices), naming what would make it
    fit. Returns the estimate otherwise."""
    bytes_, where = budget or host_budget(local_ranks, on_gpu)
    est = estimate(cfg, bytes_, where)
    retained = retained_factor(on_gpu)
    if est.tight(retained):
        off = "" if retained == RETAINED_MALLOC_OFF else " (TRIRACE_MALLOC=off returns most of it, for some speed)"
        print(f"trirace: warning: {cfg.model.name} needs about {est.peak / GiB:.1f} GiB per rank and {where} is "
              f"{bytes_ / GiB:.1f} GiB; freed memory the allocator keeps has taken up to {retained}x the "
              f"estimate here{off}", file=sys.stderr, flush=True)
    if est.fits:
        return est
    stage = est.per_rank.index(est.peak)
    helps = []
    for flag, change in (("--recompute", {"recompute": True}), ("--precision bf16", {"precision": "bf16"}),
                         ("--recompute --precision bf16", {"recompute": True, "precision": "bf16"})):
        if not all(cfg.get(k) == v for k, v in change.items()) and estimate(cfg, bytes_, where, **change).fits:
            helps.append(flag)
            break
    n_layers = len(layer_names(cfg.spec))
    for pp in (2 * cfg.parallel.pp, 4 * cfg.parallel.pp, 8 * cfg.parallel.pp):  # more stages: fits when each node brings its own memory
        if pp <= n_layers and estimate(cfg, bytes_, where, pp=pp).fits:
            helps.append(f"--pp {pp} on {pp // cfg.parallel.pp}x the machines")
            break
    advice = ("; " + " or ".join(helps) + " would fit") if helps else \
        "; neither --recompute, --precision bf16 nor more stages would fit it: use a smaller model"
    raise UsageError(f"{cfg.model.name} needs about {est.peak / GiB:.1f} GiB per rank (stage {stage} of {cfg.parallel.pp}) but "
                     f"{where} is {bytes_ / GiB:.1f} GiB: {(est.peak - bytes_) / GiB:.1f} GiB over{advice} "
                     "(--no-memory-check to try anyway)")
