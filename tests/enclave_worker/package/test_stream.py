"""A package streamed into the build (decrypt_package(stream=True), package/stream.py): the whole payload
is authenticated first, each tensor's segments are decrypted only when it is taken, into the same
places as the eager load, and a segment changed on disk after the first pass is refused when met,
with what was decrypted wiped."""

from __future__ import annotations

import secrets
from functools import partial
from pathlib import Path
from typing import Any as Pkg  # the fixture type lives in conftest.py

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from enclave_worker.engine.checkpoint import Checkpoint
from enclave_worker.engine.config import EngineConfig
from enclave_worker.engine.model_builder import BuiltModel, build_model
from enclave_worker.engine.models import model_tensors
from enclave_worker.package import DecryptedModel, decrypt_package
from protocol.package import PackageIntegrityError
from protocol.package.format import TAG_BYTES, Manifest, ad_prefix, associated_data, nonce_for, segment_key
from protocol.package.signing import read_manifest


def _segments_of(manifest: Manifest, name: str) -> set[int]:
    t = next(t for t in manifest.tensors if t.name == name)
    return set(range(t.offset // manifest.segment_size, (t.offset + t.nbytes - 1) // manifest.segment_size + 1))


def _by_offset(manifest: Manifest) -> list[str]:
    return [t.name for t in sorted(manifest.tensors, key=lambda t: t.offset)]


def _decrypted(model: DecryptedModel) -> set[int]:
    assert model.stream is not None
    return {lo // model.manifest.segment_size for lo, _ in model.stream.decrypted_ranges()}


def _forge_segment(pkg_dir: Path, data_key: bytes, index: int) -> None:
    """What a holder of the data key can do between the two passes: re-encrypt one segment with other
    plaintext; its GCM tag verifies."""
    manifest, raw, _ = read_manifest(pkg_dir)
    eager = decrypt_package(pkg_dir, data_key)
    size, n, last = manifest.segment_size, manifest.segment_len(index), index == manifest.num_segments - 1
    plain = bytearray(eager.buffer[index * size : index * size + n].numpy().tobytes())
    eager.wipe()
    plain[n // 2] ^= 0x01
    forged = AESGCM(segment_key(data_key, manifest.package_id)).encrypt(
        nonce_for(index, last), bytes(plain), associated_data(ad_prefix(manifest.package_id, raw), index, last)
    )
    with open(pkg_dir / "payload.bin", "r+b") as f:
        f.seek(index * (size + TAG_BYTES))
        f.write(forged)


def test_streamed_tensors_equal_the_eager_ones(pkg: Pkg) -> None:
    streamed = decrypt_package(pkg.path, pkg.data_key, stream=True)
    eager = decrypt_package(pkg.path, pkg.data_key)
    assert streamed.metadata == eager.metadata
    assert list(streamed.tensors) == list(eager.tensors)
    for name, tensor in eager.tensors.items():
        got = streamed.tensors.pop(name)
        assert got.dtype == tensor.dtype and torch.equal(got, tensor), name
        assert got.data_ptr() - streamed.buffer.data_ptr() == tensor.data_ptr() - eager.buffer.data_ptr()
        assert torch.equal(got, pkg.tensors[name]), name


def test_each_segment_is_decrypted_when_its_tensor_is_taken(pkg: Pkg) -> None:
    model = decrypt_package(pkg.path, pkg.data_key, stream=True)
    m = model.manifest
    assert _decrypted(model) == set(range(m.metadata_bytes // m.segment_size + 1))  # the metadata only
    names = list(model.tensors)
    assert "a.weight" in model.tensors and _decrypted(model) == set(range(m.metadata_bytes // m.segment_size + 1))
    expected = _decrypted(model)
    for name in names:
        model.tensors.pop(name)
        expected |= _segments_of(m, name)
        assert _decrypted(model) == expected, name
    assert expected == set(range(m.num_segments))


def test_a_tampered_payload_is_refused_before_any_tensor(pkg: Pkg) -> None:
    """The first pass authenticates every segment and the digest: the last segment's flipped byte is
    found before the load returns anything."""
    with open(pkg.path / "payload.bin", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(PackageIntegrityError, match="failed authentication"):
        decrypt_package(pkg.path, pkg.data_key, stream=True)


def test_a_key_holders_substitution_is_refused_before_any_tensor(pkg: Pkg) -> None:
    _forge_segment(pkg.path, pkg.data_key, pkg.manifest.num_segments - 1)
    with pytest.raises(PackageIntegrityError, match="digest differs"):
        decrypt_package(pkg.path, pkg.data_key, stream=True)


@pytest.mark.parametrize("forge", [False, True], ids=["flipped-byte", "key-holder-substitution"])
def test_a_segment_changed_after_the_first_pass_is_refused_and_wiped(pkg: Pkg, forge: bool) -> None:
    model = decrypt_package(pkg.path, pkg.data_key, stream=True)
    tail = _by_offset(model.manifest)[-1]
    target = max(_segments_of(model.manifest, tail) - _decrypted(model))
    first = model.buffer[: model.manifest.segment_size]  # the metadata's segment: decrypted and checked
    if forge:
        _forge_segment(pkg.path, pkg.data_key, target)
    else:
        with open(pkg.path / "payload.bin", "r+b") as f:
            f.seek(target * (model.manifest.segment_size + TAG_BYTES) + 7)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(PackageIntegrityError, match=f"segment {target} "):
        model.tensors.pop(tail)
    size = model.manifest.segment_size
    assert not model.buffer[target * size : target * size + model.manifest.segment_len(target)].any()
    assert first.any()
    model.wipe()
    assert not first.any()
    for lo, hi in model.stream.decrypted_ranges():  # type: ignore[union-attr]
        assert not model.buffer[lo:hi].any()


def test_a_truncated_payload_met_mid_load_is_refused(pkg: Pkg) -> None:
    model = decrypt_package(pkg.path, pkg.data_key, stream=True)
    tail = _by_offset(model.manifest)[-1]
    target = max(_segments_of(model.manifest, tail) - _decrypted(model))
    with open(pkg.path / "payload.bin", "r+b") as f:
        f.truncate(target * (model.manifest.segment_size + TAG_BYTES) + 10)
    with pytest.raises(PackageIntegrityError, match=f"segment {target} is short"):
        model.tensors.pop(tail)


def test_no_segment_is_decrypted_after_the_build(pkg: Pkg) -> None:
    model = decrypt_package(pkg.path, pkg.data_key, stream=True)
    model.end_stream()
    with pytest.raises(PackageIntegrityError, match="closed"):
        model.tensors.pop("c.ids")


# ---- through the engine's build, as enclave_worker/boot.py does it ----


@pytest.fixture(scope="module")
def llama_pkg(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    from enclave_worker.package.writer import write_package
    from sealed_bench.gpu_models import arch_config, random_tensors, tokenizer_assets

    cfg = {**arch_config("tiny"), "num_hidden_layers": 2}
    tensors = random_tensors(cfg, "cpu", torch.bfloat16)
    key = secrets.token_bytes(32)
    pkg = tmp_path_factory.mktemp("stream") / "pkg"
    write_package(
        pkg,
        metadata={"format": "hf-llama", "config": cfg, "tokenizer_json": tokenizer_assets(None)[0]},
        tensors=list(tensors.items()),
        data_key=key,
        key_id="dek",
        tenant="t1",
        model="m",
        version="v1",
        signing_key=Ed25519PrivateKey.generate(),
        segment_size=16384,
    )
    return pkg, key


def _build(model: DecryptedModel) -> BuiltModel:
    checkpoint = Checkpoint(
        model.metadata["config"], model.tensors, model.metadata["tokenizer_json"], None, release=model.release
    )
    return build_model(checkpoint, EngineConfig(device="cpu", dtype="int8", num_threads=1))


def test_a_streamed_build_holds_the_same_weights(llama_pkg: tuple[Path, bytes]) -> None:
    path, key = llama_pkg
    eager, streamed = decrypt_package(path, key), decrypt_package(path, key, stream=True)
    a, b = _build(eager), _build(streamed)
    streamed.end_stream()
    assert _decrypted(streamed) == set(range(streamed.manifest.num_segments))
    pairs = list(zip(model_tensors(a.model), model_tensors(b.model), strict=True))
    assert pairs and all(torch.equal(x, y) for x, y in pairs if not x.is_mkldnn)


def test_a_segment_tampered_mid_build_stops_it_and_is_wiped(tmp_path: Path, llama_pkg: tuple[Path, bytes]) -> None:
    import shutil

    src, key = llama_pkg
    path = tmp_path / "pkg"
    shutil.copytree(src, path)
    model = decrypt_package(path, key, stream=True)
    target = model.manifest.num_segments - 2  # in the last layer's or the final norm's tensors
    with open(path / "payload.bin", "r+b") as f:
        f.seek(target * (model.manifest.segment_size + TAG_BYTES) + 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(PackageIntegrityError, match=f"segment {target} "):
        _build(model)
    decrypted = _decrypted(model)
    assert len(decrypted) > 2 and target not in decrypted  # the build had taken tensors before
    model.wipe()
    assert model.stream is not None
    for lo, hi in model.stream.decrypted_ranges():
        assert not model.buffer[lo:hi].any()


def test_the_page_release_reads_no_tensor_still_to_be_taken() -> None:
    """models/weights.py asks after each layer which memory is still to be taken: for a streamed package
    it learns that from the manifest's extents, not by decrypting every remaining tensor."""
    from enclave_worker.engine.lazy_tensors import LazyTensors
    from enclave_worker.engine.models.weights import Weights

    buffer = torch.arange(64, dtype=torch.uint8)
    reads: list[str] = []

    def reader(name: str, lo: int, hi: int) -> torch.Tensor:
        reads.append(name)
        return buffer[lo:hi]

    spans = {"a": (0, 16), "b": (16, 40), "c": (40, 64)}
    base = buffer.data_ptr()
    lazy = LazyTensors(
        {n: partial(reader, n, lo, hi) for n, (lo, hi) in spans.items()},
        {n: (base + lo, base + hi) for n, (lo, hi) in spans.items()},
    )
    released: list[torch.Tensor] = []
    weights = Weights(lazy, release=released.append)
    weights.take("a")
    weights.release_consumed()
    assert reads == ["a"]
    assert [t.data_ptr() for t in released] == [base]


def test_a_source_that_fails_mid_build_wipes_the_layers_built_so_far() -> None:
    """The converted layers are plaintext copies that the abandoned build would leave in freed memory."""
    from enclave_worker.engine.lazy_tensors import LazyTensors
    from enclave_worker.engine.models.weights import Weights

    def refused() -> torch.Tensor:
        raise PackageIntegrityError("segment 9 failed authentication")

    lazy = LazyTensors({"a": partial(torch.ones, 8), "b": refused})
    weights = Weights(lazy, release=lambda _t: None)
    layer = torch.nn.Module()
    layer.codes = weights.take("a") * 3  # a converted copy, as a quantized layer holds
    weights.release_consumed(layer)
    with pytest.raises(PackageIntegrityError):
        weights.take("b")
    assert not layer.codes.any()


def test_the_worker_streams_only_when_asked() -> None:
    from enclave_worker.cli import parse

    argv = [
        "--broker-url",
        "https://broker.example",
        "--package-dir",
        "/pkg",
        "--tenant",
        "acme",
        "--model",
        "m",
        "--version",
        "v1",
        "--grpc-port",
        "50051",
        "--tee",
        "sim",
    ]
    assert parse(argv)[1].stream_package is False
    assert parse([*argv, "--stream-package"])[1].stream_package is True
