"""Building the model an engine serves: architecture, dtype and quantization, CPU thread pools, and
the longest sequence the model allows. The checkpoint's tensors are consumed: popped from its dict
and, where a kernel wants another layout, rearranged in their own memory, so the weights exist
once (for a decrypted package, inside the buffer that ``DecryptedModel.wipe`` zeroes). Pass clones
to keep the originals."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from dataclasses import dataclass
from typing import Any

import torch
from threadpoolctl import threadpool_limits

from .blas_calibration import measure_packed_speedup
from .checkpoint import Checkpoint
from .config import EngineConfig
from .layers.packed import PACKABLE_DTYPES, PackingError, bf16_native, packing_available
from .models import CausalLM, build_architecture, check_architecture
from .models.options import BuildOptions
from .threads import available_cpus
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
    threads: int
    tokenizer: Tokenizer
    vocab_size: int
    hidden_size: int
    packed: bool = False  # dense linears hold oneDNN-packed weights (layers/packed.py)
    panel: bool = False  # dense fp32 linears hold column panels for the C++ kernel (layers/panel.py)
    panel_codes: bool = False  # panels exactly on a block grid may be held as codes (layers/coded_panel.py)


def _release_freed_memory() -> None:
    """Return freed heap pages to the OS (glibc malloc_trim); best effort, no-op elsewhere."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


PACK_FP32_GAIN = 1.5  # packed fp32 by default where oneDNN measured this much faster at 64 rows


def _packed_fp32_pays(cfg: dict[str, Any], threads: int) -> bool:
    """Whether oneDNN over packed fp32 weights beats OpenBLAS and torch on this CPU by ``PACK_FP32_GAIN``
    at a decode batch, on the model's MLP shape (blas_calibration.py). It costs batch-1 decode ~15% on
    an AVX-512 Zen 5 and gains 2x at 16-2048 rows there; an AVX2 CPU may measure no gain and stay plain."""
    try:
        gain = measure_packed_speedup(2 * int(cfg["intermediate_size"]), int(cfg["hidden_size"]), threads)
    except (KeyError, ValueError, PackingError):
        return False
    return gain >= PACK_FP32_GAIN


def build_model(checkpoint: Checkpoint, config: EngineConfig) -> BuiltModel:
    cfg = checkpoint.config
    check_architecture(cfg)  # one line naming what is unsupported (models/__init__.py)
    threads = config.num_threads or available_cpus()
    if config.device == "cpu":
        torch.set_num_threads(threads)
        threadpool_limits(threads, user_api="blas")  # OpenBLAS (numpy) too: layers/linear.py
    quant = config.dtype if config.dtype in _QUANTIZED else "none"
    # Quantized weights take bf16 activations on a GPU (what its int4/FP8 kernels want), fp32 on the CPU.
    cuda = torch.device(config.device).type == "cuda"
    dtype = torch.bfloat16 if quant != "none" and cuda else _TORCH_DTYPES[config.dtype]
    model_len = min(
        config.max_model_len or min(cfg.get("max_position_embeddings", 4096), 4096),
        cfg.get("max_position_embeddings", 1 << 30),
    )
    # bf16 packs only where oneDNN has bf16 on this CPU (PackedMatmul refuses it elsewhere): asking for
    # packed bf16 on an AVX2-only CPU builds the plain bf16 model.
    packed = (config.device == "cpu" and dtype in PACKABLE_DTYPES and quant == "none" and packing_available()
              and (dtype != torch.bfloat16 or bf16_native())
              and (config.packed_weights if config.packed_weights is not None
                   else dtype == torch.bfloat16 or _packed_fp32_pays(cfg, threads)))
    # Panels: fp32 dense weights on the CPU that are not packed, where the engine runs the C++ kernels
    # (the default; False keeps the checkpoint's layout).
    panel = (config.device == "cpu" and dtype == torch.float32 and quant == "none" and not packed
             and config.decode_kernels != "torch" and config.panel_weights is not False)
    codes = panel and config.panel_codes
    opts = BuildOptions(quant, dtype, config.device, model_len, config.int4_group_size, packed=packed, panel=panel,
                        panel_codes=codes)
    with torch.inference_mode():
        model = build_architecture(cfg, checkpoint.tensors, opts).eval()
    _release_freed_memory()  # conversion transients go back to the OS before the KV pool is touched
    return BuiltModel(model=model, dtype=dtype, quant=quant, model_len=model_len, threads=threads,
                      tokenizer=Tokenizer(checkpoint.tokenizer_json, checkpoint.chat_template, cfg),
                      vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]), packed=packed,
                      panel=panel, panel_codes=codes)
