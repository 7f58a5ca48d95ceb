/*
 * random.c — random number kernels over Philox-4x32-10.
 *
 * Mapping (documented in tpurt.h): key = seed, counter = (offset + b, 0)
 * for 128-bit block b. With 32-bit draws element i (row-major over the
 * output shape) takes word i % 4 of block i / 4; 64-bit draws take words
 * (2(i%2), 2(i%2)+1) of block i / 2; normals take 4 per block through
 * Box-Muller on word pairs (0,1) and (2,3). The host reserves the blocks
 * at launch, so results depend only on (seed, offset), never on threads.
 *
 * Sampling runs a batch of blocks at a time through loops the compiler
 * vectorizes, one per kind (uniform, normal, log-normal, bernoulli with a
 * scalar probability, 32-bit random_) and one per output dtype, instead of
 * a switch per element: 256K float32 elements of uniform_ went from ~1.2 ms
 * to ~0.12 ms, normal_ from ~2.6 to ~0.3 ms (2 threads, Zen 5; 0.4x CPU
 * torch before, 3-7x now; x86-64-v3 builds run the normals through AVX2
 * intrinsics, the loop being scalar there: 524K float32 normals 4.7 ->
 * 1.4 ms on Zen 3, CPU torch 3.1). The other kinds (exponential, geometric, Cauchy,
 * bernoulli with a tensor of probabilities, 64-bit random_) draw element by
 * element.
 */
#include "fused.h"
#include "kcommon.h"
#if defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>
#endif

/* Blocks are drawn in bulk, RNG_BATCH at a time into a stack buffer:
 * words[4 * j + w] = word w of block ctr + j, for min(left, RNG_BATCH) j. */
#define RNG_BATCH 256
static inline void draw_batch(uint64_t seed, uint64_t ctr, int64_t left, uint32_t words[4 * RNG_BATCH]) {
  tpurt__philox_blocks(seed, ctr, left < RNG_BATCH ? left : RNG_BATCH, words);
}

/* (0, 1] and [0, 1) from 32 / 64 bits */
static inline float u01f(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }
static inline double u01d(uint64_t x) { return (double)(x >> 11) * (1.0 / 9007199254740992.0); }

static int wide_draw(tpurt_rng_kind kind, tpurt_dtype dt, uint64_t range) {
  if (kind == TPURT_RNG_RANDOM) return range == 0 || range > (1ull << 32);
  if (kind == TPURT_RNG_NORMAL || kind == TPURT_RNG_LOG_NORMAL) return 0;
  return dt == TPURT_F64;
}

uint64_t tpurt_random_blocks(tpurt_rng_kind kind, tpurt_dtype dt, int64_t n, uint64_t range) {
  if (n <= 0) return 0;
  int per = wide_draw(kind, dt, range) ? 2 : 4;
  return ((uint64_t)n + (uint64_t)per - 1) / (uint64_t)per;
}

typedef struct {
  tpurt_view out, p; /* p: bernoulli tensor probabilities */
  int kind, tensor_p;
  double p0, p1;
  int64_t from;
  uint64_t range, seed, offset;
} rng_args;

typedef struct {
  rng_args *a;
  char *o;
  const char *pp;
  int wide;
} rng_ctx;

/* ---------------------------------------------- Box-Muller, vectorizable
 *
 * The normals' logarithm and sine / cosine are computed here, in plain
 * double arithmetic the compiler vectorizes (no libm call in the loop:
 * with glibc's scalar log, cos and sin per pair normal_ ran at 0.4x
 * PyTorch CPU's). Only IEEE operations (+ - * / sqrt, conversions) in a
 * fixed order and the build's -ffp-contract=off: every build variant and
 * vector width gives the same bits. Accuracy: a few ulps of double, far
 * below a float's ulp. */

/* c[0] + y (c[1] + y (... c[n - 1])) */
static inline double horner(double y, const double *c, int n) {
  double p = c[n - 1];
  for (int k = n - 2; k >= 0; k--) p = p * y + c[k];
  return p;
}

/* 1 / (2k + 1): atanh's series */
static const double ATANH_C[11] = {1.0,        1.0 / 3.0,  1.0 / 5.0,  1.0 / 7.0,  1.0 / 9.0, 1.0 / 11.0,
                                   1.0 / 13.0, 1.0 / 15.0, 1.0 / 17.0, 1.0 / 19.0, 1.0 / 21.0};
/* (-1)^k (2 pi)^(2k+1) / (2k+1)! and (-1)^k (2 pi)^2k / (2k)! */
static const double SIN2PI_C[9] = {6.283185307179586,   -41.34170224039976, 81.60524927607506,
                                   -76.70585975306139,  42.058693944897655, -15.09464257682299,
                                   3.819952584848282,   -0.7181223017785006, 0.10422916220813984};
static const double COS2PI_C[10] = {1.0,                -19.739208802178716, 64.9393940226683,
                                    -85.45681720669373, 60.24464137187666,   -26.4262567833744,
                                    7.903536371318469,  -1.714390711088672,  0.28200596845579123,
                                    -0.03638284114254567};

/* log(m * 2^-24) for an integer m in [1, 2^24]: m = 2^e f with f in
 * [sqrt(2)/2, sqrt(2)), log f = 2 atanh(s), s = (f - 1) / (f + 1) (|s| <=
 * 0.1716), its series to s^21; (e - 24) ln 2 in two parts. */
