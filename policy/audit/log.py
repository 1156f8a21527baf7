"""The append-only audit log writer: hash-chained, signed entries with group-committed fsync.

Durability (``fsync``):
- ``"batch"`` (default): each append is written to the kernel at once (one ``write``), so a
  killed process loses nothing it appended; a background flusher fsyncs at most every
  ``batch_interval_s`` or after ``batch_max`` pending entries, so power loss loses at most that
  window. ``flush()`` blocks until everything appended so far is on disk.
- ``"group"``: ``append`` returns only after its entry is fsynced; concurrent appenders share one
  fsync (group commit), so throughput grows with the number of writers.
- ``"always"``: fsync inside every append (slow; for tests and paranoid deployments).
Checkpoints are only ever published over fsynced entries, so a crash cannot leave a checkpoint
that covers entries the log lost.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy.audit.anchor import CheckpointAnchor
from policy.audit.checkpoint import checkpoint_path, read_checkpoints, sign_checkpoint
from policy.audit.entry import (
    GENESIS,
    MAX_FIELD,
    AuditEntry,
    MetaValue,
    bounded,
    bounded_reason,
    make_entry,
    parse_entry,
    validate_metadata,
)
from policy.audit.merkle import CompactRange, merkle_root
from policy.decision import Decision
from policy.errors import AuditIntegrityError, PolicyError

FSYNC_MODES = ("batch", "group", "always")
log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


class AuditLog:
    """One component's audit log file. Thread-safe; one writer process per file (flock)."""

    def __init__(self, path: Path, signer: Ed25519PrivateKey, component: str, *, fsync: str = "batch",
                 batch_interval_s: float = 0.05, batch_max: int = 512, checkpoint_every: int = 1000,
                 checkpoint_interval_s: float = 60.0, clock: Callable[[], datetime] = _now,
                 anchors: Sequence[CheckpointAnchor] = ()) -> None:
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {FSYNC_MODES}")
        if not component:
            raise ValueError("component must be non-empty")
        self.path = Path(path)
        self.component = component
        self._signer = signer
        self._mode = fsync
        self._interval = batch_interval_s
        self._batch_max = batch_max
        self._ckpt_every = checkpoint_every
        self._ckpt_interval = checkpoint_interval_s
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._fsync_lock = threading.Lock()  # serializes fsync + checkpoint publication
        self._range = CompactRange()
        self._prev = GENESIS
        self._closed = False
        self._anchors = tuple(anchors)
        self._offset = 0  # bytes of the log this writer accounts for (the file must be exactly that)
        self._ckpt_bytes = 0  # likewise for the checkpoint file
        self._broken: str | None = None  # why this writer refuses to go on (file replaced, truncated)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            # Two writers on one file would fork the chain; refuse rather than corrupt.
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._recover()
        except BaseException:
            os.close(self._fd)
            raise
        self._written = self._synced = self._range.size
        ckpts = read_checkpoints(self.path)
        self._ckpt_size = ckpts[-1].tree_size if ckpts else 0
        self._ckpt_time = time.monotonic()
        self._flusher = threading.Thread(target=self._flush_loop, name=f"audit-{component}", daemon=True)
        self._flusher.start()

    def _recover(self) -> None:
        """Continue an existing chain; drop a torn (newline-less) tail left by a crash mid-write."""
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        end = data.rfind(b"\n") + 1
        if end < len(data):
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
        self._offset = end
        leaves: list[bytes] = []
        for index, line in enumerate(data[:end].splitlines()):
            entry, _ = parse_entry(line, index, str(self.path))
            if entry.seq != index or entry.prev != self._prev:
                raise AuditIntegrityError(index, "chain broken; refusing to append", str(self.path))
            if entry.component != self.component:
                raise PolicyError(f"{self.path} belongs to component {entry.component!r}")
            leaves.append(bytes.fromhex(entry.hash))
            self._range.push(leaves[-1])
            self._prev = entry.hash
        ckpt_file = checkpoint_path(self.path)
        if ckpt_file.exists():
            # A crash mid-publication leaves a torn checkpoint line; drop it before appending more.
            raw = ckpt_file.read_bytes()
            keep = raw.rfind(b"\n") + 1
            if keep < len(raw):
                with open(ckpt_file, "r+b") as fh:
                    fh.truncate(keep)
                    os.fsync(fh.fileno())
        self._ckpt_bytes = ckpt_file.stat().st_size if ckpt_file.exists() else 0
        ckpts = read_checkpoints(self.path)
        if ckpts and ckpts[-1].tree_size > self._range.size:
            raise AuditIntegrityError(self._range.size, "log is shorter than its last checkpoint",
                                      str(self.path))
        self._check_anchors(leaves, max((c.tree_size for c in ckpts), default=0))

    def _check_anchors(self, leaves: list[bytes], local_size: int) -> None:
        """Refuse to continue a log that an anchored checkpoint shows was cut back or rewritten."""
        for anchor in self._anchors:
            for ck in anchor.checkpoints(self.path.name):
                if ck.tree_size > len(leaves):
                    raise AuditIntegrityError(len(leaves), f"log truncated: an anchored checkpoint covers "
                                              f"{ck.tree_size} entries, {len(leaves)} remain", str(self.path))
                if ck.root != merkle_root(leaves[:ck.tree_size]).hex():
                    raise AuditIntegrityError(ck.tree_size, "entries differ from an anchored checkpoint "
                                              "(log rewritten)", str(self.path))
                if ck.tree_size > local_size:
                    raise AuditIntegrityError(ck.tree_size, "the checkpoint file lost checkpoints that an "
                                              "anchor holds (deleted or rolled back)", str(self.path))

    def _fail(self, reason: str) -> AuditIntegrityError:
        """Stop this writer for good: every later append raises too (nothing is lost silently)."""
        if self._broken is None:
            self._broken = reason
            log.critical("audit log %s: %s; refusing further appends", self.path, reason)
        return AuditIntegrityError(self._range.size, self._broken, str(self.path))

    def _check_file(self) -> None:
        """The path must still name our file, at the length we wrote: a replaced (sed -i, mv),
        deleted, truncated or appended-to log is detected on the next append."""
        st = os.fstat(self._fd)
        if st.st_nlink == 0:
            raise self._fail("log file was deleted or replaced (our inode is unlinked)")
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            raise self._fail("log file was removed") from None
        if (named.st_dev, named.st_ino) != (st.st_dev, st.st_ino):
            raise self._fail("log file was replaced by another file")
        if st.st_size != self._offset:
            raise self._fail(f"log file is {st.st_size} bytes, this writer wrote {self._offset} "
                             "(truncated or written by someone else)")

    def append(self, *, tenant: str, action: str, decision: str, reason: str = "",
               metadata: Mapping[str, MetaValue] | None = None) -> AuditEntry:
        """Record one decision; returns the signed entry. Raises ValueError for content-like metadata."""
        meta = validate_metadata(metadata)
        # Attacker-controlled strings are bounded here, so that an audit write cannot fail on them.
        tenant, action, decision = (bounded(str(v), MAX_FIELD) for v in (tenant, action, decision))
        reason = bounded_reason(str(reason))
        with self._cond:
            if self._closed:
                raise PolicyError("audit log is closed")
            if self._broken is not None:
                raise AuditIntegrityError(self._range.size, self._broken, str(self.path))
            self._check_file()
            entry, line = make_entry(self._signer, seq=self._range.size, ts=self._clock(),
                               component=self.component, tenant=tenant, action=action,
                               decision=decision, reason=reason, metadata=meta, prev=self._prev)
            # One write per entry: a kill -9 after it returns cannot lose the entry (it is in the
            # kernel); a partial write can only be a torn tail, which _recover drops.
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
            self._offset += len(line)
            self._range.push(bytes.fromhex(entry.hash))
            self._prev = entry.hash
            self._written += 1
            target = self._written
            if self._mode == "always":
                os.fsync(self._fd)
                self._synced = target
            elif self._mode == "group" or target - self._synced in (1, self._batch_max):
                # Wake the flusher: the first pending entry opens the batch window, a full batch
                # (or a group-commit waiter) closes it now.
                self._cond.notify_all()
        if self._mode == "group":
            with self._cond:
                while self._synced < target and not self._closed:
                    self._cond.wait()
        return entry

    def append_decision(self, *, tenant: str, action: str, decision: Decision,
                        metadata: Mapping[str, MetaValue] | None = None) -> AuditEntry:
        """Record a policy ``Decision`` with the policy id, version and rule that made it."""
        meta: dict[str, MetaValue] = {**(metadata or {}), "policy_id": decision.policy_id,
                                      "policy_version": decision.policy_version, "rule": decision.rule}
        # Reasons are rule annotations; engine error texts could quote request values, so not those.
        reasons = ["evaluation error" if r.startswith("evaluation-error") else r for r in decision.reasons]
        return self.append(tenant=tenant, action=action, decision=decision.verdict,
                           reason="; ".join(reasons)[:512], metadata=meta)

    def _sync(self) -> None:
        """fsync everything written so far; publish a checkpoint if one is due."""
        with self._fsync_lock:
            with self._cond:
                target, root, head = self._written, self._range.root(), self._prev
            os.fsync(self._fd)  # outside the entry lock: appenders keep going during the fsync
            with self._cond:
                self._synced = max(self._synced, target)
                self._cond.notify_all()
            due = target - self._ckpt_size >= self._ckpt_every or (
                target > self._ckpt_size and time.monotonic() - self._ckpt_time >= self._ckpt_interval)
            if due:
                self._publish(target, root, head)

    def _publish(self, size: int, root: bytes, head: str) -> None:
        if self._broken is not None:
            return  # never sign a tree head over a file we no longer trust
        ckpt = sign_checkpoint(self._signer, component=self.component, log=self.path.name,
                               tree_size=size, root=root, last_hash=head, ts=self._clock())
        path = checkpoint_path(self.path)
        line = (ckpt.to_json() + "\n").encode("ascii")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            # The checkpoint file must be what we left: deleted, cut back or replaced is an attack.
            if os.fstat(fd).st_size != self._ckpt_bytes:
                self._fail("checkpoint file was deleted, truncated or replaced")
                return
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._ckpt_bytes += len(line)
        self._ckpt_size, self._ckpt_time = size, time.monotonic()
        for anchor in self._anchors:
            try:
                anchor.publish(ckpt)
            except Exception as exc:  # an anchor outage must not stop the audit trail; the next one catches up
                log.error("audit checkpoint anchor %s failed: %s", type(anchor).__name__, type(exc).__name__)

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                pending = self._written - self._synced
                if pending == 0 or (self._mode == "batch" and pending < self._batch_max):
                    # Sleep until the batch window closes (or a full batch / group waiter wakes us).
                    self._cond.wait(timeout=self._interval if pending else min(self._interval * 20, 1.0))
                if self._closed:
                    return
                pending = self._written - self._synced
            if pending or time.monotonic() - self._ckpt_time >= self._ckpt_interval:
                self._sync()

    def checkpoint(self) -> None:
        """Fsync and publish a signed checkpoint now (e.g. before handing the log to an auditor)."""
        with self._fsync_lock:
            with self._cond:
                size, root, head = self._written, self._range.root(), self._prev
            os.fsync(self._fd)
            with self._cond:
                self._synced = max(self._synced, size)
                self._cond.notify_all()
            if size > self._ckpt_size:
                self._publish(size, root, head)

    def flush(self) -> None:
        """Block until every entry appended so far is durable on disk."""
        self._sync()

    @property
    def size(self) -> int:
        with self._cond:
            return self._written

    def close(self) -> None:
        """Refuse further appends, flush, publish a final checkpoint, release the file. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True  # appends after this point raise instead of racing the checkpoint
            self._cond.notify_all()
        self._flusher.join()
        self.checkpoint()
        os.close(self._fd)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
