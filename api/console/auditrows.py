"""What the audit index (api/console/auditindex.py) holds: each entry as the console shows it
(`Row`), each log's state while it is indexed (`LogState`) and its status (`LogStatus`, with the
first `Break`), and the component keys the entries are verified with."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from policy.audit import AuditEntry, Checkpoint
from policy.audit.entry import GENESIS
from policy.audit.merkle import CompactRange


@dataclass(frozen=True)
class Row:
    """One entry as the console shows it."""

    entry: AuditEntry
    log: str  # file name
    index: int  # position in its file
    rule: str  # the deciding rule (metadata "rule"), else the reason

    @property
    def key(self) -> tuple[datetime, str, int]:
        return (self.entry.ts, self.entry.component, self.entry.seq)


@dataclass(frozen=True)
class Break:
    log: str
    index: int
    reason: str


@dataclass(frozen=True)
class LogStatus:
    log: str
    component: str | None
    entries: int
    verified: int  # entries verified before the break (== entries when intact)
    signatures_pending: int  # entries whose signature is still being verified (in the background)
    last_checkpoint: Checkpoint | None
    broken: Break | None
    last_anchored: Checkpoint | None = None  # the newest of this log's checkpoints an anchor holds
    anchors: int = 0  # anchors configured
    anchor_error: str | None = None


def load_component_keys(keys_dir: Path | None) -> dict[str, Ed25519PublicKey]:
    keys: dict[str, Ed25519PublicKey] = {}
    if keys_dir is None or not keys_dir.is_dir():
        return keys
    for path in sorted(keys_dir.glob("*.pem")):
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except ValueError:
            continue
        if isinstance(key, Ed25519PublicKey):
            keys[path.stem] = key
    return keys


@dataclass
class LogState:
    """One log file as indexed so far (AuditIndex's, under its lock)."""

    path: Path
    stat: tuple[int, int, int] = (-1, -1, -1)
    size: int = 0  # bytes indexed (whole lines only)
    lines: int = 0  # lines indexed
    ckpt_stat: tuple[int, int] | None = None
    prefix_digest: bytes = b""
    rows: list[Row] = field(default_factory=list)
    prev: str = GENESIS
    component: str | None = None
    crange: CompactRange = field(default_factory=CompactRange)
    recent: collections.OrderedDict[int, list[tuple[int, bytes]]] = field(default_factory=collections.OrderedDict)
    leaves: list[bytes] = field(default_factory=list)
    checked: set[tuple[int, str, str]] = field(default_factory=set)  # checkpoints verified (size, root, sig)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    anchored: list[Checkpoint] = field(default_factory=list)  # this log's checkpoints held by the anchors
    anchor_key: tuple = ()
    anchor_error: str | None = None
    broken: Break | None = None
    unsigned: list[tuple[int, bytes]] = field(default_factory=list)  # (index, digest) not yet vouched for

    def fail(self, index: int, reason: str) -> None:
        if self.broken is None:
            self.broken = Break(self.path.name, index, reason)

    def status(self) -> LogStatus:
        verified = self.broken.index if self.broken else self.lines
        last = self.checkpoints[-1] if self.checkpoints else None
        anchored = max(self.anchored, key=lambda c: c.tree_size) if self.anchored else None
        return LogStatus(self.path.name, self.component, self.lines, verified, len(self.unsigned), last,
                         self.broken, anchored, 0, self.anchor_error)
