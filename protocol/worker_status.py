"""What a worker says about itself: its `/internal/status` answer. (The signed heartbeat it sends
the gateway is `protocol/heartbeat.py`.)"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# draining: shutting down; finishes the streams it has, takes no new ones (the gateway routes
# only to "ready").
ServingState = Literal["starting", "ready", "draining", "failed"]
EngineStats = dict[str, int | float]  # LLMEngine.stats(): counts, sizes, percentages


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
    gpu_cc_off: bool = False
    load_s: float | None = None  # seconds from key release to serving
    gpu_memory: dict[str, int] | None = None  # bytes: allocated, reserved, free, total
    stats: EngineStats = Field(default_factory=dict)
