"""The negative table through the whole release flow on fake TEE hardware: evidence built by the
fake platform, sent by the worker's own key-release client to the real key broker process. Each
case is refused, no key is released, and the broker's audit log records the reason.

Plus the worker itself on a GPU whose CC mode is off (the captured H200 answers): it does not
attest, says why in one line, and nothing reaches the broker.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch

from api.home import Home
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION, free_port, launch, prepare_demo
from attestation.bundle import EvidenceBundle, GpuEvidence, RuntimeData, expected_report_data
from key_broker.policies import PolicyStore
from protocol.broker.client import obtain_data_key
from protocol.broker.errors import BrokerRefused
from protocol.model_ref import ModelRef
from sealed_bench.gpu_models import random_checkpoint
from sealed_fakes.platform import FakePlatform, gpu_report
from tests.api.test_fake_tee_stack import audit_records, put_release_policy
from tests.enclave_worker.demo_package import package_for_demo


@dataclasses.dataclass(frozen=True)
class Broker:
    url: str
    home: Home
    platform: FakePlatform


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("faketee-neg")
    platform = FakePlatform.create(root / "platform", gpus=2)
    home = Home(root / "home")
    package_for_demo(home, random_checkpoint("tiny", "cpu", torch.float32))
    prepare_demo(home, log=lambda *_: None)
    signer = PolicyStore(home.broker).get(ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)).required_signer
    put_release_policy(home, signer or "", require_gpu_cc=True)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "key_broker", "--data-dir", str(home.broker), "--port", str(port),
         "--roots-dir", str(platform.root / "roots"), "--collateral-dir", str(platform.root / "collateral"),
         "--collateral-offline", "--sim-platform-signing-key", str(home.sim_key), "--unsafe-sim-reseal"],
        stdout=open(root / "broker.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, (root / "broker.log").read_text()[-2000:]
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "broker did not start"
        time.sleep(0.1)
    yield Broker(url, home, platform)
    proc.terminate()
    proc.wait(10)


def snp_bundle(p: FakePlatform, rt: RuntimeData, *, gpu_nonce: bytes | None = None, swap_chains: bool = False,
               bind: bool = True, with_gpus: bool = True) -> EvidenceBundle:
    gpus: tuple[GpuEvidence, ...] = ()
    if with_gpus:
        gpus = tuple(GpuEvidence("hopper", gpu_report(g, i, gpu_nonce or rt.nonce),
                                 p.gpus[1 - i if swap_chains else i].chain_pem()) for i, g in enumerate(p.gpus))
    report = p.snp_report(expected_report_data(rt, gpus if bind else ()))
    return EvidenceBundle("snp", report, rt, (p.vcek,), gpus)


CCEL_LOG = (Path(__file__).resolve().parents[1] / "vectors" / "tdx-ccel" / "ccel_data.dat").read_bytes()


def tdx_bundle(p: FakePlatform, rt: RuntimeData, *, tamper_log: bool = False) -> EvidenceBundle:
    gpus = tuple(GpuEvidence("hopper", gpu_report(g, i, rt.nonce), g.chain_pem()) for i, g in enumerate(p.gpus))
    log = bytearray(CCEL_LOG)
    if tamper_log:  # the first measured event's digest: the log no longer replays to the quote's RTMRs
        log[32 + int.from_bytes(log[28:32], "little") + 14] ^= 0xFF
    return EvidenceBundle("tdx", p.tdx_quote(expected_report_data(rt, gpus), CCEL_LOG), rt, (), gpus,
                          event_log=bytes(log))


NOW = dt.datetime.now(dt.UTC)
Make = Callable[[FakePlatform, RuntimeData], EvidenceBundle]
CASES: list[tuple[str, Make, dict, str]] = [  # name, bundle, collateral, reason in the audit log
    ("gpu-evidence-other-nonce", lambda p, rt: snp_bundle(p, rt, gpu_nonce=os.urandom(32)), {}, "GPU evidence nonce"),
    ("gpu-cc-off-no-gpu-evidence", lambda p, rt: snp_bundle(p, rt, with_gpus=False), {},
     "GPU confidential computing is off"),
    ("gpu-report-under-another-gpus-chain", lambda p, rt: snp_bundle(p, rt, swap_chains=True), {},
     "SignatureError: SPDM MEASUREMENTS signature does not verify"),
    ("cpu-report-without-gpu-binding", lambda p, rt: snp_bundle(p, rt, bind=False), {}, "REPORT_DATA does not bind"),
    ("expired-amd-crl", snp_bundle, {"now": NOW - dt.timedelta(days=60)}, "CRL expired"),
    ("expired-intel-tcbinfo", tdx_bundle, {"now": NOW - dt.timedelta(days=60)}, "expired"),
    ("revoked-vcek", snp_bundle, {"revoked_vcek": True}, "RevokedError"),
    ("tdx-event-log-not-replaying", lambda p, rt: tdx_bundle(p, rt, tamper_log=True), {},
     "event log does not replay"),
]


@pytest.mark.parametrize(("name", "make", "collateral", "reason"), CASES, ids=[c[0] for c in CASES])
def test_refused_nothing_released_reason_audited(broker: Broker, name: str, make: Make, collateral: dict,
                                                 reason: str) -> None:
    p = broker.platform
    p.write_collateral(collateral.pop("now", NOW), **collateral)
    before = len(audit_records(broker.home))
    try:
        with httpx.Client(base_url=broker.url, timeout=30) as client, pytest.raises(BrokerRefused):
            obtain_data_key(client, ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION),
                            make_bundle=lambda rt: make(p, rt))
    finally:
        p.write_collateral(NOW)
    records = audit_records(broker.home)[before:]
    assert [(r["action"], r["decision"]) for r in records] == [("attest", "deny")], records
    assert reason in records[0]["reason"], records[0]["reason"]


def test_the_same_broker_releases_to_good_evidence(broker: Broker) -> None:
    """The control for the table above: nothing but the one defect differs."""
    p = broker.platform
    for make in (snp_bundle, tdx_bundle):
        with httpx.Client(base_url=broker.url, timeout=30) as client:
            released = obtain_data_key(client, ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION),
                                       make_bundle=lambda rt, m=make: m(p, rt))
        assert len(released.data_key) == 32


def test_worker_on_a_gpu_with_cc_off_does_not_attest(tmp_path: Path) -> None:
    platform = FakePlatform.create(tmp_path / "platform", gpus=1)
    home = Home(tmp_path / "home")
    package_for_demo(home, random_checkpoint("tiny", "cpu", torch.float32))
    prepare_demo(home, log=lambda *_: None)
    p = platform.root
    stack = launch(home, port=free_port(),
                   broker_args=("--roots-dir", str(p / "roots"), "--collateral-dir", str(p / "collateral"),
                                "--collateral-offline"),
                   worker_launcher=("tests.enclave_worker.fake_tee_worker", "--platform", str(p), "--cpu", "snp",
                                    "--nvml", "cc-off"),
                   worker_extra_args=("--tee", "snp+nvgpu"))
    try:
        assert stack.wait_ready(timeout=240) == "failed"
    finally:
        stack.stop()
    lines = [ln for ln in (home.logs / "worker.log").read_text().splitlines() if "worker boot failed" in ln]
    assert len(lines) == 1 and "GPU confidential computing is off" in lines[0], lines
    audit = home.audit / "key-broker.audit.jsonl"
    attests = [r for r in audit_records(home) if r["action"] == "attest"] if audit.exists() else []
    assert attests == []  # no evidence was produced, so nothing reached the broker
