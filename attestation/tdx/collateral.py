"""Intel PCS collateral for TDX: TDX TCB Info (v3) and TD_QE Identity (v2), strictly typed.

Intel SGX and Intel TDX DCAP PCS API v4 ("Get TDX TCB Info", "Get TDX QE Identity"): the body is
{"tcbInfo"|"enclaveIdentity": {...}, "signature": hex(r||s)}. The signature covers the exact
served bytes of the inner JSON value, so the value's byte span is located in the served text and
never re-serialised (key order, spacing and number spelling are part of what was signed).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, utils

from attestation.claims import TcbStatus
from attestation.errors import CollateralError, ParseError, SignatureError

_STATUSES = {s.value: s for s in TcbStatus if s is not TcbStatus.UNKNOWN}


@dataclass(frozen=True)
class SignedJson:
    body: bytes  # exact served bytes of the signed value
    value: dict[str, Any]
    signature: bytes  # r||s, 64 bytes


@dataclass(frozen=True)
class Level:
    """One tcbLevels entry: the SVNs that must be met, and the status they earn."""

    sgx: tuple[int, ...]  # 16 SGX components (platform levels); empty for identity levels
    pcesvn: int
    tdx: tuple[int, ...]  # 16 TDX components (platform levels); empty for identity levels
    isvsvn: int  # QE / TDX module identity levels
    tcb_date: str
    status: TcbStatus
    advisory_ids: tuple[str, ...]


@dataclass(frozen=True)
class ModuleIdentity:
    id: str  # "TDX_01", ... : TDX module major version in tee_tcb_svn[1]
    mrsigner: bytes
    attributes: bytes
    attributes_mask: bytes
    levels: tuple[Level, ...]


@dataclass(frozen=True)
class TcbInfo:
    issue_date: dt.datetime
    next_update: dt.datetime
    fmspc: bytes
    pce_id: bytes
    evaluation_number: int
    module: ModuleIdentity  # tdxModule: mrsigner/attributes for modules without identities
    module_identities: tuple[ModuleIdentity, ...]
    levels: tuple[Level, ...]


@dataclass(frozen=True)
class QeIdentity:
    issue_date: dt.datetime
    next_update: dt.datetime
    evaluation_number: int
    miscselect: int
    miscselect_mask: int
    attributes: bytes
    attributes_mask: bytes
    mrsigner: bytes
    isvprodid: int
    levels: tuple[Level, ...]


def split_signed_json(data: bytes, key: str) -> SignedJson:
    """Locate the exact bytes of `key`'s value at the top level; reject duplicates and extra keys."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"collateral is not UTF-8: {exc}") from exc
    dec = json.JSONDecoder()
    spans: dict[str, tuple[int, int, Any]] = {}
    try:
        pos = _ws(text, 0)
        if text[pos : pos + 1] != "{":
            raise ParseError("collateral is not a JSON object")
        pos = _ws(text, pos + 1)
        while text[pos : pos + 1] != "}":
            name, pos = dec.raw_decode(text, pos)
            pos = _ws(text, pos)
            if not isinstance(name, str) or text[pos : pos + 1] != ":" or name in spans:
                raise ParseError("collateral JSON: bad or duplicate top-level key")
            start = _ws(text, pos + 1)
            value, pos = dec.raw_decode(text, start)
            spans[name] = (start, pos, value)
            pos = _ws(text, pos)
            if text[pos : pos + 1] == ",":
                pos = _ws(text, pos + 1)
            elif text[pos : pos + 1] != "}":
                raise ParseError("collateral JSON: expected ',' or '}'")
        if _ws(text, pos + 1) != len(text):
            raise ParseError("collateral JSON: data after the object")
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"collateral is not valid JSON: {exc}") from exc
    if set(spans) != {key, "signature"}:
        raise ParseError(f"collateral must hold exactly {key!r} and 'signature', got {sorted(spans)}")
    start, end, value = spans[key]
    sig = _hexbytes(spans["signature"][2], "signature", 64)
    if not isinstance(value, dict):
        raise ParseError(f"{key} is not an object")
    return SignedJson(text[start:end].encode("utf-8"), value, sig)


