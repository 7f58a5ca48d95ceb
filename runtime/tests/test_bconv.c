/* test_bconv.c — bf16 2-D convolutions (forward with bias, input gradient,
 * weight and bias gradients) at every kernel level the host can run
 * (TORCH_TPU_ISA), against a double reference within the precision
 * contract: products of bf16 values exact, sums in f32 (bound (K + 2)
 * 2^-23 times the sum of |products|), one rounding to bf16 at the end (2^-8
 * relative). Odd channel counts, K = C_in kh kw not a multiple of 32,
 * strides 1 and 2 (and 1 x 2), padding, dilation, groups, batch 1 and > 1,
 * NCHW and channels-last operands, a transposed convolution's stride-2
 * input gradient with more taps than the stride. At level amx the passes
 * must have run on the tile unit (tpurt_bf16_conv_tile_passes), at avx512
 * on a CPU with AVX512-BF16 on its dot products when asked for
 * (TORCH_TPU_CONV_BF16=1; the same packed layout, K in one chunk or in
 * chunks of 64), elsewhere (by default below amx, and with
 * TORCH_TPU_CONV_BF16=0 or its former name TORCH_TPU_CONV_AMX=0) never.
 *
 *   test_bconv               parent: one child per level, checks their output
 *   test_bconv run LEVEL     child: the cases at LEVEL
 */
#define _GNU_SOURCE
#include <stdint.h>

#include "check.h"
#include "check_child.h"

static tpurt_stream *S;


typedef struct {
  int64_t N, Ci, H, W, Co, kh, kw, sh, sw, ph, pw, dh, dw, G;
  int bias, cl; /* cl: x, y, dx, dy channels-last */
} ccase;

/* strides of an [n, c, h, w] tensor, NCHW or channels-last */
static void strides4(int64_t C, int64_t H, int64_t W, int cl, int64_t st[4]) {
  if (cl) {
    st[0] = H * W * C, st[1] = 1, st[2] = W * C, st[3] = C;
  } else {
    st[0] = C * H * W, st[1] = H * W, st[2] = W, st[3] = 1;
  }
}

static double g_worst;

/* |got - ref| / bound over n values; bound from mag (sum of |products|) and K terms */
static void compare(const char *what, const ccase *c, const uint16_t *got, const double *ref, const double *mag,
                    int64_t n, int64_t K) {
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = check_from_bf16(got[i]), bound = (double)(K + 2) * 0x1p-23 * mag[i] + 0x1p-8 * fabs(ref[i]) + 1e-30;
    double r = fabs(g - ref[i]) / bound;
    if (!(r <= worst)) worst = r;
  }
  if (!(worst <= 1.0))
    fprintf(stderr, "%s N%lld C%lld %lldx%lld -> %lld k%lldx%lld s%lld,%lld p%lld,%lld d%lld,%lld g%lld cl%d: %.3g x bound\n",
            what, (long long)c->N, (long long)c->Ci, (long long)c->H, (long long)c->W, (long long)c->Co,
            (long long)c->kh, (long long)c->kw, (long long)c->sh, (long long)c->sw, (long long)c->ph,
            (long long)c->pw, (long long)c->dh, (long long)c->dw, (long long)c->G, c->cl, worst);
  CHECK(worst <= 1.0);
  if (worst > g_worst) g_worst = worst;
}

static unsigned g_seed = 7;
static uint16_t rnd(void) {
  g_seed = g_seed * 1103515245u + 12345u;
  return check_to_bf16((float)(((g_seed >> 8) % 20001) / 10000.0 - 1.0));
}

