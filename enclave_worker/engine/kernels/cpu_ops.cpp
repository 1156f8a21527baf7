// The engine's CPU kernels (enclave_worker/engine/kernels/cpu_ops.py says what each does and why).
// Compiled when the project is installed (setup.py: a torch CppExtension), never inside a worker;
// the build embeds SEALED_BUILD_INFO (cpu_build.py: this file's SHA-256, the flags, torch's version)
// so that the worker refuses a module built from another source, for another torch or another CPU.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

inline void load_row(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void load_row(const at::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(s[i]) << 16;
    std::memcpy(dst + i, &u, sizeof(float));
  }
}

inline void store_row(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

// A K or V row as fp32: the cache row itself for fp32 (no copy), converted into ``buf`` for bf16.
inline const float* row_f32(const float* src, float*, int64_t) { return src; }
inline const float* row_f32(const at::BFloat16* src, float* buf, int64_t n) { load_row(src, buf, n); return buf; }

// q . k over DIM values in 16 independent partial sums: the loop vectorizes into 2-4 accumulators
// (AVX2 / AVX-512) instead of one serial chain (the scalar loop was ~60% of a batch-64 decode step).
template <int DIM>
inline float dot(const float* a, const float* b, int64_t dim_arg) {
  const int64_t dim = DIM > 0 ? DIM : dim_arg;
  if (dim % 16 != 0) {
    float s = 0.f;
    for (int64_t d = 0; d < dim; ++d) s += a[d] * b[d];
    return s;
  }
  float part[16] = {0.f};
  for (int64_t d = 0; d < dim; d += 16) {
    for (int j = 0; j < 16; ++j) part[j] += a[d + j] * b[d + j];
  }
  float s = 0.f;
  for (int j = 0; j < 16; ++j) s += part[j];
  return s;
}

// e^v for v in [-87, 88], written so a loop over a row that calls it vectorizes: v = n ln2 + r,
// |r| <= ln2/2, e^r by a degree-6 polynomial (relative error < 2e-7, as torch's own vectorized exp),
// 2^n built in the exponent bits.
inline float exp_in_range(float v) {
  const float k = std::nearbyint(v * 1.44269504088896341f);
  const float r = v - k * 0.693145751953125f - k * 1.428606765330187045e-06f;
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(float));
  return p * scale;
}

// exp(x) for x <= 0 (softmax after the max is subtracted), in place. Below -87 the result is 0.
inline void exp_nonpositive(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] < -87.f ? 0.f : exp_in_range(std::max(x[i], -87.f));
}

inline void store_row(const float* src, at::BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = at::BFloat16(src[i]);  // round to nearest even
}

// Rows are read a few tokens ahead of use: a sequence's rows lie in blocks scattered through the
// pool, so the hardware prefetcher loses the stream at every block boundary, and one core waiting on
// each miss in turn read K/V at ~11 GB/s (2026-12-04, Zen 5).
constexpr int64_t kPrefetchRows = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t n) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t i = 0; i < n * static_cast<int64_t>(sizeof(T)); i += 64) __builtin_prefetch(p + i, 0, 3);
}

// DIM > 0: the head size known at compile time (64, 128), so the row loops vectorize and unroll.
// One task per sequence, all its KV heads together: a slot's K (or V) row of every head is one
// contiguous run of kv_heads * dim values, read once, in block order.
template <typename T, int DIM>
void decode(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* lens, T* out,
            int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim_arg, int64_t max_blocks,
            int64_t block_size, int64_t num_blocks, float scale, std::atomic<int>& bad) {
  const int64_t dim = DIM > 0 ? DIM : dim_arg;
  const int64_t groups = heads / kv_heads, width = kv_heads * dim;
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(heads * dim), row(width), acc(heads * dim), scores;
    std::vector<int64_t> offsets;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t len = lens[b];
      if (len < 1 || len > max_blocks * block_size) { bad = 1; continue; }
      const int64_t* table = tables + b * max_blocks;
      offsets.resize(len);
      bool ok = true;
      for (int64_t t = 0; t < len; ++t) {
        const int64_t block = table[t / block_size];
        if (block < 0 || block >= num_blocks) { ok = false; break; }
        offsets[t] = (block * block_size + t % block_size) * width;
      }
      if (!ok) { bad = 1; continue; }
      load_row(q + b * heads * dim, qf.data(), heads * dim);
      scores.resize(heads * len);  // [heads][len]
      for (int64_t t = 0; t < std::min(len, kPrefetchRows); ++t) prefetch_row(kc + offsets[t], width);
      for (int64_t t = 0; t < len; ++t) {  // scores = q k^T, one pass over K
        if (t + kPrefetchRows < len) prefetch_row(kc + offsets[t + kPrefetchRows], width);
        const float* r = row_f32(kc + offsets[t], row.data(), width);
        for (int64_t hq = 0; hq < heads; ++hq) {
          scores[hq * len + t] = dot<DIM>(qf.data() + hq * dim, r + (hq / groups) * dim, dim) * scale;
        }
      }
      for (int64_t t = 0; t < std::min(len, kPrefetchRows); ++t) prefetch_row(vc + offsets[t], width);
      for (int64_t hq = 0; hq < heads; ++hq) {  // softmax per query head, max subtracted
        float* sh = scores.data() + hq * len;
        const float m = *std::max_element(sh, sh + len);
        for (int64_t t = 0; t < len; ++t) sh[t] -= m;
        exp_nonpositive(sh, len);
        float sum = 0.f;
        for (int64_t t = 0; t < len; ++t) sum += sh[t];
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < len; ++t) sh[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < len; ++t) {  // out = p V, one pass over V
        if (t + kPrefetchRows < len) prefetch_row(vc + offsets[t + kPrefetchRows], width);
        const float* r = row_f32(vc + offsets[t], row.data(), width);
        for (int64_t hq = 0; hq < heads; ++hq) {
          const float p = scores[hq * len + t];
          const float* vh = r + (hq / groups) * dim;
          float* ah = acc.data() + hq * dim;
          for (int64_t d = 0; d < dim; ++d) ah[d] += p * vh[d];
        }
      }
      store_row(acc.data(), out + b * heads * dim, heads * dim);
    }
  });
}

