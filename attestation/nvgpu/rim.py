"""NVIDIA Reference Integrity Manifests: SWID tags (ISO/IEC 19770-2) signed with XML-DSig.

Layout follows the TCG PC Client RIM / RIM Information Model as NVIDIA publishes it (nvtrust
local_gpu_verifier samples): `SoftwareIdentity/Meta@colloquialVersion` is the VBIOS or driver
version, and each `Payload/Resource[@type='Measurement']` gives an `index` (0-based, the report's
measurement block index minus one), `active`, `alternatives` and `Hash0..HashN` golden values.
The XML signature is checked with signxml (a maintained XML-DSig implementation) against the
signer certificate we validated ourselves, so certificate time checks use the injected `now`.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from lxml import etree
from signxml import DigestAlgorithm, SignatureMethod, XMLVerifier
from signxml.exceptions import SignXMLException
from signxml.verifier import SignatureConfiguration

from attestation.errors import ChainError, ParseError, SignatureError
from attestation.ocsp import OcspChecker, OcspStatus, check_chain_ocsp
from attestation.x509chain import load_der_or_pem, verify_chain

SWID_NS = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
HASH_NS = "http://www.w3.org/2001/04/xmlenc#sha384"
DSIG_NS = "http://www.w3.org/2000/09/xmldsig#"
MAX_RIM_BYTES = 1 << 20  # NVIDIA RIMs are ~20 KiB; the cap bounds parsing time on hostile input
MAX_INDEX = 255
_ALLOWED = SignatureConfiguration(
    # NVIDIA signs with ECDSA P-384 / SHA-384; weaker or HMAC methods are refused outright.
    signature_methods=frozenset({SignatureMethod.ECDSA_SHA384, SignatureMethod.ECDSA_SHA512}),
    digest_algorithms=frozenset({DigestAlgorithm.SHA384, DigestAlgorithm.SHA512}),
)


@dataclass(frozen=True)
class RimMeasurement:
    index: int
    active: bool
    name: str
    alternatives: tuple[bytes, ...]


@dataclass(frozen=True)
class Rim:
    tag_id: str
    name: str
    version: str  # Meta@colloquialVersion: "96.00.74.00.1A" (VBIOS) or "550.90.07" (driver)
    product: str
    measurements: tuple[RimMeasurement, ...]
    signer: str = ""  # subject of the signing certificate, once verified
    ocsp_status: OcspStatus = OcspStatus.UNKNOWN

    def active(self) -> dict[int, RimMeasurement]:
        return {m.index: m for m in self.measurements if m.active}


@dataclass(frozen=True)
class RimComparison:
    kind: str  # "vbios" or "driver": nvtrust appraises a GPU against one RIM of each
    rim_version: str
    checked: tuple[int, ...]  # RIM (0-based) indices compared
    mismatched: tuple[int, ...]  # RIM indices whose report value is none of the alternatives


def _parser() -> etree.XMLParser:
    # No DTDs, entities or network: a RIM is untrusted input until its signature verifies.
    return etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False, remove_comments=False
    )


def _parse_xml(data: bytes) -> etree._Element:
    if not isinstance(data, bytes) or len(data) > MAX_RIM_BYTES:
        raise ParseError("RIM must be at most 1 MiB of bytes")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise ParseError("RIM must not contain a DTD")
    try:
        root = etree.fromstring(data, parser=_parser())
    except (etree.XMLSyntaxError, ValueError) as exc:
        raise ParseError(f"RIM is not well-formed XML: {exc}") from exc
    if root is None:
        raise ParseError("RIM has no root element")
    return root


def _attr(el: etree._Element, name: str) -> str:
    value = el.get(name)
    if value is None:
        raise ParseError(f"RIM {etree.QName(el).localname} lacks attribute {name}")
    return str(value)


def _int(text: str, what: str, hi: int) -> int:
    if not text.isdigit() or len(text) > 4 or not 0 <= int(text) <= hi:
        raise ParseError(f"RIM {what} {text!r} is not an integer in 0..{hi}")
    return int(text)


def _measurement(el: etree._Element) -> RimMeasurement:
    index = _int(_attr(el, "index"), "index", MAX_INDEX)
    active = _attr(el, "active")
    if active not in ("True", "False"):
        raise ParseError(f"RIM measurement {index}: active={active!r}")
    count = _int(_attr(el, "alternatives"), "alternatives", 16)
    if count < 1 or _attr(el, "size") != "48":
        raise ParseError(f"RIM measurement {index}: needs >=1 alternative of 48 bytes")
    hashes: list[bytes] = []
    for i in range(count):
        text = el.get(f"{{{HASH_NS}}}Hash{i}")
        if text is None or len(text) != 96:
            raise ParseError(f"RIM measurement {index}: Hash{i} missing or not 48 bytes of hex")
        try:
            hashes.append(binascii.unhexlify(text))
        except (binascii.Error, ValueError) as exc:
            raise ParseError(f"RIM measurement {index}: Hash{i} is not hex") from exc
    return RimMeasurement(index, active == "True", el.get("name", ""), tuple(hashes))


def _from_root(root: etree._Element) -> Rim:
    if root.tag != f"{{{SWID_NS}}}SoftwareIdentity":
        raise ParseError(f"RIM root element is {root.tag!r}, not a SWID SoftwareIdentity")
    metas = root.findall(f"{{{SWID_NS}}}Meta")
    payloads = root.findall(f"{{{SWID_NS}}}Payload")
    if len(metas) != 1 or len(payloads) != 1:
        raise ParseError("RIM must have exactly one Meta and one Payload")
    version = metas[0].get("colloquialVersion")
    if not version:
        raise ParseError("RIM Meta lacks colloquialVersion")
    items = [_measurement(el) for el in payloads[0] if el.tag == f"{{{SWID_NS}}}Resource"]
    if not items or len({m.index for m in items}) != len(items):
        raise ParseError("RIM has no measurements, or repeats an index")
    return Rim(
        tag_id=_attr(root, "tagId"), name=root.get("name", ""), version=version,
        product=metas[0].get("product", ""), measurements=tuple(items),
    )


def parse_rim(data: bytes) -> Rim:
    """Structure only, no signature check (inspection, fuzzing). Use verify_rim for trust."""
    return _from_root(_parse_xml(data))


def _key_info_chain(root: etree._Element) -> list[x509.Certificate]:
    sigs = root.findall(f"{{{DSIG_NS}}}Signature")
    if len(sigs) != 1:
        raise SignatureError(f"RIM must carry exactly one enveloped XML signature, found {len(sigs)}")
    texts = sigs[0].findall(f".//{{{DSIG_NS}}}X509Certificate")
    if not texts:
        raise ChainError("RIM signature has no X509Certificate")
    certs = []
    for el in texts:
        try:
            der = base64.b64decode("".join((el.text or "").split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ParseError("RIM X509Certificate is not base64") from exc
        certs.append(load_der_or_pem(der))
    return certs


def verify_rim(
    data: bytes,
    roots: Sequence[x509.Certificate],
    now: dt.datetime,
    ocsp: OcspChecker,
) -> Rim:
    """Verify a RIM: signer chain to `roots` at `now`, OCSP, XML-DSig; return what was signed."""
    root = _parse_xml(data)
    _from_root(root)  # fail on structure before spending time on signatures
    # Step 1 (NVIDIA RIM verification): chain in KeyInfo, signer first, up to the RIM root.
    chain = _key_info_chain(root)
    try:
        verify_chain(chain, roots, now)
    except ChainError as exc:
        raise ChainError(f"RIM signing chain: {exc}") from exc
    status = check_chain_ocsp(chain, ocsp, now)  # RevokedError propagates
    # Step 2: XML-DSig (enveloped, c14n 1.1) with the validated signer key, at `now`.
    signer_pem = chain[0].public_bytes(serialization.Encoding.PEM)
    config = SignatureConfiguration(
        signature_methods=_ALLOWED.signature_methods,
        digest_algorithms=_ALLOWED.digest_algorithms,
        verification_time=now,
    )
    try:
        result = XMLVerifier().verify(root, x509_cert=signer_pem.decode(), expect_config=config)
    except SignXMLException as exc:
        raise SignatureError(f"RIM XML signature does not verify: {exc}") from exc
    except (ValueError, TypeError, etree.LxmlError) as exc:
        raise SignatureError(f"RIM XML signature could not be checked: {exc}") from exc
    # Step 3: read reference values only from the element the signature covers.
    if isinstance(result, list):  # only with several expected references, which we never ask for
        raise SignatureError("RIM carries more than one signed reference")
    signed = result.signed_xml
    if signed is None or signed.tag != root.tag:
        raise SignatureError("RIM signature does not cover the whole SoftwareIdentity")
    rim = _from_root(signed)
    return Rim(
        tag_id=rim.tag_id, name=rim.name, version=rim.version, product=rim.product,
        measurements=rim.measurements, signer=chain[0].subject.rfc4514_string(), ocsp_status=status,
    )


def compare_rim(rim: Rim, measurements: Mapping[int, bytes], kind: str = "vbios") -> RimComparison:
    """Every active RIM index i must equal one alternative at report block i + 1 (nvtrust rule)."""
    checked: list[int] = []
    mismatched: list[int] = []
    for index, ref in sorted(rim.active().items()):
        checked.append(index)
        value = measurements.get(index + 1)
        if value is None or value not in ref.alternatives:
            mismatched.append(index)
    return RimComparison(kind, rim.version, tuple(checked), tuple(mismatched))

