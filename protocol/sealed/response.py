"""Sealed responses: chunked AEAD under a key exported from the request's HPKE context.

Key derivation as RFC 9458 §4.4 (OHTTP response encapsulation):
    secret      = context.Export("sealed-response-v2", 32)
    salt        = enc || response_nonce          (response_nonce: 32 random bytes, sent first)
    prk         = HKDF-Extract(salt, secret)
    aead_key    = HKDF-Expand(prk, "key", 32)     (AES-256-GCM)
    aead_nonce  = HKDF-Expand(prk, "nonce", 12)
Chunks as chunked OHTTP (draft-ietf-ohai-chunked-ohttp §6.2): chunk i is sealed with nonce
aead_nonce XOR i (i as a 12-byte big-endian counter) and associated data "" or, for the last chunk,
"final". So a dropped or reordered chunk fails to open at its position, and a stream that ends
without a chunk that opens as "final" is truncated.

Frame: type (1 byte: 0 chunk, 1 final) || length (4 bytes, big-endian) || ciphertext. The type byte
only tells the reader which associated data to try; flipping it makes the chunk fail to open. Each
chunk's plaintext is padded to a size bucket before sealing (padding.py); the response hash and the
receipt cover the chunk itself, not its padding.
"""

from __future__ import annotations

import hashlib
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from protocol.sealed.errors import ResponseCorrupted, SealedFormatError
from protocol.sealed.padding import DEFAULT_PADDING, LENGTH_BYTES, MAX_STEP_BYTES, PaddingPolicy, unpad

RESPONSE_EXPORT_LABEL = b"sealed-response-v2"
SECRET_BYTES = 32
NONCE_BYTES = 32  # max(Nn, Nk), RFC 9458 §4.4
_AEAD_NONCE = 12
_FINAL_AAD = b"final"
MAX_CHUNK = 16 << 20
_MAX_CIPHERTEXT = MAX_CHUNK + LENGTH_BYTES + MAX_STEP_BYTES + 16  # chunk, padding, GCM tag
_HEADER = struct.Struct(">BI")
_LENGTH = struct.Struct(">I")  # padding.py's length prefix


def _keys(secret: bytes, enc: bytes, response_nonce: bytes) -> tuple[AESGCM, bytes]:
    prk = HKDF.extract(hashes.SHA256(), enc + response_nonce, secret)
    key = HKDFExpand(hashes.SHA256(), 32, info=b"key").derive(prk)
    nonce = HKDFExpand(hashes.SHA256(), _AEAD_NONCE, info=b"nonce").derive(prk)
    return AESGCM(key), nonce


def _nonce(base: bytes, seq: int) -> bytes:
    """aead_nonce XOR seq, seq as a 12-byte big-endian counter."""
    return (int.from_bytes(base, "big") ^ seq).to_bytes(_AEAD_NONCE, "big")


class ResponseHash:
    """SHA-256 over every non-final chunk as length || plaintext: what the receipt signs."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def update(self, chunk: bytes) -> None:
        self._h.update(struct.pack(">I", len(chunk)) + chunk)

    def update_framed(self, framed: bytes) -> None:
        """`update` for a chunk already framed as length || plaintext (the padded frame's start)."""
        self._h.update(framed)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class ResponseSealer:
    """Worker side. `header()` first (the response nonce), then `seal()` per chunk, the last with final=True."""

    def __init__(self, secret: bytes, enc: bytes, response_nonce: bytes | None = None,
                 padding: PaddingPolicy = DEFAULT_PADDING) -> None:
        self.response_nonce = response_nonce or os.urandom(NONCE_BYTES)
        self._padding = padding
        if len(self.response_nonce) != NONCE_BYTES:
            raise SealedFormatError("response nonce must be 32 bytes")
        self._aead, self._base = _keys(secret, enc, self.response_nonce)
        self._base_int = int.from_bytes(self._base, "big")  # chunk i's nonce: this XOR i (`_nonce`)
        self._seq = 0
        self._done = False
        self.hash = ResponseHash()

    def header(self) -> bytes:
        return self.response_nonce

    def seal(self, chunk: bytes, final: bool = False) -> bytes:
        # One call per streamed token: the frame is built once (length || chunk is both what the
        # response hash covers and the padded plaintext's start; padding.py's `pad`, unrolled).
        if self._done:
            raise SealedFormatError("response already finished")
        if len(chunk) > MAX_CHUNK:
            raise SealedFormatError("response chunk too large")
        framed = _LENGTH.pack(len(chunk)) + chunk
        if not final:
            self.hash.update_framed(framed)
        padded = framed + bytes(self._padding.bucket(len(framed)) - len(framed))
        ciphertext = self._aead.encrypt((self._base_int ^ self._seq).to_bytes(_AEAD_NONCE, "big"), padded,
                                        _FINAL_AAD if final else b"")
        self._seq += 1
        self._done = final
        return _HEADER.pack(1 if final else 0, len(ciphertext)) + ciphertext


class ResponseOpener:
    """Client side: feed bytes as they arrive, get (plaintext, final) chunks; `close()` at end of stream."""

    def __init__(self, secret: bytes, enc: bytes) -> None:
        self._secret, self._enc = secret, enc
        self._aead: AESGCM | None = None
        self._base = b""
        self._buf = bytearray()
        self._seq = 0
        self._done = False
        self.hash = ResponseHash()

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        self._buf += data
        out: list[tuple[bytes, bool]] = []
        if self._aead is None:
            if len(self._buf) < NONCE_BYTES:
                return out
            nonce, self._buf = bytes(self._buf[:NONCE_BYTES]), self._buf[NONCE_BYTES:]
            self._aead, self._base = _keys(self._secret, self._enc, nonce)
        while len(self._buf) >= _HEADER.size:
            if self._done:
                raise ResponseCorrupted("data after the final response chunk")
            kind, length = _HEADER.unpack_from(self._buf)
            if kind not in (0, 1) or length > _MAX_CIPHERTEXT:
                raise ResponseCorrupted("malformed response frame")
            if len(self._buf) < _HEADER.size + length:
                break
            ciphertext = bytes(self._buf[_HEADER.size:_HEADER.size + length])
            del self._buf[:_HEADER.size + length]
            final = kind == 1
            try:
                padded = self._aead.decrypt(_nonce(self._base, self._seq), ciphertext,
                                            _FINAL_AAD if final else b"")
            except InvalidTag as exc:
                raise ResponseCorrupted(f"response chunk {self._seq} does not open at its position "
                                        "(tampered, dropped or reordered)") from exc
            try:
                plaintext = unpad(padded)
            except SealedFormatError as exc:
                raise ResponseCorrupted(f"response chunk {self._seq} is not a padded frame") from exc
            self._seq += 1
            self._done = final
            if not final:
                self.hash.update(plaintext)
            out.append((plaintext, final))
        if self._done and self._buf:
            raise ResponseCorrupted("data after the final response chunk")
        return out

    @property
    def finished(self) -> bool:
        return self._done

    def close(self) -> None:
        if not self._done:
            raise ResponseCorrupted("response ended before its final chunk (truncated)")
