"""Which decode path `device=cuda` takes by default: the one that has run on a GPU (gather + SDPA).
The fused Triton kernels and CUDA graphs are opt-in until tests/gpu/engine_checks.sh has passed on a
GPU (docs/engine.md, "The GPU path"). Checked without a GPU: the choice is made from the config."""

from __future__ import annotations

import pytest

from enclave_worker.engine import llm_engine
from enclave_worker.engine.config import EngineConfig
from enclave_worker.engine.errors import EngineError


@pytest.fixture()
def triton_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU host: Triton installed (the old default took the fused path whenever it was)."""
    monkeypatch.setattr(llm_engine, "triton_installed", lambda: True)


def test_cuda_defaults_to_the_path_measured_on_a_gpu(triton_present: None) -> None:
    config = EngineConfig(device="cuda")
    assert config.decode_kernels == "auto" and config.cuda_graphs is False
    assert llm_engine._fused_decode(config) is False


@pytest.mark.parametrize(("kernels", "fused"), [("auto", False), ("torch", False), ("triton", True)])
def test_the_fused_kernels_are_taken_only_when_asked_for(triton_present: None, kernels: str, fused: bool) -> None:
    assert llm_engine._fused_decode(EngineConfig(device="cuda", decode_kernels=kernels)) is fused


def test_opting_in_without_triton_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_engine, "triton_installed", lambda: False)
    with pytest.raises(EngineError, match="triton"):
        llm_engine._fused_decode(EngineConfig(device="cuda", decode_kernels="triton"))


@pytest.mark.parametrize("kernels", ["", "fused", "TRITON"])
def test_an_unknown_decode_path_is_refused(kernels: str) -> None:
    with pytest.raises(ValueError, match="decode_kernels"):
        EngineConfig(device="cuda", decode_kernels=kernels)
