/* bf16_simd.h — AVX-512 helpers shared by the bf16 GEMM (bgemm.c), the
 * bf16 convolution (bconv.c) and the double-accumulating norms and bias
 * gradients (norm.c, conv.c): rounding f32 to bf16 as tpurt__f32_to_bf16
 * does, interleaving two bf16 rows into k pairs, loading 16 f32 or bf16
 * values as doubles. */
#ifndef TPURT_BF16_SIMD_H
#define TPURT_BF16_SIMD_H
#include <immintrin.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
/* 16 f32 -> bf16 in the low halves of 32-bit lanes, rounded as
 * tpurt__f32_to_bf16 (nearest even; a NaN stays a quiet NaN). */
__attribute__((target("avx512f"))) static inline __m512i rne_bf16(__m512 v) {
  __m512i x = _mm512_castps_si512(v), hi = _mm512_srli_epi32(x, 16);
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(x, _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff))),
      16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* 16 columns of two bf16 rows interleaved into pairs (d[j] = r0[j] | r1[j] << 16). */
__attribute__((target("avx512f,avx512bw"))) static inline void interleave16(uint32_t *d, const uint16_t *r0,
                                                                            const uint16_t *r1) {
  const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                       37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r0));
  __m512i hi = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)r1));
  _mm512_storeu_si512(d, _mm512_permutex2var_epi16(lo, idx, hi));
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* d[0..15] (bf16) = bf16(v + beta * d) — beta == 0 does not read d —
 * rounded as tpurt__f32_to_bf16 (nearest even, NaN quiet). */
__attribute__((target("avx512f"))) static inline void store_bf16x16(uint16_t *d, __m512 v, float beta) {
  if (beta != 0.0f) {
    __m512 old = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)d)), 16));
    v = _mm512_fmadd_ps(_mm512_set1_ps(beta), old, v);
  }
  _mm256_storeu_si256((__m256i *)d, _mm512_cvtepi32_epi16(rne_bf16(v)));
}
#endif
#if defined(__x86_64__) || defined(__i386__)
/* 16 elements at x (f32, or bf16 when bf; the first m of them, m < 16: a
 * masked tail, the others 0) as two vectors of 8 doubles, lo and hi (the
 * caller's target needs avx512f, bw, dq and vl) */
#define LOAD16_PD(x, bf, m, lo, hi)                                                                   \
  do {                                                                                                \
    __mmask16 k_ = (__mmask16)((1u << (m)) - 1u);                                                     \
    if (bf) {                                                                                         \
      __m512 v_ = _mm512_castsi512_ps(                                                                \
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k_, (const uint16_t *)(x))), 16)); \
      lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v_));                                               \
      hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v_), 1)));        \
    } else { /* two halves straight into the conversions: no extract */                               \
      lo = _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)k_, (const float *)(x)));                  \
      hi = _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)(k_ >> 8), (const float *)(x) + 8));       \
    }                                                                                                 \
  } while (0)
#endif
#endif
