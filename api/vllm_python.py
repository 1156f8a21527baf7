"""Which Python interpreter runs a vLLM worker.

vLLM pins its own torch and a long list of libraries, so it lives in its own virtualenv
(docs/vllm-backend.md). The interpreter is, in order: `$SEALED_VLLM_PYTHON`; `.vllm-venv/bin/python`
at the repository root (what `.ci/run` creates); this interpreter, if vLLM is importable here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from api.errors import SealedApiError

ENV = "SEALED_VLLM_PYTHON"
REPO_VENV = Path(__file__).resolve().parent.parent / ".vllm-venv" / "bin" / "python"


class VllmNotInstalled(SealedApiError, RuntimeError):
    """No interpreter with vLLM was found."""


def find_vllm_python() -> str | None:
    configured = os.environ.get(ENV)
    if configured:
        return configured if Path(configured).is_file() else None
    if REPO_VENV.is_file():
        return str(REPO_VENV)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


def vllm_python() -> str:
    python = find_vllm_python()
    if python is None:
        raise VllmNotInstalled(f"vLLM is not installed: set {ENV} to a python that imports vllm "
                               "(docs/vllm-backend.md), or create .vllm-venv as .ci/run does")
    return python
