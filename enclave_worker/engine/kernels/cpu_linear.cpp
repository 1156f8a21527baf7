// y = x W^T for fp32 weights held in column panels (kernels/cpu_ops.py, "panel_linear", says why).
// Compiled with cpu_ops.cpp into one module (setup.py); its bytes are part of the build record (cpu_build.py).
//
// Layout: W [N, K] is held as panels [N / NR, K, NR]: panel p is W^T's columns p*NR .. p*NR + NR - 1,
// row by row, so one panel is a single contiguous run of K * NR floats and a whole layer is read
// front to back once per call, whatever the number of rows (a decode step's batch).
// Micro-kernel: up to MR rows of x against one panel, one vector of NR outputs per row held in a
// register across all of K (MR accumulators + the weight vector + a broadcast fit the register file);
// above MR rows, `micro2` takes two panels at once (MR2 rows), so each broadcast of x feeds two FMAs.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

#if defined(__AVX512F__)
constexpr int NR = 16, MR = 16, MR2 = 12;  // 16 (one panel) or 24 (two) of 32 zmm registers accumulate
using vreg = __m512;
inline vreg vzero() { return _mm512_setzero_ps(); }
inline vreg vbcast(float x) { return _mm512_set1_ps(x); }
inline vreg vfmav(vreg w, vreg x, vreg acc) { return _mm512_fmadd_ps(w, x, acc); }
inline vreg vload(const float* p) { return _mm512_loadu_ps(p); }
inline vreg vfma(vreg w, float x, vreg acc) { return _mm512_fmadd_ps(w, _mm512_set1_ps(x), acc); }
inline void vstore(float* p, vreg v) { _mm512_storeu_ps(p, v); }
// NR int8 codes -> floats, d * q + m rounded twice (the empty asm keeps the compiler from fusing the two
// into one FMA, which rounds once and would not rebuild the checkpoint's float exactly).
inline vreg vdecode(const int8_t* q, vreg d, vreg m) {
  vreg p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))), d);
  asm("" : "+v"(p));
  return _mm512_add_ps(p, m);
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int NR = 8, MR = 12, MR2 = 6;  // 12 of 16 ymm registers accumulate
using vreg = __m256;
inline vreg vzero() { return _mm256_setzero_ps(); }
inline vreg vbcast(float x) { return _mm256_set1_ps(x); }
inline vreg vfmav(vreg w, vreg x, vreg acc) { return _mm256_fmadd_ps(w, x, acc); }
inline vreg vload(const float* p) { return _mm256_loadu_ps(p); }
inline vreg vfma(vreg w, float x, vreg acc) { return _mm256_fmadd_ps(w, _mm256_set1_ps(x), acc); }
inline void vstore(float* p, vreg v) { _mm256_storeu_ps(p, v); }
inline vreg vdecode(const int8_t* q, vreg d, vreg m) {  // as the AVX-512 one
  vreg p = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)))), d);
  asm("" : "+x"(p));
  return _mm256_add_ps(p, m);
}
#else
constexpr int NR = 8, MR = 4, MR2 = 2;  // portable: the compiler vectorizes what it can
struct vreg { float v[NR]; };
inline vreg vzero() { return vreg{}; }
inline vreg vbcast(float x) { vreg r; for (int i = 0; i < NR; ++i) r.v[i] = x; return r; }
inline vreg vfmav(vreg w, vreg x, vreg acc) { for (int i = 0; i < NR; ++i) acc.v[i] += w.v[i] * x.v[i]; return acc; }
inline vreg vload(const float* p) { vreg r; for (int i = 0; i < NR; ++i) r.v[i] = p[i]; return r; }
inline vreg vfma(vreg w, float x, vreg acc) { for (int i = 0; i < NR; ++i) acc.v[i] += w.v[i] * x; return acc; }
inline void vstore(float* p, vreg v) { for (int i = 0; i < NR; ++i) p[i] = v.v[i]; }
inline vreg vdecode(const int8_t* q, vreg d, vreg m) {
  vreg r;
  for (int i = 0; i < NR; ++i) {
    volatile float p = static_cast<float>(q[i]) * d.v[i];  // no fused multiply-add (see the AVX-512 one)
    r.v[i] = p + m.v[i];
  }
  return r;
}
#endif

