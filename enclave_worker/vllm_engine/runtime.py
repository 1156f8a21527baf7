"""vLLM's engine in this process, built from a decrypted package: configuration, weights, KV cache.

vLLM reads a model's architecture from a directory holding ``config.json``. We write exactly that
file (the architecture's shape: layer counts, sizes, rope settings; no weights, no tokenizer, no
chat template) into a private temporary directory, and remove it once vLLM has read it. vLLM
never gets a tokenizer (``skip_tokenizer_init``): the worker tokenizes and detokenizes itself.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from enclave_worker import vllm_cpu_binding as binding
from enclave_worker.engine.errors import InvalidRequestError
from enclave_worker.engine.tokenizer import Tokenizer
from enclave_worker.package import DecryptedModel
from protocol.sampling import StructuredOutput

from . import loader, log_redaction, packed, structured, weights

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VllmOptions:
    dtype: str = "float32"
    max_model_len: int = 2048
    max_num_seqs: int = 16
    kv_cache_memory_bytes: int = 256 << 20  # CPU: vLLM's KV cache space
    device: str = "cpu"
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = True  # CPU: no graph capture or compilation
    cpu_linear: str = "packed"  # CPU: oneDNN over packs the wipe reaches, or "torch" GEMM (loader.py)
    # CPU: the CPUs vLLM computes on (binding.py): every CPU this process may use, none reserved for
    # a frontend (vLLM's own default, `auto`, kept one of two vCPUs idle for one in another process).
    cpu_binding: binding.VllmCpuBinding = field(default_factory=binding.VllmCpuBinding)
    seed: int = 0


def architecture_config(config: dict[str, Any]) -> dict[str, Any]:
    """The HF config vLLM needs, without our private keys (those beginning with '_') and without the
    checkpoint's quantization: the loader hands vLLM dense weights (weights.py)."""
    return {k: v for k, v in config.items() if not k.startswith("_") and k != weights.CHECKPOINT_QUANTIZATION_KEY}


def _quiet_vllm_logging() -> None:
    # vLLM logs its whole configuration and per-request lines at INFO; keep warnings only.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core stays in this process
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # no usage reports leave the enclave
    os.environ.setdefault("DO_NOT_TRACK", "1")
    log_redaction.install()  # vLLM's few lines that quote token ids are kept without them


