"""Issue #33, the platform half of the negative table (tests/security/test_workload_identity.py has
the workload half): the TDX boot chain (RTMRs, replayed from the CC event log) and the GPUs' RIMs
and OCSP status, from collateral imported offline.

One tenant release policy and one client policy, on top of the workload identity and TCB
UpToDate, pin the RTMRs that a real CCEL capture (tests/vectors/tdx-ccel) replays to and require
every GPU in CC mode, matching NVIDIA's RIMs for its versions, with OCSP "good" for every
certificate of its chains. The fake platform plays NVIDIA too: it signs the RIMs and the OCSP
answers (GPU 1's device certificate "revoked") that the broker and the client import as an offline
bundle. Each row is evidence from the fake hardware for one change a host can make: sent by the
worker's own key-release client to the real key broker process (refused, nothing released, the
reason in the audit log) and verified by the client's verifier (refused). The control row is the
same flow with nothing changed.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from api.broker_state import local_broker_keys
from api.home import Home
from api.stack import DEMO_MODEL, DEMO_TENANT, free_port, prepare_demo, store_demo_release_policy
from attestation.appraisal import AppraisalPolicy, appraise
from attestation.bundle import EvidenceBundle, GpuEvidence, RuntimeData, expected_report_data
from attestation.collateral import CollateralConfig, CollateralStore
from attestation.errors import AttestationError, PolicyViolation, RevokedError
from attestation.tdx.eventlog import parse_cc_event_log, replay_rtmrs
from attestation.verifier import VerifierTrust, verify_bundle
from key_broker.policies import PolicyStore
from key_broker.statefile import local_ledger
from policy.release import ReleasePolicy
from protocol.broker.client import obtain_data_key
from protocol.broker.errors import BrokerRefused
from sealed_bench.gpu_models import random_checkpoint
from sealed_fakes.ccel import kernel_cmdline, with_kernel_cmdline
from sealed_fakes.gpu_collateral import tampered_measurements
from sealed_fakes.platform import SNP_MEASUREMENT, TDX_MR_TD, FakePlatform, gpu_report
from tests.api.test_fake_tee_stack import audit_records
from tests.enclave_worker.demo_package import package_for_demo
from tests.security.test_workload_identity import GOOD, NOW, REF

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "tdx-ccel"
CCEL = (VECTORS / "ccel_data.dat").read_bytes()  # a real boot (Google COS 113 on TDX)
# The same firmware, kernel and initrd, booted with one more kernel argument.
CCEL_OTHER_CMDLINE = with_kernel_cmdline(CCEL, kernel_cmdline(CCEL) + " init=/bin/sh")
EXPECTED_RTMRS = {f"rtmr{i}": r.hex() for i, r in enumerate(replay_rtmrs(parse_cc_event_log(CCEL)))}
REVOKED_GPU = 1  # the imported OCSP bundle says its device certificate is revoked

# What the tenant (release policy) and the client (appraisal policy) both require.
PLATFORM_TERMS: dict[str, Any] = {
    "allowed_workload_ids": frozenset({GOOD.host_data().hex(), GOOD.mr_config_id().hex()}),
    "require_gpu_cc": True, "require_gpu_rim_match": True, "require_gpu_ocsp_good": True,
    "allowed_rtmrs": [EXPECTED_RTMRS],
}


@dataclasses.dataclass(frozen=True)
class Launch:
    """How the fake guest was booted, and which GPU (with what firmware) it was given."""

    event_log: bytes = CCEL
    gpu: int = 0
    gpu_measurements: dict[int, bytes] | None = None  # None: what NVIDIA's RIMs say


# name, launch, TEEs, reason in the broker's audit log, the client's error and its text
CASES: list[tuple[str, Launch, tuple[str, ...], str, type[AttestationError], str]] = [
    ("kernel-cmdline-changed", Launch(event_log=CCEL_OTHER_CMDLINE), ("tdx",), "TDX RTMRs", PolicyViolation,
     "TDX RTMRs"),
    ("gpu-rim-mismatch", Launch(gpu_measurements=tampered_measurements()), ("snp", "tdx"),
     "GPU measurements do not match the imported RIMs", PolicyViolation,
     "GPU measurements do not match the imported RIMs"),
    ("gpu-ocsp-revoked", Launch(gpu=REVOKED_GPU), ("snp", "tdx"), "RevokedError: certificate", RevokedError,
     "is revoked (OCSP)"),
]
ROWS = [(f"{name}-{tee}", launch, tee, reason, error, text)
        for name, launch, tees, reason, error, text in CASES for tee in tees]
CLIENT_POLICY = AppraisalPolicy.from_dict({
    "allowed_tee": ["snp", "tdx"], "allowed_measurements": [SNP_MEASUREMENT.hex(), TDX_MR_TD.hex()],
    **PLATFORM_TERMS})


def evidence(p: FakePlatform, tee: str, launch: Launch, rt: RuntimeData) -> EvidenceBundle:
    ident = p.gpus[launch.gpu]
    gpus = (GpuEvidence("hopper", gpu_report(ident, launch.gpu, rt.nonce, launch.gpu_measurements),
                        ident.chain_pem()),)
    data = expected_report_data(rt, gpus)
    if tee == "snp":
        return EvidenceBundle("snp", p.snp_report(data, host_data=GOOD.host_data()), rt, (p.vcek,), gpus)
    return EvidenceBundle("tdx", p.tdx_quote(data, launch.event_log, mr_config_id=GOOD.mr_config_id()), rt,
                          gpus=gpus, event_log=launch.event_log)


@dataclasses.dataclass(frozen=True)
class Broker:
    url: str
    home: Home
    platform: FakePlatform


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("boot-gpu")
    platform = FakePlatform.create(root / "platform", gpus=2, now=NOW)
    platform.write_collateral(NOW, revoked_gpus={REVOKED_GPU})  # AMD, Intel and NVIDIA, imported offline
    home = Home(root / "home")
    package_for_demo(home, random_checkpoint("tiny", "cpu", torch.float32))
    prepare_demo(home, log=lambda *_: None)
    ledger = local_ledger(home.broker, local_broker_keys(home).master_key)
    current = PolicyStore(home.broker, ledger).get(REF)
    store_demo_release_policy(home, ledger, ReleasePolicy(
        policy_id=current.policy_id, version=current.version + 1, tenant=DEMO_TENANT, model=DEMO_MODEL,
        allowed_tee=frozenset({"snp", "tdx"}), allowed_measurements=frozenset({SNP_MEASUREMENT.hex(), TDX_MR_TD.hex()}),
        required_signer=current.required_signer, acceptable_tcb_status=frozenset({"UpToDate"}), **PLATFORM_TERMS))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "key_broker", "--data-dir", str(home.broker), "--port", str(port),
         "--roots-dir", str(platform.root / "roots"), "--collateral-dir", str(platform.root / "collateral"),
         "--collateral-offline",
         "--tee", "sim", "--sim-platform-signing-key", str(home.sim_key), "--unsafe-sim-reseal"],
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


def client_verifies(p: FakePlatform, tee: str, launch: Launch) -> None:
    """The client's side: its own verifier (pinned roots, the same imported collateral) and policy."""
    store = CollateralStore(CollateralConfig(p.root / "collateral", offline=True))
    trust = VerifierTrust(roots_dir=p.root / "roots", snp_fetcher=store.snp, tdx_collateral=store.tdx,
                          gpu_collateral=store.nvidia)
    rt = RuntimeData(nonce=os.urandom(32), hpke_public_key=os.urandom(32))
    result = verify_bundle(evidence(p, tee, launch, rt), expected_nonce=rt.nonce, now=NOW, trust=trust)
    appraise(result.token_claims(), CLIENT_POLICY)


