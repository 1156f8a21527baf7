"""OpenAI request schemas (the subset we serve); unknown fields are rejected, as OpenAI does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from protocol.sampling import MAX_LOGIT_BIAS, MAX_REPETITION_PENALTY, MAX_STRUCTURED_SPEC

# Bounds that keep every number inside the worker protocol's types (a 500 otherwise) and every
# request's fan-out small: prompts x n choices run as that many streams.
MAX_TOKENS = 1 << 20  # far above any context we serve; uint32 on the wire
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_PROMPTS = 64  # list prompts in one /v1/completions request; prompts x n is capped by the gateway too


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"


class ToolCallIn(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionDef(BaseModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-\.]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: dict[str, str]


class AllowedTools(Strict):
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1, max_length=128)


class AllowedToolsChoice(Strict):
    """OpenAI's `{"type": "allowed_tools", ...}`: only these of `tools` may be called, under `mode`."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class SamplingFields(Strict):
    model: str = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    user: str | None = Field(default=None, max_length=256)
    # Sampling beyond temperature / top_p, with vLLM's semantics (enclave_worker/engine/layers/
    # logits_processors.py); every field here is honoured or refused, none is ignored.
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as a string, OpenAI's shape) -> bias in [-100, 100]
    priority: int | None = Field(default=None, ge=-10, le=10)  # vLLM-style; capped by the key's priority
    ignore_eos: bool = False  # vLLM extension: benchmarks need exact output lengths
    # vLLM extensions (`vllm bench serve` sends repetition_penalty 1.0 on every request).
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=MAX_REPETITION_PENALTY)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    # vLLM's constrained-decoding extras (protocol/openai/constraints.py); at most one of them.
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = Field(default=None, min_length=1, max_length=MAX_STRUCTURED_SPEC)
    guided_choice: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1,
                                                                             max_length=256)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens")
        for key, bias in v.items():
            if not key.isdigit() or int(key) >= 1 << 32:
                raise ValueError(f"keys are token ids (non-negative integers), not {key[:32]!r}")
            if not -100 <= bias <= 100:
                raise ValueError("biases are in [-100, 100]")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return v

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None = None
    response_format: ResponseFormat | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1, le=1)


class TokenizeRequest(Strict):
    """vLLM's /tokenize: a completion `prompt` or chat `messages` (rendered as the worker renders them)."""

    model: str = Field(min_length=1, max_length=256)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    continue_final_message: Literal[False] = False
    add_special_tokens: bool = True  # accepted for vLLM's clients; the served tokenizers add none
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(Strict):
    model: str = Field(min_length=1, max_length=256)
    tokens: list[Annotated[int, Field(ge=0, le=(1 << 32) - 1)]] = Field(max_length=1 << 20)
