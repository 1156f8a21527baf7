"""`sealed keys ...`: tenant key operations and release receipts (one-machine mode)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from api.home import Home, default_home
from key_broker.keystore import DataKeyRegistry, LocalKeyStore, load_master_key
from key_broker.receipts import ReceiptBook, ReceiptError, verify_receipt


def _home(home: Path | None) -> Home:
    return Home(home or default_home())


def receipts(
    tenant: str = typer.Option(..., help="tenant id"),
    home: Path = typer.Option(None, help="data directory (default $SEALED_HOME or ~/.sealed)"),
    file: Path = typer.Option(None, help="verify this receipts JSONL instead of the local broker's"),
    broker_key: Path = typer.Option(None, help="broker receipt public key (PEM) for --verify"),
    verify: bool = typer.Option(False, "--verify", help="verify every receipt's signature offline"),
) -> None:
    """List key-release receipts; with --verify, check each signature against the broker's key."""
    layout = _home(home)
    if file is not None:
        lines = [json.loads(x) for x in file.read_text().splitlines() if x.strip()]
    else:
        lines = ReceiptBook(layout.broker, Ed25519PrivateKey.generate()).list(tenant)
    public: Ed25519PublicKey | None = None
    if verify:
        if broker_key is not None:
            loaded = serialization.load_pem_public_key(broker_key.read_bytes())
        else:
            loaded = serialization.load_pem_private_key(
                (layout.broker / "receipt-signing.pem").read_bytes(), None).public_key()
        if not isinstance(loaded, Ed25519PublicKey):
            raise typer.BadParameter("broker key must be Ed25519")
        public = loaded
    bad = 0
    for i, line in enumerate(lines):
        if public is not None:
            try:
                verify_receipt(line, public)
            except ReceiptError as exc:
                bad += 1
                typer.echo(f"receipt {i}: INVALID ({exc})", err=True)
                continue
        typer.echo(json.dumps(line["receipt"], sort_keys=True))
    if bad:
        raise typer.Exit(1)
    if verify:
        typer.echo(f"{len(lines)} receipts verified", err=True)


def import_key(
    tenant: str = typer.Option(...), model: str = typer.Option(...), version: str = typer.Option(...),
    key_file: Path = typer.Option(..., exists=True, help="data key written by `sealed encrypt`"),
    package: Path = typer.Option(..., exists=True, help="the package the key encrypts"),
    home: Path = typer.Option(None),
) -> None:
    """Wrap a package's data key under the tenant key in the local key store, then delete the file."""
    from enclave_worker.package import read_manifest

    layout = _home(home)
    manifest, _, signer = read_manifest(package)
    keystore = LocalKeyStore(layout.broker / "keystore", load_master_key(layout.broker / "master.key"))
    if not keystore.has_tenant_key(tenant):
        keystore.create_tenant_key(tenant)
    DataKeyRegistry(layout.broker / "keystore", keystore).register(
        tenant, model, version, bytes.fromhex(key_file.read_text().strip()), manifest.key_id, signer,
        manifest.plaintext_sha256)
    key_file.unlink()
    typer.echo(f"data key for {tenant}/{model}/{version} wrapped and stored; {key_file} deleted")


def build() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, help="Tenant keys and release receipts.")
    app.command("receipts")(receipts)
    app.command("import")(import_key)
    return app
