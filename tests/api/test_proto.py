"""The committed gRPC modules are exactly what `python -m protocol.rpc.generate` makes from worker.proto."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.rpc import generate


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools regenerates the modules")
    assert generate.main(["--out", str(tmp_path)]) == 0
    for name in ("worker_pb2.py", "worker_pb2_grpc.py"):
        assert (tmp_path / name).read_text() == (generate.HERE / name).read_text(), f"{name} is stale"
