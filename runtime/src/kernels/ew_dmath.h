/*
 * ew_dmath.h — float32 elementary functions the compiler vectorizes:
 * exp2, expm1, sinh, cosh, log2, log10, sin, cos, tan, atan, atan2, asin,
 * acos, pow, hypot, logaddexp(2), erfinv and an exact fmod. Each widens
 * its float arguments to double and evaluates a short polynomial (Taylor,
 * or a Chebyshev fit) after an exact or near-exact argument reduction, so
 * its result is the float nearest the function's value but for rare
 * near-ties (errors of 1e-11 relative or less before the final rounding):
 * tighter than the 1e-6 of ew_exec.h's float approximations, with no table
 * and no branch. glibc's scalar calls they replace ran at 0.05-0.25x
 * PyTorch CPU's vectorized kernels.
 *
 * Only + - * /, sqrt and explicit fma() (exactly rounded: the instruction
 * and the baseline build's libm call agree), never a contracted one
 * (-ffp-contract=off): every build variant (baseline, v3, v4) and the
 * generated kernels give the same bits. Where a loop mixed float and
 * double compares, or a float-to-int conversion, gcc kept it scalar: the
 * selects here compare in one type, and integer parts come from the
 * rounding constant.
 *
 * Three (sin / cos / tan, pow, fmod) have a range beyond which the
 * reduction is not exact; ew_*_ok says where the formula holds, and the
 * callers (ew_real.h) recompute the other elements with libm in a second
 * loop over the block, which stays out of the vectorized one.
 */
#ifndef TPURT_EW_DMATH_H
#define TPURT_EW_DMATH_H

#include <math.h>
#include <stdint.h>

typedef union {
  uint64_t u;
  double d;
} ew_dbits;
static inline double ew_d_of(uint64_t u) {
  ew_dbits c;
  c.u = u;
  return c.d;
}
static inline uint64_t ew_u_of(double d) {
  ew_dbits c;
  c.d = d;
  return c.u;
}

#define EW_D_RND 6755399441055744.0 /* 1.5 * 2^52: x + it - it rounds x to an integer (|x| < 2^51) */

/* p[0] + x (p[1] + x (...)), n coefficients (inlined with constants): a
 * chain of fmas (exact-rounding, so every variant agrees: the baseline
 * build's libm fma gives the same bits as the instruction) */
static inline double ew_dhorner(double x, const double *p, int n) {
  double r = p[n - 1];
  for (int i = n - 2; i >= 0; i--) r = fma(r, x, p[i]);
  return r;
}

/* 2^k for an integer-valued k in [-1022, 1023] held as rounded kd = k + EW_D_RND */
static inline double ew_d_pow2(double kd) { return ew_d_of((ew_u_of(kd) - ew_u_of(EW_D_RND) + 1023) << 52); }

/* e^r for |r| <= ln2 / 2: a degree-8 Chebyshev fit (error < 1e-12; e^0 = 1
 * exactly, so exp2 of an integer is exact) */
static inline double ew_d_expr(double r) {
  static const double c[9] = {1.0,
                              0.9999999999797852,
                              0.49999999999797934,
                              0.16666666891045775,
                              0.041666666890957,
                              0.008333266097949614,
                              0.0013888821677630362,
                              0.00019915866926782693,
                              2.487616402262598e-05};
  return ew_dhorner(r, c, 9);
}

/* e^x for x in [-600, 600] (callers clamp; NaN gives garbage they select away) */
static inline double ew_d_exp(double x) {
  double kd = x * 1.4426950408889634 + EW_D_RND, k = kd - EW_D_RND;
  double r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
  return ew_d_expr(r) * ew_d_pow2(kd);
}

/* 2^x for x in [-600, 600] */
static inline double ew_d_exp2(double x) {
  double kd = x + EW_D_RND, k = kd - EW_D_RND; /* x - k exact */
  return ew_d_expr((x - k) * 0.69314718055994530942) * ew_d_pow2(kd);
}

/* e^x - 1 for x in [-600, 600]: a Taylor series below |x| = 0.1 (to x^8:
 * truncation < 3e-12 relative; -0 stays -0), e^x - 1 above (the
 * cancellation costs at most a factor 10.5 of e^x's 1e-12) */
static inline double ew_d_expm1(double x) {
  static const double c[8] = {1.0, 0.5, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320};
  double small = x * ew_dhorner(x, c, 8);
  double big = ew_d_exp(x) - 1.0;
  return fabs(x) < 0.1 ? small : big;
}

static inline double ew_d_clamp(double x, double lim) { return x > lim ? lim : (x < -lim ? -lim : x); }

/* natural log of a positive, finite, normal double: x = 2^e m, m in
 * [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <=
 * 0.1716, 2 atanh(s) / s a degree-5 fit in s^2 (error < 6e-14). Returns
 * log m and e. */
