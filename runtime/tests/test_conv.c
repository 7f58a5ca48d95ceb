/* test_conv.c — conv2d forward vs a naive loop (stride, padding, dilation,
 * groups, bias, 1x1), backward input / weight / bias checked through the
 * adjoint identities <dy, conv(x)> = <bwd_in(dy), x> = <bwd_w(dy, x), w>,
 * max/avg pooling and upsampling on small cases, and argument errors. */
#define _GNU_SOURCE
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

/* ------------------------------------------------ direct path (few C_in)
 * Forwards with at most 4 input channels per group run as direct loops
 * (conv_direct.c) whose summation order is fixed: bias, then
 * (c_in, kh, kw) in order with one fused multiply-add each, padding taps
 * included as zeros. The reference below does exactly that in f32, so the
 * direct path must match it bit for bit (AVX2 tiles and portable loops
 * alike); the im2col + GEMM path (TORCH_TPU_CONV_DIRECT=0) must agree to
 * rounding. Views may be strided (xs: element strides of x or NULL). */
static int direct_case(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t kh, int64_t kw, int64_t sh,
                       int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t G, int with_bias,
                       int channels_last, int nan_at) {
  int64_t Ho = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1, Wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  int64_t Cig = Ci / G, Cog = Co / G;
  size_t nx = N * Ci * H * W, nw = Co * Cig * kh * kw, ny = N * Co * Ho * Wo;
  float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc(Co * 4), *ref = malloc(ny * 4);
  float *xd = malloc(nx * 4); /* device layout of x (NCHW or NHWC) */
  double *refd = malloc(ny * 8);
  unsigned s = 7 + (unsigned)(N * 131 + Ci * 17 + H * 5 + kh);
  for (size_t i = 0; i < nx; i++) x[i] = (float)frand(&s);
  if (nan_at >= 0) x[nan_at % nx] = NAN;
  for (size_t i = 0; i < nw; i++) w[i] = (float)frand(&s);
  for (int64_t i = 0; i < Co; i++) b[i] = (float)frand(&s);
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < Co; co++)
      for (int64_t oh = 0; oh < Ho; oh++)
        for (int64_t ow = 0; ow < Wo; ow++) {
          int64_t g = co / Cog;
          float acc = with_bias ? b[co] : 0.0f;
          double accd = with_bias ? b[co] : 0.0;
          for (int64_t ci = 0; ci < Cig; ci++)
            for (int64_t i = 0; i < kh; i++)
              for (int64_t j = 0; j < kw; j++) {
                int64_t ih = oh * sh - ph + i * dh, iw = ow * sw - pw + j * dw;
                float xv = (ih < 0 || ih >= H || iw < 0 || iw >= W) ? 0.0f
                                                                   : x[((n * Ci + g * Cig + ci) * H + ih) * W + iw];
                float wv = w[((co * Cig + ci) * kh + i) * kw + j];
                acc = fmaf(wv, xv, acc);
                accd += (double)wv * xv;
              }
          ref[((n * Co + co) * Ho + oh) * Wo + ow] = acc;
          refd[((n * Co + co) * Ho + oh) * Wo + ow] = accd;
        }
  int64_t xst[4];
  if (channels_last) { /* NHWC memory, NCHW view */
    xst[0] = H * W * Ci, xst[1] = 1, xst[2] = W * Ci, xst[3] = Ci;
    for (int64_t n = 0; n < N; n++)
      for (int64_t c = 0; c < Ci; c++)
        for (int64_t i = 0; i < H * W; i++) xd[n * xst[0] + c + i * Ci] = x[(n * Ci + c) * H * W + i];
  } else {
    xst[0] = Ci * H * W, xst[1] = H * W, xst[2] = W, xst[3] = 1;
    memcpy(xd, x, nx * 4);
  }
  tpurt_devptr dx = check_up(S, xd, nx * 4), dwp = check_up(S, w, nw * 4), db = check_up(S, b, Co * 4), dy;
  CHECK_OK(tpurt_malloc(0, ny * 4, S, &dy));
  int64_t xsz[4] = {N, Ci, H, W};
  tpurt_view X = check_view_st(dx, TPURT_F32, 4, xsz, xst), Wv = v4(dwp, TPURT_F32, Co, Cig, kh, kw);
  tpurt_view B = v1(db, TPURT_F32, Co), Y = v4(dy, TPURT_F32, N, Co, Ho, Wo);
  tpurt_conv_params p = {{sh, sw}, {ph, pw}, {dh, dw}, G};
  float *got = malloc(ny * 4);
  int bad = 0;
  const char *modes[3] = {"1", "portable", "0"};
  for (int m = 0; m < 3; m++) {
    setenv("TORCH_TPU_CONV_DIRECT", modes[m], 1);
    CHECK_OK(tpurt_conv2d(S, &Y, &X, &Wv, with_bias ? &B : NULL, &p, TPURT_PRECISION_HIGHEST));
    check_down(S, got, dy, ny * 4);
    for (size_t i = 0; i < ny; i++) {
      int ok;
      if (isnan(ref[i])) ok = isnan(got[i]);
      else if (m < 2 && Cig <= 4) ok = got[i] == ref[i]; /* same order, bit for bit */
      else ok = fabs(got[i] - refd[i]) <= 1e-5 * (1 + fabs(refd[i]));
      if (!ok && bad++ < 3)
        fprintf(stderr, "direct_case N%lld Ci%lld %lldx%lld Co%lld k%lldx%lld s%lld,%lld p%lld,%lld d%lld,%lld g%lld mode %s:"
                " y[%zu] = %.9g, want %.9g\n", (long long)N, (long long)Ci, (long long)H, (long long)W, (long long)Co,
                (long long)kh, (long long)kw, (long long)sh, (long long)sw, (long long)ph, (long long)pw, (long long)dh,
                (long long)dw, (long long)G, modes[m], i, got[i], ref[i]);
    }
  }
  /* weight gradient: the direct path's AVX2 and portable loops share one
   * order (bit-identical); all modes agree with the f64 reference */
  float *gy = malloc(ny * 4), *gw = malloc(nw * 4), *gw0 = malloc(nw * 4);
  double *gwd = calloc(nw, 8);
  for (size_t i = 0; i < ny; i++) gy[i] = (float)frand(&s);
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < Co; co++)
      for (int64_t oh = 0; oh < Ho; oh++)
        for (int64_t ow = 0; ow < Wo; ow++) {
          int64_t g = co / Cog;
          double d = gy[((n * Co + co) * Ho + oh) * Wo + ow];
          for (int64_t ci = 0; ci < Cig; ci++)
            for (int64_t i = 0; i < kh; i++)
              for (int64_t j = 0; j < kw; j++) {
                int64_t ih = oh * sh - ph + i * dh, iw = ow * sw - pw + j * dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                gwd[((co * Cig + ci) * kh + i) * kw + j] += d * x[((n * Ci + g * Cig + ci) * H + ih) * W + iw];
              }
        }
  double mag = 0;
  for (size_t i = 0; i < nw; i++) mag = isnan(gwd[i]) ? mag : fmax(mag, fabs(gwd[i]));
  tpurt_devptr dgy = check_up(S, gy, ny * 4), dgw;
  CHECK_OK(tpurt_malloc(0, nw * 4, S, &dgw));
  tpurt_view GY = v4(dgy, TPURT_F32, N, Co, Ho, Wo), GW = v4(dgw, TPURT_F32, Co, Cig, kh, kw);
  for (int m = 0; m < 3; m++) {
    setenv("TORCH_TPU_CONV_DIRECT", modes[m], 1);
    CHECK_OK(tpurt_conv2d_backward_weight(S, &GW, NULL, &GY, &X, &p, TPURT_PRECISION_HIGHEST));
    check_down(S, gw, dgw, nw * 4);
    if (m == 0) memcpy(gw0, gw, nw * 4);
    for (size_t i = 0; i < nw; i++) {
      int ok = isnan(gwd[i]) ? isnan(gw[i]) : fabs(gw[i] - gwd[i]) <= 1e-5 * (1 + mag);
      if (m == 1 && Cig <= 4) ok = ok && (memcmp(&gw[i], &gw0[i], 4) == 0);
      if (!ok && bad++ < 3)
        fprintf(stderr, "direct_case dw N%lld Ci%lld %lldx%lld Co%lld k%lldx%lld g%lld mode %s: dw[%zu] = %.9g, want %.9g\n",
                (long long)N, (long long)Ci, (long long)H, (long long)W, (long long)Co, (long long)kh, (long long)kw,
                (long long)G, modes[m], i, gw[i], gwd[i]);
    }
  }
  tpurt_free(dgy), tpurt_free(dgw);
  free(gy), free(gw), free(gw0), free(gwd);
  unsetenv("TORCH_TPU_CONV_DIRECT");
  CHECK(bad == 0);
  int nans = 0;
  for (size_t i = 0; i < ny; i++) nans += isnan(ref[i]);
  if (nan_at >= 0) CHECK((size_t)nans < ny); /* NaN spreads over its windows only */
  tpurt_free(dx), tpurt_free(dwp), tpurt_free(db), tpurt_free(dy);
  free(x), free(xd), free(w), free(b), free(ref), free(refd), free(got);
  return bad;
}

