"""#33 (broker side): a key lease follows the tenant's trust. Each renewal appraises the worker's
evidence again under the CURRENT release policy and the collateral held NOW; when that no longer
passes, the (MACed) answer is "revoked", the reason is in the broker's audit log only.

Cases: unchanged -> renewed; the tenant tightens its release policy -> revoked (at once, even for a
renewal held open); a CRL revoking the worker's chip (fake SNP hardware) is imported -> revoked;
renewal evidence that is not the token's -> refused. Before #33 the first three renewed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData, channel_binding, expected_report_data
from protocol.broker.client import ReleasedKey, WorkerIdentity, obtain_data_key
from protocol.model_ref import ModelRef
from sealed_fakes.platform import SNP_MEASUREMENT, FakePlatform
from tests.key_broker.conftest import MEASUREMENT, SIGNER, Clock, Harness
from tests.security.test_leases import renew, signed_body

SCOPE = {"tenant": "acme", "model": "m", "version": "v1"}


class SteppingClock(Clock):
    """Wall time (lease requests carry the worker's), plus whatever a test advances it by."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = dt.timedelta()

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += dt.timedelta(seconds=seconds)


@pytest.fixture()
def clock() -> SteppingClock:
    return SteppingClock()


@pytest.fixture()
def kb(tmp_path: Path, clock: SteppingClock) -> Iterator[Harness]:
    harness = Harness(tmp_path / "kb", clock)
    yield harness
    harness.close()


def attested_worker(kb: Harness, make_bundle: Any = None) -> tuple[ReleasedKey, WorkerIdentity]:
    identity = WorkerIdentity(Ed25519PrivateKey.generate(), b"spki-der")
    released = obtain_data_key(kb.client, ModelRef(**SCOPE), make_bundle=make_bundle or kb.bundle,
                               channel_binding=channel_binding(identity.tls_spki, identity.public_key))
    return released, identity


def policy(version: int, measurements: list[str], **extra: Any) -> dict[str, Any]:
    return {"policy_id": "acme-m", "version": version, "tenant": "acme", "model": "m",
            "allowed_tee": ["sim"], "allowed_measurements": measurements, "required_signer": SIGNER,
            "unsafe_allow_simulated_tee": True, **extra}


def wait_until_held(kb: Harness) -> None:
    """Until a renewal is held (it appraised the worker once and now waits for a change)."""
    deadline = time.monotonic() + 60  # a hang guard only
    while not kb.app.state.leases.changes._waiters:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def lease_denials(kb: Harness) -> list[dict[str, Any]]:
    return [e for e in kb.audit_entries() if e["action"] == "lease" and e["decision"] == "deny"]


def test_an_unchanged_trust_renews(kb: Harness) -> None:
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    for seq in (1, 2, 3):
        assert renew(kb, released, identity, seq) == "active"
    # A new version of the policy that still admits the worker changes nothing.
    kb.put_policy("acme", policy(2, [MEASUREMENT.hex(), "ab" * 48]))
    assert renew(kb, released, identity, 4) == "active"
    assert lease_denials(kb) == []


def test_a_tightened_release_policy_revokes_the_lease(kb: Harness) -> None:
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    assert renew(kb, released, identity, 1) == "active"
    kb.put_policy("acme", policy(2, ["ab" * 48]))  # the worker's measurement is no longer allowed
    assert renew(kb, released, identity, 2) == "revoked"  # the MAC verified: the worker wipes at once
    (denial,) = lease_denials(kb)
    assert denial["reason"].startswith("re-appraisal:") and "measurement" in denial["reason"]
    assert denial["metadata"]["policy_version"] == 2
    # One opaque answer, whatever is asked again: "revoked", lease 0; nothing says why.
    r = kb.client.post("/v1/lease", json=signed_body(released, identity, 3))
    assert r.status_code == 200 and r.json()["status"] == "revoked" and r.json()["lease_s"] == 0
    assert set(r.json()) == {"token_id", "seq", "status", "lease_s", "mac"}


def test_a_held_renewal_answers_revoked_as_soon_as_the_policy_is_tightened(kb: Harness) -> None:
    """The renewal is held for an hour and never re-reads by itself: only the policy PUT's push
    can make it answer (so no test times it)."""
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    assert renew(kb, released, identity, 1) == "active"
    book = kb.app.state.leases
    book.settings = dataclasses.replace(book.settings, max_wait_s=3600.0, recheck_s=3600.0, reappraise_s=3600.0)
    result: dict[str, str] = {}
    thread = threading.Thread(target=lambda: result.update(status=renew(kb, released, identity, 2, wait_s=3600.0)),
                              daemon=True)
    thread.start()
    wait_until_held(kb)
    assert "status" not in result  # held open while the worker is still trusted
    kb.put_policy("acme", policy(2, [MEASUREMENT.hex()], allow_debug=False, min_tcb={"sim": 2}))
    thread.join(60)  # a hang guard: without the push it would answer in an hour
    assert not thread.is_alive() and result["status"] == "revoked"
    assert "tcb" in lease_denials(kb)[0]["reason"].lower()


def test_renewal_evidence_must_be_the_tokens(kb: Harness) -> None:
    kb.setup_tenant("acme")
    released, identity = attested_worker(kb)
    other = kb.bundle(RuntimeData(bytes(32), bytes(32)))
    for evidence in (None, other.to_json(), {"tee": "sim"}):
        body = {**signed_body(released, identity, 1 + len(lease_denials(kb))), "evidence": evidence}
        r = kb.client.post("/v1/lease", json=body)
        assert r.status_code == 403 and r.json()["error"]["type"] == "refused"
    assert len(lease_denials(kb)) == 3


# --- a CRL that revokes the worker's chip, on fake SNP hardware ------------------------------------

@pytest.fixture()
def snp(tmp_path: Path, clock: SteppingClock) -> Iterator[tuple[Harness, FakePlatform]]:
    platform = FakePlatform.create(tmp_path / "platform", gpus=1, now=clock())
    harness = Harness(tmp_path / "kb", clock, roots_dir=platform.root / "roots",
                      collateral_dir=platform.root / "collateral", collateral_offline=True)
    yield harness, platform
    harness.close()


def snp_evidence(p: FakePlatform) -> Any:
    def make(rt: RuntimeData) -> EvidenceBundle:
        return EvidenceBundle("snp", p.snp_report(expected_report_data(rt, ())), rt, (p.vcek,), ())
    return make


def snp_tenant(kb: Harness) -> None:
    kb.setup_tenant("acme", measurements=(SNP_MEASUREMENT.hex(),), allowed_tee=["snp"],
                    unsafe_allow_simulated_tee=False)


def test_a_crl_revoking_the_workers_chip_revokes_the_lease(snp: tuple[Harness, FakePlatform],
                                                           clock: SteppingClock) -> None:
    kb, platform = snp
    snp_tenant(kb)
    released, identity = attested_worker(kb, snp_evidence(platform))
    assert renew(kb, released, identity, 1) == "active"
    platform.write_collateral(clock(), revoked_vcek=True)  # `sealed attest collateral import` of a new CRL
    assert renew(kb, released, identity, 2) == "revoked"
    (denial,) = lease_denials(kb)
    assert "RevokedError" in denial["reason"], denial["reason"]


def test_a_held_renewal_sees_a_crl_imported_by_another_process(snp: tuple[Harness, FakePlatform],
                                                              clock: SteppingClock) -> None:
    """No push reaches the broker when a CRL is imported into its collateral directory: a held
    renewal appraises again every `reappraise_s` of the broker's (injected) clock."""
    kb, platform = snp
    snp_tenant(kb)
    released, identity = attested_worker(kb, snp_evidence(platform))
    assert renew(kb, released, identity, 1) == "active"
    book = kb.app.state.leases
    book.settings = dataclasses.replace(book.settings, max_wait_s=3600.0, recheck_s=0.05, reappraise_s=10.0)
    result: dict[str, str] = {}
    thread = threading.Thread(target=lambda: result.update(status=renew(kb, released, identity, 2, wait_s=3600.0)),
                              daemon=True)
    thread.start()
    wait_until_held(kb)  # appraised once (the CRL not yet imported), now waiting
    platform.write_collateral(clock(), revoked_vcek=True)
    time.sleep(0.5)  # several re-reads (recheck_s)
    assert "status" not in result  # not yet: the broker's clock has not moved by reappraise_s
    clock.advance(10.0)
    thread.join(60)  # a hang guard: the hold itself lasts an hour
    assert not thread.is_alive() and result["status"] == "revoked"
    assert "RevokedError" in lease_denials(kb)[0]["reason"]
