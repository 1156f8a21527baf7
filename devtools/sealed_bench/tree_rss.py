"""Resident memory of a process tree, read from /proc: a server that forks (vLLM's API server and its
engine core) is measured as all of its processes together.

Two figures, because peaks of several processes need not coincide:
- ``sampled_peak_bytes``: the largest sum of VmRSS over the tree seen by a sampler thread (every
  ``interval_s``; a peak shorter than that can be missed: a lower bound);
- ``hwm_sum_bytes``: the sum of each process's own peak (VmHWM), read at ``stop`` while they still
  run (an upper bound of the tree's peak; exact for a single process). A child that exited before
  ``stop`` is counted by its last sampled VmHWM.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class TreeRss:
    sampled_peak_bytes: int
    hwm_sum_bytes: int
    processes: int  # how many processes the tree held at any sample

    def record(self) -> dict[str, float | int]:
        return {
            "sampled_peak_gib": round(self.sampled_peak_bytes / 2**30, 3),
            "hwm_sum_gib": round(self.hwm_sum_bytes / 2**30, 3),
            "processes": self.processes,
        }


def _children(proc: Path) -> dict[int, list[int]]:
    """Parent pid -> child pids, from every /proc/<pid>/stat (field 4; after the parenthesised name)."""
    tree: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited between listing and reading
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def tree_pids(root: int, proc: Path = PROC) -> list[int]:
    """`root` and all its descendants now running."""
    tree, out, todo = _children(proc), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def _status_kib(pid: int, field: str, proc: Path) -> int:
    """A ``Vm*`` field of /proc/<pid>/status in KiB (0 where the process has gone)."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _cmdline(pid: int, proc: Path) -> bytes:
    try:
        return (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


class TreeRssSampler:
    """Samples the trees under ``roots`` from ``start`` until ``stop``; ``only`` (a test on a process's
    command line) keeps some of their processes (e.g. the worker among a stack's)."""

    def __init__(
        self, roots: list[int], interval_s: float = 0.1, proc: Path = PROC, only: Callable[[bytes], bool] | None = None
    ) -> None:
        self.roots, self.interval_s, self.proc, self.only = roots, interval_s, proc, only
        self._result: TreeRss | None = None
        self._peak = 0
        self._hwm: dict[int, int] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-rss", daemon=True)

    def _sample(self) -> None:
        pids = [
            pid
            for root in self.roots
            for pid in tree_pids(root, self.proc)
            if self.only is None or self.only(_cmdline(pid, self.proc))
        ]
        self._peak = max(self._peak, 1024 * sum(_status_kib(pid, "VmRSS", self.proc) for pid in pids))
        for pid in pids:
            self._hwm[pid] = max(self._hwm.get(pid, 0), 1024 * _status_kib(pid, "VmHWM", self.proc))

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            self._sample()

    def start(self) -> TreeRssSampler:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> TreeRss:
        """The figures (the first call's, on every later one: a caller may stop it again on its way out)."""
        if self._result is None:
            self._done.set()
            self._thread.join()
            self._sample()  # the last word: each process's VmHWM while it still runs
            self._result = TreeRss(self._peak, sum(self._hwm.values()), len(self._hwm))
        return self._result
