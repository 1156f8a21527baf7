"""The checkpoint's tensors as a model builder consumes them: popped as they are used, so each
source is dropped at once, and fused parts taken as one matrix (a view where they lie adjacent)."""

from __future__ import annotations

import itertools

import torch


class Weights:
    """Pops tensors from the checkpoint dict as they are consumed, so each source is dropped at once."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def has(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> torch.Tensor:
        return self.tensors.pop(name)

    def take_opt(self, name: str) -> torch.Tensor | None:
        return self.tensors.pop(name, None)

    def take_cat(self, names: list[str]) -> torch.Tensor:
        parts = [self.tensors.pop(n) for n in names]
        if _adjacent(parts):  # e.g. a decrypted package laid out for fusion: a view, not a copy
            first = parts[0]
            rows = sum(p.shape[0] for p in parts)
            return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())
        fused = torch.cat(parts, dim=0)
        del parts
        return fused

    def take_cat_opt(self, names: list[str]) -> torch.Tensor | None:
        return self.take_cat(names) if all(n in self.tensors for n in names) else None


def _adjacent(parts: list[torch.Tensor]) -> bool:
    """True when the parts are contiguous and follow each other in one storage (same dtype/columns)."""
    first = parts[0]
    if not all(p.is_contiguous() and p.dtype == first.dtype and p.shape[1:] == first.shape[1:] for p in parts):
        return False
    if any(p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() for p in parts):
        return False
    return all(a.data_ptr() + a.nbytes == b.data_ptr() for a, b in itertools.pairwise(parts))