// Prefetch this many floats ahead in the panel (1 KB): the hardware prefetcher alone left one
// core's stream at ~6 GB/s of the ~15 GB/s a plain sum reads (2-vCPU Xeon, 2026-12-03).
constexpr int64_t PREFETCH = 256;

template <int R>
void micro(const float* x, int64_t ldx, const float* panel, int64_t k_len, float* y, int64_t ldy) {
  vreg acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vzero();
  for (int64_t k = 0; k < k_len; ++k) {
    __builtin_prefetch(panel + k * NR + PREFETCH, 0, 3);
    const vreg w = vload(panel + k * NR);
    for (int r = 0; r < R; ++r) acc[r] = vfma(w, x[r * ldx + k], acc[r]);
  }
  for (int r = 0; r < R; ++r) vstore(y + r * ldy, acc[r]);
}

// Two adjacent panels at once (more than MR rows, a prefill): each broadcast of x feeds two FMAs, half
// the loads per FMA of `micro`, which at 64+ rows ran below torch's GEMM (sealed bench linear).
template <int R>
void micro2(const float* x, int64_t ldx, const float* panel, int64_t k_len, float* y, int64_t ldy) {
  const float* next = panel + k_len * NR;
  vreg a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = vzero();
  for (int64_t k = 0; k < k_len; ++k) {
    __builtin_prefetch(panel + k * NR + PREFETCH, 0, 3);
    __builtin_prefetch(next + k * NR + PREFETCH, 0, 3);
    const vreg w0 = vload(panel + k * NR), w1 = vload(next + k * NR);
    for (int r = 0; r < R; ++r) {
      const vreg xv = vbcast(x[r * ldx + k]);
      a0[r] = vfmav(w0, xv, a0[r]);
      a1[r] = vfmav(w1, xv, a1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    vstore(y + r * ldy, a0[r]);
    vstore(y + r * ldy + NR, a1[r]);
  }
}

using Micro = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);

template <int... Rs>
constexpr std::array<Micro, sizeof...(Rs)> micros(std::integer_sequence<int, Rs...>) {
  return {&micro<Rs + 1>...};
}

template <int... Rs>
constexpr std::array<Micro, sizeof...(Rs)> micros2(std::integer_sequence<int, Rs...>) {
  return {&micro2<Rs + 1>...};
}

constexpr auto MICRO = micros(std::make_integer_sequence<int, MR>{});  // MICRO[r - 1]: r rows
constexpr auto MICRO2 = micros2(std::make_integer_sequence<int, MR2>{});  // MICRO2[r - 1]: r rows, 2 panels

}  // namespace

int64_t panel_width() { return NR; }

// x [M, K] fp32 contiguous, panels [N / NR, K, NR] fp32 contiguous -> y [M, N].
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor panels) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat, "x [M, K] float32, contiguous");
  TORCH_CHECK(panels.dim() == 3 && panels.is_contiguous() && panels.scalar_type() == torch::kFloat &&
              panels.size(2) == NR, "panels [N / NR, K, NR] float32, contiguous, NR = panel_width()");
  TORCH_CHECK(panels.size(1) == x.size(1), "x and the panels disagree on K");
  const int64_t rows = x.size(0), k_len = x.size(1), n_panels = panels.size(0), n = n_panels * NR;
  auto y = torch::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return y;
  const float* xp = x.data_ptr<float>();
  const float* pp = panels.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Rows in blocks whose x stays in L2 (~512 KB) while every panel passes over it: a decode step's
  // batch is one block (each weight read once); a prefill re-reads the weights once per block.
  const int64_t block = std::max<int64_t>(MR, (131072 / std::max<int64_t>(k_len, 1)) / MR * MR);
  for (int64_t m0 = 0; m0 < rows; m0 += block) {
    const int64_t m1 = std::min(rows, m0 + block);
    if (m1 - m0 <= MR) {  // a decode step: one pass of the one-panel kernel over every panel
      // One parallel region per block, panels split in contiguous runs: one sequential stream a thread.
      at::parallel_for(0, n_panels, 1, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          MICRO[m1 - m0 - 1](xp + m0 * k_len, k_len, pp + p * k_len * NR, k_len, yp + m0 * n + p * NR, n);
        }
      });
      continue;
    }
    at::parallel_for(0, (n_panels + 1) / 2, 1, [&](int64_t begin, int64_t end) {  // pairs of panels
      for (int64_t q = begin; q < end; ++q) {
        const int64_t p = 2 * q;
        const bool pair = p + 1 < n_panels;
        for (int64_t m = m0; m < m1;) {
          const int64_t r = std::min<int64_t>(pair ? MR2 : MR, m1 - m);
          const Micro kernel = pair ? MICRO2[r - 1] : MICRO[r - 1];
          kernel(xp + m * k_len, k_len, pp + p * k_len * NR, k_len, yp + m * n + p * NR, n);
          m += r;
        }
      }
    });
  }
  return y;
}

