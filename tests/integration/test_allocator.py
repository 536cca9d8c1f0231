"""The allocator settings every rank gets keep a step's re-allocated buffers resident: a
32 MiB tensor (gpt-tiny's logits) made and freed over and over stops faulting its pages
in. A setting the user made in the environment is kept."""

import json
import os
import platform
import resource
import subprocess
import sys

import pytest

from trirace.runtime import allocator

def _thp_always() -> bool:  # huge pages fault 2 MiB at a time: the counts below assume 4 KiB
    try:
        return "[always]" in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or resource.getpagesize() != 4096
                                or _thp_always() or "LD_PRELOAD" in os.environ,
                                reason="counts glibc's page faults in 4 KiB pages")

_LOOP = r"""
import json, os, resource, sys, torch
if sys.argv[1].startswith("use"):
    from trirace.runtime import allocator
    assert allocator.use() == (sys.argv[1] == "use")
faults = []
for _ in range(30):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(4, 128, 16384)  # 32 MiB, touched
    del x
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps({"faults": faults, "mmap_max": os.environ.get("MALLOC_MMAP_MAX_")}))
"""


def _run(how: str, extra_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("TRIRACE_MALLOC", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", _LOOP, how], env={**env, **extra_env}, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return json.loads(out)


def test_glibcs_defaults_fault_a_32_mib_tensor_in_every_time():
    steady = _run("plain", {})["faults"][-10:]
    assert min(steady) > 4096  # 8192 pages of 4 KiB each time


@pytest.mark.parametrize("how", ["environment", "use"])
def test_the_settings_keep_it_resident(how):
    got = _run(how, allocator.ENV if how == "environment" else {})
    assert sum(got["faults"][-10:]) < 2048, got  # the heap reaches its size within the first few
    if how == "use":
        assert got["mmap_max"] == "0"  # and processes it starts inherit the settings


def test_trirace_malloc_off_leaves_glibcs_defaults():
    got = _run("use-off", {"TRIRACE_MALLOC": "off"})
    assert got["mmap_max"] is None
    assert min(got["faults"][-10:]) > 4096


def test_a_setting_the_user_made_is_kept():
    got = _run("use", {"MALLOC_MMAP_MAX_": "65536"})  # mmap allowed: the user's choice
    assert got["mmap_max"] == "65536"
    assert min(got["faults"][-10:]) > 4096


def test_a_tunable_the_user_set_is_kept():
    got = _run("use", {"GLIBC_TUNABLES": "glibc.malloc.check=0:glibc.malloc.mmap_max=65536"})
    assert got["mmap_max"] is None  # not set over the user's tunable, nor by mallopt
    assert min(got["faults"][-10:]) > 4096
