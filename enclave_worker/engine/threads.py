"""How many CPU threads a step computes on, chosen by measuring (the machine may be shared).

On an idle machine a step is fastest on every core. When another process keeps a core busy, a
second compute thread is worse than none: OpenMP and OpenBLAS workers spin at their barriers, so
the step waits for whichever worker the kernel has just descheduled, and the spinning steals the
CPU that the worker's event loop and the gateway need (batch-1 decode fell from ~30 to 5-9 tok/s
with two threads while a second process loaded one of two cores). Load can come and go at any
time, so the choice is not made once: per kind of step, the tuner keeps a running mean of the
time per token on one thread and on all threads, uses the faster, and tries the other every
``EXPLORE_EVERY`` steps of that kind so it notices when the load changes. A try of a count that
measured k times slower costs k steps, so the interval grows with k (up to ``MAX_BACKOFF`` times):
under load two OpenBLAS threads measured 9x slower than one here, and a try every 16 steps would
have added half a step to every step.
"""

from __future__ import annotations

import os

import numpy  # noqa: F401  (loads OpenBLAS, so threadpoolctl finds its pool)
from threadpoolctl import ThreadpoolController

EXPLORE_EVERY = 16  # steps of one kind between two tries of the other thread count ...
MAX_BACKOFF = 16  # ... times how much slower the other count measured (at most this), so a try costs <= 1/16
ALPHA = 0.3  # weight of the newest measurement in the running mean
EAGER_MAX_TOKENS = 64  # steps up to this size measure both counts at once; larger ones try one thread late


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def step_kind(blas: bool, num_tokens: int) -> tuple[bool, int]:
    """Steps that cost alike: exact token counts for decode-sized steps, powers of two above."""
    return blas, num_tokens if num_tokens <= 64 else 1 << num_tokens.bit_length()


class _Arm:
    __slots__ = ("count", "mean")

    def __init__(self) -> None:
        self.mean = 0.0
        self.count = 0

    def add(self, value: float) -> None:
        # Falls at once, rises smoothly: a rarely tried count is believed as soon as it measures
        # faster (the load went away), and one slow step (a preemption) does not flip the choice.
        self.mean = value if self.count == 0 or value < self.mean else (1 - ALPHA) * self.mean + ALPHA * value
        self.count += 1


class ThreadTuner:
    """Picks 1 or ``max_threads`` threads per step kind from measured step times (see module doc)."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max(1, max_threads)
        self._arms: dict[tuple[bool, int], dict[int, _Arm]] = {}
        self._steps: dict[tuple[bool, int], int] = {}

    @property
    def active(self) -> bool:
        return self.max_threads > 1

    def choose(self, kind: tuple[bool, int]) -> int:
        if not self.active:
            return 1
        arms = self._arms.setdefault(kind, {1: _Arm(), self.max_threads: _Arm()})
        few, many = arms[1], arms[self.max_threads]
        if kind[1] > EAGER_MAX_TOKENS:
            # A large step (prefill) is costly on the wrong count: all threads first (an idle machine's
            # best), one thread only as the periodic try. Measuring both first ran half of a 64-prompt
            # prefill on one thread (bf16, 2048-token steps: 1.8 s against 0.95 s on two, Zen 5).
            if many.count == 0:
                return self.max_threads
            if few.count == 0:
                return self._explore(kind, self.max_threads, 1, 1.0)
        elif few.count < 2 or many.count < 2:  # a cheap step: measure both first, alternating
            return self.max_threads if many.count <= few.count else 1
        best, other = (1, self.max_threads) if few.mean < many.mean else (self.max_threads, 1)
        return self._explore(kind, best, other, arms[other].mean / max(arms[best].mean, 1e-12))

    def _explore(self, kind: tuple[bool, int], best: int, other: int, slower: float) -> int:
        """``best``, except every EXPLORE_EVERY steps (times how much slower ``other`` measured)."""
        n = self._steps[kind] = self._steps.get(kind, 0) + 1
        if n >= EXPLORE_EVERY * min(max(slower, 1.0), MAX_BACKOFF):
            self._steps[kind] = 0
            return other
        return best

    def record(self, kind: tuple[bool, int], threads: int, seconds_per_token: float) -> None:
        arms = self._arms.get(kind)
        if arms is not None and threads in arms:
            arms[threads].add(seconds_per_token)

    def snapshot(self) -> dict[str, dict[int, float]]:
        """Mean ms per token per thread count, per kind (for profiles and benchmarks)."""
        return {f"{'blas' if b else 'torch'}:{n}": {t: round(a.mean * 1e3, 3) for t, a in arms.items() if a.count}
                for (b, n), arms in self._arms.items()}


class ThreadPools:
    """Sets torch's intra-op pool and OpenBLAS's pool, touching each only when its count changes."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._blas = ThreadpoolController().select(user_api="blas").lib_controllers
        self._blas_threads = -1
        self.set(torch.get_num_threads(), 1)  # OpenBLAS's workers stay asleep until a step asks for them

    def set(self, torch_threads: int, blas_threads: int | None = None) -> None:
        """``blas_threads`` None leaves OpenBLAS as it is: a step that does not use it must not raise its
        count (a raised pool's worker was seen spinning at ~40% of a CPU next to a served engine)."""
        if self._torch.get_num_threads() != torch_threads:
            self._torch.set_num_threads(torch_threads)
        if blas_threads is not None and blas_threads != self._blas_threads:
            for lib in self._blas:
                _take_control(lib)
                lib.set_num_threads(blas_threads)
            self._blas_threads = blas_threads


def _take_control(lib: object) -> None:
    """Make the calling thread the one whose OpenBLAS limits count.

    threadpoolctl >= 3.8 lets only one thread (the first to set a limit, here the main thread that
    built the model) change a pthreads OpenBLAS pool; a set from any other thread silently does
    nothing. Engine steps run on the engine's own thread, so without this every OpenBLAS step kept
    the pool the main thread left (one thread): dense matmuls at half speed on two cores (seen
    2026-12-02, threadpoolctl 3.8.0, OpenBLAS 0.3.31). The engine thread is the only one that
    sets the pool while serving, so taking control from the builder is safe.
    """
    clear = getattr(type(lib), "clear_controlling_thread", None)
    if clear is not None:
        clear(force=True)


def single_threaded_caller() -> None:
    """Run the calling thread's own torch ops on one thread, so that only the engine's compute thread
    (compute_thread.py) ever starts an OpenMP team. Call it first thing in a process that hosts an
    engine, from the thread that will not step it (the event loop's).

    Each thread that runs a parallel torch op keeps an OpenMP team; once libgomp manages more threads
    than there are CPUs it stops spinning between parallel regions, and every one of a step's ~600
    regions then waits for a woken thread. A process whose main thread had loaded a checkpoint on two
    threads ran the engine's 64-prompt bf16 benchmark 12-13% slower (Zen 5, 2 vCPUs, 2026-12-02).
    """
    import torch

    torch.set_num_threads(1)
