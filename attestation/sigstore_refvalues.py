"""Reference values published as a Sigstore bundle, verified offline against a pinned identity.

The operator signs the reference-value statement keylessly (`sigstore attest` / `sign_dsse`): the
bundle carries the DSSE envelope, a short-lived Fulcio certificate naming the publisher's OIDC
identity, the Rekor entry (inclusion proof, signed checkpoint) and RFC 3161 timestamps. A client
pins *who* publishes (certificate SAN + OIDC issuer) and *which* Sigstore instance it trusts (a
trusted root file, pinned: no TUF fetch, nothing on the network), never a raw hash:

    verify_sigstore_reference_values(bundle_json, SigstorePublisher(identity, issuer, trusted_root), now)

sigstore-python does the cryptography (chain to the pinned Fulcio roots at the signed time, SCT,
Rekor inclusion proof and checkpoint, TSA timestamps, DSSE signature, log-entry consistency) under
an explicit `Identity` policy; only a payload that verified reaches `refvalues.read_statement`, the
reader the pinned-key path uses too. sigstore is imported only when a client pins a Sigstore
publisher.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attestation.refvalues import ReferenceValues, ReferenceValuesError, read_statement

BUNDLE_MEDIA_TYPE_PREFIX = "application/vnd.dev.sigstore.bundle"
# The public-good Sigstore instance's trusted root, pinned in the package (copied from sigstore-python
# 27db13db, sigstore/_store/…tuf-repo-cdn.sigstore.dev/trusted_root.json, Apache-2.0). It is a
# snapshot: a bundle from a log or CA added later needs a newer root, given as a path.
PRODUCTION_TRUSTED_ROOT = Path(__file__).parent / "roots" / "sigstore_production_trusted_root.json"


class SigstoreBundleError(ReferenceValuesError):
    """The Sigstore bundle is malformed, or does not verify against the pinned root and identity."""


def is_sigstore_bundle(doc: Any) -> bool:
    return isinstance(doc, Mapping) and str(doc.get("mediaType", "")).startswith(BUNDLE_MEDIA_TYPE_PREFIX)


@dataclass(frozen=True)
class SigstorePublisher:
    """Who may publish reference values: the certificate's SAN (an email, or a CI workflow URI) issued
    for a token from `issuer`, under the Sigstore instance described by `trusted_root`."""

    identity: str
    issuer: str
    trusted_root: Path = PRODUCTION_TRUSTED_ROOT

    def __post_init__(self) -> None:
        if not self.identity or not self.issuer:
            raise ValueError("a Sigstore publisher needs both an identity and an OIDC issuer")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], base: Path | None = None) -> SigstorePublisher:
        """`{"identity": "...", "issuer": "...", "trusted_root": "production" | "path/to/trusted_root.json"}`."""
        unknown = set(doc) - {"identity", "issuer", "trusted_root"}
        if unknown:
            raise ValueError(f"unknown sigstore publisher keys: {sorted(unknown)}")
        root = str(doc.get("trusted_root", "production"))
        path = PRODUCTION_TRUSTED_ROOT if root == "production" else Path(root)
        if not path.is_absolute() and base is not None:
            path = base / path
        return cls(identity=str(doc.get("identity", "")), issuer=str(doc.get("issuer", "")), trusted_root=path)

    def describe(self) -> str:
        return f"sigstore {self.identity} (issuer {self.issuer})"


def verify_sigstore_bundle(bundle_doc: Mapping[str, Any] | str | bytes, publisher: SigstorePublisher
                           ) -> tuple[str, bytes]:
    """The bundle's DSSE payload (type, bytes), only if the bundle verifies offline against the
    pinned trusted root and was signed by the pinned identity. Raises `SigstoreBundleError`."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle, InvalidBundle, TrustedRoot
    from sigstore.verify import Verifier
    from sigstore.verify.policy import Identity

    raw = bundle_doc if isinstance(bundle_doc, str | bytes) else json.dumps(bundle_doc)
    try:
        bundle = Bundle.from_json(raw)
    except (InvalidBundle, ValueError, TypeError, KeyError) as exc:
        raise SigstoreBundleError(f"not a Sigstore bundle: {exc}") from exc
    try:
        trusted_root = TrustedRoot.from_file(str(publisher.trusted_root))
    except (OSError, ValueError, SigstoreError) as exc:
        raise SigstoreBundleError(f"cannot load the pinned Sigstore trusted root {publisher.trusted_root}") from exc
    verifier = Verifier(trusted_root=trusted_root)  # built from the pinned file: no TUF, no network
    try:
        return verifier.verify_dsse(bundle, Identity(identity=publisher.identity, issuer=publisher.issuer))
    except (SigstoreError, ValueError) as exc:
        raise SigstoreBundleError(f"Sigstore bundle does not verify for {publisher.describe()}: {exc}") from exc


def verify_sigstore_reference_values(bundle_doc: Mapping[str, Any] | str | bytes, publisher: SigstorePublisher,
                                     now: dt.datetime, min_serial: int = 0) -> ReferenceValues:
    """The bundle verified offline, then its statement read as the pinned-key path reads it (serial
    at least `min_serial`: an older statement is `StaleReferenceValues`)."""
    payload_type, body = verify_sigstore_bundle(bundle_doc, publisher)
    return read_statement(payload_type, body, now, signer=publisher.describe(), min_serial=min_serial)
