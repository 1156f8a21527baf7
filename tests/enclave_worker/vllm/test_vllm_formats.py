"""A non-Llama family and a quantized format through the vLLM backend, from encrypted packages
(docs/vllm-backend.md, "Families and formats").

Qwen3 (q/k norms, explicit head_dim) made with `transformers` from a small config (tests/.../models/tiny.py),
packaged twice by the tenant-side path (`load_source` + `encrypt_checkpoint`): as its float32 safetensors, and
quantized to GPTQ int4 (round-to-nearest with group 32, packed to AutoGPTQ's layout). vLLM serves each
package through the sealed loader in vLLM's virtualenv (vllm_package_checks.py); the reference is HF
transformers' greedy decoding of the same weights (for GPTQ: the format's dequantization w = (q - z) * s).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from api.tenant_tools import encrypt_checkpoint, load_source
from tests.enclave_worker.engine.hf_quant_writers import pack_u32
from tests.enclave_worker.engine.models import tiny

pytestmark = pytest.mark.vllm
CHECKS = Path(__file__).with_name("vllm_package_checks.py")
REPO = Path(__file__).resolve().parents[3]
GROUP = 32
MAX_TOKENS = 16  # as vllm_package_checks.py generates
PROMPTS = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 9, 14, 22)]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def gptq_rtn(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A float weight [N, K] quantized to GPTQ int4 (asymmetric, group GROUP, zeros in 1..15 as the
    v1 layout stores z - 1), and the format's dequantization of it."""
    n, k = w.shape
    g = w.detach().double().numpy().reshape(n, k // GROUP, GROUP)
    lo, hi = g.min(-1), g.max(-1)
    s = np.maximum((hi - lo) / 15, 1e-6).astype(np.float16)
    s32 = s.astype(np.float64)
    z = np.clip(np.round(-lo / s32), 1, 15).astype(np.int64)
    q = np.clip(np.round(g / s32[..., None]) + z[..., None], 0, 15).astype(np.int64)  # [N, K/G, G]
    ref = ((q - z[..., None]) * s32[..., None]).reshape(n, k)
    q_kn = q.reshape(n, k).T  # [K, N]
    tensors = {"qweight": pack_u32(q_kn.reshape(k // 8, 8, n).transpose(0, 2, 1)),
               "qzeros": pack_u32((z.T - 1).reshape(k // GROUP, n // 8, 8)),
               "scales": torch.from_numpy(np.ascontiguousarray(s.T)),
               "g_idx": torch.from_numpy((np.arange(k) // GROUP).astype(np.int32))}
    return tensors, torch.from_numpy(ref.astype(np.float32))


def write_gptq(src: Path, out: Path, hf_model: torch.nn.Module) -> None:
    """`src`'s checkpoint with every decoder linear in GPTQ; `hf_model`'s linears set to the dequantized values."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    params = dict(hf_model.named_parameters())
    for name in [n for n in tensors if n.endswith(".weight") and n.split(".")[-2] in LINEARS]:
        parts, ref = gptq_rtn(tensors.pop(name))
        tensors.update({name.removesuffix("weight") + k: v for k, v in parts.items()})
        with torch.no_grad():
            params[name].copy_(ref)
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
                                     "sym": False}
    (out / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out / f).write_text((src / f).read_text())


def hf_greedy(model: torch.nn.Module) -> list[list[int]]:
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([p])
            gen = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None,
                                 pad_token_id=0, min_new_tokens=MAX_TOKENS)
            out.append(gen[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def served(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("vllm-formats")
    hf = tiny.build("qwen3", root / "qwen3")
    expected = {"fp32": hf_greedy(hf)}
    write_gptq(root / "qwen3", root / "qwen3-gptq", hf)
    expected["gptq"] = hf_greedy(hf)
    args = []
    for name in ("fp32", "gptq"):
        src = root / ("qwen3" if name == "fp32" else "qwen3-gptq")
        enc = encrypt_checkpoint(load_source(src), root / f"pkg-{name}", tenant="t", model=name, version="1",
                                 signing_key=Ed25519PrivateKey.generate())
        args += [str(root / f"pkg-{name}"), enc.data_key.hex()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([vllm_python, str(CHECKS), str(root / "out.json"), json.dumps(PROMPTS), *args], env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((root / "out.json").read_text())
    return {"expected": expected, "fp32": results[0], "gptq": results[1]}


@pytest.mark.parametrize("package", ["fp32", "gptq"])
def test_qwen3_package_served_by_vllm_gives_transformers_greedy_tokens(served: dict, package: str) -> None:
    got = served[package]
    assert got["architecture"] == "Qwen3ForCausalLM"
    assert got["greedy"] == served["expected"][package]
    assert all(len(t) == MAX_TOKENS for t in got["greedy"])
    assert got["buffer_nonzero_after_load"] == 0


def test_the_gptq_package_reaches_vllm_dense(served: dict) -> None:
    """vLLM built no GPTQ layer: the loader handed it the dequantized weights (weights.py)."""
    assert served["gptq"]["quant_methods"] == served["fp32"]["quant_methods"]
    assert not any("GPTQ" in m or "WNA16" in m for m in served["gptq"]["quant_methods"])
    assert served["gptq"]["greedy"] != served["fp32"]["greedy"]  # the quantized weights are what was served
