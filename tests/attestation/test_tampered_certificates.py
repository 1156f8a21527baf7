"""Damaged certificates in real evidence (an invalid EC point, a wrong ASN.1 tag in the issuer, a
flipped byte in an NVIDIA leaf) are refused by every TEE's verifier with a typed error.

These inputs once crashed `sealed attest verify` (ValueError from cryptography's lazy decoding, deep
in the chain walk): the certificate loaders now decode every field at the boundary."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from attestation.cli_request import VerifyRequest
from attestation.errors import AttestationError
from attestation.x509chain import load_der_or_pem, load_pem_chain
from sealed_fakes.tampered import TamperedCase, tampered_cases

_VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "attestation"
CASES = tampered_cases(_VECTORS)


def _verify(case: TamperedCase) -> dict:
    module = importlib.import_module(f"attestation.{case.tee}.cli")
    request = VerifyRequest(case.evidence, list(case.certs), [], None, None, case.at, None, False)
    return module.verify_for_cli(request)  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_tampered_certificate_is_refused_with_a_typed_error(case: TamperedCase) -> None:
    with pytest.raises(case.refusal) as refused:
        _verify(case)
    assert isinstance(refused.value, AttestationError) and str(refused.value)


def test_the_untampered_vectors_verify(testvectors: Path) -> None:
    """The same inputs undamaged verify, so each refusal above is the damage's doing."""
    import dataclasses

    from sealed_fakes import tampered

    originals = {
        "snp": ((testvectors / "snp" / "gosevguest_milan_vcek.der").read_bytes(),),
        "nvgpu": ((testvectors / "nvgpu" / "nvtrust_hopperCertChain.pem").read_bytes(),),
    }
    for case in CASES:
        if case.name == "nvgpu-8gpu-json-leaf-byte-100":
            evidence = (testvectors / "nvgpu" / "nvtrust_ppcie_gpu_evidence_8gpu.json").read_bytes()
            _verify(dataclasses.replace(case, evidence=evidence))
        elif case.tee == "tdx":
            _verify(dataclasses.replace(case, evidence=(testvectors / "tdx" / "trustee_tdx_quote_4.dat").read_bytes()))
        else:
            _verify(dataclasses.replace(case, certs=originals[case.tee]))
    assert tampered.flip_byte(b"\0" * 101)[100] == 1


def test_a_loaded_certificate_has_every_field_decoded(testvectors: Path) -> None:
    """The boundary itself: the loaders refuse what cryptography would only reject on first access."""
    from attestation.errors import ParseError
    from sealed_fakes.tampered import invalid_ec_point, pem_chain_with_leaf, wrong_issuer_tag

    vcek = (testvectors / "snp" / "gosevguest_milan_vcek.der").read_bytes()
    for damaged in (invalid_ec_point(vcek), wrong_issuer_tag(vcek)):
        with pytest.raises(ParseError, match="malformed certificate"):
            load_der_or_pem(damaged)
    chain = (testvectors / "nvgpu" / "nvtrust_hopperCertChain.pem").read_bytes()
    with pytest.raises(ParseError, match="malformed certificate"):
        load_pem_chain(pem_chain_with_leaf(chain, wrong_issuer_tag))
