"""Shared SNP fixtures: the real vectors' folder and facts, and a test AMD PKI per product."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from attestation.snp.certs import VekKind
from attestation.snp.tcb import Product
from sealed_fakes.snp_pki import AmdTestPki, KeySet, RealVector, generate_keys, make_pki


def _t(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


# Times inside every certificate's validity, as MANIFEST.md section 1 gives them.
VECTORS = (
    # 1a: go-sev-guest TestVerifyVcekCert pins 2022-09-24T01:00:00Z.
    RealVector(
        "gosevguest_milan_attestation.bin",
        "gosevguest_milan_vcek.der",
        Product.MILAN,
        VekKind.VCEK,
        _t(2022, 9, 24, 1, 0),
    ),
    # 1b: VCEK valid 2023-01-24 .. 2030-01-24.
    RealVector(
        "trustee_test-report.bin", "trustee_test-vcek.der", Product.MILAN, VekKind.VCEK, _t(2025, 6, 1)
    ),
    # 1c: the VLEK is valid 2024-12-10 .. 2025-12-10 only; MANIFEST suggests 2025-06-01.
    RealVector(
        "trustee_test-vlek-report.bin", "trustee_test-vlek.der", Product.MILAN, VekKind.VLEK, _t(2025, 6, 1)
    ),
    # 1e: the Genoa VCEK is valid from 2025-05-27 (report rebuilt from trustee's evidence JSON).
    RealVector(
        "trustee_e2e_genoa_report_reconstructed.bin",
        "trustee_e2e_genoa_vcek.der",
        Product.GENOA,
        VekKind.VCEK,
        _t(2025, 6, 1),
    ),
)
TODAY = _t(2026, 11, 29)  # the vectors' collection date: fixed, never the wall clock


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests taking `vector` run once per real SNP vector."""
    if "vector" in metafunc.fixturenames:
        metafunc.parametrize("vector", VECTORS, ids=[v.report for v in VECTORS])


@pytest.fixture(scope="session")
def vectors() -> tuple[RealVector, ...]:
    return VECTORS


@pytest.fixture(scope="session")
def today() -> dt.datetime:
    return TODAY


@pytest.fixture(scope="session")
def snp_dir(testvectors: Path) -> Path:
    return testvectors / "snp"


@pytest.fixture(scope="session")
def facts(testvectors: Path) -> dict[str, Any]:
    return json.loads((testvectors / "computed_facts.json").read_text())["snp"]


@pytest.fixture(scope="session")
def test_keys() -> KeySet:
    """RSA-4096 ARK/ASK/ASVK keys as AMD uses; generated once (slow)."""
    return generate_keys(4096)


@pytest.fixture(scope="session")
def other_keys() -> KeySet:
    """An unrelated PKI with the same names (a 'wrong root'); smaller keys keep the suite fast."""
    return generate_keys(2048)


@pytest.fixture(scope="session")
def pkis(test_keys: KeySet) -> dict[Product, AmdTestPki]:
    return {p: make_pki(test_keys, p) for p in Product}


@pytest.fixture(scope="session")
def roots_dir(pkis: dict[Product, AmdTestPki], tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("snp-test-roots")
    for pki in pkis.values():
        pki.write_roots(d)
    return d


@pytest.fixture(scope="session")
def wrong_roots_dir(other_keys: KeySet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("snp-wrong-roots")
    for p in Product:
        make_pki(other_keys, p).write_roots(d)
    return d
