"""Hypothesis over the smaller parsers too: the SEV-SNP certificate table, VCEK/VLEK certificates
and their AMD extensions, the PCK certificate's SGX extensions. Only typed errors come out."""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attestation.errors import AttestationError
from attestation.snp.certs import parse_vek
from attestation.snp.collect import encode_cert_table, parse_cert_table
from attestation.tdx.pck import parse_sgx_extensions

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
    from attestation.testing.snp_pki import generate_keys, make_pki, template_report

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
