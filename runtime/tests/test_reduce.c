/* test_reduce.c — reductions, scans, softmax and norms vs simple references. */
#include "check.h"

static void test_sums(void) {
  enum { R = 300, C = 1000 };
  static float x[R * C];
  for (int i = 0; i < R * C; i++) x[i] = (float)(((int64_t)i * 7919) % 1000) / 997.0f - 0.3f;
  tpurt_devptr dx = check_up(NULL, x, sizeof x), dout;
  CHECK_OK(tpurt_malloc(0, C * 8, NULL, &dout));
  /* full sum */
  int64_t sz[2] = {R, C}, st[2] = {C, 1}, osz[2] = {1, 1}, ost[2] = {0, 0};
  tpurt_view in = check_view_st(dx, TPURT_F32, 2, sz, st), out = check_view_st(dout, TPURT_F64, 2, osz, ost);
  CHECK_OK(tpurt_reduce(NULL, TPURT_RED_SUM, &out, NULL, &in, 0));
  double got, ref = 0;
  for (int i = 0; i < R * C; i++) ref += x[i];
  check_down(NULL, &got, dout, 8);
  CHECK_NEAR(got, ref, fabs(ref) * 1e-6);
  /* over dim 0 (outer strategy) and dim 1 (inner) */
  float col[C], row[R];
  int64_t o0[2] = {1, C}, s0[2] = {0, 1};
  out = check_view_st(dout, TPURT_F32, 2, o0, s0);
  CHECK_OK(tpurt_reduce(NULL, TPURT_RED_SUM, &out, NULL, &in, 0));
  check_down(NULL, col, dout, sizeof col);
  for (int j = 0; j < C; j += 97) {
    double r = 0;
    for (int i = 0; i < R; i++) r += x[i * C + j];
    CHECK_NEAR(col[j], r, 1e-3);
  }
  int64_t o1[2] = {R, 1}, s1[2] = {1, 0};
  out = check_view_st(dout, TPURT_F32, 2, o1, s1);
  CHECK_OK(tpurt_reduce(NULL, TPURT_RED_MEAN, &out, NULL, &in, 0));
  check_down(NULL, row, dout, sizeof row);
  for (int i = 0; i < R; i += 31) {
    double r = 0;
    for (int j = 0; j < C; j++) r += x[i * C + j];
    CHECK_NEAR(row[i], r / C, 1e-5);
  }
  /* variance over dim 1 */
  CHECK_OK(tpurt_reduce(NULL, TPURT_RED_VAR, &out, NULL, &in, 1.0));
  check_down(NULL, row, dout, sizeof row);
  {
    double m = 0, v = 0;
    for (int j = 0; j < C; j++) m += x[j];
    m /= C;
    for (int j = 0; j < C; j++) v += (x[j] - m) * (x[j] - m);
    CHECK_NEAR(row[0], v / (C - 1), 1e-5);
  }
  tpurt_free(dx);
  tpurt_free(dout);
}

