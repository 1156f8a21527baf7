// y = x W^T for int8 weights in blocks of 32 along K, one fp32 scale per block and output row (GGUF
// Q8_0's own layout), times activations quantized per row and block of 32 to int8 with an fp32 scale
// (llama.cpp's Q8_0 x Q8_0): an exact integer dot per block, then acc += (sw * sa) * float(dot), in
// block order, per row (layers/q8_blocks.py says how the layers use it; docs/engine.md, "Quantization").
// Compiled with cpu_ops.cpp into one module (setup.py); its bytes are part of the build record (cpu_build.py).
//
// Layout: codes [N / NR, Kp / 4, NR, 4] int8 (Kp = K rounded up to QK): panel p holds outputs
// p*NR .. p*NR + NR - 1, and one 64-byte run is NR lanes x 4 consecutive k, what one VNNI instruction
// takes; scales [N / NR, Kp / QK, NR] fp32. A layer is read front to back once per call of up to a
// block of rows (a decode step's batch), each weight vector used for up to MR rows while in L1.
// The quantized activations are interleaved per chunk of MR rows, [Kp / 4][R][4] bytes and scales
// [Kp / QK][R]: the R rows' 4 bytes for one weight vector are adjacent (one cache line for 16 rows).
//
// Tiers, chosen by the -march the build targets: AVX-512 VNNI (vpdpbusd is u8 x s8, so activations are
// stored + 128 as unsigned and 128 * sum(w) per block and lane, summed on the fly by one more vpdpbusd
// per 16 rows, is subtracted; the 16 rows of a pass in two halves of 8 per block, so that 16 fp32
// accumulators and 8 int32 dots fit the 32 registers and the block's 512 bytes of weights come from L1
// the second time); AVX2 (vpmaddubsw on |w| as unsigned times the activation carrying w's sign, then
// vpmaddwd: |w| <= 128, |a| <= 127, so no pair sum saturates, also for a code of -128); scalar.
// Each output row's sum runs in the same order in every case: a row's result does not depend on the
// other rows of the call, on MR or on the thread count.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>

