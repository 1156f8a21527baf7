"""`sealed verify URL` and `sealed proxy --upstream URL`: the client side of sealed mode."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import typer


def _trust(policy: Path | None, unsafe_allow_simulated: bool, unsafe_trust_gateway_jwks: bool) -> Any:
    from sealed_client.deployment import ClientTrust

    doc: dict[str, Any] = json.loads(policy.read_text()) if policy else {}
    if unsafe_trust_gateway_jwks:
        doc["unsafe_trust_gateway_jwks"] = True
    return ClientTrust.from_dict(doc, unsafe_allow_simulated=unsafe_allow_simulated,
                                 base=policy.parent if policy else None)


def _report(pin: Any, doc: dict[str, Any], now: dt.datetime) -> list[str]:
    """What was verified, read from the hardware evidence (the CPU and GPU reports and the runtime
    data REPORT_DATA binds); the broker's token only corroborated it."""
    hw, workload = pin.worker.hardware, pin.worker.workload
    cpu = hw.cpu
    claims = pin.worker.attestation
    return [
        f"worker {doc.get('worker_id', '?')}: tenant {workload.tenant}, model {workload.model} {workload.version}, "
        f"digest {workload.model_digest}",
        "  verified from the hardware evidence (signature and chain to the pinned vendor roots):",
        f"  TEE           {cpu.tee.value}" + ("  (INSECURE: simulated, no hardware protection)" if hw.insecure
                                              else ""),
        f"  measurement   {cpu.measurement.hex()} (allowed by the policy or the signed reference values)",
        f"  TCB           status {cpu.tcb_status.value}, {json.dumps(dict(cpu.tcb), sort_keys=True)}",
        f"  debug         {'on' if cpu.debug else 'off'}",
        "  GPUs          " + (", ".join(f"{g.arch} cc={'on' if g.cc_enabled else 'off'} rim={g.rim_matched}"
                                        for g in hw.gpus) or "none"),
        f"  REPORT_DATA   {cpu.report_data.hex()}",
        "    binds       nonce " + hw.nonce.hex(),
        f"                sealing key {pin.worker_key_id} (X25519 {pin.hpke_public_key.hex()})",
        f"                receipt key {pin.receipt_key.hex()} (Ed25519, through the channel binding "
        f"{hw.channel_binding.hex()})",
        "                workload: tenant, model, version, digest, policy version, promises",
        f"  policy        tenant policy version {workload.policy_version} (sealed requests bind it)",
        ("  release       key released under the tenant-signed release policy "
         f"{pin.release.policy_id} v{pin.release.version} (signed by the pinned tenant key {pin.release.admin_key_id}; "
         "it names this measurement)") if pin.release else "  release       NOT checked: no tenant key pinned (UNSAFE)",
        "  promises      " + ", ".join(f"{k}={v}" for k, v in sorted(workload.promises.items())),
        f"  broker token  (corroboration) issuer {claims.issuer}, expires in "
        f"{int(claims.expires_at - now.timestamp())} s; the pin lasts "
        f"{max(0, int((pin.expires_at or claims.expires_at) - now.timestamp()))} s (token, reference values)",
    ]


