"""Confidential Containers init-data: the TOML a Kata pod is launched with, carrying the worker's
init-data document (attestation/initdata.py) and the Kata agent policy.

On Kata/CoCo the host does not set HOST_DATA / MRCONFIGID to the Sealed document's digest: it reads
the pod annotation `io.katacontainers.config.hypervisor.cc_init_data` (base64 of the gzip'd TOML),
hashes the TOML's bytes with the TOML's own `algorithm` and fits the digest to the TEE's field
(truncated, or padded with zeros): SNP HOST_DATA 32 bytes, TDX MRCONFIGID 48 bytes. The agent in
the guest recomputes the same digest over the bytes it was given, checks the hardware carries it,
and enforces `policy.rego` from the same TOML. So one digest names the TOML, and the TOML names
both the agent policy and the Sealed document (under WORKLOAD_KEY): a relying party that allows the
digest allows exactly that workload. This is Kata's implementation of the CoCo init-data
specification (trustee `kbs/docs/initdata.md`, version 0.1.0): the digest covers the document as
delivered, not a canonical form of it, so the rendering below is fixed byte for byte.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import hmac
import json
import tomllib
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from attestation.broker_initdata import BROKER_KEY, BrokerInitData
from attestation.errors import ParseError, UnsupportedError, WorkloadMismatch
from attestation.initdata import InitData

ANNOTATION = "io.katacontainers.config.hypervisor.cc_init_data"
VERSION = "0.1.0"
ALGORITHMS = {"sha256": hashlib.sha256, "sha384": hashlib.sha384, "sha512": hashlib.sha512}
FIELD_LENGTH = {"snp": 32, "tdx": 48}  # SNP HOST_DATA, TDX MRCONFIGID
POLICY_KEY = "policy.rego"  # the Kata agent policy: the agent enforces it
WORKLOAD_KEY = InitData.COCO_KEY  # the Sealed init-data document: the worker checks itself against it
# The two roles' documents: a TOML names one of them, never both (one digest, one role).
ROLE_KEYS = {WORKLOAD_KEY: "worker", BROKER_KEY: "key broker"}
_Doc = TypeVar("_Doc", InitData, BrokerInitData)
_MAX_ANNOTATION = 1 << 20  # a decompression bomb from the host is refused, not inflated


@dataclass(frozen=True)
class CocoInitData:
    """One CoCo init-data document: its exact text (what the digest covers) and its parsed data."""

    text: str
    algorithm: str
    data: Mapping[str, str]

    @classmethod
    def parse(cls, text: str) -> CocoInitData:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ParseError(f"CoCo init-data is not TOML: {exc}") from exc
        if doc.get("version") != VERSION:
            raise ParseError(f"CoCo init-data version must be {VERSION}, not {doc.get('version')!r}")
        if doc.get("algorithm") not in ALGORITHMS:
            raise ParseError(f"CoCo init-data algorithm must be one of {sorted(ALGORITHMS)}")
        data = doc.get("data", {})
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise ParseError("CoCo init-data [data] must map names to strings")
        return cls(text=text, algorithm=doc["algorithm"], data=dict(data))

    def digest_for(self, tee: str) -> bytes:
        """What the TEE reports for this document when Kata launches the pod with it."""
        if tee not in FIELD_LENGTH:
            raise UnsupportedError(f"TEE {tee!r} carries no init-data digest")
        digest = ALGORITHMS[self.algorithm](self.text.encode()).digest()
        size = FIELD_LENGTH[tee]
        return digest[:size].ljust(size, b"\0")

    def workload(self) -> InitData:
        """The worker's document inside, checked against the agent policy beside it: the document's
        `agent_policy_digest` must be the digest of exactly the policy the agent enforces."""
        return self._document(InitData)

    def broker(self) -> BrokerInitData:
        """The key broker's document inside, checked as `workload` is."""
        return self._document(BrokerInitData)

    def _document(self, kind: type[_Doc]) -> _Doc:
        key = kind.COCO_KEY
        if key not in self.data:
            raise WorkloadMismatch(f"the CoCo init-data carries no {key}: it names no Sealed "
                                   f"{ROLE_KEYS[key]}")
        if any(other in self.data for other in ROLE_KEYS if other != key):
            raise WorkloadMismatch("the CoCo init-data names both a worker and a key broker: one digest, one role")
        init = kind.decode(self.data[key].encode())
        policy = self.data.get(POLICY_KEY)
        named = init.agent_policy_digest
        actual = hashlib.sha256(policy.encode()).hexdigest() if policy is not None else ""
        if not hmac.compare_digest(named, actual):
            raise WorkloadMismatch("the CoCo init-data's policy.rego is not the agent policy its document names")
        return init

    def annotation(self) -> str:
        return annotation_value(self.text)


def _literal(value: str) -> str:
    # A multi-line literal string holds a Rego or JSON text as it is; it cannot hold ''' or a
    # carriage return, so such a value is refused rather than escaped differently.
    if "'''" in value or "\r" in value:
        raise ParseError("a CoCo init-data value may not contain ''' or a carriage return")
    return "'''\n" + value + "'''"  # TOML drops the newline after the opening delimiter


