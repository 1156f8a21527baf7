"""Each family's own chat format for the tiny checkpoints of tiny.py: a byte-level tokenizer.json
carrying the family's control tokens, and a chat template written to the family's published format
(not copied from its repository).

The tiny configs name token 256 as BOS and 257 as EOS (tiny.py's `_COMMON`), so each family lists
its BOS first and its end-of-turn token (what the instruct model's generation stops at) second:

| family | turn format | template |
|---|---|---|
| llama3 | `<|start_header_id|>user<|end_header_id|>\\n\\n...<|eot_id|>` | chat_templates/llama3_1.jinja |
| mistral, mixtral | `[INST]...[/INST]` | chat_templates/mistral.jinja |
| qwen2, qwen3, qwen3_moe | ChatML `<|im_start|>user\\n...<|im_end|>` | chat_templates/qwen2_5.jinja (1) |
| gemma2, gemma3 | `<start_of_turn>user\\n...<end_of_turn>`, the assistant named `model` | GEMMA below |
| phi3 | `<|user|>\\n...<|end|>` | PHI3 below |

(1) Qwen3's own template differs from Qwen2.5's in its thinking parts only, which a history
without assistant turns does not render.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.enclave_worker.engine.models.tiny import VOCAB

TEMPLATE_DIR = Path(__file__).parents[2] / "chat_templates"

# Gemma 2 and 3: a system message is folded into the first user turn (Gemma 3's template does so;
# Gemma 2's refuses one, which this test never sends).
GEMMA = ("{{ bos_token }}{% set ns = namespace(system='') %}"
         "{% if messages[0].role == 'system' %}{% set ns.system = messages[0].content + '\n\n' %}{% endif %}"
         "{% for m in messages %}{% if not (loop.first and m.role == 'system') %}"
         "<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
         "{% if loop.index0 <= 1 and m.role == 'user' %}{{ ns.system }}{% endif %}{{ m.content }}<end_of_turn>\n"
         "{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
# Phi-3 / Phi-4-mini: one role token per turn, each turn closed by <|end|>.
PHI3 = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}")


@dataclass(frozen=True)
class ChatFormat:
    specials: tuple[str, ...]  # ids 256.. in this order: BOS, EOS (end of turn), the rest
    template: str
    added: tuple[str, ...] = ()  # tokens that are not special: they stay in the decoded text

    @property
    def bos(self) -> str:
        return self.specials[0]

    @property
    def eos(self) -> str:
        return self.specials[1]


def _file(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text()


LLAMA3 = ChatFormat(("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                     "<|python_tag|>", "<|end_of_text|>"), _file("llama3_1.jinja"))
MISTRAL = ChatFormat(("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                      "[TOOL_RESULTS]", "[/TOOL_RESULTS]"), _file("mistral.jinja"))
QWEN = ChatFormat(("<|endoftext|>", "<|im_end|>", "<|im_start|>"), _file("qwen2_5.jinja"),
                  added=("<tool_call>", "</tool_call>"))
GEMMA_FORMAT = ChatFormat(("<bos>", "<end_of_turn>", "<start_of_turn>", "<eos>"), GEMMA)
PHI3_FORMAT = ChatFormat(("<s>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|endoftext|>"), PHI3)

CHAT_FORMATS: dict[str, ChatFormat] = {
    "llama3": LLAMA3, "mistral": MISTRAL, "mixtral": MISTRAL, "qwen2": QWEN, "qwen3": QWEN, "qwen3_moe": QWEN,
    "gemma2": GEMMA_FORMAT, "gemma3": GEMMA_FORMAT, "phi3": PHI3_FORMAT,
}


def tokenizer_json(chat: ChatFormat) -> str:
    """Byte-level BPE over single bytes (ids 0..255, no merges), then the family's control tokens,
    then `<unused_N>` up to the model's vocabulary (as real tokenizers reserve theirs): every id the
    model can produce has its own text, so an answer's tokens can be told apart by their text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in chat.specials])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in chat.added])
    filler = VOCAB - tok.get_vocab_size(with_added_tokens=True)
    tok.add_tokens([AddedToken(f"<unused_{i}>", special=False, normalized=False) for i in range(filler)])
    return str(tok.to_str())


def write_chat_format(family: str, out: Path) -> ChatFormat:
    """Put the family's tokenizer.json and tokenizer_config.json (its chat template) into the HF
    directory `out` (a tiny.py checkpoint), replacing tiny.py's generic ones."""
    chat = CHAT_FORMATS[family]
    (out / "tokenizer.json").write_text(tokenizer_json(chat))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": chat.template, "bos_token": chat.bos, "eos_token": chat.eos}))
    return chat
