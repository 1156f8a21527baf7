"""Offline PII detection: candidate regexes plus validators, so matches are not just shapes.

Why not Presidio: its analyzer imports spaCy (8.6 s here) and its email recognizer calls
tldextract, which fetches the public suffix list over the network on first use; inside the
worker's trust boundary there is no egress and start-up time matters. Without an NLP model its
recognizers reduce to what this module does (regex + checksum). Phone numbers are validated with
``phonenumbers`` (Google libphonenumber's metadata), the rest with their checksums or rules.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import phonenumbers


@dataclass(frozen=True)
class Finding:
    entity: str
    start: int
    end: int


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_ok(raw: str) -> bool:
    s = raw.replace(" ", "").upper()
    if not 15 <= len(s) <= 34:
        return False
    rearranged = s[4:] + s[:4]
    # ISO 7064 mod 97-10: letters count as 10..35.
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def ssn_ok(raw: str) -> bool:
    area, group, serial = raw.split("-")
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def card_ok(raw: str) -> bool:
    digits = re.sub(r"[ -]", "", raw)
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


def ip_ok(raw: str) -> bool:
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        return False
    return True


def phone_ok(raw: str) -> bool:
    try:
        number = phonenumbers.parse(raw, "US")  # national numbers without +CC are read as US
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(number)


# Order matters: earlier detectors claim their spans first (an IBAN's digits are not a phone).
_DETECTORS: tuple[tuple[str, re.Pattern[str], Callable[[str], bool]], ...] = (
    ("EMAIL_ADDRESS", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
     lambda s: True),
    ("IBAN_CODE", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b"), iban_ok),
    ("CREDIT_CARD", re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"), card_ok),
    ("US_SSN", re.compile(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])"), ssn_ok),
    ("IP_ADDRESS", re.compile(r"(?<![\w.:])(?:\d{1,3}(?:\.\d{1,3}){3}"
                              r"|[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7})(?![\w.:])"), ip_ok),
    ("PHONE_NUMBER", re.compile(r"(?<![\w+])\+?\(?\d[\d ().-]{6,18}\d(?!\w)"), phone_ok),
)


_DIGIT = re.compile(r"\d")


def _may_match(entity: str, has_digit: bool, text: str) -> bool:
    """A cheap necessary condition for each pattern, so most prose skips most regex scans:
    an email needs "@", an IP a digit or ":", every other pattern at least one digit."""
    if entity == "EMAIL_ADDRESS":
        return "@" in text
    if entity == "IP_ADDRESS":
        return has_digit or ":" in text
    return has_digit


def detect_pii(text: str, entities: Iterable[str] | None = None) -> list[Finding]:
    """Non-overlapping findings in text order; ``entities`` limits which types are looked for."""
    wanted = None if entities is None else frozenset(entities)
    has_digit = _DIGIT.search(text) is not None
    taken: list[tuple[int, int]] = []
    found: list[Finding] = []
    for entity, pattern, valid in _DETECTORS:
        if (wanted is not None and entity not in wanted) or not _may_match(entity, has_digit, text):
            continue
        for m in pattern.finditer(text):
            start, end = m.span()
            if any(start < e and s < end for s, e in taken) or not valid(m.group()):
                continue
            taken.append((start, end))
            found.append(Finding(entity, start, end))
    return sorted(found, key=lambda f: f.start)


def redact(text: str, findings: Iterable[Finding]) -> str:
    """Replace each finding with ``[REDACTED:<TYPE>]`` (findings must not overlap)."""
    out, pos = [], 0
    for f in sorted(findings, key=lambda f: f.start):
        out.append(text[pos:f.start])
        out.append(f"[REDACTED:{f.entity}]")
        pos = f.end
    out.append(text[pos:])
    return "".join(out)
