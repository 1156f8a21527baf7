"""Size buckets: what the gateway sees of a sealed request or response chunk is its bucket, not its
length; a padded frame whose length or padding is wrong is refused, never read past."""

from __future__ import annotations

import struct

import pytest
from pyhpke import KEMKey

from protocol.sealed import (
    ReplayGuard,
    RequestContext,
    ResponseCorrupted,
    SealedFormatError,
    WorkerKey,
    open_request,
    seal_request,
)
from protocol.sealed.hpke import _AAD_LABEL, ENC_BYTES, REQUEST_INFO, SUITE, VERSION
from protocol.sealed.padding import DEFAULT_PADDING, PaddingPolicy, pad, unpad

NOW = 1_800_000_000.0


def _ctx(worker: WorkerKey) -> RequestContext:
    return RequestContext("acme", "m", "/v1/chat/completions", worker.key_id, version="v1",
                          api_key_id="key_0123456789abcdef", policy_version=1)


@pytest.mark.parametrize("short, long", [(10, 200), (300, 500), (1_100, 2_000), (70_000, 120_000)])
def test_requests_whose_lengths_differ_within_a_bucket_look_the_same_to_the_gateway(short: int, long: int) -> None:
    worker = WorkerKey.generate()
    a = seal_request(worker.public_bytes, _ctx(worker), b"a" * short, NOW).wire
    b = seal_request(worker.public_bytes, _ctx(worker), b"b" * long, NOW).wire
    assert len(a) == len(b)
    opened = open_request(worker, _ctx(worker), b, NOW, ReplayGuard())
    assert opened.body == b"b" * long  # the padding is gone again inside the worker


def test_without_padding_the_gateway_would_see_the_length() -> None:
    """The same pair with padding off differs: the equal-size test above can fail."""
    worker = WorkerKey.generate()
    exact = PaddingPolicy(min_bytes=0)
    a = seal_request(worker.public_bytes, _ctx(worker), b"a" * 10, NOW, padding=exact).wire
    b = seal_request(worker.public_bytes, _ctx(worker), b"b" * 200, NOW, padding=exact).wire
    assert len(b) - len(a) == 190


def test_response_chunks_within_a_bucket_are_the_same_size() -> None:
    worker = WorkerKey.generate()
    sealed = seal_request(worker.public_bytes, _ctx(worker), b"{}", NOW)
    sealer = open_request(worker, _ctx(worker), sealed.wire, NOW, ReplayGuard()).sealer
    short, long = sealer.seal(b'data: {"delta":"a"}\n\n'), sealer.seal(b'data: {"delta":"' + b"x" * 180 + b'"}\n\n')
    assert len(short) == len(long)
    got = sealed.opener.feed(sealer.header() + short + long)
    assert [c for c, _ in got] == [b'data: {"delta":"a"}\n\n', b'data: {"delta":"' + b"x" * 180 + b'"}\n\n']


@pytest.mark.parametrize("framed, bucket", [(1, 256), (256, 256), (257, 512), (65_536, 65_536),
                                            (65_537, 131_072), (200_000, 262_144)])
def test_buckets(framed: int, bucket: int) -> None:
    assert DEFAULT_PADDING.bucket(framed) == bucket


@pytest.mark.parametrize("kwargs", [{"min_bytes": 300}, {"min_bytes": -1}, {"step_bytes": 3},
                                    {"step_bytes": 2 << 20}, {"min_bytes": 1 << 17, "step_bytes": 1 << 16}])
def test_a_policy_that_is_not_a_bucket_scheme_is_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        PaddingPolicy(**kwargs)


@pytest.mark.parametrize("frame", [b"", b"\x00\x00\x00", struct.pack(">I", 5) + b"abcd",
                                   struct.pack(">I", 1) + b"a\x00\x01", struct.pack(">I", 0) + b"\xff"],
                         ids=["empty", "short prefix", "length past the end", "non-zero padding",
                              "padding only, non-zero"])
def test_unpad_negative_table(frame: bytes) -> None:
    with pytest.raises(SealedFormatError):
        unpad(frame)


def test_pad_round_trips() -> None:
    for n in (0, 1, 251, 252, 253, 5_000):
        assert unpad(pad(b"z" * n, DEFAULT_PADDING)) == b"z" * n


def _raw_request(worker: WorkerKey, ctx: RequestContext, plaintext: bytes) -> bytes:
    """A request sealed correctly but framed by hand (what a hostile client could send)."""
    recipient = KEMKey.from_pyca_cryptography_key(worker.private_key.public_key())
    enc, sender = SUITE.create_sender_context(recipient, info=REQUEST_INFO)
    assert len(enc) == ENC_BYTES and ctx.aad().startswith(_AAD_LABEL)
    return bytes([VERSION]) + enc + sender.seal(plaintext, aad=ctx.aad())


@pytest.mark.parametrize("frame", [struct.pack(">I", 50) + b"{}", struct.pack(">I", 2) + b"{}\x00\x07"],
                         ids=["length past the end", "non-zero padding"])
def test_a_request_with_a_bad_padded_frame_is_refused(frame: bytes) -> None:
    worker = WorkerKey.generate()
    wire = _raw_request(worker, _ctx(worker), struct.pack(">Q", int(NOW * 1000)) + frame)
    with pytest.raises(SealedFormatError):
        open_request(worker, _ctx(worker), wire, NOW, ReplayGuard())


def test_a_response_frame_that_is_not_padded_is_refused() -> None:
    worker = WorkerKey.generate()
    sealed = seal_request(worker.public_bytes, _ctx(worker), b"{}", NOW)
    sealer = open_request(worker, _ctx(worker), sealed.wire, NOW, ReplayGuard()).sealer
    raw = sealer._aead.encrypt(sealer._base, b"\x00\x00\x00\x09short", b"")
    with pytest.raises(ResponseCorrupted):
        sealed.opener.feed(sealer.header() + struct.pack(">BI", 0, len(raw)) + raw)
