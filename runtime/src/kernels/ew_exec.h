/*
 * ew_exec.h — what one element of an elementwise program computes: the
 * special functions, the vectorizable float approximations, the
 * instruction bodies of every compute type (ew_real.h, ew_complex.h and
 * the integer body below, instantiated once each) and the dtype
 * conversions of loads and stores.
 *
 * Two users, one text: the block interpreter (elementwise.c) runs these
 * bodies over blocks of registers; generated kernels (graph/codegen.c)
 * embed this header's text and run the same bodies on one element at a
 * time (EW_FN_ATTR makes them always_inline there, so a constant op folds
 * the switch away). Any change here changes both tiers alike, which is
 * what keeps their results bitwise equal.
 */
#ifndef TPURT_EW_EXEC_H
#define TPURT_EW_EXEC_H

#include <complex.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"

#undef I /* complex.h's imaginary unit; _Complex_I is used instead */
#define I_UNIT (_Complex_I)

/* attributes of the instruction bodies: none in the interpreter */
#ifndef EW_FN_ATTR
#define EW_FN_ATTR
#endif

/* ------------------------------------------------- special functions */

static double ew_lgamma(double x) {
  int sg;
  return lgamma_r(x, &sg);
}

static double ew_digamma(double x) {
  if (x == 0) return copysign(INFINITY, -x);
  if (x != x) return x;
  double result = 0;
  if (x < 0) {
    if (x == trunc(x)) return NAN;
    /* reflection: psi(1 - x) - pi / tan(pi * x), with x's fraction for accuracy */
    double q, r = modf(x, &q);
    return ew_digamma(1 - x) - M_PI / tan(M_PI * r);
  }
  while (x < 10) {
    result -= 1 / x;
    x += 1;
  }
  if (x == 10) return result + 2.25175258906672110764;
  /* asymptotic expansion with Bernoulli numbers */
  double y = 1 / (x * x);
  double poly = y * (1.0 / 12 - y * (1.0 / 120 - y * (1.0 / 252 - y * (1.0 / 240 - y * (1.0 / 132 - y * (691.0 / 32760 - y / 12))))));
  return result + log(x) - 0.5 / x - poly;
}

