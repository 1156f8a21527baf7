"""Regenerate worker_pb2*.py from worker.proto: `python -m protocol.rpc.generate` (needs grpcio-tools).

The generated modules are committed so that running the service does not need grpcio-tools; this
script makes them reproducible. Imports are rewritten to be package-relative.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    """`--out DIR` writes elsewhere (the drift test compares that with the committed modules)."""
    from grpc_tools import protoc  # imported here: only this script needs grpcio-tools

    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[args.index("--out") + 1]) if "--out" in args else HERE
    rc = protoc.main(["grpc_tools.protoc", f"-I{HERE}", f"--python_out={out}", f"--grpc_python_out={out}",
                      str(HERE / "worker.proto")])
    if rc != 0:
        return rc
    grpc_module = out / "worker_pb2_grpc.py"
    text = re.sub(r"^import worker_pb2 as", "from protocol.rpc import worker_pb2 as", grpc_module.read_text(),
                  flags=re.M)
    grpc_module.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
