#define _GNU_SOURCE
/* test_gemm.c — tpurt_gemm against a naive double reference: plain,
 * transposed, strided and broadcast-batch views, alpha/beta (beta 0 ignores
 * NaN), f64, f16/bf16 operands (f32 or rounded output), integers (wrapping),
 * precision modes, empty shapes and errors. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static uint16_t to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static float bf16r(float f) { return from_bf16(to_bf16(f)); }

/* A host matrix batch described by strides, stored in dtype dt. */
typedef struct {
  tpurt_dtype dt;
  int64_t sz[3], st[3];
  int64_t span; /* elements to allocate */
  void *h;
  tpurt_devptr d;
} dmat;

static void dmat_init(dmat *m, tpurt_dtype dt, int64_t b, int64_t r, int64_t c, int64_t sb, int64_t sr, int64_t sc) {
  memset(m, 0, sizeof *m);
  m->dt = dt;
  m->sz[0] = b, m->sz[1] = r, m->sz[2] = c;
  m->st[0] = sb, m->st[1] = sr, m->st[2] = sc;
  m->span = 1 + (b - 1) * sb + (r - 1) * sr + (c - 1) * sc;
  if (b == 0 || r == 0 || c == 0) m->span = 1;
  m->h = calloc((size_t)m->span, 8);
  CHECK_OK(tpurt_malloc(0, (size_t)m->span * 8, S, &m->d));
}
static void dmat_free(dmat *m) {
  free(m->h);
  tpurt_free(m->d);
}
static double get(const dmat *m, int64_t b, int64_t i, int64_t j) {
  int64_t o = b * m->st[0] + i * m->st[1] + j * m->st[2];
  switch (m->dt) {
    case TPURT_F32: return ((float *)m->h)[o];
    case TPURT_F64: return ((double *)m->h)[o];
    case TPURT_BF16: return from_bf16(((uint16_t *)m->h)[o]);
    case TPURT_I32: return ((int32_t *)m->h)[o];
    case TPURT_U8: return ((uint8_t *)m->h)[o];
    default: return 0;
  }
}
static void set(dmat *m, int64_t b, int64_t i, int64_t j, double v) {
  int64_t o = b * m->st[0] + i * m->st[1] + j * m->st[2];
  switch (m->dt) {
    case TPURT_F32: ((float *)m->h)[o] = (float)v; break;
    case TPURT_F64: ((double *)m->h)[o] = v; break;
    case TPURT_BF16: ((uint16_t *)m->h)[o] = to_bf16((float)v); break;
    case TPURT_I32: ((int32_t *)m->h)[o] = (int32_t)(int64_t)v; break;
    case TPURT_U8: ((uint8_t *)m->h)[o] = (uint8_t)(int64_t)v; break;
    default: break;
  }
}
static void fill(dmat *m, unsigned seed, int ints) {
  for (int64_t b = 0; b < m->sz[0]; b++)
    for (int64_t i = 0; i < m->sz[1]; i++)
      for (int64_t j = 0; j < m->sz[2]; j++) {
        seed = seed * 1103515245u + 12345u;
        double v = ints ? (double)((seed >> 16) % 200) - 100 : ((seed >> 8) % 100000) / 50000.0 - 1.0;
        set(m, b, i, j, v);
      }
}
static void up(dmat *m) { CHECK_OK(tpurt_memcpy_h2d(S, m->d, m->h, (size_t)m->span * tpurt_dtype_size(m->dt), 0)); }
static void down(dmat *m) { CHECK_OK(tpurt_memcpy_d2h(S, m->h, m->d, (size_t)m->span * tpurt_dtype_size(m->dt), 0)); }
static tpurt_view vw(const dmat *m) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = m->d;
  v.dtype = m->dt;
  v.ndim = 3;
  for (int k = 0; k < 3; k++) v.sizes[k] = m->sz[k], v.strides[k] = m->st[k];
  return v;
}

