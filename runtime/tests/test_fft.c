/* test_fft.c — c2c / r2c / c2r transforms vs a naive O(n^2) DFT in long
 * double: many lengths (1, primes, powers of two, 2^a 3^b 5^c, lengths with
 * large prime factors that go through Bluestein), both precisions, strided
 * and multi-dim views, scaling, NaN propagation, argument errors. */
#include <complex.h>

#include "check.h"

static tpurt_view vec(tpurt_devptr p, tpurt_dtype dt, int64_t n) {
  int64_t one = 1;
  return check_view_st(p, dt, 1, &n, &one);
}

static double rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* exp(2 pi i k / n) for k < n in long double, cached for the last n */
static long double complex *g_roots;
static int64_t g_roots_n;
static const long double complex *roots(int64_t n) {
  if (g_roots_n != n) {
    free(g_roots);
    g_roots = malloc((size_t)n * sizeof *g_roots);
    for (int64_t k = 0; k < n; k++) {
      long double a = 2.0L * 3.14159265358979323846264338327950288L * (long double)k / (long double)n;
      g_roots[k] = cosl(a) + I * sinl(a);
    }
    g_roots_n = n;
  }
  return g_roots;
}

/* X_k = sum_j x_j exp(sign 2 pi i j k / n) for one k */
static long double complex dft_bin(const long double complex *x, int64_t n, int64_t k, int sign) {
  const long double complex *w = roots(n);
  long double complex acc = 0;
  int64_t jk = 0;
  for (int64_t j = 0; j < n; j++) {
    acc += x[j] * (sign > 0 ? w[jk] : conjl(w[jk]));
    jk += k;
    if (jk >= n) jk -= n;
  }
  return acc;
}

/* the bins to check: all for small n, a spread sample otherwise */
static int64_t nbins(int64_t n) { return n <= 1024 ? n : 48; }
static int64_t bin_at(int64_t n, int64_t i) { return n <= 1024 ? i : (i * 7919 + i * i) % n; }

static void test_c2c_len(int64_t n, int dbl, int forward) {
  uint64_t seed = (uint64_t)n * 31 + (uint64_t)dbl * 7 + (uint64_t)forward;
  long double complex *x = malloc((size_t)n * sizeof *x);
  size_t es = dbl ? 16 : 8;
  char *h = malloc((size_t)n * es);
  for (int64_t j = 0; j < n; j++) {
    double re = rnd(&seed), im = rnd(&seed);
    if (dbl) {
      ((double *)h)[2 * j] = re;
      ((double *)h)[2 * j + 1] = im;
      x[j] = re + I * im;
    } else {
      ((float *)h)[2 * j] = (float)re;
      ((float *)h)[2 * j + 1] = (float)im;
      x[j] = (float)re + I * (float)im;
    }
  }
  tpurt_dtype dt = dbl ? TPURT_C128 : TPURT_C64;
  tpurt_devptr din = check_up(NULL, h, (size_t)n * es), dout = check_up(NULL, NULL, (size_t)n * es);
  tpurt_view vi = vec(din, dt, n), vo = vec(dout, dt, n);
  int dim = 0;
  CHECK_OK(tpurt_fft(NULL, TPURT_FFT_C2C, &vo, &vi, NULL, 1, &dim, forward, 1.0));
  check_down(NULL, h, dout, (size_t)n * es);
  double maxerr = 0, norm = sqrt((double)n);
  for (int64_t i = 0; i < nbins(n); i++) {
    int64_t k = bin_at(n, i);
    long double complex r = dft_bin(x, n, k, forward ? -1 : 1);
    double gr = dbl ? ((double *)h)[2 * k] : ((float *)h)[2 * k];
    double gi = dbl ? ((double *)h)[2 * k + 1] : ((float *)h)[2 * k + 1];
    double e = hypot(gr - (double)creall(r), gi - (double)cimagl(r)) / norm;
    if (e > maxerr) maxerr = e;
  }
  double tol = dbl ? 1e-13 : 3e-6;
  if (!(maxerr <= tol)) fprintf(stderr, "c2c n=%lld dbl=%d fwd=%d err %g\n", (long long)n, dbl, forward, maxerr);
  CHECK(maxerr <= tol);
  tpurt_free(din);
  tpurt_free(dout);
  free(x);
  free(h);
}

