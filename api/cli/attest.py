"""`sealed attest verify|inspect`: check real TEE evidence offline, with an explicit clock."""

from __future__ import annotations

import datetime as dt
import importlib
import json
from pathlib import Path
from typing import Any

import typer

from api.errors import SealedApiError
from attestation.cli_request import VerifyRequest
from attestation.errors import AttestationError, PolicyViolation

TEES = ("snp", "tdx", "nvgpu")


def _cli_module(tee: str) -> Any:
    if tee not in TEES:
        raise typer.BadParameter(f"--tee must be one of {', '.join(TEES)}")
    return importlib.import_module(f"attestation.{tee}.cli")


class _BadOption(SealedApiError, ValueError):
    """A value the command line gave that cannot be used: one line, exit 2, before anything is read."""


def _parse_time(at: str | None) -> dt.datetime:
    if at is None:
        return dt.datetime.now(dt.UTC)
    try:
        moment = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        raise _BadOption(f"--at must be an ISO 8601 time (e.g. 2025-10-01T00:00:00Z), not {at!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _parse_nonce(nonce: str | None) -> bytes | None:
    if not nonce:
        return None
    try:
        return bytes.fromhex(nonce)
    except ValueError:
        raise _BadOption(f"--nonce must be hex (the expected REPORT_DATA), not {nonce!r}") from None


def verify(
    tee: str = typer.Option(..., help="snp | tdx | nvgpu"),
    evidence: Path = typer.Option(..., exists=True, help="report / quote / GPU evidence file"),
    cert: list[Path] = typer.Option([], help="certificate files (VCEK/VLEK, chains); repeatable"),
    collateral: list[Path] = typer.Option([], help="tcbInfo, qeIdentity, CRLs, RIMs; recognised by content"),
    roots: Path = typer.Option(None, help="directory of pinned roots (default: shipped roots)"),
    nonce: str = typer.Option(None, help="expected nonce / REPORT_DATA, hex"),
    at: str = typer.Option(None, help="verification time, ISO 8601 (default: now)"),
    policy: Path = typer.Option(None, exists=True, help="appraisal policy JSON"),
    no_collateral: bool = typer.Option(False, "--no-collateral", help="signatures and chains only"),
    as_json: bool = typer.Option(False, "--json", help="print the parsed claims as JSON"),
) -> None:
    """Verify evidence: exit 0 when verified, non-zero with the reasons when not."""
    module = _cli_module(tee)
    try:
        expected_nonce, moment = _parse_nonce(nonce), _parse_time(at)
    except _BadOption as exc:
        typer.echo(f"sealed attest verify: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        claims = module.verify_for_cli(VerifyRequest(
            evidence.read_bytes(), [c.read_bytes() for c in cert], [c.read_bytes() for c in collateral],
            roots, expected_nonce, moment, json.loads(policy.read_text()) if policy else None, not no_collateral,
        ))
    except PolicyViolation as exc:
        for violation in exc.violations:
            typer.echo(f"policy violation: {violation}", err=True)
        raise typer.Exit(2) from exc
    except AttestationError as exc:
        typer.echo(f"NOT verified: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from exc
    claims = uniform_claims(claims, moment if at else None)
    if as_json:
        typer.echo(json.dumps(claims, indent=2, sort_keys=True, default=str))
    else:
        typer.echo(f"verified ({tee}); tcb_status={claims.get('tcb_status', 'n/a')} debug={claims.get('debug')}")


# Fields whose type differed between TEEs in the verifiers' claims (strings for numbers and
# booleans on SNP, another name on TDX): --json gives every field one type across TEEs. The
# verifiers' own claims keep their strings (EAT token claims; attestation/verifier.py reads them).
_INTS = ("snp_version", "vmpl", "quote_version")
_BOOLS = ("migrate_ma", "migratable")


def uniform_claims(claims: dict[str, Any], at: dt.datetime | None) -> dict[str, Any]:
    """One type per field across snp, tdx and nvgpu: numbers as numbers, booleans as booleans,
    `crl_checked` (bool) and `verified_at` (ISO 8601) everywhere."""
    out = dict(claims)
    for name in _INTS:
        if isinstance(out.get(name), str):
            out[name] = int(out[name])
    for name in _BOOLS:
        if isinstance(out.get(name), str):
            out[name] = out[name] == "true"
    checked = out.pop("crls_checked", out.get("crl_checked"))
    if isinstance(checked, str):
        checked = checked == "true"
    if checked is not None or out.get("tee") != "nvgpu":
        out["crl_checked"] = bool(checked)
    if "verified_at" not in out:
        out["verified_at"] = (at or dt.datetime.now(dt.UTC)).isoformat()
    return out


def inspect(
    file: Path = typer.Argument(..., exists=True),
    tee: str = typer.Option(None, help="snp | tdx | nvgpu (default: detect)"),
) -> None:
    """Pretty-print any evidence (parse only; nothing is verified), or a deployment's
    /.well-known/attestation document (use `sealed verify URL` to verify one)."""
    data = file.read_bytes()
    deployment = _deployment_document(data)
    if deployment is not None:
        typer.echo(json.dumps(deployment, indent=2, sort_keys=True, default=str))
        return
    tees = [tee] if tee else list(TEES)
    errors = []
    for name in tees:
        try:
            parsed = _cli_module(name).inspect_for_cli(data)
        except (AttestationError, ImportError) as exc:
            errors.append(f"{name}: {exc}")
            continue
        typer.echo(json.dumps({"tee": name, **parsed}, indent=2, sort_keys=True, default=str))
        return
    typer.echo("could not parse as any known evidence:\n  " + "\n  ".join(errors), err=True)
    raise typer.Exit(1)


def _deployment_document(data: bytes) -> dict[str, Any] | None:
    """A `/.well-known/attestation` document: each worker's token claims (unverified) and bundle."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        return None
    import jwt

    from attestation.bundle import EvidenceBundle

    workers = []
    for w in doc["workers"]:
        entry: dict[str, Any] = {k: w.get(k) for k in ("worker_id", "tenant", "model", "version", "tee", "insecure",
                                                        "sealed_key_id", "usage_public_key", "promises")}
        try:
            entry["token_claims_unverified"] = jwt.decode(str(w["token"]), options={"verify_signature": False})
            bundle = EvidenceBundle.from_json(w["evidence"])
            entry["evidence"] = {"tee": bundle.tee, "cpu_evidence_bytes": len(bundle.cpu_evidence),
                                 "gpus": len(bundle.gpus), "digest": bundle.digest(),
                                 "hpke_public_key": bundle.runtime_data.hpke_public_key.hex(),
                                 "channel_binding": bundle.runtime_data.channel_binding.hex()}
        except (KeyError, ValueError, AttestationError, jwt.PyJWTError) as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
        workers.append(entry)
    return {"kind": "deployment attestation document (parsed, not verified)", "workers": workers}


def detect() -> None:
    """Say which TEEs this machine can attest with, and why the others are unavailable."""
    from attestation.detect import detect as run_detect

    for cap in run_detect():
        typer.echo(f"{cap.tee:6} {'available  ' if cap.available else 'unavailable'}  {cap.reason}")


def _store(directory: Path, offline: bool) -> Any:
    from attestation.collateral import CollateralConfig, CollateralStore

    return CollateralStore(CollateralConfig(directory, offline=offline))


def collateral_status(
    store: Path = typer.Option(..., help="the broker's collateral directory (--collateral-dir)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """What the store holds and when each piece expires (expired pieces make the broker refuse)."""
    from attestation.collateral import status_json

    now = dt.datetime.now(dt.UTC)
    items = _store(store, True).status()
    if as_json:
        typer.echo(status_json(items, now))
        return
    if not items:
        typer.echo("no collateral")
    for i in items:
        until = i.next_update.isoformat() if i.next_update else "-"
        flag = "EXPIRED" if i.expired(now) else "ok"
        typer.echo(f"{i.source:6} {i.kind:10} {flag:7} until {until:25} {i.subject}  ({i.name})")
    if any(i.expired(now) for i in items):
        raise typer.Exit(1)


def collateral_import(
    bundle: Path = typer.Argument(..., exists=True, help="a directory of collateral made elsewhere"),
    store: Path = typer.Option(..., help="the broker's collateral directory"),
) -> None:
    """Import a bundle (for brokers with no internet); every file is recognised by content."""
    try:
        items = _store(store, True).import_dir(bundle)
    except AttestationError as exc:
        typer.echo(f"import refused: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"imported {len(items)} pieces of collateral into {store}")


def collateral_fetch(
    store: Path = typer.Option(..., help="the collateral directory to fill (then export it with --bundle)"),
    fmspc: list[str] = typer.Option([], help="TDX platform FMSPC (hex); repeatable"),
    bundle: Path = typer.Option(None, help="also write an importable bundle here"),
    if_due: bool = typer.Option(False, "--if-due", help="only when something expires within 24 h (for cron)"),
) -> None:
    """Fetch AMD KDS CRLs and Intel PCS collateral now (online), for this broker or another."""
    from attestation.collateral import CollateralConfig, CollateralStore

    collateral = CollateralStore(CollateralConfig(store, fmspcs=tuple(fmspc)))
    try:
        if if_due and not collateral.refresh_if_due(dt.datetime.now(dt.UTC)):
            typer.echo("collateral is current; nothing fetched")
            return
        items = collateral.status() if if_due else collateral.fetch()
    except AttestationError as exc:
        typer.echo(f"fetch failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        collateral.close()
    if bundle is not None:
        collateral.export_dir(bundle)
    typer.echo(f"{len(items)} pieces of collateral in {store}")


def build() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, help="Verify and inspect attestation evidence.")
    app.command("detect")(detect)
    app.command("verify")(verify)
    app.command("inspect")(inspect)
    collateral = typer.Typer(no_args_is_help=True, help="The verifier's collateral: fetch, import, status.")
    collateral.command("status")(collateral_status)
    collateral.command("import")(collateral_import)
    collateral.command("fetch")(collateral_fetch)
    app.add_typer(collateral, name="collateral")
    return app