/* Runs gemm and compares with a double reference; returns max abs error. */
static double run_check(dmat *c, dmat *a, dmat *b, double alpha, double beta, tpurt_precision prec, double tol) {
  int64_t B = c->sz[0], M = c->sz[1], N = c->sz[2], K = a->sz[2];
  double *ref = malloc(sizeof(double) * (size_t)(B * M * N + 1));
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += get(a, bi, i, k) * get(b, bi, k, j);
        ref[(bi * M + i) * N + j] = alpha * s + (beta == 0 ? 0 : beta * get(c, bi, i, j));
      }
  up(a);
  up(b);
  up(c);
  tpurt_view cv = vw(c), av = vw(a), bv = vw(b);
  CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, alpha, beta, prec));
  CHECK_OK(tpurt_stream_synchronize(S));
  down(c);
  double err = 0;
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double e = fabs(get(c, bi, i, j) - ref[(bi * M + i) * N + j]);
        if (!(e <= err)) err = e; /* NaN sticks */
      }
  free(ref);
  if (tol > 0 && !(err <= tol)) {
    fprintf(stderr, "gemm error %g > %g (B%lld M%lld N%lld K%lld)\n", err, tol, (long long)B, (long long)M,
            (long long)N, (long long)K);
    g_failures++;
  }
  return err;
}

static void test_layouts(void) {
  const int64_t B = 3, M = 37, N = 29, K = 53;
  for (int ca = 0; ca < 3; ca++)
    for (int cb = 0; cb < 3; cb++)
      for (int cc = 0; cc < 3; cc++) {
        dmat a, b, c;
        /* 0 row-major, 1 transposed (column-major), 2 general strides */
        if (ca == 0) dmat_init(&a, TPURT_F32, B, M, K, M * K, K, 1);
        else if (ca == 1) dmat_init(&a, TPURT_F32, B, M, K, M * K, 1, M);
        else dmat_init(&a, TPURT_F32, B, M, K, 3 * M * K, 3 * K, 2);
        if (cb == 0) dmat_init(&b, TPURT_F32, B, K, N, 0, N, 1); /* broadcast batch */
        else if (cb == 1) dmat_init(&b, TPURT_F32, B, K, N, K * N, 1, K);
        else dmat_init(&b, TPURT_F32, B, K, N, 0, 2 * N + 1, 2);
        if (cc == 0) dmat_init(&c, TPURT_F32, B, M, N, M * N, N, 1);
        else if (cc == 1) dmat_init(&c, TPURT_F32, B, M, N, M * N, 1, M);
        else dmat_init(&c, TPURT_F32, B, M, N, 2 * M * N, 2 * N, 2);
        fill(&a, 1 + ca, 0);
        fill(&b, 7 + cb, 0);
        fill(&c, 13, 0);
        run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST, 1e-4);
        run_check(&c, &a, &b, 1.5, -0.5, TPURT_PRECISION_HIGHEST, 1e-4);
        dmat_free(&a);
        dmat_free(&b);
        dmat_free(&c);
      }
}

static void test_beta_zero_ignores_nan(void) {
  dmat a, b, c;
  dmat_init(&a, TPURT_F32, 1, 8, 8, 64, 8, 1);
  dmat_init(&b, TPURT_F32, 1, 8, 8, 64, 8, 1);
  dmat_init(&c, TPURT_F32, 1, 8, 8, 64, 1, 8);
  fill(&a, 3, 0);
  fill(&b, 4, 0);
  for (int i = 0; i < 64; i++) ((float *)c.h)[i] = NAN;
  run_check(&c, &a, &b, 2.0, 0.0, TPURT_PRECISION_HIGHEST, 1e-5);
  /* NaN in an operand propagates */
  ((float *)a.h)[0] = NAN;
  up(&a);
  tpurt_view cv = vw(&c), av = vw(&a), bv = vw(&b);
  CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_HIGHEST));
  down(&c);
  CHECK(isnan(((float *)c.h)[0]));
  CHECK(!isnan(((float *)c.h)[8 * 1 + 1])); /* row 1, col 1 (c is column-major) */
  dmat_free(&a);
  dmat_free(&b);
  dmat_free(&c);
}

