"""Helpers the benchmarks share for the real processes they start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# The checkout: the benchmarks are a development package (devtools/, never in the product wheel), run
# from a checkout; processes they start in another interpreter (vLLM's virtualenv) import the
# product packages and this one from its source folders.
REPO = Path(__file__).resolve().parents[2]


def source_pythonpath(extra: str = "") -> str:
    """PYTHONPATH for a child that imports the product packages and sealed_bench from the checkout."""
    return os.pathsep.join(p for p in (str(REPO), str(REPO / "devtools"), extra) if p)


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 60.0) -> None:
    """Return once `url`/healthz answers 200; kill the process and raise if it never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{url}: not healthy after {timeout_s:.0f} s")


def start_sim_broker(root: Path, platform_key: Ed25519PrivateKey, admin_token: str,
                     rate_limit_per_minute: int) -> tuple[subprocess.Popen, str]:
    """A real key broker process on localhost, itself on the simulated TEE (its own platform signing
    key, written under `root`), that accepts workers' simulated evidence signed by `platform_key`."""
    from api.stack import free_port  # here: the control plane's imports only where a broker starts

    worker_platform = root / "sim.pub.pem"
    worker_platform.write_bytes(platform_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    broker_platform = root / "broker-platform.pem"  # the broker's own simulated TEE: derives its sealing key
    broker_platform.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    broker_platform.chmod(0o600)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "key_broker", "--data-dir", str(root / "broker"), "--port", str(port),
         "--sim-platform-key", str(worker_platform), "--tee", "sim", "--sim-platform-signing-key", str(broker_platform),
         "--rate-limit-per-minute", str(rate_limit_per_minute), "--init"],  # a fresh broker: new anchors
        stdout=open(root / "broker.log", "wb"),  # noqa: SIM115 (owned by the child)
        stderr=subprocess.STDOUT, env={**os.environ, "SEALED_BROKER_ADMIN_TOKEN": admin_token})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
    except RuntimeError as error:
        raise RuntimeError(f"{error}: {(root / 'broker.log').read_text()[-2000:]}") from None
    return proc, url