template <typename T>
void decode_any(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* lens, T* out,
                int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim, int64_t max_blocks,
                int64_t block_size, int64_t num_blocks, float scale, std::atomic<int>& bad) {
  if (dim == 64) {
    decode<T, 64>(q, kc, vc, tables, lens, out, batch, heads, kv_heads, dim, max_blocks, block_size, num_blocks,
                  scale, bad);
  } else if (dim == 128) {
    decode<T, 128>(q, kc, vc, tables, lens, out, batch, heads, kv_heads, dim, max_blocks, block_size, num_blocks,
                   scale, bad);
  } else {
    decode<T, 0>(q, kc, vc, tables, lens, out, batch, heads, kv_heads, dim, max_blocks, block_size, num_blocks,
                 scale, bad);
  }
}

}  // namespace

template <typename T>
inline T round_to(float v) { return static_cast<T>(v); }

// residual = residual + x (rounded to the dtype, in place; skipped when x is undefined), then
// out = weight * round(residual * rsqrt(mean(residual^2) + eps)), the product rounded: HF Llama's math.
template <typename T>
void add_rms_norm_rows(const T* x, T* residual, const T* weight, T* out, int64_t rows, int64_t width, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> r(width);
    for (int64_t i = begin; i < end; ++i) {
      T* res = residual + i * width;
      float ss = 0.f;
      for (int64_t j = 0; j < width; ++j) {
        float v = static_cast<float>(res[j]);
        if (x != nullptr) {
          v = static_cast<float>(round_to<T>(v + static_cast<float>(x[i * width + j])));
          res[j] = round_to<T>(v);
        }
        r[j] = v;
        ss += v * v;
      }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(width) + eps);
      for (int64_t j = 0; j < width; ++j) {
        const float normed = static_cast<float>(round_to<T>(r[j] * inv));
        out[i * width + j] = round_to<T>(static_cast<float>(weight[j]) * normed);
      }
    }
  });
}

torch::Tensor add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps, bool add) {
  TORCH_CHECK(residual.dim() == 2 && residual.is_contiguous() && weight.dim() == 1 && weight.is_contiguous(),
              "residual [T, W] and weight [W], contiguous");
  TORCH_CHECK(weight.size(0) == residual.size(1) && weight.scalar_type() == residual.scalar_type(), "weight shape");
  if (add) {
    TORCH_CHECK(x.sizes() == residual.sizes() && x.is_contiguous() && x.scalar_type() == residual.scalar_type(),
                "x like residual");
  }
  auto out = torch::empty_like(residual);
  const int64_t rows = residual.size(0), width = residual.size(1);
  if (residual.scalar_type() == torch::kFloat) {
    add_rms_norm_rows<float>(add ? x.data_ptr<float>() : nullptr, residual.data_ptr<float>(),
                             weight.data_ptr<float>(), out.data_ptr<float>(), rows, width, static_cast<float>(eps));
  } else if (residual.scalar_type() == torch::kBFloat16) {
    add_rms_norm_rows<at::BFloat16>(add ? x.data_ptr<at::BFloat16>() : nullptr, residual.data_ptr<at::BFloat16>(),
                                    weight.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), rows, width,
                                    static_cast<float>(eps));
  } else {
    TORCH_CHECK(false, "float32 or bfloat16 only");
  }
  return out;
}

