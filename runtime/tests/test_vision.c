/* test_vision.c — 3-D pooling, plane scatter (and its bad-index error),
 * interpolation against naive references (nearest, linear, adjoint
 * identity), grid sampling identity, im2col/col2im adjointness, the
 * distance kernels, conv3d vs a naive loop, empty tensors and NaN. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static tpurt_view vn(tpurt_devptr p, tpurt_dtype dt, int nd, const int64_t *sz) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p, v.dtype = dt, v.ndim = nd;
  int64_t st = 1;
  for (int k = nd - 1; k >= 0; k--) v.sizes[k] = sz[k], v.strides[k] = st, st *= sz[k];
  return v;
}
static double frand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return ((*s >> 8) % 20000) / 10000.0 - 1.0;
}

static void test_pool3d(void) {
  int64_t is[5] = {1, 2, 3, 4, 4}, os[5] = {1, 2, 1, 2, 2};
  double x[96], y[8];
  int64_t ix[8];
  unsigned s = 7;
  for (int i = 0; i < 96; i++) x[i] = frand(&s);
  x[48 + 5] = NAN; /* channel 1, d 0, h 1, w 1 */
  tpurt_devptr dx = check_up(S, x, sizeof x), dy = check_up(S, NULL, sizeof y), di = check_up(S, NULL, sizeof ix);
  tpurt_view X = vn(dx, TPURT_F64, 5, is), Y = vn(dy, TPURT_F64, 5, os), I = vn(di, TPURT_I64, 5, os);
  tpurt_pool3d_params p = {{3, 2, 2}, {3, 2, 2}, {0, 0, 0}, {1, 1, 1}, 1, 0};
  CHECK_OK(tpurt_max_pool3d(S, &Y, &I, &X, &p));
  check_down(S, y, dy, sizeof y);
  check_down(S, ix, di, sizeof ix);
  for (int c = 0; c < 2; c++)
    for (int oh = 0; oh < 2; oh++)
      for (int ow = 0; ow < 2; ow++) {
        double m = -INFINITY;
        int64_t bi = 0;
        int nan = 0;
        for (int d = 0; d < 3 && !nan; d++)
          for (int h = 2 * oh; h < 2 * oh + 2 && !nan; h++)
            for (int w = 2 * ow; w < 2 * ow + 2; w++) {
              double v = x[c * 48 + d * 16 + h * 4 + w];
              if (isnan(v)) {
                m = v, bi = d * 16 + h * 4 + w, nan = 1;
                break;
              }
              if (v > m) m = v, bi = d * 16 + h * 4 + w;
            }
        int o = c * 4 + oh * 2 + ow;
        CHECK((isnan(m) && isnan(y[o])) || y[o] == m);
        CHECK_EQ(ix[o], bi);
      }
  /* backward = scatter-add of the gradient at the indices */
  double g[8] = {1, 2, 3, 4, 5, 6, 7, 8}, gx[96];
  tpurt_devptr dg = check_up(S, g, sizeof g), dgx = check_up(S, NULL, sizeof gx);
  tpurt_view G = vn(dg, TPURT_F64, 5, os), GX = vn(dgx, TPURT_F64, 5, is);
  CHECK_OK(tpurt_scatter_planes(S, &GX, &G, &I, 1));
  check_down(S, gx, dgx, sizeof gx);
  double tot = 0;
  for (int i = 0; i < 96; i++) tot += gx[i];
  CHECK(fabs(tot - 36) < 1e-12);
  CHECK(gx[48 + 5] == 5);
  /* unpool with a bad index fails at the next sync; the stream stays usable */
  int64_t bad[8] = {0, 1, 2, 3, 4, 5, 6, 1000};
  tpurt_devptr db = check_up(S, bad, sizeof bad);
  tpurt_view B = vn(db, TPURT_I64, 5, os);
  tpurt_status st = tpurt_scatter_planes(S, &GX, &G, &B, 0);
  if (st == TPURT_OK) st = tpurt_stream_synchronize(S);
  CHECK_EQ(st, TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_stream_synchronize(S));
  /* avg pool of ones with count_include_pad=0 is 1 everywhere */
  for (int i = 0; i < 96; i++) x[i] = 1;
  CHECK_OK(tpurt_memcpy_h2d(S, dx, x, sizeof x, 0));
  tpurt_pool3d_params pa = {{2, 3, 3}, {1, 2, 2}, {1, 1, 1}, {1, 1, 1}, 0, 0};
  int64_t os2[5] = {1, 2, 4, 2, 2};
  double y2[32];
  tpurt_devptr dy2 = check_up(S, NULL, sizeof y2);
  tpurt_view Y2 = vn(dy2, TPURT_F64, 5, os2);
  CHECK_OK(tpurt_avg_pool3d(S, &Y2, &X, &pa));
  check_down(S, y2, dy2, sizeof y2);
  for (int i = 0; i < 32; i++) CHECK(fabs(y2[i] - 1) < 1e-12);
  /* empty batch is a no-op */
  int64_t e5[5] = {0, 2, 3, 4, 4}, eo[5] = {0, 2, 1, 2, 2};
  tpurt_view XE = vn(dx, TPURT_F64, 5, e5), YE = vn(dy, TPURT_F64, 5, eo);
  CHECK_OK(tpurt_max_pool3d(S, &YE, NULL, &XE, &p));
  tpurt_free(dx), tpurt_free(dy), tpurt_free(di), tpurt_free(dg), tpurt_free(dgx), tpurt_free(db), tpurt_free(dy2);
}

