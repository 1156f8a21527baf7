"""Warm pools on one host: per version, a number of standby workers (enclave_worker/standby.py) that have
booted and attested without a key. When the control loop wants one more serving worker it assigns a
standby one (it attests afresh, gets the key, decrypts and serves) instead of starting a process, and
starts a new standby worker in its place.

The pool is per version, not per hardware class: a worker's measurement names its tenant, model and
version (the tenant's release policy allows exactly that measurement), so a standby worker can only
ever become a worker of its own version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from api.orchestrator.local import LocalWorker, TenantPolicyFiles
from protocol.model_ref import ModelRef

log = logging.getLogger(__name__)


class StandbyRuntime(Protocol):
    def start(self, key: ModelRef, package_dir: Path, files: TenantPolicyFiles, standby: bool = False
              ) -> LocalWorker: ...

    def stop(self, worker: LocalWorker) -> None: ...

    def status(self, worker: LocalWorker) -> dict[str, Any]: ...

    def assign(self, worker: LocalWorker) -> bool: ...


@dataclass
class StandbyPool:
    size: int = 0  # standby workers kept per version that may run (0: none, every start is cold)
    workers: dict[ModelRef, list[LocalWorker]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"the standby pool size must be >= 0, not {self.size}")

    def take(self, runtime: StandbyRuntime, key: ModelRef) -> LocalWorker | None:
        """A standby worker of ``key``, assigned now and out of the pool; None if none is standing by."""
        pool = self.workers.get(key, [])
        for worker in list(pool):
            if runtime.status(worker).get("status") == "standby" and runtime.assign(worker):
                pool.remove(worker)
                log.info("assigned a standby worker of %s/%s/%s", key.tenant, key.model, key.version)
                return worker
        return None

    def tend(self, runtime: StandbyRuntime, key: ModelRef, package_dir: Path | None,
             files: Callable[[], TenantPolicyFiles]) -> list[str]:
        """Stop the standby workers that failed (their reasons are returned, for the version's backoff) and
        start new ones up to ``size`` (``files``: the tenant's policy files, read only then); with no
        package (the version may not run now), stop them all."""
        pool = self.workers.setdefault(key, [])
        failures = []
        for worker in list(pool):
            status = runtime.status(worker)
            if status.get("status") == "failed":
                failures.append(str(status.get("reason") or "standby worker failed"))
                pool.remove(worker)
                runtime.stop(worker)
        if package_dir is None or failures:
            self.stop(runtime, key)  # a failing version starts nothing until its backoff is over
            return failures
        if len(pool) < self.size:
            policy_files = files()
            while len(pool) < self.size:
                pool.append(runtime.start(key, package_dir, policy_files, standby=True))
        return failures

    def stop(self, runtime: StandbyRuntime, key: ModelRef) -> None:
        for worker in self.workers.pop(key, []):
            runtime.stop(worker)

    def stop_all(self, runtime: StandbyRuntime) -> None:
        for key in list(self.workers):
            self.stop(runtime, key)
