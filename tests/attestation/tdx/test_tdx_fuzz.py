"""Hypothesis fuzzing: the TDX quote parser and the collateral JSON parsers raise only AttestationError."""

from __future__ import annotations

import contextlib
import json
import random
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attestation.errors import AttestationError
from attestation.tdx.abi import parse_quote
from attestation.tdx.collateral import parse_qe_identity, parse_tcb_info, split_signed_json
from attestation.tdx.pcs import classify_collateral
from sealed_fakes import tdx_collateral as tc
from sealed_fakes import tdx_pki as tp

FUZZ = settings(
    max_examples=10_000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_PKI = tp.make_pki()
QUOTES = [tp.build_quote(_PKI), tp.build_quote(_PKI, version=5, body_type=3), tp.build_quote(_PKI, version=5)]
TCB_INFO = tc.tcb_info(_PKI)
QE_IDENTITY = tc.qe_identity(_PKI)
# Offsets of every length/type field a parser trusts: header, v5 descriptor, signature data.
_FIELDS = [(0, "<H"), (2, "<H"), (4, "<I"), (48, "<H"), (50, "<I"), (632, "<I"), (702, "<I"), (764, "<H"),
           (766, "<I"), (1218, "<H"), (1252, "<H"), (1254, "<I")]  # fmt: skip


def _mutate_quote(seed: int) -> bytes:
    # One hypothesis draw (the seed) per example keeps generation cheap; the mutations follow from it.
    rng = random.Random(seed)
    base = bytearray(rng.choice(QUOTES))
    for _ in range(rng.randrange(1, 5)):
        if not base:
            break
        kind, pos = rng.randrange(5), rng.randrange(len(base))
        if kind == 0:
            base[pos] ^= rng.randrange(1, 256)
        elif kind == 1:
            off, fmt = rng.choice(_FIELDS)
            if off + struct.calcsize(fmt) <= len(base):
                struct.pack_into(fmt, base, off, rng.randrange(2 ** (8 * struct.calcsize(fmt))))
        elif kind == 2:
            del base[pos:]
        elif kind == 3:
            base[pos:pos] = rng.randbytes(rng.randrange(1, 9))
        else:
            del base[pos : pos + rng.randrange(1, 65)]
    return bytes(base)


@FUZZ
@given(st.one_of(st.integers(0, 2**64).map(_mutate_quote), st.binary(max_size=2048)))
def test_quote_parser_only_raises_attestation_errors(data: bytes) -> None:
    with contextlib.suppress(AttestationError):
        parse_quote(data)


_LEAVES: list[Any] = [None, True, False, 0, -1, 2**40, 1.5, "", "UpToDate", "Revoked", "00" * 6, "FF" * 8,
                     "2026-01-01T00:00:00Z", "2026-13-01T00:00:00Z", "zz", "TDX", "TD_QE", 3, 2]  # fmt: skip


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 2 or roll < 0.6:
        return rng.choice(_LEAVES)
    if roll < 0.8:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["svn", "tcb", "id", "x", "isvsvn"]): _random_json(rng, depth + 1) for _ in range(3)}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _structural(raw: bytes, key: str, seed: int) -> bytes:
    """Replace or delete one value anywhere in the signed JSON (the parsers see every shape)."""
    rng = random.Random(seed)
    value = json.loads(raw)[key]
    path = rng.choice(_paths(value))
    replacement = _random_json(rng)
    if not path:
        value = replacement
    else:
        parent = value
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and rng.random() < 0.3:
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    return json.dumps({key: value, "signature": "00" * 64}).encode()


def _byte_mutation(raw: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    data = bytearray(raw)
    for _ in range(rng.randrange(1, 4)):
        data[rng.randrange(len(data))] = rng.choice(b'{}[]",:0123456789aZ \\\\\xff')
    return bytes(data)


def _inputs(raw: bytes, key: str) -> st.SearchStrategy[bytes]:
    seeds = st.integers(0, 2**64)
    return st.one_of(
        seeds.map(lambda s: _structural(raw, key, s)),
        seeds.map(lambda s: _byte_mutation(raw, s)),
        st.binary(max_size=256),
    )


def _check_json(data: bytes, key: str) -> None:
    with contextlib.suppress(AttestationError):
        classify_collateral(data)
    try:
        signed = split_signed_json(data, key)
        (parse_tcb_info if key == "tcbInfo" else parse_qe_identity)(signed.value)
    except AttestationError:
        pass


@FUZZ
@given(_inputs(TCB_INFO, "tcbInfo"))
def test_tcb_info_parser_only_raises_attestation_errors(data: bytes) -> None:
    _check_json(data, "tcbInfo")


@FUZZ
@given(_inputs(QE_IDENTITY, "enclaveIdentity"))
def test_qe_identity_parser_only_raises_attestation_errors(data: bytes) -> None:
    _check_json(data, "enclaveIdentity")
