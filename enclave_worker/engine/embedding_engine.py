"""A worker's engine when its package is a sentence encoder (kind "embedding"): the `Embedder` on
one compute thread, with the bounds a request must keep and what the worker's seam needs (held
tensors for the wipe, stats, shutdown). It generates nothing: a chat request is refused.

The model is built on the thread that later runs every batch (compute_thread.py says why), and
batches run one at a time there: an embedding request is one forward pass per length bucket, so
there is nothing to schedule beside it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .checkpoint import Checkpoint
from .compute_thread import ComputeThread
from .config import EngineConfig, RequestOutput, SamplingParams
from .embedder import Embedder, Embeddings
from .errors import CheckpointError, InvalidRequestError
from .layers.linear import LinearOptions
from .layers.packed import zero_every_byte
from .model_builder import kernel_path_for
from .models import model_tensors
from .models.bert import is_encoder
from .models.options import BuildOptions
from .threads import available_cpus
from .tokenizer import Tokenizer

# OpenAI's own bounds on one /v1/embeddings request: 2,048 inputs, 300,000 tokens in all.
MAX_INPUTS = 2048
MAX_REQUEST_TOKENS = 300_000
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_QUANTIZED = ("int8", "int4", "fp8")


@dataclass(frozen=True)
class EmbeddingLimits:
    max_inputs: int = MAX_INPUTS
    max_request_tokens: int = MAX_REQUEST_TOKENS


def encoder_build_options(config: EngineConfig) -> BuildOptions:
    """The encoder's build options from the worker's engine configuration: the same kernel path and
    weight quantization a decoder of this configuration would get."""
    kernel = kernel_path_for(config)
    quant = config.dtype if config.dtype in _QUANTIZED else "none"
    dtype = torch.bfloat16 if quant != "none" and torch.device(config.device).type == "cuda" \
        else _TORCH_DTYPES.get(config.dtype, torch.float32)
    return BuildOptions(LinearOptions(quant, dtype, config.device, kernel.linear, in_place=True), 512)


class EmbeddingEngine:
    """The encoder a worker serves /v1/embeddings with."""

    def __init__(self, embedder: Embedder, tokenizer: Tokenizer, thread: ComputeThread,
                 limits: EmbeddingLimits) -> None:
        self.embedder, self.tokenizer, self._thread, self.limits = embedder, tokenizer, thread, limits
        self.max_model_len = embedder.pooling.max_tokens
        self._lock = threading.Lock()  # one batch at a time; the wipe waits for the batch running
        self._served = 0

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, config: EngineConfig,
                        limits: EmbeddingLimits | None = None) -> EmbeddingEngine:
        if not is_encoder(checkpoint.config):
            raise CheckpointError("the package says it serves embeddings but holds no encoder")
        thread = ComputeThread("embedder")

        def build() -> Embedder:
            if config.device == "cpu":
                torch.set_num_threads(config.num_threads or available_cpus())
            return Embedder(checkpoint, encoder_build_options(config))

        try:
            embedder = thread.call(build)
        except BaseException:
            thread.close()
            raise
        tokenizer = Tokenizer(checkpoint.tokenizer_json, None, checkpoint.config)
        return cls(embedder, tokenizer, thread, limits or EmbeddingLimits())

    def check(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Each input's ids, or InvalidRequestError: empty, more inputs or tokens than a request may
        have, an over-long input or an id outside the vocabulary (the embedder's own checks)."""
        if len(inputs) > self.limits.max_inputs:
            raise InvalidRequestError(f"input has {len(inputs)} items; at most {self.limits.max_inputs} per request")
        ids = self.embedder.tokenize(inputs)
        total = sum(map(len, ids))
        if total > self.limits.max_request_tokens:
            raise InvalidRequestError(f"input has {total} tokens in all; at most "
                                      f"{self.limits.max_request_tokens} per request")
        return ids

    async def embed(self, inputs: Sequence[str | Sequence[int]]) -> Embeddings:
        """The inputs' vectors, computed on the compute thread (the event loop stays free)."""
        ids = self.check(inputs)

        def run() -> Embeddings:
            with self._lock:
                out = self.embedder.embed(ids)
                self._served += len(ids)
                return out

        return await asyncio.wrap_future(self._thread.start(run))

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 cache_salt: bytes = b"") -> AsyncGenerator[RequestOutput, None]:
        raise InvalidRequestError("this model is an embedding model: it serves /v1/embeddings, not generation")

    def stats(self) -> dict[str, Any]:
        # Numbers only (WorkerStatus.stats): the gateway reads a nonzero embedding_dim as "an encoder".
        return {"embedding_dim": self.embedder.dim, "inputs_embedded": self._served}

    def held_tensors(self) -> list[torch.Tensor]:
        return model_tensors(self.embedder.encoder)

    def wipe(self) -> None:
        with self._lock, torch.inference_mode():
            for tensor in self.held_tensors():
                zero_every_byte(tensor)

    async def shutdown(self) -> None:
        self._thread.close()
