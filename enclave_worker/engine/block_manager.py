"""Paged KV block allocation with a prefix cache of chained, per-tenant-salted block hashes."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from .sequence import Sequence


def block_hash(prev: bytes, token_ids: list[int], salt: bytes) -> bytes:
    """Hash of a full block, chained to the previous block's hash; the first block is salted."""
    h = hashlib.sha256()
    if not prev:
        h.update(len(salt).to_bytes(4, "little") + salt)
    h.update(prev)
    h.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU order
        self.prefix_hits = 0  # tokens served from the prefix cache
        self.prefix_queries = 0  # tokens looked up in the prefix cache

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> int:
        block, _ = self.free.popitem(last=False)
        old = self.block_hashes[block]
        if old is not None and self.hash_to_block.get(old) == block:
            del self.hash_to_block[old]
        self.block_hashes[block] = None
        self.ref_counts[block] = 1
        return block

    def _cached_blocks(self, seq: Sequence) -> list[tuple[int, bytes]]:
        """Leading full blocks of the sequence already in the cache (never all of its tokens)."""
        if not self.enable_prefix_caching:
            return []
        hits: list[tuple[int, bytes]] = []
        prev, bs = b"", self.block_size
        for i in range((len(seq) - 1) // bs):  # keep at least one token to compute
            h = block_hash(prev, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_salt)
            block = self.hash_to_block.get(h)
            if block is None:
                break
            hits.append((block, h))
            prev = h
        return hits

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._cached_blocks(seq)
        reused_free = sum(1 for b, _ in hits if self.ref_counts[b] == 0)
        return self.blocks_needed(len(seq)) - len(hits) <= len(self.free) - reused_free

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all its tokens, reusing cached prefix blocks."""
        assert not seq.block_table
        hits = self._cached_blocks(seq)
        if self.enable_prefix_caching:
            self.prefix_queries += ((len(seq) - 1) // self.block_size) * self.block_size
            self.prefix_hits += len(hits) * self.block_size
        for block, _ in hits:
            if self.ref_counts[block] == 0:
                del self.free[block]
            self.ref_counts[block] += 1
            seq.block_table.append(block)
        seq.num_hashed_blocks = len(hits)
        seq.last_block_hash = hits[-1][1] if hits else b""
        seq.num_computed_tokens = len(hits) * self.block_size
        for _ in range(self.blocks_needed(len(seq)) - len(hits)):
            seq.block_table.append(self._take_free())

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return need <= len(self.free)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(need):
            seq.block_table.append(self._take_free())

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's newly completed full blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        while (seq.num_hashed_blocks + 1) * bs <= seq.num_computed_tokens:
            i = seq.num_hashed_blocks
            h = block_hash(seq.last_block_hash, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_salt)
            block = seq.block_table[i]
            if h not in self.hash_to_block:
                self.hash_to_block[h] = block
                self.block_hashes[block] = h
            seq.last_block_hash = h
            seq.num_hashed_blocks += 1

    def free_seq(self, seq: Sequence) -> None:
        """Release a sequence's blocks; cached blocks stay reusable until their slot is recycled."""
        for block in reversed(seq.block_table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None
                if self.block_hashes[block] is None:  # uncached: recycle first
                    self.free.move_to_end(block, last=False)
        seq.block_table = []
