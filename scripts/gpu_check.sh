#!/usr/bin/env bash
# Train on the GPUs of this machine through NCCL and check every rank's issued ops under
# NCCL's rules. Prints per-step losses and tokens/s. Where CUDA is absent it says so in one
# line and exits 0: the test suite never depends on a GPU.
#
#   2+ GPUs: pp=2 x dp=1 (and pp=2 x dp=2 on 4+) from the local launcher, then the same
#            job under torchrun, each with --comm-log and trirace commcheck;
#   1 GPU:   NCCL at world size 1, then the multi-process path (4 gloo ranks on CPU) on the
#            same job for comparison. NCCL cannot put two ranks on one GPU ("duplicate
#            GPU"), and gloo's P2P takes CPU tensors, so multi-rank CUDA compute needs 2 GPUs.
set -euo pipefail
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
JOB=(--model gpt-tiny --data synthetic --steps 12 --micro-batches 4 --micro-batch-size 8 --seq-len 128 --no-progress)

losses() {  # the per-step losses a metrics file holds, on one line
  "$PY" -c 'import json, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; print("losses:", " ".join("%.4f" % r["loss"] for r in rows))' "$1"
}

run() {  # NAME, then flags for trirace train (or a torchrun command line after "--torchrun N")
  local name=$1; shift
  echo "== $name"
  if [ "$1" = "--torchrun" ]; then
    local n=$2; shift 2
    timeout 600 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" -m trirace.cli train "$@" \
      --metrics-out "$out/$name.jsonl" --comm-log "$out/$name-log"
  else
    timeout 600 "$PY" -m trirace.cli train "$@" --metrics-out "$out/$name.jsonl" --comm-log "$out/$name-log"
  fi
  losses "$out/$name.jsonl"
  "$PY" -m trirace.cli commcheck "$out/$name-log"
}

if [ "$gpus" -ge 2 ]; then
  for policy in blocking trirace; do
    run "nccl-pp2-$policy" "${JOB[@]}" --backend nccl --pp 2 --dp 1 --comm-policy "$policy"
  done
  run "torchrun-nccl-pp2" --torchrun 2 "${JOB[@]}" --backend nccl --pp 2 --dp 1
  # the training features: bf16 compute and reduction, recompute, clipping, evaluation; Muon
  run "nccl-pp2-bf16" "${JOB[@]}" --backend nccl --pp 2 --dp 1 --precision bf16 --recompute --clip-grad 1 \
    --eval-every 4 --lr-schedule cosine --warmup-steps 2
  run "nccl-pp2-muon" "${JOB[@]}" --backend nccl --pp 2 --dp 1 --optimizer muon
  if [ "$gpus" -ge 4 ]; then
    run "nccl-pp2-dp2" "${JOB[@]}" --backend nccl --pp 2 --dp 2 --embedding-comm auto
    run "nccl-pp2-dp2-bf16-comm" "${JOB[@]}" --backend nccl --pp 2 --dp 2 --grad-comm-dtype bf16
  fi
else
  run "nccl-world1" "${JOB[@]}" --backend nccl --pp 1 --dp 1
  run "nccl-world1-bf16" "${JOB[@]}" --backend nccl --pp 1 --dp 1 --precision bf16 --recompute --clip-grad 1 \
    --eval-every 4 --lr-schedule cosine --warmup-steps 2
  run "nccl-world1-muon" "${JOB[@]}" --backend nccl --pp 1 --dp 1 --precision bf16 --optimizer muon
  run "gloo-cpu-pp2-dp2" "${JOB[@]}" --backend gloo --pp 2 --dp 2
fi
echo "gpu_check: done ($out)"
