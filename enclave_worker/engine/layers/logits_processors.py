"""Logit processors before sampling, batched over a step's rows, with vLLM's semantics and order.

vLLM (v1 sampler) applies, to the raw logits in float32: `logit_bias` (added), then the penalties
(`apply_penalties`): the repetition penalty on every token seen in the prompt or the output
(positive logits divided by it, negative ones multiplied), then OpenAI's frequency penalty (minus
penalty x the token's count in the output) and presence penalty (minus penalty once per token
present in the output). Greedy rows take the argmax of the result. Then temperature, then min-p
(tokens whose probability is below min_p x the most likely token's are dropped), then top-k / top-p.
Logprobs stay those of the raw logits (vLLM's default `raw_logprobs`).

Everything here is torch ops on the logits' device over all the rows that ask for it at once: one
padded token tensor per step and a scatter-add, no per-row loop over the vocabulary.
"""

from __future__ import annotations

import torch

from ..config import SamplingParams


def _padded(rows: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device)


def token_counts(rows: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(rows), vocab] int64: how often each token id occurs in each row."""
    ids = _padded(rows, vocab, device)  # the pad id `vocab` falls in a column that is cut off
    counts = torch.zeros(len(rows), vocab + 1, dtype=torch.long, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids))
    return counts[:, :vocab]


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    """In place: add each row's biases (token ids checked against the vocabulary at admission)."""
    rows, toks, bias = [], [], []
    for i, p in enumerate(params):
        for t, b in p.logit_bias:
            rows.append(i)
            toks.append(t)
            bias.append(b)
    if rows:
        dev = logits.device
        logits.index_put_((torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)),
                          torch.tensor(bias, dtype=logits.dtype, device=dev), accumulate=True)


def apply_penalties(logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
                    outputs: list[list[int]]) -> None:
    """In place, on the rows whose params ask for a penalty (vLLM's `apply_penalties`)."""
    rows = [i for i, p in enumerate(params) if p.penalized]
    if not rows:
        return
    dev, vocab = logits.device, logits.shape[-1]
    index = torch.tensor(rows, device=dev)
    sub = logits[index]
    out_counts = token_counts([outputs[i] for i in rows], vocab, dev)
    seen_out = out_counts > 0
    rep = torch.tensor([params[i].repetition_penalty for i in rows], dtype=sub.dtype, device=dev)[:, None]
    if bool((rep != 1).any()):
        seen = seen_out | (token_counts([prompts[i] for i in rows], vocab, dev) > 0)
        scale = torch.where(seen, rep, torch.ones_like(rep))
        sub = torch.where(sub > 0, sub / scale, sub * scale)
    freq = torch.tensor([params[i].frequency_penalty for i in rows], dtype=sub.dtype, device=dev)[:, None]
    pres = torch.tensor([params[i].presence_penalty for i in rows], dtype=sub.dtype, device=dev)[:, None]
    sub = sub - freq * out_counts.to(sub.dtype) - pres * seen_out.to(sub.dtype)
    logits[index] = sub


def apply_min_p(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Temperature-scaled logits [B, V] with tokens below min_p x the top probability at -inf (min_p [B]; 0 = off)."""
    probs = scaled.softmax(-1)
    threshold = probs.amax(-1, keepdim=True) * min_p[:, None].to(probs.dtype)
    return scaled.masked_fill(probs < threshold, float("-inf"))


def needs_processing(params: list[SamplingParams]) -> bool:
    return any(p.logit_bias or p.penalized for p in params)


def process(logits: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
            outputs: list[list[int]]) -> torch.Tensor:
    """The logits every later stage samples from: a float32 copy with bias and penalties applied
    (the input, the raw logits, is left for logprobs)."""
    if not needs_processing(params):
        return logits
    out = logits.float().clone()
    apply_logit_bias(out, params)
    apply_penalties(out, params, prompts, outputs)
    return out
