"""Signed release receipts: the tenant's own, offline-verifiable record of every key release.

Each receipt names the tenant, model (and its signed plaintext digest), the worker's measurement
and TEE type, the time, the policy id and version and the token id; it is signed by the broker's
Ed25519 receipt key, whose public half the tenant fetches once and pins.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from key_broker.names import check_name
from protocol.broker.receipts import ReceiptInvalid, receipt_payload, verify_receipt  # the format is public

__all__ = ["ReceiptBook", "ReceiptInvalid", "public_key_pem", "verify_receipt"]


def public_key_pem(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class ReceiptBook:
    """Append-only JSONL per tenant; each line {"receipt": {...}, "signature": b64}.

    Durability follows the audit log's "batch" mode: each receipt is one write() before the
    release is answered, so a killed or restarted broker loses none; a background flusher fsyncs
    within `sync_interval_s`, so only power loss can lose that window. Per-release fsync would
    double the release latency (it dominated the profile) for no gain against process crashes.
    """

    def __init__(self, root: Path, signing_key: Ed25519PrivateKey, sync_interval_s: float = 0.05) -> None:
        self._root = root / "receipts"
        self._key = signing_key
        self._lock = threading.Lock()
        self._interval = sync_interval_s
        self._dirty: set[Path] = set()
        self._wake = threading.Event()
        self._closed = False
        self._flusher: threading.Thread | None = None  # started by the first issue (readers need none)

    def _flush_loop(self) -> None:
        while not self._closed:
            self._wake.wait()
            time.sleep(self._interval)  # gather a batch of appends into one fsync per file
            self.flush()

    def flush(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            self._wake.clear()
        for path in dirty:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self.flush()

    @property
    def public_key_pem(self) -> str:
        return public_key_pem(self._key)

    def issue(self, body: Mapping[str, Any]) -> dict[str, Any]:
        signature = base64.b64encode(self._key.sign(receipt_payload(body))).decode()
        line = {"receipt": dict(body), "signature": signature}
        path = self._root / f"{check_name(str(body['tenant']), 'tenant')}.jsonl"
        data = (json.dumps(line, sort_keys=True) + "\n").encode()
        with self._lock:
            self._root.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)  # one write: a crash leaves whole lines (a torn tail is skipped)
            finally:
                os.close(fd)
            self._dirty.add(path)
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="receipts-fsync", daemon=True)
                self._flusher.start()
            self._wake.set()
        return line

    def list(self, tenant: str) -> list[dict[str, Any]]:
        path = self._root / f"{check_name(tenant, 'tenant')}.jsonl"
        if not path.exists():
            return []
        out = []
        for raw in path.read_text().splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue  # a torn last line from a crash mid-append
        return out

    def token_ids_since(self, since: dt.datetime) -> set[str]:
        """Token ids released at or after `since` (all tenants), to refuse replays after a restart."""
        ids: set[str] = set()
        if not self._root.is_dir():
            return ids
        for path in self._root.glob("*.jsonl"):
            for line in self.list(path.stem):
                body = line.get("receipt", {})
                try:
                    if dt.datetime.fromisoformat(body["time"]) >= since:
                        ids.add(str(body["token_id"]))
                except (KeyError, TypeError, ValueError):
                    continue
        return ids
