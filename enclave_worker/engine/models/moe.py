"""Routed experts (Mixtral, Qwen3-MoE): a router picks each token's top-k experts; the token-expert
pairs are sorted by expert so each expert runs ONE matmul pair over all of its tokens (a grouped
GEMM: the loop is over the experts that have tokens this step, never over tokens), and the outputs,
weighted by the routing probabilities, are summed back into each token's row."""

from __future__ import annotations

import torch

from ..layers.activation import act_and_mul
from .options import BuildOptions, build_linear
from .spec import DecoderSpec
from .weights import Weights

# Checkpoint names: (block, router, gate, up, down) per family.
_NAMES = {
    "mixtral": ("block_sparse_moe.", "gate.weight", "w1", "w3", "w2"),
    "qwen3_moe": ("mlp.", "gate.weight", "gate_proj", "up_proj", "down_proj"),
}


class SparseMoe(torch.nn.Module):
    def __init__(self, spec: DecoderSpec, w: Weights, prefix: str, opt: BuildOptions) -> None:
        super().__init__()
        block, router, gate, up, down = _NAMES[spec.family]
        base = prefix + block
        self.router = build_linear(opt, w.take(base + router), quant="none")  # small; its choice steers all
        self.top_k, self.num_experts, self.norm_topk = spec.experts_per_token, spec.experts, spec.norm_topk
        self.activation = spec.activation
        self.gate_up = torch.nn.ModuleList()
        self.down = torch.nn.ModuleList()
        for e in range(spec.experts):
            ex = f"{base}experts.{e}."
            self.gate_up.append(build_linear(opt, w.take_cat([f"{ex}{gate}.weight", f"{ex}{up}.weight"])))
            self.down.append(build_linear(opt, w.take(f"{ex}{down}.weight")))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's experts [T, k] and their weights [T, k] (softmax in float32, then top-k)."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(x)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return self._every_expert(x, experts, weights)
        flat = experts.reshape(-1)
        order = flat.argsort(stable=True)  # token-expert pairs grouped by expert
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # one host sync a layer
        grouped = x[token]
        rows = torch.empty_like(grouped)
        start = 0
        for e, n in enumerate(counts):
            if n:
                part = grouped[start : start + n]
                rows[start : start + n] = self.down[e](act_and_mul(self.gate_up[e](part), self.activation))
                start += n
        rows.mul_(weights.reshape(-1)[order].unsqueeze(1))
        return torch.zeros_like(x).index_add_(0, token, rows)

    def _every_expert(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The same sum with no host sync, for a captured decode graph (a few rows): every expert over
        every row, weighted by its routing weight (zero where not chosen)."""
        dense = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype, device=x.device)
        dense.scatter_(1, experts, weights)
        out = torch.zeros_like(x)
        for e in range(self.num_experts):
            out.addcmul_(self.down[e](act_and_mul(self.gate_up[e](x), self.activation)), dense[:, e : e + 1])
        return out