/* r2c (one- and two-sided) and c2r of length n */
static void test_real_len(int64_t n, int dbl) {
  uint64_t seed = (uint64_t)n * 17 + (uint64_t)dbl;
  long double complex *x = malloc((size_t)n * sizeof *x);
  size_t rs = dbl ? 8 : 4, cs = 2 * rs;
  char *h = malloc((size_t)n * cs + 16);
  for (int64_t j = 0; j < n; j++) {
    double v = rnd(&seed);
    if (dbl) {
      ((double *)h)[j] = v;
      x[j] = v;
    } else {
      ((float *)h)[j] = (float)v;
      x[j] = (float)v;
    }
  }
  tpurt_dtype rt = dbl ? TPURT_F64 : TPURT_F32, ct = dbl ? TPURT_C128 : TPURT_C64;
  tpurt_devptr din = check_up(NULL, h, (size_t)n * rs), dout = check_up(NULL, NULL, (size_t)n * cs);
  int dim = 0;
  double tol = dbl ? 1e-13 : 3e-6, norm = sqrt((double)n);
  for (int two = 0; two < 2; two++) {
    int64_t no = two ? n : n / 2 + 1;
    tpurt_view vi = vec(din, rt, n), vo = vec(dout, ct, no);
    CHECK_OK(tpurt_fft(NULL, TPURT_FFT_R2C, &vo, &vi, NULL, 1, &dim, 1, 1.0));
    check_down(NULL, h, dout, (size_t)no * cs);
    double maxerr = 0;
    for (int64_t i = 0; i < nbins(no); i++) {
      int64_t k = bin_at(no, i);
      long double complex r = dft_bin(x, n, k, -1);
      double gr = dbl ? ((double *)h)[2 * k] : ((float *)h)[2 * k];
      double gi = dbl ? ((double *)h)[2 * k + 1] : ((float *)h)[2 * k + 1];
      double e = hypot(gr - (double)creall(r), gi - (double)cimagl(r)) / norm;
      if (e > maxerr) maxerr = e;
    }
    if (!(maxerr <= tol)) fprintf(stderr, "r2c n=%lld dbl=%d two=%d err %g\n", (long long)n, dbl, two, maxerr);
    CHECK(maxerr <= tol);
  }
  /* c2r: random half spectrum (with non-zero imaginary DC / Nyquist parts,
   * which must be ignored) vs the Hermitian extension's inverse DFT */
  int64_t nh = n / 2 + 1;
  long double complex *X = malloc((size_t)n * sizeof *X);
  for (int64_t k = 0; k < nh; k++) {
    double re = rnd(&seed), im = rnd(&seed);
    if (dbl) {
      ((double *)h)[2 * k] = re;
      ((double *)h)[2 * k + 1] = im;
    } else {
      ((float *)h)[2 * k] = (float)re;
      ((float *)h)[2 * k + 1] = (float)im;
      re = (float)re;
      im = (float)im;
    }
    X[k] = re + I * im;
  }
  X[0] = creall(X[0]);
  if (n % 2 == 0) X[n / 2] = creall(X[n / 2]);
  for (int64_t k = 1; k < nh; k++) X[n - k] = conjl(X[k]);
  tpurt_devptr dspec = check_up(NULL, h, (size_t)nh * cs);
  tpurt_view vi = vec(dspec, ct, nh), vo = vec(dout, rt, n);
  CHECK_OK(tpurt_fft(NULL, TPURT_FFT_C2R, &vo, &vi, NULL, 1, &dim, 0, 1.0 / (double)n));
  check_down(NULL, h, dout, (size_t)n * rs);
  double maxerr = 0;
  for (int64_t i = 0; i < nbins(n); i++) {
    int64_t j = bin_at(n, i);
    long double complex r = dft_bin(X, n, j, 1) / n;
    double g = dbl ? ((double *)h)[j] : ((float *)h)[j];
    double e = fabs(g - (double)creall(r)) * norm;
    if (e > maxerr) maxerr = e;
  }
  if (!(maxerr <= tol)) fprintf(stderr, "c2r n=%lld dbl=%d err %g\n", (long long)n, dbl, maxerr);
  CHECK(maxerr <= tol);
  tpurt_free(din);
  tpurt_free(dout);
  tpurt_free(dspec);
  free(x);
  free(X);
  free(h);
}