/* bf16 operands take the direct path too (computed in f32, rounded once) */
static void direct_bf16(void) {
  int64_t N = 2, Ci = 3, H = 13, W = 17, Co = 5, k = 5;
  int64_t Ho = (H + 4 - k) / 2 + 1, Wo = (W + 4 - k) / 2 + 1;
  size_t nx = N * Ci * H * W, nw = Co * Ci * k * k, ny = N * Co * Ho * Wo;
  uint16_t *x = malloc(nx * 2), *w = malloc(nw * 2), *got = malloc(ny * 2);
  unsigned s = 99;
  for (size_t i = 0; i < nx; i++) {
    float f = (float)frand(&s);
    uint32_t u;
    memcpy(&u, &f, 4);
    x[i] = (uint16_t)(u >> 16);
  }
  for (size_t i = 0; i < nw; i++) {
    float f = (float)frand(&s);
    uint32_t u;
    memcpy(&u, &f, 4);
    w[i] = (uint16_t)(u >> 16);
  }
  tpurt_devptr dx = check_up(S, x, nx * 2), dwp = check_up(S, w, nw * 2), dy;
  CHECK_OK(tpurt_malloc(0, ny * 2, S, &dy));
  tpurt_view X = v4(dx, TPURT_BF16, N, Ci, H, W), Wv = v4(dwp, TPURT_BF16, Co, Ci, k, k);
  tpurt_view Y = v4(dy, TPURT_BF16, N, Co, Ho, Wo);
  tpurt_conv_params p = {{2, 2}, {2, 2}, {1, 1}, 1};
  CHECK_OK(tpurt_conv2d(S, &Y, &X, &Wv, NULL, &p, TPURT_PRECISION_DEFAULT));
  check_down(S, got, dy, ny * 2);
  double e = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < Co; co++)
      for (int64_t oh = 0; oh < Ho; oh++)
        for (int64_t ow = 0; ow < Wo; ow++) {
          double acc = 0;
          for (int64_t ci = 0; ci < Ci; ci++)
            for (int64_t i = 0; i < k; i++)
              for (int64_t j = 0; j < k; j++) {
                int64_t ih = oh * 2 - 2 + i, iw = ow * 2 - 2 + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                uint32_t a = (uint32_t)x[((n * Ci + ci) * H + ih) * W + iw] << 16;
                uint32_t c = (uint32_t)w[((co * Ci + ci) * k + i) * k + j] << 16;
                float fa, fc;
                memcpy(&fa, &a, 4), memcpy(&fc, &c, 4);
                acc += (double)fa * fc;
              }
          uint32_t u = (uint32_t)got[((n * Co + co) * Ho + oh) * Wo + ow] << 16;
          float f;
          memcpy(&f, &u, 4);
          e = fmax(e, fabs(f - acc) / (1 + fabs(acc)));
        }
  CHECK(e < 1e-2);
  tpurt_free(dx), tpurt_free(dwp), tpurt_free(dy);
  free(x), free(w), free(got);
}

