"""Revocation latency under a flood: how long after `sealed keys revoke` every worker holding the
key has given it up (wiped, stopped serving), while the key status and lease endpoints are flooded
with the public attestation token (the red-team attack of issue #13, finding 1).

A real key broker process on localhost (simulated evidence, its default rate limit), W workers per
round, each holding its key lease exactly as `enclave_worker` does (`KeyLease`, production timing:
60 s lease, 20 s held renewals), all in one event loop; a flood of `--flood-rps` requests a second
from other threads. Each round provisions a fresh tenant, lets the leases settle into held
renewals, revokes the tenant key through the admin API and records, per worker, the time from the
revoke call to the worker's wipe. Target: p99 <= 5 s. Exits non-zero if a worker did not stop
within `--give-up-s` or stopped for another reason than "revoked".

Run: ``sealed bench revocation [--rounds R] [--workers W] [--flood-rps N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attestation.bundle import EvidenceBundle, RuntimeData, channel_binding, expected_report_data
from attestation.sim import SimTee
from enclave_worker.keywatch import KeyLease, LeaseTiming
from protocol.broker.client import ReleasedKey, WorkerIdentity, obtain_data_key
from protocol.model_ref import ModelRef
from protocol.package.signing import signer_identity
from sealed_bench.bench_keyrelease import MEASUREMENT, _percentile
from sealed_bench.processes import start_sim_broker


def provision(url: str, admin_token: str, tenant: str) -> None:
    import torch

    from enclave_worker.package.writer import write_package
    from protocol.package.keywrap import seal_data_key, sealed_upload_body
    from sealed_bench.broker_tenant import put_policy, tenant_client

    signing_key = Ed25519PrivateKey.generate()
    data_key = secrets.token_bytes(32)
    c, policy_key = tenant_client(url, admin_token, tenant)
    with c, tempfile.TemporaryDirectory() as tmp:
        manifest = write_package(Path(tmp), metadata={"config": {}}, tensors=[("w", torch.zeros(4))],
                                 data_key=data_key, key_id="k1", tenant=tenant, model="m", version="v1",
                                 signing_key=signing_key)
        import_pem = httpx.get(f"{url}/v1/import-key", timeout=30).json()["public_key_pem"]
        public = serialization.load_pem_public_key(import_pem.encode())
        body = sealed_upload_body(Path(tmp), seal_data_key(data_key, manifest, public))  # type: ignore[arg-type]
        c.put("/models/m/versions/v1/data-key", json=body).raise_for_status()
        put_policy(c, policy_key, {
            "policy_id": tenant, "version": 1, "tenant": tenant, "model": "m", "allowed_tee": ["sim"],
            "allowed_measurements": [MEASUREMENT.hex()], "required_signer": signer_identity(signing_key.public_key()),
            "unsafe_allow_simulated_tee": True})


class Flood:
    """Status checks and lease renewals made with a public token, at `rps` requests a second."""

    def __init__(self, url: str, threads: int, rps: float) -> None:
        self.url, self.rps, self.threads_n = url, rps, threads
        self.token: dict[str, Any] | None = None  # {"token", "tenant", "model", "version"}
        self.stop = threading.Event()
        self.codes: dict[str, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            i = 0
            while not self.stop.is_set():
                started = time.monotonic()
                scope = self.token
                if scope is not None:
                    if i % 2 == 0:
                        path, body = "/v1/key/status", scope
                    else:
                        path, body = "/v1/lease", {**scope, "tls_spki": "", "identity_key": "00" * 32, "seq": i + 1,
                                                   "at": int(time.time()), "wait_s": 0.0, "signature": "00" * 64}
                    try:
                        code = str(client.post(path, json=body).status_code)
                    except httpx.HTTPError as exc:
                        code = type(exc).__name__
                    with self.lock:
                        self.codes[code] = self.codes.get(code, 0) + 1
                    i += 1
                time.sleep(max(0.0, self.threads_n / self.rps - (time.monotonic() - started)))

    def close(self) -> dict[str, int]:
        self.stop.set()
        for t in self.threads:
            t.join(15)
        return dict(self.codes)


async def one_round(url: str, admin_token: str, tenant: str, workers: int, tee: SimTee, flood: Flood,
                    settle_s: float, give_up_s: float) -> list[tuple[str, float]]:
    def make_bundle(runtime: RuntimeData) -> EvidenceBundle:
        return EvidenceBundle(tee="sim", cpu_evidence=tee.get_report(expected_report_data(runtime, ())),
                              runtime_data=runtime)

    await asyncio.to_thread(provision, url, admin_token, tenant)
    scope = {"tenant": tenant, "model": "m", "version": "v1"}
    leases: list[KeyLease] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(workers):
            identity = WorkerIdentity(Ed25519PrivateKey.generate())
            released: ReleasedKey = await asyncio.to_thread(
                obtain_data_key, client, ModelRef(**scope), make_bundle=make_bundle,
                channel_binding=channel_binding(b"", identity.public_key))
            leases.append(KeyLease(url, released, identity, ModelRef(**scope), timing=LeaseTiming()))
    flood.token = {"token": leases[0].released.token, **scope}  # the public token of this round
    lost: list[tuple[str, float] | None] = [None] * workers

    def recorder(i: int):  # type: ignore[no-untyped-def]
        def on_lost(reason: str) -> None:
            lost[i] = (reason, time.monotonic())
        return on_lost

    tasks = [asyncio.create_task(lease.run(recorder(i))) for i, lease in enumerate(leases)]
    await asyncio.sleep(settle_s)  # first renewals done, held renewals open, flood running
    revoked_at = time.monotonic()
    r = await asyncio.to_thread(httpx.post, f"{url}/v1/admin/tenants/{tenant}/key/revoke", timeout=30,
                                headers={"Authorization": f"Bearer {admin_token}"})
    r.raise_for_status()
    _, pending = await asyncio.wait(tasks, timeout=give_up_s)
    for task in pending:
        task.cancel()
    return [(item[0], item[1] - revoked_at) if item else ("still-serving", float("inf")) for item in lost]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench revocation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10, help="revocations (one fresh tenant each)")
    parser.add_argument("--workers", type=int, default=10, help="workers holding the key in each round")
    parser.add_argument("--flood-rps", type=float, default=100.0, help="flood requests a second (public token)")
    parser.add_argument("--flood-threads", type=int, default=4)
    parser.add_argument("--rate-limit-per-minute", type=int, default=600, help="the broker's (its default)")
    parser.add_argument("--settle-s", type=float, default=2.0, help="flood time before each revocation")
    parser.add_argument("--give-up-s", type=float, default=70.0, help="a worker not stopped by then fails the run")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args(argv)
    platform_key, admin_token = Ed25519PrivateKey.generate(), secrets.token_urlsafe(32)
    tee = SimTee(platform_key, MEASUREMENT)
    samples: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-revocation-") as tmp:
        proc, url = start_sim_broker(Path(tmp), platform_key, admin_token, args.rate_limit_per_minute)
        flood = Flood(url, args.flood_threads, args.flood_rps)
        flood.start()
        started = time.monotonic()
        try:
            for r in range(args.rounds):
                samples += asyncio.run(one_round(url, admin_token, f"rev{r}", args.workers, tee, flood,
                                                 args.settle_s, args.give_up_s))
        finally:
            flood_s = time.monotonic() - started
            codes = flood.close()
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    latencies = [s for reason, s in samples if reason == "revoked"]
    failed = [reason for reason, _ in samples if reason != "revoked"]
    sent = sum(codes.values())
    result = {
        "benchmark": "revocation",
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "load_avg_1m": round(os.getloadavg()[0], 2)},
        "config": {"rounds": args.rounds, "workers_per_round": args.workers, "flood_rps_target": args.flood_rps,
                   "broker_rate_limit_per_minute": args.rate_limit_per_minute,
                   "lease": {"lease_s": LeaseTiming().lease_s, "watch_s": LeaseTiming().watch_s}},
        "flood": {"requests": sent, "achieved_rps": round(sent / flood_s, 1), "codes": codes},
        "revocation_latency_s": {
            "n": len(latencies),
            "p50": round(statistics.median(latencies), 3) if latencies else None,
            "p99": round(_percentile(latencies, 0.99), 3) if latencies else None,
            "max": round(max(latencies), 3) if latencies else None,
        },
        "not_revoked": failed,
        "target_p99_s": 5.0,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
