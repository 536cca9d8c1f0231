"""OPT timed as the profile timed it until stop 44 (all-zero gradients, no gradient buffer
zeroed) against as it times it now (runtime/calibrate.py `optimizer_time`: a replica's
first step's gradients, the buffer zeroed), interleaved, with the ranks' allocator
settings. Run from the repository root:
    python docs/bench/sim-accuracy/lockstep/opt_ab.py"""
import statistics, sys; sys.path.insert(0, ".")
import torch
from trirace.config import make_config
from trirace.models.build import build_layers
from trirace.optim import make_optimizer
from trirace.runtime import allocator, calibrate as C
torch.set_num_threads(1); allocator.use()
cfg = make_config({"model": "gpt-tiny", "micro_batch_size": 4, "micro_batches": 4})


def before():
    layers = build_layers(cfg.spec, cfg.seed)
    params = [torch.nn.Parameter(p.detach().clone()) for layer in layers for p in layer.parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = make_optimizer(params, cfg.optimizer, cfg.learning_rate, cfg.decay, set())
    copies = [p.detach().clone() for p in params]

    def step():
        opt.step()
        with torch.no_grad():
            for c, p in zip(copies, params):
                c.copy_(p)
    return C._best(step, 3) / sum(p.numel() for p in params)


ratios = []
for r in range(4):
    a, b = before(), C.optimizer_time(cfg)
    ratios.append(b / a)
    print(f"round {r}: before {a * 1e9:.2f} ns a parameter, now {b * 1e9:.2f}, ratio {b / a:.3f}", flush=True)
print(f"median ratio {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
