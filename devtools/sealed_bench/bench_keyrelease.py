"""Key-release benchmark: full round trips (challenge -> attest -> sealed key -> open) with
simulated evidence against a real broker process on localhost.

Run: ``sealed bench keyrelease`` or ``python sealed_bench/bench_keyrelease.py --json out.json``.
Reports sequential p50/p99 (target p99 <= 50 ms) and a burst of concurrent releases, checking that
none is lost or duplicated (distinct token ids and receipts). No assertions on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import secrets
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData, expected_report_data
from attestation.sim import SimTee
from protocol.broker.client import obtain_data_key
from protocol.broker.sealing import open_sealed, raw_public_key, release_info
from protocol.model_ref import ModelRef
from protocol.package.signing import signer_identity
from sealed_bench.processes import start_sim_broker

MEASUREMENT = bytes(range(48))
SCOPE = {"tenant": "bench", "model": "m", "version": "v1"}


def provision(url: str, admin_token: str) -> bytes:
    from sealed_bench.broker_tenant import put_policy, tenant_client

    signing_key = Ed25519PrivateKey.generate()
    c, policy_key = tenant_client(url, admin_token, "bench")
    with c:
        import_pem = httpx.get(f"{url}/v1/import-key", timeout=10).json()["public_key_pem"]
        body, data_key = _sealed_upload(import_pem, signing_key)
        c.put("/models/m/versions/v1/data-key", json=body).raise_for_status()
        put_policy(
            c,
            policy_key,
            {
                "policy_id": "bench",
                "version": 1,
                "tenant": "bench",
                "model": "m",
                "allowed_tee": ["sim"],
                "allowed_measurements": [MEASUREMENT.hex()],
                "required_signer": signer_identity(signing_key.public_key()),
                "unsafe_allow_simulated_tee": True,
            },
        )
    return data_key


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _one_async(client: httpx.AsyncClient, tee: SimTee) -> tuple[str, bytes]:
    worker = X25519PrivateKey.generate()
    ch = (await client.post("/v1/challenge")).json()
    runtime = RuntimeData(bytes.fromhex(ch["nonce"]), raw_public_key(worker))
    bundle = EvidenceBundle(
        tee="sim", cpu_evidence=tee.get_report(expected_report_data(runtime, ())), runtime_data=runtime
    )
    r = await client.post(
        "/v1/attest", json={"session_id": ch["session_id"], "evidence": bundle.to_json(), **SCOPE}
    )
    r.raise_for_status()
    k = await client.post("/v1/key", json={"token": r.json()["token"], **SCOPE})
    k.raise_for_status()
    body = k.json()
    key = open_sealed(
        base64.b64decode(body["sealed_key"]),
        worker,
        release_info(ModelRef(**SCOPE), body["token_id"]),
    )
    return body["token_id"], key


async def concurrent(url: str, tee: SimTee, n: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(_one_async(client, tee) for _ in range(n)), return_exceptions=True)
        elapsed = time.perf_counter() - started
    ok = [r for r in results if not isinstance(r, BaseException)]
    errors = [repr(r)[:200] for r in results if isinstance(r, BaseException)]
    return {
        "requested": n,
        "succeeded": len(ok),
        "failed": len(errors),
        "errors": errors[:5],
        "distinct_token_ids": len({t for t, _ in ok}),
        "wall_s": round(elapsed, 3),
        "releases_per_s": round(len(ok) / elapsed, 1),
        "keys": {k for _, k in ok},
    }


def _sealed_upload(import_pem: str, signing_key: Ed25519PrivateKey) -> tuple[dict, bytes]:
    """A tiny signed package's data key, sealed to the broker (the key never travels in the clear)."""
    import tempfile

    import torch

    from enclave_worker.package.writer import write_package
    from protocol.package.keywrap import seal_data_key, sealed_upload_body

    data_key = secrets.token_bytes(32)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_package(Path(tmp), metadata={"config": {}}, tensors=[("w", torch.zeros(4))],
                                 data_key=data_key, key_id="k1", tenant="bench", model="m", version="v1",
                                 signing_key=signing_key)
        public = serialization.load_pem_public_key(import_pem.encode())
        return sealed_upload_body(Path(tmp), seal_data_key(data_key, manifest, public)), data_key  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench keyrelease", description=__doc__)
    parser.add_argument("--iterations", type=int, default=200, help="sequential round trips")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=200, help="concurrent releases in the burst")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args(argv)

    platform_key, admin_token = Ed25519PrivateKey.generate(), secrets.token_urlsafe(32)
    tee = SimTee(platform_key, MEASUREMENT)

    def make_bundle(runtime: RuntimeData) -> EvidenceBundle:
        return EvidenceBundle(
            tee="sim", cpu_evidence=tee.get_report(expected_report_data(runtime, ())), runtime_data=runtime
        )

    with tempfile.TemporaryDirectory(prefix="bench-keyrelease-") as tmp:
        proc, url = start_sim_broker(Path(tmp), platform_key, admin_token, rate_limit_per_minute=10_000_000)
        try:
            data_key = provision(url, admin_token)
            latencies: list[float] = []
            with httpx.Client(base_url=url, timeout=30) as client:
                for i in range(args.warmup + args.iterations):
                    started = time.perf_counter()
                    released = obtain_data_key(client, ModelRef(**SCOPE), make_bundle=make_bundle)
                    if i >= args.warmup:
                        latencies.append((time.perf_counter() - started) * 1000)
                    assert released.data_key == data_key
            burst = asyncio.run(concurrent(url, tee, args.concurrency))
            receipts = httpx.get(
                f"{url}/v1/admin/tenants/bench/receipts",
                timeout=30,
                headers={"Authorization": f"Bearer {admin_token}"},
            ).json()["receipts"]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    receipt_ids = [line["receipt"]["token_id"] for line in receipts]
    keys = burst.pop("keys")
    result: dict[str, Any] = {
        "benchmark": "keyrelease",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "sequential_ms": {
            "n": len(latencies),
            "p50": round(statistics.median(latencies), 2),
            "p99": round(_percentile(latencies, 0.99), 2),
            "mean": round(statistics.mean(latencies), 2),
            "max": round(max(latencies), 2),
        },
        "concurrent": {**burst, "all_keys_correct": keys == {data_key}},
        "receipts": {
            "total": len(receipt_ids),
            "distinct": len(set(receipt_ids)),
            "expected": args.warmup + args.iterations + burst["succeeded"],
        },
        "target_p99_ms": 50,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    lost_or_dup = (
        burst["failed"]
        or burst["distinct_token_ids"] != burst["succeeded"]
        or len(set(receipt_ids)) != len(receipt_ids)
        or len(receipt_ids) != result["receipts"]["expected"]
    )
    return 1 if lost_or_dup else 0


if __name__ == "__main__":
    raise SystemExit(main())
