"""The worker's vLLM engine from its settings and the decrypted package."""

from __future__ import annotations

from enclave_worker.engine.tokenizer import Tokenizer
from enclave_worker.package import DecryptedModel
from enclave_worker.settings import WorkerSettings

from .engine import VllmEngine
from .runtime import VllmOptions, VllmRuntime


def build_vllm_engine(settings: WorkerSettings, model: DecryptedModel) -> VllmEngine:
    """vLLM loads the weights from `model` through the sealed loader, which zeroes the decrypted
    buffer once they are in vLLM's own tensors (the buffer is then no second copy)."""
    config = model.metadata["config"]
    tokenizer = Tokenizer(model.metadata["tokenizer_json"], model.metadata.get("chat_template"), config)
    options = VllmOptions(dtype=settings.dtype, max_model_len=settings.max_model_len,
                          max_num_seqs=settings.max_num_seqs, kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
                          device=settings.device, gpu_memory_utilization=settings.gpu_memory_utilization,
                          cpu_binding=settings.vllm_cpu_binding)
    return VllmEngine.on_compute_thread(lambda: VllmRuntime(config, lambda: model, options), tokenizer)
