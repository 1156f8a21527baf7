"""`python -m api.gateway --data-dir DIR --routes FILE --port N`: run the gateway."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import uvicorn

from api.gateway.app import create_app
from api.gateway.settings import GatewaySettings, WorkerRoute


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.gateway")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--routes", type=Path, required=True, help="JSON list of worker routes")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dev", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gateway %(levelname)s %(message)s")
    routes = tuple(WorkerRoute(**r) for r in json.loads(args.routes.read_text()))
    settings = GatewaySettings(data_dir=args.data_dir, workers=routes, dev=args.dev)
    # access_log off: request lines are metadata, but we keep the gateway's logs to decisions only.
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
