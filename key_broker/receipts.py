"""Signed release receipts: the tenant's own, offline-verifiable record of every key release."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from key_broker.errors import KeyBrokerError
from key_broker.names import check_name


class ReceiptError(KeyBrokerError):
    """A receipt does not verify."""


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(body), sort_keys=True, separators=(",", ":")).encode()


class ReceiptBook:
    """Append-only JSONL per tenant; each line {"receipt": {...}, "signature": b64}."""

    def __init__(self, root: Path, signing_key: Ed25519PrivateKey) -> None:
        self._root = root / "receipts"
        self._key = signing_key
        self._lock = threading.Lock()

    def issue(self, body: Mapping[str, Any]) -> dict[str, Any]:
        line = {"receipt": dict(body), "signature": base64.b64encode(self._key.sign(_canonical(body))).decode()}
        path = self._root / f"{check_name(str(body['tenant']), 'tenant')}.jsonl"
        with self._lock:
            self._root.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, sort_keys=True) + "\n")
                fh.flush()
        return line

    def list(self, tenant: str) -> list[dict[str, Any]]:
        path = self._root / f"{check_name(tenant, 'tenant')}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def verify_receipt(line: Mapping[str, Any], broker_key: Ed25519PublicKey) -> dict[str, Any]:
    try:
        body = line["receipt"]
        signature = base64.b64decode(line["signature"], validate=True)
        broker_key.verify(signature, _canonical(body))
    except (KeyError, TypeError, ValueError, InvalidSignature) as exc:
        raise ReceiptError(f"receipt does not verify: {exc}") from exc
    return dict(body)
