"""The grammar masks' arithmetic (structured.py): the byte-table bias gives exactly the masked fill of
the unpacked bits, row by row, and the EOS-only check reads the packed words right. No model here:
the engine's constrained runs are test_engine_structured.py."""

from __future__ import annotations

import pytest
import torch

from enclave_worker.engine.structured import GrammarState, apply_grammar_masks, unpack


def _state(words: torch.Tensor, vocab: int, eos: tuple[int, ...] = (0,)) -> GrammarState:
    return GrammarState(matcher=None, vocab_size=vocab, eos_token_ids=eos, mask=words.reshape(1, -1).clone())


def _reference(logits: torch.Tensor, states: list[GrammarState | None]) -> torch.Tensor:
    """The masked fill of the unpacked bits, row by row (the path apply_grammar_masks replaced)."""
    out = logits.clone()
    for i, s in enumerate(states):
        if s is not None:
            assert s.mask is not None
            out[i] = out[i].masked_fill(~unpack(s.mask, logits.shape[-1])[0], float("-inf"))
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)  # compares -0.0 and 0.0 apart, and NaN payloads


@pytest.mark.parametrize("vocab", [100, 128, 49152])  # a vocabulary not a multiple of 32 leaves bits unused
def test_bias_equals_the_masked_fill_for_mixed_rows(vocab):
    g = torch.Generator().manual_seed(vocab)
    words = -(-vocab // 32)
    rows = 6
    logits = torch.randn(rows, vocab, generator=g) * 10
    logits[:, :4] = torch.tensor([-0.0, 0.0, float("-inf"), -1e30])  # signed zero and -inf survive as they were
    masks = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=g)
    masks[1] = -1  # allows everything
    masks[2] = 0  # allows nothing
    masks[3] = torch.iinfo(torch.int32).min  # only bit 31 of each word: the sign bit
    states: list[GrammarState | None] = [_state(m, vocab) for m in masks]
    states[4] = None  # unconstrained rows in the same batch
    out = apply_grammar_masks(logits, states)
    assert out is not logits and torch.equal(_bits(out), _bits(_reference(logits, states)))
    assert torch.equal(_bits(out[4]), _bits(logits[4]))  # untouched, -0.0 included
    assert torch.isinf(out[2]).all() and not torch.isinf(out[1, 4:]).any()
    allowed_3 = torch.isfinite(out[3]).nonzero().flatten()
    assert allowed_3.tolist() == [t for t in range(4, vocab) if t % 32 == 31]


def test_a_batch_without_constrained_rows_is_returned_as_it_is():
    logits = torch.randn(3, 64)
    assert apply_grammar_masks(logits, [None, None, None]) is logits


def test_the_logits_are_not_changed_in_place():
    logits = torch.randn(2, 64)
    before = logits.clone()
    out = apply_grammar_masks(logits, [_state(torch.zeros(2, dtype=torch.int32), 64), None])
    assert torch.isinf(out[0]).all() and torch.equal(logits, before)


def _words(vocab: int, allowed: list[int]) -> torch.Tensor:
    bits = torch.zeros(-(-vocab // 32) * 32, dtype=torch.int64)
    bits[allowed] = 1
    w = (bits.view(-1, 32) << torch.arange(32)).sum(dim=1)
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


@pytest.mark.parametrize(("allowed", "only_eos"), [
    ([63], True),  # EOS at bit 31 of its word
    ([2, 63], True),  # both EOS ids
    ([], True),  # nothing at all: nothing but EOS
    ([63, 64], False),  # EOS and one more token
    ([5], False),
    ([99], False),  # the last token of a vocabulary that ends inside a word
    ([63, 100, 127], True),  # bits past the vocabulary are no tokens
])
def test_only_eos_reads_the_packed_words(allowed, only_eos):
    vocab = 100
    state = _state(_words(vocab, allowed), vocab, eos=(2, 63))
    in_vocab = [t for t in allowed if t < vocab]
    assert torch.equal(unpack(state.mask, vocab)[0].nonzero().flatten(), torch.tensor(in_vocab, dtype=torch.long))
    assert state._only_eos() is only_eos