static double ew_erfinv(double y) {
  if (y != y || y < -1 || y > 1) return NAN;
  if (y == 1) return INFINITY;
  if (y == -1) return -INFINITY;
  if (y == 0) return y;
  /* initial guess (Giles, "Approximating the erfinv function"), then Newton */
  double w = -log((1.0 - y) * (1.0 + y)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double x = p * y;
  for (int k = 0; k < 2; k++) {
    double e = erf(x) - y;
    x -= e / (M_2_SQRTPI * exp(-x * x));
  }
  return x;
}

#include "ew_special.h"

#include "vmath.h"
#include "ew_dmath.h"

/* exp(x) for finite x <= 0 (degree-7 polynomial: relative error ~1.5e-7),
 * 0 where it underflows; callers select their results where x is out of
 * range (-inf gives NaN) */
static inline float ew_expneg_f(float x) {
  static const float c[8] = {1.0f, 1.0f, 0.5f, 1.0f / 6.0f, 1.0f / 24.0f, 1.0f / 120.0f, 1.0f / 720.0f, 1.0f / 5040.0f};
  return tpurt__vexpf_core(x, c, 8);
}

/* exp(-(zz + zl)) for zz >= 0 and |zl| <= ulp(zz): e^-zz (1 - zl) */
static inline float ew_gauss_f(float zz, float zl) { return ew_expneg_f(-zz) * fmaf(-1.0f, zl, 1.0f); }

/* erfcx(z) = exp(z^2) erfc(z) for 0 <= z <= 10.5 (erfc underflows float
 * beyond) as t P(t), t = 1 / (1 + 0.4 z): a degree-9 polynomial fitted
 * for relative error (< 1e-8 in exact arithmetic, 3e-8 with the float
 * coefficients); erfc(z) = exp(-z^2) erfcx(z) keeps the tail's relative
 * accuracy, and phi's exp(-x^2/2) is the same factor. */
static inline float ew_erfcx_f(float z) {
  static const float c[10] = {0.225703672f,  0.225015238f, 0.214390993f,  0.132155135f, 0.264877856f,
                              -0.270931065f, 0.531236649f, -0.486636281f, 0.192825258f, -0.0286374614f};
  float t = 1.0f / fmaf(0.4f, z, 1.0f);
  return t * tpurt__vhornerf(t, c, 10);
}

/* Phi(x), the standard normal CDF, from erfc(|x| / sqrt 2) = g erfcx(|x| /
 * sqrt 2), where g = exp(-x^2 / 2) (x*x split exactly with an fma) is
 * returned in *gauss for the GELU backward's density. */
static inline float ew_phi_g_f(float x, float *gauss) {
  float a = fabsf(x);
  float xx = a * a, xl = fmaf(a, a, -xx);
  float g = ew_gauss_f(0.5f * xx, 0.5f * xl);
  float ec = g * ew_erfcx_f(a * 0.70710678118654752f);
  ec = a > 19.5f ? 0.0f : ec; /* erfc underflowed long before; x*x may be inf */
  float p = x >= 0 ? fmaf(-0.5f, ec, 1.0f) : 0.5f * ec;
  *gauss = a > 19.5f ? 0.0f : g;
  return x != x ? x : p;
}

/* erfc(|x|); 0 where it underflows float */
static inline float ew_erfc_abs_f(float x) {
  float a = fabsf(x), aa = a * a;
  float e = ew_gauss_f(aa, fmaf(a, a, -aa)) * ew_erfcx_f(a);
  return a > 10.5f ? 0.0f : e;
}

/* erf: an odd Taylor series below |x| = 0.75 (ten terms: truncation
 * < 4e-11; 1 - erfc would cancel there), 1 - erfc(|x|) with x's sign above */
static inline float ew_erf_f(float x) {
  /* (2 / sqrt pi) (-1)^n / (n! (2n + 1)), n = 0..9 */
  static const float c[10] = {1.1283791670955126f,     -0.37612638903183754f,  0.11283791670955126f,
                              -0.026866170645131252f,  0.005223977625442188f,  -0.0008548327023450852f,
                              0.00012055332981789664f, -1.492565035840625e-05f, 1.6462114365889246e-06f,
                              -1.6365844691234924e-07f};
  float p = tpurt__vhornerf(x * x, c, 10);
  float tail = 1.0f - ew_erfc_abs_f(x);
  float r = fabsf(x) < 0.75f ? x * p : (x < 0 ? -tail : tail);
  return x != x ? x : r;
}

/* erfc: erfc(|x|) for x >= 0 (relative accuracy in the tail), 2 - it below */
static inline float ew_erfc_f(float x) {
  float e = ew_erfc_abs_f(x);
  float r = x >= 0 ? e : 2.0f - e;
  return x != x ? x : r;
}

/* tanh: an odd Taylor series below |x| = 0.4 (eight terms: truncation
 * < 2e-10), 1 - 2 / (exp(2|x|) + 1) with x's sign above (exp's overflow to
 * infinity gives 1) */
static inline float ew_tanh_f(float x) {
  /* tanh x = x + x^3 (-1/3 + x^2 (2/15 + ...)) */
  static const float c[7] = {-1.0f / 3.0f,        2.0f / 15.0f,          -17.0f / 315.0f,          62.0f / 2835.0f,
                             -1382.0f / 155925.0f, 21844.0f / 6081075.0f, -929569.0f / 638512875.0f};
  float s = x * x;
  float small = x * fmaf(s, tpurt__vhornerf(s, c, 7), 1.0f); /* x (1 + ...): -0.0 stays -0.0 */
  float big = 1.0f - 2.0f / (tpurt__vexpf(2.0f * fabsf(x)) + 1.0f);
  float r = fabsf(x) < 0.4f ? small : (x < 0 ? -big : big);
  return x != x ? x : r;
}

/* natural log: x = 2^e m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s)
 * for s = (m - 1) / (m + 1) (|s| <= 0.1716: odd series to s^9, truncation
 * < 1e-9 relative), e ln2 added in two parts. Subnormals are scaled by 2^23
 * first; x < 0 gives NaN, 0 -inf, inf inf; NaN is kept. Branch-free. */
static inline float ew_log_f(float x) {
  static const float c[5] = {2.0f, 2.0f / 3.0f, 2.0f / 5.0f, 2.0f / 7.0f, 2.0f / 9.0f};
  int sub = x < 1.17549435e-38f;
  float xs = sub ? x * 8388608.0f : x;
  uint32_t u = tpurt__vubits(xs);
  float e = (float)((int32_t)((u >> 23) & 0xff) - 127) - (sub ? 23.0f : 0.0f);
  float m = tpurt__vbits((u & 0x007fffffu) | 0x3f800000u); /* [1, 2) */
  int big = m > 1.41421356f;
  m = big ? 0.5f * m : m;
  e = big ? e + 1.0f : e;
  float sv = (m - 1.0f) / (m + 1.0f);
  float lm = sv * tpurt__vhornerf(sv * sv, c, 5);
  float r = fmaf(e, 0.693145751953125f, fmaf(e, 1.428606765330187e-06f, lm));
  return ew_log_special_f(x, r);
}

/* log1p: log(u) x / (u - 1) with u = 1 + x (the quotient corrects u's
 * rounding), x itself where u rounds to 1 */
static inline float ew_log1p_f(float x) {
  float u = 1.0f + x;
  float r = ew_log_f(u) * (x / (u - 1.0f));
  r = u == 1.0f ? x : r;
  return x == INFINITY ? x : r;
}

/* gelu(x) = x * Phi(x) */
static inline float ew_gelu_f(float x) {
  float gauss;
  return x * ew_phi_g_f(x, &gauss);
}

/* gelu with the tanh approximation, 0.5 x (1 + tanh u) = x / (1 + exp(-2u)),
 * u = sqrt(2 / pi) (x + 0.044715 x^3); where PyTorch's float tanh(u)
 * rounds to -1 (u < -13 ln 2) its product is a signed zero, not the tiny
 * value of the exp form: a floor or a sign test after it sees what CPU sees
 * (fuzz seed 621058) */
static inline float ew_gelu_tanh_f(float x) {
  float t = x + 0.044715f * x * x * x;
  float r = x / (1.0f + tpurt__vexpf(-2.0f * 0.7978845608028654f * t));
  return 0.7978845608028654f * t < -9.010913f ? 0.0f * x : r;
}

/* d gelu(y) / dy * g = g * (Phi(y) + y * phi(y)), phi(y) = exp(-y^2 / 2) / sqrt(2 pi) */
static inline float ew_gelu_backward_f(float g, float y) {
  float gauss, p = ew_phi_g_f(y, &gauss);
  return g * fmaf(y, gauss * 0.3989422804014327f, p);
}

/* --------------------------------------------------- instruction loops */

#define EW_T float
#define EW_FN exec_f32
#define EW_M(fn) fn##f
#define EW_EXP(x) tpurt__vexpf(x)
#define EW_TANH(x) ew_tanh_f(x)
#define EW_LOG(x) ew_log_f(x)
#define EW_LOG1P(x) ew_log1p_f(x)
#define EW_EXPM1(x) ew_expm1_f(x)
#define EW_FAST 1
#include "ew_real.h"
#undef EW_T
#undef EW_FN
#undef EW_M
#undef EW_EXP
#undef EW_TANH
#undef EW_LOG
#undef EW_LOG1P
#undef EW_EXPM1
#undef EW_FAST

#define EW_T double
#define EW_FN exec_f64
#define EW_M(f) f
#define EW_EXP(x) exp(x)
#define EW_TANH(x) tanh(x)
#define EW_LOG(x) log(x)
#define EW_LOG1P(x) log1p(x)
#define EW_EXPM1(x) expm1(x)
#define EW_FAST 0
#include "ew_real.h"
#undef EW_T
#undef EW_FN
#undef EW_M
#undef EW_EXP
#undef EW_TANH
#undef EW_LOG
#undef EW_LOG1P
#undef EW_EXPM1
#undef EW_FAST

#define EW_T float _Complex
#define EW_R float
#define EW_FN exec_c64
#define EW_CM(fn) fn##f
#define EW_CR(fn) fn##f
#include "ew_complex.h"
#undef EW_T
#undef EW_R
#undef EW_FN
#undef EW_CM
#undef EW_CR

#define EW_T double _Complex
#define EW_R double
#define EW_FN exec_c128
#define EW_CM(f) f
#define EW_CR(f) f
#include "ew_complex.h"
#undef EW_T
#undef EW_R
#undef EW_FN
#undef EW_CM
#undef EW_CR

static inline int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

/* Euclid on magnitudes (unsigned: |INT64_MIN| is representable) */
static int64_t igcd(int64_t a, int64_t b) {
  uint64_t x = a < 0 ? 0 - (uint64_t)a : (uint64_t)a, y = b < 0 ? 0 - (uint64_t)b : (uint64_t)b;
  while (y) {
    uint64_t t = x % y;
    x = y;
    y = t;
  }
  return (int64_t)x;
}
static int64_t ilcm(int64_t a, int64_t b) {
  int64_t g = igcd(a, b);
  if (g == 0) return 0;
  int64_t m = wrap_mul(a / g, b); /* g > 0, or INT64_MIN for a gcd of 2^63: never -1 */
  return m < 0 ? wrap_sub(0, m) : m;
}

static int64_t ipow(int64_t base, int64_t e) {
  if (e < 0) {
    if (base == 1) return 1;
    if (base == -1) return (e & 1) ? -1 : 1;
    return 0;
  }
  int64_t r = 1;
  while (e) {
    if (e & 1) r = wrap_mul(r, base);
    base = wrap_mul(base, base);
    e >>= 1;
  }
  return r;
}

static int64_t f2i_param(double v) { return tpurt__f2i64(v); }

/* returns 1 on an integer division by zero */
static EW_FN_ATTR int exec_i64(const tpurt_ew_inst *I, int64_t *restrict d, const int64_t *restrict a,
                    const int64_t *restrict b, const int64_t *restrict c, int n) {
  typedef int64_t T;
  const T p0 = f2i_param(I->p[0]), p1 = f2i_param(I->p[1]);
  int bad = 0;
#include "ew_loops.h"
#define BDIV(expr)                \
  for (int i = 0; i < n; i++) {   \
    T x = a[i], y = b[i];         \
    if (y == 0) {                 \
      bad = 1;                    \
      d[i] = 0;                   \
      continue;                   \
    }                             \
    d[i] = (expr);                \
  }                               \
  break
  switch (I->op) {
    case TPURT_EW_NEG: U(wrap_sub(0, x));
    case TPURT_EW_ABS: U(x < 0 ? wrap_sub(0, x) : x);
    case TPURT_EW_SQUARE: U(wrap_mul(x, x));
    case TPURT_EW_SIGN:
    case TPURT_EW_SGN: U((T)((x > 0) - (x < 0)));
    case TPURT_EW_FLOOR:
    case TPURT_EW_CEIL:
    case TPURT_EW_ROUND:
    case TPURT_EW_TRUNC:
    case TPURT_EW_NAN_TO_NUM: U(x);
    case TPURT_EW_RELU: U(x < 0 ? 0 : x);
    case TPURT_EW_HARDTANH: U(x < p0 ? p0 : (x > p1 ? p1 : x));
    case TPURT_EW_LOGICAL_NOT: U((T)(x == 0));
    case TPURT_EW_BITWISE_NOT: U(~x);
    case TPURT_EW_ISNAN:
    case TPURT_EW_ISINF:
    case TPURT_EW_ISPOSINF:
    case TPURT_EW_ISNEGINF: U((T)0 * x);
    case TPURT_EW_ISFINITE: U((T)1 + 0 * x);
    case TPURT_EW_CAST: {
      tpurt_dtype via = (tpurt_dtype)(int)I->p[0];
      for (int i = 0; i < n; i++) {
        unsigned char tmp[16];
        tpurt__val v = {0, a[i], (uint64_t)a[i], 0.0, 0.0};
        tpurt__store(via, tmp, v);
        tpurt__val r = tpurt__load(via, tmp);
        d[i] = r.cls == 0 ? r.i : r.cls == 1 ? (int64_t)r.u : tpurt__f2i64(r.re);
      }
      break;
    }
    case TPURT_EW_ADD: B(wrap_add(x, wrap_mul(p0, y)));
    case TPURT_EW_SUB: B(wrap_sub(x, wrap_mul(p0, y)));
    case TPURT_EW_MUL: B(wrap_mul(x, y));
    case TPURT_EW_DIV:
    case TPURT_EW_DIV_TRUNC: BDIV(y == -1 ? wrap_sub(0, x) : x / y);
    case TPURT_EW_DIV_FLOOR: {
      for (int i = 0; i < n; i++) {
        T x = a[i], y = b[i];
        if (y == 0) {
          bad = 1;
          d[i] = 0;
          continue;
        }
        if (y == -1) {
          d[i] = wrap_sub(0, x);
          continue;
        }
        T q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) q--;
        d[i] = q;
      }
      break;
    }
    case TPURT_EW_REMAINDER: {
      for (int i = 0; i < n; i++) {
        T x = a[i], y = b[i];
        if (y == 0) {
          bad = 1;
          d[i] = 0;
          continue;
        }
        T r = y == -1 ? 0 : x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        d[i] = r;
      }
      break;
    }
    case TPURT_EW_FMOD: BDIV(y == -1 ? 0 : x % y);
    case TPURT_EW_POW: B(ipow(x, y));
    case TPURT_EW_MAXIMUM:
    case TPURT_EW_FMAX: B(x >= y ? x : y);
    case TPURT_EW_MINIMUM:
    case TPURT_EW_FMIN: B(x <= y ? x : y);
    case TPURT_EW_EQ: B((T)(x == y));
    case TPURT_EW_NE: B((T)(x != y));
    case TPURT_EW_LT: B((T)(x < y));
    case TPURT_EW_LE: B((T)(x <= y));
    case TPURT_EW_GT: B((T)(x > y));
    case TPURT_EW_GE: B((T)(x >= y));
    case TPURT_EW_LOGICAL_AND: B((T)((x != 0) & (y != 0)));
    case TPURT_EW_LOGICAL_OR: B((T)((x != 0) | (y != 0)));
    case TPURT_EW_LOGICAL_XOR: B((T)((x != 0) ^ (y != 0)));
    case TPURT_EW_BITWISE_AND: B(x & y);
    case TPURT_EW_BITWISE_OR: B(x | y);
    case TPURT_EW_BITWISE_XOR: B(x ^ y);
    case TPURT_EW_LSHIFT: B((y < 0 || y >= 64) ? 0 : (T)((uint64_t)x << y));
    case TPURT_EW_RSHIFT: B((y < 0 || y >= 64) ? (x >> 63) : (x >> y));
    case TPURT_EW_THRESHOLD_BACKWARD: B(y <= p0 ? p1 : x);
    case TPURT_EW_SIGNBIT: U((T)(x < 0));
    case TPURT_EW_HEAVISIDE: B(x == 0 ? y : (T)(x > 0));
    case TPURT_EW_GCD: B(igcd(x, y));
    case TPURT_EW_LCM: B(ilcm(x, y));
    case TPURT_EW_WHERE: TR(x != 0 ? y : z);
    case TPURT_EW_CLAMP: TR((x >= y ? x : y) <= z ? (x >= y ? x : y) : z);
    case TPURT_EW_ADDCMUL: TR(wrap_add(x, wrap_mul(wrap_mul(p0, y), z)));
    default: break;
  }
#undef U
#undef B
#undef BDIV
#undef TR
  return bad;
}

