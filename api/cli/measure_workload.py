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


def _from_pod(path: Path) -> tuple[str, list[str], dict[str, str], str]:
    """Image, arguments, literal environment and generated agent policy of the worker in a rendered
    manifest (`kubectl kustomize` output, or one Deployment): the pod spec pinned as it will run."""
    import yaml

    from api.orchestrator.agent_policy import WORKER_ENTRYPOINT, AgentPolicyError, render, worker_container

    specs = [d["spec"]["template"]["spec"] for d in yaml.safe_load_all(path.read_text())
             if isinstance(d, dict) and d.get("kind") == "Deployment"
             and d.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component") == "worker"]
    if len(specs) != 1:
        raise typer.BadParameter(f"{path}: expected one worker Deployment, found {len(specs)}", param_hint="--pod")
    try:
        container = worker_container(specs[0])
        policy = render(specs[0])
    except AgentPolicyError as exc:
        raise typer.BadParameter(str(exc), param_hint="--pod") from None
    if container.get("command") and tuple(container["command"]) != WORKER_ENTRYPOINT:
        raise typer.BadParameter(f"the worker's command is the image's entrypoint {list(WORKER_ENTRYPOINT)}",
                                 param_hint="--pod")
    env = {}
    for item in container.get("env", []):
        if "value" not in item:
            raise typer.BadParameter(f"env {item.get('name')!r} must be a literal value", param_hint="--pod")
        env[str(item["name"])] = str(item["value"])
    return container["image"], [str(a) for a in container.get("args", [])], env, policy


def init_data(
    worker_args: list[str] = typer.Argument(None, help="the worker's arguments (after `--`), as the pod runs them"),
    image: str = typer.Option(None, help="the worker image pinned by digest: <repository>@sha256:<hex>"),
    pod: Path = typer.Option(None, exists=True, dir_okay=False,
                             help="a rendered manifest (kubectl kustomize output) holding the worker Deployment: "
                                  "image, arguments, environment and the generated agent policy come from it "
                                  "(the bare document: a Kata pod reports its CoCo init-data's digest, which "
                                  "`sealed measure snp|tdx --manifest` prints)"),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE of the worker's environment (repeat)"),
    agent_policy: Path = typer.Option(None, exists=True, dir_okay=False,
                                      help="the Kata agent policy (Rego) the pod is created under"),
    out: Path = typer.Option(None, help="write the init-data document here"),
) -> None:
    """Init-data of a worker and the HOST_DATA (SNP) / MRCONFIGID (TDX) it launches with."""
    from enclave_worker.cli import parse
    from enclave_worker.workload_check import init_data_for

    environ: dict[str, str] = {}
    policy_text: bytes | None = agent_policy.read_bytes() if agent_policy else None
    if pod is not None:
        if worker_args or image or agent_policy:
            raise typer.BadParameter("--pod names the image, arguments and agent policy itself", param_hint="--pod")
        image, worker_args, environ, generated = _from_pod(pod)
        policy_text = generated.encode()
    elif not image or not worker_args:
        raise typer.BadParameter("give --pod, or --image and the worker's arguments after `--`")
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r}: use NAME=VALUE", param_hint="--env")
        environ[name] = value
    digest = hashlib.sha256(policy_text).hexdigest() if policy_text is not None else ""
    try:
        _, settings = parse(list(worker_args))
        document = init_data_for(image, worker_args, environ, settings, digest)
    except (AttestationError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if out is not None:
        out.write_bytes(document.encode())
        if pod is not None and policy_text is not None:  # the policy the pod must be created under
            out.with_suffix(".rego").write_bytes(policy_text)
    typer.echo(json.dumps({"host_data": document.host_data().hex(), "mr_config_id": document.mr_config_id().hex(),
                           "init_data": document.to_dict()}, indent=1))
