"""Hypothesis fuzzing of the SPDM report parser and the RIM parser: typed errors only, no crash."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from attestation.errors import AttestationError
from attestation.nvgpu import parse_evidence
from attestation.nvgpu.abi import GpuEvidence
from attestation.nvgpu.rim import Rim, parse_rim
from sealed_fakes import nvgpu_pki as tp

# Module-level seeds (Hypothesis needs them at collection): same lookup as the `testvectors` fixture.
_DEFAULT_VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "attestation"
REPO_VECTORS = Path(os.environ.get("SEALED_TESTVECTORS") or _DEFAULT_VECTORS) / "nvgpu"
FUZZ = settings(
    max_examples=10_000,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SYNTHETIC = tp.spdm_body(tp.EvidenceSpec(nonce=b"\x42" * 32)) + b"\x00" * 96


def _seeds() -> list[bytes]:
    """The real reports shipped in tests/vectors, plus a synthetic one."""
    names = ("nvtrust_hopperAttestationReport.bin", "trustee_hopper_coco_report1.bin")
    found = [(REPO_VECTORS / n).read_bytes() for n in names]
    return [*found, SYNTHETIC]


SEEDS = _seeds()
RIM_SEEDS = [
    *[p.read_bytes() for p in sorted(REPO_VECTORS.glob("*.swidtag"))],
    tp.rim_xml("96.00.9F.00.01", {0: (b"\0" * 48,), 3: (b"\1" * 48, b"\2" * 48)}, inactive=(0,)),
]


# Mutation plans come from one drawn seed: a handful of Hypothesis draws per example would cost
# more than the parse itself, and 10,000 examples must stay within the suite's time budget.
def _mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randrange(7)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    cut = rng.choice(["none", "truncate", "extend", "splice"])
    if cut == "truncate":
        del data[rng.randrange(len(data) + 1) :]
    elif cut == "extend":
        data += rng.randbytes(rng.randrange(9))
    elif cut == "splice":
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.randbytes(rng.randrange(1, 7))
    return bytes(data)


def mutated(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda i, s: _mutate(random.Random(s), seeds[i % len(seeds)]),
        st.integers(0, len(seeds) - 1),
        st.integers(0, 2**32),
    )


def _structured(rng: random.Random) -> bytes:
    """Well-formed skeletons with hostile counts, sizes and TLVs, so parsing goes deep."""
    count = rng.randrange(6)
    blocks = b""
    for i in range(count):
        value = rng.randbytes(rng.choice([48, 48, 0, rng.randrange(61)]))
        idx = rng.choice([i + 1, i + 1, 0, 0xFF, 1])
        size = rng.choice([len(value) + 3, len(value) + 3, len(value), 2, 0xFFFF])
        blocks += bytes([idx, rng.choice([1, 1, 0, 2])]) + struct.pack("<H", size)
        blocks += bytes([rng.choice([0x01, 0x81, 0x00])]) + struct.pack("<H", len(value)) + value
    opaque = b""
    for _ in range(rng.randrange(5)):
        kind = rng.choice([3, 6, 12, 17, 20, 26, 34, 36, 255, 0])
        value = rng.choice(
            [b"550.90.07\0", rng.randbytes(8), rng.randbytes(48), rng.randbytes(rng.randrange(51))]
        )
        opaque += struct.pack("<HH", kind, rng.choice([len(value), len(value), len(value) + 1, 0])) + value
    header = bytes([0x11, 0x60, 0, rng.choice([0, 0, 1]), rng.choice([count, count, count + 1, 0])])
    record_len = rng.choice([len(blocks), len(blocks), len(blocks) + 1, 0xFFFFFF])
    body = header + record_len.to_bytes(3, "little") + blocks + b"\0" * 32
    body += struct.pack("<H", rng.choice([len(opaque), len(opaque), len(opaque) + 3, 1025])) + opaque
    tail = rng.choice([96, 96, 95, 97, 98])
    return bytes([0x11, 0xE0, 1, 0xFF]) + b"\0" * 32 + bytes([rng.choice([0, 0, 9])]) + body + b"\0" * tail


def structured() -> st.SearchStrategy[bytes]:
    return st.builds(lambda s: _structured(random.Random(s)), st.integers(0, 2**32))


@FUZZ
@given(st.one_of(st.binary(max_size=600), mutated(SEEDS), structured()))
def test_fuzz_spdm_parser(data: bytes) -> None:
    try:
        ev = parse_evidence(data)
    except AttestationError:
        return
    assert isinstance(ev, GpuEvidence)
    ev.info()  # formatting every field must not crash either
    assert len(ev.signed) + 96 + ev.trailing == len(data)


RIM_TARGETS = (
    'index="3"',
    'active="True"',
    'alternatives="1"',
    'size="48"',
    "colloquialVersion=",
    "ns2:Hash0=",
    "<ns0:Payload",
    "SoftwareIdentity",
    'alternatives="2"',
    'index="0"',
)
JUNK = ("", "-1", "99999", "True", "x", '"', "<", "&amp;", "1e3", "0x10", "\u00e9", " ", "48 ", "１")


def _rim_attr(rng: random.Random) -> bytes:
    text = rng.choice(RIM_SEEDS).decode()
    for _ in range(rng.randrange(1, 4)):
        text = text.replace(rng.choice(RIM_TARGETS), rng.choice(JUNK), 1)
    return text.encode()


def rim_attr_mutation() -> st.SearchStrategy[bytes]:
    return st.builds(lambda s: _rim_attr(random.Random(s)), st.integers(0, 2**32))


@FUZZ
@given(st.one_of(st.binary(max_size=400), mutated(RIM_SEEDS), rim_attr_mutation()))
def test_fuzz_rim_parser(data: bytes) -> None:
    try:
        rim = parse_rim(data)
    except AttestationError:
        return
    assert isinstance(rim, Rim)
    assert all(len(h) == 48 for m in rim.measurements for h in m.alternatives)


def test_seeds_parse() -> None:
    for seed in SEEDS:
        parse_evidence(seed)
    for seed in RIM_SEEDS:
        parse_rim(seed)
    with pytest.raises(AttestationError):
        parse_evidence(SYNTHETIC + b"\0\0")