namespace {

constexpr int64_t QK = 32;  // weights (and activations) per block along K
constexpr int NR = 16;      // output rows per panel (lanes)
constexpr int64_t PREFETCH = 1024;  // bytes ahead in the panel's codes (the hardware prefetcher alone lags)

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr int MR = 16;  // 16 fp32 accumulators + 8 int32 dots (half the rows at a time) of 32 zmm registers
constexpr bool UNSIGNED_ACT = true;  // activations stored + 128 (vpdpbusd's unsigned operand)
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int MR = 4;  // per row: 2 int32 + 2 fp32 ymm accumulators, of 16 registers
constexpr bool UNSIGNED_ACT = false;
#else
constexpr int MR = 4;
constexpr bool UNSIGNED_ACT = false;
#endif

inline int32_t load4(const uint8_t* p) { int32_t v; std::memcpy(&v, p, 4); return v; }

// One row of x [K] -> codes and scales, row r of a chunk of R rows (the layout above: code k at
// ((k / 4) * R + r) * 4 + k % 4, the scale of block b at b * R + r; R = 1 is plain [Kp] and [Kp / QK]):
// per block d = amax / 127, q = round(x / d) as x * (1 / d) rounded to nearest even (the reference in
// layers/q8_blocks.py computes the same floats); the padding past K is zero. Stored + 128 as unsigned
// for the VNNI tier.
void quantize_row(const float* x, int64_t k_len, int64_t kp, int64_t chunk, int64_t r, uint8_t* q, float* s) {
  for (int64_t b = 0; b < kp / QK; ++b) {
    const int64_t k0 = b * QK, k1 = std::min(k_len, k0 + QK);
    float amax = 0.f;
    for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    for (int64_t k = k0; k < k0 + QK; ++k) {
      float v = k < k1 ? std::nearbyint(x[k] * id) : 0.f;
      v = std::min(127.f, std::max(-127.f, v));  // also a NaN to a code (its scale is NaN or inf anyway)
      const int8_t c = static_cast<int8_t>(v);
      q[((k >> 2) * chunk + r) * 4 + (k & 3)] = UNSIGNED_ACT ? static_cast<uint8_t>(c + 128) : static_cast<uint8_t>(c);
    }
    s[b * chunk + r] = d;
  }
}

// R rows of quantized x against one panel: y[r][0..lanes) for every r.
// xq [Kp / 4][R][4] bytes, xs [Kp / QK][R] (one chunk, interleaved), codes [Kp/4][NR][4], ws [Kp/QK][NR].
template <int R>
void micro(const uint8_t* xq, const float* xs, const int8_t* codes, const float* ws, int64_t kb, float* y,
           int64_t ldy, int lanes) {
  constexpr int G = static_cast<int>(QK / 4);  // weight vectors per block
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  constexpr int H = 8;  // rows whose int32 dots are live at once
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t b = 0; b < kb; ++b) {
    const int8_t* c = codes + b * QK * NR;
    const uint8_t* a = xq + b * QK * R;
    for (int g = 0; g < G; ++g) __builtin_prefetch(c + g * 4 * NR + PREFETCH, 0, 3);
    // An independent chain beside the rows' dots, needed only at the end of each half.
    __m512i wsum = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) wsum = _mm512_dpbusd_epi32(wsum, ones, _mm512_loadu_si512(c + g * 4 * NR));
    const __m512i corr = _mm512_slli_epi32(wsum, 7);  // sum((a + 128) w) - 128 sum(w) = sum(a w)
    const __m512 sw = _mm512_loadu_ps(ws + b * NR);
#pragma GCC unroll 2
    for (int h = 0; h < R; h += H) {
      __m512i dot[H];
#pragma GCC unroll 8
      for (int j = 0; j < H; ++j) dot[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < G; ++g) {
        const __m512i w = _mm512_loadu_si512(c + g * 4 * NR);  // from L1 for the second half
#pragma GCC unroll 8
        for (int j = 0; j < H; ++j) {
          if (h + j < R) dot[j] = _mm512_dpbusd_epi32(dot[j], _mm512_set1_epi32(load4(a + (g * R + h + j) * 4)), w);
        }
      }
#pragma GCC unroll 8
      for (int j = 0; j < H; ++j) {
        if (h + j < R) {
          const __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(xs[b * R + h + j]));
          acc[h + j] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[j], corr)), acc[h + j]);
        }
      }
    }
  }
  const __mmask16 mask = lanes == NR ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << lanes) - 1);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < kb; ++b) {
    const int8_t* c = codes + b * QK * NR;
    const uint8_t* xb = xq + b * QK * R;
    for (int g = 0; g < G; ++g) __builtin_prefetch(c + g * 4 * NR + PREFETCH, 0, 3);
    for (int h = 0; h < 2; ++h) {  // lanes 8h .. 8h + 7: 32 bytes of each 64-byte group
      __m256i dot[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
      for (int g = 0; g < G; ++g) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + g * 4 * NR + h * 32));
        const __m256i aw = _mm256_abs_epi8(w);  // |w| as unsigned: 128 for a code of -128
        for (int r = 0; r < R; ++r) {
          const __m256i a = _mm256_sign_epi8(_mm256_set1_epi32(load4(xb + (g * R + r) * 4)), w);
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, a), ones16));
        }
      }
      const __m256 sw = _mm256_loadu_ps(ws + b * NR + h * 8);
      for (int r = 0; r < R; ++r) {
        const __m256 s = _mm256_mul_ps(sw, _mm256_set1_ps(xs[b * R + r]));
        acc[r][h] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot[r]), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[NR];
    _mm256_store_ps(out, acc[r][0]);
    _mm256_store_ps(out + 8, acc[r][1]);
    std::memcpy(y + r * ldy, out, lanes * sizeof(float));
  }
