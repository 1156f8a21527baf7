# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton JIT kernels: Triton compiles them from source and reads their annotations itself, so their
# parameters stay unannotated; the typed wrappers below are what the worker calls.)
"""Fused element-wise kernels for decode steps, where kernel launches, not bytes, dominate:

- `add_rms_norm`: residual += x, then RMSNorm of the sum, in one pass (two reads, two writes);
- `silu_and_mul`: SiLU(gate) * up over the fused gate/up projection;
- `rope_and_cache`: rotary embedding of q and k (HF rotate-half) and the K/V write into the
  paged cache by slot, in one launch per layer.
Each has a torch reference with the same signature and the same float32 math.
"""

from __future__ import annotations

import functools

import torch

from . import triton_enabled


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    summed = (x.float() + residual.float()).to(x.dtype)
    sf = summed.float()
    normed = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return normed, summed


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


def rope_and_cache_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       slots: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k/v [T, Hkv, D]; cos/sin [T, D/2] (float32); returns rotated q, k; writes the cache."""
    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)

    q_rot, k_rot = rotate(q), rotate(k)
    k_cache.index_copy_(0, slots.long(), k_rot)
    v_cache.index_copy_(0, slots.long(), v)
    return q_rot, k_rot


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache  # one JIT function per kernel, so Triton's in-memory compile cache is kept
def _kernels():  # returns the Triton JIT functions (untyped)
    import triton
    import triton.language as tl

    @triton.jit
    def add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, eps, N: tl.constexpr, N_PAD: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, N_PAD)
        ok = cols < N
        x = tl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        summed = (x + r).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * N + cols, summed, mask=ok)  # the residual stream, updated in place
        sf = summed.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / N + eps)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        # Round to the activation dtype before the weight multiply, exactly as HF's RMSNorm does.
        normed = ((sf * inv).to(out_ptr.dtype.element_ty).to(tl.float32) * w).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * N + cols, normed, mask=ok)

    @triton.jit
    def silu_and_mul_kernel(x_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
        row, chunk = tl.program_id(0), tl.program_id(1)
        cols = chunk * BLOCK + tl.arange(0, BLOCK)
        ok = cols < N
        gate = tl.load(x_ptr + row * 2 * N + cols, mask=ok, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * N + N + cols, mask=ok, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def rope_cache_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slots_ptr, kc_ptr, vc_ptr,
                          stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cslot,
                          stride_chead, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                          HALF_PAD: tl.constexpr, HEADS_PAD: tl.constexpr):
        t = tl.program_id(0)
        i = tl.arange(0, HALF_PAD)
        i_ok = i < HALF
        c = tl.load(cos_ptr + t * HALF + i, mask=i_ok, other=0.0)
        s = tl.load(sin_ptr + t * HALF + i, mask=i_ok, other=0.0)
        h = tl.arange(0, HEADS_PAD)
        q_mask = (h < HEADS)[:, None] & i_ok[None, :]
        q_off = t * stride_qt + h[:, None] * stride_qh + i[None, :]
        q1 = tl.load(q_ptr + q_off, mask=q_mask, other=0.0).to(tl.float32)
        q2 = tl.load(q_ptr + q_off + HALF, mask=q_mask, other=0.0).to(tl.float32)
        tl.store(q_ptr + q_off, (q1 * c - q2 * s).to(q_ptr.dtype.element_ty), mask=q_mask)
        tl.store(q_ptr + q_off + HALF, (q2 * c + q1 * s).to(q_ptr.dtype.element_ty), mask=q_mask)
        kv_mask = (h < KV_HEADS)[:, None] & i_ok[None, :]
        k_off = t * stride_kt + h[:, None] * stride_kh + i[None, :]
        k1 = tl.load(k_ptr + k_off, mask=kv_mask, other=0.0).to(tl.float32)
        k2 = tl.load(k_ptr + k_off + HALF, mask=kv_mask, other=0.0).to(tl.float32)
        k1r = (k1 * c - k2 * s).to(k_ptr.dtype.element_ty)
        k2r = (k2 * c + k1 * s).to(k_ptr.dtype.element_ty)
        tl.store(k_ptr + k_off, k1r, mask=kv_mask)
        tl.store(k_ptr + k_off + HALF, k2r, mask=kv_mask)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        c_off = slot * stride_cslot + h[:, None] * stride_chead + i[None, :]
        tl.store(kc_ptr + c_off, k1r.to(kc_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(kc_ptr + c_off + HALF, k2r.to(kc_ptr.dtype.element_ty), mask=kv_mask)
        v_off = t * stride_vt + h[:, None] * stride_vh + i[None, :]
        v1 = tl.load(v_ptr + v_off, mask=kv_mask, other=0.0)
        v2 = tl.load(v_ptr + v_off + HALF, mask=kv_mask, other=0.0)
        tl.store(vc_ptr + c_off, v1.to(vc_ptr.dtype.element_ty), mask=kv_mask)
        tl.store(vc_ptr + c_off + HALF, v2.to(vc_ptr.dtype.element_ty), mask=kv_mask)

    return add_rms_norm_kernel, silu_and_mul_kernel, rope_cache_kernel


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual); the residual tensor is updated in place."""
    if not triton_enabled(x):
        normed, summed = add_rms_norm_ref(x, residual, weight, eps)
        residual.copy_(summed)
        return normed, residual
    kernel = _kernels()[0]
    rows, n = x.shape
    out = torch.empty_like(x)
    kernel[(rows,)](x.contiguous(), residual, weight, out, eps, N=n, N_PAD=_pow2(n))
    return out, residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if not triton_enabled(x):
        return silu_and_mul_ref(x)
    kernel = _kernels()[1]
    rows, n = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    block = min(1024, _pow2(n))
    kernel[(rows, -(-n // block))](x.contiguous(), out, N=n, BLOCK=block)
    return out


def rope_and_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   slots: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k in place (views of the fused QKV output are fine) and write k, v to the cache."""
    if not triton_enabled(q):
        return rope_and_cache_ref(q, k, v, cos, sin, slots, k_cache, v_cache)
    kernel = _kernels()[2]
    tokens, heads, dim = q.shape
    kv_heads = k.shape[1]
    kernel[(tokens,)](q, k, v, cos.contiguous(), sin.contiguous(), slots, k_cache, v_cache,
                      q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                      k_cache.stride(0), k_cache.stride(1), HEADS=heads, KV_HEADS=kv_heads, HALF=dim // 2,
                      HALF_PAD=_pow2(dim // 2), HEADS_PAD=_pow2(max(heads, kv_heads)))
    return q, k
