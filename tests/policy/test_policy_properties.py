"""Property tests: hostile inputs never crash a check or slip past it."""

from __future__ import annotations

import itertools
from urllib.parse import urlsplit

from hypothesis import given, settings
from hypothesis import strategies as st

from policy.agents import UrlRejected, check_url
from policy.agents.urls import normalize_host
from policy.audit.merkle import CompactRange, inclusion_proof, merkle_root, verify_inclusion
from policy.data import detect_pii

ALLOW = frozenset({"example.com", "*.example.org"})
_pieces = st.sampled_from(["https://", "http://", "example.com", "example.org", "evil.com", "@", ":", "/",
                           "..", ".", "%2e", "%40", "\\", "#", "?", "[", "]", "::1", "127.0.0.1", "xn--",
                           "ü", "а", "\u3002", " ", "\t", "443", "8080", "a.", "*", "%00"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_pieces, min_size=1, max_size=8).map("".join))
def test_url_checker_is_total_and_sound(url: str) -> None:
    try:
        host = check_url(url, ALLOW)
    except UrlRejected:
        return
    # Whatever was accepted is an https URL whose host (as urllib sees it) is on the list.
    parts = urlsplit(url)
    assert parts.scheme.lower() == "https" and parts.username is None
    assert normalize_host(parts.hostname or "") == host
    assert host == "example.com" or host.endswith(".example.org")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_pii_detection_never_crashes_and_spans_are_disjoint(text: str) -> None:
    found = detect_pii(text)
    for a, b in itertools.pairwise(found):
        assert a.end <= b.start


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=8), min_size=1, max_size=40), st.data())
def test_merkle_inclusion(leaves: list[bytes], data: st.DataObject) -> None:
    cr = CompactRange()
    for leaf in leaves:
        cr.push(leaf)
    assert cr.root() == merkle_root(leaves)
    i = data.draw(st.integers(0, len(leaves) - 1))
    proof = inclusion_proof(leaves, i)
    assert verify_inclusion(leaves[i], i, len(leaves), proof, cr.root())
    assert not verify_inclusion(leaves[i] + b"x", i, len(leaves), proof, cr.root())


_PARTITION_TEXT = """
@id("infer.permit") permit(principal, action == Action::"infer", resource);
@id("infer.big") @reason("too big") forbid(principal, action == Action::"infer", resource) when { context.n > 5 };
@id("tool.permit") permit(principal, action == Action::"call_tool", resource) when { context.n < 3 };
@id("group.forbid") @reason("group") forbid(principal, action in [Action::"call_tool", Action::"submit"], resource)
  when { context.n == 2 };
@id("any.forbid") @reason("any") forbid(principal, action, resource) when { context.n == 4 };
"""


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["infer", "call_tool", "submit", "release", "other"]), st.integers(0, 7))
def test_per_action_partitions_decide_exactly_like_the_whole_set(action: str, n: int) -> None:
    import dataclasses

    from policy.engine import compile_cedar, evaluate

    partitioned = compile_cedar(_PARTITION_TEXT)
    whole = dataclasses.replace(partitioned, by_action={}, other_actions=None)  # every call sees all policies
    assert set(partitioned.by_action) == {"infer", "call_tool"}
    args = {"policy_id": "p", "version": 1, "principal": {"type": "Agent", "id": "a"}, "action": action,
            "resource": {"type": "Tool", "id": "t"}, "context": {"n": n}}
    assert evaluate(partitioned, **args) == evaluate(whole, **args)
