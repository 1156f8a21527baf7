"""CPU threads: an engine computes on a fixed count (EngineConfig.num_threads, default every CPU this
process may use), set once on its compute thread (compute_thread.py) and never tuned while serving:
the count is part of what decides a step's numerics (torch's GEMM splits its work by it), so two
engines with the same configuration on the same machine compute alike, whatever the machine's load
(docs/engine.md, "Kernel paths")."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def single_threaded_caller() -> None:
    """Run the calling thread's own torch ops on one thread, so that only the engine's compute thread
    (compute_thread.py) ever starts an OpenMP team. Call it first thing in a process that hosts an
    engine, from the thread that will not step it (the event loop's).

    Each thread that runs a parallel torch op keeps an OpenMP team; once libgomp manages more threads
    than there are CPUs it stops spinning between parallel regions, and every one of a step's ~600
    regions then waits for a woken thread (the cost measured: docs/benchmarks-history.md, "Figures
    moved from engine docstrings").
    """
    import torch

    torch.set_num_threads(1)
