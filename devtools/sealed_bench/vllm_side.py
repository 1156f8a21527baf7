"""What the benchmarks that run vLLM beside Sealed (`vllmload`, `vllmserve`) share: the options that
choose vLLM's interpreter, its CPU binding (peers.py: all cores by default) and the results file,
and the machine facts each result records (a figure taken on a loaded machine says so)."""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path
from typing import Any

from sealed_bench.peers import add_peer_options


def add_vllm_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm-python", default=None, help="vLLM's interpreter (default: api/vllm_python.py)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    add_peer_options(parser)


def vllm_interpreter(args: argparse.Namespace) -> str:
    from api.vllm_python import vllm_python

    return str(args.vllm_python or vllm_python())


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "allowed_cpus": len(os.sched_getaffinity(0)), "machine": platform.machine(),
            "loadavg_1m": round(os.getloadavg()[0], 2)}