/* ------------------------------------------------ dtype conversions */

/* Loads: X(DT, dtype, stored C type, the stored value v as compute type
 * DT) for every dtype; CONVF converts a real floating value. Stores:
 * X(CT, dtype, stored C type, the value v of compute type CT as stored,
 * before the final cast to the stored type); TOI / RE as below. */
#define CONV_F32(v) ((float)(v))
#define CONV_F64(v) ((double)(v))
#define CONV_I64(v) tpurt__f2i64((double)(v))
#define CONV_C64(v) ((float _Complex)(v))
#define CONV_C128(v) ((double _Complex)(v))
typedef float _Complex c64_t;
typedef double _Complex c128_t;

#define EW_LOAD_INTEGER(X, DT, CONVF) /* the integer and 16-bit float rows, common to both */ \
  X(DT, TPURT_BOOL, uint8_t, (DT)(v != 0))                           \
  X(DT, TPURT_U8, uint8_t, (DT)v)                                    \
  X(DT, TPURT_I8, int8_t, (DT)v)                                     \
  X(DT, TPURT_I16, int16_t, (DT)v)                                   \
  X(DT, TPURT_I32, int32_t, (DT)v)                                   \
  X(DT, TPURT_I64, int64_t, (DT)v)                                   \
  X(DT, TPURT_U16, uint16_t, (DT)v)                                  \
  X(DT, TPURT_U32, uint32_t, (DT)v)                                  \
  X(DT, TPURT_U64, uint64_t, (DT)v)                                  \
  X(DT, TPURT_F16, uint16_t, CONVF(tpurt__f16_to_f32(v)))           \
  X(DT, TPURT_BF16, uint16_t, CONVF(tpurt__bf16_to_f32(v)))

