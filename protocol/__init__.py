"""Wire contracts shared by the roles: gateway <-> worker gRPC (`rpc`), the key-release protocol
(`broker`: schemas, HPKE sealing, typed client), the encrypted model package format and key
sealing (`package`), sealed-mode requests and responses (`sealed`), mTLS identities (`tls`)
and crash-safe file writes (`fsutil`).

This package imports no role package (`enclave_worker`, `key_broker`, `api`); import-linter
enforces it (pyproject.toml). Keep heavy imports (torch, SQLAlchemy) out of it: the CLI and the
key broker import it.
"""
