/* test_index.c — indexing, sort, random and loss kernels against simple
 * host references: index_select / gather / scatter (reductions, include_self),
 * index / index_put (accumulate with duplicates), nonzero, tril, pad, sort
 * (stable, NaN last), topk and kthvalue / nanmedian against a full sort
 * (ties, NaNs), Philox determinism, nll_loss; out-of-range indices fail
 * with TPURT_ERR_INDEX at the sync and the stream keeps working. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static void test_index_select_gather(void) {
  float x[12];
  for (int i = 0; i < 12; i++) x[i] = (float)i;
  int64_t idx[3] = {2, 0, 2};
  tpurt_devptr dx = check_up(S, x, sizeof x), di = check_up(S, idx, sizeof idx), dout;
  CHECK_OK(tpurt_malloc(0, 64, S, &dout));
  int64_t xs[2] = {3, 4}, is[1] = {3}, os[2] = {3, 3};
  tpurt_view vx = check_view(dx, TPURT_F32, 2, xs), vi = check_view(di, TPURT_I64, 1, is);
  tpurt_view vo = check_view(dout, TPURT_F32, 2, os);
  /* select columns */
  CHECK_OK(tpurt_index_select(S, &vo, &vx, 1, &vi));
  float o[9];
  check_down(S, o, dout, sizeof o);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 3; c++) CHECK_EQ(o[r * 3 + c], x[r * 4 + idx[c]]);
  /* out of range: error at the sync, then the stream works */
  int64_t bad[3] = {0, 12, 1};
  CHECK_OK(tpurt_memcpy_h2d(S, di, bad, sizeof bad, 0));
  CHECK_OK(tpurt_index_select(S, &vo, &vx, 1, &vi));
  CHECK_ST(tpurt_stream_synchronize(S), TPURT_ERR_INDEX);
  CHECK(strstr(tpurt_last_error(), "index_select: index 12 is out of bounds for dimension 1 with size 4") != NULL);
  CHECK_OK(tpurt_stream_synchronize(S));
  /* gather along dim 0 */
  int64_t gi[6] = {2, 0, 1, 1, 2, 0};
  int64_t gs[2] = {2, 3};
  tpurt_devptr dg = check_up(S, gi, sizeof gi);
  tpurt_view vg = check_view(dg, TPURT_I64, 2, gs), vgo = check_view(dout, TPURT_F32, 2, gs);
  CHECK_OK(tpurt_gather(S, &vgo, &vx, 0, &vg));
  check_down(S, o, dout, 6 * 4);
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 3; c++) CHECK_EQ(o[r * 3 + c], x[gi[r * 3 + c] * 4 + c]);
  /* empty index: no-op */
  int64_t zs[2] = {0, 3};
  tpurt_view ve = check_view(dg, TPURT_I64, 2, zs), veo = check_view(dout, TPURT_F32, 2, zs);
  CHECK_OK(tpurt_gather(S, &veo, &vx, 0, &ve));
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_free(dx);
  tpurt_free(di);
  tpurt_free(dg);
  tpurt_free(dout);
}

