"""Finding 6 (#13): the audit log could lose entries or a tail without notice.

- Replacing the log file (`sed -i`) made the writer append to the deleted inode: entries lost.
- Truncating the tail together with its checkpoints, or deleting the `.ckpt` file, made
  `sealed audit verify` say ok.
Now every append checks that the path still names the writer's file at the length it wrote; the
writer publishes checkpoints to anchors outside the directory (a witness file, PostgreSQL), checks
them when it reopens a log, and `verify` compares the log and its checkpoint file with them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from typer.testing import CliRunner

from api.cli.audit import build as build_audit_cli
from attestation.bundle import RuntimeData
from policy.audit import AuditLog, SqlAnchor, WitnessFile, checkpoint_path, entry_hashes, latest_checkpoint, verify_log
from policy.audit.merkle import consistency_proof, merkle_root, verify_consistency
from policy.errors import AuditIntegrityError
from protocol.broker.sealing import raw_public_key
from tests.api.fleet import postgres_database
from tests.key_broker.conftest import Clock, Harness

KEY = Ed25519PrivateKey.generate()
KEYS = {"gateway": KEY.public_key()}


def _fill(log: AuditLog, n: int) -> None:
    for i in range(n):
        log.append(tenant="acme", action="admission", decision="allow", metadata={"i": i})


@pytest.fixture()
def audit_dir(tmp_path: Path) -> Path:
    d = tmp_path / "audit"
    (d / "keys").mkdir(parents=True)
    from cryptography.hazmat.primitives import serialization

    (d / "keys" / "gateway.pem").write_bytes(KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return d


def test_replaced_log_file_is_detected_on_the_next_append(audit_dir: Path) -> None:
    path = audit_dir / "gateway.audit.jsonl"
    log = AuditLog(path, KEY, "gateway")
    try:
        _fill(log, 3)
        # What `sed -i` does: write a copy, rename it over the original.
        subprocess.run(["sed", "-i", "s/admission/admissioN/", str(path)], check=True)
        with pytest.raises(AuditIntegrityError, match="replaced"):
            log.append(tenant="acme", action="admission", decision="deny")
        with pytest.raises(AuditIntegrityError):  # and it stays refused: nothing goes to the old inode
            log.append(tenant="acme", action="admission", decision="deny")
    finally:
        log.close()


@pytest.mark.parametrize("how", ["truncate", "append", "delete"])
def test_truncated_appended_or_deleted_log_is_detected(audit_dir: Path, how: str) -> None:
    path = audit_dir / "gateway.audit.jsonl"
    log = AuditLog(path, KEY, "gateway")
    try:
        _fill(log, 4)
        if how == "truncate":
            os.truncate(path, path.stat().st_size // 2)
        elif how == "append":
            with open(path, "a") as fh:
                fh.write('{"forged": 1}\n')
        else:
            path.unlink()
        with pytest.raises(AuditIntegrityError):
            log.append(tenant="acme", action="admission", decision="deny")
    finally:
        log.close()


def _cut(path: Path, keep: int) -> None:
    """Truncate the log to ``keep`` entries and drop every checkpoint beyond them (a careful attacker)."""
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:keep]))
    ck = checkpoint_path(path)
    kept = [line for line in ck.read_text().splitlines(keepends=True) if f'"tree_size":{keep}' in line
            or int(line.split('"tree_size":')[1].split(",")[0].rstrip("}")) <= keep]
    ck.write_text("".join(kept))


def test_tail_cut_with_its_checkpoints_is_caught_by_the_witness(audit_dir: Path, tmp_path: Path) -> None:
    path = audit_dir / "gateway.audit.jsonl"
    witness = WitnessFile(tmp_path / "elsewhere" / "witness.jsonl")
    with AuditLog(path, KEY, "gateway", anchors=[witness]) as log:
        for _ in range(4):
            _fill(log, 5)
            log.checkpoint()
    _cut(path, 10)
    assert verify_log(path, KEYS).entries == 10  # locally consistent: the attack the finding describes
    with pytest.raises(AuditIntegrityError, match="truncated"):
        verify_log(path, KEYS, witness.read())
    runner = CliRunner()
    ok = runner.invoke(build_audit_cli(), ["verify", "--dir", str(audit_dir)])
    assert ok.exit_code == 0 and "no external anchor" in ok.output
    bad = runner.invoke(build_audit_cli(), ["verify", "--dir", str(audit_dir), "--witness", str(witness.path)])
    assert bad.exit_code == 1 and "truncated" in bad.output
    with pytest.raises(AuditIntegrityError, match="truncated"):  # the writer will not continue it either
        AuditLog(path, KEY, "gateway", anchors=[witness])


def test_deleted_or_rolled_back_checkpoint_file_is_reported(audit_dir: Path, tmp_path: Path) -> None:
    path = audit_dir / "gateway.audit.jsonl"
    witness = WitnessFile(tmp_path / "elsewhere" / "witness.jsonl")
    with AuditLog(path, KEY, "gateway", anchors=[witness]) as log:
        _fill(log, 5)
        log.checkpoint()
        _fill(log, 7)
    saved = checkpoint_path(path).read_text()
    checkpoint_path(path).unlink()
    report = verify_log(path, KEYS)
    assert any("no checkpoint" in w for w in report.warnings)  # without an anchor: a loud warning
    strict = CliRunner().invoke(build_audit_cli(), ["verify", "--dir", str(audit_dir), "--strict"])
    assert strict.exit_code == 2
    with pytest.raises(AuditIntegrityError, match="lost checkpoints"):
        verify_log(path, KEYS, witness.read())
    checkpoint_path(path).write_text("".join(saved.splitlines(keepends=True)[:1]))  # rolled back
    with pytest.raises(AuditIntegrityError, match="lost checkpoints"):
        verify_log(path, KEYS, witness.read())


def test_checkpoint_file_deleted_under_a_running_writer_stops_it(audit_dir: Path) -> None:
    path = audit_dir / "gateway.audit.jsonl"
    log = AuditLog(path, KEY, "gateway", checkpoint_every=2, batch_max=1)
    try:
        _fill(log, 2)
        log.checkpoint()
        checkpoint_path(path).unlink()
        log.append(tenant="acme", action="a", decision="allow")
        log.checkpoint()  # notices the missing checkpoint file, publishes nothing over it
        with pytest.raises(AuditIntegrityError, match="checkpoint file"):
            log.append(tenant="acme", action="a", decision="allow")
    finally:
        log.close()


def test_witness_extends_only_by_consistency_proof(audit_dir: Path, tmp_path: Path) -> None:
    path = audit_dir / "gateway.audit.jsonl"
    with AuditLog(path, KEY, "gateway") as log:
        _fill(log, 7)
    witness = WitnessFile(tmp_path / "w.jsonl")
    runner = CliRunner()
    assert runner.invoke(build_audit_cli(), ["witness", str(witness.path), "--dir", str(audit_dir)]).exit_code == 0
    with AuditLog(path, KEY, "gateway") as log:
        _fill(log, 6)
    r = runner.invoke(build_audit_cli(), ["witness", str(witness.path), "--dir", str(audit_dir)])
    assert r.exit_code == 0 and "size 13" in r.output
    old, new = witness.read()[0], witness.read()[-1]
    leaves = entry_hashes(path)
    assert verify_consistency(7, 13, bytes.fromhex(old.root), bytes.fromhex(new.root), consistency_proof(leaves, 7))
    # Someone holding the signing key rewrites history and re-signs everything: the witness refuses it.
    shutil.rmtree(audit_dir / "gateway.audit.jsonl", ignore_errors=True)
    path.unlink()
    checkpoint_path(path).unlink()
    with AuditLog(path, KEY, "gateway") as log:
        for i in range(14):
            log.append(tenant="acme", action="admission", decision="deny", metadata={"i": i})
    r = runner.invoke(build_audit_cli(), ["witness", str(witness.path), "--dir", str(audit_dir)])
    assert r.exit_code == 1 and "INVALID" in r.output


@pytest.mark.parametrize("n", range(1, 18))
def test_consistency_proofs_match_rfc6962(n: int) -> None:
    leaves = [bytes([i]) * 32 for i in range(n)]
    for m in range(n + 1):
        proof = consistency_proof(leaves, m)
        assert verify_consistency(m, n, merkle_root(leaves[:m]), merkle_root(leaves), proof)
        if 0 < m < n:
            assert not verify_consistency(m, n, merkle_root(leaves[1:m + 1]), merkle_root(leaves), proof)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    yield from postgres_database()


def test_fleet_tree_heads_in_postgresql_catch_a_cut_log(audit_dir: Path, pg_url: str) -> None:
    anchor = SqlAnchor(pg_url)
    path = audit_dir / f"gateway-{uuid.uuid4().hex[:8]}.audit.jsonl"
    try:
        with AuditLog(path, KEY, "gateway", anchors=[anchor]) as log:
            _fill(log, 4)
            log.checkpoint()
            _fill(log, 5)
        held = anchor.checkpoints(path.name)
        assert held and held[-1].tree_size == 9 and held[-1].root == latest_checkpoint(path).root  # type: ignore[union-attr]
        _cut(path, 4)
        with pytest.raises(AuditIntegrityError, match="truncated"):
            AuditLog(path, KEY, "gateway", anchors=[anchor])
        r = CliRunner().invoke(build_audit_cli(), ["verify", "--dir", str(audit_dir), "--anchor-url", pg_url])
        assert r.exit_code == 1 and "truncated" in r.output
    finally:
        anchor.close()


def test_broker_refuses_service_when_its_audit_log_was_replaced(tmp_path: Path) -> None:
    kb = Harness(tmp_path / "kb", Clock())
    try:
        path = kb.settings.data_dir.parent / "audit" / "key-broker.audit.jsonl"

        def attest_unknown_session() -> int:
            runtime = RuntimeData(b"\0" * 32, raw_public_key(X25519PrivateKey.generate()))
            return kb.client.post("/v1/attest", json={
                "session_id": "nope", "tenant": "acme", "model": "m", "version": "v1",
                "evidence": kb.bundle(runtime).to_json()}).status_code

        assert attest_unknown_session() == 403
        before = path.read_bytes()
        assert before
        shutil.copy(path, tmp_path / "copy")
        os.replace(tmp_path / "copy", path)  # like sed -i
        assert attest_unknown_session() == 503  # refused loudly: no decision without its record
        assert kb.client.post("/v1/challenge").status_code == 200  # (no decision is recorded for a nonce)
        assert attest_unknown_session() == 503
        assert path.read_bytes() == before
    finally:
        kb.close()


def test_cli_imports_stay_light() -> None:
    # `sealed audit verify` must not pull SQLAlchemy unless --anchor-url is given (lazy CLI).
    code = "import sys; import api.cli.audit; print('sqlalchemy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ})
    assert out.stdout.strip() == "False"


def test_replicas_opening_the_anchor_together_on_a_fresh_database_all_start() -> None:
    # Two gateways starting at once raced `CREATE TABLE` (pg_type unique violation) and one died.
    import threading

    database = postgres_database()
    url = next(database)  # a database of its own: the table must not exist yet
    anchors: list[SqlAnchor] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def open_anchor() -> None:
        start.wait()
        try:
            anchors.append(SqlAnchor(url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_anchor) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == [] and len(anchors) == 6
        assert anchors[0].all() == []
    finally:
        for a in anchors:
            a.close()
        next(database, None)  # runs the generator on: it drops the database