static void test_extremes(void) {
  float x[8] = {1, 5, NAN, 7, -2, 9, 9, NAN};
  tpurt_devptr dx = check_up(NULL, x, sizeof x), dv, di;
  CHECK_OK(tpurt_malloc(0, 64, NULL, &dv));
  CHECK_OK(tpurt_malloc(0, 64, NULL, &di));
  int64_t sz[2] = {2, 4}, st[2] = {4, 1}, osz[2] = {2, 1}, ost[2] = {1, 0};
  tpurt_view in = check_view_st(dx, TPURT_F32, 2, sz, st), v = check_view_st(dv, TPURT_F32, 2, osz, ost);
  tpurt_view i = check_view_st(di, TPURT_I64, 2, osz, ost);
  CHECK_OK(tpurt_reduce(NULL, TPURT_RED_MAX, &v, &i, &in, 0));
  float hv[2];
  int64_t hi[2];
  check_down(NULL, hv, dv, 8);
  check_down(NULL, hi, di, 16);
  CHECK(isnan(hv[0]) && isnan(hv[1]));
  CHECK_EQ(hi[0], 2);
  CHECK_EQ(hi[1], 3);
  /* argmax over the first 2 elements of each row: first max wins */
  int64_t sz2[2] = {2, 3}, st2[2] = {4, 1};
  float y[8] = {1, 9, 9, 0, 4, 4, 2, 0};
  tpurt_devptr dy = check_up(NULL, y, sizeof y);
  in = check_view_st(dy, TPURT_F32, 2, sz2, st2);
  CHECK_OK(tpurt_reduce(NULL, TPURT_RED_ARGMAX, &i, NULL, &in, 0));
  check_down(NULL, hi, di, 16);
  CHECK_EQ(hi[0], 1);
  CHECK_EQ(hi[1], 0);
  /* empty: sum is 0, max is an error */
  int64_t ez[2] = {0, 3}, es[2] = {3, 1}, eo[2] = {1, 1}, eos[2] = {0, 0};
  tpurt_view e = check_view_st(dy, TPURT_F32, 2, ez, es), eout = check_view_st(dv, TPURT_F32, 2, eo, eos);
  CHECK_OK(tpurt_reduce(NULL, TPURT_RED_SUM, &eout, NULL, &e, 0));
  check_down(NULL, hv, dv, 4);
  CHECK_NEAR(hv[0], 0, 0);
  CHECK_ST(tpurt_reduce(NULL, TPURT_RED_MAX, &eout, NULL, &e, 0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_device_synchronize(0));
  tpurt_free(dx);
  tpurt_free(dy);
  tpurt_free(dv);
  tpurt_free(di);
}

static void test_scan_softmax(void) {
  int32_t x[6] = {1, 2, 3, 4, 5, 6};
  tpurt_devptr dx = check_up(NULL, x, sizeof x), dout;
  CHECK_OK(tpurt_malloc(0, 64, NULL, &dout));
  int64_t sz[2] = {2, 3}, st[2] = {3, 1};
  tpurt_view in = check_view_st(dx, TPURT_I32, 2, sz, st), out = check_view_st(dout, TPURT_I64, 2, sz, st);
  CHECK_OK(tpurt_scan(NULL, TPURT_SCAN_CUMSUM, &out, NULL, &in, 0));
  int64_t h[6];
  check_down(NULL, h, dout, sizeof h);
  CHECK_EQ(h[3], 5);
  CHECK_EQ(h[5], 9);
  float f[6] = {0, 1, 2, 1000, 1000, -INFINITY}, g[6];
  tpurt_devptr df = check_up(NULL, f, sizeof f);
  tpurt_view fin = check_view_st(df, TPURT_F32, 2, sz, st), fout = check_view_st(dout, TPURT_F32, 2, sz, st);
  CHECK_OK(tpurt_softmax(NULL, &fout, &fin, 1, 0));
  check_down(NULL, g, dout, sizeof g);
  CHECK_NEAR(g[0] + g[1] + g[2], 1.0, 1e-6);
  CHECK_NEAR(g[3], 0.5, 1e-6);
  CHECK_NEAR(g[5], 0.0, 0);
  CHECK_ST(tpurt_softmax(NULL, &fout, &fin, 2, 0), TPURT_ERR_INDEX);
  tpurt_free(dx);
  tpurt_free(df);
  tpurt_free(dout);
}

static void test_norms(void) {
  enum { N = 4, C = 6, S = 5 };
  float x[N * C * S], y[N * C * S];
  for (int i = 0; i < N * C * S; i++) x[i] = (float)((i * 37) % 23) - 7.0f;
  tpurt_devptr dx = check_up(NULL, x, sizeof x), dy, dm, dr;
  CHECK_OK(tpurt_malloc(0, sizeof y, NULL, &dy));
  CHECK_OK(tpurt_malloc(0, 256, NULL, &dm));
  CHECK_OK(tpurt_malloc(0, 256, NULL, &dr));
  int64_t sz[3] = {N, C, S}, st[3] = {C * S, S, 1};
  tpurt_view xv = check_view_st(dx, TPURT_F32, 3, sz, st), yv = check_view_st(dy, TPURT_F32, 3, sz, st);
  /* layer norm over the last dim: every row has mean 0, variance 1 */
  int64_t rs[1] = {N * C}, r1[1] = {1};
  tpurt_view mv = check_view_st(dm, TPURT_F32, 1, rs, r1), rv = check_view_st(dr, TPURT_F32, 1, rs, r1);
  CHECK_OK(tpurt_layer_norm(NULL, &yv, &mv, &rv, &xv, NULL, NULL, 1, 0.0, 0));
  check_down(NULL, y, dy, sizeof y);
  double m = 0, v = 0;
  for (int i = 0; i < S; i++) m += y[i];
  for (int i = 0; i < S; i++) v += y[i] * y[i];
  CHECK_NEAR(m, 0, 1e-5);
  CHECK_NEAR(v / S, 1, 1e-4);
  /* batch norm training updates running stats with the unbiased variance */
  float rm[C] = {0}, rvar[C] = {1, 1, 1, 1, 1, 1};
  tpurt_devptr drm = check_up(NULL, rm, sizeof rm), drv = check_up(NULL, rvar, sizeof rvar);
  int64_t cs[1] = {C};
  tpurt_view rmv = check_view_st(drm, TPURT_F32, 1, cs, r1), rvv = check_view_st(drv, TPURT_F32, 1, cs, r1);
  CHECK_OK(tpurt_batch_norm(NULL, &yv, NULL, NULL, &xv, NULL, NULL, &rmv, &rvv, 1, 0.5, 1e-5));
  check_down(NULL, rm, drm, sizeof rm);
  check_down(NULL, rvar, drv, sizeof rvar);
  {
    double mm = 0, vv = 0;
    for (int n = 0; n < N; n++)
      for (int s = 0; s < S; s++) mm += x[n * C * S + 2 * S + s];
    mm /= N * S;
    for (int n = 0; n < N; n++)
      for (int s = 0; s < S; s++) vv += (x[n * C * S + 2 * S + s] - mm) * (x[n * C * S + 2 * S + s] - mm);
    CHECK_NEAR(rm[2], 0.5 * mm, 1e-5);
    CHECK_NEAR(rvar[2], 0.5 + 0.5 * vv / (N * S - 1), 1e-4);
  }
  /* group norm with 3 groups: each (n, g) block normalized */
  int64_t gs[1] = {N * 3};
  mv = check_view_st(dm, TPURT_F32, 1, gs, r1);
  rv = check_view_st(dr, TPURT_F32, 1, gs, r1);
  CHECK_OK(tpurt_group_norm(NULL, &yv, &mv, &rv, &xv, NULL, NULL, 3, 0.0));
  check_down(NULL, y, dy, sizeof y);
  m = 0;
  for (int i = 0; i < 2 * S; i++) m += y[i];
  CHECK_NEAR(m, 0, 1e-4);
  CHECK_ST(tpurt_group_norm(NULL, &yv, &mv, &rv, &xv, NULL, NULL, 4, 0.0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_device_synchronize(0));
  tpurt_free(dx);
  tpurt_free(dy);
  tpurt_free(dm);
  tpurt_free(dr);
  tpurt_free(drm);
  tpurt_free(drv);
}

/* Layer and RMS norm of f32 rows of unit stride are read and written in
 * place by their own loops (norm.c: pairs of rows in the forward,
 * ln_bwd_row_f32 in the backward); rows of another column stride take the
 * general loops through double buffers. Both give the same bits: the same
 * rows in both layouts (131 rows, an odd count, of 133 columns, not a
 * multiple of the 8 lanes; two row parts in the backward). */
static void test_norm_row_paths(void) {
  enum { M = 131, N = 133 };
  static float x[M * N], g[M * N], w[N], xs[M * N * 2], gs[M * N * 2];
  for (int i = 0; i < M * N; i++) {
    x[i] = (float)((i * 7919) % 1009) / 97.0f - 4.0f;
    g[i] = (float)((i * 104729) % 997) / 331.0f - 1.5f;
    xs[2 * i] = x[i], gs[2 * i] = g[i];
  }
  for (int j = 0; j < N; j++) w[j] = 0.5f + (float)j / N;
  int64_t sz[2] = {M, N}, dense[2] = {N, 1}, wide[2] = {2 * N, 2}, rs[1] = {M}, one[1] = {1}, ns[1] = {N};
  tpurt_devptr dw = check_up(NULL, w, sizeof w);
  tpurt_view wv = check_view_st(dw, TPURT_F32, 1, ns, one);
  for (int rms = 0; rms < 2; rms++) {
    static float out[2][6][M * N]; /* 836 KB: not on the stack */
    for (int layout = 0; layout < 2; layout++) {
      const int64_t *st = layout ? wide : dense;
      size_t bytes = layout ? sizeof xs : sizeof x;
      tpurt_devptr dx = check_up(NULL, layout ? xs : x, bytes), dg = check_up(NULL, layout ? gs : g, bytes);
      tpurt_devptr dy = check_up(NULL, NULL, bytes), dgx = check_up(NULL, NULL, bytes);
      tpurt_devptr dm = check_up(NULL, NULL, M * 4), dr = check_up(NULL, NULL, M * 4);
      tpurt_devptr dgw = check_up(NULL, NULL, N * 4), dgb = check_up(NULL, NULL, N * 4);
      tpurt_view xv = check_view_st(dx, TPURT_F32, 2, sz, st), gv = check_view_st(dg, TPURT_F32, 2, sz, st);
      tpurt_view yv = check_view_st(dy, TPURT_F32, 2, sz, st), gxv = check_view_st(dgx, TPURT_F32, 2, sz, st);
      tpurt_view mv = check_view_st(dm, TPURT_F32, 1, rs, one), rv = check_view_st(dr, TPURT_F32, 1, rs, one);
      tpurt_view gwv = check_view_st(dgw, TPURT_F32, 1, ns, one), gbv = check_view_st(dgb, TPURT_F32, 1, ns, one);
      CHECK_OK(tpurt_layer_norm(NULL, &yv, rms ? NULL : &mv, &rv, &xv, &wv, NULL, 1, 1e-5, rms));
      CHECK_OK(tpurt_layer_norm_backward(NULL, &gxv, &gwv, rms ? NULL : &gbv, &gv, &xv, rms ? NULL : &mv, &rv, &wv, 1,
                                         rms));
      static float tmp[M * N * 2];
      check_down(NULL, tmp, dy, bytes);
      for (int i = 0; i < M * N; i++) out[layout][0][i] = tmp[layout ? 2 * i : i];
      check_down(NULL, tmp, dgx, bytes);
      for (int i = 0; i < M * N; i++) out[layout][1][i] = tmp[layout ? 2 * i : i];
      check_down(NULL, out[layout][2], dm, M * 4);
      check_down(NULL, out[layout][3], dr, M * 4);
      check_down(NULL, out[layout][4], dgw, N * 4);
      check_down(NULL, out[layout][5], dgb, N * 4);
      tpurt_free(dx), tpurt_free(dg), tpurt_free(dy), tpurt_free(dgx), tpurt_free(dm), tpurt_free(dr);
      tpurt_free(dgw), tpurt_free(dgb);
    }
    static const int count[6] = {M * N, M * N, M, M, N, N};
    for (int k = 0; k < 6; k++) {
      if (rms && (k == 2 || k == 5)) continue; /* no mean, no bias gradient */
      CHECK(memcmp(out[0][k], out[1][k], sizeof(float) * (size_t)count[k]) == 0);
    }
    CHECK(out[0][1][5] != 0.0f && out[0][4][7] != 0.0f);
  }
  tpurt_free(dw);
}

int main(void) {
  CHECK_OK(tpurt_init());
  test_sums();
  test_extremes();
  test_scan_softmax();
  test_norms();
  test_norm_row_paths();
  TEST_MAIN_END();
}
