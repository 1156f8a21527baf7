#!/usr/bin/env bash
# The engine's GPU checks, as one prepared run for a lent GPU machine (issue #19). From the repo root:
#
#   here:   echo /.gpu-assets/ >> .git/info/exclude
#           .venv/bin/python -m sealed_bench.gpu_models .gpu-assets      # SmolLM2's tokenizer, 2 MB
#   there:  device run, carry [".gpu-assets"], timeout_s 600:  bash tests/gpu/engine_checks.sh
#
# It needs only what the GPU image has (torch with CUDA, triton, transformers, pytest). Results go to
# $OUT (or /tmp/gpu-out): kernels.log, bench.json, bench.log.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

# 1. Every Triton kernel against its torch reference, compiled for this GPU (not interpreted).
SEALED_KERNEL_DEVICE=cuda TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  -o addopts="" tests/enclave_worker/engine/kernels/test_paged_attention.py \
  tests/enclave_worker/engine/kernels/test_fused.py 2>&1 | tee "$OUT/kernels.log"

# 2. The default CUDA decode path (Triton kernels + CUDA graphs, EngineConfig's default since this run
#    passed on an H200, 2026-12-04): greedy fp32 equality with HF (8 prompts x 32 tokens), then the
#    benchmark table: batch 1/64/256 bf16, int4 and FP8 at batch 1, the gather + SDPA path beside it
#    (--baseline-path), HF eager and HF static cache + compile, bandwidth bound, TTFT, host<->device
#    crossings per decode step (engine count and CUDA profiler). A failing section is a row with its
#    error; the later ones still run.
timeout 400 python3 -m sealed_bench.bench_gpu --arch tinyllama-1.1b --check-hf --assets .gpu-assets \
  --batch 1,64,256 --quant int4,fp8 --compare hf,hf-compile --compile-batches 1,64 \
  --baseline-path \
  --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
