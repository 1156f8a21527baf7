"""The key broker's workload identity on (fake) SEV-SNP: its init-data names its image, arguments,
environment and measured configuration; its hardware reports the digest; workers and clients that
pin it refuse a broker launched with any other (issue #32 on #33's workload identity).

The fake sits at the hardware seam only: /dev/sev-guest's ioctl (devtools/sealed_fakes/fake_sev_guest.py,
reports signed by the test PKI playing AMD, the HOST_DATA the host launched the guest with). The
broker is the real app (key_broker.app.create_app, its settings from its own command line), its
start check is key_broker.workload_check, and the relying parties are the worker's
(enclave_worker.broker_auth.authenticate_broker) and the client's (sealed_client.broker_pin).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import enclave_worker.broker_auth as broker_auth
from attestation.broker_initdata import BrokerInitData
from attestation.collateral import CollateralConfig, CollateralStore
from attestation.errors import BrokerIdentityError
from attestation.snp.collect import encode_cert_table
from attestation.verifier import VerifierTrust
from enclave_worker.settings import WorkerSettings
from key_broker.__main__ import parse, settings_from
from key_broker.app import create_app
from key_broker.workload_check import broker_init_data_for, check_broker_workload
from protocol.broker.errors import BrokerNotAuthenticated
from sealed_client.broker_pin import BrokerPin, attested_broker_jwks
from sealed_fakes.fake_sev_guest import FakeSevGuest
from sealed_fakes.platform import SNP_MEASUREMENT, FakePlatform

NOW = dt.datetime.now(dt.UTC)
IMAGE = "registry.example.com/sealed/broker@sha256:" + "bc" * 32
ENV = {"PYTHONUNBUFFERED": "1", "PATH": "/usr/bin", "SEALED_BROKER_ADMIN_TOKEN": "not-measured-" + "x" * 32}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> FakePlatform:
    made = FakePlatform.create(tmp_path_factory.mktemp("platform"), gpus=1, now=NOW)
    made.write_collateral(NOW)
    return made


def trust(platform: FakePlatform) -> VerifierTrust:
    """The relying parties' verifier: the test PKI's roots, imported collateral (no network)."""
    store = CollateralStore(CollateralConfig(platform.root / "collateral", offline=True))
    return VerifierTrust(roots_dir=platform.root / "roots", snp_fetcher=store.snp, tdx_collateral=store.tdx)


def broker_argv(tmp: Path, *extra: str) -> list[str]:
    return ["--data-dir", str(tmp / "data"), "--tee", "snp", "--keystore", "local", *extra]


def declared(tmp: Path, *extra: str, image: str = IMAGE) -> BrokerInitData:
    """The init-data of a broker started with these arguments (what `sealed measure --broker` computes)."""
    argv = broker_argv(tmp, *extra)
    return broker_init_data_for(image, argv, ENV, settings_from(parse(argv), {}))


@dataclass
class Launched:
    client: TestClient
    argv: list[str]


@pytest.fixture()
def launch(platform: FakePlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """launch(host_data, argv, init_data_file): the host launches the fake SNP guest with `host_data`;
    the broker runs with `argv`, reading `init_data_file` (None: none); `check` its start check."""
    made: list[TestClient] = []

    def start(host_data: bytes, argv: list[str], init: BrokerInitData | None, check: bool = True) -> Launched:
        device = FakeSevGuest(tmp_path / f"dev{len(made)}" / "sev-guest",
                              lambda data, vmpl: platform.snp_report(data, vmpl, host_data=host_data),
                              encode_cert_table({"vcek": platform.vcek}), launch_measurement=SNP_MEASUREMENT)
        monkeypatch.setattr(fcntl, "ioctl", device.router(fcntl.ioctl))
        full = [*argv, "--tsm-dir", str(tmp_path / "no-configfs"), "--sev-guest-device", str(device.device)]
        if not (Path(argv[argv.index("--data-dir") + 1]) / "broker-keys.sealed").exists():
            full.append("--init")  # a fresh broker: not measured, so the same init-data starts it
        if init is not None:
            path = tmp_path / f"init-data-{len(made)}.json"
            path.write_bytes(init.encode())
            full += ["--init-data", str(path)]
        settings = settings_from(parse(full), {})
        if check:
            check_broker_workload(settings, full, ENV)
        client = TestClient(create_app(settings))
        made.append(client)
        return Launched(client, full)

    yield start
    for client in made:
        client.close()


def worker_settings(tmp: Path, pinned: str) -> WorkerSettings:
    return WorkerSettings(broker_url="http://testserver", package_dir=tmp, tenant="acme", model="m", version="v1",
                          tee="snp", broker_tee="snp", broker_measurements=(SNP_MEASUREMENT.hex(),),
                          broker_workload_ids=(pinned,))


def network(launched: Launched) -> httpx.Client:
    """The worker's HTTP client; the network relays each request to the broker app unchanged."""
    def relay(request: httpx.Request) -> httpx.Response:
        answer = launched.client.request(request.method, request.url.path, content=request.content,
                                         headers={"content-type": "application/json"})
        return httpx.Response(answer.status_code, content=answer.content, headers={"content-type": "application/json"})

    return httpx.Client(base_url="http://broker.test", transport=httpx.MockTransport(relay))