static void test_lengths(void) {
  static const int64_t lens[] = {1,   2,   3,   4,   5,   6,   7,   8,    9,    10,   11,   12,   13,   15,
                                 16,  17,  25,  27,  30,  32,  49,  59,   61,   64,   67,   81,   97,   100,
                                 101, 121, 125, 128, 210, 243, 256, 360,  509,  1000, 1009, 1024, 2048, 4096,
                                 4097, 3 * 5 * 7 * 11, 2 * 127, 7919, 65536 + 3 * 81 * 25, 1 << 17, 3 * 25 * 1024, 7 * 11 * 13 * 64, 2 * 3 * 3 * 5 * 5 * 5 * 2};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
    for (int dbl = 0; dbl < 2; dbl++) {
      test_c2c_len(lens[i], dbl, 1);
      test_c2c_len(lens[i], dbl, 0);
      test_real_len(lens[i], dbl);
    }
}

/* 2-d c2c over a transposed (non-contiguous) input with scaling, compared
 * with row-column naive DFTs; r2c over dims {0, 2} of a 3-d tensor; c2r
 * over two dims with a work view, inverting the r2c. */
static void test_multidim(void) {
  enum { A = 6, B = 10 };
  uint64_t seed = 5;
  double h[A * B * 2], g[A * B * 2];
  for (int i = 0; i < A * B * 2; i++) h[i] = rnd(&seed);
  tpurt_devptr din = check_up(NULL, h, sizeof h), dout = check_up(NULL, NULL, sizeof h);
  /* the stored matrix is [B][A]; the view is its transpose [A][B] */
  int64_t sz[2] = {A, B}, tst[2] = {1, A}, cst[2] = {B, 1};
  tpurt_view vi = check_view_st(din, TPURT_C128, 2, sz, tst), vo = check_view_st(dout, TPURT_C128, 2, sz, cst);
  int dims[2] = {0, 1};
  CHECK_OK(tpurt_fft(NULL, TPURT_FFT_C2C, &vo, &vi, NULL, 2, dims, 1, 0.5));
  check_down(NULL, g, dout, sizeof g);
  double maxerr = 0;
  for (int k0 = 0; k0 < A; k0++)
    for (int k1 = 0; k1 < B; k1++) {
      long double complex acc = 0;
      for (int j0 = 0; j0 < A; j0++)
        for (int j1 = 0; j1 < B; j1++) {
          long double complex xv = h[2 * (j1 * A + j0)] + I * h[2 * (j1 * A + j0) + 1];
          long double a = -2.0L * 3.14159265358979323846L * ((long double)j0 * k0 / A + (long double)j1 * k1 / B);
          acc += xv * (cosl(a) + I * sinl(a));
        }
      acc *= 0.5L;
      double e = hypot(g[2 * (k0 * B + k1)] - (double)creall(acc), g[2 * (k0 * B + k1) + 1] - (double)cimagl(acc));
      if (e > maxerr) maxerr = e;
    }
  CHECK(maxerr < 1e-12);

  /* 3-d real [4, 3, 8] over dims {0, 2} then back through c2r with 1/N */
  enum { P = 4, Q = 3, R = 8, RH = R / 2 + 1 };
  float xr[P * Q * R], back[P * Q * R];
  for (int i = 0; i < P * Q * R; i++) xr[i] = (float)rnd(&seed);
  tpurt_devptr dx = check_up(NULL, xr, sizeof xr), dspec = check_up(NULL, NULL, P * Q * RH * 8),
               dwork = check_up(NULL, NULL, P * Q * RH * 8), dback = check_up(NULL, NULL, sizeof back);
  int64_t rsz[3] = {P, Q, R}, rst[3] = {Q * R, R, 1}, csz[3] = {P, Q, RH}, cst3[3] = {Q * RH, RH, 1};
  tpurt_view vx = check_view_st(dx, TPURT_F32, 3, rsz, rst), vs = check_view_st(dspec, TPURT_C64, 3, csz, cst3);
  int d02[2] = {0, 2};
  CHECK_OK(tpurt_fft(NULL, TPURT_FFT_R2C, &vs, &vx, NULL, 2, d02, 1, 1.0));
  float spec[P * Q * RH * 2];
  check_down(NULL, spec, dspec, sizeof spec);
  maxerr = 0;
  for (int k0 = 0; k0 < P; k0++)
    for (int q = 0; q < Q; q++)
      for (int k2 = 0; k2 < RH; k2++) {
        long double complex acc = 0;
        for (int j0 = 0; j0 < P; j0++)
          for (int j2 = 0; j2 < R; j2++) {
            long double a = -2.0L * 3.14159265358979323846L * ((long double)j0 * k0 / P + (long double)j2 * k2 / R);
            acc += xr[(j0 * Q + q) * R + j2] * (cosl(a) + I * sinl(a));
          }
        int o = 2 * ((k0 * Q + q) * RH + k2);
        double e = hypot(spec[o] - (double)creall(acc), spec[o + 1] - (double)cimagl(acc));
        if (e > maxerr) maxerr = e;
      }
  CHECK(maxerr < 1e-4);
  tpurt_view vw = check_view_st(dwork, TPURT_C64, 3, csz, cst3), vb = check_view_st(dback, TPURT_F32, 3, rsz, rst);
  CHECK_OK(tpurt_fft(NULL, TPURT_FFT_C2R, &vb, &vs, &vw, 2, d02, 0, 1.0 / (P * R)));
  /* without a work view the multi-dim c2r is refused */
  CHECK_ST(tpurt_fft(NULL, TPURT_FFT_C2R, &vb, &vs, NULL, 2, d02, 0, 1.0), TPURT_ERR_INVALID_ARGUMENT);
  check_down(NULL, back, dback, sizeof back);
  maxerr = 0;
  for (int i = 0; i < P * Q * R; i++)
    if (fabs(back[i] - xr[i]) > maxerr) maxerr = fabs(back[i] - xr[i]);
  CHECK(maxerr < 1e-5);
  /* the input spectrum is left untouched */
  float spec2[P * Q * RH * 2];
  check_down(NULL, spec2, dspec, sizeof spec2);
  CHECK(memcmp(spec, spec2, sizeof spec) == 0);
  tpurt_free(din);
  tpurt_free(dout);
  tpurt_free(dx);
  tpurt_free(dspec);
  tpurt_free(dwork);
  tpurt_free(dback);
}