static inline double log_u24(uint32_t m) {
  double d = (double)m;
  uint64_t bits;
  memcpy(&bits, &d, 8);
  int64_t e = (int64_t)(bits >> 52) - 1023;
  bits = (bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;
  double f;
  memcpy(&f, &bits, 8);
  int64_t up = f > 1.4142135623730951;
  f = up ? f * 0.5 : f;
  e += up;
  double s = (f - 1.0) / (f + 1.0);
  double k = (double)(e - 24);
  return k * 6.9314670562744140625e-01 + (k * 4.7493250390316726e-07 + 2.0 * s * horner(s * s, ATANH_C, 11));
}

/* cos and sin of 2 pi k 2^-24 for an integer k in [0, 2^24): the nearest
 * quarter turn q (k's top bits) is taken out exactly, leaving 2 pi x with
 * |x| <= 1/8 for the Taylor series (to x^17 and x^18). */
static inline void sincos_u24(uint32_t k, double *c, double *s) {
  int32_t q = (int32_t)((k + (1u << 21)) >> 22); /* 0..4 */
  double x = (double)((int32_t)k - (q << 22)) * (1.0 / 16777216.0), y = x * x;
  double sn = horner(y, SIN2PI_C, 9) * x, cs = horner(y, COS2PI_C, 10);
  /* turn by q quarters: (c, s) -> (-s, c) per quarter */
  int32_t odd = q & 1, neg_c = (q == 1) | (q == 2), neg_s = (q == 2) | (q == 3);
  double c0 = odd ? sn : cs, s0 = odd ? cs : sn;
  *c = neg_c ? -c0 : c0;
  *s = neg_s ? -s0 : s0;
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* Four pairs at a time in AVX2 registers (x86-64-v3 builds): gcc leaves
 * the loop below scalar there — its selects and 64-bit integer to double
 * conversions need AVX-512 — and normal_ ran at half PyTorch CPU's speed.
 * The same operations in the same order as log_u24, sincos_u24 and
 * values_normal (integers made exact doubles by the 2^52 trick; selects
 * as blends; -x as a sign flip): the same bits. */
static inline __m256d horner4(__m256d y, const double *c, int n) {
  __m256d p = _mm256_set1_pd(c[n - 1]);
  for (int k = n - 2; k >= 0; k--) p = _mm256_add_pd(_mm256_mul_pd(p, y), _mm256_set1_pd(c[k]));
  return p;
}
static inline __m256d log_u24_4(__m128i m) {
  const __m256d two52 = _mm256_set1_pd(4503599627370496.0);
  __m256i bits = _mm256_castpd_si256(_mm256_cvtepi32_pd(m));
  /* the biased exponent as an exact double: (bits >> 52) | 2^52's bits, less 2^52 */
  __m256d e = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(bits, 52), _mm256_castpd_si256(two52))),
                            two52);
  e = _mm256_sub_pd(e, _mm256_set1_pd(1023.0));
  __m256d f = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000FFFFFFFFFFFFFll)),
                                                  _mm256_set1_epi64x(0x3FF0000000000000ll)));
  __m256d up = _mm256_cmp_pd(f, _mm256_set1_pd(1.4142135623730951), _CMP_GT_OQ);
  f = _mm256_blendv_pd(f, _mm256_mul_pd(f, _mm256_set1_pd(0.5)), up);
  e = _mm256_add_pd(e, _mm256_and_pd(up, _mm256_set1_pd(1.0)));
  __m256d one = _mm256_set1_pd(1.0);
  __m256d sv = _mm256_div_pd(_mm256_sub_pd(f, one), _mm256_add_pd(f, one));
  __m256d k = _mm256_sub_pd(e, _mm256_set1_pd(24.0));
  __m256d t = _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), sv), horner4(_mm256_mul_pd(sv, sv), ATANH_C, 11));
  return _mm256_add_pd(_mm256_mul_pd(k, _mm256_set1_pd(6.9314670562744140625e-01)),
                       _mm256_add_pd(_mm256_mul_pd(k, _mm256_set1_pd(4.7493250390316726e-07)), t));
}
static inline void sincos_u24_4(__m128i kv, __m256d *c, __m256d *s) {
  __m128i q = _mm_srli_epi32(_mm_add_epi32(kv, _mm_set1_epi32(1 << 21)), 22); /* 0..4 */
  __m256d x = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(kv, _mm_slli_epi32(q, 22))),
                            _mm256_set1_pd(1.0 / 16777216.0));
  __m256d y = _mm256_mul_pd(x, x);
  __m256d sn = _mm256_mul_pd(horner4(y, SIN2PI_C, 9), x), cs = horner4(y, COS2PI_C, 10);
  __m256i q64 = _mm256_cvtepi32_epi64(q);
  __m256d odd = _mm256_castsi256_pd(_mm256_cmpeq_epi64(_mm256_and_si256(q64, _mm256_set1_epi64x(1)), _mm256_set1_epi64x(1)));
  __m256d q1 = _mm256_castsi256_pd(_mm256_cmpeq_epi64(q64, _mm256_set1_epi64x(1)));
  __m256d q2 = _mm256_castsi256_pd(_mm256_cmpeq_epi64(q64, _mm256_set1_epi64x(2)));
  __m256d q3 = _mm256_castsi256_pd(_mm256_cmpeq_epi64(q64, _mm256_set1_epi64x(3)));
  __m256d sign = _mm256_set1_pd(-0.0);
  __m256d c0 = _mm256_blendv_pd(cs, sn, odd), s0 = _mm256_blendv_pd(sn, cs, odd);
  *c = _mm256_xor_pd(c0, _mm256_and_pd(_mm256_or_pd(q1, q2), sign));
  *s = _mm256_xor_pd(s0, _mm256_and_pd(_mm256_or_pd(q2, q3), sign));
}
#endif

/* ------------------------------------------------------- the sampling */

