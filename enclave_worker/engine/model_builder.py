"""Building the model an engine serves: architecture, dtype and quantization, the kernel path
(kernel_path.py), the CPU thread count, and the longest sequence the model allows. The checkpoint's
tensors are consumed: popped from its dict and, where a kernel wants another layout, rearranged in their
own memory, so the weights exist once (for a decrypted package, inside the buffer that
``DecryptedModel.wipe`` zeroes). Pass clones to keep the originals."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from dataclasses import dataclass

import torch

from .checkpoint import Checkpoint
from .config import EngineConfig
from .errors import EngineError
from .kernel_path import KernelPath, choose_kernel_path, detect_cpu_class
from .layers.linear import LinearOptions
from .models import CausalLM, build_architecture, check_architecture
from .models.options import BuildOptions
from .threads import default_threads
from .tokenizer import Tokenizer

_TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.float32,
    "int4": torch.float32,
    "fp8": torch.float32,
}
_QUANTIZED = ("int8", "int4", "fp8")


@dataclass(frozen=True)
class BuiltModel:
    model: CausalLM
    dtype: torch.dtype
    quant: str  # "none" | "int8" | "int4" | "fp8"
    model_len: int  # the longest sequence the model allows (before the KV pool's own limit)
    threads: int  # CPU: the compute thread's torch pool, fixed for the engine's life
    tokenizer: Tokenizer
    vocab_size: int
    hidden_size: int
    kernel: KernelPath


def _release_freed_memory() -> None:
    """Return freed heap pages to the OS (glibc malloc_trim); best effort, no-op elsewhere."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def kernel_path_for(config: EngineConfig) -> KernelPath:
    """The configuration's kernel path on this machine. A configuration that names a CPU class (as a
    worker's measured configuration does) must be run on a CPU of that class: another class would run
    other kernels, and so give other logits, than the ones the measurement names."""
    cpu_class = None
    if torch.device(config.device).type == "cpu":
        cpu_class = detect_cpu_class()
        if config.cpu_class is not None and config.cpu_class != cpu_class:
            raise EngineError(f"the configuration names CPU class {config.cpu_class!r}; this CPU is {cpu_class!r}")
    return choose_kernel_path(config.device, config.dtype, config.decode_kernels, cpu_class)


def build_model(checkpoint: Checkpoint, config: EngineConfig) -> BuiltModel:
    cfg = checkpoint.config
    check_architecture(cfg)  # one line naming what is unsupported (models/__init__.py)
    threads = config.num_threads or default_threads()
    if config.device == "cpu":
        torch.set_num_threads(threads)  # on the thread that will step the engine (compute_thread.py)
    kernel = kernel_path_for(config)
    quant = config.dtype if config.dtype in _QUANTIZED else "none"
    # Quantized weights take bf16 activations on a GPU (what its int4/FP8 kernels want), fp32 on the CPU.
    cuda = torch.device(config.device).type == "cuda"
    dtype = torch.bfloat16 if quant != "none" and cuda else _TORCH_DTYPES[config.dtype]
    model_len = min(
        config.max_model_len or min(cfg.get("max_position_embeddings", 4096), 4096),
        cfg.get("max_position_embeddings", 1 << 30),
    )
    linear = LinearOptions(quant, dtype, config.device, kernel.linear, codes=config.panel_codes,
                           int4_group_size=config.int4_group_size)
    opts = BuildOptions(linear, model_len, release=checkpoint.release)
    with torch.inference_mode():
        model = build_architecture(cfg, checkpoint.tensors, opts).eval()
    _release_freed_memory()  # conversion transients go back to the OS before the KV pool is touched
    return BuiltModel(model=model, dtype=dtype, quant=quant, model_len=model_len, threads=threads,
                      tokenizer=Tokenizer(checkpoint.tokenizer_json, checkpoint.chat_template, cfg),
                      vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]), kernel=kernel)
