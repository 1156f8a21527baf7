"""Size buckets for sealed requests and response chunks, so the gateway learns a size class, not a length.

Every sealed plaintext (the request body, each response chunk) is framed as

    u32 big-endian payload length ‖ payload ‖ zero bytes up to the bucket size

and the whole frame is encrypted, so the ciphertext length the gateway sees is the bucket's. Buckets
are powers of two from `min_bytes`; above `step_bytes` they grow in steps of `step_bytes`, so a
large request costs at most one step of padding. The reader checks the length and that every
padding byte is zero (a must-be-zero rule: anything else is a malformed message, not ignored).

What padding does not hide: how many chunks a streamed answer has (one per token event), timing,
and which bucket a message falls in. docs/sealed-mode.md says so.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.sealed.errors import SealedFormatError

_LENGTH = struct.Struct(">I")
LENGTH_BYTES = _LENGTH.size
MAX_STEP_BYTES = 1 << 20  # bounds what padding adds to a frame, so readers can bound frames


@dataclass(frozen=True, slots=True)
class PaddingPolicy:
    """How sealed plaintexts are padded. `min_bytes` 0 means exact sizes (only the length prefix)."""

    min_bytes: int = 256
    step_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        if self.min_bytes < 0 or (self.min_bytes and self.min_bytes & (self.min_bytes - 1)):
            raise ValueError("min_bytes must be 0 or a power of two")
        if not 0 < self.step_bytes <= MAX_STEP_BYTES or self.step_bytes & (self.step_bytes - 1):
            raise ValueError("step_bytes must be a power of two, at most 1 MiB")
        if self.min_bytes > self.step_bytes:
            raise ValueError("min_bytes must not exceed step_bytes")

    def bucket(self, framed_bytes: int) -> int:
        """The padded size of a frame whose length prefix and payload take `framed_bytes`."""
        if not self.min_bytes:
            return framed_bytes
        if framed_bytes > self.step_bytes:
            return -(-framed_bytes // self.step_bytes) * self.step_bytes
        return max(self.min_bytes, 1 << (framed_bytes - 1).bit_length())


DEFAULT_PADDING = PaddingPolicy()


def pad(payload: bytes, policy: PaddingPolicy) -> bytes:
    framed = LENGTH_BYTES + len(payload)
    return _LENGTH.pack(len(payload)) + payload + bytes(policy.bucket(framed) - framed)


def pad_fixed(payload: bytes, size: int) -> bytes:
    """A frame of exactly `size` bytes (records whose size must say nothing: decision records)."""
    framed = LENGTH_BYTES + len(payload)
    if framed > size:
        raise SealedFormatError(f"payload of {len(payload)} bytes does not fit a {size}-byte frame")
    return _LENGTH.pack(len(payload)) + payload + bytes(size - framed)


def unpad(frame: bytes) -> bytes:
    """The payload of a padded frame; SealedFormatError for a bad length or non-zero padding."""
    if len(frame) < LENGTH_BYTES:
        raise SealedFormatError("sealed frame has no length prefix")
    (length,) = _LENGTH.unpack_from(frame)
    if length > len(frame) - LENGTH_BYTES:
        raise SealedFormatError("sealed frame's length exceeds the frame")
    end = LENGTH_BYTES + length
    if frame[end:].count(0) != len(frame) - end:
        raise SealedFormatError("sealed frame's padding is not zero")
    return frame[LENGTH_BYTES:end]
