/*
 * ew_complex.h — instruction loops for one complex compute type. Included by
 * elementwise.c with EW_T (float _Complex | double _Complex), EW_R (the real
 * type), EW_FN and EW_CM(f) (cexpf / cexp). Results that are real (abs,
 * comparisons, predicates) are stored with a zero imaginary part.
 */

static EW_FN_ATTR void EW_FN(const tpurt_ew_inst *I, EW_T *restrict d, const EW_T *restrict a, const EW_T *restrict b,
                  const EW_T *restrict c, int n) {
  typedef EW_T T;
  typedef EW_R R;
  const T p0 = (T)(R)I->p[0];
#include "ew_loops.h"
#define RE(x) EW_CR(creal)(x)
#define IM(x) EW_CR(cimag)(x)
  switch (I->op) {
    case TPURT_EW_NEG: U(-x);
    case TPURT_EW_ABS: U((T)EW_CR(cabs)(x));
    case TPURT_EW_SQRT: U(EW_CM(csqrt)(x));
    case TPURT_EW_RSQRT: U((T)1 / EW_CM(csqrt)(x));
    case TPURT_EW_RECIPROCAL: U((T)1 / x);
    case TPURT_EW_SQUARE: U(x * x);
    case TPURT_EW_EXP: U(EW_CM(cexp)(x));
    case TPURT_EW_LOG: U(EW_CM(clog)(x));
    case TPURT_EW_LOG2: U(EW_CM(clog)(x) / (T)(R)M_LN2);
    case TPURT_EW_LOG10: U(EW_CM(clog)(x) / (T)(R)M_LN10);
    case TPURT_EW_SIN: U(EW_CM(csin)(x));
    case TPURT_EW_COS: U(EW_CM(ccos)(x));
    case TPURT_EW_TAN: U(EW_CM(ctan)(x));
    case TPURT_EW_ASIN: U(EW_CM(casin)(x));
    case TPURT_EW_ACOS: U(EW_CM(cacos)(x));
    case TPURT_EW_ATAN: U(EW_CM(catan)(x));
    case TPURT_EW_SINH: U(EW_CM(csinh)(x));
    case TPURT_EW_COSH: U(EW_CM(ccosh)(x));
    case TPURT_EW_TANH: U(EW_CM(ctanh)(x));
    case TPURT_EW_ASINH: U(EW_CM(casinh)(x));
    case TPURT_EW_ACOSH: U(EW_CM(cacosh)(x));
    case TPURT_EW_ATANH: U(EW_CM(catanh)(x));
    case TPURT_EW_SIGMOID: U((T)1 / ((T)1 + EW_CM(cexp)(-x)));
    case TPURT_EW_SILU: U(x / ((T)1 + EW_CM(cexp)(-x)));
    case TPURT_EW_EXP2: U(EW_CM(cexp)(x * (T)(R)M_LN2));
    case TPURT_EW_EXPM1: /* exp(z) - 1 without the cancellation near 0: (expm1(a) cos b - 2 sin^2(b/2)) + i e^a sin b */
      for (int i = 0; i < n; i++) {
        R re = RE(a[i]), im = IM(a[i]), h = EW_CR(sin)(im / 2);
        d[i] = (EW_CR(expm1)(re) * EW_CR(cos)(im) - 2 * h * h) + EW_CR(exp)(re) * EW_CR(sin)(im) * (T)I_UNIT;
      }
      break;
    case TPURT_EW_LOG1P: /* log(1 + z): 1/2 log1p(2a + a^2 + b^2) + i atan2(b, 1 + a) */
      for (int i = 0; i < n; i++) {
        R re = RE(a[i]), im = IM(a[i]);
        d[i] = (R)0.5 * EW_CR(log1p)(re * (2 + re) + im * im) + EW_CR(atan2)(im, 1 + re) * (T)I_UNIT;
      }
      break;
    case TPURT_EW_NAN_TO_NUM: /* the real and imaginary parts each (p0 nan, p1 +inf, p2 -inf) */
      for (int i = 0; i < n; i++) {
        R part[2] = {RE(a[i]), IM(a[i])};
        for (int k = 0; k < 2; k++) {
          R v = part[k];
          part[k] = v != v ? (R)I->p[0] : v == (R)INFINITY ? (R)I->p[1] : v == -(R)INFINITY ? (R)I->p[2] : v;
        }
        d[i] = part[0] + part[1] * (T)I_UNIT;
      }
      break;
    case TPURT_EW_SINC: U(x == 0 ? (T)1 : EW_CM(csin)(x * (T)(R)M_PI) / (x * (T)(R)M_PI));
    case TPURT_EW_SGN: U(x == 0 ? (T)0 : x / (T)EW_CR(cabs)(x));
    case TPURT_EW_LOGICAL_NOT: U((T)(x == 0));
    case TPURT_EW_ISNAN: U((T)(RE(x) != RE(x) || IM(x) != IM(x)));
    case TPURT_EW_ISINF: U((T)(isinf(RE(x)) || isinf(IM(x))));
    case TPURT_EW_ISFINITE: U((T)(isfinite(RE(x)) && isfinite(IM(x))));
    case TPURT_EW_CAST: {
      tpurt_dtype via = (tpurt_dtype)(int)I->p[0];
      if (via == TPURT_C64) {
        U((T)(float _Complex)x);
      } else if (via == TPURT_C128) {
        U(x);
      } else {
        for (int i = 0; i < n; i++) {
          unsigned char tmp[16];
          tpurt__val v = {2, 0, 0, (double)RE(a[i]), (double)IM(a[i])};
          tpurt__store(via, tmp, v);
          tpurt__val r = tpurt__load(via, tmp);
          d[i] = (T)(R)(r.cls == 0 ? (double)r.i : r.cls == 1 ? (double)r.u : r.re) + (T)(R)r.im * (T)I_UNIT;
        }
        break;
      }
    }
    case TPURT_EW_ADD: B(x + p0 * y);
    case TPURT_EW_SUB: B(x - p0 * y);
    case TPURT_EW_MUL: B(x * y);
    case TPURT_EW_DIV: B(x / y);
    case TPURT_EW_POW: B(EW_CM(cpow)(x, y));
    case TPURT_EW_EQ: B((T)(x == y));
    case TPURT_EW_NE: B((T)(x != y));
    case TPURT_EW_LOGICAL_AND: B((T)((x != 0) & (y != 0)));
    case TPURT_EW_LOGICAL_OR: B((T)((x != 0) | (y != 0)));
    case TPURT_EW_LOGICAL_XOR: B((T)((x != 0) ^ (y != 0)));
    case TPURT_EW_WHERE: TR(x != 0 ? y : z);
    case TPURT_EW_LERP: TR(x + z * (y - x));
    case TPURT_EW_ADDCMUL: TR(x + p0 * y * z);
    case TPURT_EW_ADDCDIV: TR(x + p0 * y / z);
    case TPURT_EW_ANGLE: U((T)EW_CR(carg)(x));
    case TPURT_EW_COMPLEX: B(RE(x) + RE(y) * (T)I_UNIT);
    case TPURT_EW_POLAR: B(RE(x) * EW_CR(cos)(RE(y)) + RE(x) * EW_CR(sin)(RE(y)) * (T)I_UNIT);
    default: break;
  }
#undef U
#undef B
#undef TR
#undef RE
#undef IM
}
