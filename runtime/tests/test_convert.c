/* test_convert.c — copy_strided casts for every pair of the 15 dtypes
 * against an independent reference, plus special values: bfloat16 and half
 * rounding (ties to even), NaN, infinities, half subnormals, float->int. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;
static tpurt_devptr DA, DB;

static int is_int(int dt) {
  return dt == TPURT_U8 || dt == TPURT_I8 || dt == TPURT_I16 || dt == TPURT_I32 || dt == TPURT_I64 ||
         dt == TPURT_U16 || dt == TPURT_U32 || dt == TPURT_U64;
}
static int is_cplx(int dt) { return dt == TPURT_C64 || dt == TPURT_C128; }

/* round x to a binary format with p significand bits, min normal exponent emin, max finite m */
static double ref_round(double x, int p, int emin, double m) {
  if (x == 0 || isnan(x) || isinf(x)) return x;
  int e = ilogb(x);
  if (e < emin) e = emin;
  double ulp = ldexp(1.0, e - (p - 1));
  double r = nearbyint(x / ulp) * ulp;
  if (fabs(r) > m) return copysign(INFINITY, x);
  return r;
}
static double r_f16(double x) { return ref_round(x, 11, -14, 65504.0); }
static double r_bf16(double x) { return ref_round(x, 8, -126, ldexp(255.0, 120)); }

/* exact encoders for representable values (test side) */
static uint16_t enc_f16(double x) {
  if (isnan(x)) return 0x7e00;
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  x = fabs(x);
  if (isinf(x)) return sign | 0x7c00;
  if (x == 0) return sign;
  int e = ilogb(x);
  if (e < -14) return sign | (uint16_t)(x / ldexp(1.0, -24));
  uint16_t mant = (uint16_t)((x / ldexp(1.0, e) - 1.0) * 1024.0);
  return sign | (uint16_t)((e + 15) << 10) | mant;
}
static double dec_f16(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}
static uint16_t enc_bf16(double x) {
  float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static double dec_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

typedef struct {
  int isint;
  int64_t k; /* integer held (u64 as bits) */
  int uns;
  double re, im;
} held;

static void encode(int dt, unsigned char *p, double re, double im) {
  int64_t k = (int64_t)re;
  switch (dt) {
    case TPURT_BOOL: p[0] = re != 0; break;
    case TPURT_U8: *(uint8_t *)p = (uint8_t)k; break;
    case TPURT_I8: *(int8_t *)p = (int8_t)k; break;
    case TPURT_I16: *(int16_t *)p = (int16_t)k; break;
    case TPURT_I32: *(int32_t *)p = (int32_t)k; break;
    case TPURT_I64: *(int64_t *)p = k; break;
    case TPURT_U16: *(uint16_t *)p = (uint16_t)k; break;
    case TPURT_U32: *(uint32_t *)p = (uint32_t)k; break;
    case TPURT_U64: *(uint64_t *)p = (uint64_t)k; break;
    case TPURT_F16: *(uint16_t *)p = enc_f16(re); break;
    case TPURT_BF16: *(uint16_t *)p = enc_bf16(re); break;
    case TPURT_F32: *(float *)p = (float)re; break;
    case TPURT_F64: *(double *)p = re; break;
    case TPURT_C64: ((float *)p)[0] = (float)re; ((float *)p)[1] = (float)im; break;
    case TPURT_C128: ((double *)p)[0] = re; ((double *)p)[1] = im; break;
  }
}

static held decode(int dt, const unsigned char *p) {
  held h = {0, 0, 0, 0, 0};
  h.isint = 1;
  switch (dt) {
    case TPURT_BOOL: h.k = p[0]; break;
    case TPURT_U8: h.k = *(const uint8_t *)p; break;
    case TPURT_I8: h.k = *(const int8_t *)p; break;
    case TPURT_I16: h.k = *(const int16_t *)p; break;
    case TPURT_I32: h.k = *(const int32_t *)p; break;
    case TPURT_I64: h.k = *(const int64_t *)p; break;
    case TPURT_U16: h.k = *(const uint16_t *)p; break;
    case TPURT_U32: h.k = *(const uint32_t *)p; break;
    case TPURT_U64: h.k = (int64_t) * (const uint64_t *)p; h.uns = 1; break;
    default: h.isint = 0;
  }
  switch (dt) {
    case TPURT_F16: h.re = dec_f16(*(const uint16_t *)p); break;
    case TPURT_BF16: h.re = dec_bf16(*(const uint16_t *)p); break;
    case TPURT_F32: h.re = *(const float *)p; break;
    case TPURT_F64: h.re = *(const double *)p; break;
    case TPURT_C64: h.re = ((const float *)p)[0]; h.im = ((const float *)p)[1]; break;
    case TPURT_C128: h.re = ((const double *)p)[0]; h.im = ((const double *)p)[1]; break;
    default: h.re = h.uns ? (double)(uint64_t)h.k : (double)h.k;
  }
  return h;
}

/* reference: expected value of dst dtype for a held source value, as held */
static held expect(int ddt, held s) {
  unsigned char buf[16] = {0};
  if (ddt == TPURT_BOOL) {
    buf[0] = s.isint ? s.k != 0 : (s.re != 0 || s.im != 0);
  } else if (is_int(ddt)) {
    int64_t k = s.isint ? s.k : (int64_t)trunc(s.re);
    switch (ddt) {
      case TPURT_U8: *(uint8_t *)buf = (uint8_t)k; break;
      case TPURT_I8: *(int8_t *)buf = (int8_t)k; break;
      case TPURT_I16: *(int16_t *)buf = (int16_t)k; break;
      case TPURT_I32: *(int32_t *)buf = (int32_t)k; break;
      case TPURT_I64: *(int64_t *)buf = k; break;
      case TPURT_U16: *(uint16_t *)buf = (uint16_t)k; break;
      case TPURT_U32: *(uint32_t *)buf = (uint32_t)k; break;
      case TPURT_U64: *(uint64_t *)buf = (uint64_t)k; break;
    }
  } else {
    double f32v = s.isint ? (s.uns ? (double)(float)(uint64_t)s.k : (double)(float)s.k) : (double)(float)s.re;
    double f64v = s.isint ? (s.uns ? (double)(uint64_t)s.k : (double)s.k) : s.re;
    double im = is_cplx(ddt) ? s.im : 0;
    switch (ddt) {
      case TPURT_F16: *(uint16_t *)buf = enc_f16(r_f16(f32v)); break;
      case TPURT_BF16: *(uint16_t *)buf = enc_bf16(r_bf16(f32v)); break;
      case TPURT_F32: *(float *)buf = (float)f32v; break;
      case TPURT_F64: *(double *)buf = f64v; break;
      case TPURT_C64: ((float *)buf)[0] = (float)f32v; ((float *)buf)[1] = (float)im; break;
      case TPURT_C128: ((double *)buf)[0] = f64v; ((double *)buf)[1] = im; break;
    }
  }
  return decode(ddt, buf);
}

static int same(held a, held b) {
  if (a.isint != b.isint) return 0;
  if (a.isint) return a.k == b.k;
  int ra = (a.re == b.re && signbit(a.re) == signbit(b.re)) || (isnan(a.re) && isnan(b.re));
  int ia = a.im == b.im || (isnan(a.im) && isnan(b.im));
  return ra && ia;
}

static tpurt_view v1(tpurt_devptr p, tpurt_dtype dt, int64_t n, int64_t st) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p;
  v.dtype = dt;
  v.ndim = 1;
  v.sizes[0] = n;
  v.strides[0] = st;
  return v;
}

