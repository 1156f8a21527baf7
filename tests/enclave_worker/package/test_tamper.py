"""The tamper-class table: each attack on a package raises its typed error and serves nothing.

Every case runs decrypt_package with an allocator that records the plaintext buffer, so the test
also proves that whatever was decrypted before the failure was wiped.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any as Pkg  # the fixture type lives in conftest.py

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.package import decrypt_package
from protocol.package import (
    PackageError,
    PackageFormatError,
    PackageIntegrityError,
    PackageSignatureError,
    WrongKeyError,
)
from protocol.package.format import TAG_BYTES
from protocol.package.signing import sign_manifest

Tamper = Callable[[Pkg, Callable[..., Pkg]], bytes | None]  # may return another data key to use


def _seg(p: Pkg) -> int:
    return p.manifest.segment_size + TAG_BYTES


def _payload(p: Pkg) -> Path:
    return p.path / "payload.bin"


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def reorder(p: Pkg, _: Callable[..., Pkg]) -> None:
    data, s = _payload(p).read_bytes(), _seg(p)
    _payload(p).write_bytes(data[s : 2 * s] + data[:s] + data[2 * s :])


def truncate_segment(p: Pkg, _: Callable[..., Pkg]) -> None:
    data = _payload(p).read_bytes()
    _payload(p).write_bytes(data[: (p.manifest.num_segments - 1) * _seg(p)])


def truncate_bytes(p: Pkg, _: Callable[..., Pkg]) -> None:
    data = _payload(p).read_bytes()
    _payload(p).write_bytes(data[:-7])


def extend(p: Pkg, _: Callable[..., Pkg]) -> None:
    data = _payload(p).read_bytes()
    _payload(p).write_bytes(data + data[-_seg(p) :])


def splice_other_package(p: Pkg, make: Callable[..., Pkg]) -> None:
    # Worst case: the other package shares the data key, the signer and the version.
    other = make(p.path.parent / "other", data_key=p.data_key, signing_key=p.signing_key, seed=1)
    mine, theirs, s = bytearray(_payload(p).read_bytes()), _payload(other).read_bytes(), _seg(p)
    mine[s : 2 * s] = theirs[s : 2 * s]
    _payload(p).write_bytes(bytes(mine))


def splice_other_version(p: Pkg, make: Callable[..., Pkg]) -> None:
    other = make(p.path.parent / "v2", version="v2", data_key=p.data_key, signing_key=p.signing_key)
    mine, theirs = bytearray(_payload(p).read_bytes()), _payload(other).read_bytes()
    mine[: _seg(p)] = theirs[: _seg(p)]  # same plaintext, same key: only the binding differs
    _payload(p).write_bytes(bytes(mine))


def swap_in_other_version_payload(p: Pkg, make: Callable[..., Pkg]) -> None:
    other = make(p.path.parent / "v2", version="v2", data_key=p.data_key, signing_key=p.signing_key)
    shutil.copy(_payload(other), _payload(p))


def flip_payload_first(p: Pkg, _: Callable[..., Pkg]) -> None:
    _flip(_payload(p), 0)


def flip_payload_middle(p: Pkg, _: Callable[..., Pkg]) -> None:
    _flip(_payload(p), _payload(p).stat().st_size // 2)


def flip_payload_tag(p: Pkg, _: Callable[..., Pkg]) -> None:
    _flip(_payload(p), _seg(p) - 1)


def flip_payload_last(p: Pkg, _: Callable[..., Pkg]) -> None:
    _flip(_payload(p), -1)


def flip_manifest_value(p: Pkg, _: Callable[..., Pkg]) -> None:
    raw = (p.path / "manifest.json").read_bytes()
    _flip(p.path / "manifest.json", raw.index(b'"model":"m"') + 9)  # "m" -> "l": still valid JSON


def flip_manifest_syntax(p: Pkg, _: Callable[..., Pkg]) -> None:
    _flip(p.path / "manifest.json", 0)


def flip_signature(p: Pkg, _: Callable[..., Pkg]) -> None:
    raw = (p.path / "manifest.sig").read_bytes()
    _flip(p.path / "manifest.sig", raw.index(b'"signature": "') + 20)


def resign_by_attacker(p: Pkg, _: Callable[..., Pkg]) -> None:
    # A manifest re-signed by someone else fails the manifest's own signer claim.
    sign_manifest(p.path, (p.path / "manifest.json").read_bytes(), Ed25519PrivateKey.generate())


def wrong_key(p: Pkg, _: Callable[..., Pkg]) -> bytes:
    return secrets.token_bytes(32)


def other_packages_key(p: Pkg, make: Callable[..., Pkg]) -> bytes:
    return make(p.path.parent / "other", seed=1).data_key


CASES: list[tuple[str, Tamper, type[PackageError]]] = [
    ("reorder", reorder, PackageIntegrityError),
    ("truncate-segment", truncate_segment, PackageIntegrityError),
    ("truncate-bytes", truncate_bytes, PackageIntegrityError),
    ("extend", extend, PackageIntegrityError),
    ("splice-other-package", splice_other_package, PackageIntegrityError),
    ("splice-other-version", splice_other_version, PackageIntegrityError),
    ("payload-of-other-version", swap_in_other_version_payload, PackageIntegrityError),
    ("flip-payload-first", flip_payload_first, PackageIntegrityError),
    ("flip-payload-middle", flip_payload_middle, PackageIntegrityError),
    ("flip-payload-tag", flip_payload_tag, PackageIntegrityError),
    ("flip-payload-last", flip_payload_last, PackageIntegrityError),
    ("flip-manifest-value", flip_manifest_value, PackageSignatureError),
    ("flip-manifest-syntax", flip_manifest_syntax, PackageFormatError),
    ("flip-signature", flip_signature, PackageSignatureError),
    ("resigned-by-attacker", resign_by_attacker, PackageSignatureError),
    ("wrong-key", wrong_key, WrongKeyError),
    ("other-packages-key", other_packages_key, WrongKeyError),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("tamper", "error"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_tamper_class_is_refused(pkg: Pkg, make_pkg: Callable[..., Pkg], tamper: Tamper,
                                 error: type[PackageError], stream: bool) -> None:
    """The same refusal, with the same error, whether the package is decrypted whole or streamed into
    the build (stream.py: its first pass authenticates everything before any tensor is made)."""
    key = tamper(pkg, make_pkg) or pkg.data_key
    buffers: list[torch.Tensor] = []

    def allocate(n: int) -> torch.Tensor:
        buffers.append(torch.empty(n, dtype=torch.uint8))
        return buffers[-1]

    with pytest.raises(error):
        decrypt_package(pkg.path, key, allocate=allocate, stream=stream)
    for buf in buffers:  # whatever was decrypted before the failure is gone
        assert not buf.any()


def test_every_segment_is_checked(pkg: Pkg) -> None:
    """A flipped byte in each segment in turn, including the final one, is caught."""
    original = (pkg.path / "payload.bin").read_bytes()
    for i in range(pkg.manifest.num_segments):
        (pkg.path / "payload.bin").write_bytes(original)
        _flip(pkg.path / "payload.bin", i * _seg(pkg) + 5)
        with pytest.raises(PackageIntegrityError, match=f"segment {i} "):
            decrypt_package(pkg.path, pkg.data_key)


def test_failure_at_the_last_segment_wipes_what_was_decrypted(pkg: Pkg) -> None:
    _flip(pkg.path / "payload.bin", -1)
    seen: list[torch.Tensor] = []

    def allocate(n: int) -> torch.Tensor:
        seen.append(torch.full((n,), 0xA5, dtype=torch.uint8))
        return seen[0]

    with pytest.raises(PackageIntegrityError, match="failed authentication"):
        decrypt_package(pkg.path, pkg.data_key, allocate=allocate)
    assert len(seen) == 1 and not seen[0].any()


def test_required_signer_is_enforced(pkg: Pkg) -> None:
    with pytest.raises(PackageSignatureError, match="required signer"):
        decrypt_package(pkg.path, pkg.data_key, required_signer="ed25519:" + "0" * 32)
