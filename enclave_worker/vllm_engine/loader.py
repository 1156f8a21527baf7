"""A vLLM model loader for our encrypted packages (`load_format="sealed-package"`).

vLLM builds the model and calls ``load_weights``; this loader takes the decrypted model from an
in-process hand-off (never a file, a tmpfs or a pipe), feeds each tensor to the model's own
``load_weights`` (which maps HF names onto vLLM's fused layouts), zeroes each plaintext view as
soon as vLLM has copied it, and zeroes the whole decrypted buffer at the end, also on failure.

The hand-off is keyed by a random token that travels in ``model_loader_extra_config``; the data
key and the plaintext never enter vLLM's configuration (which vLLM logs). The worker runs vLLM's
engine core in its own process (docs/vllm-backend.md), so the loader runs where the hand-off is.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator

import torch

from enclave_worker.engine.layers.packed import packing_available
from enclave_worker.package import DecryptedModel

from . import packed, weights

LOAD_FORMAT = "sealed-package"
HANDOFF_KEY = "sealed_handoff"
# In model_loader_extra_config: "packed" (default: oneDNN, packs the wipe reaches) or "torch"
# (torch's GEMM over the weights; no second copy of the LM head). Not secret: vLLM logs it.
CPU_LINEAR_KEY = "sealed_cpu_linear"

# The one seam between the worker and vLLM's loader registry (itself process-wide): tokens of
# models waiting to be loaded. Each is taken once; a second load with the same token fails.
_pending: dict[str, Callable[[], DecryptedModel]] = {}
_lock = threading.Lock()


class HandoffError(RuntimeError):
    """The loader was asked for a model nobody handed over (or one already taken)."""


def hand_off(source: Callable[[], DecryptedModel]) -> str:
    """Register `source` (returns the decrypted model; may decrypt when called) for one load."""
    token = secrets.token_hex(16)
    with _lock:
        _pending[token] = source
    return token


def withdraw(token: str) -> None:
    """Forget a hand-off that was not taken (the engine failed before loading)."""
    with _lock:
        _pending.pop(token, None)


def take(token: str) -> Callable[[], DecryptedModel]:
    with _lock:
        source = _pending.pop(token, None)
    if source is None:
        raise HandoffError("no sealed model was handed over under this token")
    return source


def wiping_tensors(model: DecryptedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in package order, quantized weights dequantized (weights.py); each view is zeroed
    once the consumer asks for the next, and the whole buffer when the iteration ends, however it ends."""
    return weights.dense_tensors(model)


def _plain_cpu_linear(layer: torch.nn.Module) -> None:
    # the GEMM reads layer.weight in place (cpu_linear: vLLM's hook on its layers, unknown to torch's types)
    layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]


def _cpu_linear_kind(module: torch.nn.Module) -> str:
    return type(getattr(module, "quant_method", None)).__name__


