"""Shared engine fixtures: the default GGUF loaded once per session; engines share its fp32 tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from enclave_worker.engine import (
    Checkpoint,
    EngineConfig,
    LLMEngine,
    RequestOutput,
    SamplingParams,
    load_gguf,
)
from enclave_worker.engine.checkpoint import default_gguf_path


@pytest.fixture(scope="session")
def gguf_path():
    try:
        path = default_gguf_path()
    except Exception as exc:
        pytest.skip(f"default model not installed: {exc}")
    if not path.is_file():
        pytest.skip(f"default model not found at {path}")
    return path


@pytest.fixture(scope="session")
def checkpoint(gguf_path) -> Checkpoint:
    return load_gguf(gguf_path)


@pytest.fixture(scope="session")
def make_engine(checkpoint) -> Callable[..., LLMEngine]:
    """Build an engine over a copy of the session checkpoint (an engine consumes its tensors' memory)."""

    def make(**overrides) -> LLMEngine:
        cfg = EngineConfig(**{"max_num_seqs": 16, "kv_cache_memory_bytes": 96 << 20, "num_threads": 1, **overrides})
        tensors = {k: v.clone() for k, v in checkpoint.tensors.items()}
        return LLMEngine.from_checkpoint(dataclasses.replace(checkpoint, tensors=tensors), cfg)

    return make


@pytest.fixture(scope="session")
def engine(make_engine) -> LLMEngine:
    return make_engine()


def run_sync(
    engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]], salt: bytes = b""
) -> dict[str, list[RequestOutput]]:
    """Drive the engine synchronously (add all, step until done); outputs per request id."""
    outs: dict[str, list[RequestOutput]] = {rid: [] for rid, _, _ in requests}
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params, outs[rid].append, salt)
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    return outs


def tokens_of(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.delta_token_ids]


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "List three prime numbers:",
    "Translate to German: Good morning, how are you?",
    "The quick brown fox",
    "In 1969, the first humans",
    "Water boils at a temperature of",
]


class EngineHelpers:
    prompts = PROMPTS
    run_sync = staticmethod(run_sync)
    tokens_of = staticmethod(tokens_of)


@pytest.fixture(scope="session")
def h() -> type[EngineHelpers]:
    """Helpers (the suite imports test modules with importlib, so helpers travel as a fixture)."""
    return EngineHelpers
