"""Pure decisions of the control loop (both runtimes): how many workers a version gets, and the
status the gateway's `/readyz` shows for it."""

from __future__ import annotations

from dataclasses import dataclass

from api.orchestrator.scaling import ScalingPolicy, wanted_replicas
from api.orchestrator.spec import VersionSpec

BACKOFF_FIRST_S = 2.0
BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class Inputs:
    """Whether the version can run at all: its package and its data key."""

    package: bool
    data_key: bool
    key_revoked: bool = False


@dataclass
class History:
    """What the loop remembers per version between steps."""

    failures: int = 0  # boot failures in a row (a refused key, a tampered package)
    last_failure: str = ""
    retry_at: float = 0.0
    delay: float = 0.0
    low_since: float | None = None

    def failed(self, reason: str, now: float) -> float:
        self.failures += 1
        self.last_failure = reason
        self.delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (self.failures - 1))
        self.retry_at = now + self.delay
        return self.delay

    def served(self) -> None:
        self.failures, self.last_failure, self.retry_at = 0, "", 0.0


@dataclass(frozen=True)
class Decision:
    want: int
    status: str  # "" (let /readyz judge by the workers) | waiting | failing | cold | draining
    reason: str = ""


def decide(spec: VersionSpec, inputs: Inputs, running: int, history: History, now: float,
           policy: ScalingPolicy = ScalingPolicy()) -> Decision:
    if spec.retired:
        return Decision(0, "draining" if running else "", "retired")
    if not inputs.package:
        return Decision(0, "waiting", "no package uploaded for this version (sealed upload)")
    if inputs.key_revoked:
        return Decision(0, "waiting", "the tenant's key is revoked at the key broker")
    if not inputs.data_key:
        return Decision(0, "waiting", "no data key at the key broker (sealed models register --data-key)")
    want = wanted_replicas(spec, running, history.low_since, now, policy)
    if history.retry_at > now:
        return Decision(min(want, running), "failing", f"{history.last_failure}; {history.failures} failed "
                                                       f"start(s), next try after {history.delay:.0f} s")
    if history.failures:
        return Decision(want, "failing", f"{history.last_failure}; {history.failures} failed start(s), "
                                         "trying again")
    if want == 0 and running == 0:
        return Decision(0, "cold", "scaled to zero; a request starts a worker")
    return Decision(want, "")
