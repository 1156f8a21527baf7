"""How a request ends without an answer, as the worker's RPCs report it.

`AnswerError` is the OpenAI error the gateway would give (status, type, code), raised by the
request pipeline (`enclave_worker/answer.py`); `RequestRefused` is the one the tenant's policy
caused, carrying the decisions the worker signed for the audit trail. `SealedRefusal` is a
sealed request refused before it opens (a gRPC status: nothing sealed can be said yet).
The engine's own errors are in `enclave_worker/engine/errors.py`.
"""

from __future__ import annotations

import grpc

from protocol.openai.errors import OpenAIError
from protocol.rpc import worker_pb2


class AnswerError(OpenAIError):
    """A request the worker could not answer (bad input 400, engine gone 503, refused 403)."""


class RequestRefused(AnswerError):
    """The tenant's signed policy refused the request or its answer (403)."""

    def __init__(self, message: str, decisions: tuple[worker_pb2.UsageRecord, ...]) -> None:
        super().__init__(403, message, code="content_policy_violation")
        self.decisions = decisions  # signed: the refusal and every decision noted before it


class SealedRefusal(Exception):
    """A sealed request refused before it was opened (wrong key, replay, another tenant, ...)."""

    def __init__(self, grpc_code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.grpc_code, self.message = grpc_code, message
