"""How much memory the engine may take, and whether a model fits in it.

vLLM's ``--gpu-memory-utilization``, for the CPU too: the worker may use a fraction of the memory it
can have (the device's on a GPU; on the CPU, what the machine or its cgroup leaves it); the weights as
held and an activation reserve come off, and the KV pool takes the rest. Only physical memory counts:
``MemAvailable`` and a cgroup's limit exclude swap, so a pool sized here never needs to swap (and
plaintext weights paged out would reach the guest's swap device, a disk). A model that cannot fit is
refused with one line (``ModelDoesNotFit``) that says what it needs and what there is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import EngineError

GiB = float(1 << 30)
ALLOCATOR_SLACK = 256 << 20  # allocator fragmentation and the runtime's own buffers
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a huge page-aligned number


class ModelDoesNotFit(EngineError):
    """The weights as held, the activation reserve and at least one KV block exceed the memory this
    worker may use; the message is one line with both sides."""


@dataclass(frozen=True)
class MemoryView:
    """Memory this process may still take without swapping (``available``), what the engine already
    holds of it (``held``: its weights, when asked after the build), and where the figure came from."""

    available: int
    source: str  # "MemAvailable", "cgroup v2 limit", "cgroup v1 limit" or the CUDA device

    def usable(self, utilization: float, held: int) -> int:
        """Bytes the engine may hold in all at ``utilization`` of what it holds plus what it can get."""
        return int((self.available + held) * utilization)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if not text.isdigit() else int(text)


def _stat_field(path: Path, name: str) -> int:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _meminfo_available(proc: Path) -> int:
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError as exc:
        raise EngineError(f"cannot read {proc / 'meminfo'}: {exc.strerror}") from exc
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise EngineError(f"{proc / 'meminfo'} has no MemAvailable line")


def _cgroup_available(proc: Path, root: Path) -> tuple[int, str] | None:
    """The process's cgroup limit less its working set (usage without reclaimable file pages)."""
    try:
        entries = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for entry in entries:
        hierarchy, controllers, path = entry.split(":", 2)
        rel = path.lstrip("/")
        if hierarchy == "0" and controllers == "":  # v2: one unified hierarchy
            base = root / rel
            limit, usage = _read_int(base / "memory.max"), _read_int(base / "memory.current")
            if limit is not None and usage is not None:
                return limit - (usage - _stat_field(base / "memory.stat", "inactive_file")), "cgroup v2 limit"
        elif "memory" in controllers.split(","):
            # Inside a container the process's own group is mounted at the controller's root.
            for base in (root / "memory" / rel, root / "memory"):
                limit = _read_int(base / "memory.limit_in_bytes")
                usage = _read_int(base / "memory.usage_in_bytes")
                if limit is not None and usage is not None and limit < _NO_LIMIT:
                    working = usage - _stat_field(base / "memory.stat", "total_inactive_file")
                    return limit - working, "cgroup v1 limit"
    return None


def host_memory(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> MemoryView:
    """What this process may still take of the machine's RAM: ``MemAvailable``, or less where its
    cgroup's limit leaves less. Swap is never counted."""
    available, source = _meminfo_available(proc), "MemAvailable"
    limited = _cgroup_available(proc, cgroup_root)
    if limited is not None and limited[0] < available:
        available, source = limited
    return MemoryView(max(0, available), source)


MemInfo = Callable[[], tuple[int, int]]  # (free, total) bytes, as torch.cuda.mem_get_info


def device_memory(device: str, mem_get_info: MemInfo | None = None) -> tuple[MemoryView, int]:
    """(what the device has free, how much of it is in use already) for a CUDA device."""
    free, total = (mem_get_info or (lambda: torch.cuda.mem_get_info(torch.device(device))))()
    return MemoryView(free, device), total - free


def activation_reserve(max_num_batched_tokens: int, vocab_size: int, hidden_size: int) -> int:
    """The largest step's logits (fp32) and hidden states, plus allocator slack."""
    return max_num_batched_tokens * (vocab_size + 8 * hidden_size) * 4 + ALLOCATOR_SLACK


def kv_pool_bytes(view: MemoryView, utilization: float, held: int, reserve: int, block_bytes: int) -> int:
    """The KV pool's bytes: ``utilization`` of (what is held + what is available), less what is held
    and the reserve. Raises ModelDoesNotFit where that is not even one block."""
    if not 0 < utilization <= 1:
        raise ValueError("memory utilization must be in (0, 1]")
    usable = view.usable(utilization, held)
    budget = usable - held - reserve
    if budget < block_bytes:
        raise ModelDoesNotFit(
            f"model does not fit: weights as held {held / GiB:.2f} GiB + activations {reserve / GiB:.2f} GiB "
            f"+ one KV block leave no KV pool in {usable / GiB:.2f} GiB ({utilization:g} of "
            f"{(view.available + held) / GiB:.2f} GiB, {view.source})")
    return budget


def check_fits(need: int, what: str, view: MemoryView, utilization: float, in_use: int = 0) -> None:
    """Refuse, before a model is decrypted, what needs more than ``utilization`` of ``view`` (``in_use``:
    what the device already holds, counted against the fraction as vLLM does)."""
    usable = view.usable(utilization, in_use) - in_use
    if need > usable:
        raise ModelDoesNotFit(f"model does not fit: {what} need at least {need / GiB:.2f} GiB; this worker may "
                              f"use {max(0, usable) / GiB:.2f} GiB ({utilization:g} of "
                              f"{(view.available + in_use) / GiB:.2f} GiB, {view.source})")


def held_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes the tensors hold, each allocation once (views of one decrypted buffer share it), oneDNN-packed
    (MKLDNN) ones included."""
    storages: dict[int, int] = {}
    for tensor in tensors:
        if tensor.is_mkldnn:
            storages[int(torch.ops.mkldnn.data_ptr(tensor))] = int(torch.ops.mkldnn._nbytes(tensor))
        elif tensor.numel():
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())
