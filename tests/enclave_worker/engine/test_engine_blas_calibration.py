"""OpenBLAS's advantage over torch is measured, not assumed (enclave_worker/engine/blas_calibration.py)."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine.blas_calibration import BlasSpeedup, measure_blas_speedup, measure_packed_speedup
from enclave_worker.engine.layers.packed import packing_available


def test_measures_both_sizes_and_restores_the_pools() -> None:
    before = torch.get_num_threads()
    got = measure_blas_speedup(96, 64, 1)
    assert isinstance(got, BlasSpeedup)
    assert 0.01 < got.decode < 100 and 0.01 < got.prefill < 100
    assert torch.get_num_threads() == before
    assert measure_blas_speedup(96, 64, 1) is got  # once per shape and thread count


def test_unmeasured_prefers_torch() -> None:
    assert BlasSpeedup.unmeasured() == BlasSpeedup(decode=1.0, prefill=1.0)


def test_packed_speedup_is_measured_once_and_restores_the_pools() -> None:
    if not packing_available():
        pytest.skip("torch built without oneDNN")
    before = torch.get_num_threads()
    got = measure_packed_speedup(128, 64, 1)  # a shape oneDNN packs without padding
    assert 0.01 < got < 100
    assert torch.get_num_threads() == before
    assert measure_packed_speedup(128, 64, 1) == got
