"""The broker's collateral store online: `fetch` fills the cache from AMD KDS and Intel PCS (served
here by a mock transport with test-PKI collateral), `status` and `due` say what expires when, and
the same store serves the verifiers offline afterwards."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from attestation.collateral import CollateralConfig, CollateralStore
from attestation.errors import CollateralError
from attestation.snp.certs import VekKind
from attestation.snp.tcb import Product
from sealed_fakes import tdx_collateral as testcollateral
from sealed_fakes import tdx_pki as testpki
from sealed_fakes.platform import FakePlatform

NOW = dt.datetime.now(dt.UTC)


def vendor_services(p: FakePlatform, issue: dt.datetime, calls: list[str]) -> httpx.MockTransport:
    pki = p.intel
    chain = quote(pki.signing_chain_pem().decode())
    amd_crl = p.amd.make_crl([], issuer="ark", last_update=issue, next_update=issue + dt.timedelta(days=30))

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        path = request.url.path
        if request.url.host == "kds.test" and path.endswith("/crl"):
            return httpx.Response(200, content=amd_crl)
        if path == "/tdx/certification/v4/tcb":
            return httpx.Response(200, content=testcollateral.tcb_info(pki, issue=issue),
                                  headers={"TCB-Info-Issuer-Chain": chain})
        if path == "/tdx/certification/v4/qe/identity":
            return httpx.Response(200, content=testcollateral.qe_identity(pki, issue=issue),
                                  headers={"SGX-Enclave-Identity-Issuer-Chain": chain})
        if path == "/sgx/certification/v4/pckcrl":
            return httpx.Response(200, content=testcollateral.crl(pki.ca, pki.ca_key, issue=issue),
                                  headers={"SGX-PCK-CRL-Issuer-Chain": chain})
        if path.endswith("IntelSGXRootCA.der"):
            return httpx.Response(200, content=testcollateral.crl(pki.root, pki.root_key, issue=issue))
        return httpx.Response(404)

    return httpx.MockTransport(handle)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> FakePlatform:
    return FakePlatform.create(tmp_path_factory.mktemp("p"), gpus=1, now=NOW)


def test_fetch_fills_the_cache_and_status_reports_expiry(platform: FakePlatform, tmp_path: Path) -> None:
    calls: list[str] = []
    config = CollateralConfig(tmp_path / "store", kds_url="https://kds.test", pcs_url="https://pcs.test",
                              fmspcs=(testpki.FMSPC.hex(),))
    store = CollateralStore(config, transport=vendor_services(platform, NOW - dt.timedelta(days=1), calls))
    store._pcs.root_crl_url = "https://pcs.test/IntelSGXRootCA.der"
    items = store.fetch()
    assert sum(c.endswith("/crl") for c in calls) == 2 * len(Product)  # VCEK and VLEK CRL per product
    kinds = {(i.source, i.kind) for i in items}
    assert {("amd", "crl"), ("intel", "tcbInfo"), ("intel", "qeIdentity"), ("intel", "crl")} <= kinds
    assert all(not i.expired(NOW) for i in items)
    # Everything expiring within the refresh horizon is due; a month ahead all of it is.
    assert store.due(NOW) == []
    signed = {i.name for i in items if i.kind in ("crl", "tcbInfo", "qeIdentity")}
    assert {i.name for i in store.due(NOW + dt.timedelta(days=40))} >= signed
    # The schedule: nothing is fetched while everything outlives the next refresh; once a piece
    # would expire before it, everything is fetched again.
    before = len(calls)
    assert store.refresh_if_due(NOW) is False and len(calls) == before
    assert store.refresh_if_due(NOW + dt.timedelta(days=29)) is True and len(calls) > before
    store.close()
    # Offline afterwards: the cache answers the verifiers without the network.
    offline = CollateralStore(CollateralConfig(tmp_path / "store", offline=True))
    assert offline.snp.crl(Product.MILAN, VekKind.VCEK)
    assert offline.tdx.tdx_collateral(testpki.FMSPC, "platform").tcb_info


def test_offline_store_never_fetches(tmp_path: Path) -> None:
    store = CollateralStore(CollateralConfig(tmp_path, offline=True))
    with pytest.raises(CollateralError, match="offline"):
        store.fetch()
    with pytest.raises(CollateralError):
        store.snp.crl(Product.GENOA, VekKind.VCEK)
