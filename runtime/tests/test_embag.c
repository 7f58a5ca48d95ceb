/* test_embag.c — embedding bags (sum / mean / max, padding, per-sample
 * weights, empty bags, backward), embedding renorm, searchsorted, histograms,
 * row selection (kth / median with NaN / mode) and segment reductions
 * against simple host references; bad offsets and indices fail with
 * TPURT_ERR_INDEX at the sync and the stream keeps working. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

enum { W = 6, D = 3, N = 7, B = 4 };

static void test_bag(void) {
  float w[W * D];
  for (int i = 0; i < W * D; i++) w[i] = (float)((i * 7) % 11) - 5.0f;
  int64_t idx[N] = {1, 2, 0, 5, 5, 3, 0};
  int64_t off[B] = {0, 3, 3, 5}; /* bag 1 empty */
  float psw[N] = {0.5f, 2, 1, -1, 3, 1, 1};
  int64_t ws[2] = {W, D}, ns[1] = {N}, bs[1] = {B}, os[2] = {B, D};
  tpurt_devptr dw = check_up(S, w, sizeof w), di = check_up(S, idx, sizeof idx), doff = check_up(S, off, sizeof off);
  tpurt_devptr dp = check_up(S, psw, sizeof psw);
  tpurt_devptr dout = check_up(S, NULL, sizeof(float) * B * D), do2b = check_up(S, NULL, 8 * N);
  tpurt_devptr dbs = check_up(S, NULL, 8 * B), dmi = check_up(S, NULL, 8 * B * D);
  tpurt_view vw = check_view(dw, TPURT_F32, 2, ws), vi = check_view(di, TPURT_I64, 1, ns),
             voff = check_view(doff, TPURT_I64, 1, bs), vp = check_view(dp, TPURT_F32, 1, ns),
             vo = check_view(dout, TPURT_F32, 2, os), vo2b = check_view(do2b, TPURT_I64, 1, ns),
             vbs = check_view(dbs, TPURT_I64, 1, bs), vmi = check_view(dmi, TPURT_I64, 2, os);
  for (int mode = 0; mode < 3; mode++) {
    for (int pad = -1; pad <= 0; pad++) {
      const tpurt_view *pw = mode == 0 && pad == 0 ? &vp : NULL;
      CHECK_OK(tpurt_embedding_bag(S, &vo, &vo2b, &vbs, mode == 2 ? &vmi : NULL, &vw, &vi, &voff, pw,
                                   (tpurt_bag_mode)mode, pad));
      float o[B * D];
      int64_t o2b[N], bsz[B], mi[B * D];
      check_down(S, o, dout, sizeof o);
      check_down(S, o2b, do2b, sizeof o2b);
      check_down(S, bsz, dbs, sizeof bsz);
      if (mode == 2) check_down(S, mi, dmi, sizeof mi);
      for (int b = 0; b < B; b++) {
        int beg = (int)off[b], end = b + 1 < B ? (int)off[b + 1] : N, cnt = 0;
        for (int j = beg; j < end; j++) {
          CHECK_EQ(o2b[j], b);
          cnt += idx[j] != pad;
        }
        CHECK_EQ(bsz[b], cnt);
        for (int d = 0; d < D; d++) {
          double ref = 0;
          int first = 1;
          int64_t arg = -1;
          for (int j = beg; j < end; j++) {
            if (idx[j] == pad) continue;
            double v = w[idx[j] * D + d];
            if (mode == 2) {
              if (first || v > ref) ref = v, arg = idx[j];
              first = 0;
            } else {
              ref += (pw ? psw[j] : 1.0) * v;
            }
          }
          if (mode == 1 && cnt) ref /= cnt;
          CHECK_NEAR(o[b * D + d], ref, 1e-5);
          if (mode == 2) CHECK_EQ(mi[b * D + d], arg);
        }
      }
      /* backward: reference scatter of grad = 1 + b + d */
      float g[B * D], gw[W * D];
      double ref[W * D];
      for (int i = 0; i < B * D; i++) g[i] = (float)(1 + i);
      memset(ref, 0, sizeof ref);
      for (int b = 0; b < B; b++)
        for (int d = 0; d < D; d++) {
          if (mode == 2) {
            if (mi[b * D + d] >= 0) ref[mi[b * D + d] * D + d] += g[b * D + d];
            continue;
          }
          int beg = (int)off[b], end = b + 1 < B ? (int)off[b + 1] : N;
          for (int j = beg; j < end; j++) {
            if (idx[j] == pad) continue;
            double sc = pw ? psw[j] : 1.0;
            if (mode == 1) sc /= (double)bsz[b];
            ref[idx[j] * D + d] += sc * g[b * D + d];
          }
        }
      tpurt_devptr dg = check_up(S, g, sizeof g), dgw = check_up(S, NULL, sizeof gw);
      tpurt_view vg = check_view(dg, TPURT_F32, 2, os), vgw = check_view(dgw, TPURT_F32, 2, ws);
      CHECK_OK(tpurt_embedding_bag_backward(S, &vgw, &vg, &vi, &vo2b, &vbs, &vmi, pw, (tpurt_bag_mode)mode, pad, 0));
      check_down(S, gw, dgw, sizeof gw);
      for (int i = 0; i < W * D; i++) CHECK_NEAR(gw[i], ref[i], 1e-4);
      tpurt_free(dg);
      tpurt_free(dgw);
    }
  }
  /* bad index and bad offsets: errors at the sync; the stream still works */
  int64_t bad[N] = {1, 2, 0, 9, 5, 3, 0};
  CHECK_OK(tpurt_memcpy_h2d(S, di, bad, sizeof bad, 0));
  CHECK_OK(tpurt_embedding_bag(S, &vo, NULL, NULL, NULL, &vw, &vi, &voff, NULL, TPURT_BAG_SUM, -1));
  CHECK_ST(tpurt_stream_synchronize(S), TPURT_ERR_INDEX);
  CHECK(strstr(tpurt_last_error(), "index 9 is out of bounds") != NULL);
  CHECK_OK(tpurt_memcpy_h2d(S, di, idx, sizeof idx, 0));
  int64_t badoff[B] = {0, 3, 2, 5};
  CHECK_OK(tpurt_memcpy_h2d(S, doff, badoff, sizeof badoff, 0));
  CHECK_OK(tpurt_embedding_bag(S, &vo, NULL, NULL, NULL, &vw, &vi, &voff, NULL, TPURT_BAG_SUM, -1));
  CHECK_ST(tpurt_stream_synchronize(S), TPURT_ERR_INDEX);
  CHECK_OK(tpurt_stream_synchronize(S));
  /* no bags: nothing to do */
  int64_t zb[2] = {0, D}, z1[1] = {0};
  tpurt_view vz = check_view(dout, TPURT_F32, 2, zb), vzo = check_view(doff, TPURT_I64, 1, z1);
  CHECK_OK(tpurt_embedding_bag(S, &vz, NULL, NULL, NULL, &vw, &vi, &vzo, NULL, TPURT_BAG_MEAN, -1));
  /* renorm: rows 1 and 5 scaled to max-norm 1 (row 5 listed twice) */
  int64_t ridx[3] = {5, 1, 5};
  tpurt_devptr dr = check_up(S, ridx, sizeof ridx);
  int64_t rs[1] = {3};
  tpurt_view vr = check_view(dr, TPURT_I64, 1, rs);
  CHECK_OK(tpurt_embedding_renorm(S, &vw, &vr, 1.0, 2.0));
  float w2[W * D];
  check_down(S, w2, dw, sizeof w2);
  for (int r = 0; r < W; r++) {
    double n = 0;
    for (int d = 0; d < D; d++) n += (double)w[r * D + d] * w[r * D + d];
    n = sqrt(n);
    double sc = (r == 1 || r == 5) && n > 1.0 ? 1.0 / (n + 1e-7) : 1.0;
    for (int d = 0; d < D; d++) CHECK_NEAR(w2[r * D + d], w[r * D + d] * sc, 1e-5);
  }
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_free(dw), tpurt_free(di), tpurt_free(doff), tpurt_free(dp), tpurt_free(dout), tpurt_free(do2b);
  tpurt_free(dbs), tpurt_free(dmi), tpurt_free(dr);
}

