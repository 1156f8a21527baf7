"""The worker's simulated measurement covers exactly the project code the worker can run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grimp

from attestation.sim import worker_measurement
from enclave_worker.measurement import PROJECT_PACKAGES, measured_code, simulated_measurement, worker_modules

ROOT = Path(__file__).resolve().parents[2]


def test_every_project_module_the_worker_loads_is_measured() -> None:
    # A fresh interpreter imports the worker's entry point and its gRPC server (which pulls in boot,
    # the engine, the guard, the broker client, the TEE collectors) and reports what it loaded.
    probe = (
        "import json, sys, enclave_worker.__main__, enclave_worker.grpc_server;"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {PROJECT_PACKAGES!r})))"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    loaded = set(json.loads(run.stdout))
    assert "enclave_worker.boot" in loaded
    assert loaded <= set(worker_modules()), sorted(loaded - set(worker_modules()))


def test_the_closure_contains_the_static_import_graph() -> None:
    # grimp (import-linter's graph builder) is an independent reading of the same imports; it does
    # not model that importing a.b runs a/__init__.py, so ours may only be larger.
    graph = grimp.build_graph(*PROJECT_PACKAGES)
    upstream = graph.find_upstream_modules("enclave_worker.__main__") | {"enclave_worker.__main__"}
    assert upstream <= set(worker_modules()), sorted(upstream - set(worker_modules()))


def test_only_worker_side_packages_are_measured() -> None:
    code = measured_code()
    tops = {path.split("/")[0] for path in code}
    assert tops == {"enclave_worker", "protocol", "attestation", "policy"}
    # The contracts the worker runs are measured; the key broker's and the gateway's code is not.
    assert {"protocol/broker/client.py", "protocol/rpc/worker_pb2.py", "enclave_worker/guard.py",
            "attestation/sim/tee.py", "policy/__init__.py"} <= set(code)
    assert not any(path.startswith(("key_broker/", "api/", "tests/")) for path in code)
    assert "enclave_worker/package/writer.py" not in code  # the tenant's side
    for path, data in code.items():
        assert (ROOT / path).read_bytes() == data


def test_measurement_is_over_the_measured_code_and_config() -> None:
    config = {"model": "m", "version": "v1"}
    assert simulated_measurement(config) == worker_measurement(measured_code(), config)
    assert simulated_measurement(config) != simulated_measurement({**config, "version": "v2"})


def test_the_cpu_kernels_are_measured_as_loaded() -> None:
    # Compiled at install time (setup.py), loaded from the package: the bytes the worker dlopens are measured.
    from enclave_worker.engine.kernels.cpu_ops import load_cpu_ops

    module = Path(load_cpu_ops().__file__ or "")
    assert measured_code()[module.relative_to(ROOT).as_posix()] == module.read_bytes()