/* copy n elements src(dt) -> dst(dt2) on device; reversed if rev */
static void dev_cast(int sdt, const void *src, int ddt, void *dst, int n, int rev) {
  size_t ss = tpurt_dtype_size((tpurt_dtype)sdt), ds = tpurt_dtype_size((tpurt_dtype)ddt);
  CHECK_OK(tpurt_memcpy_h2d(S, DA, src, n * ss, 0));
  tpurt_view sv = rev ? v1(DA + (n - 1) * ss, (tpurt_dtype)sdt, n, -1) : v1(DA, (tpurt_dtype)sdt, n, 1);
  tpurt_view dv = v1(DB, (tpurt_dtype)ddt, n, 1);
  CHECK_OK(tpurt_copy_strided(S, &dv, &sv));
  CHECK_OK(tpurt_memcpy_d2h(S, dst, DB, n * ds, 0));
}

static const double VALS[] = {0, 1, -1, 2.5, -2.5, 100, 127, -128, 3.75, 0.5, 65, -0.75, 250};
#define NV ((int)(sizeof VALS / sizeof VALS[0]))

static void all_pairs(void) {
  int bad = 0;
  for (int sdt = 0; sdt < TPURT_NUM_DTYPES; sdt++) {
    unsigned char src[NV * 16];
    size_t ss = tpurt_dtype_size((tpurt_dtype)sdt);
    for (int i = 0; i < NV; i++) encode(sdt, src + i * ss, VALS[i], is_cplx(sdt) ? (i % 3) * 0.5 : 0);
    for (int ddt = 0; ddt < TPURT_NUM_DTYPES; ddt++) {
      size_t ds = tpurt_dtype_size((tpurt_dtype)ddt);
      for (int rev = 0; rev < 2; rev++) {
        unsigned char dst[NV * 16];
        dev_cast(sdt, src, ddt, dst, NV, rev);
        for (int i = 0; i < NV; i++) {
          int si = rev ? NV - 1 - i : i;
          held want = expect(ddt, decode(sdt, src + si * ss));
          held got = decode(ddt, dst + i * ds);
          if (!same(want, got)) {
            if (bad++ < 20)
              fprintf(stderr, "cast %s -> %s of %g (rev %d): got (%lld, %g, %g) want (%lld, %g, %g)\n",
                      tpurt_dtype_name((tpurt_dtype)sdt), tpurt_dtype_name((tpurt_dtype)ddt), VALS[si], rev,
                      (long long)got.k, got.re, got.im, (long long)want.k, want.re, want.im);
          }
        }
      }
    }
  }
  CHECK_EQ(bad, 0);
}

