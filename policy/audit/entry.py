"""One audit entry, its canonical encoding, hash and signature.

An entry's hash covers every field except the hash and signature themselves, including the
previous entry's hash, so editing, deleting, inserting or reordering any entry breaks the chain.
The component signs the hash with its Ed25519 key, so a writer without the key cannot re-forge
the chain after an edit.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy.audit.lines import field, hex64, json_object
from policy.errors import AuditIntegrityError

FORMAT_VERSION = 1
GENESIS = "0" * 64
_DOMAIN = b"sealed-audit-entry-v1\x00"  # domain separation: an entry hash is never a checkpoint hash

MetaValue = str | int | float | bool | None

# Entries hold decisions and metadata only. These names are refused so that a careless caller
# cannot put a prompt, completion or key into the log; long strings are refused for the same reason.
_FORBIDDEN_KEY_PARTS = ("prompt", "completion", "message", "content", "secret", "password",
                        "passphrase", "private", "plaintext", "data_key", "credential")
_FORBIDDEN_KEYS = frozenset({"key", "text", "input", "output", "body", "api_key", "token"})
_LONG_RUN = re.compile(r"\S{65,}")
_KEY_RE = re.compile(r"^[a-z0-9_.-]{1,64}$")
MAX_META_STR = 256
MAX_REASON = 512
MAX_META_KEYS = 32
MAX_FIELD = 128  # tenant, action and decision (a tenant name from a request is attacker-controlled)
WITHHELD_PREFIX = "~withheld:"
# The one kind of long value an entry may hold: a sealed decision record (base64 of ciphertext only
# the tenant can open, docs/sealed-mode.md); anything else under this key is withheld like a long string.
SEALED_RECORD_KEY = "sealed_record"
MAX_SEALED_RECORD = 8192
_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


@functools.lru_cache(maxsize=4096)
def _key_ok(key: str) -> bool:
    # Cached: callers use a handful of key names, and this runs on every append.
    return (bool(_KEY_RE.match(key)) and key not in _FORBIDDEN_KEYS
            and not any(part in key for part in _FORBIDDEN_KEY_PARTS))


def withheld(value: object) -> str:
    """What the log keeps of a value it must not hold verbatim: a digest and a length, never the
    value. Correlatable (the same value gives the same marker), bounded, and content-free."""
    raw = value if isinstance(value, str) else repr(value)
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{WITHHELD_PREFIX}sha256={digest};len={len(raw)}"


def bounded(value: str, limit: int) -> str:
    """A caller-supplied string as the log may hold it: a PEM marker, or a string longer than
    ``limit``, is replaced by its digest (``withheld``); anything else is kept (JSON escapes it)."""
    if len(value) > limit or "-----BEGIN" in value:
        return withheld(value)
    return value


def bounded_reason(reason: str) -> str:
    """Reasons quote exception texts, which can quote request values: a PEM marker is defused, a
    run of more than 64 non-blank characters (a quoted value, a blob) becomes its digest, and the
    whole is capped at MAX_REASON."""
    reason = _LONG_RUN.sub(lambda m: withheld(m.group(0)), reason.replace("-----BEGIN", "-----(pem)"))
    return reason[:MAX_REASON]


def validate_metadata(metadata: Mapping[str, MetaValue] | None) -> dict[str, MetaValue]:
    """A checked copy of ``metadata``.

    Keys are chosen by code: a key that may carry content or secrets raises ValueError (a bug to
    fix, caught by tests). Values are often attacker-controlled (a TEE type, a model name from a
    request), so an append must never fail on one: a string over MAX_META_STR characters or with
    a PEM marker, a non-scalar, or a non-finite float is replaced by ``withheld(value)``.
    """
    if not metadata:
        return {}
    if len(metadata) > MAX_META_KEYS:
        raise ValueError(f"at most {MAX_META_KEYS} metadata keys")
    out: dict[str, MetaValue] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not _key_ok(key):
            raise ValueError(f"metadata key {key!r} is malformed or may carry content/secrets; not logged")
        if key == SEALED_RECORD_KEY and isinstance(value, str) and len(value) <= MAX_SEALED_RECORD \
                and _BASE64.match(value):
            pass
        elif isinstance(value, str):
            value = bounded(value, MAX_META_STR)
        elif (value is not None and not isinstance(value, int | float | bool)) or (
                isinstance(value, float) and not math.isfinite(value)):  # no stable JSON form
            value = withheld(value)
        out[key] = value
    return out


def canonical(obj: Mapping[str, Any]) -> bytes:
    """Deterministic JSON: sorted keys, no spaces, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def format_ts(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_ts(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


@dataclass(frozen=True)
class AuditEntry:
    """A decision record. ``index`` is its position in its own log file (== seq)."""

    seq: int
    ts: datetime
    component: str
    tenant: str
    action: str
    decision: str
    reason: str
    metadata: Mapping[str, MetaValue]
    prev: str
    hash: str
    sig: str

    def body(self) -> dict[str, Any]:
        """Everything the hash covers."""
        return {
            "v": FORMAT_VERSION, "seq": self.seq, "ts": format_ts(self.ts),
            "component": self.component, "tenant": self.tenant, "action": self.action,
            "decision": self.decision, "reason": self.reason, "metadata": dict(self.metadata),
            "prev": self.prev,
        }

    def to_json(self) -> str:
        return canonical({**self.body(), "hash": self.hash, "sig": self.sig}).decode("ascii")


def entry_hash(body: Mapping[str, Any]) -> bytes:
    return hashlib.sha256(_DOMAIN + canonical(body)).digest()


def make_entry(signer: Ed25519PrivateKey, *, seq: int, ts: datetime, component: str, tenant: str,
               action: str, decision: str, reason: str, metadata: dict[str, MetaValue],
               prev: str) -> tuple[AuditEntry, bytes]:
    """Build, hash and sign an entry (metadata must already be validated).

    Returns the entry and its JSONL line. The line is the canonical body with hash and signature
    appended, so the body is encoded once per append (this is the hot path of the log).
    """
    body = {"v": FORMAT_VERSION, "seq": seq, "ts": format_ts(ts), "component": component,
            "tenant": tenant, "action": action, "decision": decision, "reason": reason,
            "metadata": metadata, "prev": prev}
    encoded = canonical(body)
    digest = hashlib.sha256(_DOMAIN + encoded).digest()
    digest_hex, sig_hex = digest.hex(), signer.sign(digest).hex()
    line = encoded[:-1] + b',"hash":"' + digest_hex.encode() + b'","sig":"' + sig_hex.encode() + b'"}\n'
    entry = AuditEntry(seq, ts, component, tenant, action, decision, reason,
                       MappingProxyType(metadata), prev, digest_hex, sig_hex)
    return entry, line


def parse_entry(line: str | bytes, index: int = 0, path: str | None = None) -> tuple[AuditEntry, dict[str, Any]]:
    """Parse one JSONL line; returns the entry and the raw body (for re-hashing as written).
    Anything malformed is an AuditIntegrityError naming line `index` of `path`."""
    raw = json_object(line, index, path, "entry")
    if raw.get("v") != FORMAT_VERSION:
        raise AuditIntegrityError(index, f"unknown entry format version {str(raw.get('v'))[:20]!r}", path)
    expected = {"v", "seq", "ts", "component", "tenant", "action", "decision", "reason",
                "metadata", "prev", "hash", "sig"}
    if set(raw) != expected:
        raise AuditIntegrityError(index, f"entry fields {sorted(set(raw) ^ expected)[:8]} unexpected or missing",
                                  path)
    body = {k: v for k, v in raw.items() if k not in ("hash", "sig")}
    seq, metadata = field(raw, "seq", int, index, path, "entry"), field(raw, "metadata", dict, index, path, "entry")
    text = {k: field(raw, k, str, index, path, "entry")
            for k in ("ts", "component", "tenant", "action", "decision", "reason", "prev", "sig")}
    try:
        ts = parse_ts(text["ts"])
    except ValueError as exc:
        raise AuditIntegrityError(index, f"malformed entry: {exc}", path) from None
    entry = AuditEntry(seq, ts, text["component"], text["tenant"], text["action"], text["decision"],
                       text["reason"], MappingProxyType(metadata), text["prev"],
                       hex64(raw, "hash", index, path, "entry"), text["sig"])
    return entry, body


def check_signature(entry: AuditEntry, digest: bytes, key: Ed25519PublicKey) -> bool:
    try:
        key.verify(bytes.fromhex(entry.sig), digest)
    except (InvalidSignature, ValueError):
        return False
    return True