static void test_f64_and_half(void) {
  dmat a, b, c;
  dmat_init(&a, TPURT_F64, 2, 20, 30, 600, 1, 20);
  dmat_init(&b, TPURT_F64, 2, 30, 10, 300, 10, 1);
  dmat_init(&c, TPURT_F64, 2, 20, 10, 200, 10, 1);
  fill(&a, 5, 0);
  fill(&b, 6, 0);
  fill(&c, 7, 0);
  run_check(&c, &a, &b, 0.5, 2.0, TPURT_PRECISION_DEFAULT /* ignored for f64 */, 1e-12);
  dmat_free(&a);
  dmat_free(&b);
  dmat_free(&c);
  /* bf16 operands, bf16 output (rounded once) and f32 output */
  dmat_init(&a, TPURT_BF16, 2, 16, 40, 640, 40, 1);
  dmat_init(&b, TPURT_BF16, 2, 40, 12, 480, 1, 40);
  dmat_init(&c, TPURT_BF16, 2, 16, 12, 192, 12, 1);
  fill(&a, 8, 0);
  fill(&b, 9, 0);
  fill(&c, 10, 0);
  run_check(&c, &a, &b, 1.0, 1.0, TPURT_PRECISION_HIGHEST, 0.06);
  dmat c32;
  dmat_init(&c32, TPURT_F32, 2, 16, 12, 192, 12, 1);
  run_check(&c32, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST, 1e-4);
  dmat_free(&a);
  dmat_free(&b);
  dmat_free(&c);
  dmat_free(&c32);
}

static void test_int(void) {
  dmat a, b, c;
  dmat_init(&a, TPURT_I32, 2, 9, 300, 2700, 300, 1);
  dmat_init(&b, TPURT_I32, 2, 300, 7, 0, 1, 300);
  dmat_init(&c, TPURT_I32, 2, 9, 7, 63, 7, 1);
  fill(&a, 11, 1);
  fill(&b, 12, 1);
  fill(&c, 13, 1);
  run_check(&c, &a, &b, 2, 3, TPURT_PRECISION_HIGHEST, 0.5);
  dmat_free(&a);
  dmat_free(&b);
  dmat_free(&c);
  /* uint8 wraps modulo 256 */
  dmat_init(&a, TPURT_U8, 1, 1, 2, 2, 2, 1);
  dmat_init(&b, TPURT_U8, 1, 2, 1, 2, 1, 1);
  dmat_init(&c, TPURT_U8, 1, 1, 1, 1, 1, 1);
  set(&a, 0, 0, 0, 200), set(&a, 0, 0, 1, 100), set(&b, 0, 0, 0, 2), set(&b, 0, 1, 0, 3);
  up(&a), up(&b);
  tpurt_view cv = vw(&c), av = vw(&a), bv = vw(&b);
  CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, 1, 0, TPURT_PRECISION_HIGHEST));
  down(&c);
  CHECK_EQ(((uint8_t *)c.h)[0], (200 * 2 + 100 * 3) % 256);
  dmat_free(&a);
  dmat_free(&b);
  dmat_free(&c);
}

static void test_precision(void) {
  const int64_t M = 64, N = 48, K = 256;
  dmat a, b, c;
  dmat_init(&a, TPURT_F32, 1, M, K, M * K, K, 1);
  dmat_init(&b, TPURT_F32, 1, K, N, K * N, N, 1);
  dmat_init(&c, TPURT_F32, 1, M, N, M * N, N, 1);
  fill(&a, 21, 0);
  fill(&b, 22, 0);
  double e_highest = run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST, 1e-4);
  double e_high = run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGH, 1e-3);
  double e_default = run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_DEFAULT, 0.5);
  CHECK(e_default > 1e-3);           /* 1-pass bf16 loses ~8 bits */
  CHECK(e_high < e_default / 50);    /* 3-pass is close to f32 */
  CHECK(e_highest <= e_high * 4 + 1e-6);
  /* DEFAULT equals an f32 product of the bf16-rounded operands */
  dmat ar, br;
  dmat_init(&ar, TPURT_F32, 1, M, K, M * K, K, 1);
  dmat_init(&br, TPURT_F32, 1, K, N, K * N, N, 1);
  for (int64_t i = 0; i < M * K; i++) ((float *)ar.h)[i] = bf16r(((float *)a.h)[i]);
  for (int64_t i = 0; i < K * N; i++) ((float *)br.h)[i] = bf16r(((float *)b.h)[i]);
  up(&a), up(&b);
  tpurt_view cv = vw(&c), av = vw(&a), bv = vw(&b);
  CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_DEFAULT));
  down(&c);
  float *got = malloc(sizeof(float) * M * N);
  memcpy(got, c.h, sizeof(float) * M * N);
  run_check(&c, &ar, &br, 1.0, 0.0, TPURT_PRECISION_HIGHEST, 1e-4);
  double d = 0;
  for (int64_t i = 0; i < M * N; i++) d = fmax(d, fabs(got[i] - ((float *)c.h)[i]));
  CHECK(d < 1e-4);
  free(got);
  dmat_free(&a), dmat_free(&b), dmat_free(&c), dmat_free(&ar), dmat_free(&br);
}

