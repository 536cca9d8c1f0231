"""Devices a model runs on, as figures: what the simulator's compute model and emulated
layers (emulated.py) price a layer by. The figures and their sources are in devices.yaml."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from ..errors import UsageError
from ..yamlfile import read_mapping


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # per second, at the precision trirace computes in
    efficiency: float  # achieved fraction of peak for transformer layers
    memory_bytes: float
    memory_bytes_per_s: float  # what the optimizer step streams through

    @property
    def flops(self) -> float:
        return self.peak_flops * self.efficiency


T = TypeVar("T")
DEVICE_FILE = Path(__file__).with_name("devices.yaml")
DEVICE_KEYS = {"name", "peak_flops", "efficiency", "memory", "memory_bandwidth"}


def device_from_dict(dev: dict | Device, base: Device | None = None) -> Device:
    """A device from {name, peak_flops, efficiency, memory, memory_bandwidth}; keys left out
    come from `base` (all are needed without one)."""
    if isinstance(dev, Device):
        return dev
    if not isinstance(dev, dict) or set(dev) - DEVICE_KEYS or (base is None and set(dev) != DEVICE_KEYS):
        raise ValueError("device: expected {name, peak_flops, efficiency, memory, memory_bandwidth}")
    get = lambda k, default: float(dev[k]) if k in dev else default  # noqa: E731
    device = Device(str(dev.get("name", base.name if base else "")), get("peak_flops", base and base.peak_flops),
                    get("efficiency", base and base.efficiency), get("memory", base and base.memory_bytes),
                    get("memory_bandwidth", base and base.memory_bytes_per_s))
    if device.peak_flops <= 0 or not 0 < device.efficiency <= 1:
        raise ValueError("device: peak_flops must be positive and efficiency in (0, 1]")
    return device


def _load() -> tuple[dict[str, Device], dict[str, str]]:
    devices, aliases = {}, {}
    for name, entry in read_mapping(DEVICE_FILE, "device figures").items():
        entry = dict(entry)
        if alias := entry.pop("alias", None):
            aliases[alias] = name
        devices[name] = device_from_dict(dict(entry, name=name))
    return devices, aliases


DEVICES, ALIASES = _load()


def device_named(name: str) -> Device:
    """A device by its name or short name (h100, a100, h200), in any case."""
    lower = {k.lower(): k for k in DEVICES} | ALIASES
    key = lower.get(name.lower())
    if key is None:
        raise UsageError(f"unknown device {name!r}; choose from {', '.join(sorted(ALIASES))} "
                         f"or {', '.join(DEVICES)}")
    return DEVICES[key]


# Bytes the optimizer step streams per parameter: Adam reads and writes weight, gradient,
# two moments and the published copy (SGD: weight, gradient, copy; Muon at most AdamW's).
OPT_BYTES_PER_PARAM = {"adam": 36, "adamw": 36, "sgd": 16, "muon": 36}


@dataclass(frozen=True)
class LayerTimes:
    """What each layer of a model takes, one micro-batch, forward and backward, and the
    optimizer's seconds per parameter."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    optimizer_s_per_param: float
    source: str  # "flops" (priced on a device) or "calibration" (measured)


# The share of a layer's backward that computes its weight gradients (a split backward's W;
# the rest, its I, computes the input gradient). A transformer layer's weight gradients take
# as many FLOPs as its forward matmuls, half its backward; attention's score products add to
# I alone, a few percent at common widths. Zero-bubble schedules are derived with it even.
WEIGHT_GRAD_SHARE = 0.5


def recomputing(times: T, names: list[str]) -> T:
    """With --recompute each block (layers named block*) runs its forward again inside its
    backward. `times`: any dataclass with per-layer forward_s and backward_s (LayerTimes,
    the simulator's ComputeModel)."""
    return replace(times, backward_s=tuple(b + f if n.startswith("block") else b
                                           for n, f, b in zip(names, times.forward_s, times.backward_s)))


def flop_times(flops: list[float], device: Device, optimizer: str) -> LayerTimes:
    """Per-layer forward FLOPs (models/build.py:layer_flops) priced on `device`: forward at
    its achieved rate, backward twice the forward, the optimizer at its memory bandwidth."""
    fwd = tuple(f / device.flops for f in flops)
    return LayerTimes(fwd, tuple(2 * f for f in fwd), OPT_BYTES_PER_PARAM[optimizer] / device.memory_bytes_per_s,
                      "flops")
