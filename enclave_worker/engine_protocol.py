"""The seam between the worker (gRPC service, guard, sealed mode, revocation) and an engine.

Two implementations: our engine (`enclave_worker.engine.LLMEngine`, the default) and vLLM
(`enclave_worker.vllm_engine.VllmEngine`). The tenant picks one per model version
(`WorkerSettings.engine`, measured). Both take token ids from the worker (which renders and
tokenizes, and applies the in-enclave policy) and give back our `RequestOutput`s, with stop
strings, stop ids, EOS, logprobs and streamed text decided by the same OutputProcessor.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

import torch

from enclave_worker.engine.config import RequestOutput, SamplingParams
from enclave_worker.engine.tokenizer import Tokenizer

ENGINES = ("sealed", "vllm")


class ServingEngine(Protocol):
    tokenizer: Tokenizer
    max_model_len: int

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 cache_salt: bytes = b"") -> AsyncGenerator[RequestOutput, None]:
        """Stream one request's deltas; closing the iterator early aborts the request."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def held_tensors(self) -> list[torch.Tensor]:
        """Every tensor holding model weights or KV cache (what `wipe` zeroes)."""
        ...

    def wipe(self) -> None:
        """Zero every weight and the KV cache in place (key revocation)."""
        ...

    async def shutdown(self) -> None: ...