// panels [N / NR, K, NR] -> out [K, N], W^T in the plain layout, for a prefill's GEMM (layers/panel.py).
// torch's copy of the permuted view moves 32-byte runs through its generic strided loop (docs/engine.md
// has the figures). Rows in blocks of 16: each panel's rows of a block are one contiguous read, each
// row of out is written front to back.
void panel_unpack(torch::Tensor panels, torch::Tensor out) {
  TORCH_CHECK(panels.dim() == 3 && panels.is_contiguous() && panels.scalar_type() == torch::kFloat &&
              panels.size(2) == NR, "panels [N / NR, K, NR] float32, contiguous, NR = panel_width()");
  const int64_t n_panels = panels.size(0), k_len = panels.size(1), n = n_panels * NR;
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == torch::kFloat && out.size(0) == k_len &&
              out.size(1) == n, "out [K, N] float32, contiguous, for panels of K rows and N outputs");
  const float* pp = panels.data_ptr<float>();
  float* op = out.data_ptr<float>();
  constexpr int64_t kRows = 16;
  at::parallel_for(0, (k_len + kRows - 1) / kRows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t k0 = b * kRows, k1 = std::min(k_len, k0 + kRows);
      for (int64_t p = 0; p < n_panels; ++p) {
        const float* src = pp + (p * k_len + k0) * NR;
        for (int64_t k = k0; k < k1; ++k, src += NR) std::memcpy(op + k * n + p * NR, src, NR * sizeof(float));
      }
    }
  });
}

