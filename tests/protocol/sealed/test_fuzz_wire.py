"""Hypothesis over the sealed wire format, from the published vectors (tests/vectors/sealed): mutated
requests, response streams, response heads and receipts raise only SealedError, never a crash."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given

from protocol.sealed.errors import SealedError
from protocol.sealed.hpke import SUITE, RequestContext, WorkerKey, open_request, seal_request
from protocol.sealed.http import ResponseHead
from protocol.sealed.receipt import verify_receipt
from protocol.sealed.replay import ReplayGuard
from protocol.sealed.response import ResponseOpener
from tests.fuzzing import DEEP_JSON, budget, mutated

V = json.loads((Path(__file__).resolve().parents[2] / "vectors" / "sealed" / "sealed-mode-v4.json").read_text())
WORKER = WorkerKey(X25519PrivateKey.from_private_bytes(bytes.fromhex(V["worker_private_key"])))
CTX = RequestContext(**V["context"])
NOW = V["timestamp_ms"] / 1000
REQUEST = bytes.fromhex(V["request"])
RESPONSE = bytes.fromhex(V["response"])
SEALED = seal_request(WORKER.public_bytes, CTX, V["body"].encode(), NOW,
                      _ephemeral=SUITE.kem.derive_key_pair(bytes.fromhex(V["ephemeral_ikm"])))
assert SEALED.wire == REQUEST  # the vectors reproduce, so the opener below matches the response
HEAD, RECEIPT = V["chunks"][0]["plaintext"].encode(), V["chunks"][-1]["plaintext"].encode()


@budget(300)
@given(mutated([REQUEST]))
def test_fuzz_sealed_request(wire: bytes) -> None:
    with contextlib.suppress(SealedError):
        open_request(WORKER, CTX, wire, NOW, ReplayGuard())


@budget(300)
@given(mutated([RESPONSE]))
def test_fuzz_sealed_response_stream(stream: bytes) -> None:
    opener = ResponseOpener(SEALED.opener._secret, SEALED.opener._enc)
    with contextlib.suppress(SealedError):
        for at in range(0, len(stream), 97):  # arbitrary pieces, as a network delivers them
            opener.feed(stream[at:at + 97])
        opener.close()


@budget(300)
@given(mutated([HEAD, RECEIPT, *DEEP_JSON]))
def test_fuzz_response_head_and_receipt(chunk: bytes) -> None:
    with contextlib.suppress(SealedError):
        ResponseHead.decode(chunk)
    with contextlib.suppress(SealedError):
        verify_receipt(chunk, bytes.fromhex(V["receipt_public_key"]), request_sha256=V["request_sha256"],
                       response_sha256=V["response_sha256"], worker_key_id=V["worker_key_id"],
                       model=CTX.model)
