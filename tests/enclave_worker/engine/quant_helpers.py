"""Shared by the checkpoint-format tests: peak resident memory of loads, run in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_PROBE = """
import gc, json
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
import torch, numpy, gguf  # imported before the baseline
from enclave_worker.engine import checkpoint
from enclave_worker.engine.layers.quantized_weight import QuantizedWeight
base, peaks, quantized_fp32 = hwm(), [], 0
for call in {calls!r}:
    ck = eval(call)
    peaks.append(hwm() - base)
    quantized_fp32 = max(quantized_fp32, sum(4 * t.spec.shape[0] * t.spec.shape[1] for t in ck.tensors.values()
                                             if isinstance(t, QuantizedWeight)))
    del ck
    gc.collect()
print(json.dumps({{"peaks": peaks, "quantized_fp32": quantized_fp32}}))
"""


def peak_load_bytes(*calls: str) -> tuple[list[int], int]:
    """VmHWM growth (bytes) after each of ``calls`` (expressions over ``checkpoint``, run in order in one
    fresh interpreter: the high-water mark only rises, so order the smaller load first), and the float32
    size of the largest load's quantized weights. The peak counts every transient copy of a load."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(calls=list(calls))], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600, check=True)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return [int(p) for p in doc["peaks"]], int(doc["quantized_fp32"])