def worker_accepts(launched: Launched, platform: FakePlatform, tmp: Path, pinned: str,
                   monkeypatch: pytest.MonkeyPatch) -> str:
    """The worker's own check (the test PKI stands in for the packaged AMD roots)."""
    monkeypatch.setattr(broker_auth, "broker_trust", lambda _settings: trust(platform))
    with network(launched) as client:
        return broker_auth.authenticate_broker(worker_settings(tmp, pinned), client, now=NOW).workload_id


def client_accepts(launched: Launched, platform: FakePlatform, pinned: str) -> None:
    pin = BrokerPin(measurements=frozenset({SNP_MEASUREMENT.hex()}), tee=frozenset({"snp"}),
                    workload_ids=frozenset({pinned}))
    nonce = secrets.token_bytes(32)
    answer = launched.client.post("/v1/broker/attestation", json={"nonce": nonce.hex()})
    assert answer.status_code == 200, answer.text
    attested_broker_jwks(pin, answer.json(), nonce=nonce, issuer="sealed-key-broker", trust=trust(platform), now=NOW)


def test_the_declared_broker_is_accepted_by_the_worker_and_the_client(
        launch: Any, platform: FakePlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = declared(tmp_path)
    pinned = ours.digest_for("snp").hex()
    broker = launch(ours.digest_for("snp"), broker_argv(tmp_path), ours)
    assert worker_accepts(broker, platform, tmp_path, pinned, monkeypatch) == pinned
    client_accepts(broker, platform, pinned)


def _other_image(tmp: Path) -> tuple[BrokerInitData, list[str]]:
    return declared(tmp, image=IMAGE.replace("bc" * 32, "de" * 32)), broker_argv(tmp)


def _changed_argument(tmp: Path) -> tuple[BrokerInitData, list[str]]:
    return declared(tmp, "--rate-limit-per-minute", "100000"), broker_argv(tmp, "--rate-limit-per-minute", "100000")


def _unsafe_switch(tmp: Path) -> tuple[BrokerInitData, list[str]]:
    return declared(tmp, "--unsafe-dev-mode"), broker_argv(tmp, "--unsafe-dev-mode")


# Each: a broker the operator launches honestly described by its own init-data (it passes its own
# start check), so its hardware reports that document's digest, which is not the pinned one.
ANOTHER_BROKER = {"another-image-digest": _other_image, "a-changed-argument": _changed_argument,
                  "an-unsafe-switch": _unsafe_switch}


@pytest.mark.parametrize("case", sorted(ANOTHER_BROKER))
def test_another_broker_workload_is_refused_by_the_worker_and_the_client(
        case: str, launch: Any, platform: FakePlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = declared(tmp_path).digest_for("snp").hex()
    theirs, argv = ANOTHER_BROKER[case](tmp_path)
    broker = launch(theirs.digest_for("snp"), argv, theirs)
    with pytest.raises(BrokerNotAuthenticated) as refused:
        worker_accepts(broker, platform, tmp_path, pinned, monkeypatch)
    assert isinstance(refused.value.__cause__, BrokerIdentityError)
    assert "workload id" in str(refused.value.__cause__) and "not a pinned one" in str(refused.value.__cause__)
    with pytest.raises(BrokerIdentityError, match="not a pinned one"):
        client_accepts(broker, platform, pinned)


def test_a_broker_without_init_data_is_refused_by_the_worker_and_the_client(
        launch: Any, platform: FakePlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker build that skips the start check, launched with no init-data (HOST_DATA all zeros)."""
    pinned = declared(tmp_path).digest_for("snp").hex()
    broker = launch(bytes(32), broker_argv(tmp_path), None, check=False)
    with pytest.raises(BrokerNotAuthenticated) as refused:
        worker_accepts(broker, platform, tmp_path, pinned, monkeypatch)
    assert "carries no init-data" in str(refused.value.__cause__)
    with pytest.raises(BrokerIdentityError, match="carries no init-data"):
        client_accepts(broker, platform, pinned)


def test_a_measurement_pin_alone_accepts_any_broker_image(
        launch: Any, platform: FakePlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the workload id is pinned: without it (all that existed before), another image passes."""
    theirs, argv = _other_image(tmp_path)
    broker = launch(theirs.digest_for("snp"), argv, theirs)
    monkeypatch.setattr(broker_auth, "broker_trust", lambda _settings: trust(platform))
    settings = replace(worker_settings(tmp_path, "00" * 32), broker_workload_ids=())
    with network(broker) as client:
        assert broker_auth.authenticate_broker(settings, client, now=NOW).workload_id == theirs.digest_for("snp").hex()


def test_a_broker_launched_with_other_init_data_hands_out_no_evidence(launch: Any, tmp_path: Path) -> None:
    """The host launches the broker with another document than the file it hands it: the broker
    checks its own report before answering, and nothing leaves it."""
    ours = declared(tmp_path)
    theirs, _ = _other_image(tmp_path)
    broker = launch(theirs.digest_for("snp"), broker_argv(tmp_path), ours)
    answer = broker.client.post("/v1/broker/attestation", json={"nonce": secrets.token_hex(32)})
    assert answer.status_code == 503


def test_sealed_verify_broker_prints_the_workload_id(
        launch: Any, platform: FakePlatform, tmp_path: Path) -> None:
    from api.cli.broker_verify import report
    from attestation.broker_identity import verify_broker_attestation

    ours = declared(tmp_path)
    pinned = ours.digest_for("snp").hex()
    broker = launch(ours.digest_for("snp"), broker_argv(tmp_path), ours)
    nonce = secrets.token_bytes(32)
    answer = broker.client.post("/v1/broker/attestation", json={"nonce": nonce.hex()}).json()
    verified = verify_broker_attestation(answer, nonce=nonce, now=NOW, trust=trust(platform),
                                         allowed_measurements=[SNP_MEASUREMENT.hex()], allowed_workload_ids=[pinned])
    assert f"  workload id   {pinned} (HOST_DATA: the broker's init-data; pinned)" in report(verified, nonce, True)
    assert any("NOT pinned" in line for line in report(verified, nonce, False))


def test_the_simulated_tee_has_no_workload_id_to_pin(tmp_path: Path) -> None:
    from attestation.errors import PolicyViolation

    with pytest.raises(PolicyViolation, match="simulated broker has no workload id"):
        BrokerPin.from_dict({"measurements": ["ab" * 48], "tee": "sim", "workload_ids": ["cd" * 32]})
    with pytest.raises(ValueError, match="simulated TEE carries no init-data digest"):
        replace(worker_settings(tmp_path, "cd" * 32), broker_tee="sim")
