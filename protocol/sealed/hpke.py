"""Sealed requests: RFC 9180 HPKE base mode to the worker's attested X25519 key.

Suite: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM (the suite key release uses). One
fresh encapsulation per request. Everything the gateway routes by or relays beside the ciphertext,
and everything the worker decides by, is the AEAD's associated data (`RequestContext`): tenant,
model, model version, endpoint, worker key id, the API key id (the worker's in-enclave policy picks
its per-key rules by it) and the tenant policy version the client verified. A gateway that moves a
request to another model, tenant, version or endpoint, or relabels its API key id, makes it fail to
open. The response key is exported from the same HPKE context (RFC 9180 §5.3), as RFC 9458
§4.4 does for OHTTP responses: see response.py.

Library: `pyhpke` (built on `cryptography`). cryptography 50's `hazmat.primitives.hpke` is
single-shot only (no associated data, no secret export), which this protocol needs; a test checks
that both libraries interoperate on the same suite (tests/protocol/sealed/test_hpke.py).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from pyhpke import AEADId, CipherSuite, KDFId, KEMId, KEMKey, KEMKeyPair, OpenError

from protocol.sealed.errors import RequestRejected, SealedFormatError, WrongWorkerKey
from protocol.sealed.padding import DEFAULT_PADDING, PaddingPolicy, pad, unpad
from protocol.sealed.replay import ReplayGuard
from protocol.sealed.response import RESPONSE_EXPORT_LABEL, SECRET_BYTES, ResponseOpener, ResponseSealer

# v4: the padded plaintext starts with the caller's credential (the tenant's caller policy is checked
# in the worker against it); v3 (no credential), v2 (padding, the old context) and v1 (unpadded) are
# refused.
VERSION = 4
SUITE = CipherSuite.new(KEMId.DHKEM_X25519_HKDF_SHA256, KDFId.HKDF_SHA256, AEADId.AES256_GCM)
REQUEST_INFO = b"sealed-request-v4"
_AAD_LABEL = b"sealed-request-v4\x00"
_POLICY_VERSION = struct.Struct(">Q")
ENC_BYTES = 32
MAX_FIELD = 0xFFFF


def key_id(public_key: bytes) -> str:
    """The worker key id: hex SHA-256 of the raw X25519 public key (what the client pins)."""
    if len(public_key) != 32:
        raise SealedFormatError("a worker key is a 32-byte X25519 public key")
    return hashlib.sha256(public_key).hexdigest()


def api_key_id(api_key: str) -> str:
    """The id the control plane gives an API key: "key_" + the first 16 hex of SHA-256(key). The client
    computes it from the key it holds, so the gateway cannot relabel a request with another key's id."""
    return "key_" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RequestContext:
    """What the gateway may see and must not change: bound as the request's associated data.

    The client fills it from what it verified (tenant, model, version and policy version from the
    workload claims REPORT_DATA binds; the worker key it pinned) and from its own API key; the worker
    from its own settings and signed policy, and from the gateway's authenticated tenant and key id."""

    tenant: str
    model: str
    endpoint: str  # "/v1/chat/completions" | "/v1/completions"
    key_id: str  # the worker key id the client pinned
    version: str  # the model version the worker serves
    api_key_id: str  # the API key's id (api_key_id()): the in-enclave policy's per-key rules use it
    policy_version: int  # the tenant's signed policy set in force in the worker (0: none)

    def aad(self) -> bytes:
        out = bytearray(_AAD_LABEL)
        for value in (self.tenant, self.model, self.endpoint, self.key_id, self.version, self.api_key_id):
            raw = value.encode()
            if len(raw) > MAX_FIELD:
                raise SealedFormatError("request context field too long")
            out += struct.pack(">H", len(raw)) + raw
        if not 0 <= self.policy_version < 2**63:
            raise SealedFormatError("policy version out of range")
        return bytes(out + _POLICY_VERSION.pack(self.policy_version))


class WorkerKey:
    """The worker's long-lived serving key (made at process start, bound into its evidence)."""

    def __init__(self, private_key: X25519PrivateKey) -> None:
        self._private = private_key
        self.public_bytes = private_key.public_key().public_bytes(serialization.Encoding.Raw,
                                                                  serialization.PublicFormat.Raw)
        self.key_id = key_id(self.public_bytes)
        self._kem_key = KEMKey.from_pyca_cryptography_key(private_key)

    @classmethod
    def generate(cls) -> WorkerKey:
        return cls(X25519PrivateKey.generate())

    @property
    def private_key(self) -> X25519PrivateKey:
        return self._private


