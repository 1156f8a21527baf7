"""`sealed audit decisions`: the tenant opens what workers decided about its sealed requests."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from api.home import Home, default_home
from api.tenant_audit import load_decision_key, read_sealed_decisions


def decisions(
    key: Path = typer.Option(..., help="the tenant's decision-record private key (X25519 PEM; `sealed up`: "
                                       "HOME/tenants/<tenant>/decision-record.pem)"),
    tenant: str = typer.Option("demo", help="the tenant whose records to open"),
    home: Path = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)"),
    directory: Path = typer.Option(None, "--dir", help="audit directory (default HOME/audit)"),
    worker_key: list[str] = typer.Option(None, "--worker-key", help="accept only records signed by this worker "
                                         "usage key (hex, as `sealed verify` shows it attested); repeatable"),
    as_json: bool = typer.Option(False, "--json", help="one JSON document instead of lines"),
) -> None:
    """Decrypt the sealed decision records in the audit log, verify each worker's signature and
    report gaps in each worker's sequence. Exit 1 if a record does not open or verify (or a worker
    signed two different records with one number), 2 if records are missing."""
    audit_dir = directory or Home(home or default_home()).audit
    try:
        private = load_decision_key(key)
    except (OSError, ValueError) as exc:
        typer.echo(f"sealed audit decisions: {exc}", err=True)
        raise typer.Exit(1) from None
    report = read_sealed_decisions(audit_dir, tenant, private, frozenset(worker_key or ()))
    if as_json:
        typer.echo(json.dumps({
            "records": [r.to_dict() for r in report.records],
            "invalid": [vars(i) for i in report.invalid], "gaps": [vars(g) for g in report.gaps],
            "conflicts": [list(c) for c in report.conflicts]}, sort_keys=True))
    else:
        for r in report.records:
            said = "; ".join(f"{d['action']} {d['decision']} rule {d['rule']} (policy {d['policy_id']} "
                             f"v{d['policy_version']}, {d['request_id']})" for d in r.decisions) or "no decisions"
            more = f"; {r.omitted} more not recorded (record full)" if r.omitted else ""
            typer.echo(f"{r.worker_id} boot {r.boot_id} #{r.seq} request {r.request_id}: {said}{more}")
        for i in report.invalid:
            typer.echo(f"INVALID audit entry {i.log_seq} (worker {i.worker_id}): {i.reason}", err=True)
        for worker_id, seq in report.conflicts:
            typer.echo(f"CONFLICT {worker_id} #{seq}: two different records signed with one number", err=True)
        for g in report.gaps:
            typer.echo(f"GAP {g.worker_id} boot {g.boot_id}: records {', '.join(map(str, g.missing))} missing",
                       err=True)
    if not worker_key:
        typer.echo("warning: worker keys not pinned (--worker-key): records are checked against the keys the "
                   "audit entries name", err=True)
    if report.invalid or report.conflicts:
        raise typer.Exit(1)
    if report.gaps:
        raise typer.Exit(2)
