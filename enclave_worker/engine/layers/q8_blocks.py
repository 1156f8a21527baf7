"""int8 weights in blocks of 32 along K, one fp32 scale per block and output row (GGUF Q8_0's own
layout), multiplied on the CPU by one C++ kernel (kernels/cpu_q8.cpp) against activations quantized per
row and block of 32 (llama.cpp's Q8_0 x Q8_0): every CPU int8 layer (kernel path "q8-blocks").

Each 32-weight block's dot with the activations' block is an exact integer; the only roundings are
the activations' quantization and the fp32 sum over blocks, ``acc += (sw * sa) * float(dot)``, which
runs in block order for every row: a row's result does not depend on the other rows of a call or on
the thread count. docs/engine.md ("Quantization") has the design and its loss against weight-only int8.

Held as codes [N / 16, Kp / 4, 16, 4] int8 and scales [N / 16, Kp / 32, 16] fp32 (Kp: K rounded up to
32; N rounded up to 16 with zero rows, which the kernel does not write out): 1.125 bytes a weight. The
codes and scales are the layer's plaintext: plain tensors that ``LLMEngine.wipe`` zeroes; a source
handed over is zeroed once they are written, and so is every padded transient.
"""

from __future__ import annotations

import torch

from ..kernels.cpu_ops import load_cpu_ops

BLOCK = 32  # weights per block along K (Q8_0's); kernels/cpu_q8.cpp's QK
LANES = 16  # output rows per panel; kernels/cpu_q8.cpp's NR
_CHUNK_ROWS = 256  # rows quantized at a time: the float transient stays a few MB (a multiple of LANES)


