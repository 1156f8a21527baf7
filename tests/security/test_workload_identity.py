"""Issue #33: on (fake) hardware the evidence names the whole workload, and both relying parties
hold it to that. One tenant release policy and one client policy allow exactly one init-data
(attestation/initdata.py) and require TCB UpToDate, no debug, VMPL 0 and no migration agent.

Each row of the table is one thing an operator changes: evidence is produced by the fake platform
(the test PKIs playing AMD and Intel) for a guest launched with that change, sent by the worker's
own key-release client to the real key broker process (refused, nothing released, the reason in
the audit log), and verified by the client's verifier (refused by its appraisal policy). The
control row is the same flow with nothing changed. The worker's own refusal (it runs other
arguments than its init-data names) is the last test: the real worker process exits with
EXIT_CONFIG_ERROR before anything is attested.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch

from api.broker_state import local_broker_keys
from api.home import Home
from api.stack import DEMO_MODEL, DEMO_TENANT, DEMO_VERSION, free_port, prepare_demo, store_demo_release_policy
from attestation.appraisal import AppraisalPolicy, appraise
from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
from attestation.collateral import CollateralConfig, CollateralStore
from attestation.errors import PolicyViolation
from attestation.initdata import InitData
from attestation.snp.tcb import TcbVersion
from attestation.verifier import VerifierTrust, verify_bundle
from enclave_worker.cli import parse
from enclave_worker.workload_check import MEASURED_ENV_PREFIXES, init_data_for
from key_broker.policies import PolicyStore
from key_broker.statefile import local_ledger
from policy.release import ReleasePolicy
from protocol.broker.client import obtain_data_key
from protocol.broker.errors import BrokerRefused
from protocol.exit_codes import EXIT_CONFIG_ERROR
from protocol.model_ref import ModelRef
from sealed_bench.gpu_models import random_checkpoint
from sealed_fakes.platform import SNP_MEASUREMENT, TDX_MR_TD, FakePlatform
from tests.api.test_fake_tee_stack import audit_records
from tests.enclave_worker.demo_package import package_for_demo

REF = ModelRef(DEMO_TENANT, DEMO_MODEL, DEMO_VERSION)
BROKER_URL = "https://broker.sealed.example"
AGENT_POLICY = b"package agent_policy\ndefault CreateContainerRequest := false\n"
IMAGE = "registry.sealed.example/sealed-worker@sha256:" + "ab" * 32
ARGV = ("--broker-url", BROKER_URL, "--tenant", DEMO_TENANT, "--model", DEMO_MODEL, "--version", DEMO_VERSION,
        "--package-dir", "/var/lib/sealed/packages/demo", "--grpc-port", "50051", "--tee", "snp",
        "--max-num-seqs", "16", "--min-policy-version", "3")
ENV = {"PYTHONHASHSEED": "0", "SEALED_LOG_LEVEL": "info"}


def declared(argv: tuple[str, ...] = ARGV, env: dict[str, str] = ENV) -> InitData:
    """What `sealed measure` computes for a worker started with `argv` in `env`."""
    return init_data_for(IMAGE, argv, env, parse(list(argv))[1], hashlib.sha256(AGENT_POLICY).hexdigest())


GOOD = declared()
NOW = dt.datetime.now(dt.UTC)


def changed_arg(old: str, new: str) -> InitData:
    return declared(tuple(new if a == old else a for a in ARGV))


@dataclasses.dataclass(frozen=True)
class Launch:
    """How the fake guest was launched: its init-data and the platform conditions."""

    init: InitData = GOOD
    debug: bool = False
    vmpl: int = 0
    migrate_ma: bool = False
    out_of_date: bool = False  # REPORTED_TCB below COMMITTED_TCB


# name, launch, TEEs, reason in the broker's audit log, violation at the client
CASES: list[tuple[str, Launch, tuple[str, ...], str, str]] = [
    ("another-image-digest",
     Launch(dataclasses.replace(GOOD, image="registry.sealed.example/sealed-worker@sha256:" + "cd" * 32)),
     ("snp", "tdx"), "workload identity", "workload identity"),
    ("one-changed-argument", Launch(changed_arg("16", "64")), ("snp", "tdx"), "workload identity",
     "workload identity"),
    ("changed-env-var", Launch(declared(env={**ENV, "PYTHONHASHSEED": "1"})),
     ("snp", "tdx"), "workload identity", "workload identity"),
    ("unsafe-switch", Launch(declared((*ARGV, "--unsafe-no-tenant-policy"))),
     ("snp", "tdx"), "workload identity", "workload identity"),
    ("another-broker-url", Launch(changed_arg(BROKER_URL, "https://operator.example")), ("snp", "tdx"),
     "workload identity", "workload identity"),
    ("older-tenant-policy-floor", Launch(changed_arg("3", "1")),
     ("snp", "tdx"), "workload identity", "workload identity"),
    ("debug-guest", Launch(debug=True), ("snp", "tdx"), "worker runs in debug mode", "debug mode is on"),
    ("vmpl-1", Launch(vmpl=1), ("snp",), "VMPL above 0", "VMPL 1"),
    ("migration-agent", Launch(migrate_ma=True), ("snp",), "migration agent", "migration agent"),
    ("tcb-out-of-date", Launch(out_of_date=True), ("snp",), "TCB status is not acceptable",
     "TCB status 'OutOfDate'"),
]
ROWS = [(f"{name}-{tee}", launch, tee, reason, violation)
        for name, launch, tees, reason, violation in CASES for tee in tees]
CLIENT_POLICY = AppraisalPolicy(
    allowed_tee=frozenset({"snp", "tdx"}), allowed_measurements=frozenset({SNP_MEASUREMENT.hex(), TDX_MR_TD.hex()}),
    allowed_workload_ids=frozenset({GOOD.host_data().hex(), GOOD.mr_config_id().hex()}))


def evidence(p: FakePlatform, tee: str, launch: Launch, rt: RuntimeData) -> EvidenceBundle:
    data = expected_report_data(rt, ())
    if tee == "snp":
        committed = TcbVersion(bl=3, tee=0, snp=9, ucode=115) if launch.out_of_date else None
        report = p.snp_report(data, launch.vmpl, host_data=launch.init.host_data(), debug=launch.debug,
                              migrate_ma=launch.migrate_ma, committed_tcb=committed)
        return EvidenceBundle("snp", report, rt, (p.vcek,))
    return EvidenceBundle("tdx", p.tdx_quote(data, mr_config_id=launch.init.mr_config_id(), debug=launch.debug),
                          rt)


@dataclasses.dataclass(frozen=True)
class Broker:
    url: str
    home: Home
    platform: FakePlatform


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("workload-id")
    platform = FakePlatform.create(root / "platform", gpus=1, now=NOW)
    home = Home(root / "home")
    package_for_demo(home, random_checkpoint("tiny", "cpu", torch.float32))
    prepare_demo(home, log=lambda *_: None)
    ledger = local_ledger(home.broker, local_broker_keys(home).master_key)
    current = PolicyStore(home.broker, ledger).get(REF)
    store_demo_release_policy(home, ledger, ReleasePolicy(
        policy_id=current.policy_id, version=current.version + 1, tenant=DEMO_TENANT, model=DEMO_MODEL,
        allowed_tee=frozenset({"snp", "tdx"}), allowed_measurements=frozenset({SNP_MEASUREMENT.hex(), TDX_MR_TD.hex()}),
        required_signer=current.required_signer,
        allowed_workload_ids=frozenset({GOOD.host_data().hex(), GOOD.mr_config_id().hex()}),
        acceptable_tcb_status=frozenset({"UpToDate"})))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "key_broker", "--data-dir", str(home.broker), "--port", str(port),
         "--roots-dir", str(platform.root / "roots"), "--collateral-dir", str(platform.root / "collateral"),
         "--collateral-offline",
         # The broker's own (simulated) TEE seals its keys, as `sealed up` runs it.
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
    """The client's side: its own verifier (pinned roots, imported collateral) and its policy."""
    store = CollateralStore(CollateralConfig(p.root / "collateral", offline=True))
    trust = VerifierTrust(roots_dir=p.root / "roots", snp_fetcher=store.snp, tdx_collateral=store.tdx)
    rt = RuntimeData(nonce=os.urandom(32), hpke_public_key=os.urandom(32))
    result = verify_bundle(evidence(p, tee, launch, rt), expected_nonce=rt.nonce, now=NOW, trust=trust)
    appraise(result.token_claims(), CLIENT_POLICY)


