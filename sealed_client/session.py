"""Sans-IO core of the client: pins, sealing, and reading a sealed answer. Transports do the I/O."""

from __future__ import annotations

import base64
import collections
import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from attestation.errors import AttestationError
from attestation.token import TokenVerifier
from protocol.sealed import (
    ReattestRequired,
    Receipt,
    ReceiptInvalid,
    RequestContext,
    RequestRejected,
    RequestReplayed,
    SealedFormatError,
    SealedRequest,
    seal_request,
    verify_receipt,
)
from protocol.sealed.http import (
    ENDPOINTS,
    HEADER_KEY_ID,
    HEADER_MODEL,
    REATTEST_CODE,
    REQUEST_CONTENT_TYPE,
    RESPONSE_CONTENT_TYPE,
    ResponseHead,
    sealed_path,
)
from protocol.sealed.padding import DEFAULT_PADDING, PaddingPolicy
from sealed_client.deployment import ClientTrust, PinnedKey, verify_published, verify_sealed_document

RECEIPT_HEADER = "Sealed-Receipt"


class NoAttestedWorker(ReattestRequired):
    """No worker of the deployment serves this model (the SDK sees OpenAI's 404, as in plaintext)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist or no attested worker serves it.")
        self.model = model

    def as_response_body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": "model",
                          "code": "model_not_found"}}


def endpoint_of(path: str) -> tuple[str, str] | None:
    """("/prefix", "/v1/chat/completions") for a path that ends in a sealable endpoint."""
    for endpoint in ENDPOINTS:
        if path.endswith(endpoint):
            return path[: -len(endpoint)], endpoint
    return None


@dataclass(frozen=True)
class Exchange:
    """One sealed request in flight: what the answer must match."""

    pin: PinnedKey
    sealed: SealedRequest


class SealedSession:
    """Pins per model (verified on first use, again on every key change); seals; checks answers.

    ``clock`` returns now (tests inject one). ``receipts`` keeps the last verified receipts.
    ``padding``: the size buckets request bodies are padded to, so the gateway sees a size class.
    """

    def __init__(self, trust: ClientTrust, *, clock: Callable[[], dt.datetime] | None = None,
                 keep_receipts: int = 1000, padding: PaddingPolicy = DEFAULT_PADDING) -> None:
        self.trust = trust
        self.padding = padding
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._pins: dict[str, PinnedKey] = {}
        self._jwks: Mapping[str, Any] | None = trust.broker_jwks
        self._lock = threading.Lock()
        self.receipts: collections.deque[Receipt] = collections.deque(maxlen=keep_receipts)

    # -- verification
    def needs_jwks(self) -> bool:
        return self._jwks is None

    def set_gateway_jwks(self, jwks: Mapping[str, Any]) -> None:
        if self.trust.broker_jwks is None and self._jwks is None:
            self._jwks = jwks  # trust on first use (unsafe_trust_gateway_jwks); kept from then on

    def wants_reference_values(self) -> bool:
        return self.trust.pins_publisher

    def pin_from(self, model: str, attestation_doc: Mapping[str, Any],
                 reference_values: Mapping[str, Any] | None = None) -> PinnedKey:
        """Verify every worker of the document serving `model`; pin the first that verifies.
        Raises the first worker's error when none does (nothing is sent then)."""
        if self._jwks is None:
            raise AttestationError("no key broker JWKS to verify tokens with")
        verifier = TokenVerifier(self._jwks, self.trust.broker_issuer)
        now = self.clock()
        published = verify_published(self.trust, reference_values, now)  # raises: nothing is sent
        first_error: Exception | None = None
        for doc in attestation_doc.get("workers", []):
            if doc.get("model") != model:
                continue
            try:
                pin = verify_sealed_document(doc, verifier, self.trust, now, published, model=model)
            except (AttestationError, KeyError, ValueError, TypeError) as exc:
                first_error = first_error or exc
                continue
            with self._lock:
                self._pins[model] = pin
            return pin
        if first_error is not None:
            raise first_error
        raise NoAttestedWorker(model)

    def pinned(self, model: str) -> PinnedKey | None:
        """The pin for `model`, while the token that corroborated its evidence lasts; after that a
        request verifies the deployment again (fresh evidence, the same checks)."""
        now = self.clock()
        with self._lock:
            pin = self._pins.get(model)
            if pin is not None and pin.expired(now):
                del self._pins[model]
                return None
            return pin

    def forget(self, model: str) -> None:
        with self._lock:
            self._pins.pop(model, None)

    # -- requests
    def seal(self, pin: PinnedKey, endpoint: str, body: bytes) -> Exchange:
        ctx = RequestContext(tenant=pin.tenant, model=pin.model, endpoint=endpoint, key_id=pin.worker_key_id)
        return Exchange(pin, seal_request(pin.hpke_public_key, ctx, body, time.time(), padding=self.padding))

    @staticmethod
    def sealed_headers(exchange: Exchange, original: Mapping[str, str]) -> dict[str, str]:
        headers = {k: v for k, v in original.items() if k.lower() in ("authorization", "user-agent", "accept")
                   or k.lower().startswith("x-stainless") or k.lower().startswith("openai-")}
        headers.update({"Content-Type": REQUEST_CONTENT_TYPE, HEADER_MODEL: exchange.pin.model,
                        HEADER_KEY_ID: exchange.pin.worker_key_id})
        return headers

    @staticmethod
    def sealed_url_path(prefix: str, endpoint: str) -> str:
        return prefix + sealed_path(endpoint)

    @staticmethod
    def plain_error(status: int, content_type: str, body: bytes) -> Exception | None:
        """A gateway answer that is not sealed: a typed error for sealed-mode refusals, None for ordinary
        OpenAI errors (passed through to the SDK), and a refusal of any plaintext success."""
        if 200 <= status < 300:
            return SealedFormatError("the gateway answered a sealed request in plaintext")
        code = ""
        if content_type.startswith("application/json"):
            try:
                code = str((json.loads(body).get("error") or {}).get("code") or "")
            except (ValueError, AttributeError):
                code = ""
        if code == REATTEST_CODE:
            return ReattestRequired("the pinned worker is gone")
        if code == "sealed_request_replayed":
            return RequestReplayed("the worker saw this request before")
        if code == "sealed_request_rejected":
            return RequestRejected("the worker could not open the request")
        return None

    @staticmethod
    def is_sealed(content_type: str) -> bool:
        return content_type.split(";")[0].strip() == RESPONSE_CONTENT_TYPE

    def reader(self, exchange: Exchange) -> AnswerReader:
        return AnswerReader(self, exchange)


