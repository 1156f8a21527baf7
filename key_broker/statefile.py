"""Integrity and rollback protection of the broker's state on disk.

The disk is outside the trust boundary, yet release policies, tenant key state (revocation),
wrapped data keys with their signer and digest, reference values and their signing keys, and
tenant-admin token hashes live there. Every such file is listed in one *state ledger*
(``state-ledger.json``): its SHA-256 per relative path and a generation number, MACed under a key
the broker keeps sealed (HMAC-SHA256 under a key derived from the master key; in Vault mode a
Transit HMAC key that never leaves OpenBao). A store reads a file only through the ledger:

- a file whose digest is not the ledger's (edited, or an older copy put back) is refused;
- a file the ledger does not list (planted) is refused; a listed file that is gone is refused;
- a ledger whose MAC fails is refused, and so is one whose generation is lower than the highest
  this process has seen or than the anchors hold (the whole directory rolled back).

Every refusal is logged at CRITICAL and reported to ``on_tamper`` (the broker audits it), and
the operation fails: nothing is released from a state the broker cannot vouch for.

Anchors keep the high-water mark of the generation outside the data directory: a MACed file in
another directory (default: the audit directory) and, in Vault mode, a KV entry in OpenBao. They fail
closed (issue #46): a missing, unreadable or older anchor refuses the ledger, so the broker does not
start; only an explicit initialisation (``StateLedger.initialise``: ``python -m key_broker --init``
in an empty data directory, or `sealed up` on a new home) makes anchors, and it comes with new broker
keys, so a new attested instance identity that workers and tenants pinned to the old one refuse.
In Vault mode the anchors also name the broker instance (the Transit MAC key outlives instances). What
a local-disk attacker can still do: rolling back the data directory *and* every anchor together
(the file and, in Vault mode, the KV entry) to one consistent older copy is not detected here;
deleting files denies service (refused, never released). docs/key-broker.md, "State integrity".
"""

from __future__ import annotations

import base64
import builtins
import fcntl
import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from key_broker.errors import KeyStoreError
from protocol.fsutil import atomic_write

log = logging.getLogger(__name__)
LEDGER = "state-ledger.json"
_DOMAIN = b"sealed-broker-state-ledger-v1\x00"
_ANCHOR_DOMAIN = b"sealed-broker-state-anchor-v1\x00"


class StateTampered(KeyStoreError):
    """A state file or the ledger does not authenticate, or was rolled back. Nothing is released."""


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


class StateMac(Protocol):
    def mac(self, data: bytes) -> str: ...
    def verify(self, data: bytes, tag: str) -> bool: ...


class LocalStateMac:
    """HMAC-SHA256 under a key derived (HKDF) from the broker's master key."""

    def __init__(self, master_key: bytes) -> None:
        self._key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                         info=b"sealed-broker-state-mac-v1").derive(master_key)

    def mac(self, data: bytes) -> str:
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def verify(self, data: bytes, tag: str) -> bool:
        return hmac.compare_digest(self.mac(data), tag)


class VaultStateMac:
    """HMAC by an OpenBao/Vault Transit key (``sealed-broker-state``): the key never leaves Vault."""

    KEY = "sealed-broker-state"

    def __init__(self, client: Any, mount_point: str = "transit") -> None:
        self._transit = client.secrets.transit
        self._mount = mount_point
        try:
            self._transit.read_key(self.KEY, mount_point=mount_point)
        except Exception:
            self._transit.create_key(self.KEY, exportable=False, mount_point=mount_point)

    def mac(self, data: bytes) -> str:
        out = self._transit.generate_hmac(self.KEY, base64.b64encode(data).decode(), algorithm="sha2-256",
                                          mount_point=self._mount)
        return str(out["data"]["hmac"])

    def verify(self, data: bytes, tag: str) -> bool:
        out = self._transit.verify_signed_data(self.KEY, base64.b64encode(data).decode(), hmac=tag,
                                               hash_algorithm="sha2-256", mount_point=self._mount)
        return bool(out["data"]["valid"])


class GenerationAnchor(Protocol):
    """Keeps the ledger's highest generation somewhere the data directory's attacker may not reach.
    ``read`` raises StateTampered when the anchor is missing, unreadable or another instance's."""

    def read(self) -> int: ...
    def advance(self, generation: int) -> None: ...
    def initialise(self) -> None: ...


