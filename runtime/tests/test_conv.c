/* test_conv.c — conv2d forward vs a naive loop (stride, padding, dilation,
 * groups, bias, 1x1), backward input / weight / bias checked through the
 * adjoint identities <dy, conv(x)> = <bwd_in(dy), x> = <bwd_w(dy, x), w>,
 * max/avg pooling and upsampling on small cases, and argument errors. */
#include <stdint.h>

#include "check.h"

static tpurt_stream *S;

static tpurt_view v4(tpurt_devptr p, tpurt_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p, v.dtype = dt, v.ndim = 4;
  v.sizes[0] = a, v.sizes[1] = b, v.sizes[2] = c, v.sizes[3] = d;
  v.strides[3] = 1, v.strides[2] = d, v.strides[1] = c * d, v.strides[0] = b * c * d;
  return v;
}
static tpurt_view v1(tpurt_devptr p, tpurt_dtype dt, int64_t n) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = p, v.dtype = dt, v.ndim = 1, v.sizes[0] = n, v.strides[0] = 1;
  return v;
}

static double frand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return ((*s >> 8) % 20000) / 10000.0 - 1.0;
}

static void conv_case(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t k, int64_t st, int64_t pad,
                      int64_t dil, int64_t G) {
  int64_t Ho = (H + 2 * pad - dil * (k - 1) - 1) / st + 1, Wo = (W + 2 * pad - dil * (k - 1) - 1) / st + 1;
  int64_t Cig = Ci / G, Cog = Co / G;
  size_t nx = N * Ci * H * W, nw = Co * Cig * k * k, ny = N * Co * Ho * Wo;
  double *x = malloc(nx * 8), *w = malloc(nw * 8), *b = malloc(Co * 8), *y = calloc(ny, 8), *gy = malloc(ny * 8);
  unsigned s = 42;
  for (size_t i = 0; i < nx; i++) x[i] = frand(&s);
  for (size_t i = 0; i < nw; i++) w[i] = frand(&s);
  for (int64_t i = 0; i < Co; i++) b[i] = frand(&s);
  for (size_t i = 0; i < ny; i++) gy[i] = frand(&s);
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < Co; co++)
      for (int64_t oh = 0; oh < Ho; oh++)
        for (int64_t ow = 0; ow < Wo; ow++) {
          int64_t g = co / Cog;
          double acc = b[co];
          for (int64_t ci = 0; ci < Cig; ci++)
            for (int64_t i = 0; i < k; i++)
              for (int64_t j = 0; j < k; j++) {
                int64_t ih = oh * st - pad + i * dil, iw = ow * st - pad + j * dil;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x[((n * Ci + g * Cig + ci) * H + ih) * W + iw] * w[((co * Cig + ci) * k + i) * k + j];
              }
          y[((n * Co + co) * Ho + oh) * Wo + ow] = acc;
        }
  tpurt_conv_params p = {{st, st}, {pad, pad}, {dil, dil}, G};
  tpurt_devptr dx = check_up(S, x, nx * 8), dw = check_up(S, w, nw * 8), db = check_up(S, b, Co * 8), dy;
  tpurt_devptr dgy = check_up(S, gy, ny * 8), dgx, dgw, dgb;
  CHECK_OK(tpurt_malloc(0, ny * 8, S, &dy));
  CHECK_OK(tpurt_malloc(0, nx * 8, S, &dgx));
  CHECK_OK(tpurt_malloc(0, nw * 8, S, &dgw));
  CHECK_OK(tpurt_malloc(0, Co * 8, S, &dgb));
  tpurt_view X = v4(dx, TPURT_F64, N, Ci, H, W), Wv = v4(dw, TPURT_F64, Co, Cig, k, k), B = v1(db, TPURT_F64, Co);
  tpurt_view Y = v4(dy, TPURT_F64, N, Co, Ho, Wo), GY = v4(dgy, TPURT_F64, N, Co, Ho, Wo);
  tpurt_view GX = v4(dgx, TPURT_F64, N, Ci, H, W), GW = v4(dgw, TPURT_F64, Co, Cig, k, k), GB = v1(dgb, TPURT_F64, Co);
  CHECK_OK(tpurt_conv2d(S, &Y, &X, &Wv, &B, &p, TPURT_PRECISION_HIGHEST));
  CHECK_OK(tpurt_conv2d_backward_input(S, &GX, &GY, &Wv, NULL, &p, TPURT_PRECISION_HIGHEST));
  CHECK_OK(tpurt_conv2d_backward_weight(S, &GW, &GB, &GY, &X, &p, TPURT_PRECISION_HIGHEST));
  double *got = malloc(ny * 8), *gx = malloc(nx * 8), *gw = malloc(nw * 8), *gb = malloc(Co * 8);
  check_down(S, got, dy, ny * 8);
  check_down(S, gx, dgx, nx * 8);
  check_down(S, gw, dgw, nw * 8);
  check_down(S, gb, dgb, Co * 8);
  double e = 0, lhs = 0, rx = 0, rw = 0, sb = 0, rb = 0;
  for (size_t i = 0; i < ny; i++) e = fmax(e, fabs(got[i] - y[i]));
  CHECK(e < 1e-10);
  /* <gy, y - b> = <gx, x> = <gw, w>;  gb = sum of gy per channel */
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < Co; c++)
      for (int64_t l = 0; l < Ho * Wo; l++) lhs += gy[(n * Co + c) * Ho * Wo + l] * (y[(n * Co + c) * Ho * Wo + l] - b[c]);
  for (size_t i = 0; i < nx; i++) rx += gx[i] * x[i];
  for (size_t i = 0; i < nw; i++) rw += gw[i] * w[i];
  CHECK_NEAR(rx, lhs, 1e-8 * (1 + fabs(lhs)));
  CHECK_NEAR(rw, lhs, 1e-8 * (1 + fabs(lhs)));
  for (int64_t n = 0; n < N; n++)
    for (int64_t l = 0; l < Ho * Wo; l++) sb += gy[(n * Co + 0) * Ho * Wo + l];
  rb = gb[0];
  CHECK_NEAR(rb, sb, 1e-9);
  /* f32 path agrees with f64 */
  float *xf = malloc(nx * 4), *wf = malloc(nw * 4), *yf = malloc(ny * 4);
  for (size_t i = 0; i < nx; i++) xf[i] = (float)x[i];
  for (size_t i = 0; i < nw; i++) wf[i] = (float)w[i];
  tpurt_devptr dxf = check_up(S, xf, nx * 4), dwf = check_up(S, wf, nw * 4), dyf;
  CHECK_OK(tpurt_malloc(0, ny * 4, S, &dyf));
  tpurt_view Xf = v4(dxf, TPURT_F32, N, Ci, H, W), Wf = v4(dwf, TPURT_F32, Co, Cig, k, k),
             Yf = v4(dyf, TPURT_F32, N, Co, Ho, Wo);
  CHECK_OK(tpurt_conv2d(S, &Yf, &Xf, &Wf, &B, &p, TPURT_PRECISION_HIGHEST));
  check_down(S, yf, dyf, ny * 4);
  e = 0;
  for (size_t i = 0; i < ny; i++) e = fmax(e, fabs(yf[i] - y[i]));
  CHECK(e < 1e-4);
  /* errors: wrong output size, channels not divisible by groups */
  Yf.sizes[3] += 1;
  CHECK_ST(tpurt_conv2d(S, &Yf, &Xf, &Wf, NULL, &p, TPURT_PRECISION_HIGHEST), TPURT_ERR_INVALID_ARGUMENT);
  Yf.sizes[3] -= 1;
  tpurt_conv_params bad = p;
  bad.groups = Ci + 1;
  CHECK_ST(tpurt_conv2d(S, &Yf, &Xf, &Wf, NULL, &bad, TPURT_PRECISION_HIGHEST), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_devptr all[] = {dx, dw, db, dy, dgy, dgx, dgw, dgb, dxf, dwf, dyf};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tpurt_free(all[i]);
  free(x), free(w), free(b), free(y), free(gy), free(got), free(gx), free(gw), free(gb), free(xf), free(wf), free(yf);
}

