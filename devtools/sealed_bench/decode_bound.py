"""The bound on one decode step of a Llama-architecture model: bytes it must read, FLOPs it must do,
and the time those take at the machine's measured copy bandwidth and matmul FLOP rate.

A decode step computes one token for each of `batch` sequences. It reads every weight once (each
layer's q, k, v, o, gate, up, down projections and norms, the final norm and the LM head: with
tied embeddings the embedding table again; plus the batch's embedding rows), each sequence's K and
V for its context in every layer, and writes each sequence's new K and V. Its FLOPs are 2 per
weight per row (batch x weights, multiply and add), plus attention: q.k and p.v, 4 x heads x
head_dim per context token per layer per row. Activations (a few kB a row) stay in cache and are
not counted. The bound is the larger of bytes / copy bandwidth and FLOPs / FLOP rate (a roofline:
a step can at best overlap the two). SmolLM2-135M at batch 16 in fp32: 538 MB of weights and
4.3 GFLOP (issue 38).

Pure arithmetic: tests/sealed_bench/test_decode_bound.py checks it against SmolLM2-135M's config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Bytes per weight as the engine stores each dtype (int4: 4 bits plus a 16-bit scale per 32 weights).
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5625}
# Bytes per K/V element: the engine keeps its KV cache in the compute dtype (bf16 for bf16, else fp32).
KV_BYTES = {"fp32": 4, "bf16": 2, "int8": 4, "int4": 4}


@dataclass(frozen=True)
class ModelDims:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelDims:
        heads = int(cfg["num_attention_heads"])
        return cls(hidden=int(cfg["hidden_size"]), intermediate=int(cfg["intermediate_size"]),
                   layers=int(cfg["num_hidden_layers"]), heads=heads,
                   kv_heads=int(cfg.get("num_key_value_heads") or heads),
                   head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
                   vocab=int(cfg["vocab_size"]), tied=bool(cfg.get("tie_word_embeddings", False)))

    @property
    def linear_per_layer(self) -> int:
        """q, k, v, o, gate, up, down weights of one layer."""
        q = o = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        return q + o + kv + 3 * self.hidden * self.intermediate

    @property
    def norms(self) -> int:
        return (2 * self.layers + 1) * self.hidden

    @property
    def lm_head(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Stored parameters: the embedding, the layers, the norms, and an untied LM head."""
        return self.lm_head + self.layers * self.linear_per_layer + self.norms + (0 if self.tied else self.lm_head)

    @property
    def matmul_params(self) -> int:
        """Weights each token multiplies by: every layer's projections and the LM head."""
        return self.layers * self.linear_per_layer + self.lm_head

    def kv_elems_per_token(self) -> int:
        """K and V elements one token keeps, over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class StepCost:
    weight_bytes: float
    kv_bytes: float
    flops: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes


def decode_step_cost(dims: ModelDims, batch: int, context: float, dtype: str = "fp32") -> StepCost:
    """One decode step of `batch` sequences with `context` tokens each already in the cache
    (a mean context is fine: every term is linear in it)."""
    if batch < 1 or context < 0:
        raise ValueError(f"batch must be >= 1 and context >= 0, not {batch} and {context}")
    wbytes, kvbytes = WEIGHT_BYTES[dtype], KV_BYTES[dtype]
    weights = (dims.matmul_params + dims.norms + batch * dims.hidden) * wbytes  # + the batch's embedding rows
    kv = batch * (context + 1) * dims.kv_elems_per_token() * kvbytes  # read the context, write the new token
    attention = 4 * dims.heads * dims.head_dim * (context + 1) * dims.layers * batch
    return StepCost(weight_bytes=weights, kv_bytes=kv, flops=2.0 * batch * dims.matmul_params + attention)


@dataclass(frozen=True)
class Bound:
    memory_s: float  # the step's bytes at the copy bandwidth
    compute_s: float  # its FLOPs at the matmul rate

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def limited_by(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def step_bound(cost: StepCost, copy_gbs: float, gflops: float) -> Bound:
    """`copy_gbs`: bytes moved per second by a large copy (read + written), in GB/s; `gflops`: a
    large fp32 matmul's rate."""
    if copy_gbs <= 0 or gflops <= 0:
        raise ValueError(f"rates must be positive, not {copy_gbs} GB/s and {gflops} GFLOP/s")
    return Bound(memory_s=cost.bytes / (copy_gbs * 1e9), compute_s=cost.flops / (gflops * 1e9))


def bound_record(cost: StepCost, bound: Bound, measured_s: float | None) -> dict[str, Any]:
    """The JSON a result row carries: the step's cost, its bound, the measured step and their ratio."""
    return {
        "weight_bytes": round(cost.weight_bytes), "kv_bytes": round(cost.kv_bytes), "gflop": round(cost.flops / 1e9, 4),
        "memory_bound_ms": round(bound.memory_s * 1e3, 3), "compute_bound_ms": round(bound.compute_s * 1e3, 3),
        "bound_ms": round(bound.seconds * 1e3, 3), "limited_by": bound.limited_by,
        "measured_step_ms": None if measured_s is None else round(measured_s * 1e3, 3),
        "ratio_to_bound": None if measured_s is None else round(measured_s / bound.seconds, 3),
    }