class FileAnchor:
    """A MACed high-water mark in a file outside the data directory. ``instance`` (Vault mode, where
    the MAC key outlives a broker instance) is bound into the MAC; locally the MAC key is the
    instance's own (derived from its sealed master key)."""

    def __init__(self, path: Path, mac: StateMac, instance: str = "") -> None:
        self.path = Path(path)
        self._mac = mac
        self._instance = instance

    def _body(self, generation: int) -> bytes:
        bound = self._instance.encode() + b"\x00" if self._instance else b""
        return _ANCHOR_DOMAIN + bound + str(generation).encode()

    def read(self) -> int:
        try:
            doc = json.loads(self.path.read_text())
            generation = int(doc["generation"])
            if not self._mac.verify(self._body(generation), str(doc["mac"])):
                raise StateTampered(f"state anchor {self.path.name} does not authenticate (another broker "
                                    "instance's, or edited)")
        except FileNotFoundError:
            raise StateTampered(f"state anchor {self.path.name} is missing: a broker with state starts only "
                                "with its anchor (restore it; or start a fresh broker, with a new identity, "
                                "with --init in an empty data directory)") from None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            raise StateTampered(f"state anchor {self.path.name} unreadable") from exc
        return generation

    def advance(self, generation: int) -> None:
        if generation > self.read():
            self._write(generation)

    def _write(self, generation: int) -> None:
        atomic_write(self.path, _canonical({"generation": generation, "mac": self._mac.mac(self._body(generation))}))

    def initialise(self) -> None:
        if self.path.exists():  # another instance's: meaningless for the new one (its MAC no longer verifies)
            log.warning("initialising a fresh broker: replacing the state anchor %s of an earlier one", self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write(0)


class VaultKvAnchor:
    """The high-water mark as an OpenBao/Vault KV v2 secret (check-and-set, so it only moves forward),
    naming the broker instance it belongs to."""

    def __init__(self, client: Any, path: str = "sealed-broker/state-generation", mount_point: str = "secret",
                 instance: str = "") -> None:
        self._kv = client.secrets.kv.v2
        self._path, self._mount, self._instance = path, mount_point, instance

    def _current(self) -> tuple[int, int, str] | None:
        try:
            out = self._kv.read_secret_version(self._path, mount_point=self._mount, raise_on_deleted_version=True)
        except Exception:
            return None
        data = out["data"]["data"]
        return int(data["generation"]), int(out["data"]["metadata"]["version"]), str(data.get("instance", ""))

    def read(self) -> int:
        current = self._current()
        if current is None:
            raise StateTampered(f"the Vault state anchor {self._path} is missing: a broker with state starts only "
                                "with its anchor (or start a fresh broker with --init)")
        if current[2] != self._instance:
            raise StateTampered(f"the Vault state anchor {self._path} belongs to another broker instance")
        return current[0]

    def advance(self, generation: int) -> None:
        current = self._current()
        if current is None:
            raise StateTampered(f"the Vault state anchor {self._path} is missing")
        if generation > current[0]:
            self._kv.create_or_update_secret(self._path, secret={"generation": generation, "instance": self._instance},
                                             cas=current[1], mount_point=self._mount)

    def initialise(self) -> None:
        current = self._current()
        self._kv.create_or_update_secret(self._path, secret={"generation": 0, "instance": self._instance},
                                         cas=0 if current is None else current[1], mount_point=self._mount)


class StateLedger:
    """Authenticated, rollback-protected access to the broker's state files under ``root``."""

    def __init__(self, root: Path, mac: StateMac, anchors: Sequence[GenerationAnchor] = (),
                 on_tamper: Callable[[str, str], None] | None = None) -> None:
        self.root = Path(root)
        self._mac = mac
        self._anchors = tuple(anchors)
        self.on_tamper = on_tamper
        self._lock = threading.RLock()
        self._ident: tuple[int, int, int] | None = None
        self._doc: dict[str, Any] = {"generation": 0, "files": {}, "pending": {}}
        self._high = 0  # the highest generation this process has seen: never goes back

    @property
    def path(self) -> Path:
        return self.root / LEDGER

    @property
    def generation(self) -> int:
        return int(self._load()["generation"])

    def _rel(self, path: Path) -> str:
        return Path(path).resolve().relative_to(self.root.resolve()).as_posix()

    def _tamper(self, what: str, why: str) -> StateTampered:
        log.critical("broker state %s refused: %s", what, why)
        if self.on_tamper is not None:
            try:
                self.on_tamper(what, why)
            except Exception:
                log.exception("could not audit a state integrity failure")
        return StateTampered(f"{what}: {why}")

    def _body(self, doc: dict[str, Any]) -> bytes:
        return _DOMAIN + _canonical({k: doc[k] for k in ("generation", "files", "pending")})

    def _load(self, force: bool = False) -> dict[str, Any]:
        with self._lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                floor = max([self._high, *(a.read() for a in self._anchors)])
                if floor > 0:
                    raise self._tamper(LEDGER, f"missing, but generation {floor} was reached (deleted or "
                                       "rolled back)") from None
                self._ident, self._doc = None, {"generation": 0, "files": {}, "pending": {}}
                return self._doc
            ident = (st.st_ino, st.st_mtime_ns, st.st_size)
            if ident == self._ident and not force:
                return self._doc
            try:
                doc: dict[str, Any] = json.loads(self.path.read_bytes())
                ok = isinstance(doc, dict) and self._mac.verify(self._body(doc), str(doc.get("mac")))
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                raise self._tamper(LEDGER, "does not authenticate (edited or forged)")
            generation = int(doc["generation"])
            floor = max([self._high, *(a.read() for a in self._anchors)])
            if generation < floor:
                raise self._tamper(LEDGER, f"generation {generation} is older than {floor} (rolled back)")
            self._high, self._ident, self._doc = generation, ident, doc
            return doc

    def initialise(self) -> None:
        """A fresh broker's ledger: its anchors at generation 0, then an empty ledger (generation 1).
        Refused where a ledger exists (it belongs to another broker instance)."""
        with self._lock:
            if self.path.exists():
                raise StateTampered(f"{LEDGER} exists: a fresh broker is initialised only in an empty data directory")
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            for anchor in self._anchors:
                anchor.initialise()
            self._save({"generation": 0, "files": {}, "pending": {}})

    def check_anchors(self) -> None:
        """At start: every anchor authenticates, names this instance and is not behind the ledger by
        more than a crash between the ledger's write and the anchor's leaves (one generation); an
        anchor put back from an older copy would let a later rollback to that copy pass."""
        generation = int(self._load(force=True)["generation"])
        for anchor in self._anchors:
            held = anchor.read()
            if held < generation - 1:
                raise self._tamper(LEDGER, f"a state anchor holds generation {held}, older than the ledger's "
                                   f"{generation} (put back from an older copy)")

    def _save(self, doc: dict[str, Any]) -> None:
        doc["generation"] = int(doc["generation"]) + 1
        doc["mac"] = self._mac.mac(self._body(doc))
        atomic_write(self.path, _canonical(doc))
        self._high = doc["generation"]
        for anchor in self._anchors:
            anchor.advance(doc["generation"])

    def read(self, path: Path) -> bytes | None:
        """The file's bytes if the ledger vouches for them; None if neither exists; else refused."""
        rel = self._rel(path)
        for attempt in (0, 1):
            doc = self._load(force=attempt == 1)  # a concurrent writer may have moved on: reload once
            try:
                data: bytes | None = Path(path).read_bytes()
            except FileNotFoundError:
                data = None
            known = {doc["files"].get(rel), doc["pending"].get(rel)} - {None}
            if data is None and not known:
                return None
            if data is not None and hashlib.sha256(data).hexdigest() in known:
                return data
        if data is None:
            raise self._tamper(rel, "listed in the state ledger but missing (deleted)")
        if not known:
            raise self._tamper(rel, "not in the state ledger (planted or edited outside the broker)")
        raise self._tamper(rel, "content differs from the state ledger (edited or rolled back)")

    def exists(self, path: Path) -> bool:
        return self._rel(path) in self._load()["files"]

    def list(self, directory: Path, suffix: str) -> list[Path]:
        """The files the ledger lists under ``directory`` (any depth) ending in ``suffix``."""
        prefix = self._rel(directory).rstrip("/") + "/"
        return [self.root / rel for rel in sorted(self._load()["files"])
                if rel.startswith(prefix) and rel.endswith(suffix)]

    def write(self, path: Path, data: bytes, mode: int = 0o600) -> None:
        """Write a state file and record it. Crash-safe: the new digest is recorded as pending
        before the file is replaced, and committed after."""
        rel = self._rel(path)
        digest = hashlib.sha256(data).hexdigest()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._lock, open(self.root / ".state-ledger.lock", "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # other processes (the CLI) write too
            doc = json.loads(json.dumps(self._load(force=True)))
            doc["pending"][rel] = digest
            self._save(doc)
            atomic_write(Path(path), data, mode)
            doc["files"][rel] = digest
            doc["pending"].pop(rel, None)
            self._save(doc)

    def check_all(self) -> builtins.list[str]:
        """Every listed file checked (at start-up); returns the problems found (each already
        logged and reported), raises if the ledger itself is refused."""
        problems = []
        for rel in sorted(self._load(force=True)["files"]):
            try:
                self.read(self.root / rel)
            except StateTampered as exc:
                problems.append(str(exc))
        return problems

    def adopt(self, paths: Sequence[Path]) -> int:
        """Record existing files as they are (a data directory from before the ledger). Unsafe:
        whatever is on disk now becomes trusted; run once, on a disk you trust."""
        count = 0
        for path in paths:
            if Path(path).is_file() and not self.exists(path):
                self.write(path, Path(path).read_bytes())
                count += 1
        return count


class UnsafePlainFiles:
    """The same interface with no integrity at all: only for unit tests of one store in isolation.
    Every broker, CLI and stack path opens its stores through ``StateLedger``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def read(self, path: Path) -> bytes | None:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, path: Path) -> bool:
        return Path(path).exists()

    def list(self, directory: Path, suffix: str) -> list[Path]:
        return sorted(p for p in Path(directory).rglob(f"*{suffix}") if p.is_file())

    def write(self, path: Path, data: bytes, mode: int = 0o600) -> None:
        atomic_write(Path(path), data, mode)


StateFiles = StateLedger | UnsafePlainFiles


def state_files_to_adopt(data_dir: Path) -> list[Path]:
    """The files a StateLedger protects in a broker data directory (for ``adopt``)."""
    d = Path(data_dir)
    return sorted([*d.glob("keystore/tenants/*/kek.json"), *d.glob("keystore/datakeys/*/*/*.json"),
                   *d.glob("policies/*/*.json"), *d.glob("policy-admin/*.json"),
                   *d.glob("invitations/*.json"), *d.glob("refvals/*/keys/*.pem"),
                   *d.glob("refvals/*/docs/*.json"),
                   *d.glob("vault-state/revoked/*"), *[p for p in [d / "admin-tokens.json"] if p.exists()]])


def default_anchor_path(data_dir: Path) -> Path:
    """Outside the data directory: rolling back the data directory alone is caught."""
    return Path(data_dir).resolve().parent / "audit" / "key-broker.state-anchor.json"


def local_ledger(data_dir: Path, master_key: bytes, anchor: Path | None = None) -> StateLedger:
    """The ledger every local-key-store process (broker, `sealed up`, `sealed keys import`) opens."""
    mac = LocalStateMac(master_key)
    return StateLedger(Path(data_dir), mac, [FileAnchor(anchor or default_anchor_path(data_dir), mac)])


def tenant_of(rel: str) -> str:
    """The tenant a state file belongs to (for the audit entry of a refusal), or "-"."""
    parts = rel.split("/")
    if parts[0] in ("policy-admin", "invitations") and len(parts) == 2:
        return parts[1].removesuffix(".json")
    for prefix, index in ((("keystore", "tenants"), 2), (("keystore", "datakeys"), 2), (("policies",), 1),
                          (("refvals",), 1), (("vault-state", "revoked"), 2)):
        if tuple(parts[:len(prefix)]) == prefix and len(parts) > index:
            return parts[index]
    return "-"
