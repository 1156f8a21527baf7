"""Which caller may retrieve which file: the `file_access` section of a tenant's signed policy set,
enforced by the worker on every vector store search (enclave_worker/retrieval_rpcs.py).

    "file_access": {
      "default": "deny",
      "rules": [{"attribute": "team", "value": "legal", "api_keys": ["<hex SHA-256 of an API key>"]}]
    }

A file whose attributes match a rule (its `attribute` equals `value`, same type) may be read by the
callers that rule names; every rule a file matches grants, none takes away. A file no rule matches
follows `default`: "deny" (the default when absent) gives it to no one, "allow" to every caller the
caller policy admits. Callers are named as in `callers.api_keys` (digests: the policy never holds a
key). A tenant with no `file_access` section has not decided: every admitted caller reads every file
of its stores. Attributes are the tenant's own (set when it attaches a file), sealed in the store."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policy.errors import PolicyInvalid

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
MAX_RULES = 256
MAX_KEYS_PER_RULE = 4096

Scalar = str | int | float | bool


@dataclass(frozen=True)
class FileRule:
    attribute: str
    value: Scalar
    key_ids: frozenset[str]  # "key_" + digest[:16]: the ids requests are authenticated under
    api_keys: tuple[str, ...]

    def matches(self, attributes: Mapping[str, Any]) -> bool:
        have = attributes.get(self.attribute)
        return have is not None and type(have) is type(self.value) and have == self.value


@dataclass(frozen=True)
class FileAccessPolicy:
    rules: tuple[FileRule, ...] = ()
    default_allow: bool = False

    @classmethod
    def from_dict(cls, d: Any) -> FileAccessPolicy:
        if not isinstance(d, Mapping) or set(d) - {"default", "rules"}:
            raise PolicyInvalid("file_access has only 'default' and 'rules'")
        default = d.get("default", "deny")
        if default not in ("allow", "deny"):
            raise PolicyInvalid("file_access.default must be 'allow' or 'deny'")
        rules = d.get("rules", [])
        if not isinstance(rules, list) or len(rules) > MAX_RULES:
            raise PolicyInvalid(f"file_access.rules must be a list of at most {MAX_RULES} rules")
        return cls(tuple(_rule(r, i) for i, r in enumerate(rules)), default == "allow")

    def to_dict(self) -> dict[str, Any]:
        return {"default": "allow" if self.default_allow else "deny",
                "rules": [{"attribute": r.attribute, "value": r.value, "api_keys": list(r.api_keys)}
                          for r in self.rules]}

    def readable(self, key_id: str, attributes: Mapping[str, Any]) -> bool:
        """May the caller (`key_id`, as the request was authenticated) read a file with these attributes?"""
        matching = [r for r in self.rules if r.matches(attributes)]
        if not matching:
            return self.default_allow
        return any(key_id in r.key_ids for r in matching)


def _rule(raw: Any, i: int) -> FileRule:
    where = f"file_access.rules[{i}]"
    if not isinstance(raw, Mapping) or set(raw) != {"attribute", "value", "api_keys"}:
        raise PolicyInvalid(f"{where} names exactly 'attribute', 'value' and 'api_keys'")
    attribute, value, keys = raw["attribute"], raw["value"], raw["api_keys"]
    if not isinstance(attribute, str) or not 0 < len(attribute) <= 64:
        raise PolicyInvalid(f"{where}.attribute must be 1 to 64 characters")
    if not isinstance(value, (str, int, float, bool)) or (isinstance(value, str) and len(value) > 512):
        raise PolicyInvalid(f"{where}.value must be a string (at most 512 characters), a number or a boolean")
    if not isinstance(keys, list) or len(keys) > MAX_KEYS_PER_RULE \
            or not all(isinstance(k, str) and _DIGEST.match(k) for k in keys):
        raise PolicyInvalid(f"{where}.api_keys must be hex SHA-256 digests of API keys (sealed apikeys digest)")
    return FileRule(attribute, value, frozenset("key_" + k[:16] for k in keys), tuple(keys))