def _check_receipt_names_the_pin(receipt: Receipt, pin: PinnedKey) -> None:
    """A receipt names the tenant, version and model digest the evidence bound, or it is refused."""
    if (receipt.tenant, receipt.model_version) != (pin.tenant, pin.version) or (
            pin.model_digest and receipt.model_digest != pin.model_digest):
        raise ReceiptInvalid("the receipt names another tenant, model version or model digest than the "
                             "attested worker serves")


class AnswerReader:
    """Feed the sealed response's bytes; get the inner head, then inner body chunks; the receipt is
    checked when the final chunk arrives and `finish()` refuses a stream that ended early."""

    def __init__(self, session: SealedSession, exchange: Exchange) -> None:
        self._session, self._exchange = session, exchange
        self._opener = exchange.sealed.opener
        self.head: ResponseHead | None = None
        self.receipt: Receipt | None = None

    def feed(self, data: bytes) -> list[bytes]:
        body: list[bytes] = []
        for plaintext, final in self._opener.feed(data):
            if final:
                self.receipt = verify_receipt(
                    plaintext, self._exchange.pin.receipt_key, request_sha256=self._exchange.sealed.request_sha256,
                    response_sha256=self._opener.hash.hexdigest(), worker_key_id=self._exchange.pin.worker_key_id,
                    model=self._exchange.pin.model)
                _check_receipt_names_the_pin(self.receipt, self._exchange.pin)
                self._session.receipts.append(self.receipt)
            elif self.head is None:
                self.head = ResponseHead.decode(plaintext)
            else:
                body.append(plaintext)
        return body

    def finish(self) -> Receipt:
        self._opener.close()
        if self.head is None or self.receipt is None:
            raise SealedFormatError("sealed answer without head or receipt")
        return self.receipt

    def receipt_header(self) -> str:
        receipt = self.receipt
        if receipt is None:
            return ""
        return base64.b64encode(receipt.canonical()).decode()
