"""Perplexity of a token sequence under an engine's model (teacher forcing, one prefill): the
quantization tests' quality check, run on the engine's own model between its steps."""

from __future__ import annotations

import math
import secrets

import torch

from enclave_worker.engine.config import SamplingParams
from enclave_worker.engine.llm_engine import LLMEngine
from enclave_worker.engine.scheduler import ScheduledSeq
from enclave_worker.engine.sequence import Sequence


def perplexity(engine: LLMEngine, token_ids: list[int]) -> float:
    """exp(mean NLL of token i+1 given tokens 0..i); runs between steps, under the engine's step lock."""
    if not 2 <= len(token_ids) <= engine.max_model_len:
        raise ValueError("need 2..max_model_len tokens")
    seq = Sequence(-1, "", list(token_ids), len(token_ids), SamplingParams(), 1, secrets.token_bytes(16))
    with engine._step_lock, engine._cond:
        if not engine.blocks.can_allocate(seq):
            raise RuntimeError("not enough free KV blocks")
        engine.blocks.allocate(seq)
        try:
            sched = ScheduledSeq(seq, 0, len(token_ids))
            input_ids, positions, meta, _ = engine.runner.prepare([sched])
            assert input_ids is not None and positions is not None and meta is not None  # a prefill: eager
            logits = engine.runner.forward(input_ids, positions, meta, list(range(len(token_ids) - 1)))
        finally:
            engine.blocks.free_seq(seq)
    targets = torch.tensor(token_ids[1:], device=logits.device)
    nll = torch.nn.functional.cross_entropy(logits, targets)
    return math.exp(nll.item())
