"""Which CPUs vLLM computes on: the environment its CPU backend reads for its OpenMP threads.

vLLM 0.32 (vllm/utils/ompmultiprocessing.py) binds its CPU worker's OpenMP threads to
``VLLM_CPU_OMP_THREADS_BIND``: ``auto`` (its default) takes the first NUMA node's cores, one logical
CPU per physical core, and then keeps ``VLLM_CPU_NUM_OF_RESERVED_CPU`` of them (default: one per
local rank on x86) out of the list for its frontend; ``nobind`` binds nothing; a CPU list ("0-3,6")
binds exactly those CPUs and reserves none (the reserved count applies to ``auto`` only). On a
2-vCPU machine ``auto`` therefore computes on one core: 72-75 output tok/s under `vllm bench serve`
against 118.5-118.7 with both cores bound (issue 38). So a binding here is one of:

- ``all`` (the default): every CPU this process may run on (``os.sched_getaffinity``), no reserved
  core - the CPUs named explicitly, so vLLM reserves none;
- ``auto``: vLLM's own default (optionally with a reserved-CPU count);
- a CPU list ("0-1", "0,2-3"): exactly those CPUs, each one this process may run on.

Pure functions of the binding and the allowed CPUs; nothing here starts vLLM or reads its modules.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
ALL = "all"
AUTO = "auto"


class CpuBindingError(ValueError):
    """A CPU binding that cannot be honoured: a malformed list, a CPU this process may not use, or
    a reserved count beside an explicit list (vLLM would ignore it)."""


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (its affinity mask, not the machine's CPU count)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-3,6' -> (0, 1, 2, 3, 6): sorted, each CPU once; a malformed or empty list is refused."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise CpuBindingError(f"not a CPU list: {text!r} (e.g. '0-3' or '0,2-3')") from None
        if first < 0 or last < first:
            raise CpuBindingError(f"not a CPU range: {part.strip()!r} in {text!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 5, 7, 8) -> '0-2,5,7-8': the form vLLM's parser reads."""
    ordered = sorted(set(cpus))
    if not ordered:
        raise CpuBindingError("no CPUs to bind")
    runs: list[list[int]] = []
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True)
class VllmCpuBinding:
    """How vLLM's CPU worker binds its compute threads (see the module docstring)."""

    bind: str = ALL  # all | auto | a CPU list
    reserved: int | None = None  # with auto only: vLLM's VLLM_CPU_NUM_OF_RESERVED_CPU (None: its default)

    def __post_init__(self) -> None:
        if self.bind not in (ALL, AUTO):
            parse_cpu_list(self.bind)
        if self.reserved is not None:
            if self.bind != AUTO:
                raise CpuBindingError(f"a reserved-CPU count applies to vLLM's 'auto' binding only, not {self.bind!r}")
            if self.reserved < 0:
                raise CpuBindingError(f"reserved CPUs must be >= 0, not {self.reserved}")

    def cpus(self, allowed: Iterable[int]) -> tuple[int, ...] | None:
        """The CPUs vLLM will compute on, or None where vLLM chooses (auto)."""
        allowed_set = set(allowed)
        if self.bind == AUTO:
            return None
        if self.bind == ALL:
            if not allowed_set:
                raise CpuBindingError("this process may run on no CPU")
            return tuple(sorted(allowed_set))
        cpus = parse_cpu_list(self.bind)
        outside = sorted(set(cpus) - allowed_set)
        if outside:
            raise CpuBindingError(f"CPUs {format_cpu_list(outside)} of {self.bind!r} are not ones this process may "
                                  f"use ({format_cpu_list(allowed_set) if allowed_set else 'none'})")
        return cpus

    def env(self, allowed: Iterable[int]) -> dict[str, str]:
        """The variables vLLM reads, set for this binding (set them all: an inherited value of
        either would otherwise change what vLLM does)."""
        cpus = self.cpus(allowed)
        if cpus is None:
            return {BIND_ENV: AUTO, **({RESERVED_ENV: str(self.reserved)} if self.reserved is not None else {})}
        return {BIND_ENV: format_cpu_list(cpus), RESERVED_ENV: "0"}

    def label(self) -> str:
        if self.bind == ALL:
            return "all cores bound for compute, none reserved"
        if self.bind == AUTO:
            reserved = "vLLM's default reserved CPUs" if self.reserved is None else f"{self.reserved} reserved"
            return f"vLLM default binding (auto, {reserved})"
        return f"CPUs {self.bind} bound for compute, none reserved"


def apply(binding: VllmCpuBinding, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the binding's variables in `environ` (default: this process's) before vLLM reads them;
    an inherited reserved count is dropped where the binding sets none. Returns what was set."""
    target = os.environ if environ is None else environ
    values = binding.env(allowed_cpus())
    target.pop(RESERVED_ENV, None)
    target.update(values)
    return values
