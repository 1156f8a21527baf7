"""The forwarder's cursor and reader: durable, never moving back, and refusing a rewritten log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policy.audit.stream.cursor import Cursor, Position
from policy.audit.stream.errors import CursorError, StreamConfigError
from policy.audit.stream.forwarder import ForwardSettings
from policy.audit.stream.reader import read_after
from policy.errors import AuditIntegrityError
from tests.policy.audit.stream.helpers import write_entries


def test_a_cursor_survives_a_new_process_and_never_moves_back(tmp_path: Path) -> None:
    cursor = Cursor(tmp_path / "c.json")
    cursor.advance("gateway.audit.jsonl", Position(5, 500, "a" * 64))
    again = Cursor(tmp_path / "c.json")
    assert again.position("gateway.audit.jsonl") == Position(5, 500, "a" * 64)
    assert again.position("other.audit.jsonl") == Position()
    with pytest.raises(CursorError, match="cannot move back"):
        again.advance("gateway.audit.jsonl", Position(4, 400, "b" * 64))
    assert Cursor(tmp_path / "c.json").position("gateway.audit.jsonl").seq == 5


def test_an_unreadable_cursor_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text('{"logs": {"g": {"seq": "x"}}}')
    with pytest.raises(CursorError, match="unreadable"):
        Cursor(tmp_path / "c.json")


def test_reading_resumes_at_the_cursor_and_skips_a_line_still_being_written(tmp_path: Path) -> None:
    write_entries(tmp_path, "gateway", 6)
    path = tmp_path / "gateway.audit.jsonl"
    first = read_after(path, Position(), 4)
    assert [e.seq for e, _ in first] == [0, 1, 2, 3]
    rest = read_after(path, first[-1][1], 100)
    assert [e.seq for e, _ in rest] == [4, 5]
    with open(path, "ab") as fh:
        fh.write(b'{"v":1,"seq":6')  # a torn tail: not an entry yet
    assert read_after(path, rest[-1][1], 100) == []


def test_a_log_cut_back_or_rewritten_after_forwarding_is_refused(tmp_path: Path) -> None:
    write_entries(tmp_path, "gateway", 6)
    path = tmp_path / "gateway.audit.jsonl"
    read = read_after(path, Position(), 100)
    os.truncate(path, read[2][1].offset)
    with pytest.raises(AuditIntegrityError, match="shorter than the forwarded"):
        read_after(path, read[-1][1], 100)
    with pytest.raises(AuditIntegrityError, match="chain broken"):
        read_after(path, Position(1, read[0][1].offset, "f" * 64), 100)  # not the hash entry 1 chains to


def test_forward_settings_refuse_nonsense(tmp_path: Path) -> None:
    with pytest.raises(StreamConfigError):
        ForwardSettings(tmp_path, tmp_path, batch=0)
    with pytest.raises(StreamConfigError):
        ForwardSettings(tmp_path, tmp_path, backoff_min_s=5, backoff_max_s=1)


def test_a_writer_killed_mid_line_and_restarted_continues_the_stream_without_a_gap(tmp_path: Path) -> None:
    """The component (gateway, broker) killed -9 mid-write leaves a torn tail; the forwarder leaves
    it alone, the restarted writer drops it and appends, and forwarding goes on from the same place."""
    write_entries(tmp_path, "gateway", 4)
    path = tmp_path / "gateway.audit.jsonl"
    with open(path, "ab") as fh:
        fh.write(b'{"v":1,"seq":4,"ts":"2026')  # killed here
    read = read_after(path, Position(), 100)
    assert [e.seq for e, _ in read] == [0, 1, 2, 3]
    write_entries(tmp_path, "gateway", 3, start=4)  # a new writer: recovers (drops the tail), appends
    rest = read_after(path, read[-1][1], 100)
    assert [e.seq for e, _ in rest] == [4, 5, 6]
    assert rest[0][0].prev == read[-1][0].hash