static void test_edges(void) {
  dmat a, b, c;
  /* K = 0: c = beta * c */
  dmat_init(&a, TPURT_F32, 1, 4, 0, 0, 1, 1);
  dmat_init(&b, TPURT_F32, 1, 0, 5, 0, 5, 1);
  dmat_init(&c, TPURT_F32, 1, 4, 5, 20, 5, 1);
  fill(&c, 3, 0);
  run_check(&c, &a, &b, 1.0, 0.5, TPURT_PRECISION_HIGHEST, 1e-6);
  for (int i = 0; i < 20; i++) ((float *)c.h)[i] = NAN;
  run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_DEFAULT, 1e-6);
  { /* empty operands may carry a null device address */
    tpurt_view cv = vw(&c), av = vw(&a), bv = vw(&b);
    av.ptr = bv.ptr = 0;
    CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, 1.0, 2.0, TPURT_PRECISION_HIGHEST));
    CHECK_OK(tpurt_stream_synchronize(S));
    av.dtype = bv.dtype = cv.dtype = TPURT_I32;
    CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, 1.0, 2.0, TPURT_PRECISION_HIGHEST));
    CHECK_OK(tpurt_stream_synchronize(S));
  }
  dmat_free(&a), dmat_free(&b), dmat_free(&c);
  /* size-1 dims with odd strides, M = 0 */
  dmat_init(&a, TPURT_F32, 2, 1, 6, 6, 999, 1);
  dmat_init(&b, TPURT_F32, 2, 6, 1, 6, 1, 777);
  dmat_init(&c, TPURT_F32, 2, 1, 1, 1, 5, 3);
  fill(&a, 1, 0), fill(&b, 2, 0);
  run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST, 1e-5);
  tpurt_view cv = vw(&c), av = vw(&a), bv = vw(&b);
  cv.sizes[1] = av.sizes[1] = 0;
  CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_HIGHEST));
  /* errors */
  cv = vw(&c), av = vw(&a), bv = vw(&b);
  bv.sizes[1] = 5;
  CHECK_ST(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_HIGHEST), TPURT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tpurt_last_error(), "shapes cannot be multiplied") != NULL);
  bv = vw(&b);
  bv.dtype = TPURT_F64;
  CHECK_ST(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_HIGHEST), TPURT_ERR_INVALID_ARGUMENT);
  av.dtype = bv.dtype = cv.dtype = TPURT_BOOL;
  CHECK_ST(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_HIGHEST), TPURT_ERR_NOT_SUPPORTED);
  av = vw(&a);
  av.ndim = 2;
  CHECK_ST(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_HIGHEST), TPURT_ERR_INVALID_ARGUMENT);
  /* a failing view's message names the operand: "gemm (b)" for a bad
   * view, "gemm (output)" for a range outside the device's memory */
  cv = vw(&c), av = vw(&a), bv = vw(&b);
  bv.sizes[2] = -1;
  CHECK_ST(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_HIGHEST), TPURT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tpurt_last_error(), "gemm (b)") != NULL);
  bv = vw(&b);
  cv.strides[0] = (int64_t)1 << 40;
  CHECK_ST(tpurt_gemm(S, &cv, &av, &bv, 1.0, 0.0, TPURT_PRECISION_HIGHEST), TPURT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tpurt_last_error(), "gemm (output)") != NULL);
  CHECK_OK(tpurt_stream_synchronize(S));
  dmat_free(&a), dmat_free(&b), dmat_free(&c);
}

static void test_large_parallel(void) {
  /* big enough for the library's threads and the parallel packing */
  const int64_t M = 300, N = 260, K = 280;
  dmat a, b, c;
  dmat_init(&a, TPURT_BF16, 1, M, K, M * K, 1, M);
  dmat_init(&b, TPURT_BF16, 1, K, N, K * N, N, 1);
  dmat_init(&c, TPURT_F32, 1, M, N, M * N, N, 1);
  fill(&a, 31, 0), fill(&b, 32, 0);
  run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST, 1e-3);
  dmat_free(&a), dmat_free(&b), dmat_free(&c);
}

/* Products large enough to be cut into tiles on the pool (ragged edges,
 * batch x rows x columns, transposed operands and output, broadcast
 * batch, packed precision modes). */
