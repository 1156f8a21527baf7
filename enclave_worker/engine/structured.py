"""Constrained decoding with llguidance: a grammar matcher per sequence masks the logits before
sampling and advances on every sampled token; the sequence ends when the grammar accepts and allows
nothing more (docs/engine.md, "Constrained decoding").

Why llguidance (measured against xgrammar, docs/engine.md): it builds its tokenizer from the
tokenizer.json every checkpoint carries (xgrammar's needs a transformers tokenizer), a new schema
costs a few ms (no per-schema compile of the whole vocabulary), its Lark dialect embeds JSON
schemas (tool calls: protocol/openai/constraints.py), and vLLM's `guidance` backend is the same
library, so both engines read one grammar text the same way.

The per-step work is on the host: one bitmask row per constrained sequence (computed right after its
token was taken, so a step only gathers them), turned into an additive bias on the logits' device by
one table lookup per mask byte (apply_grammar_masks says why not an unpacked boolean mask).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from protocol.sampling import StructuredOutput

from .errors import InvalidRequestError

# JSON's layout where the schema does not say (llguidance's own default allows any run of whitespace
# between tokens, which a sampled model can fill until max_tokens): OpenAI's compact one-line form.
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_BITS = torch.arange(32, dtype=torch.int32)
BUILT_GRAMMARS = 64  # distinct specs whose built matcher is kept for copying


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # a dependency (pyproject.toml); a build without it refuses constraints
        raise InvalidRequestError("structured output needs the llguidance package in the worker") from exc
    return llguidance


class GrammarCompiler:
    """Per engine: the tokenizer as llguidance sees it (~1 s: it reads every token's bytes, holding the
    GIL throughout; built at the engine's first constrained request, docs/engine.md says why not at
    boot), and grammars from our StructuredOutput specs."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self._json, self.vocab_size, self.eos_token_ids = tokenizer_json, vocab_size, eos_token_ids
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        # Built matchers by spec, copied for each new sequence: n choices of one request, and clients
        # that send one schema with every request, build its grammar once (a 64-item array schema
        # took ~200 ms to build, a copy is microseconds). Bounded: the oldest goes first.
        self._built: OrderedDict[StructuredOutput, Any] = OrderedDict()

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                llg = _llguidance()
                self._tokenizer = llg.LLTokenizer(self._json, n_vocab=self.vocab_size,
                                                  eos_token=list(self.eos_token_ids) or None)
            return self._tokenizer

    def grammar(self, spec: StructuredOutput) -> str:
        llg = _llguidance()
        try:
            if spec.kind == "json_schema":
                return str(llg.LLMatcher.grammar_from_json_schema(spec.spec, defaults=JSON_DEFAULTS))
            if spec.kind == "regex":
                return str(llg.LLMatcher.grammar_from_regex(spec.spec))
            return str(llg.LLMatcher.grammar_from_lark(spec.spec))
        except ValueError as exc:
            raise InvalidRequestError(f"the {spec.kind} is not valid: {str(exc)[:200]}") from None

    def matcher(self, spec: StructuredOutput) -> GrammarState:
        """A fresh matcher for one sequence; a grammar llguidance cannot build is a request error."""
        with self._lock:
            built = self._built.get(spec)
            if built is not None:
                self._built.move_to_end(spec)
        if built is None:
            llg = _llguidance()
            built = llg.LLMatcher(self.tokenizer(), self.grammar(spec), log_level=0)
            if built.is_error():
                raise InvalidRequestError(f"the {spec.kind} cannot be enforced: {built.get_error()[:200]}")
            built.compute_bitmask()  # the first mask builds the lexer's states; copies share them
            with self._lock:
                self._built[spec] = built
                while len(self._built) > BUILT_GRAMMARS:
                    self._built.popitem(last=False)
        state = GrammarState(built.deep_copy(), self.vocab_size, self.eos_token_ids)
        state.refresh()
        return state