/* values of blocks [0, nb) of a batch (words w) into v: one per 32-bit
 * word (narrow), per word pair (wide), or Box-Muller pairs (normal) */
static void values_normal(const uint32_t *w, int64_t nb, double mean, double std, double *v) {
  int64_t j = 0;
#if defined(__AVX2__) && !defined(__AVX512F__)
  __m256d vm = _mm256_set1_pd(mean), vs = _mm256_set1_pd(std);
  for (; j + 4 <= 2 * nb; j += 4) {
    /* words 2j, 2j + 2, ... (a) and 2j + 1, ... (b) of four pairs, each >> 8 */
    __m256i ww = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(w + 2 * j)), 8);
    __m256i ab = _mm256_permutevar8x32_epi32(ww, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    __m128i a = _mm256_castsi256_si128(ab), b = _mm256_extracti128_si256(ab, 1);
    __m256d r = _mm256_sqrt_pd(_mm256_mul_pd(_mm256_set1_pd(-2.0), log_u24_4(_mm_sub_epi32(_mm_set1_epi32(1 << 24), a))));
    __m256d c, sn;
    sincos_u24_4(b, &c, &sn);
    __m256d vc = _mm256_add_pd(vm, _mm256_mul_pd(vs, _mm256_mul_pd(r, c)));
    __m256d vsn = _mm256_add_pd(vm, _mm256_mul_pd(vs, _mm256_mul_pd(r, sn)));
    __m256d lo = _mm256_unpacklo_pd(vc, vsn), hi = _mm256_unpackhi_pd(vc, vsn); /* (c0 s0 c2 s2), (c1 s1 c3 s3) */
    _mm256_storeu_pd(v + 2 * j, _mm256_permute2f128_pd(lo, hi, 0x20));
    _mm256_storeu_pd(v + 2 * j + 4, _mm256_permute2f128_pd(lo, hi, 0x31));
  }
#endif
  for (; j < 2 * nb; j++) {
    uint32_t a = w[2 * j] >> 8, b = w[2 * j + 1] >> 8;
    double r = sqrt(-2.0 * log_u24((1u << 24) - a)), c, s;
    sincos_u24(b, &c, &s);
    v[2 * j] = mean + std * (r * c);
    v[2 * j + 1] = mean + std * (r * s);
  }
}

/* The kinds sampled a batch at a time: uniform, normal, log-normal,
 * bernoulli with a scalar probability. Returns 0 for the others (drawn
 * element by element). */
static int batch_values(const rng_args *a, int wide, const uint32_t *w, int64_t nb, double *v) {
  double p0 = a->p0, span = a->p1 - a->p0;
  int64_t n = nb * (wide ? 2 : 4);
  switch (a->tensor_p ? -1 : a->kind) {
    case TPURT_RNG_NORMAL: values_normal(w, nb, a->p0, a->p1, v); return 1;
    case TPURT_RNG_LOG_NORMAL:
      values_normal(w, nb, a->p0, a->p1, v);
      for (int64_t j = 0; j < n; j++) v[j] = exp(v[j]);
      return 1;
    case TPURT_RNG_UNIFORM:
      if (wide)
        for (int64_t j = 0; j < n; j++) v[j] = p0 + u01d(((uint64_t)w[2 * j] << 32) | w[2 * j + 1]) * span;
      else
        for (int64_t j = 0; j < n; j++) v[j] = p0 + (double)u01f(w[j]) * span;
      return 1;
    case TPURT_RNG_BERNOULLI:
      if (wide)
        for (int64_t j = 0; j < n; j++) v[j] = u01d(((uint64_t)w[2 * j] << 32) | w[2 * j + 1]) < p0 ? 1.0 : 0.0;
      else
        for (int64_t j = 0; j < n; j++) v[j] = (double)u01f(w[j]) < p0 ? 1.0 : 0.0;
      return 1;
    default: return 0;
  }
}

/* Stores values v[0, cnt) as elements i0.. of the output. A float uniform
 * stays below `to` after rounding. */
static void store_values(const rng_args *a, char *o, int dense, int64_t i0, const double *v, int64_t cnt) {
  tpurt_dtype dt = a->out.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int clamp = a->kind == TPURT_RNG_UNIFORM && !a->tensor_p && a->p1 > a->p0;
  float hi = (float)a->p1, below = nextafterf(hi, -INFINITY);
  if (dense && dt == TPURT_F32) {
    float *d = (float *)o + i0;
    if (clamp)
      for (int64_t j = 0; j < cnt; j++) {
        float f = (float)v[j];
        d[j] = f >= hi ? below : f;
      }
    else
      for (int64_t j = 0; j < cnt; j++) d[j] = (float)v[j];
  } else if (dense && dt == TPURT_F64) {
    memcpy((double *)o + i0, v, (size_t)cnt * 8);
  } else if (dense && (dt == TPURT_BF16 || dt == TPURT_F16)) {
    uint16_t *d = (uint16_t *)o + i0;
    if (dt == TPURT_BF16)
      for (int64_t j = 0; j < cnt; j++) d[j] = tpurt__f32_to_bf16((float)v[j]);
    else
      for (int64_t j = 0; j < cnt; j++) d[j] = tpurt__f32_to_f16((float)v[j]);
  } else if (dense && dt == TPURT_BOOL) {
    uint8_t *d = (uint8_t *)o + i0;
    for (int64_t j = 0; j < cnt; j++) d[j] = (int64_t)v[j] != 0;
  } else if (dense && dt == TPURT_U8) {
    uint8_t *d = (uint8_t *)o + i0;
    for (int64_t j = 0; j < cnt; j++) d[j] = (uint8_t)(int64_t)v[j];
  } else {
    for (int64_t j = 0; j < cnt; j++) {
      char *q = o + (dense ? i0 + j : kc_lin_off(&a->out, i0 + j)) * es;
      if (dt == TPURT_F32) {
        float f = (float)v[j];
        if (clamp && f >= hi) f = below;
        memcpy(q, &f, 4);
      } else if (kc_is_float(dt)) {
        kc_st(dt, q, v[j]);
      } else {
        kc_sti(dt, q, (int64_t)v[j]);
      }
    }
  }
}

