"""The three tool-call families for tests: a tokenizer with each family's control tokens, chat
templates written to each family's published spec (not their text; chat_templates/*.jinja), and a stand-in engine that
answers a fixed token sequence.

The templates follow what each family's own template does with `tools`: Qwen 2.5/3 lists the tools
as JSON lines in `<tools></tools>` in the system message and asks for `<tool_call>` blocks; Llama 3.1
sets `Environment: ipython` and puts the tools in the first user message, asking for
`{"name": ..., "parameters": ...}`; Mistral puts `[AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]` before the
last `[INST]`, and its model answers `[TOOL_CALLS][...]`; Mistral's v11 tokenizers (Small 3.1 and later)
add `[SYSTEM_PROMPT]` and `[ARGS]`, and the model answers `[TOOL_CALLS]name[ARGS]{...}` per call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enclave_worker.engine.config import RequestOutput, SamplingParams
from enclave_worker.engine.tokenizer import Tokenizer

TEMPLATE_DIR = Path(__file__).parent / "chat_templates"
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
           "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[ARGS]", "[SYSTEM_PROMPT]",
           "[/SYSTEM_PROMPT]"]
# Qwen's <tool_call> tokens are added but not special: they stay in the decoded text.
ADDED = ["<tool_call>", "</tool_call>"]

QWEN_TEMPLATE = (TEMPLATE_DIR / "qwen2_5.jinja").read_text()

LLAMA31_TEMPLATE = (TEMPLATE_DIR / "llama3_1.jinja").read_text()

MISTRAL_TEMPLATE = (TEMPLATE_DIR / "mistral.jinja").read_text()

MISTRAL_V11_TEMPLATE = (TEMPLATE_DIR / "mistral_v11.jinja").read_text()

TEMPLATES = {"hermes": QWEN_TEMPLATE, "llama3_json": LLAMA31_TEMPLATE, "mistral": MISTRAL_TEMPLATE,
             "mistral_v11": MISTRAL_V11_TEMPLATE}
BOS = {"hermes": None, "llama3_json": "<|begin_of_text|>", "mistral": "<s>", "mistral_v11": "<s>"}
EOS = {"hermes": "<|im_end|>", "llama3_json": "<|eot_id|>", "mistral": "</s>", "mistral_v11": "</s>"}


def tokenizer_json() -> str:
    """Byte-level BPE over single bytes (no merges), plus the families' control tokens."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    return str(tok.to_str())


def family_tokenizer(family: str) -> Tokenizer:
    json_doc = tokenizer_json()
    probe = Tokenizer(json_doc, None, {})
    config: dict[str, Any] = {"eos_token_id": probe.encode(EOS[family])[0]}
    if BOS[family]:
        config["bos_token_id"] = probe.encode(BOS[family])[0]
    return Tokenizer(json_doc, TEMPLATES[family], config)


@dataclass
class ScriptedEngine:
    """Answers every request with the same token ids, one per step, decoded as the engine decodes
    them (special tokens dropped from the text, partial characters held back)."""

    tokenizer: Tokenizer
    answer_ids: list[int]
    finish_reason: str = "stop"
    max_model_len: int = 4096
    prompts: list[list[int]] = field(default_factory=list)
    params: list[SamplingParams] = field(default_factory=list)

    @classmethod
    def speaking(cls, tokenizer: Tokenizer, text: str, finish_reason: str = "stop") -> ScriptedEngine:
        return cls(tokenizer, tokenizer.encode(text), finish_reason)

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       cache_salt: bytes = b"") -> AsyncIterator[RequestOutput]:
        self.prompts.append(list(prompt_token_ids))
        self.params.append(params)
        ids: list[int] = []
        prefix_offset = read_offset = 0
        for n, tid in enumerate(self.answer_ids, 1):
            ids.append(tid)
            text, prefix_offset, read_offset = self.tokenizer.decode_incremental(ids, prefix_offset, read_offset)
            last = n == len(self.answer_ids)
            yield RequestOutput(request_id, text, (tid,), last, self.finish_reason if last else None,
                                len(prompt_token_ids), n)

    def stats(self) -> dict[str, Any]:
        return {}
