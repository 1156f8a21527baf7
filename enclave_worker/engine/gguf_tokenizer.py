"""Build a `tokenizers` tokenizer.json document from GGUF gpt2-BPE tokenizer metadata."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import CheckpointError

# Pre-tokenizer split patterns per llama.cpp `tokenizer.ggml.pre` (as in the HF tokenizer.json files).
_LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4


def _pre_tokenizer(pre: str | None) -> Any:
    from tokenizers import Regex, pre_tokenizers

    if pre in ("smollm", "starcoder", "refact", "smaug-bpe"):
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if pre in ("llama-bpe", "llama3", "qwen2", "deepseek-r1-qwen"):
        pattern = _LLAMA3_RE if pre in ("llama-bpe", "llama3") else _QWEN2_RE
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


def gguf_tokenizer_json(field: Callable[..., Any]) -> str:
    """`field(key, default)` returns a GGUF metadata value; returns a tokenizer.json document."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    if field("tokenizer.ggml.model") != "gpt2":
        raise CheckpointError(f"unsupported GGUF tokenizer model {field('tokenizer.ggml.model')!r}")
    tokens: list[str] = list(field("tokenizer.ggml.tokens"))
    types: list[int] = list(field("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(field("tokenizer.ggml.pre"))
    tok.decoder = decoders.ByteLevel()
    bos_id = field("tokenizer.ggml.bos_token_id")
    if field("tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types, strict=False)
        if ty == _TOKEN_CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, types, strict=False)
        if ty == _TOKEN_USER_DEFINED
    ]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    return tok.to_str()
