"""Self-signed TLS identities for the gateway <-> worker gRPC channel (mutual TLS).

Each side makes a P-256 key at start-up and never writes the private key to disk. The worker
announces its certificate in its heartbeat (authenticated by the registration token) and the
gateway pins exactly that certificate; the worker accepts only the gateway certificate it was given
(`--gateway-client-cert`). The SPKI hash is what an attestation would bind (see docs/gateway.md).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from protocol.fsutil import atomic_write

TARGET_NAME = "sealed-worker"  # the name both sides put in and check against the certificate


@dataclass(frozen=True)
class TlsIdentity:
    key_pem: bytes
    cert_pem: bytes

    @property
    def spki_sha256(self) -> str:
        cert = x509.load_pem_x509_certificate(self.cert_pem)
        spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
        return hashlib.sha256(spki).hexdigest()


def make_identity(common_name: str = TARGET_NAME, days: int = 30) -> TlsIdentity:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(TARGET_NAME),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return TlsIdentity(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()),
                       cert.public_bytes(serialization.Encoding.PEM))


def load_or_create(key_path: Path, cert_path: Path) -> TlsIdentity:
    """The gateway's client identity, kept across restarts so that running workers still accept it."""
    if key_path.exists() and cert_path.exists():
        return TlsIdentity(key_path.read_bytes(), cert_path.read_bytes())
    identity = make_identity("sealed-gateway")
    atomic_write(key_path, identity.key_pem)
    atomic_write(cert_path, identity.cert_pem, mode=0o644)
    return identity
