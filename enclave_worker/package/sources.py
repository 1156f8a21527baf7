"""Where the package writer reads a tensor's bytes from: memory, or a safetensors file, lazily.

`sealed encrypt` of a multi-gigabyte checkpoint must not hold the model in memory: a
`SafetensorsTensor` is a tensor's place in its shard (checked against the header like the engine's
loader checks it), read through windows of a read-only mapping that the digest and the cipher consume
in place (measured: hashing from the mapping costs 0.30 s of CPU per GB against 0.45 s through
`preadv` into a buffer). Memory then stays at one segment's ciphertext and one window whatever the
model size. Runs on the tenant's machine, beside writer.py.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from protocol.package.errors import PackageFormatError

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
              "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8}
_MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
_WINDOW = 64 << 20  # bytes of a shard mapped at a time


class TensorSource(Protocol):
    """A tensor the writer packs: its metadata, and its bytes on request."""

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def nbytes(self) -> int: ...

    def views(self, start: int, length: int) -> Iterator[memoryview]:
        """Bytes [start, start + length) of the tensor in order, as read-only views valid until the
        next one is asked for (the consumer keeps no reference)."""


@dataclass(frozen=True)
class InMemoryTensor:
    tensor: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def _bytes(self) -> memoryview:
        flat = self.tensor.detach().contiguous().reshape(-1)
        return flat.view(torch.uint8).numpy().data

    def views(self, start: int, length: int) -> Iterator[memoryview]:
        yield self._bytes()[start : start + length]


@dataclass(frozen=True)
class SafetensorsTensor:
    """A tensor inside an open shard: `fd` is held open by `open_safetensors`' ExitStack."""

    fd: int
    file_offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    where: str  # "<file>:<name>", for errors

    def views(self, start: int, length: int) -> Iterator[memoryview]:
        """Windows of a read-only mapping, each unmapped once consumed: no copy into user memory (the
        digest and the cipher read the page cache), and the mapped pages leave the process's RSS."""
        pos = self.file_offset + start
        end = pos + length
        while pos < end:
            base = pos - pos % mmap.ALLOCATIONGRANULARITY
            n = min(end, base + _WINDOW) - pos
            try:
                mapping = mmap.mmap(self.fd, pos - base + n, prot=mmap.PROT_READ, offset=base)
            except (OSError, ValueError) as exc:  # the file shrank since its header was checked
                raise PackageFormatError(f"{self.where}: cannot map the tensor's bytes ({exc})") from None
            with mapping, memoryview(mapping) as whole:
                view = whole[pos - base : pos - base + n]
                try:
                    yield view
                finally:
                    view.release()
            pos += n


def open_safetensors(path: Path, stack: ExitStack) -> dict[str, SafetensorsTensor]:
    """The tensors of one shard, each checked (dtype known, bytes inside the file, size = shape x
    dtype, no overlap); the file stays open until `stack` closes. Nothing is read but the header."""
    fd = os.open(path, os.O_RDONLY)
    stack.callback(os.close, fd)
    size = os.fstat(fd).st_size
    try:
        n = int.from_bytes(os.pread(fd, 8, 0), "little")
        if not 0 < n <= min(_MAX_HEADER, size - 8):
            raise ValueError(f"header length {n}")
        header = json.loads(os.pread(fd, n, 8))
        if not isinstance(header, dict):
            raise ValueError("the header is not an object")
    except ValueError as exc:
        raise PackageFormatError(f"{path}: not a safetensors file ({exc})") from None
    out: dict[str, SafetensorsTensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _ST_DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            start, end = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise PackageFormatError(f"{path}: tensor {name!r}: unsupported or malformed entry") from None
        count = 1
        for d in shape:
            count = count * d if d >= 0 else -1
        if count < 0 or not 0 <= start <= end <= size - 8 - n or end - start != count * dtype.itemsize:
            raise PackageFormatError(f"{path}: tensor {name} bytes [{start}, {end}) do not hold {info['dtype']} "
                                     f"{list(shape)} inside the file")
        spans.append((start, end, name))
        out[name] = SafetensorsTensor(fd, 8 + n + start, dtype, shape, end - start, f"{path.name}:{name}")
    spans.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:
            raise PackageFormatError(f"{path}: tensors {a} and {b} overlap")
    return out