def release(b: Broker, make: Callable[[RuntimeData], EvidenceBundle]) -> bytes:
    with httpx.Client(base_url=b.url, timeout=30) as client:
        return obtain_data_key(client, REF, make_bundle=make).data_key


@pytest.mark.parametrize("tee", ["snp", "tdx"])
def test_the_declared_workload_gets_the_key_and_passes_the_client(broker: Broker, tee: str) -> None:
    """The control: nothing but the row's one change differs in the table below."""
    assert len(release(broker, lambda rt: evidence(broker.platform, tee, Launch(), rt))) == 32
    client_verifies(broker.platform, tee, Launch())
    allowed = [r for r in audit_records(broker.home) if r["action"] == "attest" and r["decision"] == "allow"]
    assert allowed[-1]["metadata"]["workload_id"] == GOOD.digest_for(tee).hex()


@pytest.mark.parametrize(("name", "launch", "tee", "reason", "violation"), ROWS, ids=[r[0] for r in ROWS])
def test_refused_at_the_broker_and_at_the_client(broker: Broker, name: str, launch: Launch, tee: str, reason: str,
                                                 violation: str) -> None:
    before = len(audit_records(broker.home))
    with pytest.raises(BrokerRefused):
        release(broker, lambda rt: evidence(broker.platform, tee, launch, rt))
    records = audit_records(broker.home)[before:]
    assert [(r["action"], r["decision"]) for r in records] == [("attest", "deny")], records
    assert reason in records[0]["reason"], records[0]["reason"]
    with pytest.raises(PolicyViolation) as refused:
        client_verifies(broker.platform, tee, launch)
    assert any(violation in v for v in refused.value.violations), refused.value.violations