static void run_case(const ccase *c) {
  int64_t N = c->N, Ci = c->Ci, H = c->H, W = c->W, Co = c->Co, kh = c->kh, kw = c->kw, G = c->G;
  int64_t Ho = (H + 2 * c->ph - c->dh * (kh - 1) - 1) / c->sh + 1, Wo = (W + 2 * c->pw - c->dw * (kw - 1) - 1) / c->sw + 1;
  int64_t Cig = Ci / G, Cog = Co / G;
  int64_t nx = N * Ci * H * W, nw = Co * Cig * kh * kw, ny = N * Co * Ho * Wo;
  int64_t xs[4], ys[4];
  strides4(Ci, H, W, c->cl, xs);
  strides4(Co, Ho, Wo, c->cl, ys);
  uint16_t *x = malloc(nx * 2), *w = malloc(nw * 2), *b = malloc(Co * 2), *gy = malloc(ny * 2);
  uint16_t *y = malloc(ny * 2), *gx = malloc(nx * 2), *gw = malloc(nw * 2), *gb = malloc(Co * 2);
  for (int64_t i = 0; i < nx; i++) x[i] = rnd();
  for (int64_t i = 0; i < nw; i++) w[i] = rnd();
  for (int64_t i = 0; i < Co; i++) b[i] = rnd();
  for (int64_t i = 0; i < ny; i++) gy[i] = rnd();
  /* references in memory order of each tensor */
  double *ry = calloc(ny, 8), *my = calloc(ny, 8), *rx = calloc(nx, 8), *mx = calloc(nx, 8);
  double *rw = calloc(nw, 8), *mw = calloc(nw, 8), *rb = calloc(Co, 8), *mb = calloc(Co, 8);
  for (int64_t n = 0; n < N; n++)
    for (int64_t co = 0; co < Co; co++)
      for (int64_t oh = 0; oh < Ho; oh++)
        for (int64_t ow = 0; ow < Wo; ow++) {
          int64_t g = co / Cog, yo = n * ys[0] + co * ys[1] + oh * ys[2] + ow * ys[3];
          double dy = check_from_bf16(gy[yo]);
          if (c->bias) ry[yo] += check_from_bf16(b[co]), my[yo] += fabs(check_from_bf16(b[co]));
          rb[co] += dy, mb[co] += fabs(dy);
          for (int64_t ci = 0; ci < Cig; ci++)
            for (int64_t i = 0; i < kh; i++)
              for (int64_t j = 0; j < kw; j++) {
                int64_t ih = oh * c->sh - c->ph + i * c->dh, iw = ow * c->sw - c->pw + j * c->dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                int64_t xo = n * xs[0] + (g * Cig + ci) * xs[1] + ih * xs[2] + iw * xs[3];
                int64_t wo = ((co * Cig + ci) * kh + i) * kw + j;
                double xv = check_from_bf16(x[xo]), wv = check_from_bf16(w[wo]);
                ry[yo] += xv * wv, my[yo] += fabs(xv * wv);
                rx[xo] += dy * wv, mx[xo] += fabs(dy * wv);
                rw[wo] += dy * xv, mw[wo] += fabs(dy * xv);
              }
        }
  tpurt_devptr dX = check_up(S, x, nx * 2), dW = check_up(S, w, nw * 2), dB = check_up(S, b, Co * 2);
  tpurt_devptr dGY = check_up(S, gy, ny * 2), dY = check_up(S, NULL, ny * 2), dGX = check_up(S, NULL, nx * 2);
  tpurt_devptr dGW = check_up(S, NULL, nw * 2), dGB = check_up(S, NULL, Co * 2);
  int64_t xsz[4] = {N, Ci, H, W}, ysz[4] = {N, Co, Ho, Wo}, wsz[4] = {Co, Cig, kh, kw}, bsz[1] = {Co};
  tpurt_view X = check_view_st(dX, TPURT_BF16, 4, xsz, xs), Y = check_view_st(dY, TPURT_BF16, 4, ysz, ys);
  tpurt_view GX = check_view_st(dGX, TPURT_BF16, 4, xsz, xs), GY = check_view_st(dGY, TPURT_BF16, 4, ysz, ys);
  tpurt_view Wv = check_view(dW, TPURT_BF16, 4, wsz), GW = check_view(dGW, TPURT_BF16, 4, wsz);
  tpurt_view B = check_view(dB, TPURT_BF16, 1, bsz), GB = check_view(dGB, TPURT_BF16, 1, bsz);
  tpurt_conv_params p = {{c->sh, c->sw}, {c->ph, c->pw}, {c->dh, c->dw}, G};
  CHECK_OK(tpurt_conv2d(S, &Y, &X, &Wv, c->bias ? &B : NULL, &p, TPURT_PRECISION_DEFAULT));
  CHECK_OK(tpurt_conv2d_backward_input(S, &GX, &GY, &Wv, NULL, &p, TPURT_PRECISION_DEFAULT));
  CHECK_OK(tpurt_conv2d_backward_weight(S, &GW, &GB, &GY, &X, &p, TPURT_PRECISION_DEFAULT));
  check_down(S, y, dY, ny * 2);
  check_down(S, gx, dGX, nx * 2);
  check_down(S, gw, dGW, nw * 2);
  check_down(S, gb, dGB, Co * 2);
  compare("forward", c, y, ry, my, ny, Cig * kh * kw + 1);
  compare("input gradient", c, gx, rx, mx, nx, Cog * kh * kw);
  compare("weight gradient", c, gw, rw, mw, nw, N * Ho * Wo);
  compare("bias gradient", c, gb, rb, mb, Co, N * Ho * Wo);
  tpurt_free(dX), tpurt_free(dW), tpurt_free(dB), tpurt_free(dGY), tpurt_free(dY), tpurt_free(dGX);
  tpurt_free(dGW), tpurt_free(dGB);
  free(x), free(w), free(b), free(gy), free(y), free(gx), free(gw), free(gb);
  free(ry), free(my), free(rx), free(mx), free(rw), free(mw), free(rb), free(mb);
}

