"""A stand-in engine for tests of the worker's request path over real gRPC: a tokenizer with no
template (one id per character) and a generator that answers `tokens` tokens of "ok", optionally
holding after the first one until `release` is set (to disconnect mid-stream)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from enclave_worker.engine.config import RequestOutput, SamplingParams


class CharTokenizer:
    chat_template = None
    eos_token_ids: tuple[int, ...] = ()

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            tools: Any = None) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt
                                                                            else "")

    def encode_segments(self, segments: list[tuple[str, bool]]) -> list[int]:
        return [ord(c) % 30000 for text, _ in segments for c in text]

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 30000 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def check_ids(self, ids: Any) -> list[int]:
        return list(ids)


@dataclass
class StandInEngine:
    tokens: int = 3
    release: asyncio.Event | None = None  # set: hold after the first token until it is set
    aborted: list[str] = field(default_factory=list)
    tokenizer: CharTokenizer = field(default_factory=CharTokenizer)
    max_model_len: int = 4096

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       cache_salt: bytes = b"") -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            for i in range(1, self.tokens + 1):
                finished = i == self.tokens
                yield RequestOutput(request_id, "ok", (111,), finished, "length" if finished else None,
                                    len(prompt_token_ids), i)
                if i == 1 and self.release is not None:
                    await self.release.wait()
        finally:
            if not finished:
                self.aborted.append(request_id)

    def stats(self) -> dict[str, Any]:
        return {}
