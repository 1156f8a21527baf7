#!/usr/bin/env bash
# Issue #49's GPU run (tests/gpu/big_model.py): an 8B-shaped bf16 model made on the device, greedy
# equality with HF there, cold start (decrypt into GPU memory, GB/s), and serving beside `vllm serve`
# under `vllm bench serve`. About 10 minutes on an H100/H200 with 16 cores. From the repo root:
#
#   here:   echo /.gpu-assets/ >> .git/info/exclude
#           .venv/bin/python -m sealed_bench.gpu_models .gpu-assets      # SmolLM2's tokenizer, 2 MB
#   there:  device run, carry [".gpu-assets"], timeout_s 600:  bash tests/gpu/big_model.sh
#   CPU:    bash tests/gpu/big_model.sh --dry-run                        # the tiny shape, no GPU, no vLLM
#
# Results go to $OUT (or /tmp/gpu-out): big_model.json (one entry per section, written as each ends),
# work/vllm.log. A failing section is an entry with its error; the later ones still run.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/devtools PYTHONUNBUFFERED=1 OUT
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "${1:-}" = "--dry-run" ] && PY=.venv/bin/python
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  | tee "$OUT/gpu.txt"
timeout 590 "$PY" -m tests.gpu.big_model --out "$OUT" "$@" 2>&1 | tee "$OUT/big_model.log"
