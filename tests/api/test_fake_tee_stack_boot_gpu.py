"""Issue #33 on the whole fake-TEE stack (`sealed up` with the real worker on fake TDX/SNP and fake
NVML): a tenant release policy that pins the TDX boot chain (the RTMRs the captured CCEL replays
to) and requires every GPU to match NVIDIA's RIMs with OCSP "good" (collateral imported offline).
The worker's own attesters read the CCEL and the GPU reports; the broker refuses a TD booted with
another kernel command line, a GPU whose VBIOS measures other than its RIM, and a GPU whose device
certificate the imported OCSP answer says is revoked: the worker fails to start, nothing is
released, the reason is in the audit log. The control is the same stack with nothing changed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import torch

from api.broker_state import local_broker_keys
from api.home import Home
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION, Stack, prepare_demo, store_demo_release_policy
from attestation.tdx.eventlog import parse_cc_event_log, replay_rtmrs
from key_broker.policies import PolicyStore
from key_broker.statefile import local_ledger
from policy.release import ReleasePolicy
from protocol.model_ref import ModelRef
from sealed_bench.gpu_models import random_checkpoint
from sealed_fakes.platform import SNP_MEASUREMENT, TDX_MR_TD, FakePlatform
from tests.api.test_fake_tee_stack import Env, audit_records, start
from tests.enclave_worker.demo_package import package_for_demo
from tests.enclave_worker.fake_tee_worker import CCEL

NOW = dt.datetime.now(dt.UTC)
# What the TD the fake launcher boots (the captured CCEL, unchanged) has in its RTMRs.
RTMRS = {f"rtmr{i}": r.hex() for i, r in enumerate(replay_rtmrs(parse_cc_event_log((CCEL / "ccel_data.dat")
                                                                                     .read_bytes())))}


@pytest.fixture(scope="module")
def boot_env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    root = tmp_path_factory.mktemp("faketee-boot-gpu")
    platform = FakePlatform.create(root / "platform", gpus=2, now=NOW)
    platform.write_collateral(NOW, revoked_gpus=())
    home = Home(root / "home")
    package_for_demo(home, random_checkpoint("tiny", "cpu", torch.float32))
    demo = prepare_demo(home, log=lambda *_: None)
    signer = PolicyStore(home.broker).get(ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)).required_signer
    assert signer
    store_demo_release_policy(home, local_ledger(home.broker, local_broker_keys(home).master_key), ReleasePolicy(
        policy_id="demo-release", version=1, tenant=DEMO_TENANT, model=DEMO_MODEL,
        allowed_tee=frozenset({"snp", "tdx"}), allowed_measurements=frozenset({SNP_MEASUREMENT.hex(), TDX_MR_TD.hex()}),
        required_signer=signer, require_gpu_cc=True, require_gpu_rim_match=True, require_gpu_ocsp_good=True,
        allowed_rtmrs=[RTMRS]))  # type: ignore[arg-type]
    return Env(home, platform, demo.api_key, signer)


@pytest.fixture()
def stacks(boot_env: Env) -> Iterator[list[Stack]]:
    running: list[Stack] = []
    yield running
    for stack in running:
        stack.stop()
    boot_env.platform.write_collateral(NOW, revoked_gpus=())


CASES = [  # name, fake CPU, fake NVML, launcher flags, GPUs revoked by the imported OCSP bundle, audit reason
    ("tdx-kernel-cmdline-changed", "tdx", "cc-on", ("--kernel-cmdline-append", "init=/bin/sh"), (), "TDX RTMRs"),
    ("snp-gpu-rim-mismatch", "snp", "cc-on-tampered", (), (), "GPU measurements do not match the imported RIMs"),
    ("snp-gpu-ocsp-revoked", "snp", "cc-on", (), (1,), "RevokedError: certificate"),
]


def test_the_declared_boot_and_gpus_get_the_key(boot_env: Env, stacks: list[Stack]) -> None:
    before = len(audit_records(boot_env.home)) if (boot_env.home.audit / "key-broker.audit.jsonl").exists() else 0
    stack = start(boot_env, "tdx+nvgpu", "tdx", "cc-on")
    stacks.append(stack)
    assert stack.wait_ready(timeout=240) == "ready", (boot_env.home.logs / "worker.log").read_text()[-3000:]
    attests = [r for r in audit_records(boot_env.home)[before:] if r["action"] == "attest"]
    assert [r["decision"] for r in attests] == ["allow"], attests
    meta = attests[0]["metadata"]
    assert (meta["gpus"], meta["gpu_cc"], meta["gpu_rim_matched"], meta["gpu_ocsp_good"]) == (2, True, True, True)


@pytest.mark.parametrize(("name", "cpu", "nvml", "flags", "revoked", "reason"), CASES, ids=[c[0] for c in CASES])
def test_the_worker_is_refused_and_the_reason_audited(boot_env: Env, stacks: list[Stack], name: str, cpu: str,
                                                      nvml: str, flags: tuple[str, ...], revoked: tuple[int, ...],
                                                      reason: str) -> None:
    boot_env.platform.write_collateral(NOW, revoked_gpus=revoked)
    before = len(audit_records(boot_env.home)) if (boot_env.home.audit / "key-broker.audit.jsonl").exists() else 0
    stack = start(boot_env, f"{cpu}+nvgpu", cpu, nvml, *flags)
    stacks.append(stack)
    assert stack.wait_ready(timeout=240) == "failed", (boot_env.home.logs / "worker.log").read_text()[-3000:]
    records = audit_records(boot_env.home)[before:]
    assert [(r["action"], r["decision"]) for r in records if r["action"] in ("attest", "release")] == [
        ("attest", "deny")], records
    deny = next(r for r in records if r["action"] == "attest")
    assert reason in deny["reason"], deny["reason"]
