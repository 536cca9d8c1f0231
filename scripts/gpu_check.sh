#!/usr/bin/env bash
# What a GPU machine can prove about trirace, as one prepared run: one summary line per
# check ("PASS name: ..." or "FAIL name: ..."), a non-zero exit if any check failed. Where
# CUDA is absent it says so in one line and exits 0: the test suite never depends on a GPU.
#
#   1 GPU (NCCL refuses two ranks on one GPU, so no multi-rank NCCL here):
#     - the CUDA compute path at world size 1: bf16 with recompute, clipping, a cosine
#       schedule and evaluation; Muon; each against the same job on gloo (CPU);
#     - compute timed with CUDA events against wall time around a device sync;
#     - the memory pre-check's estimate against torch.cuda.max_memory_allocated;
#     - the partitioner's layer timing on the device;
#   2+ GPUs: pp=2 (and pp=2 x dp=2 with 4) under every policy on NCCL, with
#     NCCL_LAUNCH_ORDER_IMPLICIT=1, losses against the gloo run of the same job, and each
#     run's comm log under `trirace commcheck` (strict device model).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA device visible here; skipped"
  exit 0
fi
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
"$PY" -c 'import torch; print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {torch.cuda.nccl.version()}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")'
out=$(mktemp -d)
failed=0
JOB=(--model gpt-tiny --data synthetic --steps 12 --micro-batches 4 --micro-batch-size 8 --seq-len 128 --no-progress)

say() {  # STATUS NAME DETAIL
  echo "$1 $2: $3"
  [ "$1" = PASS ] || failed=1
}

train() {  # NAME, then flags for trirace train; writes $out/NAME.jsonl and $out/NAME-log
  local name=$1; shift
  timeout 600 "$PY" -m trirace train "$@" --metrics-out "$out/$name.jsonl" --comm-log "$out/$name-log" \
    > "$out/$name.out" 2>&1
}

compare() {  # NAME REFERENCE TOLERANCE: the runs' per-step losses, relative difference
  "$PY" - "$out/$1.jsonl" "$out/$2.jsonl" "$3" <<'EOF'
import json, math, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) and a else math.inf
ok = all(map(math.isfinite, a)) and worst <= float(sys.argv[3])
print(("PASS" if ok else "FAIL"), f"{len(a)} steps, final loss {a[-1] if a else float('nan'):.4f}, "
      f"largest relative difference {worst:.2e} (tolerance {sys.argv[3]})")
EOF
}

check_run() {  # NAME REFERENCE TOLERANCE, then the train flags
  local name=$1 ref=$2 tol=$3; shift 3
  if ! train "$name" "$@"; then
    say FAIL "$name" "trirace train exited non-zero: $(tail -n 1 "$out/$name.out")"
    return
  fi
  local line
  line=$(compare "$name" "$ref" "$tol")
  say "${line%% *}" "$name" "${line#* } against $ref"
  line=$("$PY" -m trirace commcheck "$out/$name-log" 2>&1 | tail -n 1)
  case "$line" in
    *clean*) say PASS "$name-commcheck" "$line" ;;
    *) say FAIL "$name-commcheck" "$line" ;;
  esac
}

if [ "$gpus" -ge 2 ]; then
  export NCCL_LAUNCH_ORDER_IMPLICIT=1
  layouts=("2 1")
  [ "$gpus" -ge 4 ] && layouts+=("2 2")
  for layout in "${layouts[@]}"; do
    read -r pp dp <<< "$layout"
    train "gloo-pp${pp}-dp${dp}" "${JOB[@]}" --backend gloo --pp "$pp" --dp "$dp" --comm-policy blocking \
      || say FAIL "gloo-pp${pp}-dp${dp}" "the reference run failed: $(tail -n 1 "$out/gloo-pp${pp}-dp${dp}.out")"
    for policy in blocking fifo priority trirace; do
      check_run "nccl-pp${pp}-dp${dp}-$policy" "gloo-pp${pp}-dp${dp}" 1e-3 "${JOB[@]}" --backend nccl \
        --pp "$pp" --dp "$dp" --comm-policy "$policy"
    done
  done
else
  FEATURES=(--precision bf16 --recompute --clip-grad 1 --eval-every 4 --lr-schedule cosine --warmup-steps 2)
  train gloo-world1 "${JOB[@]}" --backend gloo --pp 1 --dp 1
  check_run nccl-world1 gloo-world1 1e-3 "${JOB[@]}" --backend nccl --pp 1 --dp 1
  train gloo-world1-bf16 "${JOB[@]}" --backend gloo --pp 1 --dp 1 "${FEATURES[@]}"
  check_run nccl-world1-bf16 gloo-world1-bf16 3e-2 "${JOB[@]}" --backend nccl --pp 1 --dp 1 "${FEATURES[@]}"
  train gloo-world1-muon "${JOB[@]}" --backend gloo --pp 1 --dp 1 --optimizer muon
  check_run nccl-world1-muon gloo-world1-muon 1e-3 "${JOB[@]}" --backend nccl --pp 1 --dp 1 --optimizer muon
fi

# Device-side checks on GPU 0, in this process: event timing, the memory estimate, layer timing.
timeout 600 "$PY" - <<'EOF' || failed=1
import os, time
import torch
import torch.distributed as dist

from trirace.config import make_config
from trirace.plan.memory import RUNTIME_BYTES, estimate
from trirace.runtime.layer_timing import _Clock
from trirace.runtime.trainer import Trainer, measure_layers

dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
status = 0


def say(ok: bool, name: str, detail: str) -> None:
    global status
    print(("PASS" if ok else "FAIL"), f"{name}: {detail}", flush=True)
    status |= not ok


# CUDA events on the compute stream against wall time around a device sync (here, outside
# any job, a sync is what the reference needs).
a = torch.randn(4096, 4096, device=dev)
clock = _Clock(dev)
for _ in range(3):
    a @ a
torch.cuda.synchronize(dev)
t0 = time.perf_counter()
clock.start()
for _ in range(50):
    a @ a
events = clock.stop()
torch.cuda.synchronize(dev)
wall = time.perf_counter() - t0
say(0.8 <= events / wall <= 1.05, "event-timing", f"50 matmuls: events {events * 1e3:.1f} ms, wall {wall * 1e3:.1f} ms")

# The partitioner's layer timing on the device: every layer positive, the head the heaviest.
cfg = make_config(model="gpt-tiny", data="synthetic", pp=1, dp=1, steps=4, micro_batches=4,
                  micro_batch_size=8, progress=False, backend="nccl")
times = measure_layers(cfg, device=dev)
say(all(t > 0 for t in times) and max(times) == times[-1], "layer-timing",
    "per layer (ms): " + " ".join(f"{t * 1e3:.2f}" for t in times))

# The memory pre-check's estimate against what the CUDA allocator held at its peak.
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl", rank=0, world_size=1)
torch.cuda.reset_peak_memory_stats(dev)
Trainer(cfg, dev).run()
peak = torch.cuda.max_memory_allocated(dev)
est = estimate(cfg, torch.cuda.get_device_properties(dev).total_memory, "GPU 0").per_rank[0] - RUNTIME_BYTES
say(0.5 <= peak / est <= 1.5, "memory-estimate", f"peak allocated {peak / 2**20:.0f} MiB, estimate {est / 2**20:.0f} MiB "
    f"(ratio {peak / est:.2f})")
dist.destroy_process_group()
raise SystemExit(status)
EOF

echo "gpu_check: $([ $failed = 0 ] && echo "every check passed" || echo "some check FAILED") ($out)"
exit $failed
