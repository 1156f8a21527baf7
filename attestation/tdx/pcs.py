"""Intel Provisioning Certification Service (PCS API v4) collateral for TDX, with a disk cache.

Endpoints (Intel SGX and Intel TDX PCS API v4):
  GET {base}/tdx/certification/v4/tcb?fmspc=..     body tcbInfo JSON, header TCB-Info-Issuer-Chain
  GET {base}/tdx/certification/v4/qe/identity      body enclaveIdentity JSON, header
                                                    SGX-Enclave-Identity-Issuer-Chain
  GET {base}/sgx/certification/v4/pckcrl?ca=..&encoding=der   body CRL, SGX-PCK-CRL-Issuer-Chain
  GET {root_crl_url}                                the Intel SGX Root CA CRL (DER)

Collateral is recognised by content (`classify_collateral`), never by file name, so an offline
bundle directory may hold files under any names. Nothing here is trusted: the verifier checks
every signature, chain and validity window.
"""

from __future__ import annotations

import enum
import hashlib
import json
import string
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote

import httpx
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from attestation.errors import AttestationError, CollateralError
from attestation.tdx.verify import Collateral
from attestation.x509chain import load_crl, load_pem_chain

PCS_BASE = "https://api.trustedservices.intel.com"
ROOT_CRL_URL = "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"
_CA_CN = {"platform": "Intel SGX PCK Platform CA", "processor": "Intel SGX PCK Processor CA"}
_HEX = set(string.hexdigits.encode())


class CollateralKind(enum.StrEnum):
    TCB_INFO = "tcbInfo"
    QE_IDENTITY = "qeIdentity"
    CRL = "crl"
    PEM_CHAIN = "pemChain"


def _json_top(data: bytes) -> dict[str, object] | None:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _crl_der(data: bytes) -> bytes | None:
    """The DER of a CRL given as DER, PEM or hex text (PCS has served all three), else None."""
    candidates = [data]  # raw first: stripping "whitespace" would cut bytes off a DER signature
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        candidates = [text]
    elif text and len(text) % 2 == 0 and set(text) <= _HEX:
        candidates.append(bytes.fromhex(text.decode()))
    for candidate in candidates:
        try:
            crl = load_crl(candidate)
        except AttestationError:
            continue
        return crl.public_bytes(Encoding.DER)
    return None


def classify_collateral(data: bytes) -> CollateralKind:
    """Which kind of TDX collateral `data` is; CollateralError when it is none of them."""
    head = data.lstrip()
    if head.startswith(b"{"):
        top = _json_top(data)
        if top is not None and "signature" in top:
            if isinstance(top.get("tcbInfo"), dict):
                return CollateralKind.TCB_INFO
            if isinstance(top.get("enclaveIdentity"), dict):
                return CollateralKind.QE_IDENTITY
        raise CollateralError("JSON collateral is neither a tcbInfo nor an enclaveIdentity response")
    if head.startswith(b"-----BEGIN CERTIFICATE-----"):
        try:
            load_pem_chain(data)
        except AttestationError as exc:
            raise CollateralError(f"unreadable PEM chain: {exc}") from exc
        return CollateralKind.PEM_CHAIN
    if _crl_der(data) is not None:
        return CollateralKind.CRL
    raise CollateralError("unrecognised collateral (not tcbInfo, qeIdentity, CRL or PEM chain)")


def _cn(name: x509.Name) -> str:
    attrs = name.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else ""


def collateral_from_items(items: Iterable[bytes], fmspc: bytes, ca: str) -> Collateral:
    """Pick the pieces for one FMSPC and PCK CA out of an unordered pile; the newest issue wins."""
    best: dict[str, tuple[str, bytes]] = {}

    def offer(slot: str, issued: str, data: bytes) -> None:
        if slot not in best or issued > best[slot][0]:
            best[slot] = (issued, data)

    for data in items:
        kind = classify_collateral(data)
        if kind in (CollateralKind.TCB_INFO, CollateralKind.QE_IDENTITY):
            top = _json_top(data) or {}
            body = top.get(kind.value if kind is CollateralKind.TCB_INFO else "enclaveIdentity")
            if not isinstance(body, dict):
                continue
            issued = str(body.get("issueDate", ""))
            if kind is CollateralKind.TCB_INFO and str(body.get("fmspc", "")).lower() == fmspc.hex():
                offer("tcb_info", issued, data)
            elif kind is CollateralKind.QE_IDENTITY and body.get("id") == "TD_QE":
                offer("qe_identity", issued, data)
        elif kind is CollateralKind.PEM_CHAIN:
            leaf = load_pem_chain(data)[0]
            if _cn(leaf.subject) == "Intel SGX TCB Signing":
                offer("signing_chain", leaf.not_valid_after_utc.isoformat(), data)
        else:
            der = _crl_der(data)
            assert der is not None
            crl = load_crl(der)
            issuer = _cn(crl.issuer)
            if issuer == "Intel SGX Root CA":
                offer("root_crl", crl.last_update_utc.isoformat(), der)
            elif issuer == _CA_CN.get(ca):
                offer("pck_crl", crl.last_update_utc.isoformat(), der)
    missing = [n for n in ("tcb_info", "qe_identity", "signing_chain") if n not in best]
    if missing:
        raise CollateralError(f"collateral for FMSPC {fmspc.hex()} ({ca}) lacks: {', '.join(missing)}")
    return Collateral(
        tcb_info=best["tcb_info"][1],
        qe_identity=best["qe_identity"][1],
        signing_chain=best["signing_chain"][1],
        pck_crl=best["pck_crl"][1] if "pck_crl" in best else None,
        root_crl=best["root_crl"][1] if "root_crl" in best else None,
    )


