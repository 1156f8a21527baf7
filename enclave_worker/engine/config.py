"""Frozen configuration and request dataclasses of the engine's public API."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.sampling import SamplingParams as SamplingParams  # the one contract, re-exported

from .kernel_path import CPU_CLASSES

DTYPES = ("float32", "bfloat16", "float16", "int8", "int4", "fp8")
DECODE_KERNELS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class EngineConfig:
    device: str = "cpu"
    dtype: str = "float32"  # float32 | bfloat16 | float16 | int8 | int4 | fp8 (weight-only quantized)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # default: min(model context, 4096)
    block_size: int = 16
    kv_cache_memory_bytes: int = 512 * 1024 * 1024
    # On CUDA: size the KV pool from the device's memory instead (this fraction of it for the
    # whole worker, less the weights and an activation reserve); None keeps kv_cache_memory_bytes.
    gpu_memory_utilization: float | None = None
    # On the CPU: size the KV pool from this fraction of the memory the machine (or the process's cgroup)
    # leaves the engine plus the weights it holds, less the weights and the activation reserve; swap never
    # counts (memory.py). None keeps kv_cache_memory_bytes.
    cpu_memory_utilization: float | None = None
    enable_prefix_caching: bool = True
    num_threads: int | None = None  # torch intra-op threads on CPU, fixed for the engine; default: all cores
    int4_group_size: int = 32
    # Decode steps: "auto" takes the fused Triton kernels (paged attention in place, fused
    # norm/rope/activation) on CUDA where Triton is installed, and the C++ kernels on the CPU;
    # "triton" asks for the Triton kernels anywhere (the CPU runs them only under TRITON_INTERPRET, for
    # tests); "torch" keeps the gather + SDPA path and torch's F.linear everywhere (docs/engine.md,
    # "The GPU path", says why Triton is the CUDA default).
    decode_kernels: str = "auto"
    # Replay captured decode steps on CUDA (needs the Triton kernels). None: on wherever they run on CUDA.
    cuda_graphs: bool | None = None
    # The CPU class this configuration is for (kernel_path.CPU_CLASSES); None: this machine's. The
    # kernels follow from the device, the dtype, decode_kernels and the class alone (kernel_path.py:
    # fp32 in column panels for the C++ kernel, bf16 oneDNN-packed on x86-avx512-bf16, torch's
    # F.linear otherwise); a named class the machine is not of refuses the build.
    cpu_class: str | None = None
    # Panel layers whose fp32 weights lie exactly on a per-block grid (a GGUF Q4_1 / Q8_0 checkpoint,
    # dequantized when loaded) are held as int8 codes with a scale and offset per 32 weights: 1.25
    # bytes a weight instead of 4, every weight rebuilt to the same float before the same FMAs, so
    # the results are the fp32 panels' to the bit (layers/coded_panel.py). False: fp32 panels always.
    panel_codes: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.block_size < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and block_size must be >= 1")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.cpu_memory_utilization is not None and not 0 < self.cpu_memory_utilization <= 1:
            raise ValueError("cpu_memory_utilization must be in (0, 1]")
        if self.decode_kernels not in DECODE_KERNELS:
            raise ValueError(f"decode_kernels must be one of {DECODE_KERNELS}, not {self.decode_kernels!r}")
        if self.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes must be positive")
        if self.cpu_class is not None and self.cpu_class not in CPU_CLASSES:
            raise ValueError(f"cpu_class must be one of {CPU_CLASSES} or None, not {self.cpu_class!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("num_threads must be >= 1 (None: all cores)")


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob) alternatives, best first


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    delta_text: str
    delta_token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    prompt_tokens: int
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None = None
    # time.monotonic() when the scheduler first gave the request a batch slot (the end of its wait in
    # the queue); None where the engine does not say (vLLM). Read only for traces (docs/tracing.md).
    scheduled_at: float | None = None

    def merged(self, later: RequestOutput) -> RequestOutput:
        """This delta followed by ``later`` (of the same request) as one delta."""
        logprobs = None if self.logprobs is None and later.logprobs is None else (
            (self.logprobs or ()) + (later.logprobs or ()))
        return RequestOutput(self.request_id, self.delta_text + later.delta_text,
                             self.delta_token_ids + later.delta_token_ids, later.finished, later.finish_reason,
                             later.prompt_tokens, later.completion_tokens, logprobs,
                             self.scheduled_at if self.scheduled_at is not None else later.scheduled_at)
