"""`sealed audit verify|export|witness|decisions`: check the tamper-evident audit log, export a tenant's entries."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import typer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from api.cli.audit_decisions import decisions
from api.cli.audit_forward import forward
from api.home import Home, default_home
from policy.audit import (
    Checkpoint,
    SqlAnchor,
    WitnessFile,
    entry_hashes,
    export_jsonl,
    latest_checkpoint,
    log_files,
    verify_dir,
)
from policy.errors import AuditIntegrityError


def _audit_dir(home: Path | None, directory: Path | None) -> Path:
    return directory or Home(home or default_home()).audit


def load_component_keys(keys_dir: Path) -> dict[str, Ed25519PublicKey]:
    keys: dict[str, Ed25519PublicKey] = {}
    for path in sorted(keys_dir.glob("*.pem")):
        key = serialization.load_pem_public_key(path.read_bytes())
        if isinstance(key, Ed25519PublicKey):
            keys[path.stem] = key
    return keys


def _anchored(witness: list[Path] | None, anchor_url: str | None) -> list[Checkpoint]:
    out: list[Checkpoint] = []
    for path in witness or []:
        if not path.exists():
            raise typer.BadParameter(f"witness file {path} does not exist")
        out += WitnessFile(path).read()
    if anchor_url:
        anchor = SqlAnchor(anchor_url)
        try:
            out += anchor.all()
        finally:
            anchor.close()
    return out


def verify(
    home: Path = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)"),
    directory: Path = typer.Option(None, "--dir", help="audit directory (default HOME/audit)"),
    keys: Path = typer.Option(None, help="directory of pinned component public keys (default DIR/keys)"),
    witness: list[Path] = typer.Option(None, "--witness", help="witness file(s) of signed tree heads kept "
                                       "elsewhere (`sealed audit witness`); repeatable"),
    anchor_url: str = typer.Option(None, "--anchor-url", help="database holding anchored tree heads "
                                   "(fleet mode: the control plane's PostgreSQL URL)"),
    strict: bool = typer.Option(False, help="also fail on warnings (no checkpoint, no anchor checked)"),
) -> None:
    """Verify every log: exit 1 naming the first edited, deleted, inserted or reordered entry, a
    truncated log, or checkpoints missing or rolled back against a witness or the anchor database."""
    audit_dir = _audit_dir(home, directory)
    try:
        reports = verify_dir(audit_dir, load_component_keys(keys or audit_dir / "keys"),
                             _anchored(witness, anchor_url))
    except AuditIntegrityError as exc:
        typer.echo(f"audit log INVALID: {exc}", err=True)
        raise typer.Exit(1) from exc
    warnings = [w for r in reports for w in r.warnings]
    for r in reports:
        typer.echo(f"ok {r.path}: {r.entries} entries, {r.checkpoints} checkpoints, {r.anchored} anchored, "
                   f"root {r.root[:16]}..." + (" (torn tail ignored)" if r.torn_tail else ""))
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    if not reports:
        typer.echo(f"no audit logs in {audit_dir}", err=True)
    if strict and warnings:
        raise typer.Exit(2)


def witness_update(
    out: Path = typer.Argument(..., help="witness file to extend (created when absent); keep it elsewhere"),
    home: Path = typer.Option(None),
    directory: Path = typer.Option(None, "--dir"),
    keys: Path = typer.Option(None, help="directory of pinned component public keys (default DIR/keys)"),
) -> None:
    """Add each log's latest signed tree head to a witness file, after verifying the log and an
    RFC 6962 consistency proof from the tree head the witness already holds."""
    audit_dir = _audit_dir(home, directory)
    target = WitnessFile(out)
    try:
        verify_dir(audit_dir, load_component_keys(keys or audit_dir / "keys"), target.read())
        latest = [(ck, entry_hashes(path)) for path in log_files(audit_dir)
                  if (ck := latest_checkpoint(path)) is not None]
        added = target.update(latest)
    except AuditIntegrityError as exc:
        typer.echo(f"audit log INVALID: {exc}", err=True)
        raise typer.Exit(1) from exc
    for ck in added:
        typer.echo(f"witnessed {ck.log}: size {ck.tree_size}, root {ck.root[:16]}...")


def export(
    tenant: str = typer.Option(..., help="tenant whose entries to export (an auditor sees only its own)"),
    since: str = typer.Option(None, help="ISO 8601 lower bound"),
    fmt: str = typer.Option("jsonl", "--format", help="jsonl"),
    home: Path = typer.Option(None),
    directory: Path = typer.Option(None, "--dir"),
    component: str = typer.Option(None),
    decision: str = typer.Option(None),
) -> None:
    """Export a tenant's audit entries as JSONL on stdout."""
    if fmt != "jsonl":
        raise typer.BadParameter("only --format jsonl is supported")
    moment = dt.datetime.fromisoformat(since.replace("Z", "+00:00")) if since else None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    sys.stdout.write(export_jsonl(_audit_dir(home, directory), tenant=tenant, since=moment,
                                  component=component, decision=decision))


def build() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, help="Tamper-evident audit log.")
    app.command("verify")(verify)
    app.command("export")(export)
    app.command("witness")(witness_update)
    app.command("decisions")(decisions)
    app.command("forward")(forward)
    return app
