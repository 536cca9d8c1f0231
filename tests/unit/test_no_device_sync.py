"""No device-wide sync in the runtime: `torch.cuda.synchronize` waits for every stream of
the device, NCCL's included, so a rank that calls it between posting a receive and sending
what its peer needs first hangs a GPU job. Only the calibration's timing helpers, which run
no collective, may call it."""

import re
from pathlib import Path

import trirace

ROOT = Path(trirace.__file__).parent
ALLOWED = ("calibrate/",)  # timing helpers outside any job


def test_no_device_wide_sync_outside_the_timing_helpers():
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(ALLOWED):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bcuda\.synchronize\s*\(", code):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
