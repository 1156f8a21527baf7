"""What a worker says about itself, in one model: its `/internal/status` answer and the body of the
heartbeat it sends the gateway (which adds where to reach it and the keys it serves with)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ServingState = Literal["starting", "ready", "failed"]
EngineStats = dict[str, int | float]  # LLMEngine.stats(): counts, sizes, percentages


class WorkerStatus(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    status: ServingState
    tenant: str = Field(max_length=64)
    model: str = Field(max_length=256)
    version: str = Field(max_length=64)
    tee: str = Field(max_length=16)
    gpu_tee: str | None = Field(default=None, max_length=16)  # "nvgpu": GPUs attested beside the CPU
    insecure: bool  # a simulated TEE, or a GPU serving outside confidential computing
    device: str = Field(default="cpu", max_length=32)
    dtype: str = Field(default="", max_length=16)
    gpu_cc_off: bool = False
    load_s: float | None = None  # seconds from key release to serving
    gpu_memory: dict[str, int] | None = None  # bytes: allocated, reserved, free, total
    stats: EngineStats = Field(default_factory=dict)


class Heartbeat(WorkerStatus):
    """A worker's registration, every second; checked as hostile input by the gateway."""

    worker_id: str = Field(max_length=64)
    grpc_address: str = Field(max_length=256)
    http_url: str = Field(max_length=256)
    usage_public_key: str = Field(min_length=64, max_length=64)
    pid: int | None = None
    tls_cert: str = Field(default="", max_length=8192)  # PEM; empty: plaintext gRPC (loopback tests)
    sealed_key_id: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")  # hex SHA-256 of its HPKE key