def test_the_worker_process_refuses_arguments_its_init_data_does_not_name(broker: Broker, tmp_path: Path) -> None:
    """The host launched the guest with GOOD but starts the worker with another broker URL: the
    real worker (on the fake SNP) exits before it attests, with EXIT_CONFIG_ERROR and the reason."""
    init = tmp_path / "init-data.json"
    init.write_bytes(GOOD.encode())
    argv = [a if a != BROKER_URL else "https://operator.example" for a in ARGV]
    env = {k: v for k, v in os.environ.items() if not k.startswith(MEASURED_ENV_PREFIXES)}
    env |= ENV  # exactly the declared environment: the arguments are the one difference
    run = subprocess.run(
        [sys.executable, "-m", "tests.enclave_worker.fake_tee_worker", "--platform", str(broker.platform.root),
         "--cpu", "snp", "--launch-init-data", str(init), *argv, "--init-data", str(init)],
        capture_output=True, text=True, timeout=120, env=env, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == EXIT_CONFIG_ERROR, run.stderr[-2000:]
    line = next(x for x in run.stderr.splitlines() if "refusing to start" in x)
    assert line.endswith("WorkloadMismatch: arguments differ from the init-data's (first at argument 1, "
                         "option --broker-url)"), line
    assert "operator.example" not in run.stderr  # a value is never echoed