@dataclass(frozen=True)
class SealedRequest:
    """What the client sends (`wire`) and keeps (`opener` for the answer, `request_sha256` for the receipt)."""

    wire: bytes
    opener: ResponseOpener
    request_sha256: str


@dataclass(frozen=True)
class OpenedRequest:
    body: bytes
    timestamp_ms: int
    sealer: ResponseSealer
    request_sha256: str
    # The caller's credential as the client sealed it (protocol/sealed/caller.py; b"": none): only the
    # worker sees it, and checks it against the tenant's signed caller policy.
    caller: bytes = b""


def _plaintext(body: bytes, timestamp_ms: int, padding: PaddingPolicy, caller: bytes) -> bytes:
    if len(caller) > MAX_FIELD:
        raise SealedFormatError("caller credential too long")
    return struct.pack(">Q", timestamp_ms) + pad(struct.pack(">H", len(caller)) + caller + body, padding)


def seal_request(worker_public_key: bytes, ctx: RequestContext, body: bytes, now_s: float, *,
                 padding: PaddingPolicy = DEFAULT_PADDING, caller: bytes = b"",
                 _ephemeral: KEMKeyPair | None = None) -> SealedRequest:
    """Client side. The caller's credential (`caller`, protocol/sealed/caller.py) and the body are
    padded together to `padding`'s bucket, so the gateway sees a size class.
    `_ephemeral` fixes the encapsulation key for the checked-in test vectors only."""
    if key_id(worker_public_key) != ctx.key_id:
        raise WrongWorkerKey("request context names another worker key than the one sealed to")
    recipient = KEMKey.from_pyca_cryptography_key(X25519PublicKey.from_public_bytes(worker_public_key))
    enc, sender = SUITE.create_sender_context(recipient, info=REQUEST_INFO, eks=_ephemeral)
    plaintext = _plaintext(body, int(now_s * 1000), padding, caller)
    ciphertext = sender.seal(plaintext, aad=ctx.aad())
    secret = sender.export(RESPONSE_EXPORT_LABEL, SECRET_BYTES)
    return SealedRequest(wire=bytes([VERSION]) + enc + ciphertext, opener=ResponseOpener(secret, enc),
                         request_sha256=hashlib.sha256(plaintext).hexdigest())


def open_request(worker: WorkerKey, ctx: RequestContext, wire: bytes, now_s: float, replay: ReplayGuard,
                 *, response_padding: PaddingPolicy = DEFAULT_PADDING,
                 _response_nonce: bytes | None = None) -> OpenedRequest:
    """Worker side: check the key id, open with the context as associated data, refuse replays.
    The answer's chunks are padded to `response_padding`'s buckets."""
    if ctx.key_id != worker.key_id:
        raise WrongWorkerKey("request is sealed to another worker key")
    if len(wire) < 1 + ENC_BYTES + 16 or wire[0] != VERSION:
        raise SealedFormatError(f"not a version-{VERSION} sealed request")
    enc = wire[1:1 + ENC_BYTES]
    try:
        recipient = SUITE.create_recipient_context(enc, worker._kem_key, info=REQUEST_INFO)
        plaintext = recipient.open(wire[1 + ENC_BYTES:], aad=ctx.aad())
    except (OpenError, ValueError) as exc:
        raise RequestRejected("sealed request does not open under this worker key and context (tampered, or "
                              "its tenant, model, version, endpoint, API key id or policy version changed "
                              "on the way)") from exc
    if len(plaintext) < 8:
        raise SealedFormatError("sealed request has no timestamp")
    (timestamp_ms,) = struct.unpack(">Q", plaintext[:8])
    inner = unpad(plaintext[8:])
    if len(inner) < 2 or len(inner) < 2 + struct.unpack(">H", inner[:2])[0]:
        raise SealedFormatError("sealed request has no caller credential field")
    caller_len = struct.unpack(">H", inner[:2])[0]
    caller, body = inner[2:2 + caller_len], inner[2 + caller_len:]
    replay.check(enc, timestamp_ms / 1000.0, now_s)
    secret = recipient.export(RESPONSE_EXPORT_LABEL, SECRET_BYTES)
    return OpenedRequest(body=body, timestamp_ms=timestamp_ms,
                         sealer=ResponseSealer(secret, enc, _response_nonce, response_padding),
                         request_sha256=hashlib.sha256(plaintext).hexdigest(), caller=caller)
