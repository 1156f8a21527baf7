"""The whole service on fake TEE hardware: a worker attests as SEV-SNP or TDX (with or without
NVIDIA GPUs in CC mode) through the fakes at the kernel and driver seams, gets its key from the
real key broker process (test roots, an offline collateral bundle), and answers through the real
gateway; the broker's audit log holds one appraisal covering the CPU and GPU evidence.

On real hardware (`--run-tee`, `--run-gpu`) the same flow runs without fakes: see docs/security.md.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator

import httpx
import pytest
import torch

from api.broker_state import local_broker_keys
from api.home import Home
from api.stack import (
    DEMO_MODEL,
    DEMO_TENANT,
    DEMO_VERSION,
    Stack,
    free_port,
    launch,
    prepare_demo,
    store_demo_release_policy,
)
from key_broker.policies import PolicyStore
from key_broker.statefile import local_ledger
from policy.release import ReleasePolicy
from protocol.model_ref import ModelRef
from sealed_bench.gpu_models import random_checkpoint
from sealed_fakes.platform import SNP_MEASUREMENT, TDX_MR_TD, FakePlatform
from tests.enclave_worker.demo_package import package_for_demo


@dataclasses.dataclass(frozen=True)
class Env:
    home: Home
    platform: FakePlatform
    api_key: str
    signer: str


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    root = tmp_path_factory.mktemp("faketee")
    platform = FakePlatform.create(root / "platform", gpus=2)
    home = Home(root / "home")
    package_for_demo(home, random_checkpoint("tiny", "cpu", torch.float32))
    demo = prepare_demo(home, log=lambda *_: None)
    signer = PolicyStore(home.broker).get(ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)).required_signer
    assert signer
    return Env(home, platform, demo.api_key, signer)


def put_release_policy(home: Home, signer: str, *, require_gpu_cc: bool) -> None:
    """The demo tenant signs (with its local policy-admin key) a policy admitting the fake platform."""
    store_demo_release_policy(home, local_ledger(home.broker, local_broker_keys(home).master_key),
                              ReleasePolicy(
        policy_id="demo-release", version=1, tenant=DEMO_TENANT, model=DEMO_MODEL,
        allowed_tee=frozenset({"snp", "tdx"}), allowed_measurements=frozenset({SNP_MEASUREMENT.hex(), TDX_MR_TD.hex()}),
        required_signer=signer, require_gpu_cc=require_gpu_cc))


def audit_records(home: Home) -> list[dict]:
    path = home.audit / "key-broker.audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start(env: Env, tee: str, cpu: str, nvml: str, *launcher_flags: str) -> Stack:
    p = env.platform.root
    return launch(
        env.home, port=free_port(),
        broker_args=("--roots-dir", str(p / "roots"), "--collateral-dir", str(p / "collateral"),
                     "--collateral-offline"),
        worker_launcher=("tests.enclave_worker.fake_tee_worker", "--platform", str(p), "--cpu", cpu,
                         "--nvml", nvml, *launcher_flags),
        worker_extra_args=("--tee", tee))


@pytest.fixture()
def running() -> Iterator[list[Stack]]:
    stacks: list[Stack] = []
    yield stacks
    for stack in stacks:
        stack.stop()


def chat(stack: Stack, api_key: str, timeout: float = 60.0) -> httpx.Response:
    """Ask through the gateway once the worker is routable (its heartbeat and attestation checked)."""
    deadline = time.monotonic() + timeout
    while True:
        resp = httpx.post(f"{stack.gateway_url}/v1/chat/completions", timeout=60.0,
                          headers={"Authorization": f"Bearer {api_key}"},
                          json={"model": DEMO_MODEL, "max_tokens": 4, "temperature": 0,
                                "messages": [{"role": "user", "content": "Say hello."}]})
        if resp.status_code != 503 or time.monotonic() > deadline:
            return resp
        time.sleep(0.5)


CASES = [  # tee flag, fake CPU, fake NVML, extra launcher flags, GPUs in the evidence
    ("snp", "snp", "none", (), 0),
    ("snp-ioctl", "snp", "none", ("--sev-guest-ioctl",), 0),
    ("tdx", "tdx", "none", (), 0),
    ("snp+nvgpu", "snp", "cc-on", (), 2),
    ("tdx+nvgpu", "tdx", "cc-on", (), 2),
]


@pytest.mark.parametrize(("name", "cpu", "nvml", "flags", "gpus"), CASES, ids=[c[0] for c in CASES])
def test_worker_attests_through_the_broker_and_answers(env: Env, running: list[Stack], name: str, cpu: str,
                                                      nvml: str, flags: tuple, gpus: int) -> None:
    put_release_policy(env.home, env.signer, require_gpu_cc=gpus > 0)
    before = len(audit_records(env.home)) if (env.home.audit / "key-broker.audit.jsonl").exists() else 0
    tee = cpu + ("+nvgpu" if gpus else "")
    stack = start(env, tee, cpu, nvml, *flags)
    running.append(stack)
    log = env.home.logs / "worker.log"
    assert stack.wait_ready(timeout=240) == "ready", log.read_text()[-3000:]
    status = httpx.get(f"{stack.worker_url}/internal/status", timeout=5).json()
    assert status["tee"] == cpu and status["insecure"] is False
    evidence = httpx.get(f"{stack.worker_url}/internal/attestation", timeout=5).json()["evidence"]
    assert len(evidence["gpus"]) == gpus
    assert bool(evidence.get("event_log")) is (cpu == "tdx")  # the TD's CC event log went to the broker
    resp = chat(stack, env.api_key)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["tee"] == cpu and body["insecure"] is False and body["choices"][0]["message"]["content"] is not None
    records = audit_records(env.home)[before:]
    attests = [r for r in records if r["action"] == "attest"]
    assert [r["decision"] for r in attests] == ["allow"], attests
    meta = attests[0]["metadata"]
    # One appraisal: the CPU report and every GPU's report in one bundle, one decision.
    assert meta["tee"] == cpu and meta["gpus"] == gpus and meta["gpu_cc"] is (gpus > 0)
    assert meta["measurement"] == (SNP_MEASUREMENT if cpu == "snp" else TDX_MR_TD).hex()
    assert [r["decision"] for r in records if r["action"] == "release"] == ["allow"]
    # The GPUs were set ready only after the broker accepted the evidence.
    if gpus:
        text = log.read_text()
        assert "GPUs ready" in text