static void test_interp(void) {
  /* 1-D linear, align_corners, 4 -> 7 */
  int64_t is[5] = {1, 1, 1, 1, 4}, os[5] = {1, 1, 1, 1, 7};
  float x[4] = {0, 1, 4, 9}, y[7];
  tpurt_devptr dx = check_up(S, x, sizeof x), dy = check_up(S, NULL, sizeof y);
  tpurt_view X = vn(dx, TPURT_F32, 5, is), Y = vn(dy, TPURT_F32, 5, os);
  double sc[3] = {-1, -1, -1};
  CHECK_OK(tpurt_interpolate(S, &Y, &X, TPURT_INTERP_LINEAR, 1, sc));
  check_down(S, y, dy, sizeof y);
  for (int o = 0; o < 7; o++) {
    double src = o * 3.0 / 6.0;
    int i0 = (int)src;
    int i1 = i0 < 3 ? i0 + 1 : i0;
    double l = src - i0, want = x[i0] * (1 - l) + x[i1] * l;
    CHECK(fabs(y[o] - want) < 1e-6);
  }
  /* nearest 4 -> 7 */
  CHECK_OK(tpurt_interpolate(S, &Y, &X, TPURT_INTERP_NEAREST, 0, sc));
  check_down(S, y, dy, sizeof y);
  for (int o = 0; o < 7; o++) {
    int s = (int)floorf(o * (4.0f / 7.0f));
    CHECK(y[o] == x[s]);
  }
  /* adjoint identity <check_up(S, x), g> = <x, up^T(g)> for cubic 2-D */
  int64_t i2[5] = {1, 1, 1, 3, 5}, o2[5] = {1, 1, 1, 7, 4};
  double a[15], g[28], ya[28], ga[15];
  unsigned s = 3;
  for (int i = 0; i < 15; i++) a[i] = frand(&s);
  for (int i = 0; i < 28; i++) g[i] = frand(&s);
  tpurt_devptr da = check_up(S, a, sizeof a), dg = check_up(S, g, sizeof g), dya = check_up(S, NULL, sizeof ya);
  tpurt_devptr dga = check_up(S, NULL, sizeof ga);
  tpurt_view A = vn(da, TPURT_F64, 5, i2), Gv = vn(dg, TPURT_F64, 5, o2), YA = vn(dya, TPURT_F64, 5, o2),
             GA = vn(dga, TPURT_F64, 5, i2);
  for (int mode = TPURT_INTERP_NEAREST; mode <= TPURT_INTERP_CUBIC_AA; mode++) {
    CHECK_OK(tpurt_interpolate(S, &YA, &A, (tpurt_interp_mode)mode, 0, sc));
    CHECK_OK(tpurt_interpolate_backward(S, &GA, &Gv, (tpurt_interp_mode)mode, 0, sc));
    check_down(S, ya, dya, sizeof ya);
    check_down(S, ga, dga, sizeof ga);
    double l = 0, r = 0;
    for (int i = 0; i < 28; i++) l += ya[i] * g[i];
    for (int i = 0; i < 15; i++) r += a[i] * ga[i];
    CHECK(fabs(l - r) < 1e-9);
  }
  /* zero-size input with non-empty output is an error */
  int64_t z[5] = {1, 1, 1, 1, 0};
  tpurt_view Z = vn(dx, TPURT_F32, 5, z);
  CHECK_ST(tpurt_interpolate(S, &Y, &Z, TPURT_INTERP_LINEAR, 0, sc), TPURT_ERR_INVALID_ARGUMENT);
  tpurt_free(dx), tpurt_free(dy), tpurt_free(da), tpurt_free(dg), tpurt_free(dya), tpurt_free(dga);
}

