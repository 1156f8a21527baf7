"""A package whose weights cannot fit is refused from its signed manifest, before any decryption
(enclave_worker/memory_fit.py)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from enclave_worker.engine.memory import MemoryView, ModelDoesNotFit
from enclave_worker.memory_fit import check_package_fits, weights_lower_bound
from enclave_worker.package.writer import write_package
from enclave_worker.settings import WorkerSettings
from protocol.package import Manifest
from protocol.package.errors import PackageSignatureError
from protocol.package.signing import signer_identity

MIB = 1 << 20
SLACK = 256 * MIB  # engine/memory.py ALLOCATOR_SLACK


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest, str]:
    root = tmp_path_factory.mktemp("pkg")
    key = Ed25519PrivateKey.generate()
    tensors = [("w", torch.zeros(1024, 1024, dtype=torch.bfloat16)),  # 2 MiB stored, 4 MiB as fp32
               ("codes", torch.zeros(MIB, dtype=torch.int8))]  # already quantized: 1 MiB as it is
    manifest = write_package(root, metadata={"config": {}, "tokenizer_json": "{}"}, tensors=tensors,
                             data_key=secrets.token_bytes(32), key_id="dek", tenant="t1", model="m", version="v1",
                             signing_key=key, segment_size=1 << 16)
    return root, manifest, signer_identity(key.public_key())


def settings(root: Path, **kw: object) -> WorkerSettings:
    return WorkerSettings(broker_url="http://b", package_dir=root, tenant="t1", model="m", version="v1",
                          **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("dtype", "expected"), [
    ("float32", 4 * MIB + MIB), ("bfloat16", 2 * MIB + MIB), ("int8", MIB + MIB), ("int4", MIB // 2 + MIB),
])
def test_weights_as_held_are_bounded_from_the_manifest(package: tuple[Path, Manifest, str], dtype: str,
                                                      expected: int) -> None:
    assert weights_lower_bound(package[1], dtype) == expected


def test_a_package_that_fits_passes(package: tuple[Path, Manifest, str]) -> None:
    root, _, signer = package
    check_package_fits(settings(root, kv_cache_memory_bytes=MIB), signer,
                       MemoryView(SLACK + 6 * MIB, "MemAvailable"))  # 5 MiB weights as fp32 + 1 MiB pool


@pytest.mark.parametrize(("kw", "available", "what"), [
    ({"kv_cache_memory_bytes": MIB}, SLACK + 6 * MIB - 1, "its weights and the 1 MiB KV pool"),
    ({"cpu_memory_utilization": 0.5}, 2 * (SLACK + 5 * MIB) - 2, "its weights"),
    ({"engine_dtype": "int4", "kv_cache_memory_bytes": MIB}, SLACK + MIB, "its weights"),  # < the plaintext
])
def test_a_package_larger_than_the_budget_is_refused_with_one_line(package: tuple[Path, Manifest, str],
                                                                   kw: dict[str, object], available: int,
                                                                   what: str) -> None:
    root, _, signer = package
    with pytest.raises(ModelDoesNotFit) as refused:
        check_package_fits(settings(root, **kw), signer, MemoryView(available, "cgroup v2 limit"))
    line = str(refused.value)
    assert "\n" not in line and line.startswith("model does not fit: t1/m/v1 as ")
    assert what in line and "cgroup v2 limit" in line


def test_on_a_gpu_what_the_device_holds_counts_against_the_fraction(package: tuple[Path, Manifest, str]) -> None:
    root, manifest, signer = package
    gpu = settings(root, device="cuda", gpu_memory_utilization=0.5)  # bf16: the plaintext (3 MiB + metadata)
    need = SLACK + manifest.plaintext_bytes
    check_package_fits(gpu, signer, MemoryView(2 * need, "cuda:0"), 0)
    with pytest.raises(ModelDoesNotFit, match="cuda:0"):
        check_package_fits(gpu, signer, MemoryView(2 * need - 2 * MIB, "cuda:0"), 2 * MIB)


def test_the_manifest_must_be_the_required_signers(package: tuple[Path, Manifest, str]) -> None:
    other = signer_identity(Ed25519PrivateKey.generate().public_key())
    with pytest.raises(PackageSignatureError):
        check_package_fits(settings(package[0]), other, MemoryView(1 << 40, "MemAvailable"))


@pytest.mark.parametrize("fraction", [0.0, 1.5, -1.0])
def test_settings_refuse_a_fraction_outside_zero_to_one(tmp_path: Path, fraction: float) -> None:
    with pytest.raises(ValueError, match="cpu_memory_utilization"):
        settings(tmp_path, cpu_memory_utilization=fraction)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        settings(tmp_path, gpu_memory_utilization=fraction)
