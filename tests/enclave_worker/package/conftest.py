"""Small synthetic packages for the format tests (many segments, fast)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.package.writer import write_package
from protocol.package import Manifest

SEGMENT = 4096


@dataclass(frozen=True)
class Pkg:
    path: Path
    data_key: bytes
    manifest: Manifest
    tensors: dict[str, torch.Tensor]
    signing_key: Ed25519PrivateKey


def make_package(root: Path, *, version: str = "v1", data_key: bytes | None = None,
                 signing_key: Ed25519PrivateKey | None = None, seed: int = 0) -> Pkg:
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        "a.weight": torch.randn(64, 48, generator=gen),
        "b.bias": torch.randn(37, generator=gen).to(torch.bfloat16),
        "c.ids": torch.randint(0, 1000, (300,), generator=gen, dtype=torch.int64),
    }
    key = data_key or secrets.token_bytes(32)
    signer = signing_key or Ed25519PrivateKey.generate()
    manifest = write_package(root, metadata={"config": {"hidden_size": 48}, "tokenizer_json": "{}"},
                             tensors=list(tensors.items()), data_key=key, key_id="dek-test", tenant="t1",
                             model="m", version=version, signing_key=signer, segment_size=SEGMENT)
    return Pkg(root, key, manifest, tensors, signer)


@pytest.fixture
def pkg(tmp_path: Path) -> Pkg:
    return make_package(tmp_path / "pkg")


@pytest.fixture
def make_pkg():  # type: ignore[no-untyped-def]
    """The factory itself, for tests that need several related packages."""
    return make_package
