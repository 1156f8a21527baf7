"""A plaintext search's audit entry: one signed entry naming every file that gave passages.

Every search was one `vector_store.search` entry and one `vector_store.retrieve` entry per file,
each hashed, signed (Ed25519) and written on the request's path: 0.8 ms of a search at the median
(docs/retrieval.md "Hop by hop"). One entry carries the same facts. An entry holds scalars of
bounded length (policy/audit/entry.py: strings up to MAX_META_STR characters, MAX_META_KEYS keys),
so the ids are packed, comma-separated, into as few fields as fit: `file_ids`, `file_ids.2`, ...
(a search returns at most 50 passages; 29-character ids fit 8 to a field). The tenant reads them
back with `file_ids_of`. A sealed search's entry names no file: the tenant's sealed record has them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policy.audit.entry import MAX_META_STR, MetaValue

FIELD = "file_ids"
SEPARATOR = ","


def file_id_fields(file_ids: Sequence[str]) -> dict[str, str]:
    """The ids packed into fields of at most MAX_META_STR characters, in order; none for no file.
    An id that alone is longer than a field gets a field of its own (the log withholds it as a digest,
    as it would any over-long value: ids are the gateway's own, 29 characters)."""
    packed: list[str] = []
    for file_id in file_ids:
        if SEPARATOR in file_id:  # never from the gateway's new_id; refused rather than mis-split on reading
            raise ValueError("a file id holds the audit field's separator")
        if packed and len(packed[-1]) + len(SEPARATOR) + len(file_id) <= MAX_META_STR:
            packed[-1] += SEPARATOR + file_id
        else:
            packed.append(file_id)
    return {_name(i): value for i, value in enumerate(packed)}


def file_ids_of(metadata: Mapping[str, MetaValue]) -> list[str]:
    """The file ids a search entry names, in the order they were packed."""
    ids: list[str] = []
    i = 0
    while isinstance(value := metadata.get(_name(i)), str):
        ids += value.split(SEPARATOR)
        i += 1
    return ids


def _name(i: int) -> str:
    return FIELD if i == 0 else f"{FIELD}.{i + 1}"
