"""`sealed encrypt SRC --tenant T --out PKG`: tenant-side encryption and signing of a model.

The data key never touches the disk in the clear: it is sealed (HPKE) to the key broker's
published import key (`--broker-import-key`; with "hold your own key", the tenant's own broker).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

from api.cli.refs import model_ref
from api.home import ed25519_key
from api.tenant_tools import check_model, encrypt_checkpoint, open_source, seal_for_broker
from enclave_worker.engine.errors import CheckpointError
from enclave_worker.engine.layers.quantized_weight import QuantizedWeight
from enclave_worker.engine.models.spec import UnsupportedArchitecture
from enclave_worker.vllm_engine.weights import vllm_note
from protocol.fsutil import atomic_write
from protocol.package.signing import ModelSigningKey


def encrypt(
    src: Path = typer.Argument(..., exists=True, help="GGUF file or HF model directory"),
    tenant: str = typer.Option(..., help="tenant id"),
    out: Path = typer.Option(..., help="package directory to write"),
    model: str = typer.Option(None, help="model id (default: SRC's name)"),
    version: str = typer.Option("v1", help="model version"),
    signing_key: Path = typer.Option(None, help="tenant Ed25519 signing key (PEM; created if absent)"),
    model_signing_key: Path = typer.Option(None, exists=True,
                                           help="tenant EC private key (PEM): sign with OpenSSF model-signing"),
    broker_import_key: Path = typer.Option(..., exists=True,
                                           help="key broker's X25519 import public key (PEM or hex); "
                                                "`sealed keys import-pubkey` prints the local broker's"),
    sealed_key_out: Path = typer.Option(None, help="sealed data key file (default: PKG.datakey.json)"),
    gguf_quant: str = typer.Option("fp32", help="GGUF quantized linears: 'fp32' (dequantized, the default) or "
                                               "'native' (kept in the engine's int4/int8 kernel layouts)"),
    threads: int = typer.Option(None, help="segments encrypted at once, one thread each (default: one per core "
                                           "this process may run on, at most 4); at least 1"),
) -> None:
    """Encrypt and sign SRC into a package; plaintext never touches the disk."""
    if gguf_quant not in ("fp32", "native"):
        raise typer.BadParameter("--gguf-quant is 'fp32' or 'native'")
    if threads is not None and threads < 1:  # before any work: nothing is read or written
        raise typer.BadParameter(f"--threads must be at least 1, not {threads}")
    if (signing_key is None) == (model_signing_key is None):
        raise typer.BadParameter("give exactly one of --signing-key (Ed25519) or --model-signing-key (EC)")
    signer = ModelSigningKey(model_signing_key) if model_signing_key else ed25519_key(signing_key)
    ref = model_ref(tenant, model or src.stem.lower().replace("_", "-"), version)  # before any work
    sealed_path = sealed_key_out or out.with_name(out.name + ".datakey.json")
    with ExitStack() as stack, Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                                        TransferSpeedColumn(), TimeRemainingColumn()) as progress:
        task = progress.add_task("loading", total=None)
        try:  # an unquantized HF directory is streamed from its shards: memory flat in the model's size
            checkpoint = open_source(src, stack, native_quant=gguf_quant == "native")
        except CheckpointError as exc:  # what the engine would not load: refused before any encryption
            progress.stop()
            typer.echo(f"error: the engine cannot load {src}: {exc}", err=True)
            raise typer.Exit(2) from None
        try:
            check_model(checkpoint.config)  # before any work: one line, no package written
        except UnsupportedArchitecture as exc:
            progress.stop()
            typer.echo(f"sealed encrypt: {exc}", err=True)
            raise typer.Exit(2) from None
        total = sum(t.nbytes for t in checkpoint.tensors.values())
        progress.update(task, description="encrypting", total=total)
        result = encrypt_checkpoint(checkpoint, out, tenant=ref.tenant, model=ref.model, version=ref.version,
                                    signing_key=signer, threads=threads,
                                    progress=lambda n: progress.advance(task, n))
    sealed = seal_for_broker(result, broker_import_key)
    atomic_write(sealed_path, sealed.to_json().encode())
    typer.echo(f"package {out}: {result.manifest.num_segments} segments, "
               f"{result.manifest.plaintext_bytes} bytes, digest {result.manifest.plaintext_digest}")
    typer.echo(f"signed by {result.manifest.signer}; serves: {result.manifest.kind}")
    typer.echo(f"data key sealed to broker import key {sealed.import_key_id}: {sealed_path}")
    note = vllm_note({n: t.spec.to_json() for n, t in checkpoint.tensors.items() if isinstance(t, QuantizedWeight)})
    if note:  # the package serves on both engines; say what the vLLM backend does with its quantized weights
        typer.echo(note)
