"""`sealed verify --broker URL`: verify the key broker's own attestation offline and say what the
hardware evidence showed (attestation/broker_identity.py does the checks).

What it trusts comes from the client policy (`broker`: {"tee", "measurements", "workload_ids", "instances"}; the
simulated platform key from `evidence.sim_platform_key`, used only when the simulated TEE is allowed)
or from `--broker-measurement` / `--broker-workload-id`; vendor roots are the pinned ones (or the
policy's `unsafe_roots_dir`). A workload id pinned is required (the broker's init-data digest its
hardware reports); none pinned, the one reported is printed as "not pinned".
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from attestation.broker_identity import VerifiedBroker, verify_broker_attestation
from attestation.errors import AttestationError
from attestation.verifier import VerifierTrust


def broker_trust(policy: dict[str, Any], *, allow_simulated: bool, base: Path | None) -> VerifierTrust:
    sim_hex = (policy.get("evidence") or {}).get("sim_platform_key")
    allow = allow_simulated or bool((policy.get("appraisal") or {}).get("unsafe_allow_simulated_tee"))
    roots = (policy.get("evidence") or {}).get("unsafe_roots_dir")
    return VerifierTrust(
        roots_dir=(base / roots if base and roots else Path(roots)) if roots else None,
        sim_platform_key=Ed25519PublicKey.from_public_bytes(bytes.fromhex(sim_hex)) if (sim_hex and allow) else None)


def _workload_line(verified: VerifiedBroker, pinned: bool) -> str:
    field = {"snp": "HOST_DATA", "tdx": "MRCONFIGID"}.get(verified.cpu.tee.value)
    if field is None:
        return "  workload id   none (the simulated TEE carries no init-data digest)"
    if not verified.workload_id.strip("0"):
        return f"  workload id   none ({field} is zero: launched without init-data; not pinned)"
    return f"  workload id   {verified.workload_id} ({field}: the broker's init-data; " \
           f"{'pinned' if pinned else 'NOT pinned: any broker image in this runtime class would pass'})"


def report(verified: VerifiedBroker, nonce: bytes, workload_pinned: bool = False) -> list[str]:
    cpu, identity = verified.cpu, verified.identity
    return [
        f"key broker {identity.issuer}:",
        "  verified from the hardware evidence (signature and chain to the pinned roots):",
        f"  TEE           {cpu.tee.value}" + ("  (INSECURE: simulated, its platform key is the operator's)"
                                              if cpu.tee.value == "sim" else ""),
        f"  measurement   {cpu.measurement.hex()} (pinned)",
        _workload_line(verified, workload_pinned),
        f"  TCB           status {cpu.tcb_status.value}, {json.dumps(dict(cpu.tcb), sort_keys=True)}",
        f"  debug         {'on' if cpu.debug else 'off'}",
        f"  REPORT_DATA   {cpu.report_data.hex()}",
        f"    binds       nonce {nonce.hex()}",
        f"                identity document sha256 {verified.identity.digest().hex()}",
        f"                import key {identity.import_key.hex()} (X25519)",
        f"                receipt key {identity.receipt_key.hex()} (Ed25519)",
        f"                instance key {identity.instance_key.hex()} (Ed25519: this broker instance)",
        "                token keys " + ", ".join(str(k.get("kid")) for k in identity.token_jwks.get("keys", [])),
        "  configuration " + json.dumps(identity.measured_config, sort_keys=True),
    ]


def verify_broker(url: str, policy_path: Path | None, measurements: list[str], *, allow_simulated: bool,
                  now: dt.datetime, workload_ids: list[str] | None = None) -> VerifiedBroker:
    """Print what was verified, or why not (typer.Exit(1))."""
    policy: dict[str, Any] = json.loads(policy_path.read_text()) if policy_path else {}
    pinned = [*measurements, *((policy.get("broker") or {}).get("measurements") or [])]
    workloads = [*(workload_ids or []), *((policy.get("broker") or {}).get("workload_ids") or [])]
    instances = [str(i) for i in (policy.get("broker") or {}).get("instances") or []]  # #46: this broker instance
    nonce = secrets.token_bytes(32)
    trust = broker_trust(policy, allow_simulated=allow_simulated, base=policy_path.parent if policy_path else None)
    try:
        answer = httpx.post(f"{url.rstrip('/')}/v1/broker/attestation", json={"nonce": nonce.hex()}, timeout=10.0)
        answer.raise_for_status()
        verified = verify_broker_attestation(
            answer.json(), nonce=nonce, now=now, allowed_measurements=pinned, trust=trust,
            allowed_workload_ids=workloads, allowed_instances=instances)
    except (AttestationError, httpx.HTTPError, ValueError) as exc:
        typer.echo(f"key broker {url}: NOT verified ({type(exc).__name__}: {exc})")
        raise typer.Exit(1) from exc
    typer.echo("\n".join(report(verified, nonce, workload_pinned=bool(workloads))))
    return verified
