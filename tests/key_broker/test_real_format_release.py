"""Key release with real-format evidence signed under test roots: an AMD SEV-SNP report (VCEK ->
ASK -> ARK, test PKI) plus NVIDIA Hopper SPDM evidence with the same nonce (test device PKI).

Most tests run the broker with an evidence verifier composed from the snp and nvgpu packages'
public APIs, in the same steps as verify_bundle; the last one goes through the broker's default
verifier (attestation.verifier.verify_bundle) end to end.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation import nvgpu, snp
from attestation.bundle import EvidenceBundle, GpuEvidence, RuntimeData, check_binding, expected_report_data
from attestation.errors import FreshnessError, UnsupportedError
from attestation.snp.tcb import POLICY_DEBUG, Product
from attestation.verifier import AttestationResult
from protocol.broker.errors import BrokerRefused
from protocol.model_ref import ModelRef
from protocol.package.signing import signer_identity
from sealed_fakes import nvgpu_pki as gpu_pki
from sealed_fakes.snp_pki import AmdTestPki, generate_keys, make_pki, sign_report, template_report

Harness = Any
MEASUREMENT = bytes(range(48))
CHIP = bytes(range(64))
SIGNER = signer_identity(Ed25519PrivateKey.from_private_bytes(bytes(range(32))).public_key())  # as conftest


@dataclasses.dataclass
class RealFormatPlatform:
    pki: AmdTestPki
    roots_dir: Path
    gpu_chain: list[x509.Certificate]
    gpu_key: Any
    other_pki: AmdTestPki

    def verifier(self) -> Callable[[EvidenceBundle, bytes, dt.datetime], AttestationResult]:
        def verify(bundle: EvidenceBundle, nonce: bytes, now: dt.datetime) -> AttestationResult:
            if bundle.runtime_data.nonce != nonce:
                raise FreshnessError("evidence carries a different nonce than the one issued")
            if bundle.tee != "snp":
                raise UnsupportedError(f"this verifier accepts SNP evidence only, not {bundle.tee!r}")
            cpu = snp.to_claims(
                snp.verify_report(
                    bundle.cpu_evidence,
                    now=now,
                    certs=list(bundle.cpu_certificates),
                    roots_dir=self.roots_dir,
                )
            )
            check_binding(cpu.report_data, bundle)
            gpus: tuple = ()
            if bundle.gpus:
                verified = nvgpu.verify_gpu_list(
                    [(g.evidence, g.certificate_chain) for g in bundle.gpus],
                    nonce=nonce,
                    now=now,
                    options=nvgpu.GpuVerifyOptions(roots=(self.gpu_chain[-1],)),
                )
                gpus = tuple(nvgpu.to_claims(v, i) for i, v in enumerate(verified))
            return AttestationResult(
                cpu=cpu,
                gpus=gpus,
                nonce=nonce,
                hpke_public_key=bundle.runtime_data.hpke_public_key,
                evidence_digest=bundle.digest(),
            )

        return verify

    def bundle(
        self,
        runtime: RuntimeData,
        *,
        measurement: bytes = MEASUREMENT,
        debug: bool = False,
        gpu_nonce: bytes | None = None,
        with_gpu: bool = True,
        pki: AmdTestPki | None = None,
        bind_gpus: tuple[GpuEvidence, ...] | None = None,
    ) -> EvidenceBundle:
        pki = pki or self.pki
        gpus: tuple[GpuEvidence, ...] = ()
        if with_gpu:
            ev = gpu_pki.make_evidence(gpu_pki.EvidenceSpec(nonce=gpu_nonce or runtime.nonce), self.gpu_key)
            gpus = (GpuEvidence(arch="hopper", evidence=ev, certificate_chain=gpu_pki.pem(self.gpu_chain)),)
        report = template_report(
            3,
            Product.MILAN,
            measurement=measurement,
            chip_id=CHIP,
            report_data=expected_report_data(runtime, gpus if bind_gpus is None else bind_gpus),
        )
        if debug:
            report = dataclasses.replace(report, policy=report.policy | POLICY_DEBUG)
        vek = pki.make_vek(report.tcb("reported", Product.MILAN), CHIP)
        return EvidenceBundle(
            tee="snp",
            cpu_evidence=sign_report(report, pki.keys.vek),
            runtime_data=runtime,
            cpu_certificates=(vek.public_bytes(serialization.Encoding.DER),),
            gpus=gpus,
        )


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> RealFormatPlatform:
    # 2048-bit test roots keep key generation fast; the chain checks are the same as for 4096.
    pki = make_pki(generate_keys(2048), Product.MILAN)
    roots = pki.write_roots(tmp_path_factory.mktemp("snp-roots"))
    chain, key = gpu_pki.make_chain()
    return RealFormatPlatform(pki, roots, chain, key, make_pki(generate_keys(2048), Product.MILAN))


@pytest.fixture()
def real(harness_factory: Any, platform: RealFormatPlatform) -> Harness:
    kb = harness_factory("real", verify=platform.verifier())
    kb.setup_tenant(
        "acme",
        allowed_tee=["snp"],
        unsafe_allow_simulated_tee=False,
        require_gpu_cc=True,
        min_tcb={"snp": 8, "ucode": 115},
    )
    return kb


def _obtain(kb: Harness, make: Callable[[RuntimeData], EvidenceBundle]) -> Any:
    from protocol.broker.client import obtain_data_key

    return obtain_data_key(kb.client, ModelRef("acme", "m", "v1"), make_bundle=make)


def test_snp_with_gpu_releases_when_every_condition_holds(real: Harness, platform: RealFormatPlatform) -> None:
    released = _obtain(real, platform.bundle)
    receipt = released.receipt["receipt"]
    assert receipt["tee"] == "snp" and receipt["insecure"] is False and receipt["measurement"] == MEASUREMENT.hex()
    assert len(released.data_key) == 32


REAL_REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("measurement not allowed", {"measurement": b"\x07" * 48}, "measurement is not in the allowed set"),
    ("debug guest", {"debug": True}, "debug mode"),
    ("GPU evidence for another nonce", {"gpu_nonce": b"\x09" * 32}, "GPU evidence nonce"),
    ("no GPU (CC required)", {"with_gpu": False}, "GPU confidential computing is off"),
    ("report under an unpinned AMD root", {"pki": "other"}, "ChainError"),
    ("REPORT_DATA binds other GPU evidence", {"bind_gpus": ()}, "REPORT_DATA does not bind"),
]


@pytest.mark.parametrize(("case", "kwargs", "reason"), REAL_REFUSALS, ids=[r[0] for r in REAL_REFUSALS])
def test_real_format_refusals(
    real: Harness, platform: RealFormatPlatform, case: str, kwargs: dict, reason: str
) -> None:
    if kwargs.get("pki") == "other":
        kwargs = {**kwargs, "pki": platform.other_pki}
    with pytest.raises(BrokerRefused):
        _obtain(real, lambda rt: platform.bundle(rt, **kwargs))
    assert reason in real.last_denial()["reason"], real.last_denial()


def test_tcb_floor_and_simulated_evidence_under_an_snp_policy(real: Harness, platform: RealFormatPlatform) -> None:
    real.put_policy(
        "acme",
        {
            "policy_id": "acme-m",
            "version": 2,
            "tenant": "acme",
            "model": "m",
            "allowed_tee": ["snp"],
            "allowed_measurements": [MEASUREMENT.hex()],
            "required_signer": SIGNER,
            "require_gpu_cc": True,
            "min_tcb": {"snp": 9},
        },
    )
    with pytest.raises(BrokerRefused):
        _obtain(real, platform.bundle)
    assert "below floor" in real.last_denial()["reason"]
    with pytest.raises(BrokerRefused):  # a simulated TEE cannot pass as SNP
        _obtain(real, lambda rt: real.bundle(rt))
    assert "UnsupportedError" in real.last_denial()["reason"]


def test_snp_release_through_the_default_verifier(harness_factory: Any, platform: RealFormatPlatform) -> None:
    """Once verify_bundle's SNP path is wired, the broker's own verifier must accept the same evidence."""
    kb = harness_factory("default-verifier", roots_dir=platform.roots_dir)
    kb.setup_tenant("acme", allowed_tee=["snp"], unsafe_allow_simulated_tee=False)
    released = _obtain(kb, lambda rt: platform.bundle(rt, with_gpu=False))
    assert released.receipt["receipt"]["tee"] == "snp"