def keep_cpu_weights_in_place(model: torch.nn.Module) -> int:
    """On the CPU, vLLM re-packs each linear weight into a oneDNN handle (memory no tensor reaches)
    and frees the original without zeroing it; a wipe could then reach neither copy. So vLLM's
    post-processing leaves every linear layer (and the embedding used as LM head) on torch's GEMM
    over its own weight; `pack_cpu_weights` then packs them where the wipe reaches the pack.
    Returns the number of layers kept."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    kept = 0
    for module in model.modules():
        kind = _cpu_linear_kind(module)
        if kind == "UnquantizedLinearMethod":
            # A layer vLLM itself keeps unpacked (MLA's kv_b_proj) has its weight read directly:
            # it stays dense, never packed.
            module._sealed_pack = not getattr(module, "_cpu_skip_gemm_dispatch", False)  # type: ignore[assignment]
            module._cpu_skip_gemm_dispatch = True  # type: ignore[assignment]  # vLLM's switch: F.linear
            kept += 1
        elif kind == "UnquantizedEmbeddingMethod":
            module.quant_method.process_weights_after_loading = _plain_cpu_linear  # type: ignore[union-attr]
            kept += 1
    return kept


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype


def pack_cpu_weights(model: torch.nn.Module, loaded: list[torch.Tensor] | None = None) -> int:
    """After vLLM's post-processing: oneDNN's prepacked matmul for every layer kept in place, its
    pack a tensor the wipe zeroes (packed.py). Linear layers drop their dense weight (as vLLM's
    own dispatch does), zeroed at once and taken out of `loaded` (the loader's references to the
    loaded tensors) so that its memory is freed before the next pack is
    allocated: the allocator then reuses it (fresh pages cost a fault each, ~0.2 s per 540 MB on
    the dev VM) and the peak stays near 2x the weights. The LM head keeps its dense weight (tied,
    it is the embedding table the lookup reads). The input embedding is not packed: only its
    lookup runs. Returns the number of layers packed."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    count = 0
    for module in model.modules():
        if getattr(module, "_sealed_pack", False) and module.weight.ndim == 2:
            dense = packed.pack_linear(module, release_dense=True)
            if dense is not None and loaded is not None:
                loaded[:] = [t for t in loaded if not _same_view(t, dense)]
            del dense
            count += 1
        elif isinstance(module, ParallelLMHead) and getattr(module, "cpu_linear", None) is torch.nn.functional.linear:
            packed.pack_linear(module, release_dense=False)
            count += 1
    return count


def register() -> None:
    """Register the loader with vLLM (idempotent; vLLM imported only here)."""
    from vllm.model_executor import model_loader as registry
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if LOAD_FORMAT in registry._LOAD_FORMAT_TO_MODEL_LOADER:
        return

    @registry.register_model_loader(LOAD_FORMAT)
    class SealedPackageLoader(BaseModelLoader):  # type: ignore[misc]  # vLLM's class (not type-checked here)
        """Weights from a decrypted package held in this process's memory."""

        def download_model(self, model_config) -> None:  # type: ignore[no-untyped-def]
            pass  # nothing is ever fetched: the package is already here, encrypted

        def __init__(self, load_config) -> None:  # type: ignore[no-untyped-def]
            super().__init__(load_config)
            # The tensors load_weights filled: load_model zeroes any that post-processing replaced.
            self.loaded_tensors: list[torch.Tensor] = []

        def load_weights(self, model: torch.nn.Module, model_config) -> None:  # type: ignore[no-untyped-def]
            extra = self.load_config.model_loader_extra_config or {}
            decrypted = take(str(extra.get(HANDOFF_KEY, "")))()
            expected = {n for n, _ in model.named_parameters()}
            loaded = model.load_weights(wiping_tensors(decrypted))  # type: ignore[operator]  # vLLM's model
            missing = expected - set(loaded or expected)
            if missing:
                raise HandoffError(f"the package lacks {len(missing)} of the model's weights")
            keep_cpu_weights_in_place(model)
            self.loaded_tensors = [p.data for p in model.parameters()]

        def load_model(self, vllm_config, model_config, prefix: str = "") -> torch.nn.Module:  # type: ignore[no-untyped-def]
            """vLLM's load, then our packing (pack_cpu_weights), then: any weight that post-processing
            replaced (a re-layout, a copy, a dense weight now packed) is zeroed before it is freed,
            so no plaintext is left in freed memory."""
            model: torch.nn.Module = super().load_model(vllm_config, model_config, prefix)
            extra = self.load_config.model_loader_extra_config or {}
            if extra.get(CPU_LINEAR_KEY, "packed") == "packed" and packing_available():
                with torch.no_grad():
                    pack_cpu_weights(model, self.loaded_tensors)
            live = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
            with torch.no_grad():
                for tensor in self.loaded_tensors:
                    if tensor.untyped_storage().data_ptr() not in live:
                        tensor.zero_()
            self.loaded_tensors = []
            return model
