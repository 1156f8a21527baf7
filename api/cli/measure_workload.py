"""`sealed measure init-data`: the workload identity a worker started from a configuration has.

From the worker's arguments (as a deploy overlay's pod spec or `sealed up` starts it), its image,
its measured environment and the Kata agent policy, this writes the init-data document
(attestation/initdata.py) the host must launch the guest with, and prints the values the hardware
will report for it: SNP HOST_DATA and TDX MRCONFIGID. Those go into the reference values a
publisher signs and into release and client policies (`allowed_workload_ids`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import typer

from attestation.errors import AttestationError


def init_data(
    worker_args: list[str] = typer.Argument(..., help="the worker's arguments (after `--`), as the pod runs them"),
    image: str = typer.Option(..., help="the worker image pinned by digest: <repository>@sha256:<hex>"),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE of the worker's environment (repeat)"),
    agent_policy: Path = typer.Option(None, exists=True, dir_okay=False,
                                      help="the Kata agent policy (Rego) the pod is created under"),
    out: Path = typer.Option(None, help="write the init-data document here"),
) -> None:
    """Init-data of a worker and the HOST_DATA (SNP) / MRCONFIGID (TDX) it launches with."""
    from enclave_worker.cli import parse
    from enclave_worker.workload_check import init_data_for

    environ = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r}: use NAME=VALUE", param_hint="--env")
        environ[name] = value
    digest = hashlib.sha256(agent_policy.read_bytes()).hexdigest() if agent_policy else ""
    try:
        _, settings = parse(list(worker_args))
        document = init_data_for(image, worker_args, environ, settings, digest)
    except (AttestationError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if out is not None:
        out.write_bytes(document.encode())
    typer.echo(json.dumps({"host_data": document.host_data().hex(), "mr_config_id": document.mr_config_id().hex(),
                           "init_data": document.to_dict()}, indent=1))
