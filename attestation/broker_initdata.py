"""The key broker's workload identity: its own init-data document, whose digest its hardware carries.

The worker's document (attestation/initdata.py) names a worker; this one names the key broker: the
pinned broker image, its exact arguments (the kernel-interface paths and `--init-data` excepted:
key_broker/workload_check.py), its measured environment (the operator's credentials excepted: their
values are secrets), its measured configuration (key_broker/measurement.py: issuer, TEE, key store,
which simulated platform it accepts workers from) and the digest of the Kata agent policy of its pod.
Its `role` is "key-broker", and its field set differs from a worker's, so neither document decodes
as the other, and a worker's init-data digest can never be a broker's. The host sets the digest at
launch (SNP HOST_DATA = SHA-256, TDX MRCONFIGID = SHA-384 of `encode()`; on Kata the digest of the
CoCo TOML carrying it under BROKER_KEY, attestation/coco_initdata.py). Workers and clients pin it
(`--broker-workload-id`, a BrokerPin's `workload_ids`; attestation/broker_identity.py). Canonical
form: JSON, sorted keys, no spaces, UTF-8; decoding refuses any other form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attestation.errors import ParseError
from attestation.initdata import canonical, check_launch_fields, digest_for

BROKER_INIT_DATA_VERSION = 1
ROLE = "key-broker"
BROKER_KEY = "sealed-broker.json"  # its entry in the pod's CoCo init-data TOML
_FIELDS = {"v", "role", "image", "argv", "env", "measured_config", "agent_policy_digest"}


@dataclass(frozen=True)
class BrokerInitData:
    COCO_KEY: ClassVar[str] = BROKER_KEY
    COCO_TITLE: ClassVar[str] = "the Sealed key broker"

    image: str  # the pinned broker image, "<repository>@sha256:<digest>"
    argv: tuple[str, ...]  # the broker's arguments after the program name, interface paths excluded
    env: Mapping[str, str] = field(default_factory=dict)  # its measured environment
    measured_config: Mapping[str, Any] = field(default_factory=dict)  # key_broker.measurement.measured_config
    agent_policy_digest: str = ""  # SHA-256 hex of the pod's Kata agent policy ("" outside Kata)

    def __post_init__(self) -> None:
        check_launch_fields(self, "broker init-data")

    def to_dict(self) -> dict[str, Any]:
        return {"v": BROKER_INIT_DATA_VERSION, "role": ROLE, "image": self.image, "argv": list(self.argv),
                "env": dict(self.env), "measured_config": dict(self.measured_config),
                "agent_policy_digest": self.agent_policy_digest}

    def encode(self) -> bytes:
        """The canonical bytes the hardware's digest covers."""
        return canonical(self.to_dict())

    def digest_for(self, tee: str) -> bytes:
        """The value the `tee`'s hardware reports for this bare document (no Kata)."""
        return digest_for(self.encode(), tee, ": the simulated TEE has no workload id")

    @classmethod
    def decode(cls, raw: bytes) -> BrokerInitData:
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or set(doc) != _FIELDS or doc["v"] != BROKER_INIT_DATA_VERSION \
                    or doc["role"] != ROLE:
                raise ParseError("not a key broker's init-data (fields, version or role)")
            if not isinstance(doc["argv"], list) or not isinstance(doc["env"], dict) \
                    or not isinstance(doc["measured_config"], dict):
                raise ParseError("broker init-data argv must be a list, env and measured_config objects")
            init = cls(image=doc["image"], argv=tuple(doc["argv"]), env=doc["env"],
                       measured_config=doc["measured_config"], agent_policy_digest=doc["agent_policy_digest"])
        except (UnicodeDecodeError, ValueError, TypeError, AttributeError) as exc:
            raise ParseError(f"malformed broker init-data: {exc}") from exc
        if init.encode() != raw:
            raise ParseError("broker init-data is not in canonical form")
        return init
