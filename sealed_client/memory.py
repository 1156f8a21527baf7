"""What a client remembers across sessions: the newest policy versions, reference-value serial and
revocation list it has verified, so that nothing older is accepted again (attack: a policy downgrade
within a session, or in the next one).

The state file sits next to the client policy (its `state_file`, e.g. `client-state.json`). It is
the client's own: on the client's machine, never the operator's. It must exist once named: a missing,
unreadable or edited-to-nonsense file is refused (`ClientStateError`), never read as "nothing seen",
since a file whose absence resets history would let the next session accept an older policy again.
`ClientMemory.create(path)` makes the empty one (the tenant's set-up, `sealed up` for the demo).
A policy that names no state file keeps the memory for the session only.

    {"v": 1, "release_policy_versions": {"tenant/model": N}, "data_policy_versions": {"tenant": N},
     "reference_values_serial": N, "revocations": <the newest tenant-signed list verified> | null}
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from protocol.fsutil import atomic_write
from sealed_client.errors import ClientStateError, PolicyDowngrade

STATE_VERSION = 1
_KEYS = {"v", "release_policy_versions", "data_policy_versions", "reference_values_serial", "revocations"}


def _counts(value: Any, name: str) -> dict[str, int]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0
                                              for k, v in value.items()):
        raise ClientStateError([f"the client state's {name} must map names to non-negative ints"])
    return dict(value)


class ClientMemory:
    """The newest versions seen, per (tenant, model) for release policies and per tenant for data
    policies; `check` refuses older ones (`PolicyDowngrade`), `record` moves them forward (and writes
    the state file, merged with what another session wrote meanwhile: versions only go up)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.release_versions: dict[str, int] = {}
        self.data_versions: dict[str, int] = {}
        self.reference_values_serial = 0
        self.revocations: Mapping[str, Any] | None = None  # the newest signed list (envelope)
        if path is not None:
            self._merge(self._read(path))

    @staticmethod
    def create(path: Path) -> Path:
        """An empty state file, unless one exists (then it is kept: it holds what was seen)."""
        if not path.exists():
            atomic_write(path, json.dumps({"v": STATE_VERSION, "release_policy_versions": {},
                                           "data_policy_versions": {}, "reference_values_serial": 0,
                                           "revocations": None}, indent=1).encode())
        return path

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ClientStateError([f"the client state file {path} is missing: the memory of the newest policy "
                                    "versions and revocations seen is gone, so nothing is accepted (make a new "
                                    "one only deliberately: ClientMemory.create)"]) from None
        except (OSError, ValueError) as exc:
            raise ClientStateError([f"the client state file {path} cannot be read ({type(exc).__name__}): "
                                    "nothing is accepted"]) from None
        if not isinstance(doc, dict) or set(doc) != _KEYS or doc["v"] != STATE_VERSION:
            raise ClientStateError([f"the client state file {path} is not a version-{STATE_VERSION} client state"])
        serial = doc["reference_values_serial"]
        if type(serial) is not int or serial < 0 or not (doc["revocations"] is None
                                                          or isinstance(doc["revocations"], dict)):
            raise ClientStateError([f"the client state file {path} is malformed"])
        _counts(doc["release_policy_versions"], "release_policy_versions")
        _counts(doc["data_policy_versions"], "data_policy_versions")
        return doc

    def _merge(self, doc: Mapping[str, Any]) -> None:
        for mine, theirs in ((self.release_versions, doc["release_policy_versions"]),
                             (self.data_versions, doc["data_policy_versions"])):
            for k, v in theirs.items():
                mine[k] = max(mine.get(k, 0), v)
        self.reference_values_serial = max(self.reference_values_serial, doc["reference_values_serial"])
        theirs_list = doc["revocations"]
        if theirs_list is not None and _serial(theirs_list) > _serial(self.revocations):
            self.revocations = theirs_list

    def _save(self) -> None:
        if self.path is None:
            return
        self._merge(self._read(self.path))  # another session may have seen newer versions meanwhile
        atomic_write(self.path, json.dumps({
            "v": STATE_VERSION, "release_policy_versions": self.release_versions,
            "data_policy_versions": self.data_versions, "reference_values_serial": self.reference_values_serial,
            "revocations": self.revocations}, indent=1, sort_keys=True).encode())

    # -- the checks
    def check(self, tenant: str, model: str, release_version: int | None, data_version: int) -> None:
        """Raise PolicyDowngrade if either version is older than the newest seen."""
        with self._lock:
            newest_release = self.release_versions.get(f"{tenant}/{model}", 0)
            newest_data = self.data_versions.get(tenant, 0)
        reasons = []
        if release_version is not None and release_version < newest_release:
            reasons.append(f"the worker's key came under release policy version {release_version} of {tenant}/{model}; "
                           f"this client has seen version {newest_release} (a policy downgrade)")
        if data_version < newest_data:
            reasons.append(f"the worker enforces {tenant}'s data policy version {data_version}; this client has "
                           f"seen version {newest_data} (a policy downgrade)")
        if reasons:
            raise PolicyDowngrade(reasons)

    def record(self, tenant: str, model: str, release_version: int | None, data_version: int) -> None:
        with self._lock:
            key = f"{tenant}/{model}"
            before = (self.release_versions.get(key, 0), self.data_versions.get(tenant, 0))
            if release_version is not None:
                self.release_versions[key] = max(before[0], release_version)
            self.data_versions[tenant] = max(before[1], data_version)
            if (self.release_versions.get(key, 0), self.data_versions[tenant]) != before:
                self._save()

    def record_reference_values(self, serial: int) -> None:
        with self._lock:
            if serial > self.reference_values_serial:
                self.reference_values_serial = serial
                self._save()

    def record_revocations(self, envelope: Mapping[str, Any]) -> None:
        """Keep `envelope` (already verified) if it is newer than the list held."""
        with self._lock:
            if _serial(envelope) > _serial(self.revocations):
                self.revocations = dict(envelope)
                self._save()


def _serial(envelope: Mapping[str, Any] | None) -> int:
    if envelope is None:
        return 0
    payload = envelope.get("payload")
    serial = payload.get("serial") if isinstance(payload, Mapping) else None
    if type(serial) is not int:
        raise ClientStateError(["a stored revocation list has no serial"])
    return serial
