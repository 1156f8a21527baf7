"""The broker's secrets, generated inside it and kept on disk only sealed to its measurement.

One file, `broker-keys.sealed` (attestation.sealing: AES-256-GCM under the TEE's sealing key for
this measurement), holds the token-signing key (ES256), the receipt and audit signing key (Ed25519),
the X25519 import key tenants seal data keys to, the master key (tenant KEKs, state-ledger MAC) and
the instance key (Ed25519: this broker instance's identity, named in its attestation; it signs
tenant invitations and the attested answer of which key governs a tenant). They are made only by an
explicit initialisation (`python -m key_broker --init`, or `sealed up` on a new home), inside the
broker. The operator's disk never holds one of them in plaintext; a data directory from an older
broker (plaintext `master.key`, `*.pem` key files) is refused at start with a clear error: those
keys were readable by the operator and must not become the attested broker's. A build with another
measurement cannot open the file (on the simulated TEE, `unsafe_sim_reseal` re-seals it, since the
simulated platform key derives every build's key).
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from attestation.errors import SealingError
from attestation.sealing import SealedBlob, seal, unseal
from attestation.sim.sealing import SimSealingKey
from key_broker.errors import SealedStateError
from key_broker.platform import BrokerPlatform
from protocol.fsutil import atomic_write

log = logging.getLogger(__name__)
SEALED_KEYS_FILE = "broker-keys.sealed"
LABEL = "key-broker-keys-v1"
# Plaintext key files of brokers before sealing: refused (the operator could read them).
LEGACY_PLAINTEXT = ("master.key", "token-signing.pem", "receipt-signing.pem", "import-x25519.pem")


def _pem(key: ec.EllipticCurvePrivateKey | Ed25519PrivateKey | X25519PrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


@dataclass(frozen=True, repr=False)
class BrokerKeys:
    token_key: ec.EllipticCurvePrivateKey
    receipt_key: Ed25519PrivateKey
    import_key: X25519PrivateKey
    master_key: bytes
    instance_key: Ed25519PrivateKey  # a new one per initialisation: workers and tenants pin it

    def __repr__(self) -> str:  # never a key in a log
        return "BrokerKeys(<sealed>)"

    @classmethod
    def generate(cls) -> BrokerKeys:
        return cls(ec.generate_private_key(ec.SECP256R1()), Ed25519PrivateKey.generate(),
                   X25519PrivateKey.generate(), secrets.token_bytes(32), Ed25519PrivateKey.generate())

    def encode(self) -> bytes:
        return json.dumps({"token_key": _pem(self.token_key), "receipt_key": _pem(self.receipt_key),
                           "import_key": _pem(self.import_key), "master_key": self.master_key.hex(),
                           "instance_key": _pem(self.instance_key)}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> BrokerKeys:
        try:
            doc = json.loads(raw)
            keys = {name: serialization.load_pem_private_key(doc[name].encode(), None)
                    for name in ("token_key", "receipt_key", "import_key")}
            master = bytes.fromhex(doc["master_key"])
            if "instance_key" not in doc:
                raise SealedStateError("the broker's sealed keys predate the instance identity: initialise a new "
                                       "broker (`--init`, empty data directory); tenants accept its invitation")
            instance = serialization.load_pem_private_key(doc["instance_key"].encode(), None)
        except (ValueError, KeyError, TypeError) as exc:
            raise SealedStateError("the broker's sealed keys are malformed") from exc
        token, receipt, imp = keys["token_key"], keys["receipt_key"], keys["import_key"]
        if not (isinstance(token, ec.EllipticCurvePrivateKey) and isinstance(receipt, Ed25519PrivateKey)
                and isinstance(imp, X25519PrivateKey) and len(master) == 32
                and isinstance(instance, Ed25519PrivateKey)):
            raise SealedStateError("the broker's sealed keys are of the wrong types")
        return cls(token, receipt, imp, master, instance)


def refuse_plaintext_keys(data_dir: Path) -> None:
    found = [name for name in LEGACY_PLAINTEXT if (Path(data_dir) / name).exists()]
    if found:
        raise SealedStateError(
            f"plaintext key files from an older key broker in {data_dir}: {', '.join(found)}. The broker now "
            "generates its keys inside its TEE and keeps them sealed to its measurement; keys the operator's disk "
            "held are not the attested broker's. Start from a new data directory (tenants re-import their "
            "data keys) and destroy these files")


def open_broker_keys(data_dir: Path, platform: BrokerPlatform, *, unsafe_sim_reseal: bool = False,
                     init: bool = False) -> BrokerKeys:
    """The broker's keys, unsealed; made and sealed only by an explicit initialisation (``init``, in a
    data directory without keys). Refuses plaintext key files, a missing key file without ``init``
    (a broker's state was deleted or never made), and state sealed to another measurement or
    platform (SealedStateError)."""
    data_dir = Path(data_dir)
    refuse_plaintext_keys(data_dir)
    if platform.sealing is None:  # TDX: nothing can be sealed; the keys live as long as this process
        return BrokerKeys.generate()
    path = data_dir / SEALED_KEYS_FILE
    if init and path.exists():
        raise SealedStateError(f"--init makes a fresh broker only in an empty data directory: {data_dir} holds "
                               f"one ({SEALED_KEYS_FILE})")
    if not path.exists():
        if not init:
            raise SealedStateError(f"no broker in {data_dir} ({SEALED_KEYS_FILE} is missing): start a fresh broker, "
                                   "with a new identity that workers and tenants must pin again, with --init")
        keys = BrokerKeys.generate()
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(path, seal(platform.sealing, LABEL, keys.encode()))
        log.info("generated the key broker's keys and sealed them to its measurement (%s)", platform.tee)
        return keys
    raw = path.read_bytes()
    try:
        return BrokerKeys.decode(unseal(platform.sealing, LABEL, raw))
    except SealingError as exc:
        if not unsafe_sim_reseal:
            raise SealedStateError(f"the broker's keys do not open: {exc}") from exc
    try:
        old = bytes.fromhex(SealedBlob.from_bytes(raw).measurement)
        keys = BrokerKeys.decode(unseal(platform.sealing_for(old), LABEL, raw))
    except (SealingError, ValueError) as exc:
        raise SealedStateError(f"the broker's keys do not open, not even with unsafe_sim_reseal: {exc}") from exc
    atomic_write(path, seal(platform.sealing, LABEL, keys.encode()))
    log.warning("UNSAFE: re-sealed the broker's keys from measurement %s... to this build's", old.hex()[:16])
    return keys


def open_sim_keys_offline(data_dir: Path, sim_key: Ed25519PrivateKey, measurement: bytes) -> BrokerKeys:
    """Outside the broker, with the simulated platform key: open the broker's sealed keys (made and
    sealed to `measurement` when there are none yet). This is what the one-machine demo (`sealed up`
    provisioning the demo tenant, `sealed keys import`) and its tests do, and exactly what the
    simulated TEE cannot prevent: whoever holds its platform key derives every sealing key. On SNP
    the firmware key never leaves the chip, and nothing outside the broker can do this."""
    from key_broker.platform import sim_platform

    path = Path(data_dir) / SEALED_KEYS_FILE
    if not path.exists():  # the demo's initialisation (`sealed up` on a new home)
        return open_broker_keys(data_dir, sim_platform(sim_key, measurement), init=True)
    refuse_plaintext_keys(data_dir)
    raw = path.read_bytes()
    try:
        blob = SealedBlob.from_bytes(raw)
        if blob.tee != "sim":
            raise SealedStateError(f"the broker's keys are sealed by a {blob.tee} TEE: nothing outside it opens them")
        return BrokerKeys.decode(unseal(SimSealingKey(sim_key, bytes.fromhex(blob.measurement)), LABEL, raw))
    except (SealingError, ValueError) as exc:
        raise SealedStateError(f"the broker's keys do not open with this simulated platform key: {exc}") from exc
