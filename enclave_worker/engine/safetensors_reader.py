"""A minimal safetensors reader (format: u64 header length, JSON header, raw little-endian data): each
tensor read straight into its own buffer in the file's dtype (bf16 stays bf16), never through float32
and never with the shard held whole; eagerly (checkpoint.load_hf_dir) or when taken (lazy_tensors.py)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch

from .errors import CheckpointError
from .lazy_tensors import Reader

_ST_DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
}


def safetensors_readers(file: Path) -> dict[str, Reader]:
    """name -> a reader of that tensor, in the header's order; the header is checked here, the data
    read when a reader is called."""
    with file.open("rb") as f:
        try:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            size = file.stat().st_size
        except (ValueError, OSError) as exc:
            raise CheckpointError(f"cannot read safetensors header of {file}: {exc}") from exc
    base = 8 + n
    readers: dict[str, Reader] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"unsupported safetensors dtype {info['dtype']} for {name}")
        shape = [int(d) for d in info["shape"]]
        count = 1
        for d in shape:
            count *= d
        if not 0 <= start <= end <= size - base or end - start != count * dtype.itemsize:
            raise CheckpointError(
                f"safetensors tensor {name} in {file}: bytes [{start}, {end}) do not hold {info['dtype']} {shape}"
            )
        readers[name] = partial(_read, file, name, base + start, end - start, shape, dtype)
    return readers


def _read(file: Path, name: str, offset: int, nbytes: int, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype)
    if nbytes:
        with file.open("rb") as f:
            f.seek(offset)
            if f.readinto(t.view(-1).view(torch.uint8).numpy().data) != nbytes:
                raise CheckpointError(f"safetensors file {file} is truncated at {name}")
    return t