static void test_search_hist(void) {
  double seq[5] = {1, 2, 2, 5, 7};
  double vals[6] = {0, 2, 6, 7, 8, NAN};
  int64_t ss[2] = {1, 5}, vs[2] = {1, 6};
  tpurt_devptr ds = check_up(S, seq, sizeof seq), dv = check_up(S, vals, sizeof vals), dout = check_up(S, NULL, 8 * 6);
  tpurt_view vseq = check_view(ds, TPURT_F64, 2, ss), vv = check_view(dv, TPURT_F64, 2, vs);
  tpurt_view vo = check_view(dout, TPURT_I64, 2, vs);
  int64_t want_l[6] = {0, 1, 4, 4, 5, 5}, want_r[6] = {0, 3, 4, 5, 5, 5}, o[6];
  CHECK_OK(tpurt_searchsorted(S, &vo, &vseq, &vv, NULL, 0));
  check_down(S, o, dout, sizeof o);
  for (int i = 0; i < 6; i++) CHECK_EQ(o[i], want_l[i]);
  CHECK_OK(tpurt_searchsorted(S, &vo, &vseq, &vv, NULL, 1));
  check_down(S, o, dout, sizeof o);
  for (int i = 0; i < 6; i++) CHECK_EQ(o[i], want_r[i]);
  /* histogram of 6 values over edges [0, 2, 4, 8]: NaN and 8 (last edge) */
  double edges[4] = {0, 2, 4, 8};
  int64_t es[1] = {4}, hs[1] = {3}, ins[2] = {6, 1};
  tpurt_devptr de = check_up(S, edges, sizeof edges), dh = check_up(S, NULL, 8 * 3);
  tpurt_view ve = check_view(de, TPURT_F64, 1, es), vh = check_view(dh, TPURT_F64, 1, hs);
  tpurt_view vin = check_view(dv, TPURT_F64, 2, ins);
  double h[3];
  CHECK_OK(tpurt_histogramdd(S, &vh, &vin, NULL, &ve, 1, TPURT_HIST_BINARY));
  check_down(S, h, dh, sizeof h);
  CHECK_EQ(h[0], 1); /* 0 */
  CHECK_EQ(h[1], 1); /* 2 */
  CHECK_EQ(h[2], 3); /* 6, 7, 8 */
  /* linear edges [0, 3, 6, 9] with and without the local search */
  double ledges[4] = {0, 3, 6, 9};
  CHECK_OK(tpurt_memcpy_h2d(S, de, ledges, sizeof ledges, 0));
  for (int m = 0; m < 2; m++) {
    CHECK_OK(tpurt_histogramdd(S, &vh, &vin, NULL, &ve, 1, m ? TPURT_HIST_LINEAR_SEARCH : TPURT_HIST_LINEAR));
    check_down(S, h, dh, sizeof h);
    CHECK_EQ(h[0], 2); /* 0, 2 */
    CHECK_EQ(h[1], 0);
    CHECK_EQ(h[2], 3); /* 6, 7, 8 */
  }
  tpurt_free(ds), tpurt_free(dv), tpurt_free(dout), tpurt_free(de), tpurt_free(dh);
}

