"""ModelRef: one validated name for a tenant's model version, with one canonical string form."""

from __future__ import annotations

import pytest

from protocol.model_ref import InvalidModelRef, ModelRef


def test_canonical_string_round_trips() -> None:
    ref = ModelRef("acme", "SmolLM2-135M.q8", "v1")
    assert str(ref) == "acme/SmolLM2-135M.q8/v1"
    assert ModelRef.parse(str(ref)) == ref
    assert ref.as_dict() == {"tenant": "acme", "model": "SmolLM2-135M.q8", "version": "v1"}


@pytest.mark.parametrize("parts", [
    ("", "m", "v1"), ("acme", "../x", "v1"), ("acme", "m", "v1/.."), ("acme", "a b", "v1"),
    ("acme", ".hidden", "v1"), ("acme", "m", "x" * 257), ("acme", "m", 1),
])
def test_names_that_could_escape_a_path_are_refused(parts: tuple) -> None:
    with pytest.raises(InvalidModelRef):
        ModelRef(*parts)


@pytest.mark.parametrize("text", ["acme/m", "acme/m/v1/x", "acme//v1", ""])
def test_malformed_canonical_strings_are_refused(text: str) -> None:
    with pytest.raises(InvalidModelRef):
        ModelRef.parse(text)


def test_it_is_frozen_hashable_and_ordered() -> None:
    a, b = ModelRef("acme", "m", "v1"), ModelRef("acme", "m", "v2")
    assert {a: 1}[ModelRef("acme", "m", "v1")] == 1 and sorted([b, a]) == [a, b]
    with pytest.raises(AttributeError):
        a.version = "v3"  # type: ignore[misc]