static void test_scatter(void) {
  double self[4] = {1, 2, 3, 4}, src[5] = {10, 20, 30, 40, 50};
  int64_t idx[5] = {1, 3, 1, 1, 0};
  int64_t n4[1] = {4}, n5[1] = {5};
  tpurt_devptr ds = check_up(S, self, sizeof self), dr = check_up(S, src, sizeof src);
  tpurt_devptr di = check_up(S, idx, sizeof idx);
  tpurt_view vs = check_view(ds, TPURT_F64, 1, n4), vr = check_view(dr, TPURT_F64, 1, n5);
  tpurt_view vi = check_view(di, TPURT_I64, 1, n5);
  tpurt_scalar zero = {TPURT_SCALAR_FLOAT, 0, 0, 0};
  double o[4];
  /* sum, include_self */
  CHECK_OK(tpurt_scatter(S, &vs, 0, &vi, &vr, zero, TPURT_SCATTER_SUM, 1));
  check_down(S, o, ds, sizeof o);
  CHECK_EQ(o[0], 51);
  CHECK_EQ(o[1], 82);
  CHECK_EQ(o[2], 3);
  CHECK_EQ(o[3], 24);
  /* mean without self */
  CHECK_OK(tpurt_memcpy_h2d(S, ds, self, sizeof self, 0));
  CHECK_OK(tpurt_scatter(S, &vs, 0, &vi, &vr, zero, TPURT_SCATTER_MEAN, 0));
  check_down(S, o, ds, sizeof o);
  CHECK_NEAR(o[1], 80.0 / 3, 1e-12);
  CHECK_EQ(o[2], 3);
  /* amax with NaN propagates */
  src[2] = NAN;
  CHECK_OK(tpurt_memcpy_h2d(S, dr, src, sizeof src, 0));
  CHECK_OK(tpurt_scatter(S, &vs, 0, &vi, &vr, zero, TPURT_SCATTER_AMAX, 1));
  check_down(S, o, ds, sizeof o);
  CHECK(isnan(o[1]));
  /* index_add with duplicates and skip index */
  CHECK_OK(tpurt_memcpy_h2d(S, ds, self, sizeof self, 0));
  CHECK_OK(tpurt_index_add(S, &vs, 0, &vi, &vr, 2.0, 0, 0));
  check_down(S, o, ds, sizeof o);
  CHECK_EQ(o[0], 1); /* index 0 skipped */
  CHECK_EQ(o[3], 44);
  /* out of range */
  idx[4] = -1;
  CHECK_OK(tpurt_memcpy_h2d(S, di, idx, sizeof idx, 0));
  CHECK_OK(tpurt_scatter(S, &vs, 0, &vi, &vr, zero, TPURT_SCATTER_SUM, 1));
  CHECK_ST(tpurt_stream_synchronize(S), TPURT_ERR_INDEX);
  CHECK(strstr(tpurt_last_error(), "index -1 is out of bounds for dimension 0 with size 4") != NULL);
  tpurt_free(ds);
  tpurt_free(dr);
  tpurt_free(di);
}

static void test_advanced(void) {
  /* data [4] floats; index_put accumulate with duplicates {1, 1, -1} */
  float d[4] = {0, 0, 0, 0}, v[3] = {1, 2, 5};
  int64_t idx[3] = {1, 1, -1}, n3[1] = {3}, n4[1] = {4};
  tpurt_devptr dd = check_up(S, d, sizeof d), dv = check_up(S, v, sizeof v), di = check_up(S, idx, sizeof idx);
  tpurt_view vd = check_view(dd, TPURT_F32, 1, n3), vv = check_view(dv, TPURT_F32, 1, n3);
  tpurt_view vi = check_view(di, TPURT_I64, 1, n3);
  vd.strides[0] = 0; /* restrided: the indexed dim has stride 0 */
  int64_t sizes[1] = {4}, strides[1] = {1};
  CHECK_OK(tpurt_index_put(S, &vd, &vv, &vi, 1, sizes, strides, 1));
  float o[4];
  check_down(S, o, dd, sizeof o);
  CHECK_EQ(o[1], 3);
  CHECK_EQ(o[3], 5);
  /* index (get) */
  tpurt_devptr dout;
  CHECK_OK(tpurt_malloc(0, 16, S, &dout));
  tpurt_view vo = check_view(dout, TPURT_F32, 1, n3);
  CHECK_OK(tpurt_index(S, &vo, &vd, &vi, 1, sizes, strides));
  check_down(S, o, dout, 12);
  CHECK_EQ(o[0], 3);
  CHECK_EQ(o[2], 5);
  idx[0] = 4;
  CHECK_OK(tpurt_memcpy_h2d(S, di, idx, sizeof idx, 0));
  CHECK_OK(tpurt_index(S, &vo, &vd, &vi, 1, sizes, strides));
  CHECK_ST(tpurt_stream_synchronize(S), TPURT_ERR_INDEX);
  /* nonzero */
  float nz[4] = {0, -0.0f, 2, NAN};
  CHECK_OK(tpurt_memcpy_h2d(S, dd, nz, sizeof nz, 0));
  tpurt_view vn = check_view(dd, TPURT_F32, 1, n4);
  tpurt_devptr dc;
  CHECK_OK(tpurt_malloc(0, 8, S, &dc));
  tpurt_view vc = check_view(dc, TPURT_I64, 0, NULL);
  CHECK_OK(tpurt_count_nonzero(S, &vc, &vn));
  int64_t cnt = 0;
  check_down(S, &cnt, dc, 8);
  CHECK_EQ(cnt, 2);
  int64_t os[2] = {2, 1};
  tpurt_view vno = check_view(dout, TPURT_I64, 2, os);
  CHECK_OK(tpurt_nonzero(S, &vno, &vn));
  int64_t coords[2];
  check_down(S, coords, dout, 16);
  CHECK_EQ(coords[0], 2);
  CHECK_EQ(coords[1], 3);
  tpurt_free(dd);
  tpurt_free(dv);
  tpurt_free(di);
  tpurt_free(dout);
  tpurt_free(dc);
}

