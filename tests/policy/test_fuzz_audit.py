"""Hypothesis over audit log files as an auditor or a restarted component reads them: mutated real
logs, checkpoint files and witness files raise only PolicyError (AuditIntegrityError), never a crash."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given

from policy.audit import AuditLog, WitnessFile, read_checkpoints, read_entries, verify_log
from policy.audit.entry import parse_entry
from policy.audit.verify import entry_hashes
from policy.errors import AuditIntegrityError, PolicyError
from tests.fuzzing import DEEP_JSON, budget, mutated

KEY = Ed25519PrivateKey.generate()
KEYS = {"gateway": KEY.public_key()}
NAME = "gateway.audit.jsonl"


def _real_log() -> tuple[bytes, bytes]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / NAME
        with AuditLog(path, KEY, "gateway") as log:
            for i in range(3):
                log.append(tenant="acme", action="admission", decision="allow" if i else "deny",
                           reason=f"r{i}", metadata={"n": i, "rule": "pii"})
        return path.read_bytes(), (path.parent / (NAME + ".ckpt")).read_bytes()


LOG, CHECKPOINTS = _real_log()


def _read_everything(log: bytes, checkpoints: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / NAME
        path.write_bytes(log)
        (path.parent / (NAME + ".ckpt")).write_bytes(checkpoints)
        (path.parent / "witness.jsonl").write_bytes(checkpoints)
        for read in (lambda: verify_log(path, KEYS), lambda: list(read_entries(path)),
                     lambda: entry_hashes(path), lambda: read_checkpoints(path),
                     lambda: WitnessFile(path.parent / "witness.jsonl").read()):
            with contextlib.suppress(PolicyError):
                read()
        for line in log.splitlines():
            with contextlib.suppress(PolicyError):
                parse_entry(line.decode("ascii", errors="replace"))
        with contextlib.suppress(PolicyError), AuditLog(path, KEY, "gateway"):
            pass  # a restart recovers the chain from the file


@budget(300)
@given(mutated([LOG, *DEEP_JSON]))
def test_fuzz_audit_log_lines(log: bytes) -> None:
    _read_everything(log, CHECKPOINTS)


@budget(200)
@given(mutated([CHECKPOINTS, *DEEP_JSON]))
def test_fuzz_checkpoint_and_witness_lines(checkpoints: bytes) -> None:
    _read_everything(LOG, checkpoints)


def _line_with(old: bytes, new: bytes) -> bytes:
    first, rest = LOG.split(b"\n", 1)
    assert old in first
    return first.replace(old, new, 1) + b"\n" + rest


@pytest.mark.parametrize(("log", "reason"), [
    (DEEP_JSON[0] + b"\n", "malformed entry"),  # RecursionError from json
    (_line_with(b'"n":0', b'"n":NaN'), "NaN is not JSON"),  # canonical() refuses NaN when hashing
    (_line_with(b'"n":0', b'"n":1e999'), "out of range"),  # parses as inf, which canonical() refuses
    (_line_with(b'"seq":0', b'"seq":"0"'), "seq missing or not int"),
    (_line_with(b'"ts":"', b'"ts":1,"x":"'), "unexpected or missing"),
    (b"\xff\n", "malformed entry"),
])
def test_malformed_lines_are_integrity_errors(log: bytes, reason: str, tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_bytes(log)
    with pytest.raises(AuditIntegrityError, match=reason):
        verify_log(path, KEYS)


def test_malformed_checkpoint_lines_are_integrity_errors(tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_bytes(LOG)
    for bad in (DEEP_JSON[1] + b"\n", CHECKPOINTS.replace(b'"tree_size":', b'"tree_size":-', 1),
                CHECKPOINTS.replace(b'"root":"', b'"root":"zz', 1)):
        (tmp_path / (NAME + ".ckpt")).write_bytes(bad)
        with pytest.raises(AuditIntegrityError, match="malformed checkpoint"):
            read_checkpoints(path)
