"""Which kernels an engine runs: one path per device, dtype and CPU class, decided from the CPU's
features and the configuration, never by timing (docs/engine.md, "Kernel paths").

Two workers with the same configuration on CPUs of the same class run the same kernels on the same
thread count, so they give the same logits; the path's name is part of the worker's measured
configuration (``WorkerSettings.measured_config``), so a relying party sees which kernels it accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# What the linear kernels depend on: ATen's vector width and whether oneDNN runs bf16 natively.
CPU_CLASSES = ("x86-avx512-bf16", "x86-avx512", "x86-avx2", "generic")
QUANTIZED = ("int8", "int4", "fp8")


def detect_cpu_class() -> str:
    """This machine's class: ATen's CPU capability (the vector code it dispatches to) and, on AVX-512,
    whether oneDNN has bf16 on this CPU (AVX512-BF16 / AMX; what the packed bf16 layers need)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        bf16 = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        return "x86-avx512-bf16" if bf16 else "x86-avx512"
    return "x86-avx2" if capability == "AVX2" else "generic"


@dataclass(frozen=True)
class KernelPath:
    """The engine's kernels for one configuration on one class of machine.

    ``linear``: how dense layers multiply: "panels" (fp32 in column panels for the C++ kernel, held as
    exact block codes where a layer lies on a GGUF block grid: the same floats, layers/panel.py and
    layers/coded_panel.py), "onednn-packed" (layers/packed.py), "torch" (``F.linear``), "q8-blocks"
    (int8 on the CPU: int8 weights in blocks of 32 times activations quantized per block, one C++
    kernel, layers/q8_blocks.py), or torch's quantized kernel ("int8" on a GPU, "int4", "fp8").
    ``cpu_kernels``: CPU steps through kernels/cpu_ops.py.
    """

    device: str  # "cpu" | "cuda"
    cpu_class: str | None  # None on a GPU
    dtype: str  # EngineConfig.dtype
    linear: str
    cpu_kernels: bool

    @property
    def name(self) -> str:
        """E.g. "cpu/x86-avx512-bf16/float32/panels+cpp", "cuda/bfloat16/torch"."""
        where = self.device if self.cpu_class is None else f"{self.device}/{self.cpu_class}"
        return f"{where}/{self.dtype}/{self.linear}{'+cpp' if self.cpu_kernels else ''}"


def choose_kernel_path(device: str, dtype: str, decode_kernels: str, cpu_class: str | None) -> KernelPath:
    """The rule (docs/engine.md, "Kernel paths", has the measurements it rests on):

    - a GPU: torch's kernels, or the quantized dtype's kernel;
    - int8 on the CPU: the int8 x int8 block kernel ("q8-blocks", kernels/cpu_q8.cpp; its vector
      code is the build's -march tier: AVX-512 VNNI, AVX2 or scalar);
    - int4 / FP8 on the CPU: torch's int4 / FP8 ops;
    - ``decode_kernels="torch"``: torch's ops throughout (the reference path, no C++ kernels);
    - fp32 on the CPU: column panels for the C++ kernel, exact block codes where a layer allows; a
      prefill-sized call through the kernel on the AVX-512 classes, through torch's GEMM on the
      layer unpacked for the call elsewhere (layers/panel.py, ``gemm_min_rows``: the build's width);
    - bf16 on a CPU where oneDNN runs bf16 (class x86-avx512-bf16): oneDNN's packed layout;
    - anything else (bf16 without it, fp16): torch's ``F.linear``.
    """
    kind = torch.device(device).type
    if kind != "cpu":
        return KernelPath(kind, None, dtype, dtype if dtype in QUANTIZED else "torch", False)
    if cpu_class not in CPU_CLASSES:
        raise ValueError(f"cpu_class must be one of {CPU_CLASSES}, not {cpu_class!r}")
    if dtype == "int8":
        return KernelPath("cpu", cpu_class, dtype, "q8-blocks", False)
    if dtype in QUANTIZED:
        return KernelPath("cpu", cpu_class, dtype, dtype, False)
    if decode_kernels == "torch":
        return KernelPath("cpu", cpu_class, dtype, "torch", False)
    cpp = dtype in ("float32", "bfloat16")
    if dtype == "float32":
        return KernelPath("cpu", cpu_class, dtype, "panels", cpp)
    if dtype == "bfloat16" and cpu_class == "x86-avx512-bf16":
        return KernelPath("cpu", cpu_class, dtype, "onednn-packed", cpp)
    return KernelPath("cpu", cpu_class, dtype, "torch", cpp)
