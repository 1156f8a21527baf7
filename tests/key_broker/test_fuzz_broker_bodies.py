"""Hypothesis over the key broker's worker-facing request bodies (#35): mutated real bodies of
/v1/attest, /v1/key, /v1/key/status and /v1/lease are either refused by their schema (422) or
give a body whose model reference can be formed; `ref` raising in a route was a 500 (a name that
matches the schema's pattern but holds "..")."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from pydantic import BaseModel, ValidationError

from protocol.broker.schemas import AttestRequest, KeyRequest, KeyStatusRequest, LeaseRequest
from protocol.model_ref import ModelRef
from tests.fuzzing import DEEP_JSON, budget, mutated

SCOPE = {"tenant": "acme", "model": "smollm2", "version": "v1"}
TOKEN = "eyJhbGciOiJFUzI1NiJ9." + "a" * 200 + "." + "b" * 86
BODIES: dict[type[BaseModel], bytes] = {
    AttestRequest: json.dumps({"session_id": "s" * 32, **SCOPE, "evidence": {
        "tee": "sim", "cpu_evidence": "00" * 64, "runtime_data": {"tls_spki": "ab" * 40}}}).encode(),
    KeyRequest: json.dumps({"token": TOKEN, **SCOPE}).encode(),
    KeyStatusRequest: json.dumps({"token": TOKEN, **SCOPE}).encode(),
    LeaseRequest: json.dumps({"token": TOKEN, **SCOPE, "tls_spki": "ab" * 40, "identity_key": "cd" * 32,
                              "seq": 3, "at": 1_700_000_000, "wait_s": 25.0, "signature": "ef" * 64}).encode(),
}


@pytest.mark.parametrize("schema", list(BODIES), ids=lambda s: s.__name__)
def test_a_name_with_two_dots_is_refused_by_the_schema(schema: type[BaseModel]) -> None:
    body = json.loads(BODIES[schema]) | {"model": "a..b"}
    with pytest.raises(ValidationError):
        schema.model_validate(body)


@pytest.mark.parametrize("schema", list(BODIES), ids=lambda s: s.__name__)
@budget(60)
@given(body=mutated([*BODIES.values(), *DEEP_JSON]))
def test_fuzz_broker_request_bodies(schema: type[BaseModel], body: bytes) -> None:
    with contextlib.suppress(ValidationError):
        parsed = schema.model_validate_json(body)
        assert isinstance(parsed.ref, ModelRef)  # type: ignore[attr-defined]
