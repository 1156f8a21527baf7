"""Usage rows as the gateway stores them: a worker's signed record, its usage key registered (the
ledger counts only rows that verify, api/store/ledger.py)."""

from __future__ import annotations

import base64
import datetime as dt
import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.store.models import UsageRow
from api.store.repo import Store
from policy.audit.worker_record import public_key_bytes

USAGE_KEY = Ed25519PrivateKey.generate()  # a worker's usage key, for these tests


def signed_row(store: Store, *, request_id: str, tenant: str, key_id: str, prompt_tokens: int,
               completion_tokens: int, worker_seconds: float, model: str = "m", version: str = "v1",
               worker_id: str = "w", created_at: dt.datetime | None = None) -> UsageRow:
    record = {"request_id": request_id, "tenant": tenant, "key_id": key_id, "model": model, "version": version,
              "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
              "worker_seconds": worker_seconds, "at": 0.0}
    payload = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    public = public_key_bytes(USAGE_KEY).hex()
    store.remember_usage_key(public, tenant, worker_id, {})
    return UsageRow(request_id=request_id, tenant=tenant, key_id=key_id, model=model, version=version,
                    worker_id=worker_id, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                    worker_seconds=worker_seconds, signature=USAGE_KEY.sign(payload).hex(),
                    payload=base64.b64encode(payload).decode(), public_key=public, created_at=created_at)