static int child(const char *level) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  CHECK_STR(tpurt_cpu_get_info()->isa_name, level);
  uint64_t before = tpurt_bf16_conv_tile_passes(), ip_before = tpurt_bf16_conv_implicit_passes();
  static const ccase cases[] = {
      /* N  Ci  H   W   Co kh kw sh sw ph pw dh dw G  bias cl */
      {2, 32, 16, 16, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0},   /* ResNet-like block, K 288 */
      {3, 7, 9, 11, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0},      /* odd channels, K 63 */
      {1, 13, 12, 10, 9, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0},    /* stride 2, batch 1 */
      {2, 16, 11, 13, 24, 1, 1, 2, 2, 0, 0, 1, 1, 1, 0, 0},   /* 1 x 1 stride 2 shortcut */
      {2, 24, 8, 8, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0},     /* 1 x 1 */
      {2, 6, 14, 15, 8, 3, 3, 1, 1, 2, 2, 2, 2, 1, 0, 0},     /* dilation 2 */
      {2, 12, 10, 9, 18, 3, 3, 1, 1, 1, 1, 1, 1, 3, 1, 0},    /* groups 3 */
      {1, 8, 7, 7, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, 0, 0},       /* depthwise */
      {2, 20, 9, 12, 11, 3, 3, 2, 1, 0, 1, 1, 1, 1, 1, 0},    /* strides 2 x 1, uneven padding */
      {2, 5, 10, 10, 7, 4, 4, 2, 2, 1, 1, 1, 1, 1, 0, 0},     /* 4 x 4 stride 2 (transposed-conv shape) */
      {2, 3, 17, 17, 16, 5, 3, 1, 1, 2, 0, 1, 1, 1, 1, 0},    /* stem-like, kh != kw */
      {2, 33, 6, 6, 70, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},     /* channels-last, odd channels */
      {2, 16, 9, 9, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0, 1},     /* channels-last, stride 2 */
      {1, 64, 5, 5, 96, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0},     /* K 576 */
      {2, 256, 4, 4, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0},    /* K 2304: two chunks of K */
      {2, 32, 15, 16, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0},   /* stride 2, 32 channels of dy: phases in place */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
  printf("path %s passes %llu worst %.3f implicit %llu\n", tpurt_bf16_conv_path(),
         (unsigned long long)(tpurt_bf16_conv_tile_passes() - before), g_worst,
         (unsigned long long)(tpurt_bf16_conv_implicit_passes() - ip_before));
  return g_failures ? 1 : 0;
}