// ---------------------------------------------------------------- exact block codes (layers/coded_panel.py)
// A layer whose every QB-weight block along K is w = d * q + m, with q an int8 and d, m one float each
// per block and output (a GGUF Q4_1 or Q8_0 checkpoint dequantized to fp32 is), is held as codes
// [N / NR, K, NR] int8 plus scales and offsets [N / NR, K / QB, NR] fp32: 1.25 bytes a weight instead
// of 4. The kernel rebuilds each weight vector (vdecode) to the very float the checkpoint held before
// the same FMAs as panel_linear's, so the result is the fp32 panels' to the bit.
namespace {

constexpr int64_t QB = 32;
constexpr int64_t CODE_PREFETCH = 512;  // bytes ahead in the codes: the same 1 KB of weights ahead as PREFETCH

template <int R>
void micro_coded(const float* x, int64_t ldx, const int8_t* codes, const float* scales, const float* offsets,
                 int64_t k_len, float* y, int64_t ldy) {
  vreg acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vzero();
  for (int64_t b = 0; b < k_len / QB; ++b) {
    const vreg d = vload(scales + b * NR), m = vload(offsets + b * NR);
    for (int64_t k = b * QB; k < (b + 1) * QB; ++k) {
      __builtin_prefetch(codes + k * NR + CODE_PREFETCH, 0, 3);
      const vreg w = vdecode(codes + k * NR, d, m);
      for (int r = 0; r < R; ++r) acc[r] = vfma(w, x[r * ldx + k], acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) vstore(y + r * ldy, acc[r]);
}

using MicroCoded = void (*)(const float*, int64_t, const int8_t*, const float*, const float*, int64_t, float*, int64_t);

template <int... Rs>
constexpr std::array<MicroCoded, sizeof...(Rs)> micros_coded(std::integer_sequence<int, Rs...>) {
  return {&micro_coded<Rs + 1>...};
}

constexpr auto MICRO_CODED = micros_coded(std::make_integer_sequence<int, MR>{});  // [r - 1]: r rows

void check_codes(const torch::Tensor& codes, const torch::Tensor& scales, const torch::Tensor& offsets) {
  TORCH_CHECK(codes.dim() == 3 && codes.is_contiguous() && codes.scalar_type() == torch::kChar && codes.size(2) == NR &&
              codes.size(1) % QB == 0, "codes [N / NR, K, NR] int8, contiguous, K a multiple of code_block()");
  for (const auto* t : {&scales, &offsets}) {
    TORCH_CHECK(t->dim() == 3 && t->is_contiguous() && t->scalar_type() == torch::kFloat && t->size(0) == codes.size(0) &&
                t->size(1) == codes.size(1) / QB && t->size(2) == NR, "scales, offsets [N / NR, K / QB, NR] float32");
  }
}

// The float d * q + m rounds to, each product rounded first (as GGUF's dequantization computes it).
inline float decode_one(float d, int q, float m) {
  volatile float p = d * static_cast<float>(q);  // not fused into an FMA (vdecode says why)
  return p + m;
}

// One block of QB weights on the grid (m, d) with codes in [lo, hi]: the codes, or false.
bool fit_block(const float* w, float d, float m, int lo, int hi, int8_t* q_out, int64_t q_stride) {
  for (int64_t i = 0; i < QB; ++i) {
    const float v = w[i];
    int q = 0;
    if (d != 0.0f) q = static_cast<int>(std::nearbyint((v - m) / d));
    q = std::min(hi, std::max(lo, q));
    if (!(decode_one(d, q, m) == v)) return false;  // also false for NaN
    q_out[i * q_stride] = static_cast<int8_t>(q);
  }
  return true;
}

inline float to_half(float x) { return static_cast<float>(c10::Half(x)); }

}  // namespace

int64_t code_block() { return QB; }

// x [M, K] fp32 contiguous over a coded layer -> y [M, N]; any M (the engine unpacks for 128+ rows instead).
torch::Tensor coded_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat, "x [M, K] float32, contiguous");
  check_codes(codes, scales, offsets);
  TORCH_CHECK(codes.size(1) == x.size(1), "x and the codes disagree on K");
  const int64_t rows = x.size(0), k_len = x.size(1), n_panels = codes.size(0), n = n_panels * NR, kb = k_len / QB;
  auto y = torch::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return y;
  const float* xp = x.data_ptr<float>();
  const int8_t* cp = codes.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* op = offsets.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (rows <= MR) {
    // A decode step: panels split in contiguous runs, one parallel region, each weight rebuilt in a
    // register once and used for every row.
    at::parallel_for(0, n_panels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        MICRO_CODED[rows - 1](xp, k_len, cp + p * k_len * NR, sp + p * kb * NR, op + p * kb * NR, k_len, yp + p * NR, n);
      }
    });
    return y;
  }
  // More rows: each pair of panels is rebuilt once into a buffer (2 K NR floats, in L2) and multiplied
  // by every row with panel_linear's kernels, so the rebuild is paid once a call, not once per MR rows,
  // and each output's sum runs in the same order as over fp32 panels (the same result to the bit).
  at::parallel_for(0, (n_panels + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    // One buffer per thread, kept between calls: a fresh one this size (up to ~200 KB) is an mmap and
    // its page faults on every call.
    thread_local std::vector<float> buffer;
    if (buffer.size() < static_cast<size_t>(2 * k_len * NR)) {
      explicit_bzero(buffer.data(), buffer.size() * sizeof(float));
      buffer.assign(2 * k_len * NR, 0.0f);
    }
    float* panel = buffer.data();
    for (int64_t q = begin; q < end; ++q) {
      const int64_t p = 2 * q;
      const bool pair = p + 1 < n_panels;
      for (int64_t i = 0; i < (pair ? 2 : 1); ++i) {
        const int8_t* c = cp + (p + i) * k_len * NR;
        for (int64_t b = 0; b < kb; ++b) {
          const vreg d = vload(sp + ((p + i) * kb + b) * NR), m = vload(op + ((p + i) * kb + b) * NR);
          for (int64_t k = b * QB; k < (b + 1) * QB; ++k) vstore(panel + (i * k_len + k) * NR, vdecode(c + k * NR, d, m));
        }
      }
      for (int64_t m = 0; m < rows;) {
        const int64_t r = std::min<int64_t>(pair ? MR2 : MR, rows - m);
        (pair ? MICRO2[r - 1] : MICRO[r - 1])(xp + m * k_len, k_len, panel, k_len, yp + m * n + p * NR, n);
        m += r;
      }
    }
    explicit_bzero(panel, 2 * k_len * NR * sizeof(float));  // rebuilt plaintext weights: not left behind
  });
  return y;
}

