"""CPU threads: an engine computes on a fixed count (EngineConfig.num_threads, default every CPU this
process may use, or OMP_NUM_THREADS when the operator set it lower), set once on its compute thread
(compute_thread.py) and never tuned while serving: the count is part of what decides a step's
numerics (torch's GEMM splits its work by it), so two engines with the same configuration on the
same machine compute alike, whatever the machine's load (docs/engine.md, "Kernel paths")."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """The engine's thread count when its configuration names none: every CPU this process may use, or
    OMP_NUM_THREADS when set lower. torch.set_num_threads overrides that variable, so without this a
    stack started with OMP_NUM_THREADS=1 (as docs/benchmarks.md's retrieval runs were, to match the
    plain side's one thread) computed on every CPU: on a loaded 2-vCPU VM the encoder then took 10-20
    ms a query at the median against about 4 at one thread (docs/benchmarks.md, "The worker's side
    of a search")."""
    cpus = available_cpus()
    try:  # OpenMP allows one count per nesting level ("4,2"): the first is the engine's
        asked = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        return cpus
    return min(cpus, asked) if asked >= 1 else cpus


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
