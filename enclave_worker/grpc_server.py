"""The worker process's entry point under its first name: `python -m enclave_worker.grpc_server ...`
is `python -m enclave_worker ...` (`enclave_worker/cli.py`). Deployments and `sealed up` start
workers this way; `enclave_worker.__main__` imports it, so it is in the measured code."""

from enclave_worker.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
