#!/usr/bin/env bash
# The device check: bench_engine.py on random-init models of realistic size, on one GPU.
# Run on the lent GPU machine from the repo root, carrying .whl (transformers 5.24 wheel) and
# .cache/tokenizers/qwen3 (a real Qwen tokenizer; no weights reach that machine).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
for size in ${SIZES:-qwen2.5-1.5b qwen2.5-7b}; do
  python3 benchmarks/bench_engine.py --random-init "$size" --tokenizer .cache/tokenizers/qwen3 --device cuda \
    --repeats "${REPEATS:-10}" --ar-repeats "${AR_REPEATS:-2}" --json "$OUT/$size.json" 2>&1 | tee "$OUT/$size.txt"
done