static void test_tiled(void) {
  const int64_t B = 5, M = 203, N = 141, K = 97;
  for (int ca = 0; ca < 2; ca++)
    for (int cb = 0; cb < 3; cb++)
      for (int cc = 0; cc < 2; cc++) {
        dmat a, b, c;
        if (ca == 0) dmat_init(&a, TPURT_F32, B, M, K, M * K, K, 1);
        else dmat_init(&a, TPURT_F32, B, M, K, M * K, 1, M);
        if (cb == 0) dmat_init(&b, TPURT_F32, B, K, N, 0, N, 1);
        else if (cb == 1) dmat_init(&b, TPURT_F32, B, K, N, K * N, 1, K);
        else dmat_init(&b, TPURT_F32, B, K, N, K * N, N, 1);
        if (cc == 0) dmat_init(&c, TPURT_F32, B, M, N, M * N, N, 1);
        else dmat_init(&c, TPURT_F32, B, M, N, M * N, 1, M);
        fill(&a, 41 + ca, 0), fill(&b, 43 + cb, 0), fill(&c, 47, 0);
        run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST, 1e-3);
        run_check(&c, &a, &b, 0.5, 2.0, TPURT_PRECISION_HIGHEST, 1e-3);
        dmat_free(&a), dmat_free(&b), dmat_free(&c);
      }
  dmat a, b, c;
  dmat_init(&a, TPURT_F32, 1, 517, 301, 517 * 301, 301, 1);
  dmat_init(&b, TPURT_F32, 1, 301, 389, 301 * 389, 1, 301);
  dmat_init(&c, TPURT_F32, 1, 517, 389, 517 * 389, 389, 1);
  fill(&a, 51, 0), fill(&b, 52, 0), fill(&c, 53, 0);
  run_check(&c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST, 2e-3);
  run_check(&c, &a, &b, 1.0, 1.0, TPURT_PRECISION_HIGH, 2e-3);
  dmat_free(&a), dmat_free(&b), dmat_free(&c);
}

/* ------------------------------------------- bf16 dot-product kernel */

/* The bf16 values a product multiplies: the element itself (bf16 data),
 * rounded (f32 at DEFAULT) or split into hi and lo (f32 at HIGH). */
static double hi_of(double v) { return bf16r((float)v); }
static double lo_of(double v) { return bf16r((float)(v - hi_of(v))); }

/* One product (B batches, A M x K, B K x N in the given layouts, C f32 row-major,
 * f32 column-major or bf16) against a double reference of the products of
 * bf16 values: every element within 2^-18 of the sum of its terms'
 * magnitudes (f32 accumulation), bf16 results within their rounding.
 * Returns a hash of C's bits. */
