"""AMD KDS fetcher with httpx.MockTransport: URLs per product, cache, offline mode, rate limits."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization

from attestation.errors import CollateralError, RevokedError
from attestation.kds import KdsConfig, KdsFetcher, chain_path, crl_path, vcek_path
from attestation.snp import verify_report
from attestation.snp.certs import VekKind
from attestation.snp.tcb import Product, TcbVersion
from sealed_fakes.snp_pki import EPOCH, AmdTestPki, KeySet, sign_report, template_report

CHIP = bytes.fromhex(
    "3ac3fe21e13fb0990eb28a802e3fb6a29483a6b0753590c951bdd3b8e53786184ca39e359669a2b76a1936776b564ea4"
    "64cdce40c05f63c9b610c5068b006b5d"
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def _fetcher(
    handler: Callable[[httpx.Request], httpx.Response], tmp_path: Path | None = None, **cfg: Any
) -> tuple[KdsFetcher, FakeClock]:
    clock = FakeClock()
    config = KdsConfig(cache_dir=tmp_path, **cfg)
    return KdsFetcher(config, httpx.MockTransport(handler), clock.now, clock.sleep), clock


def test_urls_per_product() -> None:
    milan = TcbVersion(bl=2, tee=0, snp=5, ucode=68)
    # go-sev-guest verify_test.go L788: the KDS URL of the Milan sample's VCEK.
    assert vcek_path(Product.MILAN, CHIP, milan) == (
        f"/vcek/v1/Milan/{CHIP.hex()}?blSPL=2&teeSPL=0&snpSPL=5&ucodeSPL=68"
    )
    assert vcek_path(Product.GENOA, CHIP, milan).startswith(f"/vcek/v1/Genoa/{CHIP.hex()}?")
    turin = TcbVersion(fmc=5, bl=3, tee=1, snp=8, ucode=21)
    assert vcek_path(Product.TURIN, CHIP, turin) == (
        f"/vcek/v1/Turin/{CHIP[:8].hex()}?blSPL=3&teeSPL=1&snpSPL=8&ucodeSPL=21&fmcSPL=5"
    )
    with pytest.raises(CollateralError):
        vcek_path(Product.TURIN, CHIP, milan)
    assert chain_path(Product.GENOA, VekKind.VLEK) == "/vlek/v1/Genoa/cert_chain"
    assert crl_path(Product.MILAN, VekKind.VCEK) == "/vcek/v1/Milan/crl"


def test_cache_and_offline(tmp_path: Path) -> None:
    seen: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(str(req.url))
        return httpx.Response(200, content=b"chain-pem")

    f, _ = _fetcher(handler, tmp_path)
    assert f.cert_chain(Product.MILAN) == b"chain-pem"
    assert f.cert_chain(Product.MILAN) == b"chain-pem"
    assert seen == ["https://kdsintf.amd.com/vcek/v1/Milan/cert_chain"]
    offline, _ = _fetcher(handler, tmp_path, offline=True)
    assert offline.cert_chain(Product.MILAN) == b"chain-pem"  # from the cache populated above
    with pytest.raises(CollateralError, match="offline"):
        offline.crl(Product.MILAN)
    assert len(seen) == 1
    offline.seed(crl_path(Product.MILAN, VekKind.VCEK), b"crl")
    assert offline.crl(Product.MILAN) == b"crl"
    no_cache, _ = _fetcher(handler, None, offline=True)
    with pytest.raises(CollateralError):
        no_cache.cert_chain(Product.GENOA)


def test_vcek_cache_key_includes_tcb(tmp_path: Path) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=req.url.params["snpSPL"].encode())

    f, _ = _fetcher(handler, tmp_path)
    assert f.vcek(Product.MILAN, CHIP, TcbVersion(bl=2, tee=0, snp=5, ucode=68)) == b"5"
    assert f.vcek(Product.MILAN, CHIP, TcbVersion(bl=2, tee=0, snp=6, ucode=68)) == b"6"


def test_429_retry_after_and_min_interval() -> None:
    answers = [httpx.Response(429, headers={"Retry-After": "7"}), httpx.Response(200, content=b"ok")]
    f, clock = _fetcher(lambda req: answers.pop(0), None, min_interval_s=2.0)
    assert f.crl(Product.GENOA) == b"ok"
    assert clock.sleeps == [7.0]  # waited what KDS asked; the pause already exceeds min interval
    answers.append(httpx.Response(200, content=b"again"))
    assert f.crl(Product.TURIN) == b"again"
    assert clock.sleeps == [7.0, 2.0]  # client-side spacing between back-to-back requests


def test_rate_limit_gives_up() -> None:
    f, _ = _fetcher(lambda req: httpx.Response(429, headers={"Retry-After": "1"}), None, max_retries=2)
    with pytest.raises(CollateralError, match="rate-limited"):
        f.crl(Product.MILAN)
    f2, _ = _fetcher(lambda req: httpx.Response(429, headers={"Retry-After": "3600"}), None)
    with pytest.raises(CollateralError, match="retry after"):
        f2.crl(Product.MILAN)


def test_http_errors() -> None:
    f, _ = _fetcher(lambda req: httpx.Response(404), None)
    with pytest.raises(CollateralError, match="404"):
        f.cert_chain(Product.MILAN)

    def boom(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no route", request=req)

    f2, _ = _fetcher(boom, None)
    with pytest.raises(CollateralError, match="failed"):
        f2.cert_chain(Product.MILAN)


def test_verify_fetches_vcek_and_crl(
    tmp_path: Path, pkis: dict[Product, AmdTestPki], test_keys: KeySet, roots_dir: Path
) -> None:
    pki = pkis[Product.GENOA]
    rep = template_report(3, Product.GENOA)
    tcb = rep.tcb("reported", Product.GENOA)
    vek = pki.make_vek(tcb, rep.chip_id, serial=9).public_bytes(serialization.Encoding.DER)
    served = {
        vcek_path(Product.GENOA, rep.chip_id, tcb): vek,
        crl_path(Product.GENOA, VekKind.VCEK): pki.make_crl([]),
    }

    def handler(req: httpx.Request) -> httpx.Response:
        key = req.url.raw_path.decode()
        return httpx.Response(200, content=served[key]) if key in served else httpx.Response(404)

    f, _ = _fetcher(handler, tmp_path)
    now = EPOCH + dt.timedelta(days=10)
    raw = sign_report(rep, test_keys.vek)
    vr = verify_report(raw, now=now, fetcher=f, roots_dir=roots_dir, fetch_crl=True)
    assert vr.chain.crl_checked
    served[crl_path(Product.GENOA, VekKind.VCEK)] = pki.make_crl([9], issuer="ask")
    f2, _ = _fetcher(handler, None)
    with pytest.raises(RevokedError):
        verify_report(raw, now=now, fetcher=f2, roots_dir=roots_dir, fetch_crl=True)
