"""A sequence: one request's tokens, KV block table, and progress through prefill and decode."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .config import SamplingParams, TokenLogprob

if TYPE_CHECKING:
    from .structured import GrammarState


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    max_tokens: int  # params.max_tokens capped by the model length
    cache_salt: bytes = b""
    generator: torch.Generator | None = None
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_hashed_blocks: int = 0  # leading full blocks registered in the prefix cache
    last_block_hash: bytes = b""
    finish_reason: str | None = None
    # streaming state
    prefix_offset: int = 0
    read_offset: int = 0
    output_text: str = ""
    emitted_chars: int = 0
    emitted_tokens: int = 0
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    grammar: GrammarState | None = None  # constrained decoding (structured.py): what may come next
    scheduled_at: float | None = None  # time.monotonic() of its first batch slot (its queue wait ends)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: drop all KV; the whole token list becomes the new prompt."""
        self.status = SeqStatus.WAITING
        self.block_table = []
        self.num_computed_tokens = 0
        self.num_hashed_blocks = 0
        self.last_block_hash = b""
