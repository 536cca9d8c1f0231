# Longer convergence on one GPU: pp=1 x dp=1 keeps 2bw's one-step delay (the update rule is the same).
python3 -m pip install -q --no-index --find-links .devwheels pydantic 2>&1 | tail -1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for opt in adamw muon; do for run in "1f1b none" "2bw none" "2bw predict"; do set -- $run
  timeout 150 python3 -m trirace.cli train --backend nccl --pp 1 --dp 1 --model gpt-tiny --data stdlib \
    --micro-batches 8 --micro-batch-size 4 --seq-len 128 --steps 1000 --optimizer $opt --lr 3e-3 \
    --lr-schedule cosine --warmup-steps 50 --min-lr 3e-4 --eval-every 100 --eval-batches 8 \
    --schedule $1 --delay-compensation $2 --no-progress --metrics-out $OUT/$opt-$1-$2.jsonl 2>&1 | tail -1
done; done
