"""Sealed mode: requests HPKE-encrypted to the attested worker, chunked encrypted responses, receipts.

The format is written down in docs/sealed-mode.md. Client (SDK, proxy) and worker both use this
package; the gateway only reads the headers it routes and meters by.
"""

from protocol.sealed.errors import (
    ReattestRequired,
    ReceiptInvalid,
    RequestRejected,
    RequestReplayed,
    ResponseCorrupted,
    SealedError,
    SealedFormatError,
    WrongWorkerKey,
)
from protocol.sealed.hpke import (
    OpenedRequest,
    RequestContext,
    SealedRequest,
    WorkerKey,
    api_key_id,
    key_id,
    open_request,
    seal_request,
)
from protocol.sealed.receipt import Receipt, sign_receipt, verify_receipt
from protocol.sealed.replay import ReplayGuard
from protocol.sealed.response import ResponseOpener, ResponseSealer

__all__ = [
    "OpenedRequest", "ReattestRequired", "Receipt", "ReceiptInvalid", "ReplayGuard", "RequestContext",
    "RequestRejected", "RequestReplayed", "ResponseCorrupted", "ResponseOpener", "ResponseSealer",
    "SealedError", "SealedFormatError", "SealedRequest", "WorkerKey", "WrongWorkerKey", "api_key_id", "key_id",
    "open_request", "seal_request", "sign_receipt", "verify_receipt",
]
