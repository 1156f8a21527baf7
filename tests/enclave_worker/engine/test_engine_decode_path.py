"""Which decode path `device=cuda` takes by default: the fused Triton kernels with CUDA graphs, since
tests/gpu/engine_checks.sh passed on an H200 (docs/engine.md, "The GPU path"); the gather + SDPA path
where Triton is absent or "torch" is asked for; never the Triton path on the CPU unless asked for.
Checked without a GPU: the choice is made from the config."""

from __future__ import annotations

import logging

import pytest

from enclave_worker.engine import llm_engine
from enclave_worker.engine.config import EngineConfig
from enclave_worker.engine.errors import EngineError


@pytest.fixture()
def triton_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU host: Triton installed."""
    monkeypatch.setattr(llm_engine, "triton_installed", lambda: True)


def test_cuda_defaults_to_the_fused_kernels_with_graphs(triton_present: None) -> None:
    config = EngineConfig(device="cuda")
    assert config.decode_kernels == "auto" and config.cuda_graphs is None
    assert llm_engine._fused_decode(config) is True


@pytest.mark.parametrize(("device", "kernels", "fused"), [
    ("cuda", "auto", True), ("cuda:0", "auto", True), ("cuda", "torch", False), ("cuda", "triton", True),
    ("cpu", "auto", False), ("cpu", "torch", False), ("cpu", "triton", True),
])
def test_which_path_each_setting_takes(triton_present: None, device: str, kernels: str, fused: bool) -> None:
    assert llm_engine._fused_decode(EngineConfig(device=device, decode_kernels=kernels)) is fused


def test_auto_on_cuda_without_triton_takes_the_gather_path_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(llm_engine, "triton_installed", lambda: False)
    with caplog.at_level(logging.WARNING, logger=llm_engine.__name__):
        assert llm_engine._fused_decode(EngineConfig(device="cuda")) is False
    assert "without the triton package" in caplog.text


def test_asking_for_triton_without_it_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_engine, "triton_installed", lambda: False)
    with pytest.raises(EngineError, match="triton"):
        llm_engine._fused_decode(EngineConfig(device="cuda", decode_kernels="triton"))


@pytest.mark.parametrize("kernels", ["", "fused", "TRITON"])
def test_an_unknown_decode_path_is_refused(kernels: str) -> None:
    with pytest.raises(ValueError, match="decode_kernels"):
        EngineConfig(device="cuda", decode_kernels=kernels)