static void test_pool_upsample(void) {
  float in[16];
  for (int i = 0; i < 16; i++) in[i] = (float)((i * 7) % 16);
  in[5] = NAN;
  tpurt_devptr d = check_up(S, in, sizeof in), o, ix, g;
  CHECK_OK(tpurt_malloc(0, 64, S, &o));
  CHECK_OK(tpurt_malloc(0, 64, S, &ix));
  CHECK_OK(tpurt_malloc(0, 64, S, &g));
  tpurt_view X = v4(d, TPURT_F32, 1, 1, 4, 4), O = v4(o, TPURT_F32, 1, 1, 2, 2), I = v4(ix, TPURT_I64, 1, 1, 2, 2);
  tpurt_pool_params p = {{2, 2}, {2, 2}, {0, 0}, {1, 1}, 1, 0};
  CHECK_OK(tpurt_max_pool2d(S, &O, &I, &X, &p));
  float out[4];
  int64_t idx[4];
  check_down(S, out, o, 16);
  check_down(S, idx, ix, 32);
  CHECK(isnan(out[0]) && idx[0] == 5); /* NaN wins */
  /* window rows 0-1, cols 2-3: values 14, 5, 10, 1 (indices 2, 3, 6, 7) */
  CHECK(out[1] == 14.0f && idx[1] == 2);
  CHECK_OK(tpurt_avg_pool2d(S, &O, &X, &p));
  check_down(S, out, o, 16);
  CHECK(out[1] == (14.0f + 5.0f + 10.0f + 1.0f) / 4);
  /* nearest 2x upsample of a 2x2 */
  tpurt_devptr u;
  CHECK_OK(tpurt_malloc(0, 64, S, &u));
  tpurt_view U = v4(u, TPURT_F32, 1, 1, 4, 4), O2 = v4(o, TPURT_F32, 1, 1, 2, 2);
  float src[4] = {1, 2, 3, 4}, res[16];
  CHECK_OK(tpurt_memcpy_h2d(S, o, src, 16, 0));
  CHECK_OK(tpurt_upsample2d(S, &U, &O2, TPURT_UPSAMPLE_NEAREST, 0, -1, -1));
  check_down(S, res, u, 64);
  CHECK(res[0] == 1 && res[1] == 1 && res[2] == 2 && res[15] == 4 && res[8] == 3);
  /* bilinear align_corners: corners preserved, centre is the mean */
  tpurt_view U3 = v4(u, TPURT_F32, 1, 1, 3, 3);
  CHECK_OK(tpurt_upsample2d(S, &U3, &O2, TPURT_UPSAMPLE_BILINEAR, 1, -1, -1));
  check_down(S, res, u, 36);
  CHECK(res[0] == 1 && res[2] == 2 && res[6] == 3 && res[8] == 4);
  CHECK_NEAR(res[4], 2.5, 1e-6);
  /* backward of nearest sums the 2x2 blocks */
  float ones[16];
  for (int i = 0; i < 16; i++) ones[i] = 1;
  CHECK_OK(tpurt_memcpy_h2d(S, u, ones, 64, 0));
  CHECK_OK(tpurt_upsample2d_backward(S, &O2, &U, TPURT_UPSAMPLE_NEAREST, 0, -1, -1));
  check_down(S, out, o, 16);
  CHECK(out[0] == 4 && out[3] == 4);
  /* errors */
  tpurt_view bad = O;
  bad.sizes[1] = 2;
  CHECK_ST(tpurt_max_pool2d(S, &bad, NULL, &X, &p), TPURT_ERR_INVALID_ARGUMENT);
  p.kernel[0] = 0;
  CHECK_ST(tpurt_avg_pool2d(S, &O, &X, &p), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_free(d), tpurt_free(o), tpurt_free(ix), tpurt_free(g), tpurt_free(u);
}

int main(void) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  conv_case(2, 4, 7, 6, 6, 3, 1, 1, 1, 1);
  conv_case(2, 4, 9, 8, 6, 3, 2, 0, 2, 2);
  conv_case(1, 6, 5, 5, 6, 3, 1, 1, 1, 6); /* depthwise */
  conv_case(3, 8, 4, 4, 5, 1, 1, 0, 1, 1); /* 1x1 */
  conv_case(1, 3, 11, 11, 4, 5, 3, 2, 1, 1);
  test_pool_upsample();
  if (g_failures) {
    fprintf(stderr, "%d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_conv: OK\n");
  return 0;
}