def verify(
    url: str = typer.Argument(None, help="the gateway, e.g. http://127.0.0.1:8000"),
    policy: Path = typer.Option(None, exists=True, help="client policy JSON (appraisal, broker_jwks, ...)"),
    unsafe_allow_simulated: bool = typer.Option(False, "--unsafe-allow-simulated",
                                                help="accept the simulated TEE (no hardware protection)"),
    unsafe_trust_gateway_jwks: bool = typer.Option(False, "--unsafe-trust-gateway-jwks",
                                                   help="take the broker JWKS from the gateway (trust on first use)"),
    at: str = typer.Option(None, help="verification time, ISO 8601 (default: now)"),
    api_key_file: Path = typer.Option(None, exists=True, dir_okay=False,
                                      help="file holding the API key (default: $SEALED_API_KEY, $OPENAI_API_KEY)"),
    broker: str = typer.Option(None, "--broker", help="also verify the key broker's own attestation at this URL"),
    broker_measurement: list[str] = typer.Option([], "--broker-measurement",
                                                 help="a key broker measurement to accept (hex; or the policy's "
                                                      "broker.measurements)"),
    init_state: bool = typer.Option(False, "--init-state",
                                    help="create the policy's state file (empty: nothing seen yet) if it has none; "
                                         "a missing one is otherwise refused"),
    broker_workload_id: list[str] = typer.Option([], "--broker-workload-id",
                                                 help="a key broker workload id to require (hex SNP HOST_DATA / TDX "
                                                      "MRCONFIGID; or the policy's broker.workload_ids)"),
) -> None:
    """Verify every worker a deployment serves (and, with --broker, the key broker); print what was
    verified; exit non-zero on any failure.

    The gateway shows each tenant only its own workers, so the API key decides which are verified."""
    import os

    import httpx

    from attestation.errors import AttestationError, PolicyViolation
    from attestation.token import TokenVerifier
    from sealed_client.deployment import open_client_state, verify_published, verify_sealed_document

    now = dt.datetime.fromisoformat(at.replace("Z", "+00:00")) if at else dt.datetime.now(dt.UTC)
    if broker is not None:
        from api.cli.broker_verify import verify_broker

        verify_broker(broker, policy, broker_measurement, allow_simulated=unsafe_allow_simulated, now=now,
                      workload_ids=broker_workload_id)
        if url is None:
            return
    if url is None:
        typer.echo("give the gateway URL, or --broker URL", err=True)
        raise typer.Exit(2)
    try:
        trust = _trust(policy, unsafe_allow_simulated, unsafe_trust_gateway_jwks)
        if init_state and trust.state_file is not None:
            from sealed_client.memory import ClientMemory

            ClientMemory.create(trust.state_file)
        # What this client has seen before (its state file): nothing older is accepted; the tenant's
        # signed revocation list is applied.
        memory, revocations = open_client_state(trust)
    except (ValueError, PolicyViolation) as exc:
        typer.echo(f"bad client policy: {exc}", err=True)
        raise typer.Exit(2) from exc
    base = url.rstrip("/")
    api_key = (api_key_file.read_text().strip() if api_key_file
               else os.environ.get("SEALED_API_KEY") or os.environ.get("OPENAI_API_KEY"))
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=10.0) as http:
        if trust.attests_broker:
            jwks = _attested_broker_jwks(trust, http, now)
        else:
            jwks = trust.broker_jwks or http.get(f"{base}/.well-known/jwks.json").json()
        listing = http.get(f"{base}/.well-known/attestation", headers=auth)
        if listing.status_code != 200:
            typer.echo(f"{base}/.well-known/attestation answered {listing.status_code}"
                       + (" (give the API key: --api-key-file or $SEALED_API_KEY)" if listing.status_code == 401
                          else ""), err=True)
            raise typer.Exit(1)
        workers = listing.json().get("workers", [])
        published_doc = None
        if trust.pins_publisher:
            response = http.get(f"{base}/.well-known/reference-values")
            published_doc = response.json() if response.status_code == 200 else None
    try:
        published = verify_published(trust, published_doc, now, memory.reference_values_serial)
    except AttestationError as exc:
        typer.echo(f"reference values: NOT verified ({type(exc).__name__}: {exc})")
        raise typer.Exit(1) from exc
    if published is not None:
        memory.record_reference_values(published.serial)
        typer.echo(f"reference values: {len(published.measurements)} measurement(s), valid until "
                   f"{published.expires_at.isoformat()}\n  signed by     {published.signer} (the pinned publisher)")
    verifier = TokenVerifier(jwks, trust.broker_issuer)
    failed = 0
    for doc in workers:
        try:
            pin = verify_sealed_document(doc, verifier, trust, now, published, model=doc.get("model"), memory=memory,
                                         revocations=revocations)
        except (AttestationError, KeyError, ValueError, TypeError) as exc:
            failed += 1
            reasons = exc.violations if isinstance(exc, PolicyViolation) else [str(exc)]
            typer.echo(f"worker {doc.get('worker_id', '?')}: NOT verified ({type(exc).__name__})")
            for reason in reasons:
                typer.echo(f"  - {reason}")
            continue
        memory.record(pin.tenant, pin.model, pin.release.version if pin.release else None, pin.policy_version)
        typer.echo("\n".join(_report(pin, doc, now)))
    typer.echo(f"{len(workers) - failed} of {len(workers)} workers verified")
    if failed or not workers:
        raise typer.Exit(1)


def _attested_broker_jwks(trust: Any, http: Any, now: dt.datetime) -> Any:
    """The token keys of the pinned broker, from its own attestation to a fresh nonce (exit 1 if not)."""
    import secrets

    import httpx

    from attestation.errors import AttestationError
    from sealed_client.broker_pin import attested_broker_jwks

    pin, nonce = trust.broker, secrets.token_bytes(32)
    try:
        answer = http.post(pin.attestation_url, json={"nonce": nonce.hex()})
        answer.raise_for_status()
        jwks = attested_broker_jwks(pin, answer.json(), nonce=nonce, issuer=trust.broker_issuer,
                                    trust=trust.evidence_trust, now=now)
    except (AttestationError, ValueError, httpx.HTTPError) as exc:
        typer.echo(f"key broker {pin.url}: NOT verified ({type(exc).__name__}: {exc})")
        raise typer.Exit(1) from exc
    typer.echo(f"key broker {pin.url}: token keys taken from its attestation (a pinned measurement"
               + (", a pinned workload id" if pin.workload_ids else "") + ", verified from the hardware evidence)")
    return jwks


def proxy(
    upstream: str = typer.Option(..., help="the gateway, e.g. https://gateway.example/v1"),
    policy: Path = typer.Option(None, exists=True, help="client policy JSON"),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8300),
    unsafe_allow_simulated: bool = typer.Option(False, "--unsafe-allow-simulated"),
    unsafe_trust_gateway_jwks: bool = typer.Option(False, "--unsafe-trust-gateway-jwks"),
    unsafe_allow_plaintext: bool = typer.Option(False, "--unsafe-allow-plaintext",
                                                help="pass requests it cannot seal through in PLAINTEXT"),
    retrieval_model: str = typer.Option(None, help="the embedding model whose worker seals file uploads and "
                                                   "vector store searches (docs/retrieval.md)"),
) -> None:
    """A local OpenAI-compatible endpoint that seals every request to the attested worker and refuses
    (400) any it cannot seal."""
    import uvicorn

    from sealed_client.proxy import create_proxy_app

    app = create_proxy_app(upstream, _trust(policy, unsafe_allow_simulated, unsafe_trust_gateway_jwks),
                           unsafe_allow_plaintext=unsafe_allow_plaintext, retrieval_model=retrieval_model)
    typer.echo(f"sealed proxy on http://{host}:{port}/v1 -> {upstream}")
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
