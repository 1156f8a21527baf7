"""`sealed bench upload`: server memory while a large package streams in, with the connection cut.

    sealed bench upload --mib 512 --cuts 2 --json out.json
    sealed bench upload --package PKG --cuts 2 --json out.json   (an existing package, e.g. an 8B model's)

Writes a package of about MIB MiB (zero-valued tensors, streamed into the writer: the ciphertext is
as random as any), serves the management API's upload router (api/management/uploads.py, the
code the gateway mounts) under uvicorn in its own process, and uploads the package with `sealed
upload`'s client through a proxy that cuts the connection CUTS times (sealed_bench/cutting_proxy.py).
Reported: the server's resident memory before, the highest of its samples during (VmRSS every
50 ms) and its VmHWM, the growth, the throughput, and the cuts survived. Target (issue #49): server
memory flat (growth independent of the package size). No assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_SERVER = """
import sys
from pathlib import Path
import uvicorn
from fastapi import FastAPI, Header, HTTPException
from api.management import uploads
from api.parts import RouteBinder
def caller(authorization: str = Header("")) -> str:
    if authorization != "Bearer bench":
        raise HTTPException(401, "bad token")
    return "bench"
app = FastAPI()
binder = RouteBinder(app)
binder.bind(uploads.package_store, uploads.PackageStore(Path(sys.argv[1])))
binder.replace(uploads.uploader, caller)
binder.include(uploads.router)
@app.get("/healthz")
def healthz() -> dict: return {"ok": True}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""
_ZEROS = memoryview(bytes(4 << 20))


class _Zeros:
    """A uint8 tensor source of N zero bytes that holds no memory of its own."""

    def __init__(self, nbytes: int) -> None:
        import torch

        self.dtype, self.shape, self.nbytes = torch.uint8, (nbytes,), nbytes

    def views(self, start: int, length: int) -> Iterator[memoryview]:
        for pos in range(0, length, len(_ZEROS)):
            yield _ZEROS[: min(len(_ZEROS), length - pos)]


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(key)


def _make_package(root: Path, mib: int) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from enclave_worker.package.writer import write_package

    parts = [(f"blob.{i}", _Zeros(min(64, mib - i * 64) << 20)) for i in range(-(-mib // 64))]
    write_package(root, metadata={"config": {}}, tensors=parts, data_key=os.urandom(32),
                  key_id="dek-bench", tenant="bench", model="bench-upload", version="v1",
                  signing_key=Ed25519PrivateKey.generate())


def main(argv: list[str] | None = None) -> int:
    import httpx

    from api.cli.upload import describe, upload_package
    from api.stack import free_port
    from sealed_bench.cutting_proxy import CuttingProxy

    parser = argparse.ArgumentParser(prog="sealed bench upload", description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512, help="package size in MiB")
    parser.add_argument("--cuts", type=int, default=2, help="connection cuts during the upload")
    parser.add_argument("--package", type=Path, default=None,
                        help="upload this package directory (left in place) instead of making one of --mib")
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="sealed-bench-upload-"))
    server = None
    try:
        pkg = args.package
        if pkg is None:
            pkg = work / "pkg"
            _make_package(pkg, args.mib)
        total = sum(f["size"] for f in describe(pkg).values())
        port = free_port()
        server = subprocess.Popen([sys.executable, "-c", _SERVER, str(work / "store"), str(port)])
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as probe:
            for _ in range(600):  # up to a minute for the server to listen
                try:
                    probe.get("/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
        before = _status(server.pid, "VmRSS")
        samples: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append(_status(server.pid, "VmRSS"))
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        proxy = CuttingProxy(port, cut_at=[total * (i + 1) // (args.cuts + 1) for i in range(args.cuts)])
        start = time.perf_counter()
        with httpx.Client(base_url=f"http://127.0.0.1:{proxy.port}", headers={"authorization": "Bearer bench"},
                          timeout=300.0) as client:
            record = upload_package(pkg, client, chunk_bytes=args.chunk_mib << 20)
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
        proxy.close()
        report: dict[str, Any] = {
            "package_bytes": total, "chunk_bytes": args.chunk_mib << 20, "cuts_requested": args.cuts,
            "cuts_survived": proxy.cuts, "stored": record["address"], "wall_s": round(wall, 2),
            "throughput_mbps": round(total / wall / 1e6, 1), "server_rss_before": before,
            "server_rss_max_sample": max(samples), "server_vmhwm": _status(server.pid, "VmHWM"),
            "server_rss_growth_mib": round((max(samples) - before) / 2**20, 1), "samples": len(samples),
        }
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
