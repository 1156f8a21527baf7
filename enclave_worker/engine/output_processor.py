"""Per-sequence output handling: stop conditions, stream-safe incremental text, delta outputs."""

from __future__ import annotations

from .config import RequestOutput, TokenLogprob
from .sequence import Sequence
from .tokenizer import Tokenizer


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def append(
        self, seq: Sequence, token: int, record: TokenLogprob | None, eos_token_ids: tuple[int, ...]
    ) -> str | None:
        """Add a sampled token; returns the finish reason, if the sequence is now done."""
        seq.token_ids.append(token)
        if record is not None:
            seq.pending_logprobs.append(record)
        p = seq.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids):
            return "stop"  # the stop token's text is not part of the output
        # Constrained: the grammar takes the token; a complete answer ends here (EOS is never sampled).
        complete = seq.grammar is not None and seq.grammar.advance(token)
        ids = seq.completion_ids
        text, seq.prefix_offset, seq.read_offset = self.tokenizer.decode_incremental(
            ids, seq.prefix_offset, seq.read_offset
        )
        if text:
            before = len(seq.output_text)
            seq.output_text += text
            if p.stop:
                longest = max(len(s) for s in p.stop)
                start = max(0, before - longest + 1)
                hits = [i for i in (seq.output_text.find(s, start) for s in p.stop) if i >= 0]
                if hits:
                    seq.output_text = seq.output_text[: min(hits)]
                    return "stop"
        if complete:
            return "stop"
        if seq.num_completion_tokens >= seq.max_tokens:
            return "length"
        return None

    def emit(self, seq: Sequence) -> RequestOutput:
        """The delta since the last emit; text that could still begin a stop string is held back."""
        final = seq.is_finished
        end = len(seq.output_text)
        if not final and seq.params.stop:
            end = max(seq.emitted_chars, end - (max(len(s) for s in seq.params.stop) - 1))
        delta = seq.output_text[seq.emitted_chars : end]
        seq.emitted_chars = end
        toks = tuple(seq.completion_ids[seq.emitted_tokens :])
        seq.emitted_tokens = seq.num_completion_tokens
        lps = None
        if seq.params.logprobs is not None:
            lps, seq.pending_logprobs = tuple(seq.pending_logprobs), []
        return RequestOutput(
            seq.request_id,
            delta,
            toks,
            final,
            seq.finish_reason if final else None,
            seq.num_prompt_tokens,
            seq.num_completion_tokens,
            lps,
            seq.scheduled_at,
        )