static uint64_t bdot_case(int64_t B, int64_t M, int64_t N, int64_t K, int la, int lb, int lc, tpurt_dtype dt,
                          tpurt_precision prec, double alpha, double beta) {
  dmat a, b, c;
  if (la == 0) dmat_init(&a, dt, B, M, K, M * K, K, 1);
  else if (la == 1) dmat_init(&a, dt, B, M, K, M * K, 1, M);
  else dmat_init(&a, dt, B, M, K, 2 * M * K, 2 * K, 2);
  if (lb == 0) dmat_init(&b, dt, B, K, N, K * N, N, 1);
  else if (lb == 1) dmat_init(&b, dt, B, K, N, K * N, 1, K);
  else if (lb == 2) dmat_init(&b, dt, B, K, N, 0, 2 * N + 1, 2); /* broadcast batch, general strides */
  else dmat_init(&b, dt, B, K, N, 0, N, 1);                      /* broadcast batch */
  if (lc == 0) dmat_init(&c, TPURT_F32, B, M, N, M * N, N, 1);
  else if (lc == 1) dmat_init(&c, TPURT_F32, B, M, N, M * N, 1, M);
  else dmat_init(&c, TPURT_BF16, B, M, N, M * N, N, 1);
  fill(&a, 61 + (unsigned)(la + M), 0), fill(&b, 67 + (unsigned)(lb + N), 0), fill(&c, 71, 0);
  int high = dt == TPURT_F32 && prec == TPURT_PRECISION_HIGH;
  double *ref = malloc(sizeof(double) * (size_t)(B * M * N)), *mag = malloc(sizeof(double) * (size_t)(B * M * N));
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double sum = 0, m = 0;
        for (int64_t k = 0; k < K; k++) {
          double x = get(&a, bi, i, k), y = get(&b, bi, k, j), t;
          if (high)
            t = hi_of(x) * hi_of(y) + hi_of(x) * lo_of(y) + lo_of(x) * hi_of(y);
          else
            t = hi_of(x) * hi_of(y);
          sum += t;
          m += fabs(hi_of(x) * hi_of(y));
        }
        int64_t o = (bi * M + i) * N + j;
        ref[o] = alpha * sum + (beta == 0 ? 0 : beta * get(&c, bi, i, j));
        mag[o] = fabs(alpha) * m + fabs(beta * get(&c, bi, i, j));
      }
  up(&a), up(&b), up(&c);
  tpurt_view cv = vw(&c), av = vw(&a), bv = vw(&b);
  CHECK_OK(tpurt_gemm(S, &cv, &av, &bv, alpha, beta, prec));
  CHECK_OK(tpurt_stream_synchronize(S));
  down(&c);
  int bad = 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        int64_t o = (bi * M + i) * N + j;
        double got = get(&c, bi, i, j), tol = ldexp(mag[o], -18) + (lc == 2 ? ldexp(fabs(ref[o]), -8) : 0) + 1e-30;
        if (!(fabs(got - ref[o]) <= tol) && bad++ < 3)
          fprintf(stderr, "bf16 dot B%lld M%lld N%lld K%lld la%d lb%d lc%d dt%d prec%d: [%lld,%lld,%lld] = %.9g, want %.9g\n",
                  (long long)B, (long long)M, (long long)N, (long long)K, la, lb, lc, (int)dt, (int)prec,
                  (long long)bi, (long long)i, (long long)j, got, ref[o]);
        float f = (float)got;
        uint32_t u;
        memcpy(&u, &f, 4);
        h = (h ^ u) * 0x100000001b3ull;
      }
  CHECK(bad == 0);
  free(ref), free(mag);
  dmat_free(&a), dmat_free(&b), dmat_free(&c);
  return h;
}

/* Products of bf16 values (bf16 data; f32 at DEFAULT and HIGH precision)
 * in every layout, edge and batching case the bf16 dot-product kernel
 * handles (bgemm.c); on a CPU with AVX512-BF16 they run on it (their bits
 * differ from the f32 path's, TORCH_TPU_BGEMM=0). Returns a hash of all
 * results. */
static uint64_t bdot_all(void) {
  static const int64_t sh[][4] = {{1, 1, 1, 1},   {1, 7, 5, 3},    {1, 8, 16, 2},   {2, 9, 33, 17},
                                  {1, 64, 48, 256}, {1, 130, 70, 1031}, {3, 5, 200, 64}, {64, 16, 16, 16},
                                  {1, 40, 1100, 40}, {1, 136, 100, 520}};
  uint64_t h = 0;
  for (size_t s = 0; s < sizeof sh / sizeof *sh; s++)
    for (int l = 0; l < 4; l++) {
      const int64_t *d = sh[s];
      h = h * 31 + bdot_case(d[0], d[1], d[2], d[3], l % 3, l, l % 3, TPURT_BF16, TPURT_PRECISION_HIGHEST,
                             1.0, l == 3 ? 0.5 : 0.0);
      if (l < 2) {
        h = h * 31 + bdot_case(d[0], d[1], d[2], d[3], l, l, l, TPURT_F32, TPURT_PRECISION_DEFAULT, 0.5, 0.0);
        h = h * 31 + bdot_case(d[0], d[1], d[2], d[3], l, 1 - l, 0, TPURT_F32, TPURT_PRECISION_HIGH, 1.0, 2.0);
      }
    }
  return h;
}

/* bdot_all's hash in a child process with env (assignments) before it */
static uint64_t bdot_child(const char *self, const char *env) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s '%s' --bdot-hash", env, self);
  FILE *f = popen(cmd, "r");
  unsigned long long v = 0;
  CHECK(f != NULL);
  if (f && fscanf(f, "%llx", &v) != 1) g_failures++;
  if (f) CHECK(pclose(f) == 0);
  return v;
}

