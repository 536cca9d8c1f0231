"""The external baseline: torch.distributed.pipelining's 1F1B or zero bubble, plus data
parallelism.

What a user would run instead of trirace: `PipelineStage` and, for each replica's pipeline,
`Schedule1F1B`, or for a "zb-h1" job `ScheduleInterleavedZeroBubble` with one stage per rank
(torch's zero bubble, ZB1P), then one flattened, blocking all-reduce of each stage's
gradients across its replicas and an optimizer step. Synchronous: W(t+1) = W(t) - lr *
grad f(W(t)), on the same stages, micro-batches, initial weights and optimizer as trirace,
so its losses must match trirace's "1f1b" schedule step for step.

Support: pp >= 2 and micro_batches >= pp (Schedule1F1B's own limits; pp == 1 is not a
pipeline, so it raises rather than silently measuring something else), `straggler` (as a
sleep after each forward of that rank's stage). `trace_out`, `comm_policy`, `partition_mb`,
`credit_mb` and `autotune` are trirace's and are ignored here.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleavedZeroBubble

from ..config import TrainConfig
from ..errors import UsageError
from ..models import build_layers
from ..models.build import loss_of
from ..models.emulated import compute_for, step_seconds
from ..plan import Layout, stage_ranges
from ..plan.planner import plan_job
from ..runtime.link_probe import detect_topology
from ..data.batches import batch_fn, sampler_for
from ..obs.report import Reporter
from ..runtime.trainer import default_device, measure_layers, plan_partition

SYSTEM = "torch-1f1b"
SCHEDULES = ("1f1b", "zb-h1")  # the job's schedules the peer runs with torch's own


def system_name(schedule: str) -> str:
    return f"torch-{schedule}"


def run_peer(cfg: TrainConfig) -> list[dict] | None:
    """Train `cfg` on the default process group (size pp * dp) with torch's pipelining.

    Every rank calls it; the reporter rank (last stage, replica 0) returns the per-step rows
    and prints the summary, the others return None.
    """
    _check(cfg)
    device = default_device()
    sizes = _partition(cfg)
    layout = _layout(cfg, sizes)
    rank = dist.get_rank()
    stage, replica = layout.coords(rank)
    pipe_group, dp_group, groups = _make_groups(layout, stage, replica, device)

    model = nn.Sequential(*build_layers(cfg.spec, cfg.seed, stage_ranges(sizes)[stage])).to(device)
    is_first, is_last = stage == 0, stage == cfg.parallel.pp - 1
    if cfg.faults.straggler and cfg.faults.straggler[0] == rank:
        delay = cfg.faults.straggler[1]
        model.register_forward_hook(lambda *_: time.sleep(delay))
    flat = _bind_flat_grads(model)
    params = list(model.parameters())
    opt_cls = torch.optim.Adam if cfg.optim.optimizer == "adam" else torch.optim.SGD
    optimizer = opt_cls(params, lr=cfg.optim.learning_rate)
    emulated_step_s = step_seconds(model)

    inputs, outputs = _example_args(cfg, stage_ranges(sizes)[stage], is_first, is_last)
    loss = loss_of(cfg.spec)
    pipe = PipelineStage(model, stage, cfg.parallel.pp, device, input_args=inputs, output_args=outputs, group=pipe_group)
    # The loss (lm_loss: a mean over tokens) is a mean, so the default scale_grads=True (sum the micro-batch
    # gradients, then divide by their number) gives the mean over micro-batches, as trirace's
    # loss / m does; the all-reduce below divides by dp for the mean over replicas. Every
    # stage gets loss_fn: the schedule runs backward only where it has one (a stage without
    # it skips backward and its peers wait forever), though only the last stage calls it.
    kind = "zb-h1" if cfg.parallel.schedule == "zb-h1" else "1f1b"  # any other job: the 1F1B baseline
    if kind == "zb-h1":
        schedule = ScheduleInterleavedZeroBubble([pipe], cfg.parallel.micro_batches, loss_fn=loss,
                                                 scale_grads=True)
    else:
        schedule = Schedule1F1B(pipe, cfg.parallel.micro_batches, loss_fn=loss, scale_grads=True)
    name = system_name(kind)

    m = cfg.parallel.micro_batches
    batch = batch_fn(cfg, sampler_for(cfg)) if is_first or is_last else None
    report = Reporter(cfg.with_(schedule=kind, comm_policy=name), sizes) \
        if is_last and replica == 0 else None

    dist.barrier()
    if report:
        report.start(time.perf_counter())
    for t in range(cfg.steps):
        args: tuple[torch.Tensor, ...] = ()
        target = None
        if batch is not None:
            # Replica r's micro-batch i of step t is global position r*m + i, as in trirace; the
            # schedule splits the concatenation back along dim 0 into exactly these m pieces.
            mbs = [batch(t, replica * m + i) for i in range(m)]
            if is_first:
                args = (torch.cat([x for x, _ in mbs]).to(device),)
            if is_last:
                target = torch.cat([y for _, y in mbs]).to(device)
        losses: list[torch.Tensor] = []
        schedule.step(*args, target=target, losses=losses if is_last else None, return_outputs=False)

        _rebind_flat_grads(params, flat)
        if dp_group is not None:
            dist.all_reduce(flat, group=dp_group)
            flat /= cfg.parallel.dp
        if emulated_step_s is None:
            optimizer.step()
        else:  # emulated layers (--emulate): the device's time for the step, as trirace's stages take it
            compute_for(emulated_step_s)
        flat.zero_()  # zeroing in place keeps every .grad a view of `flat`

        if is_last:
            loss = _mean_loss(losses, dp_group, cfg.parallel.dp, device)
            if report:  # the step ends once its loss is known: trirace's rows time the same span
                report.step(t, time.perf_counter(), {"loss": loss, "comm_policy": name})
    dist.barrier()
    for g in groups:  # a worker may run more jobs: keep none of this one's (non-members' are no-ops)
        dist.destroy_process_group(g)
    return report.finish() if report else None


def _check(cfg: TrainConfig) -> None:
    if not dist.is_initialized():
        raise UsageError(f"{SYSTEM} needs an initialised torch.distributed process group")
    if dist.get_world_size() != cfg.world_size:
        raise UsageError(f"pp x dp = {cfg.parallel.pp} x {cfg.parallel.dp} = {cfg.world_size} but the world has "
                         f"{dist.get_world_size()} ranks")
    if cfg.parallel.pp < 2:
        raise UsageError(f"{SYSTEM} is a pipeline baseline and needs pp >= 2 (got pp={cfg.parallel.pp}); "
                         "for pp=1 compare against plain data parallelism instead")
    if cfg.parallel.micro_batches < cfg.parallel.pp:
        raise UsageError(f"torch's Schedule1F1B needs micro_batches >= pp "
                         f"(got {cfg.parallel.micro_batches} < {cfg.parallel.pp})")


def _partition(cfg: TrainConfig) -> list[int]:
    """The same stages as trirace: the given partition, or rank 0's (measured times differ
    between ranks, so one rank decides)."""
    if cfg.parallel.partition is not None or cfg.parallel.balance == "params":
        return plan_partition(cfg)
    box = [plan_partition(cfg) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _layout(cfg: TrainConfig, sizes: list[int]) -> Layout:
    """The same placement as trirace, so both run on the same links: the configured order,
    or for "auto" trirace's own choice from the detected (or given) topology."""
    if cfg.parallel.rank_order != "auto":
        return Layout(cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.rank_order)
    # Detection is a collective: every rank takes this branch together. The prediction
    # weighs measured layer times, which differ between ranks, so rank 0 decides.
    topo = detect_topology(str(cfg.comm.topology) if cfg.comm.topology else None, cfg.world_size)
    fixed = cfg.with_(partition=sizes)
    box = [plan_job(fixed, topo, lambda: measure_layers(cfg)).layout.order if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return Layout(cfg.parallel.pp, cfg.parallel.dp, box[0])


def _make_groups(layout: Layout, stage: int, replica: int,
                 device: torch.device) -> tuple[dist.ProcessGroup, dist.ProcessGroup | None, list]:
    """Every replica's pipeline group, then every stage's replica group, created on all ranks
    in this one order (new_group is collective over the world). Returns mine, and all."""
    pipes = [dist.new_group([layout.rank(s, r) for s in range(layout.pp)]) for r in range(layout.dp)]
    dps = [dist.new_group(layout.dp_group(s)) for s in range(layout.pp)]
    pipe = pipes[replica]
    # PipelineStage maps stage i to group rank i % group size; new_group orders members by
    # global rank, which Layout keeps increasing along a pipeline.
    if dist.get_rank(pipe) != stage:
        raise RuntimeError(f"stage {stage} has rank {dist.get_rank(pipe)} in its pipeline group")
    dp = dps[stage] if layout.dp > 1 else None
    if dp is not None:  # create the communicator now, not inside step 0's timing
        dist.all_reduce(torch.ones(1, device=device), group=dp)
    return pipe, dp, pipes + dps


def _example_args(cfg: TrainConfig, layers: range, is_first: bool,
                  is_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Static shapes for one micro-batch, as meta tensors: token ids -> hidden states ->
    logits (a custom or emulated model's last stage: whatever its layers make of their
    input, run on meta tensors). Given both, PipelineStage skips its dynamic inference (an
    extra forward and backward, and metadata exchange, in step 0). requires_grad matters:
    a received input whose example lacks it gets no gradient sent back to the previous stage."""
    b, s, d, v = cfg.parallel.micro_batch_size, cfg.tokens_seq, cfg.spec.d_model, cfg.spec.vocab_size
    meta = torch.device("meta")
    if is_first:
        x = torch.empty(b, s, dtype=torch.long, device=meta)
    else:
        x = torch.empty(b, s, d, device=meta, requires_grad=True)
    y = torch.empty(b, s, v if is_last else d, device=meta, requires_grad=True)
    if is_last and cfg.spec.custom is not None:
        with meta:
            shape = nn.Sequential(*build_layers(cfg.spec, cfg.seed, layers))(x.detach()).shape
        y = torch.empty(shape, device=meta, requires_grad=True)
    return x, y


def _bind_flat_grads(model: nn.Module) -> torch.Tensor:
    """One flat gradient buffer with every .grad a view into it: autograd accumulates into
    the views in place, so the all-reduce needs no flatten/unflatten copies."""
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), device=params[0].device, dtype=params[0].dtype)
    _rebind_flat_grads(params, flat)
    return flat


def _rebind_flat_grads(params: list[nn.Parameter], flat: torch.Tensor) -> None:
    """Make each .grad a view of its slice of `flat` again, copying a gradient that
    something replaced (a no-op when the views held, the usual case)."""
    offset = 0
    for p in params:
        n = p.numel()
        view = flat[offset:offset + n].view_as(p)
        if p.grad is None:
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad)
        p.grad = view
        offset += n


def _mean_loss(losses: list[torch.Tensor], dp_group: dist.ProcessGroup | None, dp: int,
               device: torch.device) -> float:
    """Mean over this replica's micro-batches, then over the last stage's replicas."""
    local = sum(x.item() for x in losses) / len(losses)
    if dp_group is None:
        return local
    box = torch.tensor([local], dtype=torch.float64, device=device)
    dist.all_reduce(box, group=dp_group)
    return box.item() / dp