// qkv [T, (H + 2 Hkv) * D]: q and k rotated in place (HF rotate-half, in fp32, rounded), then k and v
// written to the caches at their slots. cos / sin_signed [T, D] float32 (rotary.py's full-width rows).
template <typename T>
void rope_rows(T* qkv, const float* cos, const float* sin, const int64_t* slots, T* kc, T* vc, int64_t tokens,
               int64_t heads, int64_t kv_heads, int64_t dim) {  // slots checked by the caller
  const int64_t width = (heads + 2 * kv_heads) * dim, half = dim / 2;
  at::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> xf(dim);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slots[t];
      T* row = qkv + t * width;
      const float* c = cos + t * dim;
      const float* s = sin + t * dim;
      for (int64_t h = 0; h < heads + kv_heads; ++h) {
        T* x = row + h * dim;
        for (int64_t d = 0; d < dim; ++d) xf[d] = static_cast<float>(x[d]);
        for (int64_t d = 0; d < dim; ++d) {
          const int64_t other = d < half ? d + half : d - half;
          x[d] = round_to<T>(xf[d] * c[d] + xf[other] * s[d]);
        }
      }
      std::memcpy(kc + slot * kv_heads * dim, row + heads * dim, kv_heads * dim * sizeof(T));
      std::memcpy(vc + slot * kv_heads * dim, row + (heads + kv_heads) * dim, kv_heads * dim * sizeof(T));
    }
  });
}

void rope_and_cache(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor slot_mapping,
                    torch::Tensor k_cache, torch::Tensor v_cache, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "contiguous qkv [T, W] and caches");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() && k_cache.size(1) == kv_heads, "cache shapes");
  const int64_t tokens = qkv.size(0), dim = k_cache.size(2);
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * dim && dim % 2 == 0, "qkv width");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat && cos.is_contiguous() &&
              sin.is_contiguous() && cos.dim() == 2 && cos.size(0) == tokens && cos.size(1) == dim &&
              cos.sizes() == sin.sizes(), "cos / sin [T, D] float32");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == tokens && slot_mapping.scalar_type() == torch::kLong &&
              slot_mapping.is_contiguous(), "slot mapping [T] int64");
  TORCH_CHECK(qkv.scalar_type() == k_cache.scalar_type() && qkv.scalar_type() == v_cache.scalar_type(), "one dtype");
  const int64_t num_slots = k_cache.size(0);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {  // every slot checked before anything is rotated or written
    TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "a slot outside the KV pool");
  }
  if (qkv.scalar_type() == torch::kFloat) {
    rope_rows<float>(qkv.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                     slot_mapping.data_ptr<int64_t>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), tokens,
                     heads, kv_heads, dim);
  } else if (qkv.scalar_type() == torch::kBFloat16) {
    rope_rows<at::BFloat16>(qkv.data_ptr<at::BFloat16>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                            slot_mapping.data_ptr<int64_t>(), k_cache.data_ptr<at::BFloat16>(),
                            v_cache.data_ptr<at::BFloat16>(), tokens, heads, kv_heads, dim);
  } else {
    TORCH_CHECK(false, "float32 or bfloat16 only");
  }
}

// fp32 rows: exp(-g) for a whole row by exp_in_range (the argument clamped to [-87, 88]) instead of
// one libm call per value: libm's scalar exp was ~6% of a served batch-16 fp32 decode step (py-spy,
// Zen 5, 2026-12-04). Relative error < 2e-7, inside the fp32 test's tolerance; bf16 keeps libm, so
// its results stay bit-identical to torch's.
inline void silu_mul_row_f32(const float* g, const float* u, float* o, float* e, int64_t inner) {
  for (int64_t j = 0; j < inner; ++j) e[j] = exp_in_range(std::min(std::max(-g[j], -87.f), 88.f));
  for (int64_t j = 0; j < inner; ++j) o[j] = g[j] / (1.f + e[j]) * u[j];
}

// x [T, 2I] (gate | up) -> silu(gate) rounded, times up, rounded: F.silu(gate) * up's math.
template <typename T>
void silu_mul_rows(const T* x, T* out, int64_t rows, int64_t inner) {
  if constexpr (std::is_same_v<T, float>) {
    at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
      std::vector<float> e(inner);
      for (int64_t i = begin; i < end; ++i) {
        silu_mul_row_f32(x + i * 2 * inner, x + i * 2 * inner + inner, out + i * inner, e.data(), inner);
      }
    });
    return;
  }
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* g = x + i * 2 * inner;
      const T* u = g + inner;
      T* o = out + i * inner;
      for (int64_t j = 0; j < inner; ++j) {
        const float gv = static_cast<float>(g[j]);
        const float silu = static_cast<float>(round_to<T>(gv / (1.f + std::exp(-gv))));
        o[j] = round_to<T>(silu * static_cast<float>(u[j]));
      }
    }
  });
}

