"""Sentence embeddings: tokenize, batch by length, encode (models/bert.py), pool, normalize.

The pooling is the model's own, as its sentence-transformers files state it (encoder_checkpoint.py):
mean over the real tokens or the first ([CLS]) token, then L2 normalization when the model has a
Normalize module. Inputs longer than the model's window are refused, as OpenAI refuses them, rather
than silently truncated (a truncated document would be indexed as if it were whole)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoint import Checkpoint
from .errors import CheckpointError, InvalidRequestError
from .models.bert import BertEncoder
from .models.options import BuildOptions

POOLING_MODES = ("mean", "cls")


@dataclass(frozen=True)
class Pooling:
    mode: str  # one of POOLING_MODES
    normalize: bool
    max_tokens: int  # the longest input accepted, special tokens included


@dataclass(frozen=True)
class Embeddings:
    vectors: torch.Tensor  # [inputs, dim], float32, in the order given
    prompt_tokens: int  # tokens encoded, special tokens included (what usage reports)


class Embedder:
    """One encoder model, ready to embed batches of texts or token-id lists."""

    def __init__(self, checkpoint: Checkpoint, options: BuildOptions, max_batch_tokens: int = 8192) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        cfg = checkpoint.config
        self.pooling = pooling_of(cfg)
        self.device = options.device
        self.encoder = BertEncoder(cfg, dict(checkpoint.tensors), options)
        self.dim = self.encoder.spec.hidden
        self.vocab_size = int(cfg.get("vocab_size", self.encoder.word.shape[0]))
        self.pad_id = int(cfg.get("pad_token_id") or 0)
        self.max_batch_tokens = max(max_batch_tokens, self.pooling.max_tokens)
        self._tok = HFTokenizer.from_str(checkpoint.tokenizer_json)
        # The tokenizer file's own truncation and padding would hide an over-long input: off.
        self._tok.no_truncation()
        self._tok.no_padding()

    @property
    def chunk_window(self) -> int:
        """The most document tokens one chunk may have: the model's window less its special tokens."""
        return self.pooling.max_tokens - len(self._tok.encode("").ids)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Each token's character span in ``text`` (no special tokens): what chunking cuts on."""
        return [tuple(o) for o in self._tok.encode(text, add_special_tokens=False).offsets]  # type: ignore[misc]

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Normalized vectors of texts as numpy (what the vector index takes)."""
        return self.embed(texts).vectors.numpy()

    def tokenize(self, inputs: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """Each input's ids (texts tokenized with the special tokens the model was trained with; id lists
        taken as given); an empty or over-long input, or an id outside the vocabulary, is refused."""
        if not inputs:
            raise InvalidRequestError("input must not be empty")
        out: list[list[int]] = []
        for i, item in enumerate(inputs):
            ids = self._tok.encode(item).ids if isinstance(item, str) else [int(t) for t in item]
            if not ids or (isinstance(item, str) and not item):
                raise InvalidRequestError(f"input[{i}] is empty")
            if any(t < 0 or t >= self.vocab_size for t in ids):
                raise InvalidRequestError(f"input[{i}] has a token id outside the vocabulary "
                                          f"(0..{self.vocab_size - 1})")
            if len(ids) > self.pooling.max_tokens:
                raise InvalidRequestError(f"input[{i}] has {len(ids)} tokens; this model's maximum is "
                                          f"{self.pooling.max_tokens}")
            out.append(ids)
        return out

    def embed(self, inputs: Sequence[str | Sequence[int]]) -> Embeddings:
        token_lists = self.tokenize(inputs)
        vectors = torch.empty(len(token_lists), self.dim, dtype=torch.float32)
        # Longest first, in batches of a bounded padded size: little padding, bounded memory.
        order = sorted(range(len(token_lists)), key=lambda i: -len(token_lists[i]))
        start = 0
        while start < len(order):
            longest = len(token_lists[order[start]])
            count = max(1, self.max_batch_tokens // longest)
            batch = order[start:start + count]
            vectors[batch] = self._encode([token_lists[i] for i in batch])
            start += len(batch)
        return Embeddings(vectors=vectors, prompt_tokens=sum(map(len, token_lists)))

    def _encode(self, batch: list[list[int]]) -> torch.Tensor:
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, seq in enumerate(batch):
            ids[row, :len(seq)] = torch.tensor(seq)
            mask[row, :len(seq)] = 1
        hidden = self.encoder(ids.to(self.device), mask.to(self.device)).float()
        mask_f = mask.to(hidden.device, torch.float32).unsqueeze(-1)
        pooled: torch.Tensor = (hidden[:, 0] if self.pooling.mode == "cls"
                                else (hidden * mask_f).sum(1) / mask_f.sum(1).clamp(min=1.0))
        if self.pooling.normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        return pooled.cpu()


def pooling_of(cfg: dict[str, Any]) -> Pooling:
    """The pooling the checkpoint states (``_pooling``, from its sentence-transformers files); a model
    without one is refused: guessing mean or CLS would give vectors of another model."""
    raw = cfg.get("_pooling")
    if not isinstance(raw, dict) or raw.get("mode") not in POOLING_MODES:
        raise CheckpointError("the encoder states no pooling (mean or cls) in its sentence-transformers files")
    limit = int(cfg.get("max_position_embeddings", 512))
    max_tokens = min(int(raw.get("max_tokens") or limit), limit)
    return Pooling(mode=str(raw["mode"]), normalize=bool(raw.get("normalize")), max_tokens=max_tokens)
