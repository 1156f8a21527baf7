"""Hypothesis over the package format's parsers (the manifest and the sealed data key a tenant
uploads): mutated valid documents raise only PackageError, never a crash."""

from __future__ import annotations

import contextlib

from hypothesis import given

from protocol.package.errors import PackageError
from protocol.package.format import Manifest, TensorEntry
from protocol.package.keywrap import SealedDataKey
from tests.fuzzing import DEEP_JSON, budget, mutated

MANIFEST = Manifest(
    package_id="11" * 16, tenant="acme", model="m", version="v1", key_id="k1", segment_size=1 << 20,
    num_segments=1, plaintext_bytes=4096 + 64, plaintext_digest="sha256:" + "00" * 32, metadata_bytes=64,
    key_check="ab" * 16, signer="ed25519:" + "cd" * 16,
    tensors=(TensorEntry("w", "float32", (4, 256), 64, 4096),),
).to_bytes()
SEALED_KEY = SealedDataKey("acme", "m", "v1", "k1", "11" * 16, "x25519:" + "ef" * 16, "AAAA").to_json().encode()


def test_the_seed_manifest_is_valid() -> None:
    assert Manifest.from_bytes(MANIFEST).tensors[0].nbytes == 4096


@budget(600)
@given(mutated([MANIFEST, *DEEP_JSON]))
def test_fuzz_manifest(raw: bytes) -> None:
    with contextlib.suppress(PackageError):
        Manifest.from_bytes(raw)


@budget(300)
@given(mutated([SEALED_KEY, *DEEP_JSON]))
def test_fuzz_sealed_data_key(raw: bytes) -> None:
    with contextlib.suppress(PackageError):
        SealedDataKey.from_json(raw.decode(errors="replace"))
