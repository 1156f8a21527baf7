"""The verifier's collateral, one configured source per TEE, with a cache, a refresh schedule and
an offline mode:

* AMD KDS (attestation.kds): VCEK/VLEK certificates and the CRLs, under `<dir>/amd`;
* Intel PCS (attestation.tdx.pcs): TDX tcbInfo, QE identity, their signing chain and the CRLs,
  under `<dir>/intel`;
* NVIDIA: RIMs (the RIM service; one per driver or VBIOS version) and signed OCSP answers for the
  GPU and RIM certificate chains, under `<dir>/nvidia` (imported only: `attestation.nvgpu.collateral`).

Online, a missing or stale piece is fetched; offline (`offline=True`, brokers with no internet)
only what was imported (`sealed attest collateral import`) is used. Nothing here is trusted: the
verifiers check every signature, chain and validity window, so expired collateral is refused with
its reason, never used silently. `status()` says what expires when.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509
from cryptography.x509 import ocsp

from attestation.errors import AttestationError, CollateralError, ParseError
from attestation.kds import KDS_BASE, KdsConfig, KdsFetcher, crl_path
from attestation.nvgpu.collateral import GpuCollateralDir, ocsp_file_name, rim_file_name
from attestation.nvgpu.rim import parse_rim
from attestation.ocsp_imported import parse_ocsp_response
from attestation.snp.certs import VekKind
from attestation.snp.tcb import Product
from attestation.tdx.pcs import PCS_BASE, CollateralKind, PcsFetcher, _crl_der, _json_top, classify_collateral
from attestation.x509chain import load_crl, load_pem_chain

SOURCES = ("amd", "intel", "nvidia")


@dataclass(frozen=True)
class CollateralConfig:
    root: Path
    offline: bool = False
    kds_url: str = KDS_BASE
    pcs_url: str = PCS_BASE
    refresh_every: dt.timedelta = dt.timedelta(hours=24)  # and whenever a piece expires sooner
    products: tuple[Product, ...] = (Product.MILAN, Product.GENOA, Product.TURIN)
    fmspcs: tuple[str, ...] = ()  # TDX platforms to fetch collateral for (hex FMSPC)


@dataclass(frozen=True)
class CollateralItem:
    source: str  # amd | intel | nvidia
    kind: str  # crl | tcbInfo | qeIdentity | pemChain | rim | vcek
    name: str  # file name in the store
    subject: str  # issuer CN of a CRL, FMSPC of a tcbInfo, ...
    issued: dt.datetime | None
    next_update: dt.datetime | None

    def expired(self, now: dt.datetime) -> bool:
        return self.next_update is not None and now > self.next_update

    def to_json(self, now: dt.datetime) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "name": self.name, "subject": self.subject,
                "issued": self.issued.isoformat() if self.issued else None,
                "next_update": self.next_update.isoformat() if self.next_update else None,
                "expired": self.expired(now)}


def _cn(name: x509.Name) -> str:
    attrs = name.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else name.rfc4514_string()


def _iso(value: object) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _amd_crl_target(crl: x509.CertificateRevocationList) -> tuple[Product, VekKind] | None:
    """Which KDS CRL path an AMD CRL belongs to, from its issuer (ARK-<p>, SEV-<p>, SEV-VLEK-<p>)."""
    cn = _cn(crl.issuer)
    for product in Product:
        if cn == f"SEV-VLEK-{product.value}":
            return product, VekKind.VLEK
        if cn in (f"ARK-{product.value}", f"SEV-{product.value}"):
            return product, VekKind.VCEK
    return None


@dataclass
class CollateralStore:
    config: CollateralConfig
    transport: httpx.BaseTransport | None = None
    _kds: KdsFetcher = field(init=False)
    _pcs: PcsFetcher = field(init=False)

    def __post_init__(self) -> None:
        root = self.config.root
        self._kds = KdsFetcher(KdsConfig(base_url=self.config.kds_url, cache_dir=root / "amd",
                                         offline=self.config.offline), transport=self.transport)
        self._pcs = PcsFetcher(root / "intel", offline=self.config.offline, transport=self.transport,
                               base_url=self.config.pcs_url)

    # ---- what the verifiers use -------------------------------------------------------------
    @property
    def snp(self) -> KdsFetcher:
        """attestation.snp.CollateralFetcher: VCEKs and CRLs (cache first; KDS when online)."""
        return self._kds

    @property
    def nvidia(self) -> GpuCollateralDir:
        """attestation.nvgpu.GpuCollateralSource: imported RIMs and OCSP answers (read per use)."""
        return GpuCollateralDir(self.config.root / "nvidia")

    @property
    def tdx(self) -> PcsFetcher:
        """attestation.tdx.CollateralSource: tcbInfo, QE identity, CRLs for an FMSPC."""
        return self._pcs

    def close(self) -> None:
        self._pcs.close()

    # ---- import, status, fetch ------------------------------------------------------------
    def import_file(self, data: bytes, name: str = "") -> CollateralItem:
        """Put one piece of collateral in its place; recognised by content, refused otherwise."""
        der = _crl_der(data) if not data.lstrip().startswith((b"{", b"<", b"-----BEGIN CERT")) else None
        if der is not None:
            crl = load_crl(der)
            target = _amd_crl_target(crl)
            if target is not None:
                self._kds.seed(crl_path(*target), der)
                return self._item("amd", self._kds.cache_file(crl_path(*target)))  # type: ignore[arg-type]
        if data.lstrip().startswith(b"<"):  # an NVIDIA RIM (SWID XML); one per version
            return self._put_nvidia(rim_file_name(data), data)
        if _is_ocsp_response(data):  # an OCSP answer for a GPU or RIM certificate
            try:
                parse_ocsp_response(data)
            except ParseError as exc:
                raise CollateralError(f"{name or 'input'}: {exc}") from exc
            return self._put_nvidia(ocsp_file_name(data), data)
        try:
            kind = classify_collateral(data)
        except CollateralError as exc:
            raise CollateralError(f"{name or 'input'}: {exc}") from exc
        dest = self.config.root / "intel" / f"{kind.value}-{hashlib.sha256(data).hexdigest()[:16]}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        return self._item("intel", dest)

    def _put_nvidia(self, file_name: str, data: bytes) -> CollateralItem:
        dest = self.config.root / "nvidia" / file_name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        return self._item("nvidia", dest)

    def import_dir(self, bundle: Path) -> list[CollateralItem]:
        files = [p for p in sorted(bundle.rglob("*")) if p.is_file()]
        if not files:
            raise CollateralError(f"no collateral files in {bundle}")
        return [self.import_file(p.read_bytes(), p.name) for p in files]

    def export_dir(self, out: Path) -> None:
        """A bundle made here (online) for a broker without internet to import."""
        for source in SOURCES:
            src = self.config.root / source
            if src.is_dir():
                shutil.copytree(src, out / source, dirs_exist_ok=True)

    def status(self) -> list[CollateralItem]:
        items = []
        for source in SOURCES:
            directory = self.config.root / source
            if directory.is_dir():
                items += [self._item(source, p) for p in sorted(directory.iterdir()) if p.is_file()]
        return items

    def due(self, now: dt.datetime) -> list[CollateralItem]:
        """Pieces to refresh now: expired, or expiring before the next scheduled refresh."""
        horizon = now + self.config.refresh_every
        return [i for i in self.status() if i.next_update is not None and i.next_update <= horizon]

    def refresh_if_due(self, now: dt.datetime) -> bool:
        """The refresh schedule (run it often, e.g. hourly from cron): fetch when the store is
        empty or a piece expires before the next `refresh_every`; True when it fetched."""
        if self.status() and not self.due(now):
            return False
        self.fetch()
        return True

    def fetch(self) -> list[CollateralItem]:
        """Online refresh of every configured source (AMD CRLs per product, Intel per FMSPC)."""
        if self.config.offline:
            raise CollateralError("collateral store is offline: import a bundle instead")
        for product in self.config.products:
            for kind in (VekKind.VCEK, VekKind.VLEK):
                path = crl_path(product, kind)
                self._kds.seed(path, self._kds._download(path))
        refreshing = PcsFetcher(self.config.root / "intel", transport=self.transport,
                                base_url=self.config.pcs_url, refresh=True)
        try:
            for fmspc in self.config.fmspcs:
                for ca in ("platform", "processor"):
                    refreshing.tdx_collateral(bytes.fromhex(fmspc), ca)
        finally:
            refreshing.close()
        return self.status()

    def _item(self, source: str, path: Path) -> CollateralItem:
        data = path.read_bytes()
        try:
            if source == "nvidia":
                return _nvidia_item(path, data)
            der = _crl_der(data) if source == "amd" or not data.lstrip().startswith((b"{", b"-----")) else None
            if der is not None:
                crl = load_crl(der)
                return CollateralItem(source, "crl", path.name, _cn(crl.issuer), crl.last_update_utc,
                                      crl.next_update_utc)
            kind = classify_collateral(data)
            if kind in (CollateralKind.TCB_INFO, CollateralKind.QE_IDENTITY):
                top = _json_top(data) or {}
                found = top.get("tcbInfo" if kind is CollateralKind.TCB_INFO else "enclaveIdentity")
                body: dict[str, object] = found if isinstance(found, dict) else {}
                subject = str(body.get("fmspc") or body.get("id") or "")
                return CollateralItem(source, kind.value, path.name, subject, _iso(body.get("issueDate")),
                                      _iso(body.get("nextUpdate")))
            if kind is CollateralKind.PEM_CHAIN:
                leaf = load_pem_chain(data)[0]
                return CollateralItem(source, kind.value, path.name, _cn(leaf.subject), leaf.not_valid_before_utc,
                                      leaf.not_valid_after_utc)
        except (AttestationError, ValueError):
            pass
        return CollateralItem(source, "unknown", path.name, "", None, None)


def _is_ocsp_response(data: bytes) -> bool:
    try:
        ocsp.load_der_ocsp_response(data)
    except ValueError:
        return False
    return True


def _nvidia_item(path: Path, data: bytes) -> CollateralItem:
    if path.name.endswith(".xml"):
        return CollateralItem("nvidia", "rim", path.name, parse_rim(data).version, None, None)
    resp = parse_ocsp_response(data)
    subject = f"serial {resp.serial_number:x}: {resp.certificate_status.name.lower()}"
    return CollateralItem("nvidia", "ocsp", path.name, subject, resp.this_update_utc, resp.next_update_utc)


def status_json(items: list[CollateralItem], now: dt.datetime) -> str:
    return json.dumps({"now": now.isoformat(), "items": [i.to_json(now) for i in items]}, indent=1)
