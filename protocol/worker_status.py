"""What a worker says about itself, in one model on every surface:

- `WorkerStatus`: its `/internal/status` answer, and (as JSON) its gRPC `Status` reply's
  `worker_status`, which the control loop and the gateway's health check read;
- `Heartbeat`: the same plus where to reach it, its identity key and its attestation, signed by
  that key (protocol/heartbeat.py): built by the worker, validated by the gateway.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from protocol.model_ref import ModelRef

# draining: shutting down; finishes the streams it has, takes no new ones (the gateway routes
# only to "ready"). standby: a warm worker, attested without a key, waiting for an assignment
# (enclave_worker/standby.py).
ServingState = Literal["starting", "standby", "ready", "draining", "failed"]
EngineStats = dict[str, int | float]  # LLMEngine.stats(): counts, sizes, percentages

# `reason` categories of a failed worker that a fresh start may cure: the key broker was away or
# busy (at boot), or away long enough that the key's lease ran out (the worker wiped the model and
# cannot take it back in the same process). A supervisor restarts a worker that reports one
# (api/supervisor.py, `sealed up`); every other category (refused, revoked, a rejected package or
# policy, failed attestation) needs a person, and a restart would only repeat it.
BROKER_UNREACHABLE = "key broker unreachable"
BROKER_RATE_LIMITED = "key broker rate limit"
LEASE_EXPIRED = "key lease ran out without a renewal"
RESTART_MAY_CURE = frozenset({BROKER_UNREACHABLE, BROKER_RATE_LIMITED, LEASE_EXPIRED})


def restart_may_cure(status: str, reason: str) -> bool:
    """Whether a worker reporting `status` and `reason` should be started again."""
    return status == "failed" and reason in RESTART_MAY_CURE


class WorkerStatus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    status: ServingState
    reason: str = Field(default="", max_length=128)  # a failed boot's category, never exception text
    tenant: str = Field(max_length=64)
    model: str = Field(max_length=256)
    version: str = Field(max_length=64)
    tee: str = Field(max_length=16)
    gpu_tee: str | None = Field(default=None, max_length=16)  # "nvgpu": GPUs attested beside the CPU
    insecure: bool  # a simulated TEE, or a GPU serving outside confidential computing
    device: str = Field(default="cpu", max_length=32)
    dtype: str = Field(default="", max_length=16)
    # The kernels our engine computes with, as the measured configuration names them
    # (enclave_worker/engine/kernel_path.py), e.g. "cpu/x86-avx2/float32/panels+cpp"; "" for vLLM.
    kernel_path: str = Field(default="", max_length=64)
    gpu_cc_off: bool = False
    load_s: float | None = None  # seconds from key release to serving
    gpu_memory: dict[str, int] | None = None  # bytes: allocated, reserved, free, total
    # The model's tool-call syntax, read from its chat template (enclave_worker/tool_syntax.py):
    # "hermes", "llama3_json", "mistral", or "hermes_lenient" (a template that ignores tools).
    tool_call_syntax: str = Field(default="", max_length=32)
    stats: EngineStats = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_form_a_model_ref(self) -> WorkerStatus:
        # Checked where the message is read (a 422 at the gateway's heartbeat route), so every
        # reader can take `ref`. InvalidModelRef is a ValueError: pydantic reports it as invalid.
        ModelRef(self.tenant, self.model, self.version)
        return self

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.tenant, self.model, self.version)


class WorkerAttestationDoc(BaseModel):
    """What the worker's key release produced; served (after it verifies) on /.well-known/attestation."""

    tee: str = Field(max_length=16)
    insecure: bool
    evidence: dict[str, Any]
    token: str = Field(max_length=16384)
    model_digest: str = Field(max_length=128)
    sealed_key_id: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    promises: dict[str, Any] = Field(default_factory=dict)
    # The worker's signed statement of the tenant-signed release policy it got its key under
    # (protocol/sealed/release_statement.py); None: it pins no policy-admin key.
    release: dict[str, Any] | None = None


class OwedUsage(BaseModel):
    """A signed usage record a call could not deliver (the client left before its final chunk)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    payload: str = Field(max_length=4096, pattern=r"^[A-Za-z0-9+/]*={0,2}$")  # base64 of the signed JSON
    signature: str = Field(min_length=128, max_length=128, pattern=r"^[0-9a-f]+$")


class Settle(BaseModel):
    """What calls that ended early still owe the gateway (enclave_worker/outbox.py), at most one
    batch per heartbeat: usage records and the tenant's sealed decision records (base64)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usage: list[OwedUsage] = Field(default_factory=list, max_length=64)
    records: list[Annotated[str, Field(max_length=8192, pattern=r"^[A-Za-z0-9+/]*={0,2}$")]] = Field(
        default_factory=list, max_length=16)


class Heartbeat(WorkerStatus):
    """A worker's WorkerStatus plus where to reach it and who it is, signed by its identity key."""

    # Unknown fields are dropped, not refused (an older or newer worker still registers); they are
    # covered by the signature but never stored, fetched or shown.
    model_config = ConfigDict(extra="ignore", frozen=True)

    worker_id: str = Field(max_length=64)
    grpc_address: str = Field(max_length=256, pattern=r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$")
    usage_public_key: str = Field(min_length=64, max_length=64)
    pid: int | None = None
    tls_cert: str = Field(default="", max_length=8192)  # PEM; empty: plaintext gRPC (loopback tests)
    sealed_key_id: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")  # hex SHA-256 of its HPKE key
    attestation: WorkerAttestationDoc | None = None
    # Signed by the worker's identity key (protocol/heartbeat.py), fresh and in order.
    seq: int = Field(ge=1, le=2**62)
    at: int = Field(ge=0, le=2**40)
    signature: str = Field(min_length=128, max_length=128)
    settle: Settle | None = None
