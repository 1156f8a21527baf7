"""OpenBLAS's advantage over torch is measured, not assumed (enclave_worker/engine/blas_calibration.py)."""

from __future__ import annotations

import torch

from enclave_worker.engine.blas_calibration import BlasSpeedup, measure_blas_speedup


def test_measures_both_sizes_and_restores_the_pools() -> None:
    before = torch.get_num_threads()
    got = measure_blas_speedup(96, 64, 1)
    assert isinstance(got, BlasSpeedup)
    assert 0.01 < got.decode < 100 and 0.01 < got.prefill < 100
    assert torch.get_num_threads() == before
    assert measure_blas_speedup(96, 64, 1) is got  # once per shape and thread count


def test_unmeasured_prefers_torch() -> None:
    assert BlasSpeedup.unmeasured() == BlasSpeedup(decode=1.0, prefill=1.0)