static inline double ew_d_logm(double x, double *e) {
  static const double c[6] = {1.9999999999999472, 0.6666666667957926, 0.3999999489183238,
                              0.28572166145875727, 0.2217424991007749, 0.19608095639753054};
  uint64_t u = ew_u_of(x);
  /* the exponent field as a double without an int64 conversion */
  double ef = ew_d_of(0x4330000000000000ull | (u >> 52 & 0x7ff)) - 4503599627370496.0 - 1023.0;
  double m = ew_d_of((u & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  int big = m > 1.4142135623730951;
  m = big ? 0.5 * m : m;
  *e = big ? ef + 1.0 : ef;
  double s = (m - 1.0) / (m + 1.0);
  return s * ew_dhorner(s * s, c, 6);
}

/* natural log, log2 / log10 of x > 0 (widened float: always normal) */
static inline double ew_d_log(double x) {
  double e, lm = ew_d_logm(x, &e);
  return fma(e, 0.69314718055994530942, lm);
}
static inline double ew_d_log2(double x) {
  double e, lm = ew_d_logm(x, &e);
  return fma(lm, 1.4426950408889634, e);
}

/* the result of a log of a float for x <= 0, inf, NaN; r elsewhere (ew_exec.h's
 * float log too) */
static inline float ew_log_special_f(float x, float r) {
  r = x == 0 ? -INFINITY : r;
  r = x < 0 ? NAN : r;
  r = x == INFINITY ? x : r;
  return x != x ? x : r;
}

static inline float ew_log2_f(float x) {
  double xd = (x > 0) & (x < INFINITY) ? (double)x : 1.0;
  return ew_log_special_f(x, (float)ew_d_log2(xd));
}

static inline float ew_log10_f(float x) {
  double xd = (x > 0) & (x < INFINITY) ? (double)x : 1.0, e;
  double lm = ew_d_logm(xd, &e);
  return ew_log_special_f(x, (float)(e * 0.30102999566398119521 + lm * 0.43429448190325182765));
}

static inline float ew_exp2_f(float x) {
  float r = (float)ew_d_exp2(ew_d_clamp(x, 300.0));
  return x != x ? x : r;
}

static inline float ew_expm1_f(float x) {
  float r = (float)ew_d_expm1(ew_d_clamp(x, 300.0));
  return x != x ? x : r;
}

/* sinh |x| = (E + E / (E + 1)) / 2 with E = e^|x| - 1 (no cancellation near 0) */
static inline float ew_sinh_f(float x) {
  double a = ew_d_clamp(fabs((double)x), 300.0), em = ew_d_expm1(a);
  double s = 0.5 * (em + em / (em + 1.0));
  float r = (float)(x < 0 ? -s : s);
  r = x == 0 ? x : r; /* keeps -0.0 */
  return x != x ? x : r;
}

static inline float ew_cosh_f(float x) {
  double e = ew_d_exp(ew_d_clamp(fabs((double)x), 300.0));
  float r = (float)(0.5 * (e + 1.0 / e));
  return x != x ? x : r;
}

/* ---- sin, cos, tan: x = k pi/2 + r, |r| <= pi/4, pi/2 in three parts
 * (the first two of 33 bits, so k * part is exact for |k| < 2^20) */
#define EW_TRIG_LIMIT 262144.0f /* |x| below: the reduction holds; NaN, inf and beyond go to libm */
static inline int ew_trig_ok(float x) { return fabsf(x) < EW_TRIG_LIMIT; }

static inline double ew_d_trig_reduce(double x, uint64_t *q) {
  double kd = x * 0.63661977236758134308 + EW_D_RND, k = kd - EW_D_RND;
  *q = ew_u_of(kd);
  return ((x - k * 1.57079632673412561417e+00) - k * 6.077100506303966e-11) - k * 2.0222662487959506e-21;
}
/* sin r, cos r for |r| <= pi/4: degree-4 / degree-5 fits in r^2 of
 * sin(r) / r and cos r (errors < 5e-12, 6e-14) */
static inline double ew_d_sinr(double r) {
  static const double c[5] = {0.9999999999956731, -0.16666666631591165, 0.00833332878245888, -0.000198392022122311,
                              2.7173456841089953e-06};
  return r * ew_dhorner(r * r, c, 5);
}
static inline double ew_d_cosr(double r) {
  static const double c[6] = {0.9999999999999444,    -0.49999999999351113, 0.04166666654391119,
                              -0.0013888880393776424, 2.4798928755323667e-05, -2.717342984102282e-07};
  return ew_dhorner(r * r, c, 6);
}
static inline float ew_sin_f(float x) {
  uint64_t q;
  double r = ew_d_trig_reduce(ew_trig_ok(x) ? x : 0.0f, &q);
  double v = q & 1 ? ew_d_cosr(r) : ew_d_sinr(r);
  return (float)(q & 2 ? -v : v);
}
static inline float ew_cos_f(float x) {
  uint64_t q;
  double r = ew_d_trig_reduce(ew_trig_ok(x) ? x : 0.0f, &q);
  double v = q & 1 ? ew_d_sinr(r) : ew_d_cosr(r);
  return (float)((q + 1) & 2 ? -v : v);
}
static inline float ew_tan_f(float x) {
  uint64_t q;
  double r = ew_d_trig_reduce(ew_trig_ok(x) ? x : 0.0f, &q);
  double s = ew_d_sinr(r), c = ew_d_cosr(r);
  return (float)(q & 1 ? -c / s : s / c);
}

/* ---- atan of t >= 0 (inf allowed): u = 1/t above 1, then atan(u) =
 * atan(c) + atan((u - c) / (1 + u c)) for c = tan(k pi/8) nearest u
 * (|w| <= tan(pi/16)), atan(w) / w a degree-5 fit in w^2 (error < 2e-13) */
static inline double ew_d_atan_pos(double t) {
  static const double p[6] = {0.9999999999998698,  -0.33333333309629404, 0.19999992993355997,
                              -0.14284954864537447, 0.11073733059982029,  -0.08233593262356666};
  int inv = t > 1.0;
  double u = inv ? 1.0 / t : t;
  int hi = u > 0.66817863791929891999, mid = u > 0.19891236737965800691;
  double c = hi ? 1.0 : (mid ? 0.41421356237309504880 : 0.0);
  double base = hi ? 0.78539816339744830962 : (mid ? 0.39269908169872415481 : 0.0);
  double w = (u - c) / fma(u, c, 1.0);
  double a = fma(w, ew_dhorner(w * w, p, 6), base);
  return inv ? 1.57079632679489661923 - a : a;
}
static inline float ew_atan_f(float x) {
  double a = ew_d_atan_pos(fabs((double)x));
  float r = (float)(x < 0 ? -a : a);
  r = x == 0 ? x : r;
  return x != x ? x : r;
}
/* atan2(y, x): the angle of the smaller over the larger magnitude, then
 * mirrored into the quadrant; both zero or both infinite as C's atan2 */
static inline float ew_atan2_f(float y, float x) {
  double ax = fabs((double)x), ay = fabs((double)y);
  double num = ay < ax ? ay : ax, den = ay < ax ? ax : ay;
  double t = ax == ay ? (ax == 0 ? 0.0 : 1.0) : num / den;
  double r = ew_d_atan_pos(t);
  r = ay > ax ? 1.57079632679489661923 - r : r;
  r = signbit(x) ? 3.14159265358979323846 - r : r;
  float f = (float)(signbit(y) ? -r : r);
  return x != x ? x : (y != y ? y : f);
}
/* asin x = atan(x / sqrt(1 - x^2)); acos x = 2 atan(sqrt((1 - x) / (1 + x)))
 * (no cancellation at either end); |x| > 1 gives NaN through the sqrt */
static inline float ew_asin_f(float x) {
  double xd = x, s = sqrt((1.0 - xd) * (1.0 + xd));
  double a = ew_d_atan_pos(fabs(xd) / s);
  float r = (float)(x < 0 ? -a : a);
  r = s != s ? NAN : r;
  r = x == 0 ? x : r;
  return x != x ? x : r;
}
static inline float ew_acos_f(float x) {
  double xd = x, q = (1.0 - xd) / (1.0 + xd);
  float r = (float)(2.0 * ew_d_atan_pos(sqrt(q)));
  r = q < 0 ? NAN : r;
  return x != x ? x : r;
}

static inline float ew_hypot_f(float x, float y) {
  double xd = x, yd = y;
  float r = (float)sqrt(xd * xd + yd * yd);
  return (fabsf(x) == INFINITY) | (fabsf(y) == INFINITY) ? INFINITY : r;
}

/* ---- pow for finite, nonzero x and finite y: |x|^y = 2^(y log2 |x|), a
 * negative x with an integer y signed by y's parity, NaN otherwise; the
 * rest (zeros, infinities, NaN) is libm's */
static inline int ew_pow_ok(float x, float y) { return (x != 0) & (fabsf(x) < INFINITY) & (fabsf(y) < INFINITY); }
static inline float ew_pow_abs_f(float x, float y) {
  double x0 = x, y0 = y;
  int ok = (x0 != 0) & (fabs(x0) < INFINITY) & (fabs(y0) < INFINITY);
  double xd = ok ? fabs(x0) : 1.0, yd = ok ? y0 : 0.0;
  return (float)ew_d_exp2(ew_d_clamp(yd * ew_d_log2(xd), 600.0));
}
/* |x|^y = m signed for x < 0: by y's parity if y is an integer (floats of
 * magnitude >= 2^23 are, and even from 2^24), NaN if not. A second loop of
 * its own: in one loop with the magnitude, gcc vectorized neither. */
static inline float ew_pow_sign_f(float x, float y, float m) {
  float ay = fabsf(y), half = 0.5f * y;
  int is_int = (ay >= 8388608.0f) | ((y + 12582912.0f) - 12582912.0f == y);
  int odd = (ay < 16777216.0f) & is_int & ((half + 12582912.0f) - 12582912.0f != half);
  float sg = is_int ? (odd ? -1.0f : 1.0f) : NAN;
  return x < 0 ? sg * m : m;
}

/* ---- fmod of floats, exactly: q = trunc(x / y) from the rounded
 * quotient (too large by one at most, when x / y lies just below an
 * integer), r = x - q y exact in double for |q| < 2^28, then moved back by
 * |y| if its sign came out wrong; a zero takes x's sign */
static inline int ew_fmod_ok(float x, float y) {
  return (y != 0) & (fabsf(x) < INFINITY) & (fabsf(y) < INFINITY) & (fabsf(x) < 268435456.0f * fabsf(y));
}
static inline float ew_fmod_f(float x, float y) {
  double xd = x, yd = ew_fmod_ok(x, y) ? (double)y : 1.0;
  double v = xd / yd;
  /* trunc(v) for |v| < 2^28 by the rounding constant (a float-to-int
   * conversion kept the loop scalar) */
  double q = (v + EW_D_RND) - EW_D_RND;
  q = fabs(q) > fabs(v) ? q - copysign(1.0, v) : q;
  double r = xd - q * yd;
  double ay = fabs(yd);
  int wrong = (r != 0) & ((r < 0) != (xd < 0));
  r = wrong ? r + copysign(ay, xd) : r;
  r = r == 0 ? copysign(0.0, xd) : r;
  return (float)r;
}

/* log(1 + u) for u in [0, 1]: log(v) u / (v - 1) with v = 1 + u (the
 * quotient corrects v's rounding), u itself where v rounds to 1 */
static inline double ew_d_log1p01(double u) {
  double v = 1.0 + u;
  double r = ew_d_log(v) * (u / (v - 1.0));
  return v == 1.0 ? u : r;
}

/* logaddexp(x, y) = m + log(1 + e^-|x - y|) (base 2 for logaddexp2), m =
 * max(x, y), in double; NaN as x + y, two equal infinities as themselves */
static inline float ew_logaddexp_f(float x, float y, int base2) {
  double m = x >= y ? x : y, t = ew_d_clamp(-fabs((double)x - (double)y), 600.0);
  t = t != t ? 0.0 : t;
  double l = base2 ? ew_d_log1p01(ew_d_exp2(t)) * 1.4426950408889634 : ew_d_log1p01(ew_d_exp(t));
  float r = (float)(m + l);
  r = (fabsf((float)m) == INFINITY) & (x == y) ? x : r;
  return (x != x) | (y != y) ? x + y : r;
}

/* ---- erfinv: x = y p(w), w = -log((1 - y)(1 + y)), p a degree-13
 * Chebyshev fit in w - 2.5 below w = 5 and in sqrt(w) - 3 above (to
 * w = 16: the float nearest 1); errors < 3e-11 (the scheme of Giles'
 * single-precision approximation with more terms) */
static inline float ew_erfinv_f(float y) {
  static const double c1[14] = {1.5014093511310715,     0.24664027674226105,    -0.004177318042578073,
                                -0.0012527078778638292, 0.00021825108169578578, -4.996157075714713e-06,
                                -3.417409529690375e-06, 4.788011625385882e-07,  1.3782110981667457e-08,
                                -1.0897168657016768e-08, 8.198350424588279e-10, 1.2861572678730156e-10,
                                -2.0518409614330562e-11, -2.7960410484332195e-13};
  static const double c2[14] = {2.832976798731946,      1.00167527650183,       0.009445521900127605,
                                -0.007643796919676193,  0.005685175424025618,   -0.0035589022134055043,
                                0.0014838862596585,     -0.0001483567234177763, -0.00028413507380584927,
                                0.00020443662898473645, -4.3420840144571996e-05, -2.2724223010572067e-05,
                                1.785566989338426e-05,  -3.817714152402427e-06};
  double yd = y;
  double t = fabs(yd) < 1.0 ? (1.0 - yd) * (1.0 + yd) : 1.0;
  double w = -ew_d_log(t);
  double p1 = ew_dhorner(w - 2.5, c1, 14), p2 = ew_dhorner(sqrt(w) - 3.0, c2, 14);
  float r = (float)((w < 5.0 ? p1 : p2) * yd);
  r = fabsf(y) == 1.0f ? y * INFINITY : r;
  r = fabsf(y) > 1.0f ? NAN : r;
  return y != y ? y : r;
}

#endif