def render(workload: InitData | BrokerInitData, policy: str, algorithm: str = "sha384") -> CocoInitData:
    """The CoCo init-data of a Sealed worker's (or the key broker's) pod: the agent policy and the
    role's document, under its own key.

    Written here rather than by a TOML library: the digest covers these exact bytes, so their form
    must not change with a library's formatting choices. tomllib reads it back as a check."""
    if algorithm not in ALGORITHMS:
        raise UnsupportedError(f"algorithm must be one of {sorted(ALGORITHMS)}")
    if workload.agent_policy_digest != hashlib.sha256(policy.encode()).hexdigest():
        raise WorkloadMismatch("the workload document must name this agent policy's digest")
    document = workload.encode().decode()
    key = workload.COCO_KEY
    text = "\n".join([
        f"# Confidential Containers init-data of {workload.COCO_TITLE}: its digest is the guest's",
        "# SNP HOST_DATA / TDX MRCONFIGID. Generated from the pod spec; do not edit.",
        f'algorithm = "{algorithm}"',
        f'version = "{VERSION}"',
        "",
        "[data]",
        f'"{POLICY_KEY}" = {_literal(policy)}',
        # JSON text with ensure_ascii=False is a valid TOML basic string for the canonical document.
        f'"{key}" = {json.dumps(document, ensure_ascii=False)}',
        "",
    ])
    parsed = CocoInitData.parse(text)
    if parsed.data.get(key) != document or parsed.data.get(POLICY_KEY) != policy:
        raise ParseError("the CoCo init-data does not read back as written")
    return parsed


def annotation_value(toml_text: str) -> str:
    """The pod annotation's value: base64 of the gzip'd TOML (mtime 0: the same TOML, the same bytes)."""
    return base64.b64encode(gzip.compress(toml_text.encode(), mtime=0)).decode()


def from_annotation(value: str) -> CocoInitData:
    try:
        raw = base64.b64decode(value.strip(), validate=True)
        inflater = zlib.decompressobj(wbits=31)  # gzip
        text = inflater.decompress(raw, _MAX_ANNOTATION)
        if inflater.unconsumed_tail:
            raise ParseError("CoCo init-data annotation inflates past 1 MiB")
        return CocoInitData.parse(text.decode())
    except (binascii.Error, zlib.error, UnicodeDecodeError) as exc:
        raise ParseError(f"malformed CoCo init-data annotation: {exc}") from exc


@dataclass(frozen=True)
class LaunchInitData:
    """What a worker was launched with: the Sealed document, and the digest its hardware reports."""

    workload: InitData
    coco: CocoInitData | None  # None: a bare document whose own digest the host set (no Kata)

    def digest_for(self, tee: str) -> bytes:
        return self.coco.digest_for(tee) if self.coco is not None else self.workload.digest_for(tee)


@dataclass(frozen=True)
class BrokerLaunchInitData:
    """What the key broker was launched with: its document, and the digest its hardware reports."""

    broker: BrokerInitData
    coco: CocoInitData | None  # None: a bare document whose own digest the host set (no Kata)

    def digest_for(self, tee: str) -> bytes:
        return self.coco.digest_for(tee) if self.coco is not None else self.broker.digest_for(tee)


def _parse(raw: bytes) -> InitData | BrokerInitData | CocoInitData:
    stripped = raw.strip()
    if stripped.startswith(b"{"):
        try:
            return InitData.decode(raw)
        except ParseError as worker_error:
            if b'"role":"key-broker"' not in raw:
                raise worker_error from None
            return BrokerInitData.decode(raw)
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise ParseError(f"init-data is neither JSON, TOML nor an annotation: {exc}") from exc
    return from_annotation(text) if stripped.startswith(b"H4sI") else CocoInitData.parse(text)


def load_launch_init_data(raw: bytes) -> LaunchInitData:
    """A worker's --init-data: the bare Sealed document (JSON), a CoCo init-data TOML, or the pod
    annotation's value (base64 of the gzip'd TOML, as the downward API writes it)."""
    parsed = _parse(raw)
    if isinstance(parsed, BrokerInitData):
        raise WorkloadMismatch("this init-data names a key broker, not a worker")
    if isinstance(parsed, InitData):
        return LaunchInitData(parsed, None)
    return LaunchInitData(parsed.workload(), parsed)


def load_broker_launch_init_data(raw: bytes) -> BrokerLaunchInitData:
    """The key broker's --init-data, in the same three forms."""
    parsed = _parse(raw)
    if isinstance(parsed, InitData):
        raise WorkloadMismatch("this init-data names a worker, not a key broker")
    if isinstance(parsed, BrokerInitData):
        return BrokerLaunchInitData(parsed, None)
    return BrokerLaunchInitData(parsed.broker(), parsed)


def host_digest(raw: bytes, tee: str) -> bytes:
    """What a host launching a guest with these init-data bytes sets (Kata for a CoCo TOML), without
    judging their content: the fake hardware of the tests launches whatever it is given."""
    return _parse(raw).digest_for(tee)