class VllmRuntime:
    """vLLM's LLMEngine (engine core in-process) serving one decrypted model."""

    def __init__(self, config: dict[str, Any], source: Callable[[], DecryptedModel], options: VllmOptions) -> None:
        _quiet_vllm_logging()
        self.cpu_env: dict[str, str] = {}
        if options.device == "cpu":
            self.cpu_env = binding.apply(options.cpu_binding)  # read by vLLM when it builds its CPU worker
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import EngineArgs
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.llm_engine import LLMEngine

        loader.register()
        token = loader.hand_off(source)
        model_dir = Path(tempfile.mkdtemp(prefix="sealed-vllm-config-"))  # 0700
        try:
            (model_dir / "config.json").write_text(json.dumps(architecture_config(config)))
            on_cpu = options.device == "cpu"
            args = EngineArgs(
                model=str(model_dir), skip_tokenizer_init=True, load_format=loader.LOAD_FORMAT,
                structured_outputs_config=StructuredOutputsConfig(backend=structured.BACKEND),
                model_loader_extra_config={loader.HANDOFF_KEY: token, loader.CPU_LINEAR_KEY: options.cpu_linear},
                dtype=options.dtype,
                max_model_len=options.max_model_len, max_num_seqs=options.max_num_seqs,
                enforce_eager=options.enforce_eager, enable_prefix_caching=True, seed=options.seed,
                disable_log_stats=False,
                **({"kv_cache_memory_bytes": options.kv_cache_memory_bytes} if on_cpu
                   else {"gpu_memory_utilization": options.gpu_memory_utilization}))
            self.llm = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
        finally:
            loader.withdraw(token)  # taken by the loader; withdrawn here if vLLM failed earlier
            shutil.rmtree(model_dir, ignore_errors=True)
        cache = self.llm.vllm_config.cache_config
        self.block_size = int(cache.block_size)
        self.max_model_len = int(self.llm.model_config.max_model_len)
        self.num_blocks = int(cache.num_gpu_blocks or 0)
        self.stepping_cpus = _worker_cpus(self.llm.vllm_config)
        # What vLLM's add_request raises for one bad request (the others keep going).
        self.request_errors: tuple[type[BaseException], ...] = (ValueError, TypeError, VLLMClientError)
        self._grammar_executor: Any = None

    def enable_structured(self, tokenizer: Tokenizer) -> None:
        """vLLM's structured outputs, with a tokenizer made in memory (structured.py)."""
        self._hf_tokenizer, self._grammar_executor = structured.install(self.llm, tokenizer)

    def check_structured(self, spec: StructuredOutput) -> None:
        """vLLM's own validation of the constraint (its SamplingParams.verify, then the grammar
        against the model's tokens), in the caller's thread: a refusal is this request's 400."""
        import llguidance
        from vllm import SamplingParams as VSamplingParams
        from vllm.v1.structured_output.backend_guidance import serialize_guidance_grammar
        from vllm.v1.structured_output.request import get_structured_output_key

        llm = self.llm
        refusals: tuple[type[BaseException], ...] = (*self.request_errors, KeyError)
        try:
            params = VSamplingParams(max_tokens=1, structured_outputs=structured.vllm_structured(spec))
            params.verify(llm.model_config, None, llm.vllm_config.structured_outputs_config, self._hf_tokenizer)
            kind, grammar = get_structured_output_key(params.structured_outputs)
            error = llguidance.LLMatcher.validate_grammar(serialize_guidance_grammar(kind, grammar),
                                                          self._manager().backend.ll_tokenizer)
        except refusals as exc:
            raise InvalidRequestError(f"the {spec.kind} is not valid: {str(exc)[:200]}") from None
        if error:
            raise InvalidRequestError(f"the {spec.kind} cannot be enforced: {error[:200]}")

    def _manager(self) -> Any:
        return self.llm.engine_core.engine_core.structured_output_manager

    def bind_stepping_thread(self) -> None:
        """Run by the thread that steps vLLM, before its first step: the threading `vllm serve`
        gives its CPU worker process (that many torch threads, pinned to those CPUs), here for one
        thread. Left alone, the thread used torch's default (every core, unpinned) and shared the
        cores with the worker's gRPC and asyncio threads: docs/vllm-backend.md, "Threads"."""
        if not self.stepping_cpus:
            return
        try:
            os.sched_setaffinity(0, self.stepping_cpus)  # 0: the calling thread only (Linux)
        except OSError as exc:  # a CPU set the process may not use: unpinned, still one team
            log.warning("cannot pin the vLLM stepping thread to CPUs %s: %s", self.stepping_cpus, exc)
        # torch keeps the count per thread; vLLM's CPU worker replaced torch.set_num_threads
        # with a no-op that warns, so its implementation is called directly.
        torch._C.set_num_threads(len(self.stepping_cpus))

    def _model_runner(self) -> Any:
        executor = self.llm.model_executor
        worker = executor.driver_worker
        return getattr(worker, "worker", worker).model_runner

    def kv_cache_tensors(self) -> list[torch.Tensor]:
        if not hasattr(self, "llm"):
            return []
        return _flatten(getattr(self._model_runner(), "kv_caches", []))

    def held_tensors(self) -> list[torch.Tensor]:
        """Every parameter and buffer of vLLM's model, the packed weights (packed.py) and the KV
        cache tensors (none once closed)."""
        if not hasattr(self, "llm"):
            return []
        model = self._model_runner().get_model()
        return [*model.parameters(), *model.buffers(), *packed.packed_tensors(model), *self.kv_cache_tensors()]

    def wipe(self) -> None:
        """Zero the weights and the KV cache in place; `close` then drops vLLM and frees them (the
        worker's revocation runs the engine's shutdown right after the wipe)."""
        with torch.inference_mode():
            for tensor in self.held_tensors():
                packed.zero_every_byte(tensor)

    def kv_stats(self) -> dict[str, float]:
        """KV cache figures under the names our engine reports (the gateway routes on them)."""
        stats: dict[str, float] = {"num_kv_blocks": self.num_blocks}
        core = getattr(getattr(getattr(self, "llm", None), "engine_core", None), "engine_core", None)
        manager = getattr(getattr(core, "scheduler", None), "kv_cache_manager", None)
        if manager is not None:
            stats["kv_cache_usage_perc"] = 100.0 * float(manager.usage)
        return stats

    def metrics(self) -> dict[str, float]:
        """vLLM's own metrics under their vLLM names (``vllm:...``), label sets summed: counters
        and gauges as their value, histograms as ``_count`` and ``_sum``. The worker sends them
        in its heartbeat's stats; the gateway exports them (api/gateway/metrics.py)."""
        from vllm.v1.metrics.reader import Counter, Gauge, Histogram

        llm = getattr(self, "llm", None)
        if llm is None:
            return {}
        out: dict[str, float] = {}
        for metric in llm.get_metrics():
            if isinstance(metric, (Counter, Gauge)):
                out[metric.name] = out.get(metric.name, 0.0) + float(metric.value)
            elif isinstance(metric, Histogram):
                out[metric.name + "_count"] = out.get(metric.name + "_count", 0.0) + float(metric.count)
                out[metric.name + "_sum"] = out.get(metric.name + "_sum", 0.0) + float(metric.sum)
        return out

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        if self._grammar_executor is not None:
            self._grammar_executor.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(Exception):
            llm.engine_core.shutdown()
        del llm
        gc.collect()


def _worker_cpus(vllm_config: Any) -> list[int]:
    """The CPUs vLLM pins its CPU worker process to (`VLLM_CPU_OMP_THREADS_BIND`, which the runtime
    sets from VllmOptions.cpu_binding: by default every CPU this process may use; under `auto`,
    the first NUMA node's cores less those vLLM keeps for its own frontend; none under `nobind`, or
    off the CPU)."""
    from vllm.platforms import current_platform
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    if not current_platform.is_cpu():
        return []
    lists = getattr(OMPProcessManager(vllm_config), "cpu_lists", [])
    return [int(c) for c in lists[0]] if lists and lists[0] else []


def _flatten(items: Any) -> list[Any]:
    if isinstance(items, torch.Tensor):
        return [items]
    if isinstance(items, (list, tuple)):
        return [t for item in items for t in _flatten(item)]
    if isinstance(items, dict):
        return [t for item in items.values() for t in _flatten(item)]
    return []
