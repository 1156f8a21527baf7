"""A GGUF of a made checkpoint (for llama.cpp's `llama-server` beside us), quantized with the `gguf`
package's own quantizer, written tensor by tensor (gguf's writer with the header written first, then
each tensor's data as it is quantized: memory stays flat).

Quantized as llama.cpp's converter does with `--outtype q8_0` (and `llama-quantize` for Q4_0): every
2-D weight whose row length is a multiple of the block size in the chosen type, the token embedding
and output included; norms and biases stay F32. Q/K rows of Llama models are permuted into
llama.cpp's interleaved-rotary order (`convert_hf_to_gguf.py`'s `permute`), which the engine's GGUF
loader undoes. Q4_K is refused: gguf's quantizer implements only the round-to-nearest types (Q4_K
needs llama.cpp's `llama-quantize`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from enclave_worker.engine.checkpoint import TensorSpec, tensor_specs
from sealed_bench.make_model import MakeModelError, tensor_chunks
from sealed_bench.make_model_tokenizer import padded_fields

GGUF_TYPES = ("Q8_0", "Q4_0")
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, idx, rest = hf_name.split(".", 3)
    return f"blk.{idx}.{_LAYER[rest]}"


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF rotate-half rows -> llama.cpp interleaved rows (convert_hf_to_gguf.py's LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _arch_kv(writer: Any, config: dict[str, Any], arch: str, qtype: Any) -> None:
    import gguf

    writer.add_name("sealed make-model (random weights)")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type({"Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[qtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    fields = padded_fields(config["vocab_size"])
    writer.add_tokenizer_model(fields.scalars["ggml.model"])
    writer.add_tokenizer_pre(fields.scalars["ggml.pre"])
    writer.add_token_list(fields.tokens)
    writer.add_token_types(fields.token_types)
    writer.add_token_merges(fields.merges)
    writer.add_bos_token_id(fields.scalars["ggml.bos_token_id"])
    writer.add_eos_token_id(fields.scalars["ggml.eos_token_id"])
    writer.add_unk_token_id(fields.scalars["ggml.unknown_token_id"])
    writer.add_pad_token_id(fields.scalars["ggml.padding_token_id"])
    writer.add_add_bos_token(bool(fields.scalars["ggml.add_bos_token"]))
    writer.add_chat_template(fields.scalars["chat_template"])


class _Streamed:
    """One tensor's GGUF data, produced chunk by chunk as gguf's writer asks it to `tofile` (the
    writer needs only `nbytes` and `tofile`): Q8_0 and Q4_0 quantize each 32-value block on its own,
    so a row-major chunk of whole blocks quantizes to the bytes of the same rows."""

    def __init__(self, spec: TensorSpec, kind: Any, config: dict[str, Any], arch: str, seed: int) -> None:
        import gguf

        self.spec, self.kind, self.config, self.arch, self.seed = spec, kind, config, arch, seed
        self.block = gguf.GGML_QUANT_SIZES[kind]
        self.f32 = kind == gguf.GGMLQuantizationType.F32
        numel = int(np.prod(spec.shape))
        self.nbytes = numel * 4 if self.f32 else numel // self.block[0] * self.block[1]

    def _chunks(self) -> Iterator[np.ndarray[Any, Any]]:
        spec = self.spec
        if self.arch == "llama" and spec.name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = self.config["num_attention_heads" if "q_proj" in spec.name else "num_key_value_heads"]
            whole = torch.cat(list(tensor_chunks(spec, self.seed))).float().reshape(spec.shape)
            yield _permute(whole, heads).contiguous().reshape(-1).numpy()
            return
        for chunk in tensor_chunks(spec, self.seed):
            yield chunk.float().numpy()

    def tofile(self, fout: Any) -> None:
        from gguf.quants import quantize

        for values in self._chunks():
            if self.f32:
                values.tofile(fout)
            else:
                quantize(values.reshape(-1, self.block[0]), self.kind).tofile(fout)


def write_gguf(hf_dir: Path, out: Path, qtype: str, *, seed: int = 0) -> Path:
    """OUT (a .gguf file) of the checkpoint written by `write_checkpoint(hf_dir, ...)` with SEED: the
    same values, regenerated tensor by tensor instead of read back."""
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    if qtype not in GGUF_TYPES:
        raise MakeModelError(f"--gguf {qtype}: gguf's quantizer writes {', '.join(GGUF_TYPES)} only "
                             "(Q4_K needs llama.cpp's llama-quantize)")
    config = json.loads((hf_dir / "config.json").read_text())
    arch = {"llama": "llama", "qwen2": "qwen2"}[config["model_type"]]
    quant = getattr(gguf.GGMLQuantizationType, qtype)
    block = gguf.GGML_QUANT_SIZES[quant][0]
    specs = tensor_specs(config, torch.float32)
    writer = gguf.GGUFWriter(str(out), arch)
    _arch_kv(writer, config, arch, qtype)
    f32 = gguf.GGMLQuantizationType.F32
    kinds: list[Any] = []
    for spec in specs:
        kind = quant if len(spec.shape) == 2 and spec.shape[1] % block == 0 else f32
        kinds.append(kind)
        byte_shape = spec.shape if kind == f32 else quant_shape_to_byte_shape(spec.shape, kind)
        nbytes = int(np.prod(byte_shape)) * (4 if kind == f32 else 1)
        writer.add_tensor_info(gguf_name(spec.name), byte_shape, np.dtype(np.float32 if kind == f32 else np.uint8),
                               nbytes, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for spec, kind in zip(specs, kinds, strict=True):
        writer.write_tensor_data(_Streamed(spec, kind, config, arch, seed))  # type: ignore[arg-type]
    writer.close()
    return out