static void test_sort_tril_pad(void) {
  float x[8] = {3, NAN, 1, 3, -INFINITY, 2, 1, 0};
  int64_t n8[1] = {8};
  tpurt_devptr dx = check_up(S, x, sizeof x), dv, di;
  CHECK_OK(tpurt_malloc(0, 64, S, &dv));
  CHECK_OK(tpurt_malloc(0, 64, S, &di));
  tpurt_view vx = check_view(dx, TPURT_F32, 1, n8), vv = check_view(dv, TPURT_F32, 1, n8);
  tpurt_view vi = check_view(di, TPURT_I64, 1, n8);
  CHECK_OK(tpurt_sort(S, &vv, &vi, &vx, 0, 0));
  float v[8];
  int64_t ix[8];
  check_down(S, v, dv, sizeof v);
  check_down(S, ix, di, sizeof ix);
  int64_t want[8] = {4, 7, 2, 6, 5, 0, 3, 1}; /* stable, NaN last */
  for (int i = 0; i < 8; i++) CHECK_EQ(ix[i], want[i]);
  CHECK(isnan(v[7]));
  CHECK_OK(tpurt_sort(S, &vv, &vi, &vx, 0, 1));
  check_down(S, ix, di, sizeof ix);
  CHECK_EQ(ix[0], 1); /* NaN first when descending */
  CHECK_EQ(ix[1], 0); /* ties keep order */
  CHECK_EQ(ix[2], 3);
  /* tril of a 3x3 */
  float m[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  int64_t s33[2] = {3, 3};
  CHECK_OK(tpurt_memcpy_h2d(S, dx, m, sizeof m, 0));
  tpurt_view vm = check_view(dx, TPURT_F32, 2, s33), vmo = check_view(dv, TPURT_F32, 2, s33);
  CHECK_OK(tpurt_tril(S, &vmo, &vm, 0, 0));
  float t[9];
  check_down(S, t, dv, sizeof t);
  CHECK_EQ(t[1], 0);
  CHECK_EQ(t[3], 4);
  CHECK_EQ(t[8], 9);
  /* reflect pad 1-D: [1 2 3] pad (2, 1) -> 3 2 1 2 3 2 */
  int64_t s3[1] = {3}, s6[1] = {6}, pads[2] = {2, 1};
  tpurt_view vp = check_view(dx, TPURT_F32, 1, s3), vpo = check_view(dv, TPURT_F32, 1, s6);
  CHECK_OK(tpurt_pad(S, &vpo, &vp, TPURT_PAD_REFLECT, 1, pads));
  check_down(S, t, dv, 6 * 4);
  float wp[6] = {3, 2, 1, 2, 3, 2};
  for (int i = 0; i < 6; i++) CHECK_EQ(t[i], wp[i]);
  CHECK_OK(tpurt_pad(S, &vpo, &vp, TPURT_PAD_REPLICATE, 1, pads));
  check_down(S, t, dv, 6 * 4);
  float wr[6] = {1, 1, 1, 2, 3, 3};
  for (int i = 0; i < 6; i++) CHECK_EQ(t[i], wr[i]);
  tpurt_free(dx);
  tpurt_free(dv);
  tpurt_free(di);
}

/* reference order: ascending with NaN last (descending: NaN first), equal
 * values by position */
static const float *g_ref;
static int g_desc;
static int ref_cmp(const void *pa, const void *pb) {
  int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
  float x = g_ref[a], y = g_ref[b];
  int nx = isnan(x), ny = isnan(y), c;
  if (nx || ny)
    c = nx - ny;
  else
    c = (x > y) - (x < y);
  if (g_desc) c = -c;
  return c ? c : (a > b) - (a < b);
}

/* topk (a bounded heap, a selection, the whole sort: a radix sort at this
 * length) and the k-th smallest against qsort of the same order, on values
 * with ties (-0.0 equal to 0.0) and NaNs */
static void test_topk_select(void) {
  enum { N = 5003 };
  static float x[N];
  static int64_t order[N];
  for (int i = 0; i < N; i++) x[i] = i % 97 == 5 ? NAN : (float)((i * 7919) % 211);
  for (int i = 0; i < N; i += 89) x[i] = i % 2 ? -0.0f : 0.0f; /* equal keys for the sort */
  g_ref = x;
  int64_t nn[1] = {N}, rows[2] = {1, N};
  tpurt_devptr dx = check_up(S, x, sizeof x), dv = check_up(S, NULL, sizeof x), di = check_up(S, NULL, N * 8);
  tpurt_view vx = check_view(dx, TPURT_F32, 1, nn);
  static const int64_t ks[] = {1, 2, 50, N / 4, N - 1, N}; /* heap, heap, heap, select, sort, sort */
  float v[N];
  int64_t ix[N];
  for (int desc = 0; desc <= 1; desc++) {
    g_desc = desc;
    for (int64_t i = 0; i < N; i++) order[i] = i;
    qsort(order, N, sizeof *order, ref_cmp);
    for (size_t q = 0; q < sizeof ks / sizeof *ks; q++) {
      int64_t k = ks[q], kk[1] = {k};
      tpurt_view vv = check_view(dv, TPURT_F32, 1, kk), vi = check_view(di, TPURT_I64, 1, kk);
      CHECK_OK(tpurt_topk(S, &vv, &vi, &vx, k, 0, desc, 1));
      check_down(S, v, dv, (size_t)k * 4);
      check_down(S, ix, di, (size_t)k * 8);
      int64_t bad = 0;
      for (int64_t i = 0; i < k; i++) bad += ix[i] != order[i] || memcmp(&v[i], &x[order[i]], 4) != 0;
      if (bad) fprintf(stderr, "topk k=%lld largest=%d: %lld wrong\n", (long long)k, desc, (long long)bad);
      CHECK_EQ(bad, 0);
    }
  }
  g_desc = 0;
  for (int64_t i = 0; i < N; i++) order[i] = i;
  qsort(order, N, sizeof *order, ref_cmp);
  tpurt_view vr = check_view(dx, TPURT_F32, 2, rows);
  int64_t one[2] = {1, 1};
  tpurt_view v1 = check_view(dv, TPURT_F32, 2, one), i1 = check_view(di, TPURT_I64, 2, one);
  static const int64_t kth[] = {0, 1, 17, N / 2, N - 60, N - 1};
  for (size_t q = 0; q < sizeof kth / sizeof *kth; q++) {
    CHECK_OK(tpurt_select_rows(S, &v1, &i1, &vr, TPURT_SELECT_KTH, kth[q]));
    check_down(S, v, dv, 4);
    check_down(S, ix, di, 8);
    CHECK_EQ(ix[0], order[kth[q]]);
  }
  CHECK_OK(tpurt_select_rows(S, &v1, &i1, &vr, TPURT_SELECT_NANMEDIAN, 0));
  check_down(S, ix, di, 8);
  int64_t nans = 0;
  for (int i = 0; i < N; i++) nans += isnan(x[i]);
  CHECK_EQ(ix[0], order[(N - nans - 1) / 2]);
  CHECK_OK(tpurt_free(dx));
  CHECK_OK(tpurt_free(dv));
  CHECK_OK(tpurt_free(di));
}

static void test_random_and_loss(void) {
  int64_t n = 1000;
  tpurt_devptr d1, d2;
  CHECK_OK(tpurt_malloc(0, (size_t)n * 4, S, &d1));
  CHECK_OK(tpurt_malloc(0, (size_t)n * 4, S, &d2));
  int64_t sz[1] = {n};
  tpurt_view v1 = check_view(d1, TPURT_F32, 1, sz), v2 = check_view(d2, TPURT_F32, 1, sz);
  CHECK_EQ(tpurt_random_blocks(TPURT_RNG_UNIFORM, TPURT_F32, n, 0), 250);
  CHECK_OK(tpurt_random(S, &v1, TPURT_RNG_UNIFORM, 0, 1, 0, 0, 42, 10));
  CHECK_OK(tpurt_random(S, &v2, TPURT_RNG_UNIFORM, 0, 1, 0, 0, 42, 10));
  float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
  check_down(S, a, d1, (size_t)n * 4);
  check_down(S, b, d2, (size_t)n * 4);
  CHECK(memcmp(a, b, (size_t)n * 4) == 0);
  /* element 5 = word 1 of block offset + 1 */
  uint32_t ctr[4] = {11, 0, 0, 0}, key[2] = {42, 0}, w[4];
  tpurt_philox4x32_10(ctr, key, w);
  CHECK_NEAR(a[5], (float)(w[1] >> 8) / 16777216.0f, 0);
  double mean = 0;
  for (int64_t i = 0; i < n; i++) mean += a[i];
  CHECK_NEAR(mean / n, 0.5, 0.05);
  free(a);
  free(b);
  /* nll_loss mean with weight and ignore_index */
  float in[6] = {-1, -2, -3, -4, -5, -6}; /* [N=2, C=3, D=1] */
  int64_t tg[2] = {2, 0};
  float wt[3] = {1, 1, 2};
  tpurt_devptr dx = check_up(S, in, sizeof in), dt = check_up(S, tg, sizeof tg), dw = check_up(S, wt, sizeof wt), dtw;
  CHECK_OK(tpurt_malloc(0, 8, S, &dtw));
  int64_t is[3] = {2, 3, 1}, ts[2] = {2, 1}, ws[1] = {3};
  tpurt_view vx = check_view(dx, TPURT_F32, 3, is), vt = check_view(dt, TPURT_I64, 2, ts);
  tpurt_view vw = check_view(dw, TPURT_F32, 1, ws);
  tpurt_view vo = check_view(d1, TPURT_F32, 0, NULL), vtw = check_view(dtw, TPURT_F32, 0, NULL);
  CHECK_OK(tpurt_nll_loss(S, &vo, &vtw, &vx, &vt, &vw, 1, -100));
  float o, twv;
  check_down(S, &o, d1, 4);
  check_down(S, &twv, dtw, 4);
  CHECK_NEAR(o, (2 * 3 + 1 * 4) / 3.0, 1e-6);
  CHECK_NEAR(twv, 3, 0);
  tg[1] = 7;
  CHECK_OK(tpurt_memcpy_h2d(S, dt, tg, sizeof tg, 0));
  CHECK_OK(tpurt_nll_loss(S, &vo, &vtw, &vx, &vt, &vw, 1, -100));
  CHECK_ST(tpurt_stream_synchronize(S), TPURT_ERR_INDEX);
  CHECK(strstr(tpurt_last_error(), "Target 7 is out of bounds.") != NULL);
  tpurt_free(d1);
  tpurt_free(d2);
  tpurt_free(dx);
  tpurt_free(dt);
  tpurt_free(dw);
  tpurt_free(dtw);
}

int main(void) {
  CHECK_OK(tpurt_stream_default(0, &S));
  test_index_select_gather();
  test_scatter();
  test_advanced();
  test_sort_tril_pad();
  test_random_and_loss();
  test_topk_select();
  CHECK_OK(tpurt_device_synchronize(0));
  TEST_MAIN_END();
}
