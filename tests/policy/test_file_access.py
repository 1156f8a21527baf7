"""The signed policy's `file_access` section (policy/file_access.py): who may retrieve which file,
default deny, every matching rule granting; malformed sections refused at upload (a table)."""

from __future__ import annotations

from typing import Any

import pytest

from policy.callers import api_key_digest
from policy.errors import PolicyInvalid
from policy.file_access import FileAccessPolicy
from policy.policyset import PolicySet

LEGAL, HR = api_key_digest("sk-legal"), api_key_digest("sk-hr")
LEGAL_ID, HR_ID = "key_" + LEGAL[:16], "key_" + HR[:16]
SECTION = {"rules": [{"attribute": "team", "value": "legal", "api_keys": [LEGAL]},
                     {"attribute": "team", "value": "hr", "api_keys": [HR]},
                     {"attribute": "public", "value": True, "api_keys": [LEGAL, HR]}]}


@pytest.mark.parametrize("key_id,attributes,expected", [
    (LEGAL_ID, {"team": "legal"}, True),
    (HR_ID, {"team": "legal"}, False),
    (HR_ID, {"team": "hr"}, True),
    (HR_ID, {"team": "legal", "public": True}, True),  # a second rule grants: rules only grant
    (HR_ID, {"public": "true"}, False),  # a string is not the boolean the rule names
    (LEGAL_ID, {}, False),  # no rule matches: the default, deny
    (LEGAL_ID, {"team": "eng"}, False),
    ("key_0000000000000000", {"team": "legal"}, False),  # a key no rule names (the operator's)
])
def test_who_reads_which_file(key_id: str, attributes: dict[str, Any], expected: bool) -> None:
    assert FileAccessPolicy.from_dict(SECTION).readable(key_id, attributes) is expected


def test_default_allow_and_the_round_trip_through_the_policy_set() -> None:
    allow = FileAccessPolicy.from_dict({**SECTION, "default": "allow"})
    assert allow.readable(HR_ID, {"team": "eng"}) and not allow.readable(HR_ID, {"team": "legal"})
    doc = {"policy_id": "p", "version": 1, "tenant": "acme", "file_access": SECTION}
    policy_set = PolicySet.from_dict(doc)
    assert policy_set.file_access is not None
    assert PolicySet.from_dict(policy_set.to_dict()).file_access == policy_set.file_access
    assert PolicySet.from_dict({**doc, "file_access": None}).file_access is None


@pytest.mark.parametrize("section", [
    [],
    {"rules": [], "extra": 1},
    {"default": "maybe"},
    {"rules": {"team": "legal"}},
    {"rules": [{"attribute": "team", "value": "legal"}]},
    {"rules": [{"attribute": "team", "value": "legal", "api_keys": ["sk-legal"]}]},  # a key, not a digest
    {"rules": [{"attribute": "", "value": "legal", "api_keys": [LEGAL]}]},
    {"rules": [{"attribute": "team", "value": {"a": 1}, "api_keys": [LEGAL]}]},
    {"rules": [{"attribute": "team", "value": "x" * 513, "api_keys": [LEGAL]}]},
    {"rules": [{"attribute": "team", "value": "legal", "api_keys": [LEGAL], "grant": "all"}]},
    {"rules": [{"attribute": "t", "value": 1, "api_keys": []}] * 257},
], ids=lambda s: str(s)[:40])
def test_malformed_sections_are_refused(section: Any) -> None:
    with pytest.raises(PolicyInvalid):
        PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme", "file_access": section})
