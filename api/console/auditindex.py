"""An in-memory, incrementally verified index of the audit directory, so pages stay fast.

Each log file is read once; later refreshes read only what was appended (a SHA-256 of the
already-indexed prefix proves nothing before it changed; otherwise the file is re-indexed from
scratch). Verification is the same as ``policy.audit.verify_log`` (sequence, ``prev`` link,
entry hash, signature, checkpoint roots, signatures and truncation), done once per entry, and a
test keeps the two in agreement on where a log breaks. What it holds (rows, per-log state and
status) is api/console/auditrows.py.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.console.auditrows import Break, LogState, LogStatus, Row, load_component_keys
from policy.audit import Checkpoint, CheckpointAnchor, log_files, read_checkpoints
from policy.audit.entry import GENESIS, check_signature, entry_hash, parse_entry
from policy.audit.merkle import CompactRange
from policy.errors import AuditIntegrityError

SYNC_SIGNATURES = 5000  # more pending signatures than this are verified in the background
_SIGNATURE_CHUNK = 200
_RECENT_ROOTS = 8192  # chain sizes whose Merkle root is kept for checkpoints published late


def _root_of(stack: Sequence[tuple[int, bytes]]) -> bytes:
    cr = CompactRange()
    cr._stack = list(stack)  # a snapshot of the range at that size
    cr.size = sum(size for size, _ in stack)
    return cr.root()


class AuditIndex:
    """Thread-safe; ``refresh()`` before reading, then ``rows`` and ``statuses``."""

    def __init__(self, directory: Path, keys_dir: Path | None, anchors: Sequence[CheckpointAnchor] = ()) -> None:
        self.directory = Path(directory)
        self.keys_dir = keys_dir
        self.anchors = tuple(anchors)
        self._lock = threading.Lock()
        self._logs: dict[str, LogState] = {}
        self._keys: Mapping[str, Ed25519PublicKey] = {}
        self._keys_stat: tuple = ()
        self.rows: list[Row] = []  # all entries of all logs, in time order
        self.by_tenant: dict[str, list[Row]] = {}  # the same rows per tenant, component, rule
        self.by_component: dict[str, list[Row]] = {}
        self.by_rule: dict[str, list[Row]] = {}
        self.generation = 0  # bumps whenever rows change
        self._verifier: threading.Thread | None = None

    # -- refresh
    def refresh(self) -> None:
        with self._lock:
            self._refresh_keys()
            changed = False
            present = {p.name: p for p in log_files(self.directory)} if self.directory.is_dir() else {}
            for name in list(self._logs):
                if name not in present:  # a deleted log: its entries are gone from view, and that is news
                    del self._logs[name]
                    changed = True
            for name, path in present.items():
                state = self._logs.setdefault(name, LogState(path))
                changed |= self._refresh_log(state)
            if changed:
                merged = [row for st in self._logs.values() for row in st.rows]
                merged.sort(key=lambda r: r.key)
                by_tenant: dict[str, list[Row]] = {}
                by_component: dict[str, list[Row]] = {}
                by_rule: dict[str, list[Row]] = {}
                for row in merged:
                    by_tenant.setdefault(row.entry.tenant, []).append(row)
                    by_component.setdefault(row.entry.component, []).append(row)
                    by_rule.setdefault(row.rule, []).append(row)
                # Swapped in together: a reader sees one consistent generation.
                self.rows, self.by_tenant, self.by_component, self.by_rule = merged, by_tenant, by_component, by_rule
                self.generation += 1

    def _anchored(self, log_name: str) -> tuple[list[Checkpoint], str | None]:
        out: list[Checkpoint] = []
        error = None
        for anchor in self.anchors:
            try:
                out += anchor.checkpoints(log_name)
            except Exception as exc:
                error = f"anchor {type(anchor).__name__} unavailable ({type(exc).__name__})"
        return out, error

    def _refresh_keys(self) -> None:
        keys_dir = self.keys_dir
        stat: tuple = ()
        if keys_dir is not None and keys_dir.is_dir():
            stat = tuple((p.name, p.stat().st_mtime_ns) for p in sorted(keys_dir.glob("*.pem")))
        if stat != self._keys_stat:
            self._keys, self._keys_stat = load_component_keys(keys_dir), stat
            # Other keys: verify everything again.
            self._logs = {name: LogState(st.path) for name, st in self._logs.items()}

    def _refresh_log(self, st: LogState) -> bool:
        try:
            info = os.stat(st.path)
        except FileNotFoundError:
            return False
        ckpt_stat = _stat_or_none(Path(str(st.path) + ".ckpt"))
        stat = (info.st_size, info.st_mtime_ns, info.st_ino)
        # Anchored checkpoints first, then local ones, then the log: each is published only over
        # entries already written, so the log read last covers them all (no false truncation alarm).
        external, anchor_error = self._anchored(st.path.name)
        anchor_key = tuple(_ck_id(c) for c in external)
        if stat == st.stat and ckpt_stat == st.ckpt_stat and anchor_key == st.anchor_key:
            return False
        try:
            checkpoints = read_checkpoints(st.path)
            bad_checkpoints = False
        except AuditIntegrityError:
            checkpoints, bad_checkpoints = [], True
        data = st.path.read_bytes()
        end = data.rfind(b"\n") + 1  # a torn last line (crash mid-write) is not an entry yet
        if st.size and (end < st.size or hashlib.sha256(data[:st.size]).digest() != st.prefix_digest):
            # Not an append: something before what was indexed changed. Start over.
            fresh = LogState(st.path)
            st.__dict__.update(fresh.__dict__)
        lines = data[st.size:end].splitlines()
        start = st.lines
        st.checkpoints, st.anchored, st.anchor_error = checkpoints, external, anchor_error
        if bad_checkpoints:
            self._fail(st, start, "malformed checkpoint file")
        new = [ck for ck in [*checkpoints, *external] if _ck_id(ck) not in st.checked]
        by_size: dict[int, list[Checkpoint]] = {}
        for ck in new:
            by_size.setdefault(ck.tree_size, []).append(ck)
        late = [ck for ck in new if ck.tree_size <= start]
        for ck in late:
            self._check_checkpoint(st, ck, self._root_at(st, ck.tree_size), ck.tree_size - 1)
        for offset, raw in enumerate(lines):
            self._feed(st, start + offset, raw, by_size)
        st.lines += len(lines)
        total = st.lines
        if len(st.unsigned) <= SYNC_SIGNATURES:
            self._check_signatures(st, total)
        else:
            self._start_background()
        for ck in new:
            key = self._keys.get(ck.component)
            if st.component is not None and ck.component != st.component:
                self._fail(st, total, "checkpoint from another component")
            elif key is None or not ck.verify_signature(key):
                self._fail(st, min(ck.tree_size, total), "checkpoint signature invalid")
            elif ck.tree_size > total:
                self._fail(st, total, f"log truncated: a signed checkpoint covers {ck.tree_size} entries "
                                      f"but only {total} remain")
        local_max = max((c.tree_size for c in checkpoints), default=0)
        for ck in external:
            if ck.tree_size > local_max:  # as policy.audit.verify_log words it
                self._fail(st, ck.tree_size, f"checkpoint file lost checkpoints: the anchor holds one at size "
                                             f"{ck.tree_size}, the file's last is {local_max} (deleted or rolled back)")
        st.checked.update(_ck_id(ck) for ck in new)
        st.anchor_key = anchor_key
        st.size = end
        st.prefix_digest = hashlib.sha256(data[:end]).digest()
        st.stat = stat
        st.ckpt_stat = ckpt_stat
        return True

    def _root_at(self, st: LogState, size: int) -> bytes | None:
        snap = st.recent.get(size)
        if snap is not None:
            return _root_of(snap)
        if size > len(st.leaves):
            return None
        cr = CompactRange()  # an old size: replay (rare; only for checkpoints found long after)
        for leaf in st.leaves[:size]:
            cr.push(leaf)
        return cr.root()

    def _start_background(self) -> None:
        if self._verifier is None or not self._verifier.is_alive():
            self._verifier = threading.Thread(target=self._verify_backlog, name="console-audit-sigs", daemon=True)
            self._verifier.start()

    def _verify_backlog(self) -> None:
        while True:
            with self._lock:
                busy = [st for st in self._logs.values() if st.unsigned and st.broken is None]
                if not busy:
                    return
                for st in busy:
                    self._check_signatures(st, st.unsigned[min(_SIGNATURE_CHUNK, len(st.unsigned)) - 1][0] + 1)
            time.sleep(0)  # let page requests take the lock between chunks

    def _check_signatures(self, st: LogState, below: int) -> None:
        """Verify the pending entry signatures below ``below``; the first bad one breaks the chain."""
        pending, keep = st.unsigned, []
        for index, digest in pending:
            if index >= below or st.broken is not None:
                keep.append((index, digest))
                continue
            entry = st.rows[bisect.bisect_left(st.rows, index, key=lambda r: r.index)].entry
            key = self._keys.get(entry.component)
            if key is None or not check_signature(entry, digest, key):
                st.broken = Break(st.path.name, index, "bad signature (not signed by the component's key)")
        st.unsigned = keep if st.broken is None else []

    def _fail(self, st: LogState, index: int, reason: str) -> None:
        # verify_log names the first bad entry in file order: a bad signature deferred to a later
        # checkpoint may come before this failure, so those are checked first.
        self._check_signatures(st, index)
        st.fail(index, reason)

    def _check_checkpoint(self, st: LogState, ck: Checkpoint, root: bytes | None, index: int) -> None:
        if st.broken is not None and st.broken.index <= index:
            return
        head = st.leaves[index].hex() if 0 <= index < len(st.leaves) else GENESIS
        if root is None or ck.root != root.hex() or ck.last_hash != head:
            self._fail(st, index, f"entries 0..{index} differ from the signed checkpoint at size {ck.tree_size}")

    def _feed(self, st: LogState, index: int, raw: bytes, by_size: dict[int, list[Checkpoint]]) -> None:
        # Step numbers follow policy.audit.verify.verify_log.
        try:
            entry, body = parse_entry(raw, index)
        except AuditIntegrityError as exc:
            self._fail(st, index, exc.reason)
            return  # unreadable: not shown, and nothing after it verifies
        rule = str(entry.metadata.get("rule") or entry.reason)
        st.rows.append(Row(entry, st.path.name, index, rule))
        if st.broken is not None:
            return
        # 1. one component per file
        if st.component is None:
            st.component = entry.component
        elif entry.component != st.component:
            self._fail(st, index, f"component {entry.component!r} in {st.component!r}'s log")
            return
        # 2. sequence and 3. link to the previous entry
        if entry.seq != index:
            self._fail(st, index, f"sequence {entry.seq} at position {index}")
            return
        if entry.prev != st.prev:
            self._fail(st, index, "previous-hash link broken (entry deleted, inserted or reordered before this one)")
            return
        # 4. hash over the body as written
        digest = entry_hash(body)
        if digest.hex() != entry.hash:
            self._fail(st, index, "entry hash mismatch (entry edited)")
            return
        if entry.component not in self._keys:
            self._fail(st, index, f"no public key for component {entry.component!r}")
            return
        # 5. the component's signature: deferred to the end of the refresh (or, for a large
        # backlog, to a background pass), the slow part (an Ed25519 verification per entry).
        st.unsigned.append((index, digest))
        # 6. Merkle root at every checkpoint size
        st.crange.push(digest)
        st.leaves.append(digest)
        st.prev = entry.hash
        st.recent[st.crange.size] = list(st.crange._stack)
        if len(st.recent) > _RECENT_ROOTS:
            st.recent.popitem(last=False)
        for ck in by_size.get(st.crange.size, ()):
            self._check_checkpoint(st, ck, st.crange.root(), index)

    # -- reading
    def statuses(self) -> list[LogStatus]:
        with self._lock:
            return [dataclasses.replace(st.status(), anchors=len(self.anchors))
                    for _, st in sorted(self._logs.items())]

    def position(self, log: str, index: int) -> int | None:
        """Where an entry of a log sits in ``rows`` (time order), or None."""
        rows = self.rows
        st = self._logs.get(log)
        if st is None:
            return None
        at = bisect.bisect_left(st.rows, index, key=lambda r: r.index)
        if at >= len(st.rows) or st.rows[at].index != index:
            return None
        target = st.rows[at]
        i = bisect.bisect_left(rows, target.key, key=lambda r: r.key)
        while i < len(rows) and rows[i] is not target and rows[i].key == target.key:
            i += 1
        return i if i < len(rows) and rows[i] is target else None


def _ck_id(ck: Checkpoint) -> tuple[int, str, str]:
    return (ck.tree_size, ck.root, ck.sig)


def _stat_or_none(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_size, info.st_mtime_ns)
