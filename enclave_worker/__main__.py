"""`python -m enclave_worker ...`: run one worker (attest, obtain key, decrypt, serve)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

from enclave_worker.server import create_app
from enclave_worker.settings import WorkerSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m enclave_worker")
    parser.add_argument("--broker-url", required=True)
    parser.add_argument("--package-dir", type=Path, required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--tee", default="sim", choices=["sim", "snp", "tdx"])
    parser.add_argument("--sim-platform-key", type=Path, default=None)
    parser.add_argument("--unsafe-sim-measurement", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    settings = WorkerSettings(
        broker_url=args.broker_url, package_dir=args.package_dir, tenant=args.tenant, model=args.model,
        version=args.version, tee=args.tee, sim_platform_key=args.sim_platform_key,
        unsafe_sim_measurement=args.unsafe_sim_measurement, host=args.host, port=args.port,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
    )
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