static void test_bf16_dot(const char *self) {
  uint64_t h = bdot_all();
  /* the same bits at 1 and 3 pool threads (threads split rows and columns
   * only), on the dot products and on the f32 path (TORCH_TPU_BGEMM=0: the
   * own kernel, or the library's tiles, whose grid follows the shape alone) */
  CHECK(bdot_child(self, "TPU_NUM_THREADS=1") == h);
  CHECK(bdot_child(self, "TPU_NUM_THREADS=3") == h);
  uint64_t h1 = bdot_child(self, "TORCH_TPU_BGEMM=0 TPU_NUM_THREADS=1");
  CHECK(bdot_child(self, "TORCH_TPU_BGEMM=0 TPU_NUM_THREADS=3") == h1);
  int cpu_bf16 = 0;
#if defined(__x86_64__)
  __builtin_cpu_init();
  cpu_bf16 = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#endif
  setenv("TORCH_TPU_BGEMM", "0", 1);
  uint64_t h_f32 = bdot_all(); /* the f32 path: within the same bounds */
  unsetenv("TORCH_TPU_BGEMM");
  if (cpu_bf16)
    CHECK(h_f32 != h); /* else the kernel did not run */
  else
    printf("bf16 dot product: not on this CPU\n");
}

/* A product's bits do not depend on A's layout: A stored transposed (a
 * weight gradient's grad_out^T, packed from its columns) gives the bits of
 * the same values stored by rows, for bf16 data and f32 at DEFAULT
 * precision, whole and partial 8-row slivers, odd K. */
static void test_bf16_a_layout_bits(void) {
  static const int64_t sh[][4] = {{1, 64, 48, 256}, {1, 136, 100, 520}, {2, 9, 33, 17}, {1, 40, 1100, 41}, {1, 8, 16, 3}};
  for (int t = 0; t < 2; t++) {
    tpurt_dtype dt = t ? TPURT_F32 : TPURT_BF16;
    tpurt_precision prec = t ? TPURT_PRECISION_DEFAULT : TPURT_PRECISION_HIGHEST;
    for (size_t s = 0; s < sizeof sh / sizeof *sh; s++) {
      int64_t B = sh[s][0], M = sh[s][1], N = sh[s][2], K = sh[s][3];
      dmat ar, ac, b, cr, cc;
      dmat_init(&ar, dt, B, M, K, M * K, K, 1);
      dmat_init(&ac, dt, B, M, K, M * K, 1, M);
      dmat_init(&b, dt, B, K, N, K * N, N, 1);
      dmat_init(&cr, TPURT_F32, B, M, N, M * N, N, 1);
      dmat_init(&cc, TPURT_F32, B, M, N, M * N, N, 1);
      fill(&ar, 5 + (unsigned)s, 0), fill(&ac, 5 + (unsigned)s, 0), fill(&b, 9, 0);
      up(&ar), up(&ac), up(&b);
      tpurt_view vr = vw(&cr), vc = vw(&cc), va = vw(&ar), vac = vw(&ac), vb = vw(&b);
      CHECK_OK(tpurt_gemm(S, &vr, &va, &vb, 1.0, 0.0, prec));
      CHECK_OK(tpurt_gemm(S, &vc, &vac, &vb, 1.0, 0.0, prec));
      CHECK_OK(tpurt_stream_synchronize(S));
      down(&cr), down(&cc);
      int diff = memcmp(cr.h, cc.h, (size_t)(B * M * N) * 4) != 0;
      if (diff) fprintf(stderr, "A layout changed the bits: dt%d B%lld M%lld N%lld K%lld\n", (int)dt, (long long)B,
                        (long long)M, (long long)N, (long long)K);
      CHECK(!diff);
      dmat_free(&ar), dmat_free(&ac), dmat_free(&b), dmat_free(&cr), dmat_free(&cc);
    }
  }
}

int main(int argc, char **argv) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  if (argc > 1 && !strcmp(argv[1], "--bdot-hash")) {
    printf("%llx\n", (unsigned long long)bdot_all());
    return g_failures ? 1 : 0;
  }
  CHECK(strlen(tpurt_gemm_library()) > 0);
  printf("gemm library: %s\n", tpurt_gemm_library());
  test_layouts();
  test_beta_zero_ignores_nan();
  test_f64_and_half();
  test_int();
  test_precision();
  test_edges();
  test_large_parallel();
  test_tiled();
  test_bf16_dot(argv[0]);
  test_bf16_a_layout_bits();
  if (g_failures) {
    fprintf(stderr, "%d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_gemm: OK\n");
  return 0;
}
