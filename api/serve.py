"""`python -m api.gateway --data-dir DIR [--routes FILE] --port N`: run the control plane's HTTP server
(gateway, management API and console, composed by `api.app`)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import uvicorn

from api.app import create_app
from api.console_settings import ConsoleSettings, loopback_host
from api.gateway.settings import GatewaySettings, WorkerRoute
from api.http_server import ConnectionLimits, server_config, shorten_gil_switch_interval
from api.oidc_settings import OidcSettings
from protocol.asgi import freeze_startup_heap, schedule_full_collections


def _secret(path: Path | None) -> str:
    return path.read_text().strip() if path else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.gateway")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--routes", type=Path, default=None, help="JSON list of {tenant, model, version} served")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dev", action="store_true")
    parser.add_argument("--database-url", default=None, help="default: SQLite in --data-dir")
    parser.add_argument("--redis-url", default=None, help="share limits and queues with other replicas")
    parser.add_argument("--register-token-file", type=Path, default=None)
    parser.add_argument("--jwt-secret-file", type=Path, default=None)
    parser.add_argument("--max-inflight", type=int, default=256)
    parser.add_argument("--max-queued", type=int, default=1024)
    parser.add_argument("--adaptive-lag", type=float, default=0.005,
                        help="event-loop lag (s) past which dispatch slots shrink below --max-inflight; 0: fixed")
    parser.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a connection may take to send a request's headers")
    parser.add_argument("--max-connections", type=int, default=4096, help="open client connections at once")
    parser.add_argument("--gil-switch-interval", type=float, default=0.001,
                        help="seconds a thread holds the GIL while another waits (CPython's default: 0.005)")
    parser.add_argument("--http", choices=("auto", "httptools", "h11"), default="auto",
                        help="HTTP/1.1 parser (auto: httptools when installed, else h11)")
    parser.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="event loop (auto, asyncio: asyncio's, light tenants first; uvloop: FIFO)")
    parser.add_argument("--broker-jwks", type=Path, default=None,
                        help="route only to workers whose broker-signed attestation binds their channel keys")
    parser.add_argument("--audit-dir", type=Path, default=None, help="audit logs the console shows and verifies")
    parser.add_argument("--audit-keys-dir", type=Path, default=None,
                        help="component public keys for the audit logs (default AUDIT_DIR/keys)")
    parser.add_argument("--audit-witness", type=Path, default=None,
                        help="witness file of anchored audit checkpoints the console checks the logs against")
    parser.add_argument("--audit-anchor-url", default=None, help="anchor database of audit checkpoints (SQL URL)")
    parser.add_argument("--broker-url", default=None,
                        help="key broker admin API, for the console's Keys page (the gateway holds no broker "
                             "credential: the console forwards each person's own broker token)")
    parser.add_argument("--policy-keys-dir", type=Path, default=None,
                        help="tenant policy admin public keys, TENANT/KEY_ID.pub, to verify signed policies")
    parser.add_argument("--reference-values", type=Path, default=None,
                        help="signed reference values to serve at /.well-known/reference-values")
    parser.add_argument("--oidc-config", type=Path, default=None,
                        help="single sign-on: JSON settings of the enterprise's OpenID Provider (docs/sso.md); "
                             "without it, the local-development mode (shared-secret HS256 tokens)")
    parser.add_argument("--unsafe-console-plain-http-loopback", action="store_true",
                        help="console session cookies without Secure for plain-HTTP requests on loopback "
                             "(only with a loopback --host; anything proxied stays Secure)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gateway %(levelname)s %(message)s")
    if args.unsafe_console_plain_http_loopback:
        if not loopback_host(args.host):
            parser.error("--unsafe-console-plain-http-loopback needs a loopback --host (127.0.0.1, ::1, localhost)")
        logging.getLogger("api.gateway").warning(
            "UNSAFE: console session cookies are not Secure for plain-HTTP requests on loopback "
            "(--unsafe-console-plain-http-loopback); serve the console over HTTPS anywhere else")
    routes = tuple(WorkerRoute(**r) for r in json.loads(args.routes.read_text())) if args.routes else ()
    try:
        settings = _settings(args, routes)
    except ValueError as exc:  # a missing or placeholder secret, a bad --oidc-config: one line, no traceback
        parser.error(str(exc))
    limits = ConnectionLimits(header_timeout_s=args.header_timeout, max_connections=args.max_connections)
    app = create_app(settings)
    shorten_gil_switch_interval(args.gil_switch_interval)
    freeze_startup_heap()  # full GC passes scan only what serving creates
    schedule_full_collections()  # and run on a timer, not every few seconds under load
    uvicorn.Server(server_config(app, args.host, args.port, limits, http=args.http,
                                 loop=args.loop, timeout_graceful_shutdown=5)).run()
    return 0


def _settings(args: argparse.Namespace, routes: tuple[WorkerRoute, ...]) -> GatewaySettings:
    return GatewaySettings(data_dir=args.data_dir, workers=routes, dev=args.dev,
                               database_url=args.database_url, redis_url=args.redis_url,
                               register_token=_secret(args.register_token_file),
                               jwt_secret=_secret(args.jwt_secret_file), max_inflight=args.max_inflight,
                               adaptive_lag_s=args.adaptive_lag or None,
                               max_queued=args.max_queued, broker_jwks=args.broker_jwks,
                               reference_values=args.reference_values,
                               oidc=OidcSettings.from_file(args.oidc_config) if args.oidc_config else None,
                               console=ConsoleSettings(audit_dir=args.audit_dir, audit_keys_dir=args.audit_keys_dir,
                                                       audit_witness=args.audit_witness,
                                                       audit_anchor_url=args.audit_anchor_url,
                                                       broker_url=args.broker_url,
                                                       policy_keys_dir=args.policy_keys_dir,
                                                       unsafe_plain_http_loopback=args.unsafe_console_plain_http_loopback))


if __name__ == "__main__":
    raise SystemExit(main())
