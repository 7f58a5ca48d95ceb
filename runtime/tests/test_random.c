/* test_random.c — the random sampling kernels (tpurt_random) against
 * references computed here from the Philox words (tpurt_philox4x32_10) and
 * the mapping documented in tpurt.h: uniform, bernoulli and 32-bit
 * random_ exactly (float, double, bf16, bool, int outputs; dense and strided
 * views), normals and
 * log-normals within a few double ulps of a long-double Box-Muller (the
 * f32 ones equal to it rounded), at sizes that leave partial blocks,
 * partial batches and several parallel chunks; multinomial with
 * replacement against a linear scan, without replacement by the exact
 * frequencies of ordered pairs. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;
static const uint64_t SEED = 0x1234567890abcdefull, OFFSET = 77;

/* word w of block b */
static uint32_t word(uint64_t b, int w) {
  uint64_t ctr = OFFSET + b;
  uint32_t c[4] = {(uint32_t)ctr, (uint32_t)(ctr >> 32), 0, 0}, k[2] = {(uint32_t)SEED, (uint32_t)(SEED >> 32)}, o[4];
  tpurt_philox4x32_10(c, k, o);
  return o[w];
}
static double u24(uint32_t x) { return (double)(x >> 8) / 16777216.0; }
static double u53(uint32_t hi, uint32_t lo) { return (double)((((uint64_t)hi << 32) | lo) >> 11) / 9007199254740992.0; }

/* the unit normal of element i (long double Box-Muller on words (0,1) or (2,3)) */
static long double ref_normal(int64_t i) {
  int64_t b = i / 4;
  int h = (int)(i % 4) / 2;
  long double u1 = 1.0L - (long double)u24(word((uint64_t)b, 2 * h)), u2 = (long double)u24(word((uint64_t)b, 2 * h + 1));
  long double r = sqrtl(-2.0L * logl(u1)), th = 2.0L * 3.14159265358979323846264338327950288L * u2;
  return i % 2 ? r * sinl(th) : r * cosl(th);
}

/* runs tpurt_random into a fresh buffer of n elements (view: sizes sz,
 * strides st over `span` elements) and copies the buffer back */
static void *sample(tpurt_dtype dt, int nd, const int64_t *sz, const int64_t *st, int64_t span, tpurt_rng_kind kind,
                    double p0, double p1) {
  size_t bytes = (size_t)span * tpurt_dtype_size(dt);
  tpurt_devptr d = check_up(S, NULL, bytes);
  tpurt_view v = check_view_st(d, dt, nd, sz, st);
  CHECK_OK(tpurt_random(S, &v, kind, p0, p1, 0, 0, SEED, OFFSET));
  void *h = malloc(bytes);
  check_down(S, h, d, bytes);
  CHECK_OK(tpurt_free(d));
  return h;
}

static double ld(tpurt_dtype dt, const void *h, int64_t k) {
  switch (dt) {
    case TPURT_F32: return ((const float *)h)[k];
    case TPURT_F64: return ((const double *)h)[k];
    case TPURT_BF16: return check_from_bf16(((const uint16_t *)h)[k]);
    case TPURT_BOOL: return ((const uint8_t *)h)[k];
    default: return NAN;
  }
}

/* what the output dtype stores for a double value (bf16 through float) */
static double rounded(tpurt_dtype dt, double v) {
  if (dt == TPURT_F32) return (float)v;
  if (dt == TPURT_BF16) return check_from_bf16(check_to_bf16((float)v));
  if (dt == TPURT_BOOL) return v != 0;
  return v;
}

/* uniform [lo, hi) and bernoulli(p) with a dense 1-D view of n elements
 * and with a transposed [r, c] view (element i of the row-major output at
 * memory (i % c) * r + i / c) */