static float fbits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t bitsf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static void specials(void) {
  /* f32 -> bf16 */
  uint32_t fb[] = {0x3F808000u, 0x3F818000u, 0x3F808001u, 0x7F800000u, 0x7F7FFFFFu, 0x80000000u, 0x00000001u,
                   0x7FC00001u, 0xFF800001u, 0x3F80FFFFu};
  uint16_t wantb[] = {0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7F80, 0x8000, 0x0000, 0, 0, 0x3F81};
  float f[10];
  uint16_t out[16];
  for (int i = 0; i < 10; i++) f[i] = fbits(fb[i]);
  dev_cast(TPURT_F32, f, TPURT_BF16, out, 10, 0);
  for (int i = 0; i < 7; i++) CHECK_EQ(out[i], wantb[i]);
  CHECK_EQ(out[9], wantb[9]);
  CHECK((out[7] & 0x7F80) == 0x7F80 && (out[7] & 0x7F) != 0 && !(out[7] & 0x8000)); /* NaN kept */
  CHECK((out[8] & 0x7F80) == 0x7F80 && (out[8] & 0x7F) != 0 && (out[8] & 0x8000));   /* sNaN -> NaN */
  /* f32 -> f16 */
  float hf[] = {65504.0f, 65519.0f, 65520.0f, ldexpf(1, -24), ldexpf(1, -25), 1.5f * ldexpf(1, -24),
                2.5f * ldexpf(1, -24), ldexpf(1, -14), 1.0f + ldexpf(1, -11), 1.0f + 3 * ldexpf(1, -11),
                -INFINITY, 1e-10f, -1e-10f, NAN, ldexpf(1023, -24), 0.1f};
  uint16_t wanth[] = {0x7BFF, 0x7BFF, 0x7C00, 0x0001, 0x0000, 0x0002, 0x0002, 0x0400,
                      0x3C00, 0x3C02, 0xFC00, 0x0000, 0x8000, 0,      0x03FF, 0x2E66};
  dev_cast(TPURT_F32, hf, TPURT_F16, out, 16, 0);
  for (int i = 0; i < 16; i++)
    if (i != 13) CHECK_EQ(out[i], wanth[i]);
  CHECK((out[13] & 0x7C00) == 0x7C00 && (out[13] & 0x3FF) != 0);
  /* f16 -> f32 */
  uint16_t hv[] = {0x0001, 0x03FF, 0x7C00, 0xFE00, 0x8000, 0x7BFF, 0x3C00, 0xC000, 0x0400};
  float fo[9];
  dev_cast(TPURT_F16, hv, TPURT_F32, fo, 9, 0);
  CHECK(fo[0] == ldexpf(1, -24));
  CHECK(fo[1] == ldexpf(1023, -24));
  CHECK(isinf(fo[2]) && fo[2] > 0);
  CHECK(isnan(fo[3]));
  CHECK(fo[4] == 0 && signbit(fo[4]));
  CHECK(fo[5] == 65504.0f && fo[6] == 1.0f && fo[7] == -2.0f && fo[8] == ldexpf(1, -14));
  /* f16 -> f64 (generic path) subnormal */
  double dd[1];
  dev_cast(TPURT_F16, hv, TPURT_F64, dd, 1, 0);
  CHECK(dd[0] == ldexp(1, -24));
  /* bf16 NaN -> f32 NaN; bf16 -> f16 rounding via float */
  uint16_t bn[2] = {0x7FC1, 0x3F81};
  dev_cast(TPURT_BF16, bn, TPURT_F32, fo, 2, 0);
  CHECK(isnan(fo[0]));
  CHECK(fo[1] == 1.0078125f);
  /* float -> int: truncation; NaN and out of range -> INT64_MIN for int64 (and uint8: its low bits), INT32_MIN
   * for the 8- to 32-bit targets (then their low bits), as PyTorch's CPU backend converts on x86 */
  float fi[] = {NAN, 1e30f, -3.9f, 3.9f, -INFINITY};
  int64_t io[5];
  int32_t i32o[5];
  dev_cast(TPURT_F32, fi, TPURT_I64, io, 5, 0);
  CHECK(io[0] == INT64_MIN);
  CHECK(io[1] == INT64_MIN);
  CHECK_EQ(io[2], -3);
  CHECK_EQ(io[3], 3);
  CHECK(io[4] == INT64_MIN);
  dev_cast(TPURT_F32, fi, TPURT_I32, i32o, 5, 0);
  CHECK_EQ(i32o[0], INT32_MIN);
  CHECK_EQ(i32o[1], INT32_MIN);
  CHECK_EQ(i32o[2], -3);
  CHECK_EQ(i32o[4], INT32_MIN);
  int16_t i16o[5];
  dev_cast(TPURT_F32, fi, TPURT_I16, i16o, 5, 0);
  CHECK_EQ(i16o[1], 0); /* INT32_MIN's low bits, not 1e30's */
  CHECK_EQ(i16o[2], -3);
  double di[] = {3e9, 1.5e19, -1.0, NAN};
  int32_t o32[4];
  uint64_t o64[4];
  uint8_t o8[4];
  unsigned char ob[4];
  dev_cast(TPURT_F64, di, TPURT_I32, o32, 4, 0);
  CHECK_EQ(o32[0], INT32_MIN);
  uint32_t u32[4];
  dev_cast(TPURT_F64, di, TPURT_U32, u32, 4, 0);
  CHECK(u32[0] == 3000000000u && u32[1] == 0 && u32[2] == UINT32_MAX && u32[3] == 0x80000000u);
  dev_cast(TPURT_F64, di, TPURT_U64, o64, 4, 0);
  CHECK(o64[1] == 15000000000000000000ull);
  CHECK(o64[2] == UINT64_MAX);
  CHECK(o64[3] == 0);
  dev_cast(TPURT_F64, di, TPURT_U8, o8, 4, 0);
  CHECK_EQ(o8[2], 255);
  dev_cast(TPURT_F64, di, TPURT_BOOL, ob, 4, 0);
  CHECK(ob[0] == 1 && ob[2] == 1 && ob[3] == 1); /* NaN != 0 */
  /* f64 -> f32 ties to even; int64 -> f32 rounding */
  double dr[] = {1.0 + ldexp(1, -24), 1.0 + 3 * ldexp(1, -24)};
  dev_cast(TPURT_F64, dr, TPURT_F32, fo, 2, 0);
  CHECK(bitsf(fo[0]) == bitsf(1.0f));
  CHECK(fo[1] == 1.0f + ldexpf(1, -22));
  int64_t ii[] = {(1 << 24) + 1, INT64_MAX};
  dev_cast(TPURT_I64, ii, TPURT_F32, fo, 2, 0);
  CHECK(fo[0] == 16777216.0f);
  CHECK(fo[1] == 9223372036854775808.0f);
  /* uint64 above INT64_MAX -> double, int64 -> uint64 keeps bits */
  uint64_t big[] = {18446744073709551615ull, 9223372036854775808ull};
  dev_cast(TPURT_U64, big, TPURT_F64, dd, 1, 0);
  CHECK(dd[0] == 18446744073709551616.0);
  int64_t neg[] = {-2};
  dev_cast(TPURT_I64, neg, TPURT_U64, o64, 1, 0);
  CHECK(o64[0] == UINT64_MAX - 1);
  /* complex -> real takes the real part; complex -> bool uses both parts */
  float cz[4] = {0.0f, 0.5f, 2.0f, 0.0f};
  dev_cast(TPURT_C64, cz, TPURT_BOOL, ob, 2, 0);
  CHECK(ob[0] == 1 && ob[1] == 1);
  dev_cast(TPURT_C64, cz, TPURT_F32, fo, 2, 0);
  CHECK(fo[0] == 0.0f && fo[1] == 2.0f);
  /* bool source */
  unsigned char bs[2] = {0, 1};
  dev_cast(TPURT_BOOL, bs, TPURT_F32, fo, 2, 0);
  CHECK(fo[0] == 0.0f && fo[1] == 1.0f);
}

int main(void) {
  CHECK_OK(tpurt_stream_default(0, &S));
  CHECK_OK(tpurt_malloc(0, 4096, S, &DA));
  CHECK_OK(tpurt_malloc(0, 4096, S, &DB));
  all_pairs();
  specials();
  CHECK_OK(tpurt_free(DA));
  CHECK_OK(tpurt_free(DB));
  TEST_MAIN_END();
}
