"""Hypothesis fuzzing of the SNP parser: only AttestationError subclasses may escape, never a crash."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attestation.errors import AttestationError
from attestation.snp.abi import REPORT_SIZE, parse_report
from attestation.snp.cli import inspect_for_cli
from sealed_fakes.snp_bench import make_cached_verifier
from sealed_fakes.snp_pki import RealVector


def _exercise(data: bytes, verifiers: list[Callable[[bytes], object]]) -> None:
    try:
        report = parse_report(data)
        report.signature_der()
        inspect_for_cli(data)
        for verify in verifiers:
            verify(data)
    except AttestationError:
        pass


def test_fuzz_parser(snp_dir: Path, vectors: tuple[RealVector, ...]) -> None:
    seeds = [(snp_dir / v.report).read_bytes() for v in vectors]
    # One cached verifier (Milan VCEK) so mutated reports also reach the binding and signature checks.
    verifiers = [make_cached_verifier((snp_dir / vectors[1].vek).read_bytes(), now=vectors[1].at)]
    # Cheap encodings keep 10,000 examples fast: mutations are 3-byte (offset, offset, value) chunks,
    # exact-length noise comes from a seeded PRNG (optionally with a valid VERSION so parsing goes on).
    mutated = st.builds(_mutate, st.sampled_from(seeds), st.binary(min_size=3, max_size=24))
    resized = st.builds(
        lambda seed, n: (seed * 2)[:n], st.sampled_from(seeds), st.integers(0, 2 * REPORT_SIZE)
    )
    noise = st.builds(_noise, st.integers(0, 2**64), st.sampled_from([None, 2, 3, 5]))
    anything = st.one_of(st.binary(max_size=2 * REPORT_SIZE), noise, mutated, mutated, resized)

    @settings(
        max_examples=10_000,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(anything)
    def run(data: bytes) -> None:
        _exercise(data, verifiers)

    run()


def _mutate(seed: bytes, muts: bytes) -> bytes:
    buf = bytearray(seed)
    for i in range(0, len(muts) - 2, 3):
        buf[int.from_bytes(muts[i : i + 2], "little") % REPORT_SIZE] = muts[i + 2]
    return bytes(buf)


def _noise(seed: int, version: int | None) -> bytes:
    data = bytearray(random.Random(seed).randbytes(REPORT_SIZE))
    if version is not None:
        data[0:4] = version.to_bytes(4, "little")
    return bytes(data)
