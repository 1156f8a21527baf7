"""Stored Responses state in the worker (enclave_worker/response_state.py): sealed under a key derived
from the model version's data key, bound to tenant, model, version and id; refused when tampered,
moved, expired, of another key, or once the key is wiped (revoked); the history put in the prompt."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from enclave_worker.clock import Clock
from enclave_worker.engine import InvalidRequestError
from enclave_worker.guard import WorkerGuard
from enclave_worker.response_state import StateCipher, StateUnreadable, seal_state, with_history
from enclave_worker.servicer import WorkerServicer
from enclave_worker.settings import WorkerSettings
from enclave_worker.state import LiveState, WorkerState
from policy.errors import PolicyInvalid
from policy.policyset import PolicySet
from protocol.rpc import worker_pb2

DATA_KEY = bytes(range(32))
NOW = 1_700_000_000.0
DOC = {"response": {"id": "resp_1"}, "input_items": [],
       "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@dataclass(frozen=True)
class At(Clock):
    t: float = NOW

    def now(self) -> float:
        return self.t


def _state(*, data_key: bytes = DATA_KEY, retention_days: int | None = None, require_sealed: bool = False,
           version: str = "v1", clock: Clock | None = None) -> WorkerState:
    doc: dict[str, Any] = {"policy_id": "p", "version": 1, "tenant": "acme", "require_sealed": require_sealed}
    if retention_days is not None:
        doc["response_retention_days"] = retention_days
    booted = SimpleNamespace(engine=object(), released=SimpleNamespace(data_key=data_key))
    state = WorkerState(WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme",
                                       model="m", version=version), guard=WorkerGuard(PolicySet.from_dict(doc)),
                        clock=clock or At(), live=LiveState.serving(booted))  # type: ignore[arg-type]
    return state


def _sealed(state: WorkerState, state_id: str = "resp_1") -> bytes:
    return seal_state(state, "acme", state_id, json.dumps(DOC))


def test_round_trip_and_expiry_stamped_by_the_tenants_policy() -> None:
    state = _state(retention_days=2)
    blob = _sealed(state)
    cipher = StateCipher.derive(DATA_KEY, "acme", "m", "v1")
    opened = cipher.open("resp_1", blob, NOW)
    assert opened["messages"] == DOC["messages"] and opened["expires_at"] == NOW + 2 * 86400
    assert b"hello" not in blob
    with pytest.raises(StateUnreadable):
        cipher.open("resp_1", blob, NOW + 2 * 86400)  # expired, whatever the gateway's rows say


@pytest.mark.parametrize("case", ["another id", "another tenant", "another model", "another version",
                                  "another data key", "a flipped bit", "truncated", "unknown format"])
def test_a_blob_opens_only_where_it_was_sealed(case: str) -> None:
    blob = _sealed(_state())
    derive = {"another tenant": ("globex", "m", "v1"), "another model": ("acme", "m2", "v1"),
              "another version": ("acme", "m", "v2")}.get(case, ("acme", "m", "v1"))
    cipher = StateCipher.derive(bytes(32) if case == "another data key" else DATA_KEY, *derive)
    blob = {"a flipped bit": blob[:-1] + bytes([blob[-1] ^ 1]), "truncated": blob[:20],
            "unknown format": b"\x02" + blob[1:]}.get(case, blob)
    with pytest.raises(StateUnreadable):
        cipher.open("resp_2" if case == "another id" else "resp_1", blob, NOW)


def test_a_wiped_key_opens_and_seals_nothing() -> None:
    """Revocation wipes the data key (server._revoke): stored state is unreadable from then on."""
    state = _state()
    blob = _sealed(state)
    state.live.booted = SimpleNamespace(engine=object(), released=SimpleNamespace(data_key=b""))  # type: ignore[assignment]
    request = worker_pb2.GenerateRequest(tenant="acme", kind="chat", messages_json="[]",
                                         history=[worker_pb2.StateBlob(id="resp_1", blob=blob)])
    with pytest.raises(StateUnreadable):
        with_history(state, request)
    with pytest.raises(StateUnreadable):
        _sealed(state)
    state.live.booted = None
    with pytest.raises(StateUnreadable):
        with_history(state, request)


def test_history_goes_after_the_new_instructions_and_before_the_new_input() -> None:
    state = _state()
    blobs = [worker_pb2.StateBlob(id=i, blob=_sealed(state, i)) for i in ("resp_1", "resp_2")]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "and now?"}]
    request = worker_pb2.GenerateRequest(tenant="acme", kind="chat", messages_json=json.dumps(messages),
                                         history=blobs)
    continued = with_history(state, request)
    assert json.loads(continued.messages_json) == [messages[0], *DOC["messages"], *DOC["messages"], messages[1]]
    assert not continued.history and request.history  # the caller's request is left as it was


@pytest.mark.parametrize("case", ["another tenant", "completion", "too long", "document without messages",
                                  "not JSON"])
def test_refused_inputs(case: str) -> None:
    state = _state()
    if case in ("document without messages", "not JSON"):
        with pytest.raises(InvalidRequestError):
            seal_state(state, "acme", "resp_1", "[]" if case == "document without messages" else "{")
        return
    blob = worker_pb2.StateBlob(id="resp_1", blob=_sealed(state))
    request = worker_pb2.GenerateRequest(tenant="globex" if case == "another tenant" else "acme",
                                         kind="completion" if case == "completion" else "chat", messages_json="[]",
                                         history=[blob] * (257 if case == "too long" else 1))
    with pytest.raises(InvalidRequestError):
        with_history(state, request)


def test_retention_zero_stores_nothing_and_the_policy_bounds_it() -> None:
    with pytest.raises(InvalidRequestError, match="keeps no responses"):
        _sealed(_state(retention_days=0))
    for bad in (-1, 366, "30", True):
        with pytest.raises(PolicyInvalid):
            PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme", "response_retention_days": bad})
    doc = PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme", "response_retention_days": 7})
    assert PolicySet.from_dict(doc.to_dict()).response_retention_days == 7


class Aborted(Exception):
    pass


@dataclass
class Context:
    code: Any = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise Aborted(details)


def test_the_rpcs_seal_open_and_refuse() -> None:
    servicer, context = WorkerServicer(_state()), Context()
    sealed = asyncio.run(servicer.SealState(worker_pb2.SealStateRequest(
        tenant="acme", id="resp_1", document_json=json.dumps(DOC)), context))  # type: ignore[arg-type]
    assert sealed.version == "v1"
    state = worker_pb2.StateBlob(id="resp_1", blob=sealed.blob)
    opened = asyncio.run(servicer.OpenState(worker_pb2.OpenStateRequest(tenant="acme", state=state),
                                            context))  # type: ignore[arg-type]
    assert json.loads(opened.document_json)["response"] == DOC["response"]
    moved = worker_pb2.StateBlob(id="resp_2", blob=sealed.blob)
    with pytest.raises(Aborted):
        asyncio.run(servicer.OpenState(worker_pb2.OpenStateRequest(tenant="acme", state=moved),
                                       context))  # type: ignore[arg-type]
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    # A tenant that requires sealed mode gets no state in clear, and none sealed from clear text.
    sealed_only, context = WorkerServicer(_state(require_sealed=True)), Context()
    with pytest.raises(Aborted):
        asyncio.run(sealed_only.OpenState(worker_pb2.OpenStateRequest(tenant="acme", state=state),
                                          context))  # type: ignore[arg-type]
    assert context.code == grpc.StatusCode.PERMISSION_DENIED
