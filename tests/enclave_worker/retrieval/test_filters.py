"""Attributes and OpenAI's attribute filters: a table of matches and a table of refusals."""

from __future__ import annotations

import pytest

from enclave_worker.retrieval.errors import InvalidRetrievalRequest
from enclave_worker.retrieval.filters import parse_attributes, parse_filter

ATTRS = {"team": "legal", "year": 2024, "draft": False, "score": 0.5}


@pytest.mark.parametrize(("raw", "expected"), [
    ({"type": "eq", "key": "team", "value": "legal"}, True),
    ({"type": "eq", "key": "team", "value": "sales"}, False),
    ({"type": "ne", "key": "team", "value": "sales"}, True),
    ({"type": "ne", "key": "missing", "value": "x"}, False),  # a missing key never matches
    ({"type": "gt", "key": "year", "value": 2023}, True),
    ({"type": "gte", "key": "year", "value": 2024}, True),
    ({"type": "lt", "key": "year", "value": 2024}, False),
    ({"type": "lte", "key": "score", "value": 0.5}, True),
    ({"type": "gt", "key": "team", "value": 5}, False),  # a string against a number: no match
    ({"type": "eq", "key": "draft", "value": False}, True),
    ({"type": "eq", "key": "draft", "value": 0}, False),  # a boolean equals only a boolean
    ({"type": "in", "key": "team", "value": ["sales", "legal"]}, True),
    ({"type": "nin", "key": "team", "value": ["sales", "legal"]}, False),
    ({"type": "and", "filters": [{"type": "eq", "key": "team", "value": "legal"},
                                 {"type": "gte", "key": "year", "value": 2025}]}, False),
    ({"type": "or", "filters": [{"type": "eq", "key": "team", "value": "hr"},
                                {"type": "and", "filters": [{"type": "eq", "key": "draft", "value": False}]}]}, True),
])
def test_filter_matches(raw: dict, expected: bool) -> None:
    assert parse_filter(raw).matches(ATTRS) is expected


@pytest.mark.parametrize(("raw", "message"), [
    ("team", "must be an object"),
    ({"type": "like", "key": "team", "value": "l%"}, "type must be one of"),
    ({"type": "eq", "value": "legal"}, "a comparison has"),
    ({"type": "eq", "key": "team", "value": "x", "extra": 1}, "a comparison has"),
    ({"type": "eq", "key": "team", "value": {"nested": 1}}, "must be a string, a number or a boolean"),
    ({"type": "eq", "key": "team", "value": float("nan")}, "NaN"),
    ({"type": "gt", "key": "draft", "value": True}, "not booleans"),
    ({"type": "in", "key": "team", "value": "legal"}, "non-empty list"),
    ({"type": "in", "key": "team", "value": []}, "non-empty list"),
    ({"type": "and", "filters": []}, "non-empty 'filters'"),
    ({"type": "or", "filters": [{"type": "eq", "key": "a", "value": 1}, 3]},
     r"filters\.filters\[1\] must be an object"),
    ({"type": "eq", "key": "k" * 65, "value": 1}, "1 to 64 characters"),
    ({"type": "eq", "key": "team", "value": "v" * 513}, "longer than 512"),
])
def test_bad_filters_are_refused(raw: object, message: str) -> None:
    with pytest.raises(InvalidRetrievalRequest, match=message):
        parse_filter(raw)


def test_deep_or_wide_filters_are_refused() -> None:
    deep: dict = {"type": "eq", "key": "a", "value": 1}
    for _ in range(9):
        deep = {"type": "and", "filters": [deep]}
    with pytest.raises(InvalidRetrievalRequest, match="nest at most"):
        parse_filter(deep)
    wide = {"type": "or", "filters": [{"type": "eq", "key": "a", "value": i} for i in range(64)]}
    with pytest.raises(InvalidRetrievalRequest, match="at most 64 conditions"):
        parse_filter(wide)


@pytest.mark.parametrize(("raw", "message"), [
    ([1], "must be an object"),
    ({f"k{i}": i for i in range(17)}, "at most 16 keys"),
    ({"": 1}, "1 to 64 characters"),
    ({"k": None}, "must be a string, a number or a boolean"),
    ({"k": "v" * 513}, "longer than 512"),
])
def test_bad_attributes_are_refused(raw: object, message: str) -> None:
    with pytest.raises(InvalidRetrievalRequest, match=message):
        parse_attributes(raw)


def test_attributes_kept_as_given() -> None:
    assert parse_attributes(ATTRS) == ATTRS and parse_attributes(None) == {}
