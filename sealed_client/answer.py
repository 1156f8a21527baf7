"""One sealed request in flight (`Exchange`) and reading its answer (`AnswerReader`): the inner head,
the body chunks, and the receipt, checked against everything the request bound and the pin was made
from. Sans-IO, like the session that makes both (sealed_client/session.py)."""

from __future__ import annotations

import base64
import collections
from dataclasses import dataclass
from typing import Any

from protocol.sealed import Receipt, ReceiptInvalid, SealedFormatError, SealedRequest, verify_receipt
from protocol.sealed.http import SEARCH_ENDPOINT, ResponseHead
from sealed_client.conversation_state import ConversationMemory
from sealed_client.deployment import PinnedKey
from sealed_client.retrieval import check_retrieved
from sealed_client.stored_state import check_history


@dataclass(frozen=True)
class Exchange:
    """One sealed request in flight: what the answer must match."""

    pin: PinnedKey
    sealed: SealedRequest
    api_key_id: str  # of the API key the request is sent with (bound as associated data)
    previous_response_id: str | None = None  # the stored response it continues (the gateway learns the id)
    conversation_id: str | None = None  # the sealed-mode conversation it works on (the gateway learns the id)
    endpoint: str = ""  # the endpoint the request is bound to (a search's receipt is checked against its answer)


def expected_receipt(exchange: Exchange) -> dict[str, Any]:
    """What a receipt must name besides the hashes, worker key and model: everything the request bound
    and the evidence the pin was made from (tenant, version, digest, policy version), the API key id,
    and the receipt key's other half of the channel binding."""
    pin = exchange.pin
    return {"tenant": pin.tenant, "model_version": pin.version, "model_digest": pin.model_digest,
            "policy_version": pin.policy_version, "api_key_id": exchange.api_key_id,
            "channel_spki": pin.channel_spki.hex(), "tee": pin.worker.tee, "insecure": pin.worker.insecure}


class AnswerReader:
    """Feed the sealed response's bytes; get the inner head, then inner body chunks; the receipt is
    checked when the final chunk arrives and `finish()` refuses a stream that ended early."""

    def __init__(self, exchange: Exchange, receipts: collections.deque[Receipt],
                 conversations: ConversationMemory) -> None:
        """``receipts`` and ``conversations``: the session's, which the answer adds to and is checked against."""
        self._exchange, self._receipts, self._conversations = exchange, receipts, conversations
        self._opener = exchange.sealed.opener
        self.head: ResponseHead | None = None
        self.receipt: Receipt | None = None
        self.signed_receipt = b""  # the final chunk as signed: what a third party verifies
        # A search's answer, kept to check that its receipt names the files the passages came from.
        self._search: list[bytes] | None = [] if exchange.endpoint == SEARCH_ENDPOINT else None

    def feed(self, data: bytes) -> list[bytes]:
        body: list[bytes] = []
        for plaintext, final in self._opener.feed(data):
            if final:
                self.receipt = verify_receipt(
                    plaintext, self._exchange.pin.receipt_key, request_sha256=self._exchange.sealed.request_sha256,
                    response_sha256=self._opener.hash.hexdigest(), worker_key_id=self._exchange.pin.worker_key_id,
                    model=self._exchange.pin.model, **expected_receipt(self._exchange))
                if not self.receipt.evidence_sha256:
                    raise ReceiptInvalid("the receipt names no evidence (a third party could not verify it)")
                if self._search is not None and self.head is not None:
                    check_retrieved(self.receipt, self.head.status, b"".join(self._search))
                self.signed_receipt = plaintext
                self._receipts.append(self.receipt)
            elif self.head is None:
                self.head = ResponseHead.decode(plaintext)
                check_history(self.head, self._exchange.previous_response_id)
                self._conversations.check(self.head, self._exchange.endpoint, self._exchange.conversation_id)
            else:
                body.append(plaintext)
                if self._search is not None:
                    self._search.append(plaintext)
        return body

    def finish(self) -> Receipt:
        self._opener.close()
        if self.head is None or self.receipt is None:
            raise SealedFormatError("sealed answer without head or receipt")
        return self.receipt

    def receipt_header(self) -> str:
        """Base64 of the signed receipt (`{"receipt": ..., "signature": ...}`): with the evidence it
        names, all a third party needs (sealed_client.receipts.verify_receipt_with_evidence)."""
        if self.receipt is None:
            return ""
        return base64.b64encode(self.signed_receipt).decode()