/* random_ / randint: from + draw % range. A 32-bit draw (range in [1,
 * 2^32]) takes the remainder through a double quotient (exact inputs; a
 * quotient rounded up to the next integer gives a remainder below 0, fixed
 * once), so that the loop vectorizes; a 64-bit draw (word pairs; range 0:
 * all 2^64) divides. */
static void random_ints(const rng_args *a, int wide, const uint32_t *w, int64_t n, int64_t *iv) {
  if (wide) {
    for (int64_t j = 0; j < n; j++) {
      uint64_t r = ((uint64_t)w[2 * j] << 32) | w[2 * j + 1];
      iv[j] = (int64_t)((uint64_t)a->from + (a->range ? r % a->range : r));
    }
    return;
  }
  int64_t range = (int64_t)a->range, from = a->from;
  double dr = (double)range;
  for (int64_t j = 0; j < n; j++) {
    int64_t r = (int64_t)w[j];
    int64_t q = r - (int64_t)floor((double)r / dr) * range;
    q += q < 0 ? range : 0;
    q -= q >= range ? range : 0;
    iv[j] = (int64_t)((uint64_t)from + (uint64_t)q);
  }
}

static void store_ints(const rng_args *a, char *o, int dense, int64_t i0, const int64_t *iv, int64_t cnt) {
  tpurt_dtype dt = a->out.dtype;
  int es = (int)tpurt_dtype_size(dt);
  if (dense && dt == TPURT_I64) {
    memcpy((int64_t *)o + i0, iv, (size_t)cnt * 8);
  } else if (dense && dt == TPURT_I32) {
    int32_t *d = (int32_t *)o + i0;
    for (int64_t j = 0; j < cnt; j++) d[j] = (int32_t)iv[j];
  } else {
    for (int64_t j = 0; j < cnt; j++) {
      char *q = o + (dense ? i0 + j : kc_lin_off(&a->out, i0 + j)) * es;
      if (kc_is_float(dt))
        kc_st(dt, q, (double)iv[j]);
      else
        kc_sti(dt, q, iv[j]);
    }
  }
}

/* exponential, geometric and Cauchy samples of word (pair) slot */
static inline double draw_value(const rng_args *a, int wide, const uint32_t *w, int slot) {
  switch (a->kind) {
    case TPURT_RNG_EXPONENTIAL:
    case TPURT_RNG_GEOMETRIC:
    case TPURT_RNG_CAUCHY: {
      double u = wide ? u01d(((uint64_t)w[2 * slot] << 32) | w[2 * slot + 1]) : u01f(w[slot]);
      if (a->kind == TPURT_RNG_EXPONENTIAL) return -log1p(-u) / a->p0;
      if (a->kind == TPURT_RNG_GEOMETRIC) return ceil(log1p(-u) / log1p(-a->p0));
      return a->p0 + a->p1 * tan(M_PI * (u - 0.5));
    }
    default: return 0;
  }
}

static void rng_chunk(void *c, int64_t b, int64_t e) {
  rng_ctx *x = c;
  rng_args *a = x->a;
  int wide = x->wide, per = wide ? 2 : 4;
  int64_t n = kc_numel(&a->out);
  int dense = kc_dense(&a->out);
  uint32_t words[4 * RNG_BATCH];
  double vals[4 * RNG_BATCH];
  int64_t *ints = (int64_t *)vals;
  /* chunk units are blocks, drawn RNG_BATCH at a time */
  for (int64_t b0 = b; b0 < e; b0 += RNG_BATCH) {
    int64_t nb = e - b0 < RNG_BATCH ? e - b0 : RNG_BATCH;
    draw_batch(a->seed, a->offset + (uint64_t)b0, nb, words);
    int64_t i0 = b0 * per, cnt = nb * per < n - i0 ? nb * per : n - i0;
    if (a->kind == TPURT_RNG_RANDOM) {
      random_ints(a, wide, words, cnt, ints);
      store_ints(a, x->o, dense, i0, ints, cnt);
      continue;
    }
    if (!batch_values(a, wide, words, nb, vals))
      for (int64_t k = 0; k < cnt; k++) {
        const uint32_t *w = words + 4 * (k / per);
        int slot = (int)(k % per);
        if (a->tensor_p) {
          const char *pp = x->pp + kc_lin_off(&a->p, i0 + k) * (int64_t)tpurt_dtype_size(a->p.dtype);
          vals[k] = (double)u01f(w[slot]) < kc_ld(a->p.dtype, pp) ? 1.0 : 0.0;
        } else {
          vals[k] = draw_value(a, wide, w, slot);
        }
      }
    store_values(a, x->o, dense, i0, vals, cnt);
  }
}

static tpurt_status k_rng(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  rng_args *a = p;
  rng_ctx x = {a, tpurt__host_view(a->out.ptr), a->tensor_p ? tpurt__host_view(a->p.ptr) : NULL, 0};
  x.wide = a->tensor_p ? 0 : wide_draw((tpurt_rng_kind)a->kind, a->out.dtype, a->range);
  int64_t n = kc_numel(&a->out);
  int64_t blocks = (int64_t)tpurt_random_blocks((tpurt_rng_kind)a->kind, a->tensor_p ? TPURT_F32 : a->out.dtype, n,
                                                a->range);
  tpurt_parallel_for(blocks, 2048, rng_chunk, &x);
  return TPURT_OK;
}

