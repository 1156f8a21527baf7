"""Verification of audit logs: chain, signatures, sequence and checkpoints.

Any edited, deleted, inserted or reordered entry breaks either its own hash, its signature, its
sequence number or the next entry's ``prev``; ``verify_log`` names the first entry where that
happens. A truncated tail is caught by the signed checkpoints (the log is shorter than one of
them). Only a torn final line with no newline, the signature of a crash mid-write, is tolerated,
and reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    uncheckpointed: int = 0  # entries after the last local checkpoint (no signed tree head covers them)
    anchored: int = 0  # external checkpoints (witness file, database) checked against the log

    @property
    def warnings(self) -> list[str]:
        """What an auditor should know though nothing failed: without an anchor, a log whose
        checkpoints are missing cannot be told from one cut back together with its checkpoints."""
        out = []
        if self.entries and not self.checkpoints:
            out.append(f"{self.path}: no checkpoint at all covers its {self.entries} entries (checkpoint "
                       "file missing?); check against a witness (--witness) to detect truncation")
        elif self.uncheckpointed:
            out.append(f"{self.path}: {self.uncheckpointed} entries after the last checkpoint")
        if not self.anchored and self.entries:
            out.append(f"{self.path}: no external anchor checked; truncation together with the checkpoint "
                       "file is not detectable without one")
        return out


def verify_log(path: Path, public_keys: Mapping[str, Ed25519PublicKey],
               anchored: Sequence[Checkpoint] = ()) -> AuditVerifyReport:
    """Verify one log file; raises AuditIntegrityError naming the first bad entry.

    ``anchored``: checkpoints kept outside the log's directory (a witness file, the anchor
    database); those of this log must verify, be covered by the log (else it was truncated), match
    its entries (else rewritten) and be present in its checkpoint file (else that file lost
    checkpoints: deleted or rolled back)."""
    path = Path(path)
    where = str(path)
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    torn = end < len(data)
    lines = data[:end].splitlines()
    checkpoints = read_checkpoints(path)
    external = [c for c in anchored if c.log == path.name]
    by_size: dict[int, list[int]] = {}
    for i, ck in enumerate([*checkpoints, *external]):
        by_size.setdefault(ck.tree_size, []).append(i)
    every = [*checkpoints, *external]
    crange = CompactRange()
    prev = GENESIS
    component: str | None = None
    for index, raw_line in enumerate(lines):
        entry, body = parse_entry(raw_line, index, where)
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
            _check_checkpoint_root(every[ck_index], crange.root(), prev, index, where)
    for ck in every:
        if component is not None and ck.component != component:
            raise AuditIntegrityError(len(lines), "checkpoint from another component", where)
        key = public_keys.get(ck.component)
        if key is None or not ck.verify_signature(key):
            raise AuditIntegrityError(min(ck.tree_size, len(lines)), "checkpoint signature invalid", where)
        if ck.tree_size > len(lines):
            raise AuditIntegrityError(len(lines), f"log truncated: a signed checkpoint covers "
                                      f"{ck.tree_size} entries but only {len(lines)} remain", where)
    local_max = max((c.tree_size for c in checkpoints), default=0)
    for ck in external:
        if ck.tree_size > local_max:
            raise AuditIntegrityError(ck.tree_size, f"checkpoint file lost checkpoints: the anchor holds one at size "
                                      f"{ck.tree_size}, the file's last is {local_max} (deleted or rolled back)",
                                      where)
    return AuditVerifyReport(where, component, len(lines), len(checkpoints), prev,
                             crange.root().hex(), torn, len(lines) - local_max, len(external))


def _check_checkpoint_root(ck: Checkpoint, root: bytes, head: str, index: int, where: str) -> None:
    if ck.root != root.hex() or ck.last_hash != head:
        # The chain verified but the tree does not: entries up to here were rewritten and
        # re-signed with the real key after the checkpoint was published.
        raise AuditIntegrityError(index, f"entries 0..{index} differ from the signed checkpoint "
                                  f"at size {ck.tree_size}", where)


def log_files(directory: Path) -> list[Path]:
    """The audit logs in a shared audit directory (one per component process)."""
    return sorted(Path(directory).glob(LOG_GLOB))


def verify_dir(directory: Path, public_keys: Mapping[str, Ed25519PublicKey],
               anchored: Sequence[Checkpoint] = ()) -> list[AuditVerifyReport]:
    """Verify every log in ``directory``; raises on the first bad file (error names the file).
    A log that an anchored checkpoint names but that is gone from the directory is an error too."""
    files = log_files(directory)
    names = {p.name for p in files}
    for ck in anchored:
        if ck.log not in names:
            raise AuditIntegrityError(0, f"log {ck.log} has anchored checkpoints but is missing", str(directory))
    return [verify_log(path, public_keys, anchored) for path in files]


def entry_hashes(path: Path) -> list[bytes]:
    """The leaf data (entry hashes) of a log, in order; a torn final line is skipped."""
    data = Path(path).read_bytes()
    lines = data[: data.rfind(b"\n") + 1].splitlines()
    return [bytes.fromhex(parse_entry(line, i, str(path))[0].hash) for i, line in enumerate(lines)]


def prove_inclusion(path: Path, index: int, tree_size: int) -> list[str]:
    """RFC 6962 audit path (hex) proving entry ``index`` is in the first ``tree_size`` entries,
    to check against a checkpoint an auditor already holds (``merkle.verify_inclusion``)."""
    leaves = entry_hashes(path)
    if tree_size > len(leaves):
        raise AuditIntegrityError(len(leaves), f"log has fewer than {tree_size} entries", str(path))
    return [p.hex() for p in inclusion_proof(leaves[:tree_size], index)]
