"""Gateway settings: explicit and frozen; placeholder secrets are refused outside dev."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from api.console_settings import ConsoleSettings
from api.oidc_settings import OidcSettings
from protocol.sampling import DEFAULT_MAX_TOKENS

PLACEHOLDER_SECRETS = frozenset({"", "changeme", "change-me", "secret", "dev", "test", "password", "placeholder"})
MIN_SECRET_LEN = 32


@dataclass(frozen=True)
class WorkerRoute:
    """A model version the gateway serves (the catalog); workers for it register by heartbeat."""

    tenant: str
    model: str
    version: str
    url: str = ""  # legacy field of the first routes file; workers now announce their own address


@dataclass(frozen=True)
class GatewaySettings:
    data_dir: Path
    workers: tuple[WorkerRoute, ...] = field(default_factory=tuple)
    dev: bool = False
    database_url: str | None = None  # default: SQLite in data_dir
    redis_url: str | None = None  # None: rate limits and queue counters in this process
    register_token: str = ""  # workers present it with their heartbeats
    jwt_secret: str = ""  # HS256 key of the management API's bearer tokens
    request_timeout_s: float = 600.0
    heartbeat_timeout_s: float = 3.0
    max_inflight: int = 256  # requests dispatched to workers at once (beyond: fair queue)
    # Dispatch slots follow the event loop's lag below max_inflight (capacity.py); None: fixed slots.
    adaptive_lag_s: float | None = 0.005
    max_queued: int = 1024  # queued across tenants; and the default bound per tenant
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_body_bytes: int = 4 << 20
    max_choices: int = 64  # streams one request may open: prompts x n (400 beyond)
    # The key broker's JWKS: when set, a worker is routed to only after its attestation token
    # (signed by that broker) binds the TLS and usage keys it registered with.
    broker_jwks: Path | None = None
    broker_issuer: str = "sealed-key-broker"
    # The operator's signed in-toto statement of allowed worker measurements (served as is).
    reference_values: Path | None = None
    # The shared audit directory (default: <data_dir>/../audit, beside the key broker's log).
    audit_dir: Path | None = None
    console: ConsoleSettings = field(default_factory=ConsoleSettings)  # the web console (/console)
    # Single sign-on (management API bearer tokens and console sign-in from the enterprise's IdP);
    # None: the local-development mode, shared-secret HS256 tokens (`jwt_secret`).
    oidc: OidcSettings | None = None

    def __post_init__(self) -> None:
        if self.dev:
            return
        for name in ("register_token", "jwt_secret"):
            value = getattr(self, name)
            if value.strip().lower() in PLACEHOLDER_SECRETS or len(value) < MIN_SECRET_LEN:
                flag = "--" + name.replace("_", "-") + "-file"  # the gateway's command-line flag
                raise ValueError(f"{name} ({flag}) is missing, a placeholder or too short ({MIN_SECRET_LEN}+ "
                                 "characters) outside dev mode")

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'control-plane.db'}"