static unsigned long long passes_of(const char *out) {
  const char *p = strstr(out, "passes ");
  return p ? strtoull(p + 7, NULL, 10) : 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "run")) return child(argv[2]);
  const tpurt_cpu_info *ci = tpurt_cpu_get_info();
  static const char *const levels[] = {"scalar", "avx2", "avx512", "amx"};
  static char out[1 << 16];
  for (int lv = 0; lv <= ci->host_isa; lv++) {
    char env_isa[64];
    snprintf(env_isa, sizeof env_isa, "TORCH_TPU_ISA=%s", levels[lv]);
    /* TORCH_TPU_CONV_BF16=1: every pass on the bf16 kernel (the first
     * children); the last one runs the default (the dot products: by shape) */
    const char *e1[] = {env_isa, "TPU_NUM_THREADS=2", "TORCH_TPU_CONV_BF16=1", "TORCH_TPU_HBM_LIMIT=1G", NULL};
    const char *e2[] = {env_isa, "TPU_NUM_THREADS=1", "TORCH_TPU_CONV_BF16=1", "TORCH_TPU_HBM_LIMIT=1G", NULL};
    const char *e3[] = {env_isa, "TPU_NUM_THREADS=2", "TORCH_TPU_CONV_BF16=0", "TORCH_TPU_HBM_LIMIT=1G", NULL};
    const char *e4[] = {env_isa, "TPU_NUM_THREADS=2", "TORCH_TPU_CONV_BF16=1", "TORCH_TPU_AMX_KC=64",
                        "TORCH_TPU_HBM_LIMIT=1G", NULL};
    const char *e5[] = {env_isa, "TPU_NUM_THREADS=2", "TORCH_TPU_CONV_AMX=0", "TORCH_TPU_HBM_LIMIT=1G", NULL};
    const char *e6[] = {env_isa, "TPU_NUM_THREADS=2", "TORCH_TPU_HBM_LIMIT=1G", NULL};
    const char *const *envs[] = {e1, e2, e3, e4, e5, e6};
    static const char *const what[] = {"", " (1 thread)", " (TORCH_TPU_CONV_BF16=0)", " (K chunks of 64)",
                                       " (TORCH_TPU_CONV_AMX=0)", " (default)"};
    char *av[] = {argv[0], "run", (char *)levels[lv], NULL};
    /* the bf16 kernel of the level: the tiles at amx, the dot products at
     * avx512 on a CPU with AVX512-BF16 (asked for), else none (f32 path) */
    const char *want = lv == 3 ? "path amx-bf16 tiles" : lv == 2 && ci->avx512_bf16 ? "path avx512-bf16 dot products" : NULL;
    for (int k = 0; k < 6; k++) {
      if (k == 3 && !want) continue; /* chunks of K: the bf16 kernels only */
      int rc = check_run_child(av, envs[k], out, sizeof out, NULL);
      printf("level %s%s: %s", levels[lv], what[k], out);
      CHECK_EQ(rc, 0);
      int on = want && k != 2 && k != 4 && (k != 5 || lv == 3); /* default: every pass on the tiles */
      if (on) {
        CHECK(strstr(out, want) != NULL);
        CHECK(passes_of(out) >= 45); /* every case's three passes (phases: more) */
      } else if (want && k == 5) {
        /* default on the dot products: the passes that gain from them —
         * here only images with >= 32 input channels on patch rows: copied
         * for the small ones (the forward pass and input gradient of 33 -> 70
         * at 6 x 6 and 64 -> 96 at 5 x 5, the input gradient of 256 -> 64 at
         * 4 x 4: 64 channels in), the forward pass and input gradient of
         * 24 -> 40 1 x 1 at 8 x 8 as batched products (one_by_one), read in
         * place for 32 -> 32 at 16 x 16 (forward pass and input
         * gradient), the forward pass of 256 -> 64 at 4 x 4 (>= 128 channels
         * in at <= 64 positions), the stride-2 input gradient of 32 -> 32 at
         * 15 x 16 (its 4 phases; its forward pass, 8 x 8 outputs, on copied
         * rows), and the weight gradients of 256 -> 64 at 4 x 4 and of that
         * stride-2 pass (8 x 8 outputs, 32 channels) */
        CHECK(strstr(out, "path avx512-bf16 dot products for large passes, f32 implicit GEMM below") != NULL);
        CHECK_EQ(passes_of(out), 17);
        CHECK(strstr(out, "implicit 9\n") != NULL);
      } else {
        CHECK(strstr(out, "path f32 implicit GEMM") != NULL);
        CHECK_EQ(passes_of(out), 0);
      }
    }
  }
  if (ci->host_isa < 3) printf("skipped: the tile unit (this host has no usable AMX)\n");
  TEST_MAIN_END();
}
