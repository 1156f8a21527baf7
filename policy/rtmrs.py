"""TDX RTMR sets in a release policy: which boot chains (kernel, command line, initrd, ...) may run.

On TDX the firmware and the boot loader extend what they load into RTMR0..3 and log each event in
the CC event log (CCEL); the quote signs the RTMRs, and the verifier replays the log to them. MRTD
alone names only the firmware: any kernel, initrd and command line under it gives the same MRTD.

A policy lists allowed *sets*: each names some of RTMR0..3 (hex, 48 bytes), and a TDX worker
passes when every RTMR of at least one set equals its own. A set is a whole boot chain, so a
kernel allowed with one command line cannot be combined with another set's command line. An empty
list allows no TDX worker at all (default deny); no list (None) leaves the RTMRs unappraised.

    "allowed_rtmrs": [{"rtmr1": "<96 hex>", "rtmr2": "<96 hex>"}]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policy.engine import cedar_str
from policy.errors import PolicyInvalid

NAMES = ("rtmr0", "rtmr1", "rtmr2", "rtmr3")
_HEX = frozenset("0123456789abcdef")
RtmrSet = tuple[str, str, str, str]  # "" where the set does not pin that RTMR


def _one(entry: Any) -> RtmrSet:
    if isinstance(entry, tuple) and len(entry) == len(NAMES):  # already normalised
        entry = {n: v for n, v in zip(NAMES, entry, strict=True) if v}
    if not isinstance(entry, Mapping) or not entry:
        raise PolicyInvalid("each allowed_rtmrs entry is an object naming at least one of rtmr0..rtmr3")
    unknown = set(entry) - set(NAMES)
    if unknown:
        raise PolicyInvalid(f"allowed_rtmrs: unknown keys {sorted(map(str, unknown))} (rtmr0..rtmr3)")
    values = []
    for name in NAMES:
        value = entry.get(name, "")
        if not isinstance(value, str):
            raise PolicyInvalid(f"allowed_rtmrs: {name} must be a hex string")
        value = value.lower()
        if value and (len(value) != 96 or not set(value) <= _HEX):
            raise PolicyInvalid(f"allowed_rtmrs: {name} must be 96 hex characters (48 bytes)")
        values.append(value)
    return values[0], values[1], values[2], values[3]


def parse_rtmr_sets(value: Any) -> frozenset[RtmrSet]:
    """A list of objects (or already normalised tuples) as a frozen set; PolicyInvalid otherwise."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise PolicyInvalid("allowed_rtmrs must be a list of objects")
    return frozenset(_one(entry) for entry in value)


def rtmr_sets_json(sets: Iterable[RtmrSet]) -> list[dict[str, str]]:
    """Sorted, so the same policy always serializes (and signs) the same."""
    return [{n: v for n, v in zip(NAMES, s, strict=True) if v} for s in sorted(sets)]


def matches(sets: Iterable[RtmrSet], rtmrs: tuple[str, ...]) -> bool:
    """Whether a quote's RTMR0..3 (hex) satisfy at least one set."""
    have = tuple(r.lower() for r in rtmrs)
    return len(have) == len(NAMES) and any(
        all(not want or want == got for want, got in zip(s, have, strict=True)) for s in sets)


def cedar_allowed(sets: Iterable[RtmrSet]) -> str:
    """A Cedar expression over `context.rtmr0..3` that holds when one set matches."""
    alternatives = []
    for s in sorted(sets):
        terms = [f"context.{n} == {cedar_str(v)}" for n, v in zip(NAMES, s, strict=True) if v]
        alternatives.append("(" + " && ".join(terms) + ")")
    return "(" + (" || ".join(alternatives) or "false") + ")"
