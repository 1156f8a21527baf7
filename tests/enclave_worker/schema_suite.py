"""The acceptance suite of JSON schemas (issue #36), shared by both engines' tests: our engine
(engine/test_engine_structured.py) and the vLLM backend (vllm/vllm_checks.py, run in vLLM's
virtualenv; vllm/test_vllm_engine.py and api/test_vllm_stack.py check its answers). Schemas bound
their strings, numbers and arrays so that a sampled answer ends well within MAX_TOKENS.

No pytest or jsonschema import at module level: vllm_checks.py imports this from vLLM's virtualenv.
"""

from __future__ import annotations

import json
from typing import Any

S = {"type": "string", "maxLength": 12}
I = {"type": "integer", "minimum": 0, "maximum": 999}  # noqa: E741
# A number's digits are bounded too: range alone lets a sampled answer run its fraction to max_tokens
# (seen on vLLM: "a shape", 96 digits). 0.25 is exact in binary, so jsonschema's float check holds.
N = {"type": "number", "minimum": -100, "maximum": 100, "multipleOf": 0.25}
B = {"type": "boolean"}


def obj(props: dict, required: list[str] | None = None, **extra: object) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False, **extra}


SCHEMAS: list[tuple[str, dict]] = [
    ("a person", obj({"name": S, "age": I})),
    ("a city", obj({"city": S, "country": S, "population": I})),
    ("a flag", obj({"enabled": B})),
    ("a colour", obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("a temperature", obj({"celsius": N})),
    ("a list of fruits", obj({"fruits": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}})),
    ("a list of numbers", {"type": "array", "items": I, "minItems": 2, "maxItems": 4}),
    ("a single word", {"type": "string", "maxLength": 10}),
    ("a yes or no", {"enum": ["yes", "no"]}),
    ("a score", {"type": "integer", "minimum": 1, "maximum": 10}),
    ("a book", obj({"title": S, "author": obj({"first": S, "last": S})})),
    ("an order", obj({"id": I, "items": {"type": "array", "maxItems": 2, "items": obj({"sku": S, "qty": I})}})),
    ("a user, email optional", obj({"name": S, "email": S}, required=["name"])),
    ("a point", obj({"x": N, "y": N}, required=["x", "y"])),
    ("a status", obj({"status": {"anyOf": [{"const": "ok"}, {"type": "integer", "minimum": 400, "maximum": 599}]}})),
    ("a value or null", obj({"value": {"anyOf": [I, {"type": "null"}]}})),
    ("a date", obj({"date": {"type": "string", "format": "date"}})),
    # maxLength: RFC 3339 allows any number of fraction digits, which a sampled model can extend to max_tokens
    ("a time", obj({"at": {"type": "string", "format": "time", "maxLength": 16}})),
    ("a uuid", obj({"id": {"type": "string", "format": "uuid"}})),
    ("an ip address", obj({"ip": {"type": "string", "format": "ipv4"}})),
    ("a zip code", obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}})),
    ("a hex colour", obj({"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}})),
    ("a tag set", obj({"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}})),
    ("a pair", {"type": "array", "prefixItems": [S, I], "items": False, "minItems": 2}),
    ("a shape", {"anyOf": [obj({"circle": N}), obj({"square": N})]}),
    ("a pet", obj({"kind": {"enum": ["cat", "dog"]}, "name": S, "age": I}, required=["kind"])),
    ("a matrix", obj({"rows": {"type": "array", "maxItems": 2,
                               "items": {"type": "array", "items": I, "maxItems": 2}}})),
    ("a config", obj({"debug": B, "level": {"enum": ["low", "high"]}, "retries": I}, required=["debug"])),
    ("a rating", obj({"stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]}, "comment": S})),
    ("a constant", obj({"version": {"const": 2}, "name": S})),
    ("a nested config", obj({"db": obj({"host": S, "port": I}), "cache": obj({"on": B})})),
    ("an event", obj({"name": S, "day": {"enum": ["mon", "tue", "wed"]}, "hour": {"type": "integer",
                                                                                   "minimum": 0, "maximum": 23}})),
    ("two words", obj({"words": {"type": "array", "items": S, "minItems": 2, "maxItems": 2}})),
]
MAX_TOKENS = 96
FREE = 8  # the first FREE schemas are also asked unconstrained: most of those answers must fail


def ask(what: str) -> str:
    """The user message for one schema."""
    return f"Reply with {what}, as JSON."


def valid(doc: str, schema: dict[str, Any]) -> bool:
    """Whether `doc` is JSON that validates against `schema` (string formats checked too)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(doc), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
