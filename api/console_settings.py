"""What the console reads besides the gateway's own state: the audit directory and the key broker.

A part of the control plane's settings (`GatewaySettings.console`), so it sits beside the parts, not in
the console package: the gateway and its settings import no console code."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ConsoleSettings:
    # The shared audit directory (`<component>.audit.jsonl`, checkpoints, `keys/<component>.pem`).
    audit_dir: Path | None = None
    # Component public keys; default `audit_dir/keys`. Point it at a copy the log's host cannot
    # rewrite to make a re-signed log evident (the keys beside the log move with it).
    audit_keys_dir: Path | None = None
    # External anchors of the checkpoints (policy.audit.anchor): a witness file and/or the anchor
    # database; anchored checkpoints are checked against the log like verify_log does.
    audit_witness: Path | None = None
    audit_anchor_url: str | None = None
    # The key broker's admin API (receipts, key state, release policies, revocation). The console
    # holds no broker credential: it forwards the signed-in person's own broker token
    # (api/console/broker_token.py), after checking the person's role and tenant.
    broker_url: str | None = None
    # Tenant policy admin public keys, `<tenant>/<key_id>.pub` (PEM), to verify signed policies.
    policy_keys_dir: Path | None = None
    session_ttl_s: int = 8 * 3600
    # Session cookies are Secure. The one exception, for a gateway reached directly over plain HTTP
    # on loopback (`sealed up` on 127.0.0.1): True drops the flag for exactly such requests
    # (api/console/session.py cookie_secure); the gateway refuses it on a non-loopback bind.
    unsafe_plain_http_loopback: bool = False
    page_size: int = 50

    @property
    def keys_dir(self) -> Path | None:
        if self.audit_keys_dir is not None:
            return self.audit_keys_dir
        return self.audit_dir / "keys" if self.audit_dir is not None else None


def loopback_host(host: str | None) -> bool:
    """A loopback address or name (where --unsafe-console-plain-http-loopback may apply)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address((host or "").strip("[]")).is_loopback
    except ValueError:
        return False