#else
  float acc[R][NR] = {};
  for (int64_t b = 0; b < kb; ++b) {
    const int8_t* c = codes + b * QK * NR;
    for (int r = 0; r < R; ++r) {
      const int8_t* a = reinterpret_cast<const int8_t*>(xq + b * QK * R);
      int32_t dot[NR] = {};
      for (int g = 0; g < G; ++g) {
        for (int l = 0; l < NR; ++l) {
          for (int j = 0; j < 4; ++j) dot[l] += static_cast<int32_t>(a[(g * R + r) * 4 + j]) * c[(g * NR + l) * 4 + j];
        }
      }
      const float sa = xs[b * R + r];
      for (int l = 0; l < NR; ++l) acc[r][l] += (ws[b * NR + l] * sa) * static_cast<float>(dot[l]);
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(y + r * ldy, acc[r], lanes * sizeof(float));
#endif
}

using Micro = void (*)(const uint8_t*, const float*, const int8_t*, const float*, int64_t, float*, int64_t, int);

template <int... Rs>
constexpr std::array<Micro, sizeof...(Rs)> micros(std::integer_sequence<int, Rs...>) {
  return {&micro<Rs + 1>...};
}

constexpr auto MICRO = micros(std::make_integer_sequence<int, MR>{});  // MICRO[r - 1]: r rows

void check_weight(const torch::Tensor& codes, const torch::Tensor& scales) {
  TORCH_CHECK(codes.dim() == 4 && codes.is_contiguous() && codes.scalar_type() == torch::kChar && codes.size(2) == NR &&
              codes.size(3) == 4 && (codes.size(1) * 4) % QK == 0,
              "codes [N / 16, Kp / 4, 16, 4] int8, contiguous, Kp a multiple of 32");
  TORCH_CHECK(scales.dim() == 3 && scales.is_contiguous() && scales.scalar_type() == torch::kFloat &&
              scales.size(0) == codes.size(0) && scales.size(1) == codes.size(1) * 4 / QK && scales.size(2) == NR,
              "scales [N / 16, Kp / 32, 16] float32, contiguous, matching the codes");
}

// x [M, K] -> (codes [M, Kp] int8, scales [M, Kp / QK] fp32), rows in parallel (each row alone), in
// chunks of `chunk` rows interleaved as the micro-kernels read them (chunk 1: row by row).
std::pair<torch::Tensor, torch::Tensor> quantize(const torch::Tensor& x, int64_t kp, int64_t chunk) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat, "x [M, K] float32, contiguous");
  TORCH_CHECK(kp >= x.size(1) && kp % QK == 0 && kp - x.size(1) < QK, "Kp is K rounded up to a multiple of 32");
  const int64_t rows = x.size(0), k_len = x.size(1);
  auto q = torch::empty({rows, kp}, x.options().dtype(torch::kByte));
  auto s = torch::empty({rows, kp / QK}, x.options());
  const float* xp = x.data_ptr<float>();
  uint8_t* qp = q.data_ptr<uint8_t>();
  float* sp = s.data_ptr<float>();
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const int64_t m0 = m / chunk * chunk, r = std::min(chunk, rows - m0);  // the chunk's first row and size
      quantize_row(xp + m * k_len, k_len, kp, r, m - m0, qp + m0 * kp, sp + m0 * (kp / QK));
    }
  });
  return {q, s};
}

}  // namespace

int64_t q8_panel_width() { return NR; }

int64_t q8_block() { return QK; }

// x [M, K] fp32 -> (codes [M, Kp] int8, scales [M, Kp / 32] fp32): the activations as q8_linear
// quantizes them (for tests and references; the kernel does this itself).
std::tuple<torch::Tensor, torch::Tensor> q8_quantize(torch::Tensor x, int64_t kp) {
  auto [q, s] = quantize(x, kp, 1);
  if (UNSIGNED_ACT) q.sub_(128);  // uint8 arithmetic wraps: back to the signed codes' bytes
  return {q.view(torch::kChar), s};
}

// x [M, K] fp32 contiguous, codes and scales as above, n <= N / 16 * 16 outputs -> y [M, n] fp32.
torch::Tensor q8_linear(torch::Tensor x, torch::Tensor codes, torch::Tensor scales, int64_t n) {
  check_weight(codes, scales);
  const int64_t kp = codes.size(1) * 4, kb = kp / QK, n_panels = codes.size(0);
  TORCH_CHECK(x.dim() == 2 && x.size(1) <= kp && kp - x.size(1) < QK, "x [M, K] with K rounded up to 32 the codes' Kp");
  TORCH_CHECK(n > (n_panels - 1) * NR && n <= n_panels * NR, "n outputs must fill the last panel partly or whole");
  const int64_t rows = x.size(0);
  auto y = torch::empty({rows, n}, x.options());
  if (rows == 0 || n == 0) return y;
  auto [xq, xs] = quantize(x, kp, MR);
  const uint8_t* qp = xq.data_ptr<uint8_t>();
  const float* sp = xs.data_ptr<float>();
  const int8_t* cp = codes.data_ptr<int8_t>();
  const float* wp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Rows in blocks whose quantized x stays in L2 (~256 KB) while every panel passes over it: a decode
  // step's batch is one block (each weight read once); a prefill re-reads the weights once per block.
  const int64_t block = std::max<int64_t>(MR, (262144 / kp) / MR * MR);
  for (int64_t m0 = 0; m0 < rows; m0 += block) {
    const int64_t m1 = std::min(rows, m0 + block);
    // Panels split in contiguous runs, one per thread: one sequential stream each; each panel's
    // outputs are computed whole by one thread.
    at::parallel_for(0, n_panels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const int lanes = static_cast<int>(std::min<int64_t>(NR, n - p * NR));
        for (int64_t m = m0; m < m1;) {  // m0 a multiple of MR: these are the chunks quantize interleaved
          const int64_t r = std::min<int64_t>(MR, m1 - m);
          MICRO[r - 1](qp + m * kp, sp + m * kb, cp + p * kp * NR, wp + p * kb * NR, kb, yp + m * n + p * NR, n, lanes);
          m += r;
        }
      }
    });
  }
  return y;
}