static void test_select_segment(void) {
  float x[2][5] = {{3, 1, NAN, 2, 1}, {4, 4, 2, 2, 9}};
  int64_t xs[2] = {2, 5}, rs[2] = {2, 1};
  tpurt_devptr dx = check_up(S, x, sizeof x), dv = check_up(S, NULL, 8), di = check_up(S, NULL, 16);
  tpurt_view vx = check_view(dx, TPURT_F32, 2, xs), vv = check_view(dv, TPURT_F32, 2, rs);
  tpurt_view vi = check_view(di, TPURT_I64, 2, rs);
  float v[2];
  int64_t i[2];
  CHECK_OK(tpurt_select_rows(S, &vv, &vi, &vx, TPURT_SELECT_MEDIAN, 0));
  check_down(S, v, dv, sizeof v), check_down(S, i, di, sizeof i);
  CHECK(isnan(v[0]) && i[0] == 2);
  CHECK(v[1] == 4 && i[1] == 0);
  CHECK_OK(tpurt_select_rows(S, &vv, &vi, &vx, TPURT_SELECT_NANMEDIAN, 0));
  check_down(S, v, dv, sizeof v), check_down(S, i, di, sizeof i);
  CHECK(v[0] == 1 && (i[0] == 1 || i[0] == 4));
  CHECK_OK(tpurt_select_rows(S, &vv, &vi, &vx, TPURT_SELECT_MODE, 0));
  check_down(S, v, dv, sizeof v), check_down(S, i, di, sizeof i);
  CHECK(v[0] == 1 && i[0] == 4);
  CHECK(v[1] == 2 && i[1] == 3);
  CHECK_OK(tpurt_select_rows(S, &vv, &vi, &vx, TPURT_SELECT_KTH, 4));
  check_down(S, v, dv, sizeof v), check_down(S, i, di, sizeof i);
  CHECK(v[1] == 9 && i[1] == 4);
  CHECK_ST(tpurt_select_rows(S, &vv, &vi, &vx, TPURT_SELECT_KTH, 5), TPURT_ERR_INVALID_ARGUMENT);
  /* segments of [1..6] with lengths 2, 0, 4 */
  double data[6] = {1, 2, 3, 4, 5, 6};
  int64_t off[4] = {0, 2, 2, 6};
  int64_t d3[3] = {1, 6, 1}, o3[3] = {1, 3, 1}, of2[2] = {1, 4};
  tpurt_devptr dd = check_up(S, data, sizeof data), dof = check_up(S, off, sizeof off), dso = check_up(S, NULL, 24);
  tpurt_devptr dg = check_up(S, NULL, 48);
  tpurt_view vd = check_view(dd, TPURT_F64, 3, d3), vof = check_view(dof, TPURT_I64, 2, of2),
             vso = check_view(dso, TPURT_F64, 3, o3), vg = check_view(dg, TPURT_F64, 3, d3);
  double so[3], gd[6];
  CHECK_OK(tpurt_segment_reduce(S, &vso, &vd, &vof, TPURT_SEG_SUM, 0, 0));
  check_down(S, so, dso, sizeof so);
  CHECK(so[0] == 3 && so[1] == 0 && so[2] == 18);
  CHECK_OK(tpurt_segment_reduce(S, &vso, &vd, &vof, TPURT_SEG_MAX, 1, -7));
  check_down(S, so, dso, sizeof so);
  CHECK(so[0] == 2 && so[1] == -7 && so[2] == 6);
  CHECK_OK(tpurt_segment_reduce(S, &vso, &vd, &vof, TPURT_SEG_PROD, 0, 0));
  check_down(S, so, dso, sizeof so);
  CHECK(so[0] == 2 && so[1] == 1 && so[2] == 360);
  CHECK_OK(tpurt_segment_reduce_backward(S, &vg, &vso, &vso, &vd, &vof, TPURT_SEG_PROD, 0, 0));
  check_down(S, gd, dg, sizeof gd);
  CHECK_NEAR(gd[0], 2 * 2, 1e-9);
  CHECK_NEAR(gd[5], 360 * 360 / 6.0, 1e-6);
  int64_t badoff[4] = {0, 2, 1, 6};
  CHECK_OK(tpurt_memcpy_h2d(S, dof, badoff, sizeof badoff, 0));
  CHECK_OK(tpurt_segment_reduce(S, &vso, &vd, &vof, TPURT_SEG_SUM, 0, 0));
  CHECK_ST(tpurt_stream_synchronize(S), TPURT_ERR_INDEX);
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_free(dx), tpurt_free(dv), tpurt_free(di), tpurt_free(dd), tpurt_free(dof), tpurt_free(dso), tpurt_free(dg);
}

int main(void) {
  CHECK_OK(tpurt_stream_default(0, &S));
  test_bag();
  test_search_hist();
  test_select_segment();
  CHECK_OK(tpurt_device_synchronize(0));
  TEST_MAIN_END();
}