torch::Tensor silu_and_mul(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0, "x [T, 2I] contiguous");
  const int64_t rows = x.size(0), inner = x.size(1) / 2;
  auto out = torch::empty({rows, inner}, x.options());
  if (x.scalar_type() == torch::kFloat) {
    silu_mul_rows<float>(x.data_ptr<float>(), out.data_ptr<float>(), rows, inner);
  } else if (x.scalar_type() == torch::kBFloat16) {
    silu_mul_rows<at::BFloat16>(x.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), rows, inner);
  } else {
    TORCH_CHECK(false, "float32 or bfloat16 only");
  }
  return out;
}

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, int64_t block_size,
                                     double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3, "q [B, H, D], caches [slots, Hkv, D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous tensors");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(), "one dtype");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "K and V pools of one shape");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.scalar_type() == torch::kLong && block_tables.is_contiguous(),
              "block tables [B, max_blocks] int64");
  TORCH_CHECK(context_lens.dim() == 1 && context_lens.scalar_type() == torch::kLong && context_lens.is_contiguous(),
              "context lengths [B] int64");
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2), kv_heads = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == dim && kv_heads > 0 && heads % kv_heads == 0, "head shapes");
  TORCH_CHECK(block_tables.size(0) == batch && context_lens.size(0) == batch, "one table and length per sequence");
  TORCH_CHECK(block_size > 0 && k_cache.size(0) % block_size == 0, "pool of whole blocks");
  const int64_t num_blocks = k_cache.size(0) / block_size, max_blocks = block_tables.size(1);
  auto out = torch::empty_like(q);
  std::atomic<int> bad{0};
  if (q.scalar_type() == torch::kFloat) {
    decode_any<float>(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                  block_tables.data_ptr<int64_t>(), context_lens.data_ptr<int64_t>(), out.data_ptr<float>(), batch,
                  heads, kv_heads, dim, max_blocks, block_size, num_blocks, static_cast<float>(scale), bad);
  } else if (q.scalar_type() == torch::kBFloat16) {
    decode_any<at::BFloat16>(q.data_ptr<at::BFloat16>(), k_cache.data_ptr<at::BFloat16>(),
                         v_cache.data_ptr<at::BFloat16>(), block_tables.data_ptr<int64_t>(),
                         context_lens.data_ptr<int64_t>(), out.data_ptr<at::BFloat16>(), batch, heads, kv_heads, dim,
                         max_blocks, block_size, num_blocks, static_cast<float>(scale), bad);
  } else {
    TORCH_CHECK(false, "float32 or bfloat16 only");
  }
  TORCH_CHECK(bad.load() == 0, "a block index or context length outside the KV pool");
  return out;
}

// cpu_linear.cpp (the same module, its own translation unit).
int64_t panel_width();
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor panels);
void panel_unpack(torch::Tensor panels, torch::Tensor out);
int64_t code_block();
torch::Tensor coded_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets);
void coded_unpack(torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets, torch::Tensor out);
bool grid_encode(torch::Tensor w, torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets);

// cpu_q8.cpp (the same module, its own translation unit).
int64_t q8_panel_width();
int64_t q8_block();
std::tuple<torch::Tensor, torch::Tensor> q8_quantize(torch::Tensor x, int64_t kp);
torch::Tensor q8_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, int64_t n);

#define SEALED_STR2(x) #x
#define SEALED_STR(x) SEALED_STR2(x)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "paged_decode_attention");
  m.def("add_rms_norm", &add_rms_norm, "add_rms_norm");
  m.def("rope_and_cache", &rope_and_cache, "rope_and_cache");
  m.def("silu_and_mul", &silu_and_mul, "silu_and_mul");
  m.def("panel_linear", &panel_linear, "panel_linear");
  m.def("panel_width", &panel_width, "panel_width");
  m.def("panel_unpack", &panel_unpack, "panel_unpack");
  m.def("code_block", &code_block, "code_block");
  m.def("coded_linear", &coded_linear, "coded_linear");
  m.def("coded_unpack", &coded_unpack, "coded_unpack");
  m.def("grid_encode", &grid_encode, "grid_encode");
  m.def("q8_panel_width", &q8_panel_width, "q8_panel_width");
  m.def("q8_block", &q8_block, "q8_block");
  m.def("q8_quantize", &q8_quantize, "q8_quantize");
  m.def("q8_linear", &q8_linear, "q8_linear");
  // Hex of the build's JSON record (hex: no quoting through the compiler's command line).
  m.def("build_info", []() { return std::string(SEALED_STR(SEALED_BUILD_INFO)); }, "build_info");
}
