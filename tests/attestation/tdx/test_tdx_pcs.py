"""Intel PCS fetcher (httpx.MockTransport, no network): cache, offline bundles, errors, classification."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.claims import TcbStatus
from attestation.errors import CollateralError
from attestation.tdx import TdxVerifier, pcs
from attestation.tdx.pcs import CollateralKind, PcsFetcher, classify_collateral, collateral_from_items
from sealed_fakes import tdx_collateral as tc
from sealed_fakes import tdx_pki as tp


@pytest.fixture(scope="module")
def pki() -> tp.TestPki:
    return tp.make_pki()


def _server(
    pki: tp.TestPki, log: list[str], *, status: int = 200, drop_header: bool = False
) -> httpx.MockTransport:
    c = tc.collateral(pki)
    chain = quote(pki.signing_chain_pem().decode())
    crl_chain = quote(b"".join(x.public_bytes(Encoding.PEM) for x in (pki.ca, pki.root)).decode())

    def handler(request: httpx.Request) -> httpx.Response:
        log.append(str(request.url))
        path = request.url.path
        if status != 200:
            return httpx.Response(status)
        if path == "/tdx/certification/v4/tcb" and request.url.params["fmspc"] == tp.FMSPC.hex():
            headers = {} if drop_header else {"TCB-Info-Issuer-Chain": chain}
            return httpx.Response(200, content=c.tcb_info, headers=headers)
        if path == "/tdx/certification/v4/qe/identity":
            return httpx.Response(
                200, content=c.qe_identity, headers={"SGX-Enclave-Identity-Issuer-Chain": chain}
            )
        if path == "/sgx/certification/v4/pckcrl" and request.url.params["ca"] == "platform":
            return httpx.Response(200, content=c.pck_crl, headers={"SGX-PCK-CRL-Issuer-Chain": crl_chain})
        if path == "/IntelSGXRootCA.der":
            return httpx.Response(200, content=c.root_crl)
        return httpx.Response(404)

    return httpx.MockTransport(handler)


def test_fetch_verify_and_cache(tmp_path: Path, pki: tp.TestPki) -> None:
    log: list[str] = []
    fetcher = PcsFetcher(tmp_path / "cache", transport=_server(pki, log))
    verifier = TdxVerifier([pki.root], fetcher=fetcher)
    v = verifier.verify(tp.build_quote(pki), tp.NOW)
    assert v.tcb is not None and v.tcb.status is TcbStatus.UP_TO_DATE and v.crls_checked
    assert len(log) == 4 and any("fmspc=00906ed50000" in u for u in log)
    # A second fetcher on the same cache answers without the network.
    again: list[str] = []
    cached = PcsFetcher(tmp_path / "cache", transport=_server(pki, again, status=500))
    assert (
        classify_collateral(cached.tdx_collateral(tp.FMSPC, "platform").tcb_info) is CollateralKind.TCB_INFO
    )
    assert again == []
    # refresh=True goes back to PCS.
    PcsFetcher(tmp_path / "cache", transport=_server(pki, again), refresh=True).tdx_collateral(
        tp.FMSPC, "platform"
    )
    assert len(again) == 4
    fetcher.close()


def test_offline_bundle_recognised_by_content(tmp_path: Path, pki: tp.TestPki) -> None:
    c = tc.collateral(pki)
    for i, data in enumerate([c.tcb_info, c.qe_identity, c.signing_chain, c.pck_crl, c.root_crl]):
        assert data is not None
        (tmp_path / f"blob{i}").write_bytes(data)
    fetcher = PcsFetcher(tmp_path, offline=True)
    v = TdxVerifier([pki.root], fetcher=fetcher).verify(tp.build_quote(pki), tp.NOW)
    assert v.tcb is not None and v.tcb.status is TcbStatus.UP_TO_DATE
    with pytest.raises(CollateralError, match="lacks"):
        fetcher.tdx_collateral(b"\x11" * 6, "platform")
    assert fetcher.tdx_collateral(tp.FMSPC, "processor").pck_crl is None  # the verifier refuses it


def test_offline_miss(tmp_path: Path) -> None:
    with pytest.raises(CollateralError):
        PcsFetcher(tmp_path / "empty", offline=True).tdx_collateral(tp.FMSPC, "platform")


@pytest.mark.parametrize(
    ("transport_kw", "match"),
    [
        ({"status": 404}, "HTTP 404"),
        ({"status": 503}, "HTTP 503"),
        ({"drop_header": True}, "TCB-Info-Issuer-Chain"),
    ],
)
def test_pcs_errors(tmp_path: Path, pki: tp.TestPki, transport_kw: dict[str, object], match: str) -> None:
    fetcher = PcsFetcher(tmp_path, transport=_server(pki, [], **transport_kw))  # type: ignore[arg-type]
    with pytest.raises(CollateralError, match=match):
        fetcher.tdx_collateral(tp.FMSPC, "platform")
    assert list(tmp_path.iterdir()) == []


def test_network_failure_and_garbage(tmp_path: Path) -> None:
    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("unreachable", request=request)

    with pytest.raises(CollateralError, match="failed"):
        PcsFetcher(tmp_path, transport=httpx.MockTransport(boom)).tdx_collateral(tp.FMSPC, "platform")
    junk = httpx.MockTransport(
        lambda r: httpx.Response(
            200,
            content=b"<html/>",
            headers={
                "TCB-Info-Issuer-Chain": "x",
                "SGX-Enclave-Identity-Issuer-Chain": "x",
                "SGX-PCK-CRL-Issuer-Chain": "x",
            },
        )
    )
    with pytest.raises(CollateralError):
        PcsFetcher(tmp_path, transport=junk).tdx_collateral(tp.FMSPC, "platform")
    with pytest.raises(CollateralError, match="unknown PCK CA"):
        PcsFetcher(tmp_path, offline=True).tdx_collateral(tp.FMSPC, "elsewhere")


def test_classify_real_collateral(testvectors: Path) -> None:
    tdx = testvectors / "tdx"
    kinds = {
        "gotdxguest_sample_tcbInfo_response": CollateralKind.TCB_INFO,
        "gotdxguest_sample_tcbinfo_response_v5": CollateralKind.TCB_INFO,
        "trustee_tcbInfo_00A06D080000.json": CollateralKind.TCB_INFO,
        "gotdxguest_sample_qeIdentity_response": CollateralKind.QE_IDENTITY,
        "trustee_enclaveIdentity.json": CollateralKind.QE_IDENTITY,
        "gotdxguest_pckcrl": CollateralKind.CRL,
        "gotdxguest_rootcrl.der": CollateralKind.CRL,
        "gotdxguest_tcbInfoIssuerChain.pem": CollateralKind.PEM_CHAIN,
        "gotdxguest_pckCrlIssuerChain.pem": CollateralKind.PEM_CHAIN,
    }
    for name, kind in kinds.items():
        assert classify_collateral((tdx / name).read_bytes()) is kind, name
    der = (tdx / "gotdxguest_rootcrl.der").read_bytes()
    assert classify_collateral(der.hex().encode()) is CollateralKind.CRL
    for junk in (
        b"",
        b"{}",
        b'{"tcbInfo": 1, "signature": ""}',
        b"-----BEGIN CERTIFICATE-----\nxx",
        b"\x00" * 10,
    ):
        with pytest.raises(CollateralError):
            classify_collateral(junk)


def test_newest_collateral_wins(pki: tp.TestPki) -> None:
    old = tc.tcb_info(pki, issue=tp.NOW - dt.timedelta(days=40))
    new = tc.tcb_info(pki)
    c = tc.collateral(pki)
    picked = collateral_from_items([new, old, c.qe_identity, c.signing_chain], tp.FMSPC, "platform")
    assert picked.tcb_info == new and picked.pck_crl is None
    picked = collateral_from_items([old, new, c.qe_identity, c.signing_chain], tp.FMSPC, "platform")
    assert picked.tcb_info == new
    assert pcs.PCS_BASE.startswith("https://")