class PcsFetcher:
    """`CollateralSource` backed by Intel PCS, a disk cache, or (offline) a pre-seeded bundle dir."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        offline: bool = False,
        transport: httpx.BaseTransport | None = None,
        base_url: str = PCS_BASE,
        root_crl_url: str = ROOT_CRL_URL,
        refresh: bool = False,
        timeout_s: float = 10.0,
    ) -> None:
        self.cache_dir = cache_dir
        self.offline = offline
        self.refresh = refresh  # online: ignore cached copies and fetch again
        self._client = None if offline else httpx.Client(transport=transport, timeout=timeout_s)
        self.base_url = base_url.rstrip("/")
        self.root_crl_url = root_crl_url

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _cached(self) -> list[bytes]:
        if not self.cache_dir.is_dir():
            return []
        return [p.read_bytes() for p in sorted(self.cache_dir.iterdir()) if p.is_file()]

    def tdx_collateral(self, fmspc: bytes, ca: str) -> Collateral:
        if ca not in _CA_CN:
            raise CollateralError(f"unknown PCK CA kind {ca!r}")
        if self.offline:
            # Missing CRLs are left for the verifier to refuse (or accept under unsafe_skip_crls).
            return collateral_from_items(self._cached(), fmspc, ca)
        if not self.refresh:
            try:
                found = collateral_from_items(self._cached(), fmspc, ca)
            except CollateralError:
                found = None
            if found is not None and found.pck_crl is not None and found.root_crl is not None:
                return found
        return self._fetch(fmspc, ca)

    def _get(self, url: str, params: dict[str, str] | None, chain_header: str | None) -> tuple[bytes, bytes]:
        assert self._client is not None
        try:
            resp = self._client.get(url, params=params)
        except httpx.HTTPError as exc:
            raise CollateralError(f"PCS request {url} failed: {exc}") from exc
        if resp.status_code != 200:
            raise CollateralError(f"PCS {url} answered HTTP {resp.status_code}")
        chain = b""
        if chain_header is not None:
            raw = resp.headers.get(chain_header)
            if not raw:
                raise CollateralError(f"PCS {url} response lacks the {chain_header} header")
            chain = unquote(raw).encode()  # PCS URL-encodes the PEM chain
        return resp.content, chain

    def _fetch(self, fmspc: bytes, ca: str) -> Collateral:
        b = self.base_url
        tcb, chain = self._get(
            f"{b}/tdx/certification/v4/tcb", {"fmspc": fmspc.hex()}, "TCB-Info-Issuer-Chain"
        )
        qe, qe_chain = self._get(
            f"{b}/tdx/certification/v4/qe/identity", None, "SGX-Enclave-Identity-Issuer-Chain"
        )
        crl, crl_chain = self._get(
            f"{b}/sgx/certification/v4/pckcrl", {"ca": ca, "encoding": "der"}, "SGX-PCK-CRL-Issuer-Chain"
        )
        root_crl, _ = self._get(self.root_crl_url, None, None)
        pieces = {
            "tcbinfo": tcb,
            "tcbinfo-chain": chain,
            "qeidentity": qe,
            "qeidentity-chain": qe_chain,
            "pckcrl": crl,
            "pckcrl-chain": crl_chain,
            "rootcrl": root_crl,
        }
        for data in pieces.values():
            classify_collateral(data)  # refuse to cache something that is not collateral at all
        found = collateral_from_items(pieces.values(), fmspc, ca)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        for name, data in pieces.items():
            # Content-addressed names: a cache never overwrites a piece with a different one.
            digest = hashlib.sha256(data).hexdigest()[:16]
            (self.cache_dir / f"{name}-{fmspc.hex() if name.startswith('tcb') else ca}-{digest}").write_bytes(
                data
            )
        return found
