"""Sealed-mode wire format: checked-in vectors, HPKE interop, and the negative table of the protocol."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite
from pyhpke import KEMKey

from protocol.sealed import (
    Receipt,
    ReceiptInvalid,
    ReplayGuard,
    RequestContext,
    RequestRejected,
    RequestReplayed,
    ResponseCorrupted,
    SealedFormatError,
    WorkerKey,
    WrongWorkerKey,
    open_request,
    seal_request,
    sign_receipt,
    verify_receipt,
)
from protocol.sealed.hpke import SUITE
from protocol.sealed.http import ResponseHead
from protocol.sealed.vectors import build_vectors


def ctx_for(worker_key_id: str, tenant: str = "acme", model: str = "m", endpoint: str = "/v1/chat/completions",
            **changes: object) -> RequestContext:
    """A request context with the bindings every test shares; `changes` relabel one of them."""
    fields: dict[str, object] = {"version": "v1", "api_key_id": "key_0123456789abcdef", "policy_version": 3}
    fields.update(changes)
    return RequestContext(tenant, model, endpoint, worker_key_id, **fields)  # type: ignore[arg-type]

VECTORS = Path(__file__).parents[2] / "vectors" / "sealed" / "sealed-mode-v4.json"
NOW = 1_800_000_000.0


def test_checked_in_vectors_are_what_the_code_generates() -> None:
    assert json.loads(VECTORS.read_text()) == build_vectors()


def test_checked_in_vectors_open_with_the_worker_key() -> None:
    v = json.loads(VECTORS.read_text())
    worker = WorkerKey(X25519PrivateKey.from_private_bytes(bytes.fromhex(v["worker_private_key"])))
    ctx = RequestContext(**v["context"])
    opened = open_request(worker, ctx, bytes.fromhex(v["request"]), v["timestamp_ms"] / 1000, ReplayGuard(),
                          _response_nonce=bytes.fromhex(v["response_nonce"]))
    assert opened.body.decode() == v["body"]
    frames = [opened.sealer.seal(c["plaintext"].encode(), final=c["final"]) for c in v["chunks"]]
    assert [f.hex() for f in frames] == v["frames"]


def test_suite_interoperates_with_cryptography_hpke() -> None:
    """The suite is RFC 9180's: cryptography's single-shot HPKE opens what pyhpke seals, and back."""
    sk = X25519PrivateKey.generate()
    crypto_suite = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_256_GCM)
    enc, sender = SUITE.create_sender_context(KEMKey.from_pyca_cryptography_key(sk.public_key()), info=b"i")
    assert crypto_suite.decrypt(enc + sender.seal(b"one"), sk, info=b"i") == b"one"
    sealed = crypto_suite.encrypt(b"two", sk.public_key(), info=b"i")
    recipient = SUITE.create_recipient_context(sealed[:32], KEMKey.from_pyca_cryptography_key(sk), info=b"i")
    assert recipient.open(sealed[32:]) == b"two"


def _pair(worker: WorkerKey | None = None) -> tuple[WorkerKey, RequestContext]:
    worker = worker or WorkerKey.generate()
    return worker, ctx_for(worker.key_id)


def _raw(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def _exchange(chunks: list[bytes]) -> tuple[object, bytes, str, str, Ed25519PrivateKey, WorkerKey]:
    worker, ctx = _pair()
    sealed = seal_request(worker.public_bytes, ctx, b'{"hello": 1}', NOW)
    opened = open_request(worker, ctx, sealed.wire, NOW, ReplayGuard())
    signer = Ed25519PrivateKey.generate()
    frames = [opened.sealer.seal(c) for c in chunks]
    receipt = Receipt(opened.request_sha256, opened.sealer.hash.hexdigest(), worker.key_id, "acme", "m", "v1",
                      "d", 3, 5, 7, "sim", True, NOW, api_key_id=ctx.api_key_id, signing_key=_raw(signer),
                      channel_spki="", evidence_sha256="ee" * 32)
    frames.append(opened.sealer.seal(sign_receipt(receipt, signer), final=True))
    return sealed, opened.sealer.header(), frames, sealed.request_sha256, signer, worker  # type: ignore[return-value]


def test_round_trip_with_receipt() -> None:
    sealed, header, frames, request_hash, signer, worker = _exchange([b"a", b"bb", b""])
    out = sealed.opener.feed(header + b"".join(frames))  # type: ignore[attr-defined]
    sealed.opener.close()  # type: ignore[attr-defined]
    assert [c for c, _ in out[:-1]] == [b"a", b"bb", b""] and out[-1][1]
    public = signer.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    receipt = verify_receipt(out[-1][0], public, request_sha256=request_hash,
                             response_sha256=sealed.opener.hash.hexdigest(),  # type: ignore[attr-defined]
                             worker_key_id=worker.key_id, model="m")
    assert (receipt.prompt_tokens, receipt.completion_tokens, receipt.policy_version) == (5, 7, 3)


def test_byte_by_byte_feeding_gives_the_same_chunks() -> None:
    sealed, header, frames, *_ = _exchange([b"x" * 100, b"y"])
    data = header + b"".join(frames)
    got = [c for i in range(len(data)) for c in sealed.opener.feed(data[i:i + 1])]  # type: ignore[attr-defined]
    assert [c for c, _ in got[:2]] == [b"x" * 100, b"y"]


# -- requests: each gets its typed error, and nothing is returned
def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


@pytest.mark.parametrize("case, error", [
    ("sealed to another worker's key", WrongWorkerKey),
    ("sealed to another worker's key, key id rewritten by the gateway", RequestRejected),
    ("key id of another worker in the context", WrongWorkerKey),
    ("tampered encapsulated key", RequestRejected),
    ("tampered ciphertext", RequestRejected),
    ("tampered tag", RequestRejected),
    ("model changed by the gateway", RequestRejected),
    ("tenant changed by the gateway", RequestRejected),
    ("endpoint changed by the gateway", RequestRejected),
    ("API key id relabelled by the gateway", RequestRejected),
    ("version changed by the gateway", RequestRejected),
    ("policy version other than the client verified", RequestRejected),
    ("replayed", RequestReplayed),
    ("stale", RequestReplayed),
    ("from the future", RequestReplayed),
    ("truncated", SealedFormatError),
    ("unknown version", SealedFormatError),
    ("version 1 (unpadded)", SealedFormatError),
    ("version 2 (context without version, API key id, policy version)", SealedFormatError),
    ("version 3 (no caller credential)", SealedFormatError),
])
def test_request_negative_table(case: str, error: type[Exception]) -> None:
    worker, ctx = _pair()
    other, _ = _pair()
    guard, now, body = ReplayGuard(), NOW, b'{"messages": "secret"}'
    sealed = seal_request(worker.public_bytes, ctx, body, NOW).wire
    opener_key, opener_ctx = worker, ctx
    if case == "sealed to another worker's key":
        sealed = seal_request(other.public_bytes, ctx_for(other.key_id), body,
                              NOW).wire
        opener_ctx = ctx_for(other.key_id)
    elif case == "sealed to another worker's key, key id rewritten by the gateway":
        sealed = seal_request(other.public_bytes, ctx_for(other.key_id), body,
                              NOW).wire
    elif case == "key id of another worker in the context":
        opener_ctx = ctx_for(other.key_id)
    elif case == "tampered encapsulated key":
        sealed = _flip(sealed, 5)
    elif case == "tampered ciphertext":
        sealed = _flip(sealed, 40)
    elif case == "tampered tag":
        sealed = _flip(sealed, len(sealed) - 1)
    elif case == "model changed by the gateway":
        opener_ctx = ctx_for(ctx.key_id, model="other-model")
    elif case == "tenant changed by the gateway":
        opener_ctx = ctx_for(ctx.key_id, tenant="globex")
    elif case == "endpoint changed by the gateway":
        opener_ctx = ctx_for(ctx.key_id, endpoint="/v1/completions")
    elif case == "API key id relabelled by the gateway":
        opener_ctx = ctx_for(ctx.key_id, api_key_id="key_fedcba9876543210")
    elif case == "version changed by the gateway":
        opener_ctx = ctx_for(ctx.key_id, version="v2")
    elif case == "policy version other than the client verified":
        opener_ctx = ctx_for(ctx.key_id, policy_version=2)
    elif case == "replayed":
        open_request(worker, ctx, sealed, now, guard)
    elif case == "stale":
        now = NOW + 301
    elif case == "from the future":
        now = NOW - 301
    elif case == "truncated":
        sealed = sealed[:40]
    elif case == "unknown version":
        sealed = b"\x05" + sealed[1:]
    elif case == "version 3 (no caller credential)":
        sealed = b"\x03" + sealed[1:]
    elif case == "version 2 (context without version, API key id, policy version)":
        sealed = b"\x02" + sealed[1:]
    elif case == "version 1 (unpadded)":
        sealed = b"\x01" + sealed[1:]
    with pytest.raises(error):
        open_request(opener_key, opener_ctx, sealed, now, guard)


def test_replay_guard_forgets_only_outside_the_window() -> None:
    guard = ReplayGuard(window_s=10)
    guard.check(b"a", 100.0, 100.0)
    with pytest.raises(RequestReplayed):
        guard.check(b"a", 100.0, 109.0)
    guard.check(b"b", 125.0, 125.0)  # prunes "a" (older than two windows); "a" is stale anyway
    with pytest.raises(RequestReplayed):
        guard.check(b"a", 100.0, 125.0)


# -- responses
@pytest.mark.parametrize("case", ["dropped", "reordered", "truncated", "tampered", "final flag flipped",
                                  "data after final", "duplicated", "wrong request's stream"])
def test_response_negative_table(case: str) -> None:
    sealed, header, frames, *_ = _exchange([b"one", b"two", b"three"])
    if case == "dropped":
        frames = [frames[0], frames[2], frames[3]]
    elif case == "reordered":
        frames = [frames[1], frames[0], *frames[2:]]
    elif case == "truncated":
        frames = frames[:-1]
    elif case == "tampered":
        frames[1] = _flip(frames[1], 7)
    elif case == "final flag flipped":
        frames[-1] = b"\x00" + frames[-1][1:]
    elif case == "data after final":
        frames.append(frames[0])
    elif case == "duplicated":
        frames = [frames[0], frames[0], *frames[1:]]
    elif case == "wrong request's stream":
        _other, other_header, other_frames, *_ = _exchange([b"one", b"two", b"three"])
        header, frames = other_header, other_frames
    with pytest.raises(ResponseCorrupted):
        sealed.opener.feed(header + b"".join(frames))  # type: ignore[attr-defined]
        sealed.opener.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", ["response mismatch", "request mismatch", "other signer", "unsigned",
                                  "other worker key", "other model", "other API key id", "other policy version",
                                  "other tenant", "other version", "signing key field rewritten",
                                  "version 1 receipt"])
def test_receipt_negative_table(case: str) -> None:
    sealed, header, frames, request_hash, signer, worker = _exchange([b"answer"])
    chunks = sealed.opener.feed(header + b"".join(frames))  # type: ignore[attr-defined]
    final = chunks[-1][0]
    public = signer.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    kwargs = {"request_sha256": request_hash, "response_sha256": sealed.opener.hash.hexdigest(),  # type: ignore[attr-defined]
              "worker_key_id": worker.key_id, "model": "m"}
    if case == "response mismatch":
        kwargs["response_sha256"] = "00" * 32
    elif case == "request mismatch":
        kwargs["request_sha256"] = "00" * 32
    elif case == "other signer":
        public = Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                        serialization.PublicFormat.Raw)
    elif case == "unsigned":
        doc = json.loads(final)
        doc.pop("signature")
        final = json.dumps(doc).encode()
    elif case == "other worker key":
        kwargs["worker_key_id"] = "ab" * 32
    elif case == "other model":
        kwargs["model"] = "n"
    elif case == "other API key id":
        kwargs["api_key_id"] = "key_fedcba9876543210"
    elif case == "other policy version":
        kwargs["policy_version"] = 4
    elif case == "other tenant":
        kwargs["tenant"] = "globex"
    elif case == "other version":
        kwargs["model_version"] = "v2"
    elif case == "signing key field rewritten":  # names another key: its signature no longer verifies
        doc = json.loads(final)
        doc["receipt"]["signing_key"] = _raw(Ed25519PrivateKey.generate())
        final = json.dumps(doc).encode()
    elif case == "version 1 receipt":
        doc = json.loads(final)
        doc["receipt"]["version"] = 1
        final = json.dumps(doc).encode()
    with pytest.raises(ReceiptInvalid):
        verify_receipt(final, public, **kwargs)


def test_receipt_carries_what_a_third_party_needs() -> None:
    """Signature, key and evidence reference travel in the receipt: read_signed_receipt checks it alone."""
    from protocol.sealed.receipt import read_signed_receipt

    sealed, header, frames, _, signer, _ = _exchange([b"answer"])
    final = sealed.opener.feed(header + b"".join(frames))[-1][0]  # type: ignore[attr-defined]
    receipt = read_signed_receipt(final)
    assert receipt.signing_key == _raw(signer) and receipt.evidence_sha256 == "ee" * 32
    assert receipt.api_key_id == "key_0123456789abcdef" and receipt.version == 2
    doc = json.loads(final)
    doc["receipt"]["prompt_tokens"] += 1
    with pytest.raises(ReceiptInvalid, match="not signed by the key it names"):
        read_signed_receipt(json.dumps(doc).encode())


def test_api_key_id_is_the_control_planes() -> None:
    """The client derives the id from its key as the control plane does (api/store/repo.py)."""
    from api.store.repo import hash_secret
    from protocol.sealed import api_key_id

    assert api_key_id("sk-sealed-abc") == "key_" + hash_secret("sk-sealed-abc")[:16]


def test_response_head_must_be_a_head() -> None:
    assert ResponseHead.decode(ResponseHead(200, "application/json").encode()).status == 200
    with pytest.raises(ResponseCorrupted):
        ResponseHead.decode(b"data: hello")


def test_the_caller_credential_reaches_only_the_worker() -> None:
    """The credential is sealed with the body (inside the padding): the worker reads it back exactly; an
    empty one is none; a length that runs past the plaintext is a format error."""
    from protocol.sealed.caller import CallerCredential, read_caller

    worker, ctx = _pair()
    caller = CallerCredential(api_key="sk-sealed-abc", oidc_token="eyJ.x.y").encode()
    sealed = seal_request(worker.public_bytes, ctx, b'{"messages": []}', NOW, caller=caller)
    assert b"sk-sealed-abc" not in sealed.wire
    opened = open_request(worker, ctx, sealed.wire, NOW, ReplayGuard())
    assert opened.body == b'{"messages": []}' and read_caller(opened.caller) == CallerCredential("sk-sealed-abc",
                                                                                                   "eyJ.x.y")
    none = open_request(worker, ctx, seal_request(worker.public_bytes, ctx, b"{}", NOW).wire, NOW, ReplayGuard())
    assert none.caller == b"" and read_caller(none.caller) == CallerCredential()
    for bad in (b"[]", b'{"api_key": 1}', b'{"who": "x"}', b"\xff"):
        with pytest.raises(SealedFormatError):
            read_caller(bad)