static void test_direct(void) {
  direct_case(2, 3, 23, 29, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, 1, 0, -1);   /* stem, small */
  direct_case(1, 3, 23, 29, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, 0, 1, -1);   /* stem, channels-last, no bias */
  direct_case(3, 1, 9, 40, 5, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 0, -1);    /* Cin 1, batch 3 */
  direct_case(1, 2, 11, 31, 7, 3, 5, 3, 3, 1, 2, 1, 1, 1, 1, 0, -1);   /* Cin 2, stride 3 */
  direct_case(2, 4, 12, 26, 9, 3, 3, 2, 1, 2, 0, 2, 2, 1, 0, 0, -1);   /* Cin 4, dilation 2, mixed stride */
  direct_case(1, 3, 7, 5, 4, 3, 3, 1, 1, 3, 3, 1, 1, 1, 1, 0, -1);     /* padding 3 > kernel reach, odd sizes */
  direct_case(1, 4, 6, 6, 3, 2, 2, 1, 2, 0, 1, 1, 3, 1, 1, 0, -1);     /* even kernel, kw dilation 3 */
  direct_case(2, 6, 10, 19, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1, 0, -1);   /* groups 2, Cig 3 */
  direct_case(1, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1, 8, 1, 1, -1);     /* depthwise, channels-last */
  direct_case(1, 5, 8, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, -1);     /* Cin 5: im2col path (tolerance) */
  direct_case(1, 1, 1, 50, 6, 1, 9, 1, 2, 0, 4, 1, 1, 1, 1, 0, -1);    /* 1-D signal */
  direct_case(1, 3, 1, 1, 70, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, -1);    /* 1x1 output, Co not a tile multiple */
  direct_case(1, 3, 64, 100, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1, 1, 0, -1); /* several full tiles per row */
  direct_case(2, 3, 15, 21, 6, 7, 7, 2, 2, 3, 3, 1, 1, 1, 1, 0, 400); /* NaN in the input */
  /* NaN in the last input column, which no window reaches (W = 16, k 3,
   * stride 2): outputs and weight gradient stay finite */
  direct_case(1, 2, 5, 16, 3, 3, 3, 2, 2, 0, 0, 1, 1, 1, 1, 0, 15);
  direct_bf16();
}

