"""A worker's engine when its package is a sentence encoder (kind "embedding"): the `Embedder` on
one compute thread, with the bounds a request must keep and what the worker's seam needs (held
tensors for the wipe, stats, shutdown). It generates nothing: a chat request is refused.

The model is built on the thread that later runs every batch (compute_thread.py says why), and
batches run one at a time there: an embedding request is one forward pass per length bucket, so
there is nothing to schedule beside it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
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
from .threads import default_threads
from .tokenizer import Tokenizer

# OpenAI's own bounds on one /v1/embeddings request: 2,048 inputs, 300,000 tokens in all.
MAX_INPUTS = 2048
MAX_REQUEST_TOKENS = 300_000
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_QUANTIZED = ("int8", "int4", "fp8")
T = TypeVar("T")


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
        self.retrieval_encoder = ComputeEncoder(self)  # one for the engine's life: retrieval keys on it

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, config: EngineConfig,
                        limits: EmbeddingLimits | None = None) -> EmbeddingEngine:
        if not is_encoder(checkpoint.config):
            raise CheckpointError("the package says it serves embeddings but holds no encoder")
        thread = ComputeThread("embedder")

        def build() -> Embedder:
            if config.device == "cpu":
                torch.set_num_threads(config.num_threads or default_threads())
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
            out = self._batch(ids)
            self._served += len(ids)
            return out

        return await asyncio.wrap_future(self._thread.start(run))

    def embed_waiting(self, inputs: Sequence[str | Sequence[int]]) -> Embeddings:
        """The inputs' vectors, computed on the compute thread: at once when called there, else while
        the calling thread (never the event loop) waits; no request bounds (a file's chunks)."""
        if threading.current_thread() is self._thread.thread:
            return self._batch(inputs)
        return self._thread.call(lambda: self._batch(inputs))

    def _batch(self, inputs: Sequence[str | Sequence[int]]) -> Embeddings:
        with self._lock:
            return self.embedder.embed(inputs)

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


class ComputeEncoder:
    """The engine's encoder as a worker's retrieval uses it (retrieval/service.py's StoreEncoder):
    chunks and queries are embedded on the engine's compute thread, under its lock, like a
    /v1/embeddings batch, and the retrieval calls themselves run there (``submit``: one hop from the
    event loop, not two). Run on asyncio's pool threads (until 2026-12-07), torch and faiss started
    OpenMP teams beside the compute thread's, which makes libgomp stop spinning between parallel
    regions once it counts more threads than CPUs (compute_thread.py), and the wipe did not wait
    for a retrieval batch; a hop from a pool thread to the compute thread and back cost about 1 ms
    a query on a loaded 2-vCPU VM (docs/retrieval.md, "The cost of the boundary")."""

    def __init__(self, engine: EmbeddingEngine) -> None:
        self._engine = engine
        self.dim = engine.embedder.dim

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """``fn`` queued on the engine's compute thread (a retrieval call: open, embed, search, seal)."""
        return self._engine._thread.start(fn)

    @property
    def chunk_window(self) -> int:
        return self._engine.embedder.chunk_window

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self._engine.embedder.token_offsets(text)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        return self._engine.embed_waiting(texts).vectors.numpy()
