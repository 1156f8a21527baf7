"""Key broker settings: explicit, frozen, built by the caller (never at import)."""

from __future__ import annotations

import datetime as dt
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from attestation.attesters import KernelInterfaces
from key_broker.auth import check_secret, hash_token
from key_broker.errors import SettingsError

log = logging.getLogger(__name__)

ADMIN_TOKEN_ENV = "SEALED_BROKER_ADMIN_TOKEN"  # plaintext, hashed at startup, never stored
VAULT_TOKEN_ENVS = ("SEALED_VAULT_TOKEN", "BAO_TOKEN", "VAULT_TOKEN")


# The broker's own TEEs: its evidence (POST /v1/broker/attestation) and the key its state is sealed with.
BROKER_TEES = ("sim", "snp", "tdx")


@dataclass(frozen=True)
class BrokerSettings:
    data_dir: Path
    issuer: str = "sealed-key-broker"
    # Present only where simulated TEEs may attest (dev); policies must still allow them.
    sim_platform_public_key: Path | None = None
    roots_dir: Path | None = None
    # Verifier collateral (AMD KDS, Intel PCS, NVIDIA): the store's directory, and whether the
    # broker may fetch (online, with cache) or uses only imported bundles (offline).
    collateral_dir: Path | None = None
    collateral_offline: bool = False
    # The broker's own TEE (key_broker/platform.py): it attests itself and seals its keys with it.
    # On the simulated TEE it needs the simulated platform's signing key (a file: nothing is protected).
    tee: str = "sim"
    sim_platform_signing_key: Path | None = None
    # Simulated TEE only: open state sealed by an earlier build of the broker (the platform key derives
    # every build's sealing key) and seal it to this one. The one-machine demo uses it across upgrades.
    unsafe_sim_reseal: bool = False
    # Tests only: the broker's simulated measurement, instead of computing it over its code.
    unsafe_sim_measurement: str | None = None
    # SNP/TDX: the broker's init-data (attestation/broker_initdata.py: its image, arguments,
    # environment, measured configuration), whose digest its hardware reports; the path is not
    # measured, the document is (key_broker/workload_check.py). Where its attestation interfaces are.
    init_data: Path | None = None
    kernel: KernelInterfaces = field(default_factory=KernelInterfaces)
    challenge_ttl: dt.timedelta = dt.timedelta(seconds=60)
    token_ttl: dt.timedelta = dt.timedelta(minutes=5)
    max_body_bytes: int = 1 << 20
    rate_limit_per_minute: int = 600
    # Key leases (docs/security.md, "Revocation"): a renewal keeps a key usable this long; a held
    # renewal (long poll) waits at most lease_max_wait_s. Longer leases ride out longer broker
    # outages; a worker cut off from the broker serves at most one lease past a revocation.
    lease_s: int = 60
    lease_max_wait_s: float = 30.0
    # SHA-256 hex of the operator's admin token(s); empty = the admin API admits only tenant admins.
    admin_token_sha256: frozenset[str] = frozenset()
    keystore: Literal["local", "vault"] = "local"
    vault_url: str | None = None
    vault_token: str | None = None
    vault_mount: str = "transit"
    # Audit checkpoints are also published outside the audit directory: a witness file (another
    # volume) and/or a database (PostgreSQL in fleet mode); see docs/policy.md.
    audit_witness: Path | None = None
    # The state ledger's generation high-water mark (default: <data_dir>/../audit/); in Vault
    # mode also a KV v2 secret in this mount.
    state_anchor: Path | None = None
    vault_kv_mount: str = "secret"
    # Trust the state files on disk as they are, once (a data directory from before the ledger).
    unsafe_adopt_state: bool = False
    # Make a fresh broker (new keys, so a new attested instance identity) in an empty data directory.
    # Without it a broker whose keys, ledger or state anchor are missing refuses to start (#46).
    init: bool = False
    audit_anchor_url: str | None = None
    # Accept placeholder secrets (example master keys, short admin tokens, Vault dev tokens).
    unsafe_dev_mode: bool = False

    def __post_init__(self) -> None:
        if self.tee not in BROKER_TEES:
            raise SettingsError(f"unknown broker TEE {self.tee!r}: use one of {', '.join(BROKER_TEES)}")
        if self.tee == "sim" and self.sim_platform_signing_key is None:
            raise SettingsError("the broker on the simulated TEE needs the simulated platform's signing key")
        if self.tee != "sim" and (self.unsafe_sim_reseal or self.unsafe_sim_measurement):
            raise SettingsError("unsafe_sim_reseal and unsafe_sim_measurement exist only on the simulated TEE")
        if self.keystore not in ("local", "vault"):
            raise SettingsError(f"unknown key store {self.keystore!r}")
        if self.keystore == "vault" and not (self.vault_url and self.vault_token):
            raise SettingsError("the vault key store needs vault_url and a token (env SEALED_VAULT_TOKEN)")
        if self.vault_token is not None:
            check_secret(self.vault_token, "the Vault token", dev=self.unsafe_dev_mode)
        if self.tee == "sim":
            log.warning("the key broker runs on the SIMULATED TEE: its keys are sealed with a key file on this disk")
        if self.unsafe_sim_reseal:
            log.warning("UNSAFE: state sealed by another broker build is re-sealed to this one (simulated TEE)")
        if self.unsafe_dev_mode:
            log.warning("UNSAFE dev mode: placeholder secrets are accepted; never use this in production")

    def __repr__(self) -> str:  # the Vault token must not reach a log through a repr
        return f"BrokerSettings(data_dir={self.data_dir!s}, keystore={self.keystore}, issuer={self.issuer})"


def admin_token_hashes(env: dict[str, str] | None = None, hash_file: Path | None = None, *,
                       dev: bool = False) -> frozenset[str]:
    """Operator token hashes from a file of SHA-256 hex lines (hashed at rest) and/or the env var
    (plaintext, refused when it looks like a placeholder outside dev mode)."""
    env = dict(os.environ) if env is None else env
    hashes: set[str] = set()
    if hash_file is not None:
        for line in hash_file.read_text().splitlines():
            value = line.strip().lower()
            if value and not value.startswith("#"):
                if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
                    raise SettingsError(f"{hash_file} must hold SHA-256 hex lines")
                hashes.add(value)
    plain = env.get(ADMIN_TOKEN_ENV)
    if plain:
        check_secret(plain, ADMIN_TOKEN_ENV, dev=dev)
        hashes.add(hash_token(plain))
    return frozenset(hashes)


def vault_token_from_env(env: dict[str, str] | None = None) -> str | None:
    env = dict(os.environ) if env is None else env
    return next((env[name] for name in VAULT_TOKEN_ENVS if env.get(name)), None)