#define EW_LOAD_REAL(X, DT, CONVF)                                   \
  EW_LOAD_INTEGER(X, DT, CONVF)                                      \
  X(DT, TPURT_F32, float, CONVF(v))                                  \
  X(DT, TPURT_F64, double, CONVF(v))                                 \
  X(DT, TPURT_C64, c64_t, CONVF(crealf(v)))                          \
  X(DT, TPURT_C128, c128_t, CONVF(creal(v)))

#define EW_LOAD_CPLX(X, DT, CONVF)                                   \
  EW_LOAD_INTEGER(X, DT, CONVF)                                      \
  X(DT, TPURT_F32, float, (DT)v)                                     \
  X(DT, TPURT_F64, double, (DT)v)                                    \
  X(DT, TPURT_C64, c64_t, CONVF(v))                                  \
  X(DT, TPURT_C128, c128_t, CONVF(v))

/* float -> integer as the copy kernel does it (dtype.c: truncation; NaN and out of range -> INT64_MIN for the
 * 64-bit and uint8 targets, INT32_MIN for the others, then the low bits); TOI##_32 / TOI##_U32: the int32 and
 * uint32 conversions of the 8- to 32-bit targets */
#define F2I(v) tpurt__f2i64((double)(v))
#define F2I_32(v) ((uint32_t)tpurt__f2i32((double)(v)))
#define F2I_U32(v) tpurt__f2u32((double)(v))
#define ID_I(v) (v)
#define ID_I_32(v) ((uint32_t)(v))
#define ID_I_U32(v) ((uint32_t)(v))
#define EW_STORE_REAL(X, CT, TOI)                                    \
  X(CT, TPURT_BOOL, uint8_t, v != 0)                                 \
  X(CT, TPURT_U8, uint8_t, (uint8_t)TOI(v))                          \
  X(CT, TPURT_I8, int8_t, (int8_t)(uint8_t)TOI##_32(v))              \
  X(CT, TPURT_I16, int16_t, (int16_t)(uint16_t)TOI##_32(v))          \
  X(CT, TPURT_I32, int32_t, (int32_t)TOI##_32(v))                    \
  X(CT, TPURT_I64, int64_t, TOI(v))                                  \
  X(CT, TPURT_U16, uint16_t, (uint16_t)TOI##_32(v))                  \
  X(CT, TPURT_U32, uint32_t, TOI##_U32(v))                           \
  X(CT, TPURT_U64, uint64_t, (uint64_t)TOI(v))                       \
  X(CT, TPURT_F16, uint16_t, tpurt__f32_to_f16((float)v))            \
  X(CT, TPURT_BF16, uint16_t, tpurt__f32_to_bf16((float)v))          \
  X(CT, TPURT_F32, float, v)                                         \
  X(CT, TPURT_F64, double, v)                                        \
  X(CT, TPURT_C64, c64_t, (float)v)                                  \
  X(CT, TPURT_C128, c128_t, (double)v)

#define EW_STORE_CPLX(X, CT, RE)                                     \
  X(CT, TPURT_BOOL, uint8_t, v != 0)                                 \
  X(CT, TPURT_U8, uint8_t, (uint8_t)F2I(RE(v)))                      \
  X(CT, TPURT_I8, int8_t, (int8_t)(uint8_t)F2I_32(RE(v)))            \
  X(CT, TPURT_I16, int16_t, (int16_t)(uint16_t)F2I_32(RE(v)))        \
  X(CT, TPURT_I32, int32_t, (int32_t)F2I_32(RE(v)))                  \
  X(CT, TPURT_I64, int64_t, F2I(RE(v)))                              \
  X(CT, TPURT_U16, uint16_t, (uint16_t)F2I_32(RE(v)))                \
  X(CT, TPURT_U32, uint32_t, F2I_U32(RE(v)))                         \
  X(CT, TPURT_U64, uint64_t, (uint64_t)F2I(RE(v)))                   \
  X(CT, TPURT_F16, uint16_t, tpurt__f32_to_f16((float)RE(v)))        \
  X(CT, TPURT_BF16, uint16_t, tpurt__f32_to_bf16((float)RE(v)))      \
  X(CT, TPURT_F32, float, (float)RE(v))                              \
  X(CT, TPURT_F64, double, (double)RE(v))                            \
  X(CT, TPURT_C64, c64_t, v)                                         \
  X(CT, TPURT_C128, c128_t, v)

#endif
