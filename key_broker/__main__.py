"""`python -m key_broker --data-dir DIR --port N [--sim-platform-key PEM]`: run the key broker."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

from key_broker.app import create_app
from key_broker.settings import BrokerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m key_broker")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--sim-platform-key", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s key-broker %(levelname)s %(message)s")
    settings = BrokerSettings(data_dir=args.data_dir, sim_platform_public_key=args.sim_platform_key)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
