"""How the benchmarks start a peer (vLLM, llama.cpp): at its best documented configuration for this
machine, and the record of that configuration each result row carries.

- vLLM on the CPU: every CPU this process may use bound for compute, none reserved
  (`VLLM_CPU_OMP_THREADS_BIND=<those CPUs>`, `VLLM_CPU_NUM_OF_RESERVED_CPU=0`;
  enclave_worker/vllm_cpu_binding.py). vLLM's own default (`auto`) reserves one core for its
  frontend, which on a 2-vCPU machine leaves it one core to compute on (issue 38: 72-75 vs 118.5-118.7
  output tok/s). `--vllm-cpu-bind auto` (optionally with `--vllm-reserved-cpus N`) or a CPU list
  runs another configuration, for one that measures faster; the row then says which.
- llama.cpp: as many threads (generation and batch) as this process has CPUs.

Pure functions: nothing here starts a peer.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from enclave_worker.vllm_cpu_binding import (
    ALL,
    BIND_ENV,
    RESERVED_ENV,
    CpuBindingError,
    VllmCpuBinding,
    allowed_cpus,
    format_cpu_list,
)


@dataclass(frozen=True)
class PeerConfig:
    """What a result row records about the peer it measured."""

    peer: str
    dtype: str
    threads: int | None  # compute threads; None where the peer chooses (vLLM's auto binding)
    binding: str  # the CPUs it computes on, or who chose them
    label: str  # in words, for the docs' tables
    env: Mapping[str, str] = field(default_factory=dict)  # the variables set for the peer

    def record(self) -> dict[str, Any]:
        return {"peer": self.peer, "dtype": self.dtype, "threads": self.threads, "binding": self.binding,
                "label": self.label, "env": dict(self.env)}


def add_peer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm-cpu-bind", default=ALL, metavar="all|auto|CPUS",
                        help="the CPUs vLLM computes on: all (default: every CPU this process may use, none "
                             "reserved), auto (vLLM's default binding) or a list like 0-3")
    parser.add_argument("--vllm-reserved-cpus", type=int, default=None, metavar="N",
                        help="with --vllm-cpu-bind auto: VLLM_CPU_NUM_OF_RESERVED_CPU (default: vLLM's)")


def vllm_binding(args: argparse.Namespace, parser: argparse.ArgumentParser) -> VllmCpuBinding:
    """The binding the options name; a bad one (malformed, or naming a CPU this process may not
    use) is a usage error."""
    try:
        binding = VllmCpuBinding(args.vllm_cpu_bind, args.vllm_reserved_cpus)
        binding.cpus(allowed_cpus())
    except CpuBindingError as exc:
        parser.error(str(exc))
    return binding


def vllm_peer(binding: VllmCpuBinding, allowed: Iterable[int], dtype: str, peer: str = "vllm") -> PeerConfig:
    """vLLM's configuration under `binding` on the CPUs `allowed` (raises CpuBindingError for a list
    that names a CPU outside them)."""
    allowed = tuple(allowed)
    cpus = binding.cpus(allowed)
    return PeerConfig(peer=peer, dtype=dtype, threads=None if cpus is None else len(cpus),
                      binding="vllm auto" if cpus is None else format_cpu_list(cpus),
                      label=binding.label(), env=binding.env(allowed))


def peer_env(base: Mapping[str, str], config: PeerConfig) -> dict[str, str]:
    """`base` (this process's environment) with the peer's variables set, and an inherited vLLM
    binding variable the peer's configuration does not set removed (it would change the peer)."""
    env = {k: v for k, v in base.items() if k not in (BIND_ENV, RESERVED_ENV)}
    env.update(config.env)
    return env


def llama_cpp_peer(allowed: Iterable[int], dtype: str, threads: int | None = None) -> PeerConfig:
    """llama.cpp with every CPU this process may use as a thread (generation and batch), unless
    `threads` is given."""
    allowed = tuple(allowed)
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, not {threads}")
    n = threads or len(allowed)
    label = "all threads" if n == len(allowed) else f"{n} threads of {len(allowed)} CPUs"
    return PeerConfig(peer="llama.cpp", dtype=dtype, threads=n, binding="unbound (OS scheduler)", label=label)
