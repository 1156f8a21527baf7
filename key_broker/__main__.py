"""`python -m key_broker --data-dir DIR --port N [--sim-platform-key PEM] ...`: run the key broker.

Secrets never come from argv (visible in `ps`): the operator admin token from
SEALED_BROKER_ADMIN_TOKEN (or --admin-token-hash-file, SHA-256 hex lines), the Vault token from
SEALED_VAULT_TOKEN / BAO_TOKEN / VAULT_TOKEN. The broker's own keys (token, receipt, import, master)
are generated inside its TEE (`--tee`) and kept on disk only sealed to its measurement.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import uvicorn

from attestation.attesters import CCEL_DATA, CCEL_TABLE, SEV_GUEST, KernelInterfaces
from attestation.errors import AttestationError
from attestation.launch_env import process_environ
from attestation.tsm import DEFAULT_BASE
from key_broker.app import create_app
from key_broker.errors import KeyStoreError, SettingsError
from key_broker.settings import BrokerSettings, admin_token_hashes, vault_token_from_env
from key_broker.workload_check import check_broker_workload
from protocol.asgi import freeze_startup_heap, schedule_full_collections
from protocol.exit_codes import EXIT_CONFIG_ERROR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m key_broker")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--sim-platform-key", type=Path, default=None)
    parser.add_argument("--roots-dir", type=Path, default=None)
    parser.add_argument("--collateral-dir", type=Path, default=None,
                        help="verifier collateral store (AMD KDS, Intel PCS, NVIDIA); see `sealed attest collateral`")
    parser.add_argument("--collateral-offline", action="store_true",
                        help="use only imported collateral, never fetch (brokers without internet)")
    parser.add_argument("--tee", choices=("sim", "snp", "tdx"), default="sim",
                        help="the broker's own TEE: it attests itself and seals its keys with it")
    parser.add_argument("--sim-platform-signing-key", type=Path, default=None,
                        help="--tee sim: the simulated platform's private key (a file: protects nothing)")
    parser.add_argument("--unsafe-sim-reseal", action="store_true",
                        help="--tee sim: re-seal keys sealed by another broker build to this one")
    parser.add_argument("--unsafe-sim-measurement", default=None,
                        help="--tee sim, tests only: the broker's simulated measurement (hex)")
    parser.add_argument("--admin-token-hash-file", type=Path, default=None)
    parser.add_argument("--keystore", choices=("local", "vault"), default="local")
    parser.add_argument("--vault-url", default=None)
    parser.add_argument("--vault-mount", default="transit")
    parser.add_argument("--rate-limit-per-minute", type=int, default=600)
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--audit-witness", type=Path, default=None,
                        help="also append every signed audit checkpoint to this file (keep it on another volume)")
    parser.add_argument("--audit-anchor-url", default=None,
                        help="also store signed audit checkpoints in this database (fleet: PostgreSQL URL)")
    parser.add_argument("--lease-seconds", type=int, default=60,
                        help="how long a lease renewal keeps a released key usable")
    parser.add_argument("--lease-max-wait-seconds", type=float, default=30.0,
                        help="longest a lease renewal is held waiting for a revocation (push)")
    parser.add_argument("--state-anchor", type=Path, default=None,
                        help="file keeping the state ledger's generation (default: DATA_DIR/../audit/)")
    parser.add_argument("--vault-kv-mount", default="secret", help="KV v2 mount for the state generation (vault)")
    parser.add_argument("--init", action="store_true",
                        help="make a fresh broker in an empty data directory: new keys and a new instance identity "
                             "(workers and tenants pinned to an earlier one refuse it). Without it, a broker whose "
                             "keys, state ledger or state anchor are missing or older refuses to start")
    parser.add_argument("--unsafe-adopt-state", action="store_true",
                        help="trust the state files on disk as they are (once, for a data dir from before the ledger)")
    parser.add_argument("--unsafe-dev-mode", action="store_true",
                        help="accept placeholder secrets (development only; logs a warning)")
    # SNP/TDX: the init-data the host launched this guest with (its digest is in every report), and
    # where the guest kernel's attestation interfaces are (not measured).
    parser.add_argument("--init-data", type=Path, default=None,
                        help="the broker's init-data (required on snp and tdx; attestation/broker_initdata.py)")
    parser.add_argument("--tsm-dir", type=Path, default=DEFAULT_BASE)
    parser.add_argument("--tsm-entry", default=None)
    parser.add_argument("--sev-guest-device", type=Path, default=SEV_GUEST)
    parser.add_argument("--ccel-table", type=Path, default=CCEL_TABLE)
    parser.add_argument("--ccel-data", type=Path, default=CCEL_DATA)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The broker's options for `argv` (exits with a usage error on bad input)."""
    return _parser().parse_args(argv)


def settings_from(args: argparse.Namespace, env: dict[str, str] | None = None) -> BrokerSettings:
    """The broker's settings for its parsed arguments (secrets from `env`, default the environment)."""
    return BrokerSettings(
        data_dir=args.data_dir, sim_platform_public_key=args.sim_platform_key, roots_dir=args.roots_dir,
        collateral_dir=args.collateral_dir, collateral_offline=args.collateral_offline,
        tee=args.tee, sim_platform_signing_key=args.sim_platform_signing_key,
        unsafe_sim_reseal=args.unsafe_sim_reseal, unsafe_sim_measurement=args.unsafe_sim_measurement,
        rate_limit_per_minute=args.rate_limit_per_minute,
        max_body_bytes=args.max_body_bytes, lease_s=args.lease_seconds,
        lease_max_wait_s=args.lease_max_wait_seconds,
        admin_token_sha256=admin_token_hashes(env, hash_file=args.admin_token_hash_file, dev=args.unsafe_dev_mode),
        keystore=args.keystore, vault_url=args.vault_url,
        vault_token=vault_token_from_env(env) if args.keystore == "vault" else None,
        vault_mount=args.vault_mount, unsafe_dev_mode=args.unsafe_dev_mode,
        audit_witness=args.audit_witness, audit_anchor_url=args.audit_anchor_url,
        state_anchor=args.state_anchor, vault_kv_mount=args.vault_kv_mount, unsafe_adopt_state=args.unsafe_adopt_state,
        init=args.init,
        init_data=args.init_data, kernel=KernelInterfaces(args.tsm_dir, args.tsm_entry, args.sev_guest_device,
                                                          args.ccel_table, args.ccel_data),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s key-broker %(levelname)s %(message)s")
    try:  # before any key is made or opened: this broker runs what its init-data says, or stops here
        settings = settings_from(args)
        launched = check_broker_workload(settings, argv, process_environ())
    except (AttestationError, SettingsError, OSError) as exc:
        print(f"key-broker: refusing to start: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG_ERROR  # restarting cannot help: the same arguments, the same init-data
    if launched is not None and settings.tee != "sim":
        logging.getLogger(__name__).info("init-data %s: arguments, environment and configuration are as declared",
                                         launched.digest_for(settings.tee).hex())
    # Held lease renewals (long polls) must not hold a stopping broker: workers simply renew again.
    try:  # a missing, unreadable or older state anchor, keys or ledger: refuse, never start fresh (#46)
        app = create_app(settings)
    except (SettingsError, KeyStoreError) as exc:
        print(f"key-broker: refusing to start: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG_ERROR
    freeze_startup_heap()  # before any key is fetched: full GC passes scan only what serving creates
    schedule_full_collections()  # and run on a timer, not every few seconds under load
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
