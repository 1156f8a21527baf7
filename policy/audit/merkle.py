"""RFC 6962 Merkle tree hashing (Certificate Transparency style) over audit entry hashes.

Leaves are prefixed 0x00 and interior nodes 0x01 so a leaf can never pose as a node. The tree is
kept as a compact range (one perfect subtree per set bit of the size), so appending is O(log n)
and a root is available at any moment without rereading the log.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


class CompactRange:
    """Incremental RFC 6962 root: push leaves, ask for the root of everything pushed so far."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[tuple[int, bytes]] = []  # (subtree size, hash), sizes strictly decreasing

    def push(self, data: bytes) -> None:
        size, digest = 1, leaf_hash(data)
        # Merge equal-sized perfect subtrees, like carrying in binary addition.
        while self._stack and self._stack[-1][0] == size:
            left_size, left = self._stack.pop()
            size, digest = left_size + size, node_hash(left, digest)
        self._stack.append((size, digest))
        self.size += 1

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        # MTH splits at the largest power of two below n, which is exactly the leftmost perfect
        # subtree; folding right to left reproduces that recursion.
        acc = self._stack[-1][1]
        for _, digest in reversed(self._stack[:-1]):
            acc = node_hash(digest, acc)
        return acc


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """The RFC 6962 MTH of ``leaves`` (reference recursion; used to cross-check CompactRange)."""
    n = len(leaves)
    if n == 0:
        return EMPTY_ROOT
    if n == 1:
        return leaf_hash(leaves[0])
    k = 1 << ((n - 1).bit_length() - 1)
    return node_hash(merkle_root(leaves[:k]), merkle_root(leaves[k:]))


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """RFC 6962 audit path for leaf ``index`` in the tree over ``leaves``."""
    n = len(leaves)
    if not 0 <= index < n:
        raise IndexError(index)
    if n == 1:
        return []
    k = 1 << ((n - 1).bit_length() - 1)
    if index < k:
        return [*inclusion_proof(leaves[:k], index), merkle_root(leaves[k:])]
    return [*inclusion_proof(leaves[k:], index - k), merkle_root(leaves[:k])]


def verify_inclusion(data: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Check an audit path (RFC 9162 section 2.1.3.2 algorithm)."""
    if not 0 <= index < size:
        return False
    fn, sn = index, size - 1
    acc = leaf_hash(data)
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            acc = node_hash(p, acc)
            if (fn & 1) == 0:
                while (fn & 1) == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            acc = node_hash(acc, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and acc == root


def consistency_proof(leaves: Sequence[bytes], old_size: int) -> list[bytes]:
    """RFC 6962 (RFC 9162 section 2.1.4.1) proof that the tree of the first ``old_size`` leaves is
    a prefix of the tree over all ``leaves``: what a witness holding an old tree head checks a new
    one against, without the log."""
    n = len(leaves)
    if not 0 <= old_size <= n:
        raise IndexError(old_size)
    if old_size in (0, n):
        return []
    return _subproof(leaves, old_size, True)


def _subproof(leaves: Sequence[bytes], m: int, whole: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if whole else [merkle_root(leaves)]
    k = 1 << ((n - 1).bit_length() - 1)
    if m <= k:
        return [*_subproof(leaves[:k], m, whole), merkle_root(leaves[k:])]
    return [*_subproof(leaves[k:], m - k, False), merkle_root(leaves[:k])]


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes,
                       proof: Sequence[bytes]) -> bool:
    """Check a consistency proof (RFC 9162 section 2.1.4.2, steps numbered as there)."""
    if not 0 <= old_size <= new_size:
        return False
    if old_size == 0:
        return not proof  # every tree extends the empty one
    if old_size == new_size:
        return not proof and old_root == new_root
    if not proof:
        return False
    path = list(proof)
    # 2. An old tree of a power-of-two size is itself a node of the new tree: start from it.
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    # 3.-4.
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    # 5.
    fr = sr = path[0]
    # 6.
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    # 7.
    return fr == old_root and sr == new_root and sn == 0
