"""A plaintext search's one audit entry: every file id it names survives the log's bounds and reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.gateway.retrieval_audit import file_id_fields, file_ids_of
from api.gateway.vector_stores import new_id
from policy.audit import AuditLog
from policy.audit.entry import MAX_META_KEYS, MAX_META_STR, WITHHELD_PREFIX, MetaValue
from policy.audit.verify import verify_log


@pytest.mark.parametrize("count", [0, 1, 8, 9, 50])
def test_a_searchs_file_ids_fit_one_signed_entry_and_read_back(tmp_path: Path, count: int) -> None:
    ids = sorted(new_id("file") for _ in range(count))  # the gateway's ids, as the worker returns them
    key = Ed25519PrivateKey.generate()
    log = AuditLog(tmp_path / "gateway.audit.jsonl", key, "gateway")
    fields = file_id_fields(ids)
    metadata: dict[str, MetaValue] = {
        "key_id": "key-1",
        "vector_store_id": new_id("vs"),
        "search_id": new_id("search"),
        "files": count,
        **fields,
    }
    assert len(metadata) <= MAX_META_KEYS and all(len(v) <= MAX_META_STR for v in fields.values())
    log.append(tenant="t", action="vector_store.search", decision="allow", reason="caller", metadata=metadata)
    log.close()
    (entry,) = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert not any(str(v).startswith(WITHHELD_PREFIX) for v in entry["metadata"].values())  # none withheld
    assert file_ids_of(entry["metadata"]) == ids
    verify_log(log.path, {"gateway": key.public_key()})


def test_an_id_holding_the_separator_is_refused() -> None:
    with pytest.raises(ValueError, match="separator"):
        file_id_fields(["file-a,file-b"])
