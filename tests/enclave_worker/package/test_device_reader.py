"""Decrypting into device memory keeps at most one segment of plaintext on the CPU (run here with
device="cpu" standing in for the GPU buffer; the CUDA run is tests/gpu)."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.package.device_reader import decrypt_package_to_device
from protocol.package.errors import PackageIntegrityError, WrongKeyError

SEGMENT = 4096  # as conftest.make_package


def test_tensors_arrive_whole_and_staging_holds_one_segment_at_most(pkg) -> None:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    staging_ref: list[torch.Tensor] = []

    def on_segment(i: int, staging: torch.Tensor) -> None:
        seen.append(i)
        staging_ref[:] = [staging]
        n = pkg.manifest.segment_len(i)
        assert staging.numel() <= SEGMENT + 64  # one segment (+ cipher slack), never the model
        assert not staging[n:].any()  # nothing of an earlier segment left behind

    model = decrypt_package_to_device(pkg.path, pkg.data_key, "cpu", on_segment=on_segment)
    assert seen == list(range(pkg.manifest.num_segments)) and len(seen) > 3
    assert not staging_ref[0].any()  # the CPU copy is wiped after the upload
    for name, tensor in pkg.tensors.items():
        assert torch.equal(model.tensors[name], tensor)


def test_tampered_segment_leaves_nothing(pkg) -> None:  # type: ignore[no-untyped-def]
    payload = pkg.path / "payload.bin"
    data = bytearray(payload.read_bytes())
    data[SEGMENT + 100] ^= 1
    payload.write_bytes(bytes(data))
    with pytest.raises(PackageIntegrityError):
        decrypt_package_to_device(pkg.path, pkg.data_key, "cpu")


def test_wrong_key_is_refused_before_anything_is_allocated(pkg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WrongKeyError):
        decrypt_package_to_device(pkg.path, bytes(32), "cpu")
