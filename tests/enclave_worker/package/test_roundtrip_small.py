"""A synthetic package decrypts into exactly its tensors, as views into one buffer."""

from __future__ import annotations

from typing import Any as Pkg  # the fixture type lives in conftest.py

import torch

from enclave_worker.package import decrypt_package
from protocol.package import read_manifest
from protocol.package.signing import signer_identity


def test_round_trip(pkg: Pkg) -> None:
    model = decrypt_package(pkg.path, pkg.data_key)
    assert model.manifest.num_segments > 3
    assert set(model.tensors) == set(pkg.tensors)
    for name, t in pkg.tensors.items():
        assert torch.equal(model.tensors[name], t)
        assert model.tensors[name].untyped_storage().data_ptr() == model.buffer.untyped_storage().data_ptr()
    assert model.metadata["config"] == {"hidden_size": 48}
    assert model.signer == signer_identity(pkg.signing_key.public_key())
    assert model.manifest.plaintext_digest.startswith("blake3:")


def test_manifest_lists_what_the_issue_requires(pkg: Pkg) -> None:
    manifest, _, _ = read_manifest(pkg.path)
    entry = {t.name: t for t in manifest.tensors}["a.weight"]
    assert (entry.dtype, entry.shape, entry.nbytes) == ("float32", (64, 48), 64 * 48 * 4)
    assert manifest.format_version == 2 and manifest.key_id == "dek-test"
    assert manifest.signer.startswith("ed25519:")


def test_wipe_zeroes_the_buffer(pkg: Pkg) -> None:
    model = decrypt_package(pkg.path, pkg.data_key)
    model.wipe()
    assert not model.buffer.any()