static void check_exact(tpurt_dtype dt, tpurt_rng_kind kind, double p0, double p1, int64_t n, int transposed) {
  int wide = dt == TPURT_F64;
  int64_t r = 3, c = n / 3, sz[2], st[2];
  if (transposed) n = r * c;
  void *h = transposed ? (sz[0] = r, sz[1] = c, st[0] = 1, st[1] = r, sample(dt, 2, sz, st, n, kind, p0, p1))
                       : (sz[0] = n, st[0] = 1, sample(dt, 1, sz, st, n, kind, p0, p1));
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double u = wide ? u53(word((uint64_t)(i / 2), 2 * (int)(i % 2)), word((uint64_t)(i / 2), 2 * (int)(i % 2) + 1))
                    : u24(word((uint64_t)(i / 4), (int)(i % 4)));
    double want = kind == TPURT_RNG_BERNOULLI ? (u < p0 ? 1.0 : 0.0) : p0 + u * (p1 - p0);
    want = rounded(dt, want);
    if (kind == TPURT_RNG_UNIFORM && dt == TPURT_F32 && want >= (float)p1) want = nextafterf((float)p1, -INFINITY);
    int64_t at = transposed ? (i % c) * r + i / c : i;
    bad += ld(dt, h, at) != want;
  }
  if (bad) fprintf(stderr, "kind %d dtype %d n %lld transposed %d: %lld wrong\n", kind, dt, (long long)n, transposed,
                   (long long)bad);
  CHECK_EQ(bad, 0);
  free(h);
}

/* normal(mean, std) and log-normal: doubles within 4 ulps of |mean| +
 * |std z| (the sum may cancel) plus 2^-60 std (where cos or sin crosses
 * zero); floats within one float ulp (the reference rounded) */
static void check_normal(tpurt_dtype dt, tpurt_rng_kind kind, double mean, double std, int64_t n) {
  int64_t sz[1] = {n}, st[1] = {1};
  void *h = sample(dt, 1, sz, st, n, kind, mean, std);
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    long double z = ref_normal(i), want = mean + std * z;
    if (kind == TPURT_RNG_LOG_NORMAL) want = expl(want);
    double got = ld(dt, h, i), err = fabs(got - (double)want);
    double mag = fabs(mean) + fabs(std * (double)z);
    if (kind == TPURT_RNG_LOG_NORMAL) mag = fabs((double)want) * (1 + mag);
    double tol = dt == TPURT_F64 ? 4 * 0x1p-52 * mag + 0x1p-60 * fabs(std)
                                 : 1.0000001 * fabs(nextafterf((float)want, INFINITY) - (float)want);
    if (!(err <= tol)) bad++;
    if (err / tol > worst) worst = err / tol;
  }
  if (bad) fprintf(stderr, "normal kind %d dtype %d n %lld: %lld beyond tolerance (worst %.3g x)\n", kind, dt,
                   (long long)n, (long long)bad, worst);
  CHECK_EQ(bad, 0);
  free(h);
}

/* random_ with a 32-bit draw: from + word % range (int64, int32, float
 * outputs; a transposed int64 view) */
static void check_ints(tpurt_dtype dt, int64_t from, uint64_t range, int64_t n, int transposed) {
  int64_t r = 3, c = n / 3, sz[2], st[2];
  if (transposed) n = r * c;
  size_t bytes = (size_t)n * tpurt_dtype_size(dt);
  tpurt_devptr d = check_up(S, NULL, bytes);
  tpurt_view v = transposed ? (sz[0] = r, sz[1] = c, st[0] = 1, st[1] = r, check_view_st(d, dt, 2, sz, st))
                            : (sz[0] = n, check_view(d, dt, 1, sz));
  CHECK_OK(tpurt_random(S, &v, TPURT_RNG_RANDOM, 0, 0, from, range, SEED, OFFSET));
  char *h = malloc(bytes);
  check_down(S, h, d, bytes);
  CHECK_OK(tpurt_free(d));
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t want = from + (int64_t)((uint64_t)word((uint64_t)(i / 4), (int)(i % 4)) % range);
    int64_t at = transposed ? (i % c) * r + i / c : i, got;
    if (dt == TPURT_I64) got = ((int64_t *)h)[at];
    else if (dt == TPURT_I32) got = ((int32_t *)h)[at];
    else got = (int64_t)((double *)h)[at];
    bad += got != want;
  }
  if (bad) fprintf(stderr, "random_ dtype %d from %lld range %llu n %lld: %lld wrong\n", dt, (long long)from,
                   (unsigned long long)range, (long long)n, (long long)bad);
  CHECK_EQ(bad, 0);
  free(h);
}

