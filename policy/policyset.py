"""A tenant's whole policy: the typed sections plus custom Cedar rules, compiled once to Cedar."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policy.callers import CallerPolicy
from policy.compile import compile_policy_set
from policy.engine import CedarPolicies, compile_cedar, validate_against_schema
from policy.errors import PolicyInvalid
from policy.file_access import FileAccessPolicy
from policy.model import AgentPolicy, DataPolicy, Limits, _check_keys, _frozen, _name
from policy.release import ReleasePolicy
from policy.schema import CEDAR_SCHEMA

_KEYS = {"policy_id", "version", "tenant", "admission", "key_overrides", "agents", "data", "release", "cedar",
         "require_sealed", "decision_record_key", "callers", "response_retention_days", "file_access"}
DEFAULT_RESPONSE_RETENTION_DAYS = 30  # OpenAI's for stored responses
MAX_RESPONSE_RETENTION_DAYS = 365


@dataclass(frozen=True)
class PolicySet:
    """Everything one tenant decided, at one version. Absent sections permit nothing."""

    policy_id: str
    version: int
    tenant: str
    admission: Limits | None = None
    key_overrides: Mapping[str, Limits] = field(default_factory=dict)  # API key id -> override
    agents: Mapping[str, AgentPolicy] = field(default_factory=dict)  # agent key id -> controls
    data: DataPolicy | None = None
    release: tuple[ReleasePolicy, ...] = ()
    cedar: str = ""  # extra tenant rules: forbid-only, each with @id (they can narrow, never widen)
    require_sealed: bool = False  # refuse plaintext requests: prompts only sealed to the worker (docs/sealed-mode.md)
    # The tenant's X25519 public key (64 hex), to which workers seal their decisions on sealed
    # requests (docs/sealed-mode.md, "Decision records"); None: those decisions reach no one.
    decision_record_key: str | None = None
    # Who may call the tenant's models (policy/callers.py); None: no caller list (every key accepted).
    callers: CallerPolicy | None = None
    # How long stored Responses state (`store: true`) may be opened, in days; 0: nothing is stored.
    # Workers stamp the expiry inside the sealed state and refuse it after (docs/security.md).
    response_retention_days: int = DEFAULT_RESPONSE_RETENTION_DAYS
    # Which caller may retrieve which file of its vector stores (policy/file_access.py); None: all.
    file_access: FileAccessPolicy | None = None

    def __post_init__(self) -> None:
        _name(self.policy_id, "policy_id")
        _name(self.tenant, "tenant")
        if type(self.version) is not int or self.version < 1:
            raise PolicyInvalid("version must be a positive int")
        for rp in self.release:
            if rp.tenant != self.tenant:
                raise PolicyInvalid(f"release policy {rp.policy_id} names another tenant")
        object.__setattr__(self, "key_overrides", _frozen(self.key_overrides))
        object.__setattr__(self, "agents", _frozen(self.agents))
        if type(self.require_sealed) is not bool:
            raise PolicyInvalid("require_sealed must be true or false")
        days = self.response_retention_days
        if type(days) is not int or not 0 <= days <= MAX_RESPONSE_RETENTION_DAYS:
            raise PolicyInvalid(f"response_retention_days must be an int from 0 to {MAX_RESPONSE_RETENTION_DAYS}")
        if self.decision_record_key is not None and not _is_x25519_hex(self.decision_record_key):
            raise PolicyInvalid("decision_record_key must be an X25519 public key: 64 lowercase hex digits")
        if self.cedar.strip():
            custom = compile_cedar(self.cedar)
            if any(effect != "forbid" for effect in custom.effects.values()):
                # A custom permit could re-open what a typed section closed; only forbids may be added.
                raise PolicyInvalid("custom Cedar policies may only forbid")
            validate_against_schema(self.cedar, CEDAR_SCHEMA)
        self.compiled  # noqa: B018 - compile now so an invalid policy fails at upload, not at use

    def release_for(self, model: str, model_version: str) -> ReleasePolicy | None:
        """The most specific release policy covering a model version (exact version first)."""
        exact = [p for p in self.release if p.model == model and p.model_version == model_version]
        anyv = [p for p in self.release if p.model == model and p.model_version is None]
        found = exact or anyv
        return found[0] if found else None

    @functools.cached_property
    def compiled(self) -> CedarPolicies:
        """The Cedar form of the whole set (parsed once; cached on the frozen instance)."""
        return compile_cedar(compile_policy_set(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PolicySet:
        d = _check_keys(d, _KEYS, "policy set")
        missing = {"policy_id", "version", "tenant"} - set(d)
        if missing:
            raise PolicyInvalid(f"missing policy set keys: {sorted(missing)}")
        overrides = _check_keys(d.get("key_overrides", {}), set(d.get("key_overrides", {})), "overrides")
        agents = _check_keys(d.get("agents", {}), set(d.get("agents", {})), "agents")
        release = d.get("release", [])
        if not isinstance(release, list):
            raise PolicyInvalid("release must be a list")
        cedar = d.get("cedar", "")
        if not isinstance(cedar, str):
            raise PolicyInvalid("cedar must be a string")
        return cls(
            policy_id=d["policy_id"], version=d["version"], tenant=d["tenant"],
            admission=Limits.from_dict(d["admission"]) if d.get("admission") is not None else None,
            key_overrides={_name(k, "API key id"): Limits.from_dict(v) for k, v in overrides.items()},
            agents={_name(k, "agent key id"): AgentPolicy.from_dict(v) for k, v in agents.items()},
            data=DataPolicy.from_dict(d["data"]) if d.get("data") is not None else None,
            release=tuple(ReleasePolicy.from_dict(r) for r in release), cedar=cedar,
            require_sealed=d.get("require_sealed", False), decision_record_key=d.get("decision_record_key"),
            callers=CallerPolicy.from_dict(d["callers"]) if d.get("callers") is not None else None,
            response_retention_days=d.get("response_retention_days", DEFAULT_RESPONSE_RETENTION_DAYS),
            file_access=FileAccessPolicy.from_dict(d["file_access"]) if d.get("file_access") is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy_id": self.policy_id, "version": self.version, "tenant": self.tenant}
        if self.admission is not None:
            out["admission"] = self.admission.to_dict()
        if self.key_overrides:
            out["key_overrides"] = {k: v.to_dict() for k, v in sorted(self.key_overrides.items())}
        if self.agents:
            out["agents"] = {k: v.to_dict() for k, v in sorted(self.agents.items())}
        if self.data is not None:
            out["data"] = self.data.to_dict()
        if self.release:
            out["release"] = [r.to_dict() for r in self.release]
        if self.cedar:
            out["cedar"] = self.cedar
        if self.require_sealed:
            out["require_sealed"] = True
        if self.decision_record_key is not None:
            out["decision_record_key"] = self.decision_record_key
        if self.callers is not None:
            out["callers"] = self.callers.to_dict()
        if self.response_retention_days != DEFAULT_RESPONSE_RETENTION_DAYS:
            out["response_retention_days"] = self.response_retention_days
        if self.file_access is not None:
            out["file_access"] = self.file_access.to_dict()
        return out


def _is_x25519_hex(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        return False
    return bytes.fromhex(value) != bytes(32)  # the all-zero point: every shared secret would be zero
