"""Control-plane tables. No prompts, completions, weights or keys in any of them; API keys are hashes."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)  # share under weighted fair queueing
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    token_budget: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # lifetime tokens
    max_queued: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), unique=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    models: Mapped[list] = mapped_column(JSON, default=list)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)  # higher is served first
    token_budget: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # lifetime tokens of this key
    revoked: Mapped[bool] = mapped_column(default=False)
    # Agent kill switch: every tool call this key's answers carry is refused (in the worker, at once)
    tools_killed: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("tenant", "model", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String(256))
    version: Mapped[str] = mapped_column(String(64))
    traffic_percent: Mapped[float] = mapped_column(Float, default=0.0)
    previous_percent: Mapped[float | None] = mapped_column(Float, nullable=True)  # for one-call rollback
    min_warm: Mapped[int] = mapped_column(Integer, default=1)  # warm-pool floor; 0: may scale to zero
    max_replicas: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    ttft_slo_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)  # scale out above it
    retired: Mapped[bool] = mapped_column(default=False, server_default=false())  # workers drain and stop
    # What the control loop last saw (e.g. "failing", "no data key at the broker"); shown by /readyz.
    status: Mapped[str] = mapped_column(String(32), default="", server_default="")
    status_reason: Mapped[str] = mapped_column(String(256), default="", server_default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UsageRow(Base):
    __tablename__ = "usage"
    # One row per (worker, request id): replicas that both receive a record cannot both store it.
    __table_args__ = (Index("ux_usage_worker_request", "worker_id", "request_id", unique=True),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), index=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    key_id: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(String(256))
    version: Mapped[str] = mapped_column(String(64))
    worker_id: Mapped[str] = mapped_column(String(64))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    worker_seconds: Mapped[float] = mapped_column(Float)
    signature: Mapped[str] = mapped_column(String(256))  # hex Ed25519 over the record, verified before insert
    # The signed record (base64 of the exact bytes) and the worker's usage key (hex) it verifies with:
    # checked again on every read (api/store/ledger.py); a row without them counts for nothing.
    payload: Mapped[str | None] = mapped_column(Text, nullable=True)
    public_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class UsageKeyRow(Base):
    """A worker usage key that signed a stored usage row, with the attestation document that binds it
    (evidence and TLS certificate, as the gateway verified them): what the tenant needs, beside the
    records, to check its bill on its own machine (`sealed usage --export` / `--verify`)."""

    __tablename__ = "usage_keys"
    public_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    worker_id: Mapped[str] = mapped_column(String(64))
    document: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class PolicyRow(Base):
    __tablename__ = "policies"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    document: Mapped[dict] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(Integer, default=1)
    # The tenant admin's Ed25519 public key (PEM) the workers are started with; it is part of the
    # workers' measurement, so the control plane cannot substitute its own.
    admin_key_pem: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class PolicyVersionRow(Base):
    """Every version of a tenant's policy document, kept (the policies table holds the current one)."""

    __tablename__ = "policy_versions"
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    document: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ConsoleSessionRow(Base):
    """A console session (the cookie's jti): a session is live only while its row is and not revoked."""

    __tablename__ = "console_sessions"
    jti: Mapped[str] = mapped_column(String(64), primary_key=True)
    subject: Mapped[str] = mapped_column(String(256), index=True)
    role: Mapped[str] = mapped_column(String(32))
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    token_jti: Mapped[str] = mapped_column(String(64))  # the management token it was exchanged for
    issued_at: Mapped[float] = mapped_column(Float)  # epoch seconds, compared with revocation cut-offs
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class TokenRevocation(Base):
    """Management tokens are minted offline (the CLI, the control loop), so they are revoked by
    deny-list: one token by jti, or every token of a subject or tenant (or all) issued up to a time."""

    __tablename__ = "token_revocations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16), index=True)  # jti | subject | tenant | all
    value: Mapped[str] = mapped_column(String(256), index=True)  # "" for all
    issued_until: Mapped[float] = mapped_column(Float)  # tokens issued (iat) at or before this are revoked
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ResponseStateRow(Base):
    """A stored response (`store: true` on /v1/responses): ciphertext only, sealed by a worker under a
    key derived from the model version's data key (enclave_worker/response_state.py). The clear
    columns are what the gateway routes by: owner, model and version, the chain link, the expiry."""

    __tablename__ = "response_states"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str] = mapped_column(String(256))
    version: Mapped[str] = mapped_column(String(128))
    previous_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    blob_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), index=True)


class ConversationRow(Base):
    """A conversation (OpenAI's Conversations API). Its items are worker-sealed ciphertext
    (ConversationItemRow), all under the key of one model version, bound when the first is sealed."""

    __tablename__ = "conversations"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    version: Mapped[str | None] = mapped_column(String(128), nullable=True)
    metadata_blob: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # sealed like its items
    # Made in sealed mode: the whole conversation, one blob a worker sealed (no item rows, no metadata_blob).
    sealed_state: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), index=True)


class ConversationItemRow(Base):
    __tablename__ = "conversation_items"
    conversation_id: Mapped[str] = mapped_column(String(64), ForeignKey("conversations.id", ondelete="CASCADE"),
                                                 primary_key=True)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    blob: Mapped[bytes] = mapped_column(LargeBinary)


class FileRow(Base):
    """An uploaded file (/v1/files): its content is ciphertext a worker sealed (SealFile) under a key
    derived from its model version's data key; the clear columns are owner, name, size and routing."""

    __tablename__ = "files"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(256))
    size: Mapped[int] = mapped_column("bytes", BigInteger)
    model: Mapped[str] = mapped_column(String(256))
    version: Mapped[str] = mapped_column(String(128))
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class VectorStoreRow(Base):
    """A vector store: its corpus and index are one sealed snapshot (versioned; a worker refuses an
    older one than it has seen), replaced whole on every change, compare-and-set on the version."""

    __tablename__ = "vector_stores"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str | None] = mapped_column(String(256), nullable=True)
    metadata_: Mapped[dict] = mapped_column("metadata", JSON)
    model: Mapped[str] = mapped_column(String(256))
    version: Mapped[str] = mapped_column(String(128))
    snapshot: Mapped[bytes] = mapped_column(LargeBinary)
    snapshot_version: Mapped[int] = mapped_column(BigInteger)
    usage_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class VectorStoreFileRow(Base):
    __tablename__ = "vector_store_files"
    store_id: Mapped[str] = mapped_column(String(64), ForeignKey("vector_stores.id", ondelete="CASCADE"),
                                          primary_key=True)
    file_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    batch_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    status: Mapped[str] = mapped_column(String(16))  # completed | failed
    error_code: Mapped[str | None] = mapped_column(String(32), nullable=True)
    error_message: Mapped[str | None] = mapped_column(String(256), nullable=True)
    usage_bytes: Mapped[int] = mapped_column(BigInteger)
    attributes: Mapped[dict] = mapped_column(JSON)
    chunking: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
