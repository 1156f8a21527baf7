"""What a worker says it serves and promises, bound into its evidence (REPORT_DATA, see bundle.py).

The worker writes these claims into its runtime data; the CPU report's REPORT_DATA covers them, so
a relying party reads the tenant, model, version, model digest, the version of the tenant's signed
policy set the worker enforces, and the worker's promises from what the hardware signed, not from a
token or a field the gateway serves beside it. They are as true as the measured code that wrote
them: a measured worker writes its own settings here.

v2 added `policy_version` (a sealed request binds it as associated data); v1 claims are refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attestation.errors import FreshnessError, ParseError

WORKLOAD_CLAIMS_VERSION = 2
_FIELDS = {"v", "tenant", "model", "version", "model_digest", "promises", "policy_version"}


@dataclass(frozen=True)
class WorkloadClaims:
    tenant: str
    model: str
    version: str
    model_digest: str  # the package manifest's plaintext digest the worker decrypts and checks
    promises: Mapping[str, Any] = field(default_factory=dict)
    policy_version: int = 0  # the tenant's signed policy set the worker loaded at boot (0: none)

    def encode(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces): the bytes REPORT_DATA commits to."""
        return json.dumps({"v": WORKLOAD_CLAIMS_VERSION, "tenant": self.tenant, "model": self.model,
                           "version": self.version, "model_digest": self.model_digest,
                           "promises": dict(self.promises), "policy_version": self.policy_version},
                          sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> WorkloadClaims:
        """The claims of evidence; raises FreshnessError when the evidence binds none (an older worker,
        or runtime data stripped of them: the client then has nothing the hardware said)."""
        if not raw:
            raise FreshnessError("the evidence binds no workload claims (tenant, model, promises)")
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or set(doc) != _FIELDS or doc["v"] != WORKLOAD_CLAIMS_VERSION:
                raise ParseError("workload claims have unexpected fields or version")
            if not isinstance(doc["promises"], dict):
                raise ParseError("workload promises must be an object")
            if type(doc["policy_version"]) is not int or not 0 <= doc["policy_version"] < 2**63:
                raise ParseError("workload policy_version must be a non-negative int")
            claims = cls(tenant=str(doc["tenant"]), model=str(doc["model"]), version=str(doc["version"]),
                         model_digest=str(doc["model_digest"]), promises=dict(doc["promises"]),
                         policy_version=doc["policy_version"])
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise ParseError(f"malformed workload claims: {exc}") from exc
        if claims.encode() != raw:
            raise ParseError("workload claims are not in canonical form")
        return claims