// codes -> out [K, N], W^T in the plain layout with every weight rebuilt exactly (a prefill's GEMM).
void coded_unpack(torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets, torch::Tensor out) {
  check_codes(codes, scales, offsets);
  const int64_t n_panels = codes.size(0), k_len = codes.size(1), n = n_panels * NR, kb = k_len / QB;
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == torch::kFloat && out.size(0) == k_len &&
              out.size(1) == n, "out [K, N] float32, contiguous, for codes of K rows and N outputs");
  const int8_t* cp = codes.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* opp = offsets.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, kb, 1, [&](int64_t begin, int64_t end) {  // one block of QB rows of out at a time
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t p = 0; p < n_panels; ++p) {
        const vreg d = vload(sp + (p * kb + b) * NR), m = vload(opp + (p * kb + b) * NR);
        for (int64_t k = b * QB; k < (b + 1) * QB; ++k) vstore(o + k * n + p * NR, vdecode(cp + (p * k_len + k) * NR, d, m));
      }
    }
  });
}

// w [N, K] fp32 -> codes, scales, offsets (shapes as coded_linear's), where every block of QB weights
// along K is exactly on one of two grids: codes 0..15 with m the block's minimum (GGUF Q4_1), or codes
// -128..127 with m = 0 (Q8_0); d a half-precision number in both, as GGUF stores it. False, with the
// outputs partly written, where any block is on neither (or N, K do not fit): the caller keeps fp32.
bool grid_encode(torch::Tensor w, torch::Tensor codes, torch::Tensor scales, torch::Tensor offsets) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == torch::kFloat, "w [N, K] float32, contiguous");
  check_codes(codes, scales, offsets);
  TORCH_CHECK(codes.size(0) * NR == w.size(0) && codes.size(1) == w.size(1), "codes do not match w's shape");
  const int64_t n = w.size(0), k_len = w.size(1), kb = k_len / QB;
  const float* wp = w.data_ptr<float>();
  int8_t* cp = codes.data_ptr<int8_t>();
  float* sp = scales.data_ptr<float>();
  float* op = offsets.data_ptr<float>();
  std::atomic<bool> ok{true};
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end && ok.load(std::memory_order_relaxed); ++row) {
      const int64_t p = row / NR, lane = row % NR;
      for (int64_t b = 0; b < kb; ++b) {
        const float* v = wp + row * k_len + b * QB;
        float lo = v[0], hi = v[0];
        for (int64_t i = 1; i < QB; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
        int8_t* q = cp + (p * k_len + b * QB) * NR + lane;
        float d = to_half((hi - lo) / 15.0f), m = lo;
        if (!fit_block(v, d, m, 0, 15, q, NR)) {
          d = to_half(std::max(std::fabs(lo), std::fabs(hi)) / 127.0f), m = 0.0f;
          if (!fit_block(v, d, m, -128, 127, q, NR)) {
            ok.store(false, std::memory_order_relaxed);
            return;
          }
        }
        sp[(p * kb + b) * NR + lane] = d;
        op[(p * kb + b) * NR + lane] = m;
      }
    }
  });
  return ok.load();
}