/* multinomial draws of rows x cats weights (every third weight 0) */
static int64_t *mn_draw(const double *wts, int64_t rows, int64_t cats, int64_t ns, int repl) {
  tpurt_devptr dp = check_up(S, wts, (size_t)(rows * cats) * 8), dout = check_up(S, NULL, (size_t)(rows * ns) * 8);
  int64_t ps[2] = {rows, cats}, os[2] = {rows, ns};
  tpurt_view pv = check_view(dp, TPURT_F64, 2, ps), ov = check_view(dout, TPURT_I64, 2, os);
  CHECK_OK(tpurt_multinomial(S, &ov, &pv, ns, repl, SEED, OFFSET));
  int64_t *h = malloc((size_t)(rows * ns) * 8);
  check_down(S, h, dout, (size_t)(rows * ns) * 8);
  CHECK_OK(tpurt_free(dp));
  CHECK_OK(tpurt_free(dout));
  return h;
}

/* with replacement: the pick of a linear scan of the cumulative weights
 * (block offset + r * ns + k, words 0 and 1 as a 53-bit uniform); without:
 * distinct categories of positive weight, and the ordered pairs of 2 draws
 * from 5 categories at their exact frequencies w_i / W * w_j / (W - w_i) */
static void test_multinomial(void) {
  int64_t rows = 3, cats = 3001, ns = 700;
  double *wts = malloc((size_t)(rows * cats) * 8);
  for (int64_t i = 0; i < rows * cats; i++) wts[i] = i % 3 == 1 ? 0.0 : (double)(1 + (i * 7919) % 101);
  int64_t *h = mn_draw(wts, rows, cats, ns, 1), bad = 0;
  for (int64_t r = 0; r < rows; r++) {
    const double *w = wts + r * cats;
    double tot = 0;
    for (int64_t j = 0; j < cats; j++) tot += w[j];
    for (int64_t k = 0; k < ns; k++) {
      uint64_t b = (uint64_t)(r * ns + k);
      double u = u53(word(b, 0), word(b, 1)) * tot, acc = 0;
      int64_t pick = -1;
      for (int64_t j = 0; j < cats; j++) {
        if (w[j] <= 0) continue;
        acc += w[j];
        pick = j;
        if (u < acc) break;
      }
      bad += h[r * ns + k] != pick;
    }
  }
  CHECK_EQ(bad, 0);
  free(h);
  /* one draw without replacement is the draw with replacement */
  int64_t *one = mn_draw(wts, rows, cats, 1, 0), *one_r = mn_draw(wts, rows, cats, 1, 1);
  for (int64_t r = 0; r < rows; r++) bad += one[r] != one_r[r] || wts[r * cats + one[r]] <= 0;
  CHECK_EQ(bad, 0);
  free(one);
  free(one_r);
  /* without replacement: 2,000 of the 3,001 (2,000 with a weight) */
  h = mn_draw(wts, rows, cats, 2000, 0);
  char *seen = calloc((size_t)cats, 1);
  for (int64_t r = 0; r < rows; r++) {
    memset(seen, 0, (size_t)cats);
    for (int64_t k = 0; k < 2000; k++) {
      int64_t j = h[r * 2000 + k];
      bad += j < 0 || j >= cats || seen[j] || wts[r * cats + j] <= 0;
      if (j >= 0 && j < cats) seen[j] = 1;
    }
  }
  CHECK_EQ(bad, 0);
  free(seen);
  free(h);
  free(wts);
  /* ordered pairs */
  const double w5[5] = {1, 0, 2, 3, 4};
  int64_t n = 40000;
  double *many = malloc((size_t)n * 5 * 8);
  for (int64_t r = 0; r < n; r++) memcpy(many + r * 5, w5, sizeof w5);
  h = mn_draw(many, n, 5, 2, 0);
  int64_t cnt[5][5] = {{0}};
  for (int64_t r = 0; r < n; r++) cnt[h[2 * r]][h[2 * r + 1]]++;
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 5; j++) {
      double p = i == j || w5[i] == 0 || w5[j] == 0 ? 0 : w5[i] / 10 * w5[j] / (10 - w5[i]);
      double sd = sqrt(n * p * (1 - p)) + 1e-9;
      if (!(fabs((double)cnt[i][j] - n * p) <= 5 * sd)) {
        fprintf(stderr, "pair (%d, %d): %lld draws, expected %.1f\n", i, j, (long long)cnt[i][j], n * p);
        bad++;
      }
    }
  CHECK_EQ(bad, 0);
  free(h);
  free(many);
}

