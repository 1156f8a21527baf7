"""`sealed bench sealed`: what sealed mode's cryptography costs, per request and per streamed chunk.

Client and worker sides of docs/sealed-mode.md on this CPU, no network: seal a request (fresh HPKE
encapsulation), open it (decapsulation, replay check, response key export), seal and open one
response chunk of a typical streamed size, sign and verify a receipt. Medians over --iterations.
The end-to-end cost is `sealed bench serve --sealed`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.sealed import (
    Receipt,
    ReplayGuard,
    RequestContext,
    WorkerKey,
    open_request,
    seal_request,
    sign_receipt,
    verify_receipt,
)
from protocol.sealed.padding import DEFAULT_PADDING, PaddingPolicy


def _median_us(fn: Callable[[], object], iterations: int) -> float:
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sealed bench sealed", description=__doc__)
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--body-bytes", type=int, default=2048, help="request body size (an OpenAI chat request)")
    p.add_argument("--chunk-bytes", type=int, default=200, help="one streamed SSE event")
    p.add_argument("--padding-min-bytes", type=int, default=DEFAULT_PADDING.min_bytes,
                   help="smallest size bucket (0: no padding; docs/sealed-mode.md)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    padding = PaddingPolicy(min_bytes=args.padding_min_bytes)
    worker, signer = WorkerKey.generate(), Ed25519PrivateKey.generate()
    signer_public = signer.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ctx = RequestContext("tenant", "model", "/v1/chat/completions", worker.key_id, version="v1",
                         api_key_id="key_0123456789abcdef", policy_version=1)
    body, chunk = b"x" * args.body_bytes, b"y" * args.chunk_bytes
    guard = ReplayGuard(max_entries=10 * args.iterations + 10)
    sealed = seal_request(worker.public_bytes, ctx, body, time.time(), padding=padding)
    opened = open_request(worker, ctx, sealed.wire, time.time(), guard, response_padding=padding)
    frames = [opened.sealer.seal(chunk) for _ in range(args.iterations)]
    sealed.opener.feed(opened.sealer.header())
    frame_iter = iter(frames)
    receipt = Receipt("a" * 64, "b" * 64, worker.key_id, "tenant", "model", "v1", "d", 1, 10, 20, "sim", True, 0.0,
                      api_key_id=ctx.api_key_id, signing_key=signer_public.hex(), channel_spki="",
                      evidence_sha256="e" * 64)
    final = sign_receipt(receipt, signer)
    results = {
        "seal_request_us": _median_us(lambda: seal_request(worker.public_bytes, ctx, body, time.time(),
                                                           padding=padding), args.iterations),
        "open_request_us": _median_us(lambda: open_request(
            worker, ctx, seal_request(worker.public_bytes, ctx, body, time.time(), padding=padding).wire,
            time.time(), guard), args.iterations),
        "seal_chunk_us": _median_us(lambda: opened.sealer.seal(chunk), args.iterations),
        "open_chunk_us": _median_us(lambda: sealed.opener.feed(next(frame_iter)), args.iterations),
        "sign_receipt_us": _median_us(lambda: sign_receipt(receipt, signer), args.iterations),
        "verify_receipt_us": _median_us(lambda: verify_receipt(
            final, signer_public, request_sha256="a" * 64, response_sha256="b" * 64, worker_key_id=worker.key_id,
            model="model"), args.iterations),
    }
    results["request_wire_bytes"] = len(sealed.wire)
    results["chunk_frame_bytes"] = len(frames[0])
    # open_request_us includes one seal_request (a fresh request each time): report the difference too.
    results["open_request_only_us"] = results["open_request_us"] - results["seal_request_us"]
    for name, value in results.items():
        print(f"{name:22s} {value:9.1f} {'bytes' if name.endswith('_bytes') else 'µs'}")
    if args.json:
        args.json.write_text(json.dumps({"conditions": {k: v for k, v in vars(args).items() if k != "json"},
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