def _up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [N, K] -> symmetric int8 codes [N, K] and fp32 scales [N, ceil(K / 32)]: per block
    d = amax / 127, q = round(w / d) (Q8_0's rule, the scale kept in fp32), a few rows at a time."""
    n, k = w.shape
    kp = _up(k, BLOCK)
    codes = torch.empty(n, k, dtype=torch.int8)
    scales = torch.empty(n, kp // BLOCK, dtype=torch.float32)
    for i in range(0, n, _CHUNK_ROWS):
        part = torch.nn.functional.pad(w[i : i + _CHUNK_ROWS].float(), (0, kp - k)).view(-1, kp // BLOCK, BLOCK)
        d = part.abs().amax(-1) / 127.0
        q = torch.round(part / torch.where(d == 0, 1.0, d)[..., None]).clamp_(-127, 127)
        codes[i : i + part.shape[0]] = q.view(-1, kp)[:, :k].to(torch.int8)
        scales[i : i + part.shape[0]] = d
        part.zero_(), q.zero_()  # float copies of the weight
    return codes, scales


def channel_scales_to_blocks(scales: torch.Tensor, k: int) -> torch.Tensor:
    """A scale per output channel [N] as the same scale for each of its blocks [N, ceil(K / 32)]."""
    return scales.float()[:, None].expand(-1, _up(k, BLOCK) // BLOCK).contiguous()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float32 as the kernel quantizes it: (codes [M, Kp] int8, scales [M, Kp / 32] fp32)."""
    q, s = load_cpu_ops().q8_quantize(x.contiguous(), _up(x.shape[1], BLOCK))
    return q, s


class Q8BlockMatmul:
    """y = x W^T, W given as int8 ``codes`` [N, K] and block ``scales`` [N, ceil(K / 32)]; ``consume``:
    the caller hands both over, zeroed once packed."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, consume: bool) -> None:
        n, k = codes.shape
        kp, np_ = _up(k, BLOCK), _up(n, LANES)
        if codes.dtype != torch.int8 or scales.dtype != torch.float32 or tuple(scales.shape) != (n, kp // BLOCK):
            raise ValueError(f"q8 blocks: codes int8 [N, K] and scales float32 [N, ceil(K / 32)], not "
                             f"{codes.dtype} {tuple(codes.shape)} and {scales.dtype} {tuple(scales.shape)}")
        self._ops = load_cpu_ops()
        self.out_features, self.in_features = n, k
        # Zero codes past K and zero rows past N add nothing, and no output is written for them; a
        # non-contiguous source is copied the same way (a copy this code zeroes, not reshape's own).
        padded = (kp, np_) != (k, n) or not codes.is_contiguous() or not scales.is_contiguous()
        src_c, src_s = codes, scales
        if padded:
            src_c = torch.zeros(np_, kp, dtype=torch.int8)
            src_c[:n, :k] = codes
            src_s = torch.zeros(np_, kp // BLOCK, dtype=torch.float32)
            src_s[:n] = scales
        self.codes = torch.empty(np_ // LANES, kp // 4, LANES, 4, dtype=torch.int8)
        self.codes.permute(0, 2, 1, 3).copy_(src_c.reshape(np_ // LANES, LANES, kp // 4, 4))
        self.scales = torch.empty(np_ // LANES, kp // BLOCK, LANES, dtype=torch.float32)
        self.scales.permute(0, 2, 1).copy_(src_s.reshape(np_ // LANES, LANES, kp // BLOCK))
        with torch.inference_mode():
            if padded:
                src_c.zero_(), src_s.zero_()
            if consume:
                codes.zero_(), scales.zero_()

    @classmethod
    def from_float(cls, w: torch.Tensor) -> Q8BlockMatmul:
        """A float weight [N, K] quantized by ``quantize_blocks``' rule straight into the packed layout, a
        chunk of rows (a whole number of 16-row panels) at a time: the same codes and scales as
        ``Q8BlockMatmul(*quantize_blocks(w), consume=True)`` without its [N, K] int8 copy beside them (at
        8B the 128k x 4096 table's 0.53 GB, on top of its source and the packed layout)."""
        n, k = w.shape
        kp, np_ = _up(k, BLOCK), _up(n, LANES)
        self = cls.__new__(cls)
        self._ops = load_cpu_ops()
        self.out_features, self.in_features = n, k
        self.codes = torch.empty(np_ // LANES, kp // 4, LANES, 4, dtype=torch.int8)
        self.scales = torch.empty(np_ // LANES, kp // BLOCK, LANES, dtype=torch.float32)
        for i in range(0, n, _CHUNK_ROWS):  # _CHUNK_ROWS is a multiple of LANES: chunks are whole panels
            codes, scales = quantize_blocks(w[i : i + _CHUNK_ROWS])
            rows = _up(codes.shape[0], LANES)
            src_c = torch.zeros(rows, kp, dtype=torch.int8)
            src_c[: codes.shape[0], :k] = codes
            src_s = torch.zeros(rows, kp // BLOCK, dtype=torch.float32)
            src_s[: codes.shape[0]] = scales
            p = slice(i // LANES, i // LANES + rows // LANES)
            self.codes[p].permute(0, 2, 1, 3).copy_(src_c.reshape(rows // LANES, LANES, kp // 4, 4))
            self.scales[p].permute(0, 2, 1).copy_(src_s.reshape(rows // LANES, LANES, kp // BLOCK))
            with torch.inference_mode():
                codes.zero_(), scales.zero_(), src_c.zero_(), src_s.zero_()  # the chunk's plaintext copies
        return self

    def __call__(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [M, K] (any float dtype) -> [M, N] float32."""
        x = x2 if x2.dtype == torch.float32 and x2.is_contiguous() else x2.to(torch.float32).contiguous()
        y: torch.Tensor = self._ops.q8_linear(x, self.codes, self.scales, self.out_features)
        return y

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """W's rows ``ids`` [T] -> [T, K] float32, code times its block's scale (an embedding's lookup)."""
        p, lane = ids // LANES, ids % LANES
        q = self.codes[p, :, lane].reshape(ids.shape[0], -1)[:, : self.in_features].to(torch.float32)
        d = self.scales[p, :, lane].repeat_interleave(BLOCK, dim=1)[:, : self.in_features]
        return q.mul_(d)