static void test_grid_and_fold(void) {
  /* identity grid with align_corners reproduces the input (bilinear) */
  int64_t is[5] = {1, 2, 1, 3, 4}, gs[5] = {1, 1, 3, 4, 2};
  double x[24], grid[24], y[24];
  unsigned s = 5;
  for (int i = 0; i < 24; i++) x[i] = frand(&s);
  for (int h = 0; h < 3; h++)
    for (int w = 0; w < 4; w++) grid[(h * 4 + w) * 2] = -1 + 2.0 * w / 3, grid[(h * 4 + w) * 2 + 1] = -1 + 2.0 * h / 2;
  tpurt_devptr dx = check_up(S, x, sizeof x), dg = check_up(S, grid, sizeof grid), dy = check_up(S, NULL, sizeof y);
  tpurt_view X = vn(dx, TPURT_F64, 5, is), G = vn(dg, TPURT_F64, 5, gs), Y = vn(dy, TPURT_F64, 5, is);
  for (int interp = 0; interp < 3; interp++) {
    CHECK_OK(tpurt_grid_sample(S, &Y, &X, &G, interp, 1, 1));
    check_down(S, y, dy, sizeof y);
    for (int i = 0; i < 24; i++) CHECK(fabs(y[i] - x[i]) < 1e-9);
  }
  CHECK_OK(tpurt_grid_sample(S, &Y, &X, &G, 2, 0, 1));
  /* im2col / col2im adjointness */
  int64_t im[4] = {2, 2, 4, 5}, cs[3] = {2, 2 * 2 * 3, 0};
  int64_t k[2] = {2, 3};
  tpurt_conv_params p = {{2, 1}, {1, 1}, {1, 2}, 1};
  int64_t oh = (4 + 2 - 1 * (2 - 1) - 1) / 2 + 1, ow = (5 + 2 - 2 * (3 - 1) - 1) / 1 + 1;
  cs[2] = oh * ow;
  size_t ni = 80, nc = (size_t)(2 * 12 * cs[2]);
  double *a = malloc(ni * 8), *c = malloc(nc * 8), *ca = malloc(nc * 8), *ia = malloc(ni * 8);
  for (size_t i = 0; i < ni; i++) a[i] = frand(&s);
  for (size_t i = 0; i < nc; i++) c[i] = frand(&s);
  tpurt_devptr da = check_up(S, a, ni * 8), dc = check_up(S, c, nc * 8), dca = check_up(S, NULL, nc * 8);
  tpurt_devptr dia = check_up(S, NULL, ni * 8);
  tpurt_view Ai = vn(da, TPURT_F64, 4, im), Cc = vn(dc, TPURT_F64, 3, cs), CA = vn(dca, TPURT_F64, 3, cs),
             IA = vn(dia, TPURT_F64, 4, im);
  CHECK_OK(tpurt_im2col(S, &CA, &Ai, k, &p, 0));
  CHECK_OK(tpurt_im2col(S, &Cc, &IA, k, &p, 1));
  check_down(S, ca, dca, nc * 8);
  check_down(S, ia, dia, ni * 8);
  double l = 0, r = 0;
  for (size_t i = 0; i < nc; i++) l += ca[i] * c[i];
  for (size_t i = 0; i < ni; i++) r += a[i] * ia[i];
  CHECK(fabs(l - r) < 1e-9);
  cs[2] += 1;
  tpurt_view Bad = vn(dc, TPURT_F64, 3, cs);
  CHECK_ST(tpurt_im2col(S, &Bad, &Ai, k, &p, 0), TPURT_ERR_INVALID_ARGUMENT);
  free(a), free(c), free(ca), free(ia);
  tpurt_free(dx), tpurt_free(dg), tpurt_free(dy), tpurt_free(da), tpurt_free(dc), tpurt_free(dca), tpurt_free(dia);
}

