"""The simulated measurement of a worker: the code it runs and its measured configuration.

The code is the worker's import closure (`attestation.sim.closure`: every project module that
`python -m enclave_worker` can import, lazy imports and compiled extensions included). Editing a
module the worker can run changes the measurement; editing one it cannot run (the key broker, the
gateway, the tenant's package writer) does not. The import rules in pyproject.toml keep the closure
inside `enclave_worker`, `protocol`, `attestation` and `policy`; `docs/architecture.md` says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attestation.sim import worker_measurement
from attestation.sim.closure import PROJECT_PACKAGES, MeasurementError, closure_code, closure_modules

ENTRY_POINT = "enclave_worker.__main__"

__all__ = ["ENTRY_POINT", "PROJECT_PACKAGES", "MeasurementError", "measured_code", "simulated_measurement",
           "worker_modules"]


def worker_modules() -> dict[str, Path]:
    """Module name -> source file for every project module the worker's entry point can import."""
    return closure_modules(ENTRY_POINT)


def measured_code() -> dict[str, bytes]:
    """Relative path -> bytes of every file in the worker's closure."""
    return closure_code(ENTRY_POINT)


def simulated_measurement(measured_config: dict[str, Any]) -> bytes:
    return worker_measurement(measured_code(), measured_config)
