"""Key-release policy: may the key broker release a model's data key to this attested worker?

The typed ``ReleasePolicy`` is what tenants write; ``evaluate_release`` appraises the verifier's
facts against it. Default deny: every empty allow-set allows nothing, and every failing condition
is listed in the decision's reasons so an operator sees all problems at once, not one per retry.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from policy.compile import cedar_rule
from policy.decision import Decision
from policy.engine import CedarPolicies, authorize, cedar_set, cedar_str, cedar_uid, compile_cedar, uid
from policy.errors import PolicyInvalid
from policy.rtmrs import NAMES as RTMR_NAMES
from policy.rtmrs import RtmrSet, cedar_allowed, parse_rtmr_sets, rtmr_sets_json

log = logging.getLogger(__name__)

KNOWN_TEES = frozenset({"snp", "tdx", "sim"})
_HEX = frozenset("0123456789abcdef")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class FrozenMap(Mapping[str, int]):
    """A read-only, hashable copy, so a frozen policy stays hashable and a caller mutating its
    dict later cannot change the policy."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, int]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> int:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._data) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


@dataclass(frozen=True)
class ReleasePolicy:
    """A tenant's release policy for one model (optionally one version of it)."""

    policy_id: str
    version: int
    tenant: str
    model: str
    model_version: str | None = None  # None = any version of the model
    allowed_tee: frozenset[str] = frozenset()
    allowed_measurements: frozenset[str] = frozenset()  # lower-case hex
    min_tcb: Mapping[str, int] = field(default_factory=dict)
    allow_debug: bool = False
    require_gpu_cc: bool = False
    required_signer: str | None = None
    unsafe_allow_simulated_tee: bool = False
    # Enforced by the attested worker, which alone sees its device: it may serve this model on a
    # GPU whose confidential-computing mode is off (weights and prompts cross PCIe in the clear),
    # and marks every answer insecure. Contradicts require_gpu_cc.
    unsafe_allow_gpu_cc_off: bool = False
    # The workloads allowed: init-data digests (attestation/initdata.py; SNP HOST_DATA, TDX
    # MRCONFIGID), hex. None: not named (the launch digest alone decides: any image, arguments and
    # configuration in an allowed VM); a set names every workload that may receive the key.
    allowed_workload_ids: frozenset[str] | None = None
    # TCB statuses accepted (e.g. ["UpToDate"]); None: not named (min_tcb still applies).
    acceptable_tcb_status: frozenset[str] | None = None
    max_vmpl: int = 0  # SNP: the report must come from VMPL 0 unless a policy says otherwise
    allow_migration_agent: bool = False  # SNP MIGRATE_MA / TDX MIGRATABLE: refused unless allowed
    # TDX boot chains allowed (policy/rtmrs.py): sets of RTMR values, as `sealed measure` and the CC
    # event log give them; None: not named (any kernel, initrd and command line under the MRTD).
    allowed_rtmrs: frozenset[RtmrSet] | None = None
    # Every GPU's measurements match the imported RIMs for its driver and VBIOS versions, and every
    # certificate of its device and RIM chains has an imported OCSP answer "good" (a "revoked"
    # answer fails verification whatever the policy). Both need GPU evidence: none is refused.
    require_gpu_rim_match: bool = False
    require_gpu_ocsp_good: bool = False
    # How many GPUs the node must attest, exactly (an 8-GPU node with one GPU's evidence left out
    # still verifies GPU by GPU); None: not named (any number, none included).
    gpu_count: int | None = None

    def __post_init__(self) -> None:
        if not self.policy_id or not self.tenant or not self.model:
            raise PolicyInvalid("policy_id, tenant and model must be non-empty")
        if type(self.version) is not int or self.version < 1:
            raise PolicyInvalid(f"version must be a positive int, got {self.version!r}")
        tees = frozenset(self.allowed_tee)
        if not tees <= KNOWN_TEES:
            raise PolicyInvalid(f"unknown TEE types {sorted(tees - KNOWN_TEES)}")
        measurements = frozenset(m.lower() for m in self.allowed_measurements)
        bad = [m for m in measurements if not m or not set(m) <= _HEX]
        if bad:
            raise PolicyInvalid(f"measurements must be hex: {sorted(bad)}")
        for name, floor in self.min_tcb.items():
            if type(floor) is not int or floor < 0:
                raise PolicyInvalid(f"min_tcb[{name!r}] must be a non-negative int")
        for flag in ("allow_debug", "require_gpu_cc", "unsafe_allow_simulated_tee", "unsafe_allow_gpu_cc_off",
                     "require_gpu_rim_match", "require_gpu_ocsp_good"):
            if type(getattr(self, flag)) is not bool:
                raise PolicyInvalid(f"{flag} must be a bool")
        object.__setattr__(self, "allowed_tee", tees)
        object.__setattr__(self, "allowed_measurements", measurements)
        object.__setattr__(self, "min_tcb", FrozenMap(self.min_tcb))
        if self.allowed_workload_ids is not None:
            ids = frozenset(w.lower() for w in self.allowed_workload_ids)
            if any(not w or not set(w) <= _HEX for w in ids):
                raise PolicyInvalid("allowed_workload_ids must be hex")
            object.__setattr__(self, "allowed_workload_ids", ids)
        if self.acceptable_tcb_status is not None:
            object.__setattr__(self, "acceptable_tcb_status", frozenset(self.acceptable_tcb_status))
        if type(self.max_vmpl) is not int or not 0 <= self.max_vmpl <= 3:
            raise PolicyInvalid("max_vmpl must be an int from 0 to 3")
        if type(self.allow_migration_agent) is not bool:
            raise PolicyInvalid("allow_migration_agent must be a bool")
        if self.allowed_rtmrs is not None:
            object.__setattr__(self, "allowed_rtmrs", parse_rtmr_sets(self.allowed_rtmrs))
        if self.gpu_count is not None and (type(self.gpu_count) is not int or self.gpu_count < 1):
            raise PolicyInvalid(f"gpu_count must be a positive int or null, got {self.gpu_count!r}")
        if self.unsafe_allow_gpu_cc_off and self.require_gpu_cc:
            raise PolicyInvalid("unsafe_allow_gpu_cc_off contradicts require_gpu_cc")
        if self.unsafe_allow_gpu_cc_off:
            log.warning("release policy %s v%s sets unsafe_allow_gpu_cc_off: the model may be served on a "
                        "GPU without confidential computing (answers marked insecure)", self.policy_id, self.version)
        if self.unsafe_allow_simulated_tee:
            log.warning("release policy %s v%s sets unsafe_allow_simulated_tee: simulated TEEs "
                        "(no hardware protection) may receive keys", self.policy_id, self.version)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReleasePolicy:
        """Build from a JSON-shaped mapping; unknown keys are rejected (a typo must not widen access)."""
        if not isinstance(d, Mapping):
            raise PolicyInvalid("release policy must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise PolicyInvalid(f"unknown release policy keys: {sorted(unknown)}")
        missing = {"policy_id", "version", "tenant", "model"} - set(d)
        if missing:
            raise PolicyInvalid(f"missing release policy keys: {sorted(missing)}")
        args = dict(d)
        for key in ("allowed_tee", "allowed_measurements", "allowed_workload_ids", "acceptable_tcb_status"):
            if key in args and (args[key] is not None or key in ("allowed_tee", "allowed_measurements")):
                value = args[key]
                if not isinstance(value, list | tuple | frozenset | set) or not all(isinstance(v, str) for v in value):
                    raise PolicyInvalid(f"{key} must be a list of strings")
                args[key] = frozenset(value)
        if "min_tcb" in args and not isinstance(args["min_tcb"], Mapping):
            raise PolicyInvalid("min_tcb must be an object")
        for key in ("policy_id", "tenant", "model"):
            if not isinstance(args[key], str) or not _ID.match(args[key]):
                raise PolicyInvalid(f"{key} must be a name (letters, digits, '._:-', at most 128)")
        for key in ("model_version", "required_signer"):
            if args.get(key) is not None and not isinstance(args[key], str):
                raise PolicyInvalid(f"{key} must be a string or null")
        try:
            return cls(**args)
        except TypeError as exc:  # defensive: a field of the wrong shape
            raise PolicyInvalid(str(exc)) from exc

    @functools.cached_property
    def compiled(self) -> CedarPolicies:
        """This policy as parsed Cedar (compiled once per policy object)."""
        return compile_cedar(compile_release(self))

    def to_dict(self) -> dict[str, Any]:
        """JSON-shaped, sorted lists so the same policy always serializes (and signs) the same."""
        return {
            "policy_id": self.policy_id,
            "version": self.version,
            "tenant": self.tenant,
            "model": self.model,
            "model_version": self.model_version,
            "allowed_tee": sorted(self.allowed_tee),
            "allowed_measurements": sorted(self.allowed_measurements),
            "min_tcb": dict(sorted(self.min_tcb.items())),
            "allow_debug": self.allow_debug,
            "require_gpu_cc": self.require_gpu_cc,
            "required_signer": self.required_signer,
            "unsafe_allow_simulated_tee": self.unsafe_allow_simulated_tee,
            # Only when set, so every policy written before the flag existed serializes as before.
            **({"unsafe_allow_gpu_cc_off": True} if self.unsafe_allow_gpu_cc_off else {}),
            # The workload-identity and platform conditions, likewise only when not the default.
            **({"allowed_workload_ids": sorted(self.allowed_workload_ids)}
               if self.allowed_workload_ids is not None else {}),
            **({"acceptable_tcb_status": sorted(self.acceptable_tcb_status)}
               if self.acceptable_tcb_status is not None else {}),
            **({"max_vmpl": self.max_vmpl} if self.max_vmpl else {}),
            **({"allow_migration_agent": True} if self.allow_migration_agent else {}),
            **({"allowed_rtmrs": rtmr_sets_json(self.allowed_rtmrs)} if self.allowed_rtmrs is not None else {}),
            **({"require_gpu_rim_match": True} if self.require_gpu_rim_match else {}),
            **({"require_gpu_ocsp_good": True} if self.require_gpu_ocsp_good else {}),
            **({"gpu_count": self.gpu_count} if self.gpu_count is not None else {}),
        }


@dataclass(frozen=True)
class ReleaseFacts:
    """What the verifier established about the requesting worker and the model it asks for."""

    tenant: str
    model: str
    model_version: str
    tee: str
    measurement: str  # hex
    debug: bool
    tcb: Mapping[str, int]
    gpu_cc: bool
    insecure: bool
    signer: str | None
    tcb_status: str = "Unknown"
    workload_id: str = ""  # hex: the init-data digest the hardware carries ("" for sim)
    vmpl: int = 0
    migration_agent: bool = False
    rtmrs: tuple[str, ...] = ()  # TDX RTMR0..3 (hex) from the signed quote; () for other TEEs
    gpu_rim_matched: bool = False  # at least one GPU, and every GPU matched its RIMs
    gpu_ocsp_good: bool = False  # at least one GPU, and every GPU's chains answered "good"
    gpu_count: int = 0  # GPUs whose evidence verified


def _context(policy: ReleasePolicy, facts: ReleaseFacts) -> dict[str, Any]:
    return {
        "tenant": facts.tenant, "model": facts.model, "model_version": facts.model_version,
        "tee": facts.tee, "measurement": facts.measurement.lower(), "debug": bool(facts.debug),
        "tcb": {str(k): int(v) for k, v in facts.tcb.items()}, "gpu_cc": bool(facts.gpu_cc),
        "insecure": bool(facts.insecure), "signer": facts.signer or "",
        "tcb_status": facts.tcb_status, "workload_id": facts.workload_id.lower(), "vmpl": int(facts.vmpl),
        "migration_agent": bool(facts.migration_agent),
        **{name: (facts.rtmrs[i].lower() if len(facts.rtmrs) == len(RTMR_NAMES) else "")
           for i, name in enumerate(RTMR_NAMES)},
        "gpu_rim_matched": bool(facts.gpu_rim_matched), "gpu_ocsp_good": bool(facts.gpu_ocsp_good),
        "gpu_count": int(facts.gpu_count),
    }


def evaluate_release(policy: ReleasePolicy, facts: ReleaseFacts) -> Decision:
    """Appraise ``facts`` against ``policy`` with the Cedar engine; never raises for a deny (call
    ``.require()``). Every failing condition is one Cedar forbid, so all of them are listed."""
    decision = authorize(policy.compiled, policy_id=policy.policy_id, version=policy.version,
                         principal=uid("Tenant", facts.tenant), action="release",
                         resource=uid("Model", facts.model), context=_context(policy, facts))
    if decision.allowed and (facts.insecure or facts.tee == "sim"):
        log.warning("releasing under %s v%s to a simulated TEE (unsafe_allow_simulated_tee)",
                    policy.policy_id, policy.version)
    return decision


def compile_release(rp: ReleasePolicy) -> str:
    """A ReleasePolicy as Cedar: one permit for the model, one forbid per failing condition."""
    scope = f'principal, action == Action::"release", resource == {cedar_uid("Model", rp.model)}'
    any_scope = 'principal, action == Action::"release", resource'
    rid = f"release.{rp.policy_id}"
    out = [cedar_rule(rid, "permit", scope)]

    def forbid(suffix: str, cond: str, reason: str) -> None:
        out.append(cedar_rule(f"{rid}.{suffix}", "forbid", any_scope, cond, reason))

    forbid("tenant", f"context.tenant != {cedar_str(rp.tenant)}", "tenant is not the policy's tenant")
    forbid("model", f"context.model != {cedar_str(rp.model)}", "model is not covered by this policy")
    if rp.model_version is not None:
        forbid("model_version", f"context.model_version != {cedar_str(rp.model_version)}",
               "model version is not the allowed version")
    forbid("tee", f"!{cedar_set(rp.allowed_tee)}.contains(context.tee)", "TEE type is not allowed")
    forbid("measurement", f"!{cedar_set(rp.allowed_measurements)}.contains(context.measurement)",
           "measurement is not in the allowed set")
    for name, floor in sorted(rp.min_tcb.items()):
        n = cedar_str(name)
        forbid(f"tcb.{name}", f"!(context.tcb has {n}) || context.tcb[{n}] < {floor}",
               f"TCB component {name} below floor {floor}")
    if rp.allowed_workload_ids is not None:
        forbid("workload_id", f"!{cedar_set(rp.allowed_workload_ids)}.contains(context.workload_id)",
               "workload identity (init-data digest) is not in the allowed set")
    if rp.acceptable_tcb_status is not None:
        forbid("tcb_status", f"!{cedar_set(rp.acceptable_tcb_status)}.contains(context.tcb_status)",
               "TCB status is not acceptable")
    forbid("vmpl", f"context.vmpl > {rp.max_vmpl}", f"report comes from a VMPL above {rp.max_vmpl}")
    if not rp.allow_migration_agent:
        forbid("migration_agent", "context.migration_agent", "a migration agent may export the guest's state")
    if not rp.allow_debug:
        forbid("debug", "context.debug", "worker runs in debug mode")
    if rp.require_gpu_cc:
        forbid("gpu_cc", "!context.gpu_cc", "GPU confidential computing is off")
    if rp.allowed_rtmrs is not None:
        forbid("rtmrs", f'context.tee == "tdx" && !{cedar_allowed(rp.allowed_rtmrs)}',
               "TDX RTMRs (kernel, initrd, command line as the CC event log replays them) are not an allowed set")
    if rp.require_gpu_rim_match:
        forbid("gpu_rim", "!context.gpu_rim_matched",
               "GPU measurements do not match the imported RIMs (or no GPU, or no driver and VBIOS RIMs for "
               "its versions)")
    if rp.require_gpu_ocsp_good:
        forbid("gpu_ocsp", "!context.gpu_ocsp_good",
               "GPU certificate status is not OCSP good (no GPU, or no fresh imported OCSP answer)")
    if rp.gpu_count is not None:
        forbid("gpu_count", f"context.gpu_count != {rp.gpu_count}",
               f"the node must attest exactly {rp.gpu_count} GPU(s)")
    if rp.required_signer is not None:
        forbid("signer", f"context.signer != {cedar_str(rp.required_signer)}",
               "model signer is not the required signer")
    if not rp.unsafe_allow_simulated_tee:
        forbid("simulated", 'context.insecure || context.tee == "sim"',
               "evidence is from a simulated (insecure) TEE")
    return "".join(out)