tpurt_status tpurt_random(tpurt_stream *s, const tpurt_view *out, tpurt_rng_kind kind, double p0, double p1,
                          int64_t from, uint64_t range, uint64_t seed, uint64_t offset) {
  TPURT__INIT_OR_RETURN();
  const char *op = "random";
  tpurt_status st;
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((unsigned)kind > TPURT_RNG_CAUCHY) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad kind", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if ((st = kc_check(s->dev, out, op, "out"))) return st;
  if (kc_is_complex(out->dtype)) return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: complex is not supported", op);
  if (kc_numel(out) == 0) return TPURT_OK;
  rng_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.kind = kind;
  a.p0 = p0;
  a.p1 = p1;
  a.from = from;
  a.range = range;
  a.seed = seed;
  a.offset = offset;
  static const char *names[] = {"uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_",
                                "log_normal_", "cauchy_"};
  return tpurt_launch(s, names[kind], k_rng, &a, sizeof a);
}

tpurt_status tpurt_bernoulli_tensor(tpurt_stream *s, const tpurt_view *out, const tpurt_view *p, uint64_t seed,
                                    uint64_t offset) {
  TPURT__INIT_OR_RETURN();
  const char *op = "bernoulli_";
  tpurt_status st;
  if (!out || !p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, p, op, "p"))) return st;
  if (p->ndim != out->ndim) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: p must be broadcast to out", op);
  for (int k = 0; k < p->ndim; k++)
    if (p->sizes[k] != out->sizes[k]) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: p must be broadcast", op);
  if (kc_numel(out) == 0) return TPURT_OK;
  rng_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.p = *p;
  a.tensor_p = 1;
  a.kind = TPURT_RNG_BERNOULLI;
  a.seed = seed;
  a.offset = offset;
  return tpurt_launch(s, op, k_rng, &a, sizeof a);
}

/* -------------------------------------------------------------- dropout */

/* Dropout is an elementwise program (TPURT_EW_UNIFORM draws the mask), so
 * DeferAndFuse fuses it with its neighbours (e.g. dropout + residual add)
 * and strict eager runs the same instructions. Like PyTorch: out = x * keep
 * * scale, backward grad * mask * scale (NaN and inf propagate). */
tpurt_status tpurt_dropout(tpurt_stream *s, const tpurt_view *out, const tpurt_view *mask, const tpurt_view *in,
                           double p, double scale, int gen, uint64_t seed, uint64_t offset) {
  TPURT__INIT_OR_RETURN();
  const char *op = gen ? "native_dropout" : "native_dropout_backward";
  tpurt_status st;
  if (!out || !in || (!gen && !mask)) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, in, op, "input")) ||
      (mask && (st = kc_check(s->dev, mask, op, "mask"))))
    return st;
  if (out->ndim != in->ndim || (mask && mask->ndim != out->ndim) || !kc_is_float(out->dtype) ||
      (mask && mask->dtype != TPURT_BOOL && mask->dtype != TPURT_U8))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad views", op);
  for (int k = 0; k < out->ndim; k++)
    if (in->sizes[k] != out->sizes[k] || (mask && mask->sizes[k] != out->sizes[k]))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: shapes differ", op);
  if (kc_numel(out) == 0) return TPURT_OK;
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = out->dtype == TPURT_F64 ? TPURT_F64 : TPURT_F32;
  int x = tpurt__ew_emit(&pr, TPURT_EW_LOAD, 0, 0, 0), keep;
  if (gen) {
    int u = tpurt__ew_emit(&pr, TPURT_EW_UNIFORM, 0, 0, 0);
    keep = tpurt__ew_emit(&pr, TPURT_EW_GE, u, tpurt__ew_emit(&pr, TPURT_EW_CONST, 0, 0, (float)p), 0);
  } else {
    keep = tpurt__ew_emit(&pr, TPURT_EW_LOAD, 0, 0, 1);
  }
  int y = tpurt__ew_emit(&pr, TPURT_EW_MUL, tpurt__ew_emit(&pr, TPURT_EW_MUL, x, keep, 0),
                    tpurt__ew_emit(&pr, TPURT_EW_CONST, 0, 0, pr.compute == TPURT_F32 ? (float)scale : scale), 0);
  pr.nout = gen && mask ? 2 : 1;
  pr.out_reg[0] = (uint8_t)y;
  pr.out_reg[1] = (uint8_t)keep;
  tpurt_view outs[2] = {*out, mask ? *mask : *out}, ins[2] = {*in, mask ? *mask : *in};
  const double sc[4] = {(double)(uint32_t)seed, (double)(uint32_t)(seed >> 32), (double)(uint32_t)offset,
                        (double)(uint32_t)(offset >> 32)};
  return tpurt__elementwise_named(s, &pr, outs, ins, gen ? 1 : 2, sc, gen ? 4 : 0, op);
}

/* -------------------------------------------------------------- randperm */

typedef struct {
  tpurt_view out;
  uint64_t seed, offset;
} perm_args;

