"""`python -m api.gateway --data-dir DIR [--routes FILE] --port N`: run the gateway."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import uvicorn

from api.gateway.app import create_app
from api.gateway.http_server import ConnectionLimits, server_config
from api.gateway.settings import GatewaySettings, WorkerRoute


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
    parser.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a connection may take to send a request's headers")
    parser.add_argument("--max-connections", type=int, default=4096, help="open client connections at once")
    parser.add_argument("--broker-jwks", type=Path, default=None,
                        help="route only to workers whose broker-signed attestation binds their channel keys")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gateway %(levelname)s %(message)s")
    routes = tuple(WorkerRoute(**r) for r in json.loads(args.routes.read_text())) if args.routes else ()
    settings = GatewaySettings(data_dir=args.data_dir, workers=routes, dev=args.dev,
                               database_url=args.database_url, redis_url=args.redis_url,
                               register_token=_secret(args.register_token_file),
                               jwt_secret=_secret(args.jwt_secret_file), max_inflight=args.max_inflight,
                               max_queued=args.max_queued, broker_jwks=args.broker_jwks)
    limits = ConnectionLimits(header_timeout_s=args.header_timeout, max_connections=args.max_connections)
    uvicorn.Server(server_config(create_app(settings), args.host, args.port, limits,
                                 timeout_graceful_shutdown=5)).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
