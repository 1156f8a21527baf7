"""Checkpoints anchored outside the log's own directory.

A signed checkpoint kept only next to its log (``<log>.ckpt``) proves nothing against whoever can
edit that directory: they can cut the tail of the log and the checkpoints together, or delete the
checkpoint file. So the writer also publishes every checkpoint to anchors elsewhere, and both the
writer (at open) and ``verify_log`` compare the log with them:

- ``WitnessFile``: an append-only JSONL file of checkpoints (one line per signed tree head) that an
  operator keeps on another volume, or that an auditor exports (``sealed audit witness``) and keeps.
  ``WitnessFile.update`` extends it RFC 6962-style: a newer tree head is added only after a
  consistency proof shows the older one is a prefix of it.
- ``SqlAnchor``: the same rows in a SQL database (PostgreSQL in fleet mode, the control plane's
  database), table ``sealed_audit_tree_heads``.

What an anchor catches: a log or checkpoint file cut back, deleted or rewritten after a checkpoint
reached the anchor. What it cannot: entries written after the last anchored checkpoint (at most
``checkpoint_every`` entries or ``checkpoint_interval_s``), and an attacker who controls both the
log's disk and the anchor.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from policy.audit.checkpoint import Checkpoint, checkpoint_from_json
from policy.audit.lines import json_object
from policy.audit.merkle import consistency_proof, verify_consistency
from policy.errors import AuditIntegrityError

log = logging.getLogger(__name__)


class CheckpointAnchor(Protocol):
    """Somewhere outside the log's directory that keeps its signed tree heads."""

    def publish(self, checkpoint: Checkpoint) -> None: ...

    def checkpoints(self, log_name: str) -> list[Checkpoint]: ...


class WitnessFile:
    """An append-only JSONL file of signed tree heads, for any number of logs."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> list[Checkpoint]:
        if not self.path.exists():
            return []
        out = []
        for index, line in enumerate(self.path.read_text(encoding="ascii", errors="replace").splitlines()):
            if not line.strip():
                continue
            raw = json_object(line, index, str(self.path), "witness line")
            out.append(checkpoint_from_json(raw, index, str(self.path)))
        return out

    def checkpoints(self, log_name: str) -> list[Checkpoint]:
        return [c for c in self.read() if c.log == log_name]

    def publish(self, checkpoint: Checkpoint) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (checkpoint.to_json() + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def update(self, latest: Iterable[tuple[Checkpoint, Sequence[bytes]]]) -> list[Checkpoint]:
        """Add each log's newest checkpoint after checking it extends what the witness holds.

        ``latest`` pairs a checkpoint with the log's leaves (entry hashes) up to at least its size,
        from which the RFC 6962 consistency proof is built. Raises AuditIntegrityError if a new
        tree head is not an extension of the witnessed one (a rewritten or forked log)."""
        added = []
        held = self.read()
        for ckpt, leaves in latest:
            known = [c for c in held if c.log == ckpt.log]
            newest = max(known, key=lambda c: c.tree_size, default=None)
            if newest is not None:
                if ckpt.tree_size < newest.tree_size:
                    raise AuditIntegrityError(ckpt.tree_size, f"log {ckpt.log} rolled back: the witness holds "
                                              f"a tree head of size {newest.tree_size}", str(self.path))
                if ckpt.tree_size == newest.tree_size:
                    if ckpt.root != newest.root:
                        raise AuditIntegrityError(ckpt.tree_size, f"log {ckpt.log} forked at size "
                                                  f"{ckpt.tree_size}", str(self.path))
                    continue
                proof = consistency_proof(list(leaves[:ckpt.tree_size]), newest.tree_size)
                if not verify_consistency(newest.tree_size, ckpt.tree_size, bytes.fromhex(newest.root),
                                          bytes.fromhex(ckpt.root), proof):
                    raise AuditIntegrityError(newest.tree_size, f"log {ckpt.log}: the new tree head does not "
                                              "extend the witnessed one (entries rewritten)", str(self.path))
            self.publish(ckpt)
            added.append(ckpt)
        return added


_DDL_LOCK_KEY = int.from_bytes(b"sealedTH", "big") & 0x7FFF_FFFF_FFFF_FFFF  # constant, not a secret


class SqlAnchor:
    """Signed tree heads in a SQL database (PostgreSQL in fleet mode; SQLite works for tests)."""

    def __init__(self, url: str) -> None:
        import sqlalchemy as sa  # only deployments with an anchor database need it

        self._sa = sa
        self._engine = sa.create_engine(url, pool_pre_ping=True)
        meta = sa.MetaData()
        self._table = sa.Table(
            "sealed_audit_tree_heads", meta,
            sa.Column("log", sa.String(200), primary_key=True),
            sa.Column("tree_size", sa.BigInteger, primary_key=True),
            sa.Column("component", sa.String(200), nullable=False),
            sa.Column("root", sa.String(64), nullable=False),
            sa.Column("last_hash", sa.String(64), nullable=False),
            sa.Column("ts", sa.String(40), nullable=False),
            sa.Column("sig", sa.String(200), nullable=False),
        )
        with self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Replicas start together: two `CREATE TABLE` racing past checkfirst collide on
                # pg_type's unique index and one gateway dies. A transaction-scoped advisory lock
                # makes the second wait and then see the table.
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _DDL_LOCK_KEY})
            meta.create_all(conn, checkfirst=True)

    def publish(self, checkpoint: Checkpoint) -> None:
        body = json.loads(checkpoint.to_json())
        row = {k: body[k] for k in ("log", "tree_size", "component", "root", "last_hash", "ts", "sig")}
        with self._engine.begin() as conn:
            existing = conn.execute(self._sa.select(self._table.c.root).where(
                self._table.c.log == row["log"], self._table.c.tree_size == row["tree_size"])).first()
            if existing is None:
                conn.execute(self._table.insert().values(**row))
            elif existing[0] != row["root"]:
                raise AuditIntegrityError(row["tree_size"], f"log {row['log']} forked: the anchor holds another "
                                          "root at this size", "sealed_audit_tree_heads")

    def checkpoints(self, log_name: str) -> list[Checkpoint]:
        t = self._table
        with self._engine.connect() as conn:
            rows = conn.execute(self._sa.select(t).where(t.c.log == log_name).order_by(t.c.tree_size)).mappings()
            return [checkpoint_from_json(dict(r)) for r in rows]

    def all(self) -> list[Checkpoint]:
        t = self._table
        with self._engine.connect() as conn:
            rows = conn.execute(self._sa.select(t).order_by(t.c.log, t.c.tree_size)).mappings()
            return [checkpoint_from_json(dict(r)) for r in rows]

    def close(self) -> None:
        self._engine.dispose()