/* ------------------------------------------- implicit GEMM (f32 2-D)
 * f32 convolutions at full precision gather their column matrix while
 * the GEMM packs it (sgemm.c): runs of 8 or 4 positions per output row
 * at stride 1 and 2 (masked at the edges), gathers otherwise, slivers
 * across images, the transposed matrix for the weight gradient, and the
 * input gradient at unit stride as a convolution with flipped weights.
 * Forward, input and weight gradients against f64 loops, in every mode:
 * implicit AVX2, implicit portable, implicit without packing buffers,
 * im2col + GEMM, strided input gradients by GEMM + col2im instead of by
 * phases, implicit with the column matrix always packed (the same
 * bits as the default, which reads it in place from the images where
 * output rows hold whole 16-column slivers at column stride 1). */
static void implicit_case(int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t kh, int64_t kw,
                          int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t G) {
  int64_t Ho = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1, Wo = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
  int64_t Cig = Ci / G, Cog = Co / G;
  size_t nx = N * Ci * H * W, nw = Co * Cig * kh * kw, ny = N * Co * Ho * Wo;
  float *x = malloc(nx * 4), *w = malloc(nw * 4), *gy = malloc(ny * 4);
  double *y = calloc(ny, 8), *gx = calloc(nx, 8), *gw = calloc(nw, 8);
  unsigned s = 11 + (unsigned)(N * 7 + Ci * 13 + H * 3 + W + kh * 5 + sh);
  for (size_t i = 0; i < nx; i++) x[i] = (float)frand(&s);
  for (size_t i = 0; i < nw; i++) w[i] = (float)frand(&s);
  for (size_t i = 0; i < ny; i++) gy[i] = (float)frand(&s);
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < Co; co++)
      for (int64_t oh = 0; oh < Ho; oh++)
        for (int64_t ow = 0; ow < Wo; ow++) {
          int64_t g = co / Cog, yi = ((n * Co + co) * Ho + oh) * Wo + ow;
          for (int64_t ci = 0; ci < Cig; ci++)
            for (int64_t i = 0; i < kh; i++)
              for (int64_t j = 0; j < kw; j++) {
                int64_t ih = oh * sh - ph + i * dh, iw = ow * sw - pw + j * dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                int64_t xi = ((n * Ci + g * Cig + ci) * H + ih) * W + iw, wi = ((co * Cig + ci) * kh + i) * kw + j;
                y[yi] += (double)x[xi] * w[wi];
                gx[xi] += (double)gy[yi] * w[wi];
                gw[wi] += (double)gy[yi] * x[xi];
              }
        }
  tpurt_devptr dx = check_up(S, x, nx * 4), dwt = check_up(S, w, nw * 4), dgy = check_up(S, gy, ny * 4), dy, dgx, dgw;
  CHECK_OK(tpurt_malloc(0, ny * 4, S, &dy));
  CHECK_OK(tpurt_malloc(0, nx * 4, S, &dgx));
  CHECK_OK(tpurt_malloc(0, nw * 4, S, &dgw));
  tpurt_view X = v4(dx, TPURT_F32, N, Ci, H, W), Wv = v4(dwt, TPURT_F32, Co, Cig, kh, kw);
  tpurt_view Y = v4(dy, TPURT_F32, N, Co, Ho, Wo), GY = v4(dgy, TPURT_F32, N, Co, Ho, Wo);
  tpurt_view GX = v4(dgx, TPURT_F32, N, Ci, H, W), GW = v4(dgw, TPURT_F32, Co, Cig, kh, kw);
  tpurt_conv_params p = {{sh, sw}, {ph, pw}, {dh, dw}, G};
  size_t nmax = nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw);
  float *got = malloc(nmax * 4), *first[3] = {malloc(ny * 4), malloc(nx * 4), malloc(nw * 4)};
  const char *modes[7][2] = {{"1", "auto"}, {"portable", "auto"}, {"1", "nobuf"}, {"0", "auto"},
                             {"1", "narrow"}, {"1", "packed"},      {"1", "auto"}};
  int bad = 0;
  for (int m = 0; m < 7; m++) {
    setenv("TORCH_TPU_CONV_IMPLICIT", modes[m][0], 1);
    setenv("TORCH_TPU_SGEMM", modes[m][1], 1);
    setenv("TORCH_TPU_CONV_PHASES", m == 6 ? "0" : "1", 1); /* 6: strided input gradients by GEMM + col2im */
    CHECK_OK(tpurt_conv2d(S, &Y, &X, &Wv, NULL, &p, TPURT_PRECISION_HIGHEST));
    for (int what = 0; what < 3; what++) {
      const double *ref = what == 0 ? y : what == 1 ? gx : gw;
      size_t n = what == 0 ? ny : what == 1 ? nx : nw;
      if (what == 1) CHECK_OK(tpurt_conv2d_backward_input(S, &GX, &GY, &Wv, NULL, &p, TPURT_PRECISION_HIGHEST));
      if (what == 2) CHECK_OK(tpurt_conv2d_backward_weight(S, &GW, NULL, &GY, &X, &p, TPURT_PRECISION_HIGHEST));
      check_down(S, got, what == 0 ? dy : what == 1 ? dgx : dgw, n * 4);
      if (m == 0) memcpy(first[what], got, n * 4);
      if (m == 5 && memcmp(first[what], got, n * 4) && bad++ < 3)
        fprintf(stderr, "implicit_case N%lld Ci%lld %lldx%lld Co%lld: %s packed differs from auto\n", (long long)N,
                (long long)Ci, (long long)H, (long long)W, (long long)Co, what == 0 ? "y" : what == 1 ? "dx" : "dw");
      double mag = 0;
      for (size_t i = 0; i < n; i++) mag = fmax(mag, fabs(ref[i]));
      for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - ref[i]) <= 2e-5 * (1 + mag)) && bad++ < 3)
          fprintf(stderr, "implicit_case N%lld Ci%lld %lldx%lld Co%lld k%lldx%lld s%lld,%lld p%lld,%lld d%lld,%lld g%lld "
                  "mode %s/%s: %s[%zu] = %.9g, want %.9g\n", (long long)N, (long long)Ci, (long long)H, (long long)W,
                  (long long)Co, (long long)kh, (long long)kw, (long long)sh, (long long)sw, (long long)ph,
                  (long long)pw, (long long)dh, (long long)dw, (long long)G, modes[m][0], modes[m][1],
                  what == 0 ? "y" : what == 1 ? "dx" : "dw", i, got[i], ref[i]);
    }
  }
  unsetenv("TORCH_TPU_CONV_IMPLICIT");
  unsetenv("TORCH_TPU_SGEMM");
  unsetenv("TORCH_TPU_CONV_PHASES");
  CHECK(bad == 0);
  tpurt_free(dx), tpurt_free(dwt), tpurt_free(dgy), tpurt_free(dy), tpurt_free(dgx), tpurt_free(dgw);
  free(x), free(w), free(gy), free(y), free(gx), free(gw), free(got), free(first[0]), free(first[1]), free(first[2]);
}