static tpurt_status k_randperm(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  perm_args *a = p;
  int64_t n = a->out.sizes[0];
  int64_t *tmp = malloc((size_t)n * sizeof *tmp);
  if (!tmp) {
    snprintf(err, errlen, "out of host memory");
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  for (int64_t i = 0; i < n; i++) tmp[i] = i;
  uint32_t words[4 * RNG_BATCH];
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t blk = n - 1 - i; /* blocks in order: offset, offset + 1, ... */
    if (blk % RNG_BATCH == 0) draw_batch(a->seed, a->offset + (uint64_t)blk, i, words);
    const uint32_t *w = words + 4 * (blk % RNG_BATCH);
    uint64_t r = ((uint64_t)w[0] << 32) | w[1];
    int64_t j = (int64_t)(r % (uint64_t)(i + 1));
    int64_t t = tmp[i];
    tmp[i] = tmp[j];
    tmp[j] = t;
  }
  char *o = tpurt__host_view(a->out.ptr);
  int es = (int)tpurt_dtype_size(a->out.dtype);
  for (int64_t i = 0; i < n; i++) {
    char *q = o + i * a->out.strides[0] * es;
    if (kc_is_float(a->out.dtype))
      kc_st(a->out.dtype, q, (double)tmp[i]);
    else
      kc_sti(a->out.dtype, q, tmp[i]);
  }
  free(tmp);
  return TPURT_OK;
}

tpurt_status tpurt_randperm(tpurt_stream *s, const tpurt_view *out, uint64_t seed, uint64_t offset) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "randperm: NULL view");
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if ((st = kc_check(s->dev, out, "randperm", "out"))) return st;
  if (out->ndim != 1 || kc_is_complex(out->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "randperm: out must be a 1-D real view");
  if (out->sizes[0] == 0) return TPURT_OK;
  perm_args a = {*out, seed, offset};
  return tpurt_launch(s, "randperm", k_randperm, &a, sizeof a);
}

/* ----------------------------------------------------------- multinomial */

typedef struct {
  tpurt_view out, probs;
  int64_t nsample;
  int replacement;
  uint64_t seed, offset;
} mn_args;

typedef struct {
  mn_args *a;
  char *o;
  const char *p;
  kc_err err;
} mn_ctx;

/* The first index whose cumulative weight exceeds u: with replacement, a
 * binary search of the row's cumulative sums (summed in index order: the
 * pick a linear scan would make, in O(log C)). */
