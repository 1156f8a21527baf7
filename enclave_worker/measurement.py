"""The simulated measurement of a worker: its code (the packages it runs) and its configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import api.proto
import attestation
import enclave_worker
import key_broker
import policy
import protocol
from attestation.sim import worker_measurement


def code_roots() -> list[Path]:
    """Every package whose code runs inside the worker's trust boundary."""
    return [Path(m.__file__).parent for m in (enclave_worker, attestation, key_broker, policy, protocol, api.proto)]


def simulated_measurement(measured_config: dict[str, Any]) -> bytes:
    return worker_measurement(code_roots(), measured_config)
