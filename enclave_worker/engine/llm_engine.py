"""LLMEngine: requests in, streamed deltas out; a background thread steps the batch."""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from .block_manager import BlockManager
from .checkpoint import Checkpoint
from .compute_thread import ComputeThread
from .config import EngineConfig, RequestOutput, SamplingParams
from .engine_thread import ThreadedEngine
from .errors import EngineError
from .kernels import triton_installed
from .kernels.cpu_ops import load_cpu_ops
from .kv_cache import KVCacheSpec, allocate_kv_cache
from .layers.packed import zero_every_byte
from .memory import ModelDoesNotFit, activation_reserve, device_memory, held_bytes, host_memory, kv_pool_bytes
from .model_builder import BuiltModel, build_model
from .model_runner import ModelRunner
from .models import model_tensors
from .output_processor import OutputProcessor
from .output_stream import Sink
from .scheduler import ScheduledSeq, Scheduler
from .sequence import Sequence
from .structured import GrammarCompiler

log = logging.getLogger(__name__)


def _fused_decode(config: EngineConfig) -> bool:
    """Whether decode steps take the fused Triton kernels (EngineConfig.decode_kernels)."""
    if config.decode_kernels == "torch":
        return False
    if config.decode_kernels == "triton":
        if not triton_installed():
            raise EngineError("decode_kernels='triton' needs the triton package")
        return True
    if torch.device(config.device).type == "cuda":  # "auto": Triton on CUDA, where it passed engine_checks.sh
        if triton_installed():
            return True
        log.warning("decode_kernels='auto' on CUDA without the triton package: decode takes the gather + SDPA "
                    "path, many times slower at small batches (docs/engine.md, 'The GPU path')")
    return False


def _cpu_kernels(built: BuiltModel) -> bool:
    """Whether CPU steps take the C++ kernels (kernels/cpu_ops.py: decode attention in place, fused
    norm / rotary / activation), as the kernel path says (kernel_path.py: dense fp32 and bf16 unless
    decode_kernels="torch"), from the build installed with the package (CpuKernelsUnavailable, one
    line, where it is missing or stale)."""
    if not built.kernel.cpu_kernels:
        return False
    load_cpu_ops()
    return True


def kv_pool_size(config: EngineConfig, built: BuiltModel, block_bytes: int) -> int:
    """The KV pool's bytes: from the utilisation fraction of the device's or the host's memory where the
    configuration names one (memory.py), else ``kv_cache_memory_bytes``. ModelDoesNotFit where the weights
    leave less than one block."""
    reserve = activation_reserve(config.max_num_batched_tokens, built.vocab_size, built.hidden_size)
    if torch.device(config.device).type == "cuda":
        if config.gpu_memory_utilization is None:
            return config.kv_cache_memory_bytes
        view, in_use = device_memory(config.device)  # everything in use on the device counts as held
        return kv_pool_bytes(view, config.gpu_memory_utilization, in_use, reserve, block_bytes)
    if config.cpu_memory_utilization is None:
        return config.kv_cache_memory_bytes
    return kv_pool_bytes(host_memory(), config.cpu_memory_utilization, held_bytes(model_tensors(built.model)),
                         reserve, block_bytes)


@dataclass
class _Request:
    seq: Sequence
    sink: Sink


