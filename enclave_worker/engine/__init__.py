"""The inference engine: paged KV cache, continuous batching, prefix cache, quantized kernels."""

from .checkpoint import Checkpoint, load_gguf, load_hf_dir, tensor_specs
from .config import EngineConfig, RequestOutput, SamplingParams, TokenLogprob
from .errors import CheckpointError, EngineDeadError, EngineError, InvalidRequestError
from .llm_engine import LLMEngine
from .tokenizer import Tokenizer

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "InvalidRequestError",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
    "Tokenizer",
    "load_gguf",
    "load_hf_dir",
    "tensor_specs",
]