static void test_implicit(void) {
  /* read in place (Wo a multiple of 16, column stride 1): padded, unpadded,
   * row stride 2, dilation, groups, partial row slivers, odd sliver
   * counts, several images per sliver pair */
  implicit_case(3, 5, 16, 16, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1);  /* M 13: partial row slivers */
  implicit_case(2, 7, 18, 18, 9, 3, 3, 1, 1, 0, 0, 1, 1, 1);   /* no padding: the images themselves */
  implicit_case(2, 6, 33, 32, 10, 3, 3, 2, 1, 1, 1, 1, 1, 1);  /* row stride 2 */
  implicit_case(1, 4, 20, 32, 8, 3, 3, 1, 1, 2, 2, 2, 2, 1);   /* dilation 2 */
  implicit_case(3, 12, 16, 48, 18, 3, 3, 1, 1, 1, 1, 1, 1, 3); /* groups; 3 slivers a row */
  implicit_case(1, 3, 1, 16, 5, 1, 3, 1, 1, 0, 1, 1, 1, 1);    /* one row a image: odd slivers */
  implicit_case(2, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1); /* runs of 8, two per output row */
  implicit_case(3, 8, 8, 8, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1);    /* runs of 8, one per row */
  implicit_case(2, 8, 4, 4, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1);    /* runs of 4 */
  implicit_case(2, 8, 31, 31, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1);   /* stride 2, right edge in the padding */
  implicit_case(2, 8, 16, 16, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1);   /* stride 2, runs of 8 */
  implicit_case(2, 8, 8, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1);     /* stride 2, runs of 4 */
  implicit_case(2, 18, 9, 11, 9, 3, 3, 1, 1, 2, 2, 2, 2, 3);   /* groups, dilation, slivers across images */
  implicit_case(2, 10, 7, 12, 6, 2, 3, 1, 1, 3, 0, 1, 2, 2);   /* padding past the kernel's reach, even kernel */
  implicit_case(1, 64, 7, 7, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1);   /* 1x1 */
  implicit_case(3, 12, 16, 17, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1);  /* 1x1 stride 2 */
  implicit_case(2, 130, 4, 8, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1);  /* K 1170: several K chunks */
  implicit_case(1, 8, 16, 16, 200, 3, 3, 1, 1, 1, 1, 1, 1, 1); /* M 200: shared B panel */
  implicit_case(2, 8, 8, 8, 120, 3, 3, 1, 1, 1, 1, 1, 1, 1);   /* M 120: one A block of 120 rows */
  implicit_case(2, 6, 12, 16, 8, 5, 5, 1, 1, 2, 2, 1, 1, 1);   /* 5x5 */
  implicit_case(1, 5, 20, 24, 4, 9, 9, 1, 1, 4, 4, 1, 1, 1);   /* 81 taps: gathers */
  implicit_case(1, 6, 13, 14, 5, 3, 3, 3, 3, 1, 1, 1, 1, 1);   /* stride 3: gathers */
  implicit_case(2, 8, 8, 6, 8, 3, 3, 1, 2, 1, 1, 1, 1, 1);     /* mixed strides */
  /* strided input gradients by phases */
  implicit_case(2, 8, 32, 32, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1);  /* phase rows of 16, read past the padding */
  implicit_case(2, 6, 21, 19, 7, 3, 3, 2, 2, 2, 2, 2, 2, 1);   /* dilation 2 at stride 2 */
  implicit_case(1, 5, 22, 23, 6, 3, 3, 2, 2, 3, 3, 3, 3, 1);   /* dilation 3: phase taps dilated */
  implicit_case(2, 4, 13, 14, 5, 2, 2, 3, 3, 0, 0, 1, 1, 1);   /* stride 3 > kernel: phases no tap reaches */
  implicit_case(2, 6, 16, 18, 6, 4, 4, 2, 2, 1, 1, 1, 1, 2);   /* even kernel, groups */
  implicit_case(1, 9, 12, 13, 4, 1, 1, 3, 3, 0, 0, 1, 1, 1);   /* 1x1 stride 3 */
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
  test_direct();
  test_implicit();
  if (g_failures) {
    fprintf(stderr, "%d failure(s)\n", g_failures);
    return 1;
  }
  printf("test_conv: OK\n");
  return 0;
}