def release(b: Broker, tee: str, launch: Launch) -> bytes:
    with httpx.Client(base_url=b.url, timeout=60) as client:
        return obtain_data_key(client, REF, make_bundle=lambda rt: evidence(b.platform, tee, launch, rt)).data_key


@pytest.mark.parametrize("tee", ["snp", "tdx"])
def test_the_declared_boot_and_gpu_get_the_key_and_pass_the_client(broker: Broker, tee: str) -> None:
    """The control: the declared boot chain, a GPU whose measurements are NVIDIA's, status good."""
    assert len(release(broker, tee, Launch())) == 32
    client_verifies(broker.platform, tee, Launch())
    allowed = [r for r in audit_records(broker.home) if r["action"] == "attest" and r["decision"] == "allow"]
    meta = allowed[-1]["metadata"]
    assert (meta["gpu_cc"], meta["gpu_rim_matched"], meta["gpu_ocsp_good"]) == (True, True, True)


@pytest.mark.parametrize(("name", "launch", "tee", "reason", "error", "text"), ROWS, ids=[r[0] for r in ROWS])
def test_refused_at_the_broker_and_at_the_client(broker: Broker, name: str, launch: Launch, tee: str, reason: str,
                                                 error: type[AttestationError], text: str) -> None:
    before = len(audit_records(broker.home))
    with pytest.raises(BrokerRefused):
        release(broker, tee, launch)
    records = audit_records(broker.home)[before:]
    assert [(r["action"], r["decision"]) for r in records] == [("attest", "deny")], records
    assert reason in records[0]["reason"], records[0]["reason"]
    if "GPU measurements" in reason:  # verified, appraised and refused: the audit says what the GPU was
        assert (records[0]["metadata"]["gpu_rim_matched"], records[0]["metadata"]["gpu_ocsp_good"]) == (False, True)
    with pytest.raises(error) as refused:
        client_verifies(broker.platform, tee, launch)
    assert text in str(refused.value), str(refused.value)