def _ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _get(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in obj:
        raise ParseError(f"{where}: missing {key!r}")
    value = obj[key]
    # bool is an int subclass in Python; JSON true must not pass as an SVN.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ParseError(f"{where}: {key!r} must be {kind.__name__}")
    if isinstance(value, int) and not 0 <= value < 2**32:
        raise ParseError(f"{where}: {key!r} out of range")
    return value


def _hexbytes(value: Any, where: str, size: int | None = None) -> bytes:
    if not isinstance(value, str):
        raise ParseError(f"{where}: expected a hex string")
    try:
        raw = bytes.fromhex(value)
    except ValueError as exc:
        raise ParseError(f"{where}: bad hex") from exc
    if size is not None and len(raw) != size:
        raise ParseError(f"{where}: expected {size} bytes, got {len(raw)}")
    return raw


def _date(value: Any, where: str) -> dt.datetime:
    if not isinstance(value, str) or not value.endswith("Z"):
        raise ParseError(f"{where}: expected an ISO-8601 UTC time")
    try:
        return dt.datetime.fromisoformat(value[:-1]).replace(tzinfo=dt.UTC)
    except ValueError as exc:
        raise ParseError(f"{where}: bad time {value!r}") from exc


def _level(obj: Any, kind: str) -> Level:
    if not isinstance(obj, dict):
        raise ParseError("tcbLevels entry is not an object")
    tcb = _get(obj, "tcb", dict, "tcbLevel")
    status = _get(obj, "tcbStatus", str, "tcbLevel")
    if status not in _STATUSES:
        raise ParseError(f"unknown tcbStatus {status!r}")
    advisories = obj.get("advisoryIDs", [])
    if not isinstance(advisories, list) or not all(isinstance(a, str) for a in advisories):
        raise ParseError("advisoryIDs must be a list of strings")
    _date(_get(obj, "tcbDate", str, "tcbLevel"), "tcbDate")
    sgx: tuple[int, ...] = ()
    tdx: tuple[int, ...] = ()
    pcesvn = isvsvn = 0
    if kind == "platform":
        sgx = _components(_get(tcb, "sgxtcbcomponents", list, "tcb"))
        tdx = _components(_get(tcb, "tdxtcbcomponents", list, "tcb"))
        pcesvn = _get(tcb, "pcesvn", int, "tcb")
    else:
        isvsvn = _get(tcb, "isvsvn", int, "tcb")
    return Level(sgx, pcesvn, tdx, isvsvn, obj["tcbDate"], _STATUSES[status], tuple(advisories))


def _components(items: list[Any]) -> tuple[int, ...]:
    if len(items) != 16 or not all(isinstance(c, dict) for c in items):
        raise ParseError("TCB components must be 16 objects")
    return tuple(_get(c, "svn", int, "TCB component") for c in items)


def _levels(obj: dict[str, Any], kind: str) -> tuple[Level, ...]:
    levels = _get(obj, "tcbLevels", list, kind)
    if not levels:
        raise ParseError(f"{kind}: empty tcbLevels")
    return tuple(_level(x, kind) for x in levels)


def _module(obj: Any, with_levels: bool) -> ModuleIdentity:
    if not isinstance(obj, dict):
        raise ParseError("TDX module entry is not an object")
    return ModuleIdentity(
        id=_get(obj, "id", str, "tdxModuleIdentity") if with_levels else "",
        mrsigner=_hexbytes(_get(obj, "mrsigner", str, "tdxModule"), "mrsigner", 48),
        attributes=_hexbytes(_get(obj, "attributes", str, "tdxModule"), "attributes", 8),
        attributes_mask=_hexbytes(_get(obj, "attributesMask", str, "tdxModule"), "attributesMask", 8),
        levels=_levels(obj, "module") if with_levels else (),
    )


def parse_tcb_info(value: dict[str, Any]) -> TcbInfo:
    # PCS API: TDX TCB Info is id "TDX", version 3, tcbType 0 (component-wise SVN comparison).
    if value.get("id") != "TDX" or value.get("version") != 3:
        raise CollateralError("tcbInfo is not TDX TCB Info v3")
    if _get(value, "tcbType", int, "tcbInfo") != 0:
        raise CollateralError("tcbInfo tcbType must be 0")
    identities = value.get("tdxModuleIdentities", [])
    if not isinstance(identities, list):
        raise ParseError("tdxModuleIdentities must be a list")
    return TcbInfo(
        issue_date=_date(_get(value, "issueDate", str, "tcbInfo"), "issueDate"),
        next_update=_date(_get(value, "nextUpdate", str, "tcbInfo"), "nextUpdate"),
        fmspc=_hexbytes(_get(value, "fmspc", str, "tcbInfo"), "fmspc", 6),
        pce_id=_hexbytes(_get(value, "pceId", str, "tcbInfo"), "pceId", 2),
        evaluation_number=_get(value, "tcbEvaluationDataNumber", int, "tcbInfo"),
        module=_module(_get(value, "tdxModule", dict, "tcbInfo"), with_levels=False),
        module_identities=tuple(_module(x, with_levels=True) for x in identities),
        levels=_levels(value, "platform"),
    )


def parse_qe_identity(value: dict[str, Any]) -> QeIdentity:
    if value.get("id") != "TD_QE" or value.get("version") != 2:
        raise CollateralError("enclaveIdentity is not TD_QE identity v2")
    where = "enclaveIdentity"
    return QeIdentity(
        issue_date=_date(_get(value, "issueDate", str, where), "issueDate"),
        next_update=_date(_get(value, "nextUpdate", str, where), "nextUpdate"),
        evaluation_number=_get(value, "tcbEvaluationDataNumber", int, where),
        miscselect=int.from_bytes(_hexbytes(_get(value, "miscselect", str, where), "miscselect", 4), "big"),
        miscselect_mask=int.from_bytes(
            _hexbytes(_get(value, "miscselectMask", str, where), "miscselectMask", 4), "big"
        ),
        attributes=_hexbytes(_get(value, "attributes", str, where), "attributes", 16),
        attributes_mask=_hexbytes(_get(value, "attributesMask", str, where), "attributesMask", 16),
        mrsigner=_hexbytes(_get(value, "mrsigner", str, where), "mrsigner", 32),
        isvprodid=_get(value, "isvprodid", int, where),
        levels=_levels(value, "qe"),
    )


def verify_signed_json(signed: SignedJson, signer: x509.Certificate, what: str) -> None:
    """ECDSA-P256-SHA256 over the served bytes, by the TCB Signing certificate."""
    key = signer.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SignatureError(f"{what}: signing certificate key is not ECDSA")
    der = utils.encode_dss_signature(
        int.from_bytes(signed.signature[:32], "big"), int.from_bytes(signed.signature[32:], "big")
    )
    try:
        key.verify(der, signed.body, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise SignatureError(f"{what}: signature does not verify with the TCB Signing key") from exc


def check_window(issue: dt.datetime, next_update: dt.datetime, now: dt.datetime, what: str) -> None:
    if now < issue:
        raise CollateralError(f"{what} is not yet valid at {now.isoformat()} (issued {issue.isoformat()})")
    if now > next_update:
        raise CollateralError(
            f"{what} has expired at {now.isoformat()} (nextUpdate {next_update.isoformat()})"
        )
