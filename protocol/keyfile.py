"""A private key in a 0600 PEM file, loaded, or created once if absent (every role's keys on disk:
the broker's token and receipt signing keys, the gateway's audit signing key, the demo's keys, the
one-machine broker import key).

Created with O_EXCL in a 0700 directory: a file that appeared meanwhile is never overwritten, and
the key is never readable by others, not even for a moment.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

Key = TypeVar("Key", Ed25519PrivateKey, X25519PrivateKey, EllipticCurvePrivateKey)


class WrongKeyType(ValueError):
    """The file holds a key of another type."""


def load_or_create_private_key(path: Path, kind: type[object], generate: Callable[[], Key]) -> Key:
    """The private key at `path`, which must be a `kind`; a new one (`generate()`), written 0600, if there is
    no file."""
    path = Path(path)
    if path.exists():
        key = serialization.load_pem_private_key(path.read_bytes(), None)
        if not isinstance(key, kind):
            raise WrongKeyType(f"{path} is not an {kind.__name__.removesuffix('PrivateKey')} private key")
        return cast(Key, key)  # `kind` is an abstract class (mypy takes no type[Key] of one): checked above
    new = generate()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(new.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
        fh.flush()
        os.fsync(fh.fileno())
    return new
