"""The workload identity: one init-data document whose digest the hardware carries at launch.

What a confidential VM's launch digest (SNP MEASUREMENT, TDX MRTD) covers is the firmware (and, for
SNP with measured direct boot, kernel, initrd and kernel command line): the same for every workload
started in it. What the workload is (the pinned worker image, its exact command line, its measured
environment, its measured configuration, the oldest tenant policy version it accepts, and the Kata
agent policy that keeps the host from running anything else in the pod) is this document. The host
supplies it at launch and the hardware signs its digest in every report:

* SEV-SNP: HOST_DATA (32 bytes) = SHA-256(encode())
* TDX: MRCONFIGID (48 bytes) = SHA-384(encode())

so a relying party that allows one digest allows exactly one workload; the worker checks at start
that what it runs is what this document says (enclave_worker/workload_check.py), and that its own
hardware reports this digest, and refuses to start otherwise. Canonical form: JSON, sorted keys, no
spaces, UTF-8; decoding refuses any other form.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attestation.errors import ParseError, UnsupportedError, WorkloadMismatch
from attestation.snp.abi import parse_report
from attestation.tdx.abi import parse_quote

INIT_DATA_VERSION = 1
_FIELDS = {"v", "image", "argv", "env", "measured_config", "min_policy_version", "agent_policy_digest"}
_IMAGE = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# Which hardware field carries the digest, and how long it is.
FIELD_BY_TEE = {"snp": ("host_data", 32), "tdx": ("mr_config_id", 48)}


def check_launch_fields(doc: Any, label: str) -> None:
    """The checks and normal form every role's init-data shares (this worker's and the broker's,
    attestation/broker_initdata.py): a digest-pinned image, string arguments and environment, an
    agent policy digest in hex; `doc` is a frozen dataclass still in its __post_init__."""
    if not _IMAGE.match(doc.image):
        raise ParseError(f"{label} image must be pinned by digest (name@sha256:<64 hex>): {doc.image!r}")
    if not all(isinstance(a, str) for a in doc.argv):
        raise ParseError(f"{label} argv must be strings")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in doc.env.items()):
        raise ParseError(f"{label} env must map strings to strings")
    if doc.agent_policy_digest and not _SHA256_HEX.match(doc.agent_policy_digest):
        raise ParseError(f"{label} agent_policy_digest must be SHA-256 hex")
    object.__setattr__(doc, "argv", tuple(doc.argv))
    object.__setattr__(doc, "env", dict(doc.env))
    object.__setattr__(doc, "measured_config", json.loads(json.dumps(dict(doc.measured_config))))


def canonical(document: Mapping[str, Any]) -> bytes:
    """The canonical bytes the hardware's digest covers: JSON, sorted keys, no spaces, UTF-8."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_for(encoded: bytes, tee: str, no_digest: str = "") -> bytes:
    """The value the `tee`'s hardware reports for a bare document: SNP HOST_DATA = SHA-256, TDX
    MRCONFIGID = SHA-384."""
    if tee == "snp":
        return hashlib.sha256(encoded).digest()
    if tee == "tdx":
        return hashlib.sha384(encoded).digest()
    raise UnsupportedError(f"TEE {tee!r} carries no init-data digest{no_digest}")


@dataclass(frozen=True)
class InitData:
    COCO_KEY: ClassVar[str] = "sealed-worker.json"  # its entry in the pod's CoCo init-data TOML
    COCO_TITLE: ClassVar[str] = "a Sealed worker"

    image: str  # the pinned worker image, "<repository>@sha256:<digest>"
    argv: tuple[str, ...]  # the worker's arguments after the program name, interface paths excluded
    env: Mapping[str, str] = field(default_factory=dict)  # the measured environment (workload_check.py)
    measured_config: Mapping[str, Any] = field(default_factory=dict)  # WorkerSettings.measured_config()
    min_policy_version: int = 0  # the oldest tenant-signed policy set the worker accepts (0: none needed)
    agent_policy_digest: str = ""  # SHA-256 hex of the Kata agent policy document ("" outside Kata)

    def __post_init__(self) -> None:
        check_launch_fields(self, "init-data")
        if type(self.min_policy_version) is not int or self.min_policy_version < 0:
            raise ParseError("init-data min_policy_version must be a non-negative int")

    def to_dict(self) -> dict[str, Any]:
        return {"v": INIT_DATA_VERSION, "image": self.image, "argv": list(self.argv), "env": dict(self.env),
                "measured_config": dict(self.measured_config), "min_policy_version": self.min_policy_version,
                "agent_policy_digest": self.agent_policy_digest}

    def encode(self) -> bytes:
        """The canonical bytes the hardware's digest covers."""
        return canonical(self.to_dict())

    def host_data(self) -> bytes:
        """SEV-SNP HOST_DATA (32 bytes), set by the host at SNP_LAUNCH_FINISH."""
        return digest_for(self.encode(), "snp")

    def mr_config_id(self) -> bytes:
        """TDX MRCONFIGID (48 bytes), set by the host at TD creation (TDH.MNG.INIT)."""
        return digest_for(self.encode(), "tdx")

    def digest_for(self, tee: str) -> bytes:
        """The value the `tee`'s hardware reports for this document."""
        return digest_for(self.encode(), tee)

    @classmethod
    def decode(cls, raw: bytes) -> InitData:
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or set(doc) != _FIELDS or doc["v"] != INIT_DATA_VERSION:
                raise ParseError("init-data has unexpected fields or version")
            if not isinstance(doc["argv"], list) or not isinstance(doc["env"], dict) \
                    or not isinstance(doc["measured_config"], dict):
                raise ParseError("init-data argv must be a list, env and measured_config objects")
            init = cls(image=doc["image"], argv=tuple(doc["argv"]), env=doc["env"],
                       measured_config=doc["measured_config"], min_policy_version=doc["min_policy_version"],
                       agent_policy_digest=doc["agent_policy_digest"])
        except (UnicodeDecodeError, ValueError, TypeError, AttributeError) as exc:
            raise ParseError(f"malformed init-data: {exc}") from exc
        if init.encode() != raw:
            raise ParseError("init-data is not in canonical form")
        return init


def workload_id_of(tee: str, extra: Mapping[str, str]) -> str:
    """The init-data digest a verified report carries (hex, from CpuClaims.extra); "" where none."""
    name = FIELD_BY_TEE.get(tee)
    return extra.get(name[0], "") if name else ""


def reported_digest(tee: str, report: bytes) -> bytes:
    """The init-data digest a report of this guest's hardware carries."""
    if tee == "snp":
        return parse_report(report).host_data
    if tee == "tdx":
        return parse_quote(report).body.mr_config_id
    raise UnsupportedError(f"TEE {tee!r} carries no init-data digest")


def check_report_carries(expected: bytes, tee: str, report: bytes) -> None:
    """Raise WorkloadMismatch unless the report carries `expected` (InitData.digest_for(tee))."""
    if not hmac.compare_digest(reported_digest(tee, report), expected):
        raise WorkloadMismatch(f"the {tee.upper()} report does not carry this worker's init-data digest: "
                               "the host launched this guest with other init-data")
