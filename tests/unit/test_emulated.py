"""Emulated layers (--emulate): the transformation keeps the real model's boundaries, scales
its bytes by 1/byte_scale, keeps the token rows real, and takes the device's time."""

import math
import time

import pytest
import torch

from trirace.config import make_config
from trirace.errors import ConfigError
from trirace.models import build_layers, layer_names
from trirace.models.build import layer_flops, table_index
from trirace.models.devices import device_named, flop_times
from trirace.models.emulated import compute_for
from trirace.runtime.sparse_exchange import touched_rows

JOB = dict(model="gpt-test", micro_batch_size=2, seq_len=16, micro_batches=4, pp=2, dp=2)


def _cfg(**kw):
    return make_config(dict(JOB, emulate="h100", **kw))


def test_layers_keep_the_boundaries_and_carry_one_sth_of_the_bytes():
    s = 4
    cfg = _cfg(byte_scale=s, dilation=10)
    real, emulated = cfg.real_spec, cfg.spec
    assert len(layer_names(emulated)) == len(layer_names(real))
    assert emulated.d_model == math.ceil(real.d_model / s) and emulated.vocab_size == real.vocab_size
    assert cfg.activation_shape == (2, 16, math.ceil(real.d_model / s))
    built = build_layers(real, 0)
    fake = build_layers(emulated, 0)
    for r, e in zip(built, fake):
        rp, ep = dict(r.named_parameters()), dict(e.named_parameters())
        assert rp.keys() == ep.keys()  # the real names: ties and the token table are found alike
        for name in rp:
            want = (*rp[name].shape[:-1], math.ceil(rp[name].shape[-1] / s))
            assert tuple(ep[name].shape) == want, name
    real_bytes = sum(p.numel() for m in built for p in m.parameters())
    fake_bytes = sum(p.numel() for m in fake for p in m.parameters())
    assert real_bytes / s <= fake_bytes <= real_bytes / s * 1.05


def test_the_token_rows_a_sparse_exchange_sends_are_the_real_models():
    cfg = _cfg(byte_scale=8, dilation=1)
    ids = torch.tensor([[3, 7, 7, 11], [0, 3, 250, 9]])
    rows = []
    for spec in (cfg.real_spec, cfg.spec):
        first = build_layers(spec, 0, range(0, 1))[0]
        first(ids).float().sum().backward()
        table = list(first.parameters())[table_index(spec)]
        rows.append(touched_rows(table.grad)[0].tolist())
    assert rows[0] == rows[1] == sorted(set(ids.flatten().tolist()))


def test_forward_and_backward_take_the_dilated_device_time():
    cfg = _cfg(dilation=40.0, byte_scale=2)
    times = flop_times(layer_flops(cfg.real_spec, 2, 16), device_named("h100"), "adam")
    layers = build_layers(cfg.spec, 0)
    for i in (1, len(layers) - 1):  # a block and the head
        assert layers[i].forward_s == pytest.approx(40.0 * times.forward_s[i])
        assert layers[i].backward_s == pytest.approx(2 * layers[i].forward_s)
    x = torch.zeros(2, 16, cfg.spec.d_model, requires_grad=True)
    y = layers[1](x)
    assert torch.equal(y, x)  # cheap values: the input passed on
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_a_run_of_sleeps_keeps_to_its_total():
    wanted = [0.0021, 0.0007, 0.0133, 0.0005] * 25  # about 0.42 s, mostly short sleeps
    t0 = time.perf_counter()
    for s in wanted:
        compute_for(s)
    took = time.perf_counter() - t0
    assert took == pytest.approx(sum(wanted), rel=0.02)


def test_defaults_put_a_step_near_two_seconds_and_the_weights_in_128_mib():
    cfg = make_config(dict(model="gpt2-medium", emulate="a100", micro_batch_size=4, seq_len=1024, micro_batches=8,
                           pp=4, dp=4))
    em = cfg.emulation
    per_stage = cfg.parallel.micro_batches * (sum(em.times.forward_s) + sum(em.times.backward_s)) / 4
    assert em.dilation * per_stage == pytest.approx(2.0, rel=0.05)
    assert 4 * 354e6 / em.byte_scale <= 128 << 20 and 4 * 354e6 / (em.byte_scale / 2) > 128 << 20
    assert em.device == "A100-80GB"


@pytest.mark.parametrize("bad, says", [
    (dict(emulate="v100"), "unknown device"),
    (dict(dilation=4), "come with emulate"),
    (dict(emulate="h100", dilation=0.5), "dilation"),
    (dict(emulate="h100", model="bert-test"), "causal"),
])
def test_bad_emulation_is_refused_in_one_line(bad, says):
    with pytest.raises(ConfigError, match=says) as e:
        make_config(dict(JOB, **bad)).spec
    assert "\n" not in str(e.value)


def test_an_input_gradient_pass_takes_the_i_share_of_the_backward():
    from trirace.models.devices import WEIGHT_GRAD_SHARE
    from trirace.models.emulated import input_grad_only
    layer = build_layers(_cfg(dilation=2_000_000.0, byte_scale=2).spec, 0)[1]  # a 60 ms backward
    x = torch.zeros(2, 16, _cfg(byte_scale=2).spec.d_model, requires_grad=True)
    took = {}
    for part in ("whole", "input"):
        y = layer(x)
        t0 = time.perf_counter()
        if part == "input":
            with input_grad_only():
                torch.autograd.grad(y.sum(), x)
        else:
            torch.autograd.grad(y.sum(), x)
        took[part] = time.perf_counter() - t0
    assert took["whole"] == pytest.approx(layer.backward_s, rel=0.1)
    assert took["input"] == pytest.approx((1 - WEIGHT_GRAD_SHARE) * layer.backward_s, rel=0.1)


def test_the_bench_simulates_the_emulated_run_on_its_own_links_and_the_real_cluster_as_it_is():
    """The testbed's links give a collective the nominal rate; 100 GbE over TCP gives NCCL
    about half of it (clusters.yaml), so the real cluster, simulated, is slower than the
    emulated run's prediction over K, and the two agree where no collective runs."""
    from trirace.bench.side_by_side import Cluster, simulated
    cfg = _cfg(dilation=50.0, byte_scale=4, model="gpt2-medium", seq_len=1024, pp=2, dp=2, micro_batches=4,
               memory_check=False)
    cluster = Cluster(nodes=4, ranks_per_node=1, link=None)
    here = simulated(cfg, cluster, "h100-100gbe", ["fifo", "1f1b/fifo"], testbed=True)
    real = simulated(cfg, cluster, "h100-100gbe", ["fifo", "1f1b/fifo"], testbed=False)
    assert here.keys() == real.keys() == {"fifo", "1f1b/fifo"}
    for name in here:
        assert here[name] / 50.0 < real[name]
    one = cfg.with_(dp=1, pp=4)  # no replicas: nothing but P2P, the same on both
    here, real = (simulated(one, cluster, "h100-100gbe", ["fifo"], testbed=t)["fifo"] for t in (True, False))
    assert here / 50.0 == pytest.approx(real, rel=1e-6)


def test_the_partition_of_an_emulated_job_weighs_the_device_times_not_the_sleeps():
    from trirace.runtime.trainer import measure_layers
    cfg = _cfg(dilation=30.0, byte_scale=2)
    em = cfg.emulation
    got = measure_layers(cfg)
    assert got == [30.0 * (f + b) for f, b in zip(em.times.forward_s, em.times.backward_s)]
    assert got == measure_layers(cfg)  # every run of the job: the same partition