int main(void) {
  CHECK_OK(tpurt_stream_default(0, &S));
  /* 1, 4k + 3, a partial batch, several batches and parallel chunks */
  static const int64_t sizes[] = {1, 7, 1001, 40003};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    int64_t n = sizes[k];
    check_exact(TPURT_F32, TPURT_RNG_UNIFORM, -2.0, 3.0, n, 0);
    check_exact(TPURT_F32, TPURT_RNG_UNIFORM, 0.0, 1.0, n, 0);
    check_exact(TPURT_F64, TPURT_RNG_UNIFORM, -2.0, 3.0, n, 0);
    check_exact(TPURT_BF16, TPURT_RNG_UNIFORM, 0.5, 100.0, n, 0);
    check_exact(TPURT_F32, TPURT_RNG_BERNOULLI, 0.3, 0, n, 0);
    check_exact(TPURT_F64, TPURT_RNG_BERNOULLI, 0.3, 0, n, 0);
    check_exact(TPURT_BOOL, TPURT_RNG_BERNOULLI, 0.7, 0, n, 0);
    check_normal(TPURT_F64, TPURT_RNG_NORMAL, 0.0, 1.0, n);
    check_normal(TPURT_F64, TPURT_RNG_NORMAL, 2.0, 3.0, n);
    check_normal(TPURT_F32, TPURT_RNG_NORMAL, 0.0, 1.0, n);
    check_normal(TPURT_F32, TPURT_RNG_LOG_NORMAL, 0.1, 0.5, n);
    check_normal(TPURT_F64, TPURT_RNG_LOG_NORMAL, 0.1, 0.5, n);
    check_ints(TPURT_I64, -5, 1000, n, 0);
    check_ints(TPURT_I64, 0, 1, n, 0);
    check_ints(TPURT_I64, 7, 3, n, 0);
    check_ints(TPURT_I64, 0, 4294967295ull, n, 0);
    check_ints(TPURT_I64, -(1ll << 40), 1ull << 32, n, 0);
    check_ints(TPURT_I64, 0, 2147483649ull, n, 0);
    check_ints(TPURT_I32, -100, 50000, n, 0);
    check_ints(TPURT_F64, 0, 1u << 24, n, 0);
    if (n >= 3) {
      check_ints(TPURT_I64, -5, 1000, n, 1);
      check_exact(TPURT_F32, TPURT_RNG_UNIFORM, -2.0, 3.0, n, 1);
      check_exact(TPURT_F64, TPURT_RNG_UNIFORM, -2.0, 3.0, n, 1);
      check_exact(TPURT_BOOL, TPURT_RNG_BERNOULLI, 0.5, 0, n, 1);
    }
  }
  test_multinomial();
  TEST_MAIN_END();
}