static void test_dist_conv3d(void) {
  /* pdist / cdist p = 2 and inf against a naive loop */
  double x[12], d[6], c[16];
  unsigned s = 11;
  for (int i = 0; i < 12; i++) x[i] = frand(&s);
  int64_t xs[2] = {4, 3}, ds[1] = {6}, x3[3] = {1, 4, 3}, c3[3] = {1, 4, 4};
  tpurt_devptr dx = check_up(S, x, sizeof x), dd = check_up(S, NULL, sizeof d), dc = check_up(S, NULL, sizeof c);
  tpurt_view X = vn(dx, TPURT_F64, 2, xs), D = vn(dd, TPURT_F64, 1, ds), X3 = vn(dx, TPURT_F64, 3, x3),
             C = vn(dc, TPURT_F64, 3, c3);
  CHECK_OK(tpurt_pdist(S, &D, &X, 2.0));
  CHECK_OK(tpurt_cdist(S, &C, &X3, &X3, INFINITY));
  check_down(S, d, dd, sizeof d);
  check_down(S, c, dc, sizeof c);
  int q = 0;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      double s2 = 0, mx = 0;
      for (int k = 0; k < 3; k++) {
        double df = x[i * 3 + k] - x[j * 3 + k];
        s2 += df * df;
        mx = fabs(df) > mx ? fabs(df) : mx;
      }
      CHECK(fabs(c[i * 4 + j] - mx) < 1e-12);
      if (j > i) CHECK(fabs(d[q++] - sqrt(s2)) < 1e-12);
    }
  /* conv3d of a one-hot kernel shifts the volume */
  int64_t xs5[5] = {1, 1, 3, 3, 3}, ws5[5] = {1, 1, 2, 2, 2}, ys5[5] = {1, 1, 2, 2, 2};
  double v[27], w[8] = {0, 0, 0, 0, 0, 0, 0, 1}, y[8];
  for (int i = 0; i < 27; i++) v[i] = i;
  tpurt_devptr dv = check_up(S, v, sizeof v), dw = check_up(S, w, sizeof w), dy = check_up(S, NULL, sizeof y);
  tpurt_view V = vn(dv, TPURT_F64, 5, xs5), W = vn(dw, TPURT_F64, 5, ws5), Y = vn(dy, TPURT_F64, 5, ys5);
  tpurt_conv3d_params cp = {{1, 1, 1}, {0, 0, 0}, {1, 1, 1}, 1};
  CHECK_OK(tpurt_conv3d(S, &Y, &V, &W, NULL, &cp, TPURT_PRECISION_HIGHEST));
  check_down(S, y, dy, sizeof y);
  for (int dd2 = 0; dd2 < 2; dd2++)
    for (int h = 0; h < 2; h++)
      for (int ww = 0; ww < 2; ww++) CHECK(y[(dd2 * 2 + h) * 2 + ww] == v[(dd2 + 1) * 9 + (h + 1) * 3 + ww + 1]);
  tpurt_free(dx), tpurt_free(dd), tpurt_free(dc), tpurt_free(dv), tpurt_free(dw), tpurt_free(dy);
}

int main(void) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  test_pool3d();
  test_interp();
  test_grid_and_fold();
  test_dist_conv3d();
  CHECK_OK(tpurt_stream_synchronize(S));
  if (g_failures) {
    fprintf(stderr, "%d failure(s)\n", g_failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
