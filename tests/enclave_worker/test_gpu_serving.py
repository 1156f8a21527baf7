"""The GPU serving path's decisions, on the CPU: CC mode and the tenant's unsafe_allow_gpu_cc_off,
KV pool sizing from GPU memory, dtype and device in the measured configuration, and the decrypted
buffer released when the engine holds its own copy of the weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from attestation.errors import UnsupportedError
from enclave_worker.boot import _release_unaliased
from enclave_worker.engine import EngineConfig, LLMEngine
from enclave_worker.engine.checkpoint import Checkpoint
from enclave_worker.engine.memory import ModelDoesNotFit, device_memory, kv_pool_bytes
from enclave_worker.gpu import check_gpu_confidentiality
from enclave_worker.package import DecryptedModel
from enclave_worker.settings import WorkerSettings
from policy.errors import PolicyInvalid
from policy.policyset import PolicySet
from policy.release import ReleasePolicy
from sealed_fakes.fake_nvml import FakeNvml
from sealed_fakes.platform import make_gpu_identities

GIB = 1 << 30


def settings(**kw: object) -> WorkerSettings:
    return WorkerSettings(broker_url="http://b", package_dir=Path("/nonexistent"), tenant="acme", model="m",
                          version="v1", **kw)  # type: ignore[arg-type]


def policy_set(allow_cc_off: bool | None) -> PolicySet | None:
    if allow_cc_off is None:
        return None
    release = ReleasePolicy(policy_id="r", version=1, tenant="acme", model="m", allowed_tee=frozenset({"snp"}),
                            unsafe_allow_gpu_cc_off=allow_cc_off)
    return PolicySet(policy_id="p", version=1, tenant="acme", release=(release,))


@pytest.fixture()
def cc_off(testvectors: Path) -> FakeNvml:
    return FakeNvml.from_capture(testvectors.parent / "nvml" / "h200_cc_off_20261130.json")


def test_cpu_and_attested_gpus_need_no_exception() -> None:
    assert check_gpu_confidentiality(settings(), None) is False
    assert check_gpu_confidentiality(settings(device="cuda", tee="snp", gpu_tee="nvgpu"), None) is False


@pytest.mark.parametrize("allow", [None, False])
def test_cc_off_gpu_is_refused_unless_the_tenant_allows_it(cc_off: FakeNvml, allow: bool | None) -> None:
    with pytest.raises(UnsupportedError, match="GPU confidential computing is off"):
        check_gpu_confidentiality(settings(device="cuda"), policy_set(allow), nvml=cc_off)


def test_cc_off_gpu_under_unsafe_allow_is_served_and_insecure(cc_off: FakeNvml, caplog) -> None:  # type: ignore[no-untyped-def]
    s = settings(device="cuda", tee="snp")
    assert check_gpu_confidentiality(s, policy_set(True), nvml=cc_off) is True
    assert s.insecure and "UNSAFE" in caplog.text


def test_unattested_gpu_in_cc_mode_is_refused() -> None:
    nvml = FakeNvml.cc_on(make_gpu_identities(1), lambda *_: b"")
    with pytest.raises(UnsupportedError, match="not attested"):
        check_gpu_confidentiality(settings(device="cuda", tee="snp"), policy_set(True), nvml=nvml)


def test_unsafe_allow_gpu_cc_off_contradicts_require_gpu_cc() -> None:
    with pytest.raises(PolicyInvalid):
        ReleasePolicy(policy_id="r", version=1, tenant="a", model="m", require_gpu_cc=True,
                      unsafe_allow_gpu_cc_off=True)
    plain = ReleasePolicy(policy_id="r", version=1, tenant="a", model="m")
    assert "unsafe_allow_gpu_cc_off" not in plain.to_dict()  # older policies serialize as before
    flagged = ReleasePolicy.from_dict({**plain.to_dict(), "unsafe_allow_gpu_cc_off": True})
    assert flagged.unsafe_allow_gpu_cc_off and flagged.to_dict()["unsafe_allow_gpu_cc_off"] is True


def test_device_dtype_and_memory_share_are_measured() -> None:
    cpu, gpu = settings(), settings(device="cuda", tee="snp", gpu_tee="nvgpu", gpu_memory_utilization=0.8)
    assert cpu.dtype == "float32" and gpu.dtype == "bfloat16"
    assert gpu.measured_config()["engine"] == {"max_num_seqs": 16, "max_model_len": 2048, "dtype": "bfloat16",
                                               "device": "cuda", "kernel": "cuda/bfloat16/torch",
                                               "gpu_memory_utilization": 0.8}
    assert cpu.measured_config() != settings(engine_dtype="bfloat16").measured_config()
    assert not gpu.insecure and settings(device="cuda", tee="snp").insecure


def test_step_token_budget_is_small_on_the_cpu_and_measured_when_set() -> None:
    from enclave_worker.boot import engine_config

    cpu, gpu = settings(), settings(device="cuda", tee="snp", gpu_tee="nvgpu")
    assert engine_config(cpu).max_num_batched_tokens == 512 and gpu.step_token_budget == 2048
    assert "max_num_batched_tokens" not in cpu.measured_config()["engine"]  # defaults measure as before
    wide = settings(max_num_batched_tokens=2048)
    assert engine_config(wide).max_num_batched_tokens == 2048
    assert wide.measured_config()["engine"]["max_num_batched_tokens"] == 2048
    assert wide.measured_config() != cpu.measured_config()
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_num_batched_tokens"):
            settings(max_num_batched_tokens=bad)


def test_kv_budget_from_gpu_memory() -> None:
    # 140 GiB device, 3 GiB used by weights: 0.9 * 140 - 3 - 1 reserve = 122 GiB for the KV pool.
    view, in_use = device_memory("cuda:0", lambda: (137 * GIB, 140 * GIB))
    assert kv_pool_bytes(view, 0.9, in_use, GIB, 1) == int(140 * GIB * 0.9) - 3 * GIB - GIB
    view, in_use = device_memory("cuda:0", lambda: (100 * GIB, 140 * GIB))
    with pytest.raises(ModelDoesNotFit, match="leave no KV pool"):
        kv_pool_bytes(view, 0.1, in_use, GIB, 1)
    with pytest.raises(ValueError):
        kv_pool_bytes(view, 1.5, 0, 0, 1)


def _tiny_model(tmp_path: Path) -> tuple[Checkpoint, DecryptedModel]:
    from sealed_bench.gpu_models import random_checkpoint

    ck = random_checkpoint("tiny", "cpu", torch.float32)
    buffer = torch.cat([t.reshape(-1).view(torch.uint8) for t in ck.tensors.values()])
    views, offset = {}, 0
    for name, t in ck.tensors.items():
        views[name] = buffer[offset:offset + t.nbytes].view(t.dtype).reshape(t.shape)
        offset += t.nbytes
    manifest = type("M", (), {"tensors": list(views)})()
    return dataclasses.replace(ck, tensors=dict(views)), DecryptedModel(manifest, "s", {}, views, buffer)  # type: ignore[arg-type]


# fp32 layers stay in the buffer (panels rearranged in place, or torch's layout); bf16 ones are copies
# (packed, opaque tensors with no storage to compare, or plain).
@pytest.mark.parametrize(("dtype", "kept", "kernels"),
                         [("float32", True, "torch"), ("float32", True, "auto"), ("bfloat16", False, "torch"),
                          ("bfloat16", False, "auto")])
def test_decrypted_buffer_is_wiped_and_released_when_the_engine_copied_every_weight(
        tmp_path: Path, dtype: str, kept: bool, kernels: str) -> None:
    ck, model = _tiny_model(tmp_path)
    engine = LLMEngine.from_checkpoint(ck, EngineConfig(dtype=dtype, max_num_seqs=2, kv_cache_memory_bytes=4 << 20,
                                                        num_threads=1, decode_kernels=kernels))
    buffer = model.buffer
    out = _release_unaliased(model, engine)
    assert (out is model) is kept
    if not kept:
        assert out.buffer.numel() == 0 and not buffer.any()
