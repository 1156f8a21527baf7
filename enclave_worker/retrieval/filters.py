"""File attributes and OpenAI's attribute filters (vector store search, `file_search`).

Attributes follow OpenAI's limits (at most 16 keys of at most 64 characters; values strings of at
most 512 characters, booleans or numbers). A filter is a comparison {"type": eq|ne|gt|gte|lt|lte|in|nin,
"key", "value"} or a compound {"type": and|or, "filters": [...]}; it is parsed once into frozen
values, every error naming its path, and evaluated against a file's attributes. A key the file does
not have never matches (not even `ne`), so a filter cannot select files by what they lack."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidRetrievalRequest

MAX_ATTRIBUTES, MAX_KEY_CHARS, MAX_VALUE_CHARS = 16, 64, 512
MAX_FILTER_DEPTH, MAX_FILTER_NODES = 8, 64
_ORDERED = ("gt", "gte", "lt", "lte")
_COMPARISONS = ("eq", "ne", *_ORDERED, "in", "nin")

Scalar = str | int | float | bool


@dataclass(frozen=True)
class Comparison:
    op: str
    key: str
    value: Scalar | tuple[Scalar, ...]

    def matches(self, attributes: dict[str, Scalar]) -> bool:
        if self.key not in attributes:
            return False
        have = attributes[self.key]
        if self.op in ("in", "nin"):
            assert isinstance(self.value, tuple)
            return any(_equal(have, v) for v in self.value) == (self.op == "in")
        if self.op in ("eq", "ne"):
            return _equal(have, self.value) == (self.op == "eq")
        if not _comparable(have, self.value):
            return False
        a, b = have, self.value
        return {"gt": a > b, "gte": a >= b, "lt": a < b, "lte": a <= b}[self.op]  # type: ignore[operator]


@dataclass(frozen=True)
class Compound:
    op: str  # "and" | "or"
    filters: tuple[Comparison | Compound, ...]

    def matches(self, attributes: dict[str, Scalar]) -> bool:
        results = (f.matches(attributes) for f in self.filters)
        return all(results) if self.op == "and" else any(results)


Filter = Comparison | Compound


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _equal(a: object, b: object) -> bool:
    # True == 1 in Python; in a filter a boolean equals only a boolean.
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _comparable(a: object, b: object) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


def _scalar(value: object, path: str) -> Scalar:
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise InvalidRetrievalRequest(f"{path} is longer than {MAX_VALUE_CHARS} characters")
        return value
    if isinstance(value, bool) or _is_number(value):
        if isinstance(value, float) and value != value:  # NaN compares with nothing
            raise InvalidRetrievalRequest(f"{path} must not be NaN")
        return value  # type: ignore[return-value]
    raise InvalidRetrievalRequest(f"{path} must be a string, a number or a boolean")


def parse_attributes(raw: object) -> dict[str, Scalar]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRetrievalRequest("attributes must be an object")
    if len(raw) > MAX_ATTRIBUTES:
        raise InvalidRetrievalRequest(f"attributes may have at most {MAX_ATTRIBUTES} keys")
    out: dict[str, Scalar] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
            raise InvalidRetrievalRequest(f"attribute keys must be 1 to {MAX_KEY_CHARS} characters")
        out[key] = _scalar(value, f"attributes.{key}")
    return out


def parse_filter(raw: object, path: str = "filters") -> Filter:
    counter = [0]
    return _parse(raw, path, 0, counter)


def _parse(raw: object, path: str, depth: int, counter: list[int]) -> Filter:
    counter[0] += 1
    if depth > MAX_FILTER_DEPTH or counter[0] > MAX_FILTER_NODES:
        raise InvalidRetrievalRequest(f"{path}: filters nest at most {MAX_FILTER_DEPTH} deep and hold at most "
                                      f"{MAX_FILTER_NODES} conditions")
    if not isinstance(raw, dict):
        raise InvalidRetrievalRequest(f"{path} must be an object")
    op = raw.get("type")
    if op in ("and", "or"):
        items = raw.get("filters")
        if not isinstance(items, list) or not items or set(raw) - {"type", "filters"}:
            raise InvalidRetrievalRequest(f"{path}: a compound filter has 'type' and a non-empty 'filters' list")
        return Compound(op, tuple(_parse(f, f"{path}.filters[{i}]", depth + 1, counter) for i, f in enumerate(items)))
    if op not in _COMPARISONS:
        raise InvalidRetrievalRequest(f"{path}.type must be one of {', '.join(('and', 'or', *_COMPARISONS))}")
    key, value = raw.get("key"), raw.get("value")
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS or set(raw) - {"type", "key", "value"}:
        raise InvalidRetrievalRequest(f"{path}: a comparison has 'type', 'key' (1 to {MAX_KEY_CHARS} characters) "
                                      f"and 'value'")
    if op in ("in", "nin"):
        if not isinstance(value, list) or not value:
            raise InvalidRetrievalRequest(f"{path}.value must be a non-empty list for '{op}'")
        return Comparison(op, key, tuple(_scalar(v, f"{path}.value[{i}]") for i, v in enumerate(value)))
    scalar = _scalar(value, f"{path}.value")
    if op in _ORDERED and isinstance(scalar, bool):
        raise InvalidRetrievalRequest(f"{path}.value: '{op}' compares numbers or strings, not booleans")
    return Comparison(op, key, scalar)
