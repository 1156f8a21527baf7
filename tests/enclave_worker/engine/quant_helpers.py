"""Shared by the checkpoint-format tests: peak resident memory of a load, run in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_PROBE = """
import json, sys
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
import torch, numpy, gguf  # imported before the baseline
from enclave_worker.engine import checkpoint
base = hwm()
ck = {call}
import resource
print(json.dumps({{"peak": hwm() - base, "names": len(ck.tensors)}}))
"""


def peak_load_bytes(call: str) -> int:
    """VmHWM growth (bytes) of ``call`` (an expression over ``checkpoint``) in a fresh interpreter: the
    most memory the load ever held, the transient copies included."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(call=call)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600, check=True)
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak"])
