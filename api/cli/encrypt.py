"""`sealed encrypt SRC --tenant T --out PKG`: tenant-side encryption and signing of a model."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from api.home import ed25519_key
from api.tenant_tools import encrypt_model
from key_broker.fsutil import atomic_write


def encrypt(
    src: Path = typer.Argument(..., exists=True, help="GGUF file or HF model directory"),
    tenant: str = typer.Option(..., help="tenant id"),
    out: Path = typer.Option(..., help="package directory to write"),
    model: str = typer.Option(None, help="model id (default: SRC's name)"),
    version: str = typer.Option("v1", help="model version"),
    signing_key: Path = typer.Option(..., help="tenant Ed25519 signing key (PEM; created if absent)"),
    key_out: Path = typer.Option(..., help="where to write the data key (0600) for `sealed keys import`"),
) -> None:
    """Encrypt and sign SRC into a package; plaintext never touches the disk."""
    name = model or src.stem.lower().replace("_", "-")
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn()) as progress:
        task = progress.add_task("encrypting", total=None)
        result = encrypt_model(src, out, tenant=tenant, model=name, version=version,
                               signing_key=ed25519_key(signing_key),
                               progress=lambda n: progress.advance(task, n))
    atomic_write(key_out, result.data_key.hex().encode())
    typer.echo(f"package {out}: {result.manifest.num_segments} segments, "
               f"{result.manifest.plaintext_bytes} bytes, digest {result.manifest.plaintext_sha256}")
    typer.echo(f"data key written to {key_out} (0600); register it with the key broker, then delete it")
