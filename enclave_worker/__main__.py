"""`python -m enclave_worker ...`: run one worker (attest, obtain key, decrypt, serve over gRPC)."""

from enclave_worker.grpc_server import main

if __name__ == "__main__":
    raise SystemExit(main())
