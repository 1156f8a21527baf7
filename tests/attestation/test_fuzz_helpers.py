"""Hypothesis over the smaller parsers too: the SEV-SNP certificate table, VCEK/VLEK certificates
and their AMD extensions, the PCK certificate's SGX extensions, certificate and CRL loading, the CC
event log, NVIDIA's JSON evidence, and each TEE's `verify_for_cli` over mutated real vectors.
Only typed errors come out."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import json
from pathlib import Path

from cryptography.hazmat.primitives.serialization import Encoding
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attestation.cli_request import VerifyRequest
from attestation.errors import AttestationError
from attestation.snp.certs import parse_vek
from attestation.snp.collect import encode_cert_table, parse_cert_table
from attestation.tdx.eventlog import ccel_log_length, parse_cc_event_log, replay_rtmrs
from attestation.tdx.pck import parse_sgx_extensions
from attestation.x509chain import check_crl, load_crl, load_der_or_pem, load_pem_chain, load_pinned_roots, verify_chain
from tests.fuzzing import DEEP_JSON, budget, mutated

FUZZ = settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALID_TABLE = encode_cert_table({"vcek": b"v" * 40, "ask": b"a" * 7, "ark": b"r" * 3})


def mutations(seed: bytes) -> st.SearchStrategy[bytes]:
    """Arbitrary bytes, and the seed with random bytes overwritten or cut (to reach deep code)."""
    edits = st.lists(st.tuples(st.integers(0, len(seed) - 1), st.integers(0, 255)), max_size=8)
    mutated = st.builds(lambda e, cut: _apply(seed, e)[:cut], edits, st.integers(0, len(seed)))
    return st.one_of(st.binary(max_size=512), mutated)


def _apply(seed: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(seed)
    for offset, value in edits:
        out[offset] = value
    return bytes(out)


@FUZZ
@given(mutations(VALID_TABLE))
def test_fuzz_snp_cert_table(data: bytes) -> None:
    with contextlib.suppress(AttestationError):
        parse_cert_table(data)


def _test_vcek_der() -> bytes:
    from cryptography.hazmat.primitives import serialization

    from attestation.snp.tcb import Product
    from sealed_fakes.snp_pki import generate_keys, make_pki, template_report

    pki = make_pki(generate_keys(2048), Product.MILAN)
    report = template_report(3, Product.MILAN)
    vek = pki.make_vek(report.tcb("reported", Product.MILAN), report.chip_id)
    return vek.public_bytes(serialization.Encoding.DER)


@FUZZ
@given(mutations(_test_vcek_der()))
def test_fuzz_vek_certificate_parser(data: bytes) -> None:
    with contextlib.suppress(AttestationError):
        parse_vek(data)


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_pck_sgx_extension_parser(data: bytes) -> None:
    with contextlib.suppress(AttestationError):
        parse_sgx_extensions(data)


# --- Real vectors, mutated: certificates, CRLs, the CC event log, NVIDIA's JSON evidence, and the
# `verify_for_cli` entry points (which reach the chain walks and signature checks). Typed errors only.

_VECTORS = Path(__file__).resolve().parents[1] / "vectors"
_AT = _VECTORS / "attestation"
_NOW = dt.datetime(2025, 6, 1, tzinfo=dt.UTC)
_CERT_SEEDS = [
    (_AT / "snp" / "gosevguest_milan_vcek.der").read_bytes(),
    (_AT / "snp" / "trustee_test-vlek.der").read_bytes(),
    (_AT / "tdx" / "gotdxguest_tcbInfoIssuerChain.pem").read_bytes(),
    *(c.public_bytes(Encoding.DER)
      for c in load_pem_chain((_AT / "nvgpu" / "nvtrust_hopperCertChain.pem").read_bytes())[:2]),
]
_CRL_SEEDS = [(_AT / "tdx" / "gotdxguest_pckcrl").read_bytes(), (_AT / "tdx" / "gotdxguest_rootcrl.der").read_bytes()]


@budget(800)
@given(mutated(_CERT_SEEDS))
def test_fuzz_certificate_loaders_and_chain_checks(data: bytes) -> None:
    try:
        certs = load_pem_chain(data) if data.lstrip().startswith(b"-----BEGIN") else [load_der_or_pem(data)]
        verify_chain(certs, certs[-1:], _NOW)
    except AttestationError:
        pass
    with contextlib.suppress(AttestationError):
        parse_vek(data)


@budget(300)
@given(mutated(_CRL_SEEDS))
def test_fuzz_crl_loader(data: bytes) -> None:
    issuer = load_pinned_roots("intel_sgx_root_ca_gotdxguest.pem")[0]
    with contextlib.suppress(AttestationError):
        check_crl(load_crl(data), issuer, [issuer], _NOW)


# The log area is 256 KiB, nearly all 0xFF padding: keep every event and a little padding.
_CCEL = [(_VECTORS / "tdx-ccel" / "ccel_data.dat").read_bytes().rstrip(b"\xff") + b"\xff" * 64,
         (_VECTORS / "tdx-ccel" / "ccel_table.dat").read_bytes()]


@budget(800)
@given(mutated(_CCEL))
def test_fuzz_cc_event_log(data: bytes) -> None:
    with contextlib.suppress(AttestationError):
        replay_rtmrs(parse_cc_event_log(data))
    with contextlib.suppress(AttestationError):
        ccel_log_length(data)


def _cli_verify(tee: str, evidence: bytes, certs: list[bytes], at: dt.datetime) -> None:
    module = importlib.import_module(f"attestation.{tee}.cli")
    with contextlib.suppress(AttestationError):
        module.verify_for_cli(VerifyRequest(evidence, certs, [], None, None, at, None, False))
    with contextlib.suppress(AttestationError):
        module.inspect_for_cli(evidence)


_SNP_REPORT = (_AT / "snp" / "gosevguest_milan_attestation.bin").read_bytes()


@budget(300)
@given(mutated(_CERT_SEEDS[:1]))
def test_fuzz_snp_verify_with_a_mutated_vcek(vcek: bytes) -> None:
    _cli_verify("snp", _SNP_REPORT, [vcek], dt.datetime(2022, 9, 24, 1, tzinfo=dt.UTC))


_GPU_JSON = (_AT / "nvgpu" / "nvtrust_ppcie_gpu_evidence_8gpu.json").read_bytes()
_GPU_ONE = json.dumps(json.loads(_GPU_JSON)[:1]).encode()
_GPU_OBJECT = json.dumps({"arch": "HOPPER", "nonce": json.loads(_GPU_JSON)[0]["nonce"],
                          "evidence_list": json.loads(_GPU_JSON)[:1]}).encode()


@budget(400)
@given(mutated([_GPU_ONE, _GPU_OBJECT, *DEEP_JSON]))
def test_fuzz_nvgpu_json_evidence(document: bytes) -> None:
    _cli_verify("nvgpu", document, [], _NOW)


_GPU_CHAIN = (_AT / "nvgpu" / "nvtrust_hopperCertChain.pem").read_bytes()
_GPU_REPORT = (_AT / "nvgpu" / "nvtrust_hopperAttestationReport.bin").read_bytes()


@budget(100)
@given(mutated([_GPU_CHAIN]))
def test_fuzz_nvgpu_verify_with_a_mutated_chain(chain: bytes) -> None:
    _cli_verify("nvgpu", _GPU_REPORT, [chain], _NOW)
    _cli_verify("nvgpu", _GPU_REPORT.hex().encode()[:-1], [chain], _NOW)  # odd-length hex text


_QUOTE = (_AT / "tdx" / "trustee_tdx_quote_4.dat").read_bytes()


@budget(300)
@given(mutated([_QUOTE]))
def test_fuzz_tdx_verify_with_a_mutated_quote(quote: bytes) -> None:
    _cli_verify("tdx", quote, [], dt.datetime(2023, 7, 1, 1, tzinfo=dt.UTC))
