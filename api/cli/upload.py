"""`sealed upload PKG`: send an encrypted package to the gateway's management API.

Chunked and resumable: the server derives the upload id from the declared files, so running the
command again after an interruption continues from the bytes already stored; within one run, a cut
connection resumes from the server's last acknowledged chunk.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

from api.cli.mgmt_client import PROFILE, gateway_url, management_token
from protocol.package.errors import UploadError
from protocol.package.format import UPLOAD_CHUNK_DIGEST_HEADER as CHUNK_DIGEST_HEADER

# manifest + payload + whichever signature method's files the package has
PACKAGE_FILES = ("manifest.json", "manifest.sig", "model.sig", "signer.pub.pem", "payload.bin")
DEFAULT_CHUNK = 4 << 20  # the gateway's default body limit; a 413 halves it
_RETRIES = 5


class UploadFailed(UploadError):
    """The gateway refused the package or stayed unreachable."""


def describe(pkg: Path) -> dict[str, dict[str, Any]]:
    files = {}
    for name in (n for n in PACKAGE_FILES if (pkg / n).is_file()):
        digest = hashlib.sha256()
        with open(pkg / name, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
        files[name] = {"size": (pkg / name).stat().st_size, "sha256": digest.hexdigest()}
    return files


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise UploadFailed(f"{response.request.method} {response.request.url.path}: "
                           f"{response.status_code} {response.text[:300]}")
    answer: dict[str, Any] = response.json()
    return answer


def upload_package(pkg: Path, client: httpx.Client, *, chunk_bytes: int = DEFAULT_CHUNK,
                   progress: Callable[[int], None] | None = None,
                   on_start: Callable[[int, int], None] | None = None,
                   sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Upload (or resume) `pkg` through `client` (base URL and auth already set); returns the record.

    Each chunk carries its SHA-256; the server stores it whole or not at all. After a cut connection
    (or a chunk refused as altered in transit) the client asks the server where the file ends, its
    last acknowledged chunk, and continues from there; it gives up after `_RETRIES` failures in a row
    without progress. Memory holds one chunk."""
    files = describe(pkg)
    declared = _check(client.post("/v1/packages/uploads", json={"files": files}))
    upload_id, offsets = declared["upload_id"], declared["offsets"]
    chunk_bytes = min(chunk_bytes, int(declared.get("max_chunk_bytes", chunk_bytes)))
    if on_start:
        on_start(sum(f["size"] for f in files.values()), sum(offsets.values()))
    for name in files:
        offset, size, failures = offsets[name], files[name]["size"], 0
        with open(pkg / name, "rb") as fh:
            while offset < size:
                fh.seek(offset)
                chunk = fh.read(chunk_bytes)
                headers = {"content-type": "application/octet-stream",
                           CHUNK_DIGEST_HEADER: hashlib.sha256(chunk).hexdigest()}
                r: httpx.Response | None
                try:
                    r = client.put(f"/v1/packages/uploads/{upload_id}/{name}", params={"offset": offset},
                                   content=chunk, headers=headers)
                    failure = f"chunk at {offset} of {name} refused as altered: {r.text[:200]}"
                except httpx.TransportError as exc:
                    r, failure = None, f"gateway unreachable: {exc}"
                if r is not None and r.status_code == 413 and chunk_bytes > 64 << 10:
                    chunk_bytes //= 2  # a smaller body limit in front of the gateway
                    continue
                if r is None or r.status_code == 422:  # cut, or altered on the way: back off, resync
                    failures += 1
                    if failures > _RETRIES:
                        raise UploadFailed(failure)
                    sleep(min(8.0, 0.5 * 2**failures))
                if r is None or r.status_code in (409, 422):  # resync with what the server acknowledged
                    now = _check(client.get(f"/v1/packages/uploads/{upload_id}"))["offsets"][name]
                else:
                    now = int(_check(r)["offset"])
                if now > offset:
                    failures = 0
                    if progress:
                        progress(now - offset)
                offset = now
    return _check(client.post(f"/v1/packages/uploads/{upload_id}/complete"))


def upload(
    pkg: Path = typer.Argument(..., exists=True, file_okay=False, help="package directory (encrypt --out)"),
    gateway: str = typer.Option(None, "--gateway", "--url", help="gateway URL (default $SEALED_GATEWAY, the "
                                                                 "login's, or the local stack's)"),
    profile: str = PROFILE,
    chunk_mib: int = typer.Option(4, min=1, help="chunk size in MiB"),
) -> None:
    """Upload an encrypted package: chunked, resumable (run it again to continue), with progress.

    Needs a tenant-admin management token of the package's tenant (not an API key): `sealed login`
    with one (an operator makes it with `sealed tokens create --role tenant-admin`), or
    $SEALED_MANAGEMENT_TOKEN."""
    headers = {"authorization": f"Bearer {management_token(profile)}"}
    with httpx.Client(base_url=gateway_url(gateway, profile), headers=headers, timeout=120.0) as client, Progress(
            "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
            TimeRemainingColumn()) as bar:
        task = bar.add_task("uploading", total=None)
        try:
            record = upload_package(pkg, client, chunk_bytes=chunk_mib << 20,
                                    progress=lambda n: bar.advance(task, n),
                                    on_start=lambda total, done: bar.update(task, total=total,
                                                                            completed=done))
        except UploadFailed as exc:
            typer.echo(f"upload failed: {exc}", err=True)
            raise typer.Exit(1) from exc
    typer.echo(f"stored {record['tenant']}/{record['model']}/{record['version']} at {record['address']}")
