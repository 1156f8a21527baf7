"""Wire schemas between the gateway and the worker."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class GenerateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    logprobs: int | None = None


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(max_length=128)
    tenant: str = Field(max_length=64)
    kind: Literal["chat", "completion"]
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    params: GenerateParams = Field(default_factory=GenerateParams)
