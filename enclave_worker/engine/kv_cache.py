"""The KV block pool: one allocation per layer, sized from a memory budget."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def num_blocks(self, memory_bytes: int) -> int:
        return memory_bytes // self.bytes_per_block


def allocate_kv_cache(spec: KVCacheSpec, num_blocks: int, device: str) -> torch.Tensor:
    """[2, layers, slots, kv_heads, head_dim], zeroed.

    Decode attention gathers whole blocks and masks the slots past a sequence's length; a masked slot
    still enters the weighted sum with weight 0, and 0 x NaN is NaN. Memory reused from freed tensors can
    hold NaN or inf bit patterns, so the pool starts zeroed (every page resident from the start)."""
    slots = num_blocks * spec.block_size
    return torch.zeros(2, spec.num_layers, slots, spec.num_kv_heads, spec.head_dim, dtype=spec.dtype, device=device)