@dataclass(eq=False)
class GrammarState:
    """One sequence's matcher and the bitmask of the tokens it allows next ([1, ceil(V/32)] int32)."""

    matcher: Any
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    mask: torch.Tensor | None = None

    def refresh(self) -> None:
        from llguidance.torch import allocate_token_bitmask, fill_next_token_bitmask

        if self.mask is None:
            self.mask = allocate_token_bitmask(1, self.vocab_size)
        fill_next_token_bitmask(self.matcher, self.mask, 0)

    def advance(self, token: int) -> bool:
        """Take the sampled token; True when the answer is complete (the grammar accepts and allows
        nothing but EOS, or the matcher stopped), so the sequence ends without sampling EOS."""
        if not self.matcher.consume_token(token) or self.matcher.is_stopped():
            return True
        self.refresh()
        return bool(self.matcher.is_accepting()) and self._only_eos()

    def _only_eos(self) -> bool:
        """Whether the mask allows no token but EOS: the packed words with the EOS bits cleared are all
        zero (1,536 words for a 49k vocabulary, instead of listing every allowed token). Bits past the
        vocabulary in the last word are no tokens."""
        assert self.mask is not None
        words = self.mask.numpy()[0].view(np.uint32)[: -(-self.vocab_size // 32)].copy()
        if self.vocab_size % 32:
            words[-1] &= np.uint32((1 << (self.vocab_size % 32)) - 1)
        for t in self.eos_token_ids:
            if t < self.vocab_size:
                words[t >> 5] &= ~np.uint32(1 << (t & 31))
        return not words.any()


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, words] int32 bitmask -> [B, vocab_size] bool (bit i of word w allows token 32w + i)."""
    bits = (bitmask[:, :, None] >> _BITS.to(bitmask.device)) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


# Bias per mask byte: row b holds the 8 tokens' bias for byte value b (bit i set: token i allowed, -0.0,
# which leaves every logit exactly as it was, even -0.0; clear: -inf). Bytes, not int32 words: the
# words are read as little-endian bytes, so byte k of word w holds tokens 32w + 8k .. 32w + 8k + 7.
_BYTE_BIAS = torch.tensor([[-0.0 if (b >> i) & 1 else float("-inf") for i in range(8)] for b in range(256)])
_BYTE_BIAS_ON: dict[torch.device, torch.Tensor] = {}
if sys.byteorder != "little":  # the byte view above (x86 and ARM hosts are little-endian)
    raise ImportError("constrained decoding reads its bitmasks as little-endian bytes")


def _byte_bias(device: torch.device) -> torch.Tensor:
    table = _BYTE_BIAS_ON.get(device)
    if table is None:
        table = _BYTE_BIAS_ON[device] = _BYTE_BIAS.to(device)
    return table


def apply_grammar_masks(logits: torch.Tensor, states: list[GrammarState | None]) -> torch.Tensor:
    """Logits with every constrained row's disallowed tokens at -inf (a new tensor when any row is
    constrained; the raw logits stay for logprobs). Unconstrained rows pass unchanged.

    As a bias added in one op: `logits + bias` gathered from _BYTE_BIAS by the masks' bytes (an
    unconstrained row takes an all-ones mask, so its bias is -0.0 throughout). x + -0.0 is x for every
    x and x + -inf is -inf for every finite x (the model's logits are), so the result is the masked
    fill's. Unpacking the bits to a boolean [B, V] with shifts, then a masked fill on a clone, was
    ~10 torch ops over [B, V] per step, each a parallel region the step's threads meet at: 1.72 ms
    median at batch 16 on the 2-vCPU VM against 0.55 ms for this index_select and add, and far worse
    once the VM is loaded (docs/engine.md, "Constrained decoding")."""
    masks = [None if s is None else s.mask for s in states]
    shape = next((m.shape for m in masks if m is not None), None)
    if shape is None:
        return logits
    free = torch.full(shape, -1, dtype=torch.int32)
    packed = torch.cat([free if m is None else m for m in masks])
    byte_index = packed.view(torch.uint8).reshape(-1).to(logits.device, non_blocking=True).int()
    bias = _byte_bias(logits.device).index_select(0, byte_index).view(len(states), -1)
    return logits + bias[:, : logits.shape[-1]]
