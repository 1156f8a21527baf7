"""Signed reference values: a tenant-signed list of allowed measurements that a release policy can
reference by id. Verified (Ed25519, the tenant's registered keys) on upload and again on every
load, so a file edited on disk is refused rather than trusted.

Envelope: {"payload": {"kind", "tenant", "id", "version", "measurements": [hex]}, "key_id", "alg":
"Ed25519", "sig": hex}. The signature covers SHA-256(domain || canonical JSON of the payload).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from key_broker.errors import ReferenceValuesError
from key_broker.names import check_name
from key_broker.statefile import StateFiles, UnsafePlainFiles

KIND = "sealed-reference-values-v1"
ALG = "Ed25519"
_DOMAIN = b"sealed-reference-values-v1\x00"
_HEX = frozenset("0123456789abcdef")


def _canonical(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(payload), sort_keys=True, separators=(",", ":")).encode()


def _digest(payload: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(_DOMAIN + _canonical(payload)).digest()


@dataclass(frozen=True)
class ReferenceValues:
    tenant: str
    id: str
    version: int
    measurements: frozenset[str]
    digest: str  # of the signed payload, for audit records


def sign_reference_values(tenant: str, ref_id: str, version: int, measurements: list[str],
                          key: Ed25519PrivateKey, key_id: str) -> dict[str, Any]:
    payload = {"kind": KIND, "tenant": tenant, "id": ref_id, "version": version,
               "measurements": sorted(m.lower() for m in measurements)}
    _parse_payload(payload)
    return {"payload": payload, "key_id": key_id, "alg": ALG, "sig": key.sign(_digest(payload)).hex()}


def _parse_payload(payload: Any) -> ReferenceValues:
    if not isinstance(payload, dict) or set(payload) != {"kind", "tenant", "id", "version", "measurements"}:
        raise ReferenceValuesError("reference values payload has missing or unknown fields")
    if payload["kind"] != KIND:
        raise ReferenceValuesError("not a reference values document")
    tenant, ref_id, version = payload["tenant"], payload["id"], payload["version"]
    check_name(tenant, "tenant"), check_name(ref_id, "reference values id")
    if type(version) is not int or version < 1:
        raise ReferenceValuesError("reference values version must be a positive int")
    ms = payload["measurements"]
    if not isinstance(ms, list) or not all(isinstance(m, str) and m and set(m) <= _HEX for m in ms):
        raise ReferenceValuesError("measurements must be a list of lower-case hex strings")
    digest = hashlib.sha256(_canonical(payload)).hexdigest()
    return ReferenceValues(tenant, ref_id, version, frozenset(ms), digest)


def verify_reference_values(envelope: Any, keys: Mapping[str, Ed25519PublicKey]) -> ReferenceValues:
    """Check the envelope's signature with one of the tenant's registered keys, then parse it."""
    if not isinstance(envelope, dict) or set(envelope) != {"payload", "key_id", "alg", "sig"}:
        raise ReferenceValuesError("reference values envelope must have exactly payload, key_id, alg, sig")
    if envelope["alg"] != ALG:
        raise ReferenceValuesError("unsupported signature algorithm")
    key = keys.get(str(envelope["key_id"]))
    if key is None:
        raise ReferenceValuesError("reference values signed by an unknown key")
    payload = envelope["payload"]
    try:
        key.verify(bytes.fromhex(str(envelope["sig"])), _digest(payload))
    except (InvalidSignature, ValueError, TypeError) as exc:
        raise ReferenceValuesError("reference values signature does not verify") from exc
    return _parse_payload(payload)


class ReferenceValuesStore:
    """refvals/<tenant>/keys/<kid>.pem (trusted signing keys) and refvals/<tenant>/docs/<id>.json."""

    def __init__(self, root: Path, files: StateFiles | None = None) -> None:
        self._root = root / "refvals"
        # A planted signing key would let anyone sign reference values: keys and documents are
        # read only through the state ledger.
        self._files = files if files is not None else UnsafePlainFiles(root)

    def _tenant_dir(self, tenant: str) -> Path:
        return self._root / check_name(tenant, "tenant")

    def add_signing_key(self, tenant: str, key_id: str, public_pem: bytes) -> None:
        try:
            key = serialization.load_pem_public_key(public_pem)
        except ValueError as exc:
            raise ReferenceValuesError("signing key is not a PEM public key") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise ReferenceValuesError("signing key must be Ed25519")
        self._files.write(self._tenant_dir(tenant) / "keys" / f"{check_name(key_id, 'key id')}.pem", public_pem)

    def signing_keys(self, tenant: str) -> dict[str, Ed25519PublicKey]:
        keys: dict[str, Ed25519PublicKey] = {}
        for path in self._files.list(self._tenant_dir(tenant) / "keys", ".pem"):
            raw = self._files.read(path)
            if raw is None:
                continue
            key = serialization.load_pem_public_key(raw)
            if isinstance(key, Ed25519PublicKey):
                keys[path.stem] = key
        return keys

    def put(self, tenant: str, envelope: Any) -> ReferenceValues:
        values = verify_reference_values(envelope, self.signing_keys(tenant))
        if values.tenant != tenant:
            raise ReferenceValuesError("reference values are for another tenant")
        try:
            current = self.load(tenant, values.id)
        except ReferenceValuesError:
            current = None
        if current is not None and values.version <= current.version:
            raise ReferenceValuesError(f"version {values.version} is not newer than {current.version}")
        self._files.write(self._tenant_dir(tenant) / "docs" / f"{values.id}.json", json.dumps(envelope).encode())
        return values

    def load(self, tenant: str, ref_id: str) -> ReferenceValues:
        path = self._tenant_dir(tenant) / "docs" / f"{check_name(ref_id, 'reference values id')}.json"
        try:
            raw = self._files.read(path)
            if raw is None:
                raise ReferenceValuesError(f"no reference values {ref_id} for {tenant}")
            envelope = json.loads(raw)
        except (OSError, ValueError) as exc:
            raise ReferenceValuesError("reference values file unreadable") from exc
        values = verify_reference_values(envelope, self.signing_keys(tenant))
        if values.tenant != tenant or values.id != ref_id:
            raise ReferenceValuesError("reference values file does not match its tenant and id")
        return values
