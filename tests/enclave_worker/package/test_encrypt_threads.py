"""`sealed encrypt`'s segment loop on several threads (encrypt_segments.py): the package is the same
format whatever the thread count, a bad count is refused before anything is written, and a failed
write stops the loop with its error."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers import algorithms

from enclave_worker.package import decrypt_package, encrypt_segments
from enclave_worker.package.encrypt_segments import encrypt_segments as encrypt_loop
from enclave_worker.package.writer import write_package
from protocol.package.errors import PackageIntegrityError
from protocol.package.format import TAG_BYTES

SEGMENT = 4096


def tensors() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [("a.weight", torch.randn(300, 70, generator=gen)),
            ("b.weight", torch.randn(1001, generator=gen).to(torch.bfloat16)),
            ("c.ids", torch.randint(0, 9, (77,), generator=gen))]


def write(root: Path, key: bytes, threads: int | None) -> None:
    write_package(root, metadata={"config": {}}, tensors=tensors(), data_key=key, key_id="dek", tenant="t1",
                  model="m", version="v1", signing_key=Ed25519PrivateKey.generate(), segment_size=SEGMENT,
                  threads=threads)


@pytest.mark.parametrize("threads", [1, 2, 3, 7, None])
def test_any_thread_count_writes_the_same_plaintext(tmp_path: Path, threads: int | None) -> None:
    key = secrets.token_bytes(32)
    write(tmp_path / "pkg", key, threads)
    decrypted = decrypt_package(tmp_path / "pkg", key)
    assert decrypted.manifest.num_segments > 20
    for name, tensor in tensors():
        assert torch.equal(decrypted.tensors[name], tensor), name


def test_segments_are_written_in_order(tmp_path: Path) -> None:
    """Reordered segments would fail authentication: a package made on 4 threads decrypts, and one
    whose first two segments are swapped is refused."""
    key = secrets.token_bytes(32)
    write(tmp_path / "pkg", key, 4)
    payload = tmp_path / "pkg" / "payload.bin"
    raw = bytearray(payload.read_bytes())
    seg = SEGMENT + TAG_BYTES
    raw[:seg], raw[seg : 2 * seg] = raw[seg : 2 * seg], raw[:seg]
    payload.write_bytes(raw)
    with pytest.raises(PackageIntegrityError, match="segment 0"):
        decrypt_package(tmp_path / "pkg", key)


@pytest.mark.parametrize("threads", [0, -1])
def test_a_bad_thread_count_is_refused_before_anything_is_written(tmp_path: Path, threads: int) -> None:
    with pytest.raises(ValueError, match="threads"):
        write(tmp_path / "pkg", secrets.token_bytes(32), threads)
    assert not (tmp_path / "pkg").exists()


def test_a_failed_write_stops_the_loop_with_its_error() -> None:
    data = memoryview(bytes(64 * SEGMENT))
    with open("/dev/full", "wb") as full, pytest.raises(OSError, match="No space"):
        encrypt_loop(full, lambda start, end: iter([data[start:end]]), key=algorithms.AES(bytes(32)),
                     ad_prefix=b"p" * 32, total=len(data), segment_size=SEGMENT, num_segments=64, threads=2)


def test_the_flush_path_keeps_the_package_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flushed and dropped from the cache after every segment: the payload is still complete."""
    calls: list[int] = []
    flush = encrypt_segments._flush_and_drop
    monkeypatch.setattr(encrypt_segments, "_FLUSH_EVERY", SEGMENT)
    monkeypatch.setattr(encrypt_segments, "_flush_and_drop", lambda fd, upto: (calls.append(upto), flush(fd, upto)))
    key = secrets.token_bytes(32)
    write(tmp_path / "pkg", key, 2)
    assert calls and calls == sorted(calls)
    decrypted = decrypt_package(tmp_path / "pkg", key)
    assert torch.equal(decrypted.tensors["a.weight"], tensors()[0][1])
