"""Stored responses in sealed mode, in the worker (enclave_worker/sealed_state.py): the worker seals
its own answers' state, marked as sealed-mode state; a continuation opens only the unbroken chain
that ends at the id sealed inside the request, of sealed-mode states; everything else the gateway
could send (another chain, a dropped or spliced link, a state it had sealed from clear text, a
tampered blob, a revoked key) is refused; a sealed-mode state is never opened for a plaintext answer."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from enclave_worker.engine import InvalidRequestError
from enclave_worker.response_state import SealedOnlyState, open_state, seal_state, with_history
from enclave_worker.sealed_state import SealedTurn, begin_sealed_turn
from enclave_worker.state import WorkerState
from protocol.openai.errors import OpenAIError
from protocol.openai.responses_request import ResponsesRequest
from protocol.rpc import worker_pb2
from tests.enclave_worker.test_response_state import DOC, _state


def _request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})


def _sealed_request(history: list[worker_pb2.StateBlob]) -> worker_pb2.SealedRequest:
    return worker_pb2.SealedRequest(tenant="acme", model="m", endpoint="/v1/responses", history=history)


def _answer(turn: SealedTurn, previous: str | None, text: str) -> dict[str, Any]:
    return {"id": turn.response_id, "previous_response_id": previous,
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]}


def _chain(state: WorkerState, length: int = 3) -> list[worker_pb2.StateBlob]:
    """`length` turns, each continuing the one before, stored as a sealed-mode answer stores them."""
    chain: list[worker_pb2.StateBlob] = []
    for i in range(length):
        previous = chain[-1].id if chain else None
        req = _request(input=f"turn {i}", previous_response_id=previous)
        turn = begin_sealed_turn(state, _sealed_request(list(chain)), req)
        turn.keep(state, "acme", req, _answer(turn, previous, f"answer {i}"))
        assert turn.stored is not None and turn.stored.id == turn.response_id
        chain.append(turn.stored)
    return chain


def test_a_chain_is_continued_and_its_ids_stated() -> None:
    state = _state()
    chain = _chain(state)
    turn = begin_sealed_turn(state, _sealed_request(chain), _request(previous_response_id=chain[-1].id))
    assert turn.history_ids == tuple(s.id for s in chain)
    assert [m["content"] for m in turn.past] == ["turn 0", "answer 0", "turn 1", "answer 1", "turn 2", "answer 2"]
    assert all(b"answer" not in s.blob and b"turn" not in s.blob for s in chain)  # ciphertext only
    request = worker_pb2.GenerateRequest(messages_json=json.dumps([{"role": "user", "content": "and now?"}]))
    [continued] = turn.continued([request])
    assert json.loads(continued.messages_json)[-1] == {"role": "user", "content": "and now?"}
    assert len(json.loads(continued.messages_json)) == 7


def _swap(chain: list[worker_pb2.StateBlob], other: list[worker_pb2.StateBlob]) -> list[worker_pb2.StateBlob]:
    return other


def _relabelled(chain: list[worker_pb2.StateBlob], other: list[worker_pb2.StateBlob]) -> list[worker_pb2.StateBlob]:
    return [*chain[:-1], worker_pb2.StateBlob(id=chain[-1].id, blob=other[-1].blob)]


def _flipped(chain: list[worker_pb2.StateBlob], other: list[worker_pb2.StateBlob]) -> list[worker_pb2.StateBlob]:
    last = chain[-1].blob
    return [*chain[:-1], worker_pb2.StateBlob(id=chain[-1].id, blob=last[:-1] + bytes([last[-1] ^ 1]))]


# What an operator holding the gateway's database could send instead of the chain the client asked for.
OPERATOR_CASES = {
    "another chain (swapped)": (_swap, "state_mismatch"),
    "a link dropped from the middle": (lambda c, o: [c[0], c[2]], "state_mismatch"),
    "the oldest link dropped": (lambda c, o: c[1:], "state_mismatch"),
    "another chain's link spliced in": (lambda c, o: [o[0], c[1], c[2]], "state_mismatch"),
    "no history at all": (lambda c, o: [], "state_mismatch"),
    "the chain cut short of the asked id": (lambda c, o: c[:2], "state_mismatch"),
    "another response's blob under the asked id": (_relabelled, "state_unreadable"),
    "a flipped bit": (_flipped, "state_unreadable"),
}


@pytest.mark.parametrize("case", OPERATOR_CASES)
def test_an_operator_cannot_change_the_history(case: str) -> None:
    state = _state()
    chain, other = _chain(state), _chain(state)
    tamper, code = OPERATOR_CASES[case]
    with pytest.raises(OpenAIError) as err:
        begin_sealed_turn(state, _sealed_request(tamper(chain, other)), _request(previous_response_id=chain[-1].id))
    assert (err.value.code, err.value.param) == (code, "previous_response_id")


def test_history_the_request_did_not_ask_for_is_refused() -> None:
    state = _state()
    with pytest.raises(OpenAIError) as err:
        begin_sealed_turn(state, _sealed_request(_chain(state)), _request())
    assert err.value.code == "state_mismatch"


def test_state_sealed_from_clear_text_is_not_sealed_history() -> None:
    """The gateway can have a plaintext state sealed under any id (SealState); a sealed request does not
    continue it, and SealState refuses a document that claims the sealed-mode mark."""
    state = _state()
    forged = worker_pb2.StateBlob(id="resp_1", blob=seal_state(state, "acme", "resp_1", json.dumps(DOC)))
    with pytest.raises(OpenAIError, match="stored in plaintext mode"):
        begin_sealed_turn(state, _sealed_request([forged]), _request(previous_response_id="resp_1"))
    with pytest.raises(InvalidRequestError, match="may not carry"):
        seal_state(state, "acme", "resp_1", json.dumps({**DOC, "sealed_mode": True}))


def test_a_sealed_mode_state_is_never_opened_for_a_plaintext_answer() -> None:
    state = _state()
    [stored] = _chain(state, 1)
    with pytest.raises(SealedOnlyState):
        open_state(state, "acme", stored.id, stored.blob)  # GET /v1/responses/{id} in plaintext
    with pytest.raises(SealedOnlyState):  # a plaintext continuation
        with_history(state, worker_pb2.GenerateRequest(tenant="acme", kind="chat", messages_json="[]",
                                                       history=[stored]))


def test_a_revoked_key_makes_sealed_state_unreadable() -> None:
    state = _state()
    chain = _chain(state, 2)
    state.live.booted = SimpleNamespace(engine=object(), released=SimpleNamespace(data_key=b""))  # type: ignore[assignment]
    with pytest.raises(OpenAIError) as err:
        begin_sealed_turn(state, _sealed_request(chain), _request(previous_response_id=chain[-1].id))
    assert (err.value.status, err.value.code) == (404, "state_unreadable")


@pytest.mark.parametrize(("fields", "retention_days", "param"), [
    ({"conversation": "conv_1"}, None, "conversation"),
    ({"store": True}, 0, "store"),
])
def test_refused_requests(fields: dict[str, Any], retention_days: int | None, param: str) -> None:
    with pytest.raises(OpenAIError) as err:
        begin_sealed_turn(_state(retention_days=retention_days), _sealed_request([]), _request(**fields))
    assert (err.value.status, err.value.param) == (400, param)


@pytest.mark.parametrize(("store", "retention_days", "stored"), [
    (None, None, True), (True, None, True), (False, None, False), (None, 0, False), (False, 0, False)])
def test_store_defaults_as_openai_and_the_tenants_retention_bounds_it(store: bool | None,
                                                                      retention_days: int | None,
                                                                      stored: bool) -> None:
    state = _state(retention_days=retention_days)
    req = _request() if store is None else _request(store=store)
    turn = begin_sealed_turn(state, _sealed_request([]), req)
    turn.keep(state, "acme", req, _answer(turn, None, "x"))
    assert turn.store is stored and (turn.stored is not None) is stored
