"""Tokenizer: a `tokenizers` tokenizer plus the jinja2 chat template, and stream-safe detokenization."""

from __future__ import annotations

from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InvalidRequestError


def _raise(message: str) -> None:
    raise InvalidRequestError(message)


class Tokenizer:
    def __init__(self, tokenizer_json: str, chat_template: str | None, config: dict[str, Any]) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._tok = HFTokenizer.from_str(tokenizer_json)
        # Text a user typed: "<|im_start|>" in it stays those characters, never the control token.
        self._text_tok = HFTokenizer.from_str(tokenizer_json)
        self._text_tok.encode_special_tokens = True
        self.vocab_size = max(self._tok.get_vocab_size(with_added_tokens=True), config.get("vocab_size", 0))
        self.chat_template = chat_template
        eos = config.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_token_ids: tuple[int, ...] = tuple(eos_ids)
        bos = config.get("bos_token_id")
        self.bos_token = config.get("_bos_token") or (self._tok.id_to_token(bos) if isinstance(bos, int) else "")
        self.eos_token = config.get("_eos_token") or (self._tok.id_to_token(eos_ids[0]) if eos_ids else "")
        self._template = None
        if chat_template:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(chat_template)

    def to_json(self) -> str:
        """The tokenizer.json this was built from (the grammar library builds its own view of it)."""
        return str(self._tok.to_str())

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; `parse_special=False` for untrusted text (special tokens stay text)."""
        if not isinstance(text, str):
            raise InvalidRequestError("text to tokenize must be a string")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequestError("the text is not valid Unicode (a lone UTF-16 surrogate)") from None
        tok = self._tok if parse_special else self._text_tok
        try:
            return tok.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # the Rust tokenizer's errors are request errors, never worker failures
            raise InvalidRequestError(f"the text cannot be tokenized ({type(exc).__name__})") from None

    def encode_segments(self, segments: list[tuple[str, bool]]) -> list[int]:
        """Concatenated ids of (text, trusted) segments: only trusted ones (the template's) may hold control tokens."""
        ids: list[int] = []
        for text, trusted in segments:
            if text:
                ids.extend(self.encode(text, parse_special=trusted))
        return ids

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def check_ids(self, ids: Any) -> list[int]:
        """Token ids from outside (a /detokenize request): integers within the vocabulary."""
        out = list(ids)
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.vocab_size for i in out):
            raise InvalidRequestError(f"token ids must be integers in [0, {self.vocab_size})")
        return out

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        if self._template is None:
            raise InvalidRequestError("this model has no chat template")
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def decode_incremental(self, ids: list[int], prefix_offset: int, read_offset: int) -> tuple[str, int, int]:
        """New stable text of `ids` since read_offset (held back while it ends in a partial character)."""
        prefix_text = self.decode(ids[prefix_offset:read_offset])
        new_text = self.decode(ids[prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            return new_text[len(prefix_text) :], read_offset, len(ids)
        return "", prefix_offset, read_offset
