"""Verification of audit logs: chain, signatures, sequence and checkpoints.

Any edited, deleted, inserted or reordered entry breaks either its own hash, its signature, its
sequence number or the next entry's ``prev``; ``verify_log`` names the first entry where that
happens. A truncated tail is caught by the signed checkpoints (the log is shorter than one of
them). Only a torn final line with no newline, the signature of a crash mid-write, is tolerated,
and reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from policy.audit.checkpoint import Checkpoint, read_checkpoints
from policy.audit.entry import GENESIS, check_signature, entry_hash, parse_entry
from policy.audit.merkle import CompactRange, inclusion_proof
from policy.errors import AuditIntegrityError

LOG_GLOB = "*.audit.jsonl"


@dataclass(frozen=True)
class AuditVerifyReport:
    path: str
    component: str | None
    entries: int
    checkpoints: int
    head: str  # hash of the last entry (GENESIS when empty)
    root: str  # RFC 6962 root over all entries
    torn_tail: bool  # a crash left a partial final line (ignored, not an entry)


def verify_log(path: Path, public_keys: Mapping[str, Ed25519PublicKey]) -> AuditVerifyReport:
    """Verify one log file; raises AuditIntegrityError naming the first bad entry."""
    path = Path(path)
    where = str(path)
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    torn = end < len(data)
    lines = data[:end].splitlines()
    checkpoints = read_checkpoints(path)
    by_size: dict[int, list[int]] = {}
    for i, ck in enumerate(checkpoints):
        by_size.setdefault(ck.tree_size, []).append(i)
    crange = CompactRange()
    prev = GENESIS
    component: str | None = None
    for index, raw_line in enumerate(lines):
        try:
            entry, body = parse_entry(raw_line.decode("ascii"))
        except (ValueError, UnicodeDecodeError, KeyError) as exc:
            raise AuditIntegrityError(index, f"malformed entry: {exc}", where) from exc
        if component is None:
            component = entry.component
        elif entry.component != component:
            raise AuditIntegrityError(index, f"component {entry.component!r} in {component!r}'s log", where)
        if entry.seq != index:
            raise AuditIntegrityError(index, f"sequence {entry.seq} at position {index}", where)
        if entry.prev != prev:
            raise AuditIntegrityError(index, "previous-hash link broken (entry deleted, inserted "
                                      "or reordered before this one)", where)
        digest = entry_hash(body)
        if digest.hex() != entry.hash:
            raise AuditIntegrityError(index, "entry hash mismatch (entry edited)", where)
        key = public_keys.get(entry.component)
        if key is None:
            raise AuditIntegrityError(index, f"no public key for component {entry.component!r}", where)
        if not check_signature(entry, digest, key):
            raise AuditIntegrityError(index, "bad signature (not signed by the component's key)", where)
        crange.push(digest)
        prev = entry.hash
        for ck_index in by_size.get(crange.size, ()):
            _check_checkpoint_root(checkpoints[ck_index], crange.root(), prev, index, where)
    for ck in checkpoints:
        if component is not None and ck.component != component:
            raise AuditIntegrityError(len(lines), "checkpoint from another component", where)
        key = public_keys.get(ck.component)
        if key is None or not ck.verify_signature(key):
            raise AuditIntegrityError(min(ck.tree_size, len(lines)), "checkpoint signature invalid", where)
        if ck.tree_size > len(lines):
            raise AuditIntegrityError(len(lines), f"log truncated: a signed checkpoint covers "
                                      f"{ck.tree_size} entries but only {len(lines)} remain", where)
    return AuditVerifyReport(where, component, len(lines), len(checkpoints), prev,
                             crange.root().hex(), torn)


def _check_checkpoint_root(ck: Checkpoint, root: bytes, head: str, index: int, where: str) -> None:
    if ck.root != root.hex() or ck.last_hash != head:
        # The chain verified but the tree does not: entries up to here were rewritten and
        # re-signed with the real key after the checkpoint was published.
        raise AuditIntegrityError(index, f"entries 0..{index} differ from the signed checkpoint "
                                  f"at size {ck.tree_size}", where)


def log_files(directory: Path) -> list[Path]:
    """The audit logs in a shared audit directory (one per component process)."""
    return sorted(Path(directory).glob(LOG_GLOB))


def verify_dir(directory: Path, public_keys: Mapping[str, Ed25519PublicKey]) -> list[AuditVerifyReport]:
    """Verify every log in ``directory``; raises on the first bad file (error names the file)."""
    return [verify_log(path, public_keys) for path in log_files(directory)]


def entry_hashes(path: Path) -> list[bytes]:
    """The leaf data (entry hashes) of a log, in order; a torn final line is skipped."""
    data = Path(path).read_bytes()
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    return [bytes.fromhex(parse_entry(line.decode("ascii"))[0].hash) for line in lines]


def prove_inclusion(path: Path, index: int, tree_size: int) -> list[str]:
    """RFC 6962 audit path (hex) proving entry ``index`` is in the first ``tree_size`` entries,
    to check against a checkpoint an auditor already holds (``merkle.verify_inclusion``)."""
    leaves = entry_hashes(path)
    if tree_size > len(leaves):
        raise AuditIntegrityError(len(leaves), f"log has fewer than {tree_size} entries", str(path))
    return [p.hex() for p in inclusion_proof(leaves[:tree_size], index)]
