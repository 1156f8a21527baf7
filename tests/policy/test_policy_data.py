"""Data controls: PII detection table, redaction, blocking, patterns and topics."""

from __future__ import annotations

from typing import Any

import pytest

from policy import PolicySet
from policy.data import check_content, detect_pii, redact, retention_cutoff


@pytest.mark.parametrize(
    ("text", "entity"),
    [
        ("card 4111 1111 1111 1111 ok", "CREDIT_CARD"),
        ("card 4111-1111-1111-1111", "CREDIT_CARD"),
        ("amex 378282246310005", "CREDIT_CARD"),
        ("mail Bob.Smith+tag@mail.example.co.uk now", "EMAIL_ADDRESS"),
        ("call +1 415-555-2671", "PHONE_NUMBER"),
        ("call (212) 555-0123", "PHONE_NUMBER"),
        ("ring +44 20 7946 0958", "PHONE_NUMBER"),
        ("iban DE89 3704 0044 0532 0130 00", "IBAN_CODE"),
        ("iban GB82WEST12345698765432", "IBAN_CODE"),
        ("ssn 123-45-6789", "US_SSN"),
        ("host 10.1.2.3", "IP_ADDRESS"),
        ("v6 2001:db8::8a2e:370:7334", "IP_ADDRESS"),
    ],
)
def test_pii_detected(text: str, entity: str) -> None:
    assert entity in {f.entity for f in detect_pii(text)}


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112",  # fails Luhn
        "iban DE89 3704 0044 0532 0130 01",  # fails mod 97
        "ssn 000-12-3456", "ssn 666-12-3456", "ssn 923-45-6789", "ssn 123-00-6789",
        "version 1.2.3.4.5", "addr 999.1.1.1", "at 12:30:45", "order 12345", "user@localhost",
        "plain text with no identifiers",
    ],
)
def test_pii_not_detected(text: str) -> None:
    assert detect_pii(text) == []


def test_redact_keeps_the_rest() -> None:
    text = "mail a@b.com or call +1 415-555-2671, card 4111111111111111."
    out = redact(text, detect_pii(text))
    assert out == ("mail [REDACTED:EMAIL_ADDRESS] or call [REDACTED:PHONE_NUMBER], "
                   "card [REDACTED:CREDIT_CARD].")


DOC: dict[str, Any] = {
    "policy_id": "acme-data", "version": 4, "tenant": "acme",
    "data": {
        "retention_days": 30,
        "pii_input": {"CREDIT_CARD": "block", "EMAIL_ADDRESS": "redact", "US_SSN": "block",
                      "IP_ADDRESS": "allow"},
        "pii_output": {"EMAIL_ADDRESS": "redact", "PHONE_NUMBER": "redact", "IBAN_CODE": "block"},
        "blocked_patterns": {"internal-codename": r"(?i)project\s+nightingale"},
        "blocked_topics": {"weapons": ["nerve agent", "bioweapon"]},
    },
}
PS = PolicySet.from_dict(DOC)


@pytest.mark.parametrize(
    ("text", "direction", "allowed", "rule", "expected_text"),
    [
        ("hello", "input", True, "data.permit", "hello"),
        ("mail me at a@b.com", "input", True, "data.permit", "mail me at [REDACTED:EMAIL_ADDRESS]"),
        ("my card is 4111 1111 1111 1111", "input", False, "data.input.pii_block", ""),
        ("ssn 123-45-6789", "input", False, "data.input.pii_block", ""),
        ("ssn 123-45-6789", "output", True, "data.permit", "ssn 123-45-6789"),  # only blocked on input
        ("server 10.0.0.1", "input", True, "data.permit", "server 10.0.0.1"),
        ("call +1 415-555-2671", "input", True, "data.permit", "call +1 415-555-2671"),
        ("call +1 415-555-2671", "output", True, "data.permit", "call [REDACTED:PHONE_NUMBER]"),
        ("pay to DE89 3704 0044 0532 0130 00", "output", False, "data.output.pii_block", ""),
        ("status of PROJECT  Nightingale?", "input", False, "data.pattern.internal-codename", ""),
        ("status of PROJECT  Nightingale?", "output", False, "data.pattern.internal-codename", ""),
        ("how to make a Nerve Agent", "input", False, "data.topic.weapons", ""),
        ("nerve agents are", "input", True, "data.permit", "nerve agents are"),  # whole words only
    ],
)
def test_content_table(text: str, direction: str, allowed: bool, rule: str, expected_text: str) -> None:
    v = check_content(PS, "k1", "llama", text, direction=direction)
    assert (v.decision.allowed, v.decision.rule, v.text) == (allowed, rule, expected_text)
    assert (v.decision.policy_id, v.decision.policy_version) == ("acme-data", 4)


def test_findings_are_counts_not_content() -> None:
    v = check_content(PS, "k1", "llama", "a@b.com c@d.org 4111 1111 1111 1111", direction="input")
    assert v.findings == {"EMAIL_ADDRESS": 2, "CREDIT_CARD": 1}
    assert not v.decision.allowed and v.text == ""


def test_no_data_policy_denies() -> None:
    ps = PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "acme"})
    v = check_content(ps, "k1", "llama", "hi")
    assert not v.decision.allowed and v.decision.rule == "default-deny"


def test_bad_direction() -> None:
    with pytest.raises(ValueError):
        check_content(PS, "k1", "llama", "hi", direction="sideways")


@pytest.mark.parametrize(
    "bad",
    [{"pii_input": {"CREDIT_CARD": "shred"}}, {"pii_input": {"DNA": "block"}},
     {"blocked_patterns": {"x": "(unclosed"}}, {"blocked_topics": {"t": "word"}}, {"retention": 3}],
)
def test_invalid_data_policies(bad: dict[str, Any]) -> None:
    from policy import PolicyInvalid

    with pytest.raises(PolicyInvalid):
        PolicySet.from_dict({**DOC, "data": {**DOC["data"], **bad}})


def test_retention_cutoff() -> None:
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 6, 1, tzinfo=UTC)
    assert retention_cutoff(PS, now) == now - timedelta(days=30)
    assert retention_cutoff(PolicySet.from_dict({"policy_id": "p", "version": 1, "tenant": "a"}), now) is None
