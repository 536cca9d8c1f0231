"""Every gloo process group of a process on one gloo transport device.

torch's `new_group` gives each gloo group a transport device of its own, and each device a
loop thread that wakes 100-180 times a second even while its group is idle. A 2x2 job's
rank is in seven gloo groups, so about a thousand wake-ups a second, and where ranks share
cores each wake-up preempts computation (runtime/wakeups.py).

A gloo device serves any number of groups (its loop polls every socket of every group's
pairs, none blocking), but `new_group` passes no options to gloo. Registering a backend is
the hook torch offers for building a group with options of our own, so gloo groups are
made through `BACKEND`: a `ProcessGroupGloo` on the process's one device, chosen as torch
would choose it (`GLOO_SOCKET_IFNAME`'s interfaces, else the host's default).
"""

from __future__ import annotations

import os

import torch.distributed as dist

BACKEND = "gloo_shared"  # what init_process_group and new_group are given for gloo

_devices: list = []  # this process's gloo transport devices, made by the first group


def backend(requested: str) -> str:
    """The backend name to give torch for `requested` ("gloo" becomes `BACKEND`)."""
    if requested != "gloo":
        return requested
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    return BACKEND


def _create(o, _options) -> dist.ProcessGroupGloo:
    if not _devices:
        names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
        _devices.extend([dist.ProcessGroupGloo.create_device(interface=n) for n in names]
                        or [dist.ProcessGroupGloo.create_default_device()])
    options = dist.ProcessGroupGloo._Options()
    options._timeout = o.timeout
    options._devices = list(_devices)
    options.global_ranks_in_group = o.global_ranks_in_group
    options.group_name = o.group_id
    return dist.ProcessGroupGloo(o.store, o.group_rank, o.group_size, options)