static int64_t mn_search(const double *cdf, int64_t C, double u) {
  int64_t lo = 0, hi = C - 1;
  if (!(u < cdf[C - 1])) { /* u rounded up to the total: the last category with a weight */
    while (hi > 0 && cdf[hi] == cdf[hi - 1]) hi--;
    return hi;
  }
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (u < cdf[mid])
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

/* Without replacement: a tree of sums (leaves P..P+C-1 the weights, node i
 * the sum of 2i and 2i+1) that a draw descends in O(log C) and a pick
 * leaves by zeroing its leaf and re-adding its ancestors (sums recomputed,
 * never subtracted: no drift). The descent never enters a zero subtree, so
 * a pick always has a positive weight. A linear scan per draw made n draws
 * from C categories O(n C): 2,000 of 50,000 took 47 ms (CPU torch 1.6). */
static int64_t mn_tree_pick(double *t, int64_t P, double u) {
  int64_t i = 1;
  while (i < P) {
    double l = t[2 * i], r = t[2 * i + 1];
    if ((u < l && l > 0) || !(r > 0)) {
      i = 2 * i;
    } else {
      u -= l;
      i = 2 * i + 1;
    }
  }
  return i - P;
}
static void mn_tree_remove(double *t, int64_t P, int64_t j) {
  int64_t i = P + j;
  t[i] = 0;
  for (i /= 2; i >= 1; i /= 2) t[i] = t[2 * i] + t[2 * i + 1];
}

static void mn_chunk(void *c, int64_t b, int64_t e) {
  mn_ctx *x = c;
  mn_args *a = x->a;
  int64_t C = a->probs.sizes[1], P = 1;
  while (P < C) P *= 2;
  tpurt_dtype pt = a->probs.dtype;
  int pes = (int)tpurt_dtype_size(pt);
  /* with replacement or a single draw: the cumulative sums [C]; else the
   * tree [2P] (its build cost more than the one search of torch.multinomial(
   * probs, 1), an LLM's sampling, whose default is without replacement) */
  int cdf = a->replacement || a->nsample == 1;
  double *w = malloc((size_t)(cdf ? C : 2 * P) * sizeof *w);
  if (!w) {
    kc_err_index(&x->err, "out of host memory");
    return;
  }
  double *leaf = cdf ? w : w + P;
  for (int64_t r = b; r < e; r++) {
    /* the row's weights as doubles (a typed loop for contiguous float
     * rows), checked, then summed in index order */
    const char *row = x->p + r * a->probs.strides[0] * pes;
    if (a->probs.strides[1] == 1 && pt == TPURT_F32)
      for (int64_t j = 0; j < C; j++) leaf[j] = ((const float *)row)[j];
    else if (a->probs.strides[1] == 1 && pt == TPURT_F64)
      memcpy(leaf, row, (size_t)C * 8);
    else
      for (int64_t j = 0; j < C; j++) leaf[j] = kc_ld(pt, row + j * a->probs.strides[1] * pes);
    int64_t nz = 0, bad = 0;
    for (int64_t j = 0; j < C; j++) {
      double v = leaf[j];
      bad += !(v >= 0) | (v == INFINITY);
      nz += v > 0;
    }
    if (bad) {
      kc_err_index(&x->err, "probability tensor contains either `inf`, `nan` or element < 0");
      free(w);
      return;
    }
    double tot = 0;
    if (cdf)
      for (int64_t j = 0; j < C; j++) leaf[j] = tot += leaf[j];
    else
      for (int64_t j = 0; j < C; j++) tot += leaf[j];
    if (!(tot > 0)) {
      kc_err_index(&x->err, "invalid multinomial distribution (sum of probabilities <= 0)");
      free(w);
      return;
    }
    if (!a->replacement && nz < a->nsample) {
      kc_err_index(&x->err, "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
      free(w);
      return;
    }
    if (!cdf) {
      for (int64_t j = C; j < P; j++) leaf[j] = 0;
      for (int64_t i = P - 1; i >= 1; i--) w[i] = w[2 * i] + w[2 * i + 1];
    }
    uint32_t words[4 * RNG_BATCH];
    for (int64_t k = 0; k < a->nsample; k++) {
      if (k % RNG_BATCH == 0) draw_batch(a->seed, a->offset + (uint64_t)(r * a->nsample + k), a->nsample - k, words);
      const uint32_t *q = words + 4 * (k % RNG_BATCH);
      double u = u01d(((uint64_t)q[0] << 32) | q[1]);
      int64_t pick;
      if (cdf) {
        pick = mn_search(w, C, u * tot);
      } else {
        pick = mn_tree_pick(w, P, u * w[1]);
        mn_tree_remove(w, P, pick);
      }
      *(int64_t *)(x->o + (r * a->out.strides[0] + k * a->out.strides[1]) * 8) = pick;
    }
  }
  free(w);
}

static tpurt_status k_multinomial(void *p, char *err, size_t errlen) {
  mn_args *a = p;
  mn_ctx x;
  x.a = a;
  x.o = tpurt__host_view(a->out.ptr);
  x.p = tpurt__host_view(a->probs.ptr);
  atomic_init(&x.err.set, 0);
  tpurt_parallel_for(a->probs.sizes[0], 1, mn_chunk, &x);
  return kc_err_finish(&x.err, TPURT_ERR_INVALID_ARGUMENT, err, errlen);
}

tpurt_status tpurt_multinomial(tpurt_stream *s, const tpurt_view *out, const tpurt_view *probs, int64_t nsample,
                               int replacement, uint64_t seed, uint64_t offset) {
  TPURT__INIT_OR_RETURN();
  const char *op = "multinomial";
  tpurt_status st;
  if (!out || !probs) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, probs, op, "probs"))) return st;
  if (probs->ndim != 2 || out->ndim != 2 || out->dtype != TPURT_I64 || out->sizes[0] != probs->sizes[0] ||
      out->sizes[1] != nsample || !kc_is_float(probs->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad views", op);
  if (kc_numel(out) == 0) return TPURT_OK;
  mn_args a = {*out, *probs, nsample, replacement, seed, offset};
  return tpurt_launch(s, op, k_multinomial, &a, sizeof a);
}

/* ---------------------------------------------------- poisson, binomial */

/* The samplers need a varying number of uniforms per element (rejection):
 * element i (row-major over out) takes its j-th block from the 128-bit
 * counter (offset + i, j, tag), so its values depend only on (seed, offset,
 * i) and each element reserves one block index from the generator. */
typedef struct {
  uint32_t key[2], ctr[4], w[4];
  int used; /* 64-bit words of w already taken (0..2) */
} estream;

static void es_init(estream *s, uint64_t seed, uint64_t blk, uint32_t tag) {
  s->key[0] = (uint32_t)seed, s->key[1] = (uint32_t)(seed >> 32);
  s->ctr[0] = (uint32_t)blk, s->ctr[1] = (uint32_t)(blk >> 32), s->ctr[2] = 0, s->ctr[3] = tag;
  s->used = 2;
}
static double es_u01(estream *s) { /* [0, 1), 53 bits */
  if (s->used == 2) {
    tpurt_philox4x32_10(s->ctr, s->key, s->w);
    s->ctr[2]++;
    s->used = 0;
  }
  uint64_t x = ((uint64_t)s->w[2 * s->used] << 32) | s->w[2 * s->used + 1];
  s->used++;
  return u01d(x);
}

/* log(k!) for k >= 0: the sum of logs below 16, Stirling's series above (error < 1e-12); lgamma
 * is not thread-safe (signgam) */
static double log_factorial(double k) {
  if (k < 16) {
    double r = 0;
    for (int i = 2; i <= (int)k; i++) r += log((double)i);
    return r;
  }
  double x = k + 1, ix = 1.0 / x, ix2 = ix * ix;
  return (x - 0.5) * log(x) - x + 0.91893853320467274178 + ix * (1.0 / 12 - ix2 * (1.0 / 360 - ix2 / 1260));
}

/* Poisson(mu), mu >= 0: products of uniforms below 10 (mu + 1 draws on average); above, the
 * transformed rejection with squeeze of Hormann (1993), "The transformed rejection method for
 * generating Poisson random variables" (about 1.1 pairs of draws) */
static double sample_poisson(double mu, estream *s) {
  if (mu == 0) return 0;
  if (isinf(mu)) return INFINITY;
  if (mu < 10) {
    double lim = exp(-mu), prod = 1;
    int64_t k = -1;
    do {
      k++;
      prod *= 1.0 - es_u01(s); /* (0, 1] */
    } while (prod > lim);
    return (double)k;
  }
  double smu = sqrt(mu), lmu = log(mu);
  double b = 0.931 + 2.53 * smu, a = -0.059 + 0.02483 * b;
  double inv_alpha = 1.1239 + 1.1328 / (b - 3.4), vr = 0.9277 - 3.6224 / (b - 2);
  for (;;) {
    double u = es_u01(s) - 0.5, v = es_u01(s), us = 0.5 - fabs(u);
    double k = floor((2 * a / us + b) * u + mu + 0.43);
    if (us >= 0.07 && v <= vr) return k;
    if (k < 0 || (us < 0.013 && v > us)) continue;
    if (log(v) + log(inv_alpha) - log(a / (us * us) + b) <= -mu + k * lmu - log_factorial(k)) return k;
  }
}

/* Binomial(n, p) of n = floor(count) trials: waiting times of the rarer outcome when n * min(p, 1 - p)
 * < 10 (that many + 1 draws on average); above, the BTRS rejection of Hormann (1993), "The generation
 * of binomial random variates". As the CPU: count <= 0 or p <= 0 give 0, p >= 1 gives count; NaN
 * and an infinite count give NaN. */
static double sample_binomial(double count, double p, estream *s) {
  if (isnan(count) || isnan(p) || isinf(count)) return NAN;
  if (count <= 0 || p <= 0) return 0;
  if (p >= 1) return count;
  double n = floor(count);
  int flip = p > 0.5;
  double q = flip ? 1 - p : p, r;
  if (n * q < 10) {
    double lq = log1p(-q), sum = 0;
    r = 0;
    for (;;) {
      double g = ceil(log(1.0 - es_u01(s)) / lq); /* trials up to the next success, >= 1 */
      sum += g < 1 ? 1 : g;
      if (sum > n) break;
      r++;
    }
  } else {
    double spq = sqrt(n * q * (1 - q));
    double b = 1.15 + 2.53 * spq, a = -0.0873 + 0.0248 * b + 0.01 * q, c = n * q + 0.5;
    double vr = 0.92 - 4.2 / b, alpha = (2.83 + 5.1 / b) * spq, lpq = log(q / (1 - q));
    double m = floor((n + 1) * q), h = log_factorial(m) + log_factorial(n - m);
    for (;;) {
      double u = es_u01(s) - 0.5, v = es_u01(s), us = 0.5 - fabs(u);
      double k = floor((2 * a / us + b) * u + c);
      if (k < 0 || k > n) continue;
      if (us >= 0.07 && v <= vr) { r = k; break; }
      v = log(v * alpha / (a / (us * us) + b));
      if (v <= h - log_factorial(k) - log_factorial(n - k) + (k - m) * lpq) { r = k; break; }
    }
  }
  return flip ? n - r : r;
}

typedef struct {
  tpurt_view out, a, b; /* poisson: a = rate; binomial: a = count, b = prob */
  int binomial;
  uint64_t seed, offset;
} dist_args;

typedef struct {
  dist_args *x;
  char *o;
  const char *pa, *pb;
  kc_err err;
} dist_ctx;

static void dist_chunk(void *c, int64_t b, int64_t e) {
  dist_ctx *d = c;
  dist_args *x = d->x;
  int oes = (int)tpurt_dtype_size(x->out.dtype), aes = (int)tpurt_dtype_size(x->a.dtype);
  int bes = x->binomial ? (int)tpurt_dtype_size(x->b.dtype) : 0;
  for (int64_t i = b; i < e; i++) {
    estream s;
    es_init(&s, x->seed, x->offset + (uint64_t)i, x->binomial ? 0x62696e6fu : 0x706f6973u);
    double va = kc_ld(x->a.dtype, d->pa + kc_lin_off(&x->a, i) * aes), v;
    if (x->binomial) {
      v = sample_binomial(va, kc_ld(x->b.dtype, d->pb + kc_lin_off(&x->b, i) * bes), &s);
    } else {
      if (!(va >= 0)) {
        kc_err_index(&d->err, "invalid Poisson rate, expected rate to be non-negative");
        return;
      }
      v = sample_poisson(va, &s);
    }
    kc_st(x->out.dtype, d->o + kc_lin_off(&x->out, i) * oes, v);
  }
}

static tpurt_status k_dist(void *p, char *err, size_t errlen) {
  dist_args *x = p;
  dist_ctx d;
  d.x = x;
  d.o = tpurt__host_view(x->out.ptr);
  d.pa = tpurt__host_view(x->a.ptr);
  d.pb = x->binomial ? tpurt__host_view(x->b.ptr) : NULL;
  atomic_init(&d.err.set, 0);
  tpurt_parallel_for(kc_numel(&x->out), 256, dist_chunk, &d);
  return kc_err_finish(&d.err, TPURT_ERR_INVALID_ARGUMENT, err, errlen);
}

static tpurt_status dist_launch(tpurt_stream *s, const char *op, const tpurt_view *out, const tpurt_view *a,
                                const tpurt_view *b, uint64_t seed, uint64_t offset) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if (!out || !a || (strcmp(op, "binomial") == 0 && !b)) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, a, op, "input")) ||
      (b && (st = kc_check(s->dev, b, op, "prob"))))
    return st;
  const tpurt_view *ins[2] = {a, b};
  for (int v = 0; v < 2; v++) {
    if (!ins[v]) continue;
    if (ins[v]->ndim != out->ndim || !kc_is_float(ins[v]->dtype))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: inputs must be float views of out's shape", op);
    for (int k = 0; k < out->ndim; k++)
      if (ins[v]->sizes[k] != out->sizes[k])
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: inputs must be float views of out's shape", op);
  }
  if (!kc_is_float(out->dtype)) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out must be a float view", op);
  if (kc_numel(out) == 0) return TPURT_OK;
  dist_args x = {.out = *out, .a = *a, .b = b ? *b : *a, .binomial = b != NULL, .seed = seed, .offset = offset};
  return tpurt_launch(s, op, k_dist, &x, sizeof x);
}

tpurt_status tpurt_poisson(tpurt_stream *s, const tpurt_view *out, const tpurt_view *rate, uint64_t seed,
                           uint64_t offset) {
  return dist_launch(s, "poisson", out, rate, NULL, seed, offset);
}

tpurt_status tpurt_binomial(tpurt_stream *s, const tpurt_view *out, const tpurt_view *count, const tpurt_view *prob,
                            uint64_t seed, uint64_t offset) {
  return dist_launch(s, "binomial", out, count, prob, seed, offset);
}
