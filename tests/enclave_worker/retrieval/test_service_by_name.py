"""The retrieval service with stores named rather than sent (enclave_worker/retrieval/service.py,
``base``), with the real encoder: a warm call needs no snapshot, a cold one says SnapshotNeeded; a
cached store is never served at another version or digest than the one named; an older version
than one seen is refused (StaleSnapshot) however it comes; a deletion is gone at once with the cache
warm; a wiped or rotated data key empties the cache and opens nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from enclave_worker.engine.embedder import Embedder
from enclave_worker.engine.encoder_checkpoint import load_encoder_dir
from enclave_worker.engine.layers.linear import LinearOptions
from enclave_worker.engine.models.options import BuildOptions
from enclave_worker.retrieval.errors import InvalidRetrievalRequest, SealedStoreError, SnapshotNeeded, StaleSnapshot
from enclave_worker.retrieval.service import FileUnreadable, RetrievalService, Snapshot
from protocol.rpc.snapshot_segments import SnapshotName

CONTRACT = "The supplier contract ends on 31 March. Termination needs 90 days notice."
HOLIDAYS = "Employees get 28 days of paid holiday a year, plus public holidays."
EMPTY = SnapshotName("vs_1", 0, b"")


@pytest.fixture(scope="module")
def encoder(minilm_dir: Path) -> Embedder:
    return Embedder(load_encoder_dir(minilm_dir), BuildOptions(LinearOptions(kernel="torch", in_place=True), 512))


class Keys:
    def __init__(self) -> None:
        self.key = bytes(range(32))

    def __call__(self) -> bytes:
        return self.key


def _name(snapshot: Snapshot) -> SnapshotName:
    assert snapshot.sha256 == hashlib.sha256(snapshot.blob).digest()
    return SnapshotName("vs_1", snapshot.version, snapshot.sha256)


def _ingest(service: RetrievalService, base: SnapshotName, file_id: str, text: str, read: bool = True) -> Snapshot:
    """One file in by name, and (``read``) the new snapshot read back, as the gateway does."""
    blob = service.seal_file("acme", file_id, text.encode())
    made = service.ingest("acme", "vs_1", b"", file_id, file_id + ".txt", blob, {}, None, base=base).snapshot
    if read:
        assert service.made("acme", _name(made)) == made.blob
        service.read(_name(made))
    return made


def _files(service: RetrievalService, base: SnapshotName, query: str = "When does the contract end?") -> list[str]:
    return [r.file_id for r in service.search("acme", "vs_1", b"", query, 5, base=base)]


def _two_files(service: RetrievalService) -> tuple[Snapshot, Snapshot]:
    first = _ingest(service, EMPTY, "file-legal", CONTRACT)
    return first, _ingest(service, _name(first), "file-hr", HOLIDAYS)


def test_warm_by_name_cold_needs_the_snapshot_then_serves_it(encoder: Embedder) -> None:
    maker = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    _, second = _two_files(maker)  # each new snapshot held for the gateway, and read
    with pytest.raises(SnapshotNeeded):
        maker.made("acme", _name(second))  # read once: not kept twice
    assert _files(maker, _name(second))[0] == "file-legal"  # warm: no snapshot given

    cold = RetrievalService(encoder, Keys(), "acme", "m", "v1")  # another worker (or a restarted one)
    with pytest.raises(SnapshotNeeded):
        _files(cold, _name(second))
    cold.load("acme", _name(second), second.blob)
    assert _files(cold, _name(second))[0] == "file-legal"


def test_a_cached_store_is_never_served_at_another_version_or_digest(encoder: Embedder) -> None:
    service = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    _, second = _two_files(service)
    for other in (
        SnapshotName("vs_1", second.version, b"\0" * 32),
        SnapshotName("vs_1", second.version + 1, second.sha256),
    ):
        with pytest.raises(SnapshotNeeded):
            _files(service, other)
    cold = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    with pytest.raises(SealedStoreError, match="SHA-256"):  # the bytes are not the ones named
        cold.load("acme", SnapshotName("vs_1", second.version, b"\0" * 32), second.blob)
    with pytest.raises(SealedStoreError, match="not the 9 named"):  # the version named is not the sealed one
        cold.load("acme", SnapshotName("vs_1", 9, second.sha256), second.blob)
    with pytest.raises(SnapshotNeeded):
        _files(cold, _name(second))  # nothing was cached by the refused loads


def test_an_older_version_than_one_seen_is_refused(encoder: Embedder) -> None:
    service = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    first, second = _two_files(service)
    with pytest.raises(StaleSnapshot):
        _files(service, _name(first))  # by name
    with pytest.raises(StaleSnapshot):
        service.load("acme", _name(first), first.blob)  # sent whole
    with pytest.raises(StaleSnapshot):
        service.search("acme", "vs_1", first.blob, "contract")  # inline, the first protocol
    with pytest.raises(StaleSnapshot):
        _ingest(service, EMPTY, "file-x", "text")  # "no snapshot yet" is a version 0 as well

    cold = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    cold.load("acme", _name(second), second.blob)  # seen from the gateway: the highest it has seen
    with pytest.raises(StaleSnapshot):
        cold.load("acme", _name(first), first.blob)


def test_a_snapshot_the_gateway_never_read_is_not_yet_seen(encoder: Embedder) -> None:
    service = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    first = _ingest(service, EMPTY, "file-legal", CONTRACT)
    lost = _ingest(service, _name(first), "file-hr", HOLIDAYS, read=False)  # the gateway's read failed
    with pytest.raises(SnapshotNeeded):
        _files(service, _name(first))  # the open store moved on: the one named is sent again
    service.load("acme", _name(first), first.blob)  # and served: the lost change never reached anyone
    assert _files(service, _name(first)) == ["file-legal"]
    with pytest.raises(SnapshotNeeded):
        service.made("acme", _name(lost))  # gone with the open store it belonged to

    again = _ingest(service, _name(first), "file-hr", HOLIDAYS, read=False)
    assert service.made("acme", _name(again)) == again.blob  # asked for: from now on the gateway may hold it
    with pytest.raises(StaleSnapshot):
        service.load("acme", _name(first), first.blob)


def test_a_deleted_file_is_gone_at_once_with_the_cache_warm(encoder: Embedder) -> None:
    service = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    _, second = _two_files(service)
    assert "file-legal" in _files(service, _name(second))
    third = service.delete_file("acme", "vs_1", b"", "file-legal", base=_name(second))
    service.made("acme", _name(third))
    assert "file-legal" not in _files(service, _name(third))
    with pytest.raises(StaleSnapshot):
        _files(service, _name(second))  # the store as it was before the deletion: never again


def test_a_failed_ingestion_leaves_no_cached_store_behind(encoder: Embedder) -> None:
    service = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    first = _ingest(service, EMPTY, "file-legal", CONTRACT)
    bad = service.seal_file("acme", "file-bad", b"\xff\xfe not utf-8")
    with pytest.raises(FileUnreadable):
        service.ingest("acme", "vs_1", b"", "file-bad", "bad.txt", bad, {}, None, base=_name(first))
    assert _files(service, _name(first)) == ["file-legal"]  # unreadable before anything changed: still served


def test_a_wiped_or_rotated_key_empties_the_cache(encoder: Embedder) -> None:
    keys = Keys()
    service = RetrievalService(encoder, keys, "acme", "m", "v1")
    _, second = _two_files(service)
    assert len(service.cache) == 1
    keys.key = b""  # revoked: the worker wiped its data key
    with pytest.raises(SealedStoreError, match="revoked"):
        _files(service, _name(second))
    assert len(service.cache) == 0
    keys.key = bytes(range(1, 33))  # another data key (rotated)
    with pytest.raises(SnapshotNeeded):
        _files(service, _name(second))  # nothing opened under the old key is served
    with pytest.raises(SealedStoreError, match="does not open"):
        service.load("acme", _name(second), second.blob)  # and the old snapshot does not open under the new

    warm = RetrievalService(encoder, keys, "acme", "m", "v1")
    _, made = _two_files(warm)
    assert _files(warm, _name(made))  # served warm under this key
    keys.key = bytes(range(2, 34))  # rotated with the store warm
    with pytest.raises(SnapshotNeeded):
        _files(warm, _name(made))
    assert len(warm.cache) == 0


def test_hold_checks_the_name_before_a_sealed_search_opens_and_pins_it(encoder: Embedder) -> None:
    service = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    first, second = _two_files(service)
    service.hold("acme", EMPTY)  # no file yet: nothing to hold
    service.hold("acme", _name(second))
    assert service.cache.pinned("vs_1") == 2
    for other in (_name(first), SnapshotName("vs_1", second.version, bytes(32)),
                  SnapshotName("vs_1", second.version + 1, second.sha256)):
        with pytest.raises(SnapshotNeeded):  # not the one held: the gateway is sent for it
            service.hold("acme", other)
    assert service.cache.pinned("vs_1") == 2  # a refused hold pins nothing
    cold = RetrievalService(encoder, Keys(), "acme", "m", "v1")
    with pytest.raises(SnapshotNeeded):
        cold.hold("acme", _name(second))
    with pytest.raises(InvalidRetrievalRequest, match="another tenant"):
        service.hold("other", _name(second))
