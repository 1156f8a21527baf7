"""Payload layout: parts the engine fuses sit together, so the worker fuses them without a copy."""

from __future__ import annotations

import torch

from enclave_worker.engine.models.llama import _Weights
from enclave_worker.package.writer import fusion_adjacent_order

P = "model.layers.0."


def test_fused_parts_are_laid_out_together_in_fusion_order() -> None:
    names = [P + "mlp.up_proj.weight", P + "self_attn.k_proj.weight", "model.norm.weight", P + "mlp.down_proj.weight",
             P + "self_attn.v_proj.bias", P + "self_attn.q_proj.weight", P + "self_attn.v_proj.weight",
             P + "mlp.gate_proj.weight", P + "self_attn.q_proj.bias", P + "self_attn.k_proj.bias"]
    order = [n for n, _ in fusion_adjacent_order([(n, torch.zeros(1)) for n in names])]
    assert sorted(order) == sorted(names)  # nothing lost or duplicated
    assert order == [P + "mlp.gate_proj.weight", P + "mlp.up_proj.weight",
                     P + "self_attn.q_proj.weight", P + "self_attn.k_proj.weight", P + "self_attn.v_proj.weight",
                     "model.norm.weight", P + "mlp.down_proj.weight",
                     P + "self_attn.q_proj.bias", P + "self_attn.k_proj.bias", P + "self_attn.v_proj.bias"]


def test_adjacent_parts_fuse_as_a_view_and_others_are_copied() -> None:
    buffer = torch.arange(24, dtype=torch.float32)
    q, k, v = buffer[0:8].view(2, 4), buffer[8:12].view(1, 4), buffer[12:20].view(2, 4)
    fused = _Weights({"q": q, "k": k, "v": v}).take_cat(["q", "k", "v"])
    assert fused.data_ptr() == buffer.data_ptr() and torch.equal(fused, buffer[:20].view(5, 4))
    gap = buffer[16:20].view(1, 4)  # not right after k: must be copied, values still right
    copied = _Weights({"q": q, "k": k, "g": gap}).take_cat(["q", "k", "g"])
    assert copied.data_ptr() != buffer.data_ptr()
    assert torch.equal(copied, torch.cat([q, k, gap]))
