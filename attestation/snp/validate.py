"""Typed appraisal policy for verified SEV-SNP reports. Default-deny; all violations reported at once."""

from __future__ import annotations

import dataclasses
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attestation.errors import ParseError, PolicyViolation
from attestation.snp.certs import VekKind
from attestation.snp.tcb import Product, TcbVersion
from attestation.snp.verify import VerifiedReport

_TCB_KEYS = ("bl", "tee", "snp", "ucode", "fmc")


def _floor(spec: Mapping[str, int] | None) -> TcbVersion | None:
    if spec is None:
        return None
    unknown = set(spec) - set(_TCB_KEYS)
    if unknown:
        raise ParseError(f"unknown TCB components {sorted(unknown)}")
    # Absent components floor at 0, which every TCB meets.
    return TcbVersion(**{k: int(spec.get(k, 0)) for k in ("bl", "tee", "snp", "ucode")}, fmc=spec.get("fmc"))


@dataclass(frozen=True)
class Policy:
    """What a relying party accepts. Defaults deny debug, migration agents, VMPL > 0 and any
    measurement (an empty allow-list matches nothing); `unsafe_any_measurement` opts out loudly."""

    allowed_measurements: frozenset[bytes] = frozenset()
    unsafe_any_measurement: bool = False
    min_tcb: TcbVersion | None = None  # floor on REPORTED_TCB (the TCB the VEK is bound to)
    min_launch_tcb: TcbVersion | None = None
    allow_debug: bool = False
    allow_migrate_ma: bool = False
    allow_smt: bool = True
    require_single_socket: bool = False
    allowed_vmpls: frozenset[int] = frozenset({0})
    report_data: bytes | None = None
    host_data: bytes | None = None
    family_id: bytes | None = None
    image_id: bytes | None = None
    id_key_digests: frozenset[bytes] | None = None  # None: any; otherwise must be one of these
    author_key_digests: frozenset[bytes] | None = None
    require_author_key: bool = False
    min_guest_svn: int = 0
    min_abi: tuple[int, int] | None = None  # (major, minor) of the guest POLICY
    min_firmware: tuple[int, int, int] | None = None  # committed (major, minor, build)
    allowed_products: frozenset[Product] | None = None
    allowed_signers: frozenset[VekKind] = frozenset({VekKind.VCEK, VekKind.VLEK})
    chip_ids: frozenset[bytes] | None = None
    require_crl: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """Build from JSON: bytes as hex strings, sets as lists, TCBs as {"bl":..}. Unknown keys fail."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ParseError(f"unknown SNP policy keys {sorted(unknown)}")
        try:
            return cls(**{k: _convert(k, v) for k, v in data.items()})
        except (TypeError, ValueError) as exc:
            raise ParseError(f"bad SNP policy: {exc}") from exc


def _hex(v: Any) -> bytes:
    if not isinstance(v, str):
        raise ValueError(f"expected a hex string, got {type(v).__name__}")
    return bytes.fromhex(v)


def _convert(key: str, v: Any) -> Any:
    if v is None:
        return None
    if key in ("allowed_measurements", "id_key_digests", "author_key_digests", "chip_ids"):
        return frozenset(_hex(x) for x in v)
    if key in ("report_data", "host_data", "family_id", "image_id"):
        return _hex(v)
    if key in ("min_tcb", "min_launch_tcb"):
        return _floor(v)
    if key in ("min_abi", "min_firmware"):
        return tuple(int(x) for x in v)
    if key == "allowed_vmpls":
        return frozenset(int(x) for x in v)
    if key == "allowed_products":
        return frozenset(Product(x) for x in v)
    if key == "allowed_signers":
        return frozenset(VekKind(x) for x in v)
    if key == "min_guest_svn":
        return int(v)
    if not isinstance(v, bool):
        raise ValueError(f"{key} must be true or false")
    return v


def _eq(a: bytes, b: bytes) -> bool:
    return len(a) == len(b) and hmac.compare_digest(a, b)


def _tcb_violations(name: str, tcb: TcbVersion, floor: TcbVersion | None) -> list[str]:
    if floor is None:
        return []
    have = tcb.as_dict()
    return [
        f"{name}.{k} {have.get(k)} < minimum {v}" for k, v in floor.as_dict().items() if have.get(k, -1) < v
    ]


def validate(verified: VerifiedReport, policy: Policy) -> None:
    """Appraise `verified` against `policy`; raises PolicyViolation listing every violation."""
    r = verified.report
    gp = r.guest_policy
    out: list[str] = []
    if policy.unsafe_any_measurement:
        logging.getLogger(__name__).warning("SNP policy accepts any measurement (unsafe_any_measurement)")
    elif not any(_eq(r.measurement, m) for m in policy.allowed_measurements):
        out.append(f"measurement {r.measurement.hex()} is not allowed")
    out += _tcb_violations("reported_tcb", verified.reported_tcb, policy.min_tcb)
    out += _tcb_violations("launch_tcb", r.tcb("launch", verified.product), policy.min_launch_tcb)
    if gp.debug and not policy.allow_debug:
        out.append("guest policy allows DEBUG")
    if gp.migrate_ma and not policy.allow_migrate_ma:
        out.append("guest policy allows a migration agent (MIGRATE_MA)")
    if not policy.allow_smt and (gp.smt or r.platform.smt_enabled):
        out.append("SMT is allowed by the guest policy or enabled on the platform")
    if policy.require_single_socket and not gp.single_socket:
        out.append("guest policy does not require SINGLE_SOCKET")
    if r.vmpl not in policy.allowed_vmpls:
        out.append(f"VMPL {r.vmpl} not in {sorted(policy.allowed_vmpls)}")
    for name in ("report_data", "host_data", "family_id", "image_id"):
        want = getattr(policy, name)
        if want is not None and not _eq(getattr(r, name), want):
            out.append(f"{name} {getattr(r, name).hex()} != expected {want.hex()}")
    if policy.id_key_digests is not None and r.id_key_digest not in policy.id_key_digests:
        out.append(f"ID_KEY_DIGEST {r.id_key_digest.hex()} not allowed")
    if policy.require_author_key and not r.signer.author_key_en:
        out.append("AUTHOR_KEY_EN is not set")
    if policy.author_key_digests is not None and (
        not r.signer.author_key_en or r.author_key_digest not in policy.author_key_digests
    ):
        out.append(f"AUTHOR_KEY_DIGEST {r.author_key_digest.hex()} not allowed")
    if r.guest_svn < policy.min_guest_svn:
        out.append(f"GUEST_SVN {r.guest_svn} < minimum {policy.min_guest_svn}")
    if policy.min_abi is not None and (gp.abi_major, gp.abi_minor) < policy.min_abi:
        out.append(f"guest policy ABI {gp.abi_major}.{gp.abi_minor} < minimum {policy.min_abi}")
    fw = (r.committed_major, r.committed_minor, r.committed_build)
    if policy.min_firmware is not None and fw < policy.min_firmware:
        out.append(f"committed firmware {fw} < minimum {policy.min_firmware}")
    if policy.allowed_products is not None and verified.product not in policy.allowed_products:
        out.append(f"product {verified.product.value} not allowed")
    if verified.signer not in policy.allowed_signers:
        out.append(f"signer {verified.signer.value} not allowed")
    if policy.chip_ids is not None and r.chip_id not in policy.chip_ids:
        out.append(f"CHIP_ID {r.chip_id.hex()} not allowed")
    if policy.require_crl and not verified.chain.crl_checked:
        out.append("no CRL was checked")
    if out:
        raise PolicyViolation(out)


__all__ = ["Policy", "validate"]
