"""Workload claims (attestation/workload.py): v2 binds the policy version; each malformed form is refused."""

from __future__ import annotations

import json

import pytest

from attestation.errors import FreshnessError, ParseError
from attestation.workload import WorkloadClaims

CLAIMS = WorkloadClaims("acme", "m", "v1", "d", {"prompts_logged": False}, policy_version=4)


def test_claims_round_trip_with_their_policy_version() -> None:
    raw = CLAIMS.encode()
    assert json.loads(raw)["v"] == 2 and json.loads(raw)["policy_version"] == 4
    assert WorkloadClaims.decode(raw) == CLAIMS


def _edited(**changes: object) -> bytes:
    doc = json.loads(CLAIMS.encode())
    doc.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del doc[key]
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize("case, raw", [
    ("version 1 (no policy version)", _edited(v=1, policy_version=None)),
    ("no policy version", _edited(policy_version=None)),
    ("policy version a string", _edited(policy_version="4")),
    ("policy version negative", _edited(policy_version=-1)),
    ("policy version a bool", _edited(policy_version=True)),
    ("an unknown field", _edited(extra=1)),
    ("not canonical", json.dumps(json.loads(CLAIMS.encode()), indent=1).encode()),
])
def test_malformed_claims_are_refused(case: str, raw: bytes) -> None:
    with pytest.raises(ParseError):
        WorkloadClaims.decode(raw)


def test_evidence_without_claims_is_refused() -> None:
    with pytest.raises(FreshnessError):
        WorkloadClaims.decode(b"")
