"""Signed checkpoints: a component's signature over the Merkle root of its first N entries.

Published periodically next to the log (``<log>.ckpt``, one JSON object per line). A checkpoint
lets an auditor who fetched it earlier prove later that the log was not truncated or rewritten,
even by someone who can re-sign entries, and lets a single entry be proved with an audit path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from policy.audit.entry import canonical, format_ts, parse_ts
from policy.audit.lines import field, hex64, json_object
from policy.errors import AuditIntegrityError

_DOMAIN = b"sealed-audit-checkpoint-v1\x00"


def checkpoint_path(log_path: Path) -> Path:
    # A suffix the log glob (*.audit.jsonl) does not match, so checkpoints are never read as entries.
    return log_path.with_name(log_path.name + ".ckpt")


@dataclass(frozen=True)
class Checkpoint:
    component: str
    log: str  # file name of the log it covers
    tree_size: int
    root: str  # hex RFC 6962 root over the first tree_size entry hashes
    last_hash: str  # hash of entry tree_size - 1 (chain head), or GENESIS
    ts: datetime
    sig: str

    def body(self) -> dict[str, Any]:
        return {"v": 1, "component": self.component, "log": self.log, "tree_size": self.tree_size,
                "root": self.root, "last_hash": self.last_hash, "ts": format_ts(self.ts)}

    def digest(self) -> bytes:
        return hashlib.sha256(_DOMAIN + canonical(self.body())).digest()

    def verify_signature(self, key: Ed25519PublicKey) -> bool:
        try:
            key.verify(bytes.fromhex(self.sig), self.digest())
        except (InvalidSignature, ValueError):
            return False
        return True

    def to_json(self) -> str:
        return canonical({**self.body(), "sig": self.sig}).decode("ascii")


def sign_checkpoint(signer: Ed25519PrivateKey, *, component: str, log: str, tree_size: int,
                    root: bytes, last_hash: str, ts: datetime) -> Checkpoint:
    draft = Checkpoint(component, log, tree_size, root.hex(), last_hash, ts, "")
    return Checkpoint(component, log, tree_size, root.hex(), last_hash, ts,
                      signer.sign(draft.digest()).hex())


def read_checkpoints(log_path: Path) -> list[Checkpoint]:
    """All published checkpoints of a log, oldest first (a torn last line is ignored)."""
    path = checkpoint_path(log_path)
    if not path.exists():
        return []
    out: list[Checkpoint] = []
    text = path.read_text(encoding="ascii", errors="replace")
    for index, line in enumerate(text.splitlines(keepends=True)):
        if not line.endswith("\n"):
            break  # torn by a crash mid-write; the previous checkpoint still stands
        out.append(checkpoint_from_json(json_object(line, index, str(path), "checkpoint"), index, str(path)))
    return out


def checkpoint_from_json(raw: dict[str, Any], index: int = 0, path: str | None = None) -> Checkpoint:
    """A checkpoint from its JSON object (a .ckpt line, a witness line, an anchor row), every field
    checked; raises AuditIntegrityError naming line `index` of `path`."""
    what = "checkpoint"
    text = {k: field(raw, k, str, index, path, what) for k in ("component", "log", "last_hash", "ts", "sig")}
    tree_size = field(raw, "tree_size", int, index, path, what)
    if tree_size < 0:
        raise AuditIntegrityError(index, "malformed checkpoint: negative tree_size", path)
    try:
        ts = parse_ts(text["ts"])
    except ValueError as exc:
        raise AuditIntegrityError(index, f"malformed checkpoint: {exc}", path) from None
    return Checkpoint(text["component"], text["log"], tree_size, hex64(raw, "root", index, path, what),
                      text["last_hash"], ts, text["sig"])


def latest_checkpoint(log_path: Path) -> Checkpoint | None:
    """The most recent checkpoint, what an auditor fetches and keeps."""
    checkpoints = read_checkpoints(log_path)
    return checkpoints[-1] if checkpoints else None