class LLMEngine(ThreadedEngine[_Request]):
    thread_name = "llm-engine"

    def __init__(self, built: BuiltModel, config: EngineConfig, compute: ComputeThread | None = None) -> None:
        """Wire a built model to its KV pool, block manager, scheduler and runner (``compute``: the thread
        that built it, where the steps will run: ThreadedEngine)."""
        super().__init__(compute)
        self.config = config
        self.model = built.model
        cuda = torch.device(config.device).type == "cuda"
        spec = KVCacheSpec(
            len(self.model.layers), self.model.num_kv_heads, self.model.head_dim, config.block_size, built.dtype
        )
        num_blocks = spec.num_blocks(kv_pool_size(config, built, spec.bytes_per_block))
        if num_blocks < 1:
            raise ModelDoesNotFit(f"the KV memory budget of {config.kv_cache_memory_bytes} bytes is smaller than one "
                                  f"KV block ({spec.bytes_per_block} bytes)")
        self.max_model_len = min(built.model_len, num_blocks * config.block_size)
        # What the worker's status reports against its process's RSS (`sealed bench coldstart`).
        self.weights_held_bytes = held_bytes(model_tensors(self.model))
        self.kv_pool_bytes = num_blocks * spec.bytes_per_block
        self.blocks = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_num_batched_tokens)
        self.kernel_path = built.kernel  # which kernels run (kernel_path.py); named in the measured config
        fused = _fused_decode(config)
        cpu_kernels = _cpu_kernels(built)
        self.model.cpu_kernels = cpu_kernels
        graphs = fused and cuda and config.cuda_graphs is not False
        # With decode graphs, one extra block no sequence owns takes the padding rows' K/V writes.
        self.runner = ModelRunner(
            self.model,
            allocate_kv_cache(spec, num_blocks + int(graphs), config.device),
            config.block_size,
            config.device,
            built.threads,
            fused_decode=fused,
            max_model_len=self.max_model_len,
            cpu_kernel=cpu_kernels,
        )
        if graphs:
            self.runner.enable_decode_graphs(config.max_num_seqs, pad_slot=num_blocks * config.block_size)
        self.tokenizer = built.tokenizer
        self.vocab_size = built.vocab_size
        self.output = OutputProcessor(self.tokenizer)
        self.grammars = GrammarCompiler(self.tokenizer.to_json(), self.vocab_size, self.tokenizer.eos_token_ids)
        self._step_lock = threading.Lock()  # one step at a time (background thread or a direct caller)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, config: EngineConfig) -> LLMEngine:
        """Build the model from ``checkpoint`` (see ``build_model``: its tensors are consumed) and the
        engine around it, on the thread that will step it (compute_thread.py)."""
        compute = ComputeThread(cls.thread_name)
        try:
            engine = compute.call(lambda: cls(build_model(checkpoint, config), config, compute))
        except BaseException:
            compute.close()
            raise
        # An engine dropped without shutdown() ends its idle thread (and the OpenMP team that thread
        # holds) when it is collected; a running step loop keeps the engine alive until it returns.
        weakref.finalize(engine, compute.close)
        return engine

    def held_tensors(self) -> list[torch.Tensor]:
        """Every tensor the model holds (weights, scales, packed kernels' layouts, tables) plus the KV pool."""
        return [*model_tensors(self.model), self.runner.kv_cache]

    def wipe(self) -> None:
        """Zero every weight and the KV pool in place (key revocation): nothing of the model stays.

        Fused and quantized weights are copies outside any decrypted buffer, so wiping that buffer
        alone would leave them readable.
        """
        with self._step_lock, torch.inference_mode():
            for tensor in self.held_tensors():
                zero_every_byte(tensor)

    # ------------------------------------------------------------ requests

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sink: Sink,
        cache_salt: bytes = b"",
    ) -> None:
        """Queue a request; `sink` receives its outputs (from the stepping thread)."""
        prompt = list(prompt_token_ids)
        self.validate(request_id, prompt, params, cache_salt)
        gen = None
        if not params.greedy:
            gen = torch.Generator(device=self.config.device)
            gen.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt))
        # Built before queueing: a schema or grammar that cannot be enforced is this request's error.
        grammar = self.grammars.matcher(params.structured) if params.structured is not None else None

        def make(seq_id: int) -> _Request:
            seq = Sequence(seq_id, request_id, prompt, len(prompt), params, max_tokens, cache_salt, gen)
            seq.grammar = grammar
            self.scheduler.add(seq)
            return _Request(seq, sink)

        self._submit(request_id, make)

    def _release(self, req: _Request, reason: str) -> None:
        self.scheduler.finish(req.seq, reason)

    # ------------------------------------------------------------ stepping

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, and post-process; returns this step's outputs."""
        with self._step_lock:
            with self._cond:
                batch = self.scheduler.schedule()
                if not batch:
                    return []
                inputs = self.runner.prepare(batch)
            tokens, records = self.runner.execute(batch, *inputs)
            with self._cond:
                delivered = self._postprocess(batch, tokens, records)
        for sink, out in delivered:
            sink(out)
        return [out for _, out in delivered]

    def _postprocess(self, batch: list[ScheduledSeq], tokens: list[int], records: list[Any]
                     ) -> list[tuple[Sink, RequestOutput]]:
        delivered = []
        sampled = iter(zip(tokens, records, strict=True))
        for s in batch:
            tok, rec = next(sampled) if s.samples else (None, None)
            seq = s.seq
            req = self._requests.get(seq.request_id)
            if seq.is_finished or req is None:
                continue  # aborted while the step ran
            seq.num_computed_tokens += s.num_tokens
            self.blocks.commit(seq)
            if tok is None:
                continue
            reason = self.output.append(seq, tok, rec, self.tokenizer.eos_token_ids)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                del self._requests[seq.request_id]
            delivered.append((req.sink, self.output.emit(seq)))
        return delivered

    def stats(self) -> dict[str, Any]:
        with self._cond:
            b = self.blocks
            return {
                "num_running": len(self.scheduler.running),
                "num_waiting": len(self.scheduler.waiting),
                "kv_cache_usage_perc": 100.0 * b.usage(),
                "num_kv_blocks": b.num_blocks,
                "num_free_kv_blocks": b.num_free_blocks,
                "block_size": b.block_size,
                "max_model_len": self.max_model_len,
                "prefix_cache_hits": b.prefix_hits,
                "prefix_cache_queries": b.prefix_queries,
                "num_preemptions": self.scheduler.num_preemptions,
                "weights_held_bytes": self.weights_held_bytes,
                "kv_pool_bytes": self.kv_pool_bytes,
            }

    # ------------------------------------------------------------ the stepping thread's hooks

    def _has_work(self) -> bool:
        return self.scheduler.has_work()

    def _pace(self) -> None:
        with self._cond:
            progress = self.scheduler.running or self.blocks.num_free_blocks > 0
        if not progress:  # nothing can be scheduled right now; do not spin
            time.sleep(0.001)
