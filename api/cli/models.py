"""`sealed models register|list|promote|rollback|retire|measurement`: model versions.

Registering a version puts it in the catalog; the control loop then runs workers for it as soon as
its package is uploaded (`sealed upload`) and its data key is at the key broker (`--data-key`
here, from `sealed encrypt`), and the tenant's release policy allows the workers' measurement
(`sealed models measurement` prints it and can write that release policy).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from api.cli import tenant_broker
from api.cli.mgmt_client import PROFILE, URL, broker_credentials, broker_tenant_call, call, show
from api.cli.refs import model_name, model_ref
from api.home import default_home

TENANT = typer.Option(..., "--tenant")
MODEL = typer.Option(..., "--model")
VERSION = typer.Option(..., "--version")
JSON = typer.Option(False, "--json", help="print the API's JSON")


def _row(v: dict) -> str:
    state = "retired" if v.get("retired") else (v.get("status") or "-")
    reason = f" ({v['status_reason']})" if v.get("status_reason") else ""
    return (f"{v['model']}/{v['version']}\ttraffic={v['traffic_percent']:g}% warm-floor={v['min_warm']} "
            f"max={v.get('max_replicas', 1)} state={state}{reason}")


def register(
    tenant: str = TENANT, model: str = MODEL, version: str = VERSION,
    min_warm: int = typer.Option(1, min=0, help="warm-pool floor (0: may scale to zero)"),
    max_replicas: int = typer.Option(None, min=1, help="ceiling of workers (default: the floor, at least 1)"),
    ttft_slo_ms: int = typer.Option(None, min=1, help="add a worker while the mean TTFT is above this"),
    data_key: Path = typer.Option(None, exists=True, help="the sealed data key `sealed encrypt` wrote: sent to "
                                                          "the key broker (still sealed to it)"),
    package: Path = typer.Option(None, exists=True, file_okay=False,
                                 help="the package the data key belongs to (its manifest and signature go along)"),
    profile: str = PROFILE, url: str = URL, as_json: bool = JSON,
) -> None:
    """Add a model version to the catalog (the first version of a model gets all its traffic)."""
    ref = model_ref(tenant, model, version)
    if (data_key is None) != (package is None):
        raise typer.BadParameter("--data-key and --package go together")
    if data_key is not None:
        from protocol.package.keywrap import SealedDataKey, sealed_upload_body

        sealed = SealedDataKey.from_json(data_key.read_text())
        if sealed.ref != ref:
            raise typer.BadParameter(f"the data key is for {sealed.ref}")
        creds = broker_credentials(profile)
        if creds is None:
            raise typer.BadParameter("no key broker URL: set $SEALED_BROKER_URL (or `sealed login --local-operator`)")
        # Issue #46: the key goes only to the pinned broker instance, where the tenant's own key governs.
        tenant_broker.guard(creds[0], ref.tenant, default_home())
        broker_tenant_call("PUT", f"/tenants/{ref.tenant}/models/{ref.model}/versions/{ref.version}/data-key",
                           tenant=ref.tenant, profile=profile, body=sealed_upload_body(package, sealed))
        typer.echo(f"data key of {ref} is at the key broker (it was sealed to the broker)")
    body = {"model": ref.model, "version": ref.version, "min_warm": min_warm, "max_replicas": max_replicas,
            "ttft_slo_ms": ttft_slo_ms}
    doc = call("POST", f"/tenants/{ref.tenant}/models", profile=profile, url=url,
               body={k: v for k, v in body.items() if v is not None})
    show(doc, as_json, [f"registered {ref.tenant}/{_row(doc)}"])


def list_versions(tenant: str = TENANT, profile: str = PROFILE, url: str = URL, as_json: bool = JSON) -> None:
    """The tenant's model versions: traffic split, replica bounds, and what the control loop sees."""
    doc = call("GET", f"/tenants/{tenant}/models", profile=profile, url=url)
    show(doc, as_json, [_row(v) for v in doc["data"]])


def promote(tenant: str = TENANT, model: str = MODEL, version: str = VERSION,
            percent: float = typer.Option(100.0, min=0, max=100, help="share of the model's traffic"),
            profile: str = PROFILE, url: str = URL, as_json: bool = JSON) -> None:
    """Move traffic to a version (the others share the rest in proportion)."""
    ref = model_ref(tenant, model, version)
    doc = call("POST", f"/tenants/{ref.tenant}/models/{ref.model}/rollout", profile=profile, url=url,
               body={"version": ref.version, "percent": percent})
    show(doc, as_json, [_row(v) for v in doc["data"]])


def rollback(tenant: str = TENANT, model: str = MODEL, profile: str = PROFILE, url: str = URL,
             as_json: bool = JSON) -> None:
    """Restore the traffic split from before the last promote or retire."""
    tenant, model = model_name(tenant, model)
    doc = call("POST", f"/tenants/{tenant}/models/{model}/rollback", profile=profile, url=url)
    show(doc, as_json, [_row(v) for v in doc["data"]])


def retire(tenant: str = TENANT, model: str = MODEL, version: str = VERSION, profile: str = PROFILE,
           url: str = URL) -> None:
    """Take a version out of service: its traffic goes to the others; its workers drain and stop."""
    ref = model_ref(tenant, model, version)
    doc = call("POST", f"/tenants/{ref.tenant}/models/{ref.model}/versions/{ref.version}/retire", profile=profile,
               url=url)
    for v in doc["data"]:
        typer.echo(f"{ref.model}/{v['version']}\ttraffic={v['traffic_percent']:g}%{' retired' if v['retired'] else ''}")


def measurement(
    tenant: str = TENANT, model: str = MODEL, version: str = VERSION,
    policy_admin_key: Path = typer.Option(None, exists=True, help="the tenant admin public key its workers "
                                                                  "enforce policies with (none: no in-enclave policy)"),
    package: Path = typer.Option(None, exists=True, file_okay=False, help="with --release-policy-out: the package "
                                                                         "whose signer the policy requires"),
    release_policy_out: Path = typer.Option(None, help="write a release policy allowing exactly this measurement"),
    policy_version: int = typer.Option(1, min=1, help="version of that release policy"),
) -> None:
    """The measurement of the workers `sealed up` runs for this version (simulated TEE)."""
    from api.broker_state import broker_measurement
    from api.home import Home, default_home
    from api.orchestrator.local import local_measurement

    ref = model_ref(tenant, model, version)
    home = Home(default_home())  # its workers pin the local key broker's measurement (made by `sealed up`)
    broker = broker_measurement(home).hex() if home.sim_public_key.exists() else None
    value = local_measurement(ref, policy_admin_key, broker)
    typer.echo(value)
    if release_policy_out is not None:
        if package is None:
            raise typer.BadParameter("--release-policy-out needs --package (its signer is required)")
        from protocol.package import read_manifest

        _, _, signer = read_manifest(package)
        doc = {"policy_id": f"{ref.model}-release", "version": policy_version, "tenant": ref.tenant, "model": ref.model,
               "allowed_tee": ["sim"], "allowed_measurements": [value], "required_signer": signer,
               "unsafe_allow_simulated_tee": True}
        release_policy_out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        typer.echo(f"release policy written to {release_policy_out} (simulated TEE: for this host only)", err=True)


def build() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, help="Model versions: register, list, promote, roll back, retire.")
    for name, fn in (("register", register), ("list", list_versions), ("promote", promote),
                     ("rollback", rollback), ("retire", retire), ("measurement", measurement)):
        app.command(name)(fn)
    return app
