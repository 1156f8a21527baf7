"""The Files and Vector Stores rows (api/store/retrieval.py, migration 0010) on SQLite and PostgreSQL:
tenant-scoped reads, binding a store once, the snapshot replaced compare-and-set on its version
(a stale change does not land), deletion of a store with its file rows."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from api.store.db import make_engine, session_factory, upgrade
from api.store.models import utcnow
from api.store.retrieval import RetrievalStore, StoreFile
from tests.api.fleet import postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def rows(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RetrievalStore]:
    if request.param == "sqlite":
        url, cleanup = f"sqlite:///{tmp_path / 'cp.db'}", None
    else:
        cleanup = postgres_database()
        url = next(cleanup)
    engine = make_engine(url)
    upgrade(engine)
    yield RetrievalStore(session_factory(engine))
    engine.dispose()
    if cleanup is not None:
        next(cleanup, None)


def _row(file_id: str, status: str = "completed") -> StoreFile:
    return StoreFile("vs-1", file_id, None, status, None, None, 10, {"team": "hr"}, {"type": "static"}, utcnow())


def test_files_are_scoped_to_their_tenant(rows: RetrievalStore) -> None:
    rows.put_file(file_id="file-1", tenant="acme", purpose="assistants", filename="a.txt", size=3, model="m",
                  version="v1", blob=b"\x00sealed")
    assert rows.file("acme", "file-1") is not None and rows.file("globex", "file-1") is None
    assert [f.id for f in rows.files("acme")] == ["file-1"] and rows.files("acme", "user_data") == []
    assert rows.files("globex") == [] and not rows.delete_file("globex", "file-1")
    assert rows.delete_file("acme", "file-1") and rows.file("acme", "file-1") is None


def test_the_snapshot_is_replaced_compare_and_set(rows: RetrievalStore) -> None:
    rows.put_store(store_id="vs-1", tenant="acme", name="s", metadata={"k": "v"}, model="", version="")
    rows.bind_store("acme", "vs-1", "m", "v1")
    rows.bind_store("acme", "vs-1", "m2", "v9")  # bound once: a later bind changes nothing
    store = rows.store("acme", "vs-1")
    assert store is not None and (store.model, store.version, store.snapshot_version) == ("m", "v1", 0)
    assert rows.replace_snapshot("acme", "vs-1", 0, b"snap1", 1, 10, store_file=_row("file-1"))
    assert not rows.replace_snapshot("acme", "vs-1", 0, b"stale", 1, 10, store_file=_row("file-2"))  # raced
    assert not rows.replace_snapshot("globex", "vs-1", 1, b"other", 2, 0)  # another tenant's id
    store = rows.store("acme", "vs-1")
    assert store is not None and (store.snapshot, store.snapshot_version, store.usage_bytes) == (b"snap1", 1, 10)
    assert [f.file_id for f in rows.store_files("acme", "vs-1")] == ["file-1"]
    assert rows.store_file("globex", "vs-1", "file-1") is None and rows.store("globex", "vs-1") is None
    assert rows.replace_snapshot("acme", "vs-1", 1, b"snap2", 2, -10, drop_file="file-1")
    assert rows.store_files("acme", "vs-1") == []
    rows.put_store_file("acme", _row("file-3", "failed"))
    assert not rows.drop_failed_file("acme", "vs-1", "file-1") and rows.drop_failed_file("acme", "vs-1", "file-3")
    rows.put_store_file("acme", _row("file-4"))
    assert not rows.delete_store("globex", "vs-1") and rows.delete_store("acme", "vs-1")
    assert rows.store("acme", "vs-1") is None and rows.store_files("acme", "vs-1") == []


def test_the_store_head_is_the_row_without_its_snapshot_and_scoped_to_its_tenant(rows: RetrievalStore) -> None:
    made = rows.put_store(store_id="vs-1", tenant="acme", name="s", metadata={"k": "v"}, model="", version="")
    rows.bind_store("acme", "vs-1", "m", "v1")
    assert rows.replace_snapshot("acme", "vs-1", 0, b"snap1", 1, 10, store_file=_row("file-1"))
    head, whole = rows.store_head("acme", "vs-1"), rows.store("acme", "vs-1")
    assert head is not None and whole is not None and whole.snapshot == b"snap1" and head.snapshot == b""
    assert head == replace(whole, snapshot=b"")  # every other field as stored
    assert (head.name, head.metadata, head.model, head.version, head.snapshot_version, head.usage_bytes) == (
        "s", {"k": "v"}, "m", "v1", 1, 10)
    assert head.created_at == whole.created_at and made.id == head.id
    assert rows.store_head("globex", "vs-1") is None  # another tenant's id reads as absent
    assert rows.store_head("acme", "vs-2") is None
    assert rows.delete_store("acme", "vs-1") and rows.store_head("acme", "vs-1") is None