/* batches of lines (split over the pool), NaN / inf confined to their line,
 * size-1 dims, empty tensors, plan reuse, argument errors */
static void test_batch_edges(void) {
  enum { NB = 64, N = 12 };
  static float h[NB * N * 2], g[NB * N * 2];
  uint64_t seed = 9;
  for (int i = 0; i < NB * N * 2; i++) h[i] = (float)rnd(&seed);
  h[2 * (5 * N + 3)] = NAN;
  h[2 * (7 * N + 1) + 1] = INFINITY;
  tpurt_devptr din = check_up(NULL, h, sizeof h), dout = check_up(NULL, NULL, sizeof h);
  int64_t sz[3] = {NB, 1, N}, st[3] = {N, N, 1};
  tpurt_view vi = check_view_st(din, TPURT_C64, 3, sz, st), vo = check_view_st(dout, TPURT_C64, 3, sz, st);
  int dims[2] = {1, 2};
  CHECK_OK(tpurt_fft(NULL, TPURT_FFT_C2C, &vo, &vi, NULL, 2, dims, 1, 1.0));
  int cached = tpurt_fft_plan_cache_size();
  CHECK_OK(tpurt_fft(NULL, TPURT_FFT_C2C, &vo, &vi, NULL, 2, dims, 1, 1.0));
  CHECK_EQ(tpurt_fft_plan_cache_size(), cached);
  check_down(NULL, g, dout, sizeof g);
  for (int b = 0; b < NB; b++) {
    int bad = b == 5 || b == 7, allbad = 1, anybad = 0;
    for (int k = 0; k < N; k++) {
      int fin = isfinite(g[2 * (b * N + k)]) && isfinite(g[2 * (b * N + k) + 1]);
      allbad &= !fin;
      anybad |= !fin;
    }
    CHECK(bad ? allbad : !anybad);
    if (!bad) {
      long double complex x[N];
      for (int j = 0; j < N; j++) x[j] = h[2 * (b * N + j)] + I * h[2 * (b * N + j) + 1];
      for (int k = 0; k < N; k++) {
        long double complex r = dft_bin(x, N, k, -1);
        CHECK_NEAR(g[2 * (b * N + k)], (double)creall(r), 1e-5);
        CHECK_NEAR(g[2 * (b * N + k) + 1], (double)cimagl(r), 1e-5);
      }
    }
  }
  /* empty batch: nothing to do */
  int64_t esz[2] = {0, N}, est[2] = {N, 1};
  tpurt_view ei = check_view_st(din, TPURT_C64, 2, esz, est), eo = check_view_st(dout, TPURT_C64, 2, esz, est);
  int d1 = 1, d0 = 0, dd[2] = {1, 1}, dbad = 3;
  CHECK_OK(tpurt_fft(NULL, TPURT_FFT_C2C, &eo, &ei, NULL, 1, &d1, 1, 1.0));
  /* errors */
  tpurt_view v2i = check_view_st(din, TPURT_C64, 2, (int64_t[]){4, N}, est);
  tpurt_view v2o = check_view_st(dout, TPURT_C64, 2, (int64_t[]){4, N}, est);
  CHECK_ST(tpurt_fft(NULL, TPURT_FFT_C2C, &v2o, &v2i, NULL, 2, dd, 1, 1.0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_fft(NULL, TPURT_FFT_C2C, &v2o, &v2i, NULL, 1, &dbad, 1, 1.0), TPURT_ERR_INDEX);
  CHECK_ST(tpurt_fft(NULL, TPURT_FFT_C2C, &v2i, &v2i, NULL, 1, &d0, 1, 1.0), TPURT_ERR_INVALID_ARGUMENT);
  tpurt_view f32o = check_view_st(dout, TPURT_F32, 2, (int64_t[]){4, N}, est);
  CHECK_ST(tpurt_fft(NULL, TPURT_FFT_C2C, &f32o, &v2i, NULL, 1, &d0, 1, 1.0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_fft(NULL, TPURT_FFT_R2C, &v2o, &v2i, NULL, 1, &d1, 1, 1.0), TPURT_ERR_INVALID_ARGUMENT);
  tpurt_view wrong = check_view_st(dout, TPURT_C64, 2, (int64_t[]){4, 5}, est);
  tpurt_view rin = check_view_st(din, TPURT_F32, 2, (int64_t[]){4, N}, est);
  CHECK_ST(tpurt_fft(NULL, TPURT_FFT_R2C, &wrong, &rin, NULL, 1, &d1, 1, 1.0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_device_synchronize(0));
  tpurt_free(din);
  tpurt_free(dout);
}

int main(void) {
  CHECK_OK(tpurt_init());
  test_lengths();
  test_multidim();
  test_batch_edges();
  CHECK_OK(tpurt_device_synchronize(0));
  if (g_failures) {
    fprintf(stderr, "%d failure(s)\n", g_failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
