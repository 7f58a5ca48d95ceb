/*
 * conv.c — 2-D/3-D convolution (forward, backward input, backward weight
 * and bias) on the GEMMs of gemm.c / sgemm.c.
 *
 * Operands are first brought to contiguous NCHW buffers of the compute
 * type (f32 for f32/f16/bf16, f64 for f64) unless they already are.
 *
 * f32 2-D at full precision (the common case) is an implicit GEMM on the
 * runtime's own kernel: per group, y = w_g @ col with the images of the
 * batch side by side as columns, where col [C_in/g * kH * kW, N * Ho * Wo]
 * is never stored: the GEMM gathers each 16-column sliver from the images
 * when it packs it (tpurt__sgemm_conv), or reads it from the images in
 * place where its slivers are runs of image rows. The weight gradient is
 * dy @ col^T the same way, or (up to 128 output channels) dw^T = col @
 * dy^T with col read in place; the input gradient at other strides, for
 * few input channels, is one such convolution per phase of dx
 * (bwd_input_phases); the input gradient at unit stride is the convolution of
 * dy with the weights transposed and flipped (no col2im). Measured on the
 * ResNet bench step (2 cores): 250 -> 188 ms, im2col/col2im were ~20 % of
 * it. TORCH_TPU_CONV_IMPLICIT=0 keeps the path below.
 *
 * Otherwise (f64, reduced precision, 3-D, strided input gradients): for
 * every image and group col = im2col(x), then y = w_g @ col. 1x1
 * convolutions with unit stride and no padding skip the im2col (the image
 * is its own column matrix). Backward input is col2im(w_g^T @ dy) (which is
 * also a transposed convolution's forward); backward weight accumulates
 * dy @ col^T over the batch. Few input channels per group (the stem) run
 * the direct loops of conv_direct.c.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gemm_internal.h"
#include "rk_common.h" /* rk_load_f64 */
#include "bf16_simd.h" /* LOAD16_PD */

/* conv_direct.c: direct forward for few input channels per group */
TPURT_INTERNAL int tpurt__conv_direct_applies(int64_t Cig, int64_t kd, int64_t D, int64_t Do);
TPURT_INTERNAL int tpurt__conv_direct_f32(const float *x, const float *w, const float *bias, float *y, int64_t N,
                                          int64_t Ci, int64_t H, int64_t W, int64_t Co, int64_t Ho, int64_t Wo,
                                          int64_t kh, int64_t kw, int64_t G, const int64_t stride[2],
                                          const int64_t pad[2], const int64_t dil[2], int portable);
TPURT_INTERNAL int tpurt__conv_direct_dw_f32(const float *x, const float *dy, float *dw, int64_t N, int64_t Ci,
                                             int64_t H, int64_t W, int64_t Co, int64_t Ho, int64_t Wo, int64_t kh,
                                             int64_t kw, int64_t G, const int64_t stride[2], const int64_t pad[2],
                                             const int64_t dil[2], int portable);

/* host view of a device address; empty views may carry a null one */
static inline void *hv(tpurt_devptr p) { return p ? tpurt__host_view(p) : NULL; }

enum { CONV_FWD = 0, CONV_BWD_IN = 1, CONV_BWD_W = 2 };

typedef struct {
  int kind;
  int has0, has1; /* optional outputs / bias present */
  tpurt_view out0, out1; /* fwd: y, bias(in); bwd_in: dx, bias(in); bwd_w: dw, db */
  tpurt_view in0, in1;   /* fwd: x, w; bwd_in: dy, w; bwd_w: dy, x */
  tpurt_conv3d_params p;
  tpurt_precision prec;
  int direct_mode; /* forward algorithm: 1 auto, 0 im2col + GEMM only, 2 direct with portable loops */
  int implicit;    /* f32 2-D: 1 implicit GEMM, 2 with the portable kernels, 0 im2col + GEMM */
  int phases;      /* strided f32 2-D input gradient: 1 by phases (implicit GEMMs), 0 GEMM + col2im */
} conv_args;

/* ------------------------------------------------ layout helpers */

static int is_contig4(const tpurt_view *v) {
  int64_t st = 1;
  for (int k = 4; k >= 0; k--) {
    if (v->sizes[k] != 1 && v->strides[k] != st) return 0;
    st *= v->sizes[k];
  }
  return 1;
}

static int64_t numel4(const tpurt_view *v) {
  return v->sizes[0] * v->sizes[1] * v->sizes[2] * v->sizes[3] * v->sizes[4];
}

typedef struct {
  const tpurt_view *v;
  void *dst;
  int f64;
  int store; /* 0: view -> dst (load), 1: dst -> view (store) */
  double alpha_unused;
} xfer_ctx;

/* rows of the view = N*C*D*H, each W elements */
static void xfer_rows(void *c, int64_t r0, int64_t r1) {
  xfer_ctx *x = c;
  const tpurt_view *v = x->v;
  int64_t C = v->sizes[1], D = v->sizes[2], H = v->sizes[3], W = v->sizes[4];
  size_t es = tpurt_dtype_size(v->dtype);
  char *base = hv(v->ptr);
  for (int64_t r = r0; r < r1; r++) {
    int64_t n = r / (C * D * H), ch = (r / (D * H)) % C, dd = (r / H) % D, h = r % H;
    char *row = base + (ptrdiff_t)((n * v->strides[0] + ch * v->strides[1] + dd * v->strides[2] +
                                    h * v->strides[3]) * (int64_t)es);
    int64_t ws = v->strides[4];
    if (x->f64) {
      double *d = (double *)x->dst + r * W;
      if (!x->store)
        for (int64_t j = 0; j < W; j++) d[j] = ((double *)row)[j * ws];
      else
        for (int64_t j = 0; j < W; j++) ((double *)row)[j * ws] = d[j];
      continue;
    }
    float *d = (float *)x->dst + r * W;
    switch (v->dtype) {
      case TPURT_F32:
        if (!x->store)
          for (int64_t j = 0; j < W; j++) d[j] = ((float *)row)[j * ws];
        else
          for (int64_t j = 0; j < W; j++) ((float *)row)[j * ws] = d[j];
        break;
      case TPURT_BF16:
        if (!x->store)
          for (int64_t j = 0; j < W; j++) d[j] = tpurt__bf16_to_f32(((uint16_t *)row)[j * ws]);
        else
          for (int64_t j = 0; j < W; j++) ((uint16_t *)row)[j * ws] = tpurt__f32_to_bf16(d[j]);
        break;
      case TPURT_F16:
        if (!x->store)
          for (int64_t j = 0; j < W; j++) d[j] = tpurt__f16_to_f32(((uint16_t *)row)[j * ws]);
        else
          for (int64_t j = 0; j < W; j++) ((uint16_t *)row)[j * ws] = tpurt__f32_to_f16(d[j]);
        break;
      default: break;
    }
  }
}

/* A dense view of 16-bit floats: elements [b, e) converted as one flat
 * run (vectorized; the row walk above costs index arithmetic a row). */
static void xfer_flat16(void *c, int64_t b, int64_t e) {
  xfer_ctx *x = c;
  uint16_t *h = (uint16_t *)hv(x->v->ptr);
  float *d = x->dst;
  int bf = x->v->dtype == TPURT_BF16;
  if (!x->store) {
    if (bf)
      for (int64_t i = b; i < e; i++) d[i] = tpurt__bf16_to_f32(h[i]);
    else
      for (int64_t i = b; i < e; i++) d[i] = tpurt__f16_to_f32(h[i]);
  } else {
    if (bf)
      for (int64_t i = b; i < e; i++) h[i] = tpurt__f32_to_bf16(d[i]);
    else
      for (int64_t i = b; i < e; i++) h[i] = tpurt__f32_to_f16(d[i]);
  }
}

static void xfer(const tpurt_view *v, void *buf, int f64, int store) {
  xfer_ctx x = {v, buf, f64, store, 0};
  if (!f64 && (v->dtype == TPURT_BF16 || v->dtype == TPURT_F16) && is_contig4(v)) {
    tpurt_parallel_for(numel4(v), 1 << 15, xfer_flat16, &x);
    return;
  }
  int64_t rows = v->sizes[0] * v->sizes[1] * v->sizes[2] * v->sizes[3];
  int64_t W = v->sizes[4] ? v->sizes[4] : 1;
  tpurt_parallel_for(rows, (1 << 14) / W + 1, xfer_rows, &x);
}

/* Contiguous compute-type data of a 4-D view (the view itself when it
 * already is, else a scratch copy). */
static void *load4(const tpurt_view *v, int slot, int f64) {
  int ct = f64 ? TPURT_F64 : TPURT_F32;
  if ((int)v->dtype == ct && is_contig4(v)) return hv(v->ptr);
  void *buf = tpurt__scratch(slot, (size_t)numel4(v) * (f64 ? 8 : 4));
  xfer(v, buf, f64, 0);
  return buf;
}

/* Output buffer: the view's memory when contiguous in the compute type. */
static void *out4(const tpurt_view *v, int slot, int f64, int *direct) {
  int ct = f64 ? TPURT_F64 : TPURT_F32;
  *direct = (int)v->dtype == ct && is_contig4(v);
  if (*direct) return hv(v->ptr);
  return tpurt__scratch(slot, (size_t)numel4(v) * (f64 ? 8 : 4));
}

static void gemm_rt(int f64, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                    const void *B, int64_t ldb, double beta, void *C, int64_t ldc, tpurt_precision prec) {
  if (f64)
    tpurt__dgemm(ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
  else
    tpurt__sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, (float)beta, C, ldc, prec);
}

/* One group's column geometry for the implicit GEMM (sgemm.c): images x
 * ([n, c, h, w] at n * img + (c * H + h) * W + w), C channels, output
 * plane Ho x Wo, taps kh x kw, strides/padding/dilation of dims 1, 2. */
static tpurt_conv_cols conv_cols(const float *x, int64_t img, int64_t C, int64_t H, int64_t W, int64_t N,
                                 int64_t Ho, int64_t Wo, int64_t kh, int64_t kw, const int64_t st[3],
                                 const int64_t pad[3], const int64_t dil[3]) {
  tpurt_conv_cols g = {x, img, C, H, W, N, Ho, Wo, kh, kw, st[1], st[2], pad[1], pad[2], dil[1], dil[2]};
  return g;
}

/* --------------------------------------------------- im2col / col2im */

/* Columns of nb images at once: col [C*kh*kw, nb * Ho*Wo], image n's
 * columns at offset n * Ho*Wo of every row; image n at img + n * img_stride. */
typedef struct {
  const void *img; /* [C, H, W] of the first image */
  void *col;
  int64_t C, D, H, W, Do, Ho, Wo, kd, kh, kw;
  const tpurt_conv3d_params *p;
  int f64;
  int64_t nb, img_stride, ld; /* images, elements between images, col row length */
} i2c_ctx;

/* Output columns [lo, hi) whose input column ow * sw + off lies in [0, W)
 * (the others read padding). */
static inline void ow_range(int64_t off, int64_t sw, int64_t W, int64_t Wo, int64_t *lo, int64_t *hi) {
  int64_t a = off >= 0 ? 0 : (-off + sw - 1) / sw;
  int64_t b = W - 1 - off >= 0 ? (W - 1 - off) / sw + 1 : 0;
  if (a > Wo) a = Wo;
  if (b > Wo) b = Wo;
  if (b < a) b = a;
  *lo = a;
  *hi = b;
}

#define IM2COL_BODY(T)                                                                                   \
  do {                                                                                                   \
    int64_t kk = x->kd * x->kh * x->kw;                                                                  \
    for (int64_t u = u0; u < u1; u++) {                                                                  \
      int64_t r = u / x->nb, n = u % x->nb;                                                              \
      int64_t c = r / kk, kz = (r / (x->kw * x->kh)) % x->kd, ki = (r / x->kw) % x->kh, kj = r % x->kw; \
      const T *vol = (const T *)x->img + n * x->img_stride + c * x->D * x->H * x->W;                     \
      T *dst = (T *)x->col + r * x->ld + n * x->Do * x->Ho * x->Wo;                                      \
      for (int64_t oz = 0; oz < x->Do; oz++)                                                             \
      for (int64_t oh = 0; oh < x->Ho; oh++) {                                                           \
        int64_t iz = oz * sz - pz + kz * dz;                                                             \
        int64_t ih = oh * sh - ph + ki * dh;                                                             \
        const T *plane = vol + iz * x->H * x->W;                                                         \
        T *d = dst + (oz * x->Ho + oh) * x->Wo;                                                          \
        if (ih < 0 || ih >= x->H || iz < 0 || iz >= x->D) {                                              \
          memset(d, 0, sizeof(T) * (size_t)x->Wo);                                                      \
          continue;                                                                                      \
        }                                                                                                \
        const T *srow = plane + ih * x->W;                                                               \
        int64_t off = kj * dw - pw, lo, hi;                                                              \
        ow_range(off, sw, x->W, x->Wo, &lo, &hi);                                                        \
        for (int64_t ow = 0; ow < lo; ow++) d[ow] = (T)0;                                                \
        if (sw == 1)                                                                                     \
          memcpy(d + lo, srow + lo + off, sizeof(T) * (size_t)(hi - lo));                                \
        else                                                                                             \
          for (int64_t ow = lo; ow < hi; ow++) d[ow] = srow[ow * sw + off];                              \
        for (int64_t ow = hi; ow < x->Wo; ow++) d[ow] = (T)0;                                            \
      }                                                                                                  \
    }                                                                                                    \
  } while (0)

static void im2col_rows(void *c, int64_t u0, int64_t u1) {
  i2c_ctx *x = c;
  int64_t sz = x->p->stride[0], pz = x->p->padding[0], dz = x->p->dilation[0];
  int64_t sh = x->p->stride[1], sw = x->p->stride[2], ph = x->p->padding[1], pw = x->p->padding[2];
  int64_t dh = x->p->dilation[1], dw = x->p->dilation[2];
  if (x->f64)
    IM2COL_BODY(double);
  else
    IM2COL_BODY(float);
}

#define COL2IM_BODY(T)                                                                                   \
  do {                                                                                                   \
    int64_t kk = x->kd * x->kh * x->kw;                                                                  \
    for (int64_t u = u0; u < u1; u++) {                                                                  \
      int64_t n = u / x->C, c = u % x->C;                                                                \
      T *vol = (T *)x->img + n * x->img_stride + c * x->D * x->H * x->W;                                 \
      memset(vol, 0, sizeof(T) * (size_t)(x->D * x->H * x->W));                                          \
      for (int64_t kz = 0; kz < x->kd; kz++)                                                             \
      for (int64_t ki = 0; ki < x->kh; ki++)                                                             \
        for (int64_t kj = 0; kj < x->kw; kj++) {                                                         \
          const T *src = (const T *)x->col + (c * kk + (kz * x->kh + ki) * x->kw + kj) * x->ld +         \
                         n * x->Do * x->Ho * x->Wo;                                                      \
          for (int64_t oz = 0; oz < x->Do; oz++)                                                         \
          for (int64_t oh = 0; oh < x->Ho; oh++) {                                                       \
            int64_t iz = oz * sz - pz + kz * dz;                                                         \
            int64_t ih = oh * sh - ph + ki * dh;                                                         \
            if (ih < 0 || ih >= x->H || iz < 0 || iz >= x->D) continue;                                  \
            T *drow = vol + (iz * x->H + ih) * x->W;                                                     \
            const T *sr = src + (oz * x->Ho + oh) * x->Wo;                                               \
            int64_t off = kj * dw - pw, lo, hi;                                                          \
            ow_range(off, sw, x->W, x->Wo, &lo, &hi);                                                    \
            if (sw == 1)                                                                                 \
              for (int64_t ow = lo; ow < hi; ow++) drow[ow + off] += sr[ow];                             \
            else                                                                                         \
              for (int64_t ow = lo; ow < hi; ow++) drow[ow * sw + off] += sr[ow];                        \
          }                                                                                              \
        }                                                                                                \
    }                                                                                                    \
  } while (0)

static void col2im_chans(void *c, int64_t u0, int64_t u1) {
  i2c_ctx *x = c;
  int64_t sz = x->p->stride[0], pz = x->p->padding[0], dz = x->p->dilation[0];
  int64_t sh = x->p->stride[1], sw = x->p->stride[2], ph = x->p->padding[1], pw = x->p->padding[2];
  int64_t dh = x->p->dilation[1], dw = x->p->dilation[2];
  if (x->f64)
    COL2IM_BODY(double);
  else
    COL2IM_BODY(float);
}

/* dst [C, nb * L] <- src images [nb][C, L] (image stride src_stride) */
static void gather_cl(char *dst, const char *src, int64_t C, int64_t L, int64_t nb, int64_t src_stride, size_t es) {
  for (int64_t c = 0; c < C; c++)
    for (int64_t n = 0; n < nb; n++)
      memcpy(dst + (size_t)((c * nb + n) * L) * es, src + (size_t)(n * src_stride + c * L) * es, (size_t)L * es);
}

#define COL_BUDGET ((int64_t)128 << 20) /* bytes of column matrix per chunk of images */

/* Weights [Cog, Cig, kk taps] -> [Cig, Cog, nt]: wt[(ci * Cog + co) * nt +
 * t] = w[(co * Cig + ci) * kk + tap[t]] (the taps of one phase). */
static void transpose_taps(float *restrict wt, const float *restrict w, int64_t Cog, int64_t Cig, int64_t kk,
                           const int64_t *tap, int64_t nt) {
  for (int64_t ci = 0; ci < Cig; ci++)
    for (int64_t co = 0; co < Cog; co++)
      for (int64_t t = 0; t < nt; t++) wt[(ci * Cog + co) * nt + t] = w[(co * Cig + ci) * kk + tap[t]];
}

/* ------------------------------------ strided input gradient by phases */

/* The taps of one kernel dimension that reach input positions of phase a
 * (positions a, a + s, a + 2 s, ...): tap r reaches them when a + pad -
 * r * dil is a multiple of s, from output row (a + pad - r * dil) / s +
 * i for phase row i. Returns their count; tap[t] in increasing order of
 * that offset (decreasing r), *off0 the first offset, *step the next ones'
 * increment (dil / gcd(dil, s)). */
static int64_t phase_taps(int64_t a, int64_t s, int64_t pad, int64_t dil, int64_t k, int64_t *tap, int64_t *off0,
                          int64_t *step) {
  int64_t n = 0;
  for (int64_t r = k - 1; r >= 0; r--) {
    int64_t d = a + pad - r * dil;
    if (((d % s) + s) % s) continue;
    if (n == 0) *off0 = d >= 0 ? d / s : -((-d) / s);
    tap[n++] = r;
  }
  int64_t g = s, h = dil;
  while (h) {
    int64_t t = g % h;
    g = h;
    h = t;
  }
  *step = dil / g;
  return n;
}

#define MAX_PHASES 16    /* sh * sw up to this: phases (else GEMM + col2im) */
#define PHASE_MAX_CIN 96 /* input channels per group up to this: phases (measured, k_conv) */

typedef struct {
  float *dx;
  const float *ph[MAX_PHASES]; /* phase (ah, aw) at [ah * sw + aw]: [N, Ci, hq, wq], NULL: no tap reaches it */
  int64_t hq[MAX_PHASES], wq[MAX_PHASES];
  int64_t H, W, sh, sw;
} phase_scatter;

/* (image, channel) planes [b, e) of dx from the phases, one pass: row ih
 * of a plane interleaves the rows ih / sh of phases (ih % sh, 0..sw-1) */
static void scatter_planes(void *p, int64_t b, int64_t e) {
  const phase_scatter *q = p;
  for (int64_t u = b; u < e; u++)
    for (int64_t ih = 0; ih < q->H; ih++) {
      float *d = q->dx + (u * q->H + ih) * q->W;
      int64_t ah = ih % q->sh, i = ih / q->sh;
      const float *r[MAX_PHASES];
      int any = 0;
      for (int64_t aw = 0; aw < q->sw; aw++) {
        int64_t k = ah * q->sw + aw;
        r[aw] = aw < q->W && q->ph[k] ? q->ph[k] + (u * q->hq[k] + i) * q->wq[k] : NULL;
        any |= r[aw] != NULL;
      }
      if (!any) { /* a row no tap reaches (1 x 1 kernels: all but one in sh) */
        memset(d, 0, sizeof(float) * (size_t)q->W);
        continue;
      }
      if (q->sw == 2 && q->wq[ah * 2] == q->W / 2 + (q->W & 1)) { /* pairs (the common stride 2) */
        static const float zero[1] = {0.0f};
        const float *a = r[0] ? r[0] : zero, *c = r[1] ? r[1] : zero;
        int64_t sa = r[0] != NULL, sb = r[1] != NULL, half = q->W / 2;
        for (int64_t j = 0; j < half; j++) {
          d[2 * j] = a[j * sa];
          d[2 * j + 1] = c[j * sb];
        }
        if (q->W & 1) d[q->W - 1] = a[half * sa];
        continue;
      }
      for (int64_t aw = 0; aw < q->sw && aw < q->W; aw++) {
        int64_t k = ah * q->sw + aw, wq = q->wq[k];
        const float *src = q->ph[k] ? q->ph[k] + (u * q->hq[k] + i) * wq : NULL;
        if (src)
          for (int64_t j = 0; j < wq; j++) d[aw + j * q->sw] = src[j];
        else
          for (int64_t j = 0; j < wq; j++) d[aw + j * q->sw] = 0.0f;
      }
    }
}

/* dx of a strided 2-D f32 convolution (groups G) as sh x sw unit-stride
 * convolutions of dy, one per phase of dx's positions, each with the
 * weights of the taps that reach it (transposed, in decreasing tap order),
 * then interleaved into dx in one pass: the implicit GEMM of the forward
 * pass, instead of a column matrix of Kd x positions written by a GEMM and
 * added back by col2im. 0 (nothing written) when scratch memory is short
 * or the strides have too many phases. */
static int bwd_input_phases(const float *dy, const float *w, float *dx, int64_t N, int64_t Ci, int64_t H, int64_t W,
                            int64_t Co, int64_t Ho, int64_t Wo, int64_t kh, int64_t kw, int64_t G,
                            const tpurt_conv3d_params *p, int flags) {
  int64_t Cig = Ci / G, Cog = Co / G, sh = p->stride[1], sw = p->stride[2];
  if (sh * sw > MAX_PHASES || kh > 64 || kw > 64) return 0;
  float *wt = tpurt__scratch(3, sizeof(float) * (size_t)(Cig * Cog * kh * kw));
  float *buf = tpurt__scratch(5, sizeof(float) * (size_t)(N * Ci * H * W)); /* the phases: dx's size in all */
  if (!wt || !buf) return 0;
  phase_scatter sc = {.dx = dx, .H = H, .W = W, .sh = sh, .sw = sw};
  float *next = buf;
  for (int64_t ah = 0; ah < sh; ah++)
    for (int64_t aw = 0; aw < sw; aw++) {
      int64_t th[64], tw[64], oh = 0, ow = 0, dh = 1, dw = 1, k = ah * sw + aw;
      int64_t nh = phase_taps(ah, sh, p->padding[1], p->dilation[1], kh, th, &oh, &dh);
      int64_t nw = phase_taps(aw, sw, p->padding[2], p->dilation[2], kw, tw, &ow, &dw);
      int64_t hq = H > ah ? (H - ah + sh - 1) / sh : 0, wq = W > aw ? (W - aw + sw - 1) / sw : 0;
      sc.hq[k] = hq, sc.wq[k] = wq, sc.ph[k] = NULL;
      if (!nh || !nw || !hq || !wq) continue;
      float *ph = next;
      next += N * Ci * hq * wq;
      sc.ph[k] = ph;
      const int64_t st[3] = {1, 1, 1}, pad[3] = {0, -oh, -ow}, dil[3] = {1, dh, dw};
      for (int64_t g = 0; g < G; g++) {
        int64_t tap[64 * 64];
        for (int64_t a = 0; a < nh; a++)
          for (int64_t b = 0; b < nw; b++) tap[a * nw + b] = th[a] * kw + tw[b];
        transpose_taps(wt, w + g * Cog * Cig * kh * kw, Cog, Cig, kh * kw, tap, nh * nw);
        tpurt_conv_cols cc = conv_cols(dy + g * Cog * Ho * Wo, Co * Ho * Wo, Cog, Ho, Wo, N, hq, wq, nh, nw, st, pad,
                                       dil);
        tpurt__sgemm_conv(0, &cc, Cig, wt, Cog * nh * nw, ph + g * Cig * hq * wq, Ci * hq * wq, 0.0f, flags);
      }
    }
  tpurt_parallel_for(N * Ci, 1 + 4096 / (H * W + 1), scatter_planes, &sc);
  return 1;
}

/* ---------------------------------------------------------- kernel */

/* element c of a bias gradient view = s in its dtype */
static void store_bias_grad(const tpurt_view *bv, int64_t c, double s) {
  char *bp = (char *)hv(bv->ptr) + (ptrdiff_t)(c * bv->strides[0]) * (ptrdiff_t)tpurt_dtype_size(bv->dtype);
  switch (bv->dtype) {
    case TPURT_F64: *(double *)bp = s; break;
    case TPURT_F32: *(float *)bp = (float)s; break;
    case TPURT_BF16: *(uint16_t *)bp = tpurt__f32_to_bf16((float)s); break;
    default: *(uint16_t *)bp = tpurt__f32_to_f16((float)s); break;
  }
}

/* A bias gradient: db[c] = the sum of dy[n, c, h, w] over images and
 * positions, in double (each element converted exactly), an image's rows
 * in vector lanes, the images in order: the same bits from the bf16
 * kernels' views and the f32 path's buffer. Parallel over channels (one
 * thread's single f32 add chain took 2.6 ms for 64 x 64 x 32^2, longer than
 * the weight gradient's product a third of the time). */
typedef struct {
  const char *base;
  tpurt_dtype dt;
  int64_t sn, sc, sh, sw; /* element strides of dy */
  int64_t N, Ho, Wo;
  const tpurt_view *bv;
} bgjob;

#if defined(__x86_64__) || defined(__i386__)
/* sum of n f32 (bf16 when bf) elements at x in double: 4 x 16 lanes */
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) static double vsum_avx512(const char *x, int bf, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t es = bf ? 2 : 4, i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512d l0, h0, l1, h1;
    LOAD16_PD(x + i * es, bf, 16, l0, h0);
    LOAD16_PD(x + (i + 16) * es, bf, 16, l1, h1);
    a0 = _mm512_add_pd(a0, l0), a1 = _mm512_add_pd(a1, h0), a2 = _mm512_add_pd(a2, l1), a3 = _mm512_add_pd(a3, h1);
  }
  for (; i < n; i += 16) {
    int m = n - i < 16 ? (int)(n - i) : 16;
    __m512d l0, h0;
    LOAD16_PD(x + i * es, bf, m, l0, h0);
    a0 = _mm512_add_pd(a0, l0), a1 = _mm512_add_pd(a1, h0);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
}
#endif

/* sum of n elements at x, element stride st, in double */
static double run_sum(const char *x, tpurt_dtype dt, int64_t st, int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
  if (st == 1 && (dt == TPURT_F32 || dt == TPURT_BF16) && tpurt__cpu_has_avx512())
    return vsum_avx512(x, dt == TPURT_BF16, n);
#endif
  double s = 0, buf[256];
  int64_t es = (int64_t)tpurt_dtype_size(dt);
  for (int64_t o = 0; o < n; o += 256) {
    int64_t cnt = n - o < 256 ? n - o : 256;
    rk_load_f64(buf, x + o * st * es, dt, st, cnt);
    for (int64_t i = 0; i < cnt; i++) s += buf[i];
  }
  return s;
}

static void bias_grad_rows(void *p, int64_t c0, int64_t c1) {
  const bgjob *j = p;
  int64_t es = (int64_t)tpurt_dtype_size(j->dt);
  int flat = j->sh == j->Wo * j->sw; /* an image's plane is one run */
  for (int64_t c = c0; c < c1; c++) {
    double s = 0;
    for (int64_t n = 0; n < j->N; n++) {
      const char *pl = j->base + (n * j->sn + c * j->sc) * es;
      if (flat) {
        s += run_sum(pl, j->dt, j->sw, j->Ho * j->Wo);
        continue;
      }
      double r = 0;
      for (int64_t h = 0; h < j->Ho; h++) r += run_sum(pl + h * j->sh * es, j->dt, j->sw, j->Wo);
      s += r;
    }
    store_bias_grad(j->bv, c, s);
  }
}

static void bias_grad(const tpurt_view *bv, const char *dy, tpurt_dtype dt, int64_t sn, int64_t sc, int64_t sh,
                      int64_t sw, int64_t N, int64_t Co, int64_t Ho, int64_t Wo) {
  bgjob j = {dy, dt, sn, sc, sh, sw, N, Ho, Wo, bv};
  tpurt_parallel_for(Co, 1 + 65536 / (N * Ho * Wo + 1), bias_grad_rows, &j);
}

static tpurt_status k_conv(void *pa, char *err, size_t errlen) {
  conv_args *a = pa;
  tpurt__gemm_lib_init();
  const tpurt_conv3d_params *p = &a->p;
  int f64 = a->in0.dtype == TPURT_F64;
  size_t es = f64 ? 8 : 4;
  tpurt_precision prec = (!f64 && a->in0.dtype == TPURT_F32) ? a->prec : TPURT_PRECISION_HIGHEST;
  /* geometry: x [N, Ci, H, W], y [N, Co, Ho, Wo], w [Co, Ci/g, kh, kw] */
  const tpurt_view *xv, *yv, *wv;
  if (a->kind == CONV_FWD) xv = &a->in0, wv = &a->in1, yv = &a->out0;
  else if (a->kind == CONV_BWD_IN) xv = &a->out0, wv = &a->in1, yv = &a->in0;
  else xv = &a->in1, wv = &a->out0, yv = &a->in0;
  int64_t N = xv->sizes[0], Ci = xv->sizes[1], D = xv->sizes[2], H = xv->sizes[3], W = xv->sizes[4];
  int64_t Co = yv->sizes[1], Do = yv->sizes[2], Ho = yv->sizes[3], Wo = yv->sizes[4];
  int64_t kd = wv->sizes[2], kh = wv->sizes[3], kw = wv->sizes[4], G = p->groups;
  int64_t Cig = Ci / G, Cog = Co / G, kk = kd * kh * kw, L = Do * Ho * Wo, HW = D * H * W, Kd = Cig * kk;
  int one = kk == 1 && p->stride[0] == 1 && p->stride[1] == 1 && p->stride[2] == 1 && p->padding[0] == 0 &&
            p->padding[1] == 0 && p->padding[2] == 0 && Do == D && Ho == H && Wo == W;
  i2c_ctx ic = {NULL, NULL, Cig, D, H, W, Do, Ho, Wo, kd, kh, kw, p, f64, 1, Ci * HW, L};
  /* f32 at full precision: the images of a chunk are one batched product
   * (tiled over images x rows x columns on the pool) */
  int batched = !f64 && prec == TPURT_PRECISION_HIGHEST;
  /* ... and 2-D: implicit GEMM, the column matrix never stored */
  int implicit = batched && a->implicit && kd == 1 && D == 1 && Do == 1;
  int ig_flags = a->implicit == 2 ? 1 : 0;

  /* bf16 2-D: the tile unit (bconv.c), bias fused, one rounding */
  if (a->in0.dtype == TPURT_BF16 && kd == 1 && D == 1 && Do == 1 && N > 0 && L > 0 && HW > 0 &&
      (a->kind != CONV_BWD_W || a->has0) && tpurt__bconv_applies()) {
    const tpurt_view *bias = a->has1 && a->kind != CONV_BWD_W ? &a->out1 : NULL;
    int done = a->kind == CONV_FWD      ? tpurt__bconv_forward(&a->out0, &a->in0, &a->in1, bias, p)
               : a->kind == CONV_BWD_IN ? tpurt__bconv_backward_input(&a->out0, &a->in0, &a->in1, bias, p)
                                        : tpurt__bconv_backward_weight(&a->out0, &a->in0, &a->in1, p);
    if (done) {
      if (a->kind == CONV_BWD_W && a->has1) {
        const tpurt_view *d = &a->in0;
        bias_grad(&a->out1, hv(d->ptr), d->dtype, d->strides[0], d->strides[1], d->strides[3], d->strides[4], N, Co, Ho,
                  Wo);
      }
      tpurt__scratch_trim();
      return TPURT_OK;
    }
  }

  if (a->kind == CONV_FWD) {
    const char *x = load4(&a->in0, 0, f64);
    const char *w = load4(&a->in1, 1, f64);
    int direct;
    char *y = out4(&a->out0, 4, f64, &direct);
    int64_t nb = one ? 1 : COL_BUDGET / ((Kd * L > 0 ? Kd * L : 1) * (int64_t)es);
    if (nb < 1) nb = 1;
    if (nb > N) nb = N;
    /* few input channels per group (the ResNet stem): direct loops, bias
     * fused (see conv_direct.c for the measurements behind the choice) */
    if (batched && a->direct_mode && tpurt__conv_direct_applies(Cig, kd, D, Do)) {
      float *bias = NULL;
      if (a->has1) {
        bias = tpurt__scratch(3, sizeof(float) * (size_t)Co);
        const tpurt_view *bv = &a->out1;
        const char *bb = hv(bv->ptr);
        size_t bes = tpurt_dtype_size(bv->dtype);
        for (int64_t c = 0; c < Co && bias; c++) {
          const char *bp = bb + (ptrdiff_t)(c * bv->strides[0]) * (ptrdiff_t)bes;
          bias[c] = bv->dtype == TPURT_F64   ? (float)*(const double *)bp
                    : bv->dtype == TPURT_F32 ? *(const float *)bp
                    : bv->dtype == TPURT_BF16 ? tpurt__bf16_to_f32(*(const uint16_t *)bp)
                                              : tpurt__f16_to_f32(*(const uint16_t *)bp);
        }
      }
      if ((!a->has1 || bias) &&
          tpurt__conv_direct_f32((const float *)x, (const float *)w, bias, (float *)y, N, Ci, H, W, Co, Ho, Wo, kh,
                                 kw, G, p->stride + 1, p->padding + 1, p->dilation + 1, a->direct_mode == 2)) {
        if (!direct) xfer(&a->out0, y, f64, 1);
        tpurt__scratch_trim();
        return TPURT_OK;
      }
    }
    for (int64_t g = 0; g < G && implicit; g++) {
      tpurt_conv_cols cc = conv_cols((const float *)x + g * Cig * HW, Ci * HW, Cig, H, W, N, Ho, Wo, kh, kw,
                                     p->stride, p->padding, p->dilation);
      tpurt__sgemm_conv(0, &cc, Cog, (float *)w + g * Cog * Kd, Kd, (float *)y + g * Cog * L, Co * L, 0.0f,
                        ig_flags);
    }
    char *col = one || implicit ? NULL : tpurt__scratch(3, (size_t)(Kd * L * nb) * es);
    for (int64_t g = 0; g < G && !implicit; g++) {
      const char *wg = w + (size_t)(g * Cog * Kd) * es;
      if (one && batched) {
        tpurt__sgemm_batched(0, 0, N, Cog, L, Kd, 1.0f, (const float *)wg, Kd, 0,
                             (const float *)x + g * Cig * HW, L, Ci * HW, 0.0f, (float *)y + g * Cog * L, L, Co * L);
        continue;
      }
      for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t cnt = N - n0 < nb ? N - n0 : nb;
        if (one) {
          const char *xg = x + (size_t)((n0 * Ci + g * Cig) * HW) * es;
          gemm_rt(f64, 0, 0, Cog, L, Kd, wg, Kd, xg, L, 0.0, y + (size_t)((n0 * Co + g * Cog) * L) * es, L, prec);
          continue;
        }
        ic.img = x + (size_t)((n0 * Ci + g * Cig) * HW) * es;
        ic.col = col;
        ic.nb = cnt;
        ic.ld = cnt * L;
        tpurt_parallel_for(Kd * cnt, 1 + 4096 / (L + 1), im2col_rows, &ic);
        if (batched)
          tpurt__sgemm_batched(0, 0, cnt, Cog, L, Kd, 1.0f, (const float *)wg, Kd, 0, (const float *)col, cnt * L, L,
                               0.0f, (float *)y + ((n0 * Co + g * Cog) * L), L, Co * L);
        else
          for (int64_t n = 0; n < cnt; n++)
            gemm_rt(f64, 0, 0, Cog, L, Kd, wg, Kd, col + (size_t)(n * L) * es, cnt * L, 0.0,
                    y + (size_t)(((n0 + n) * Co + g * Cog) * L) * es, L, prec);
      }
    }
    if (a->has1) { /* bias */
      const tpurt_view *bv = &a->out1;
      const char *bb = hv(bv->ptr);
      size_t bes = tpurt_dtype_size(bv->dtype);
      for (int64_t c = 0; c < Co; c++) {
        const char *bp = bb + (ptrdiff_t)(c * bv->strides[0]) * (ptrdiff_t)bes;
        double b = bv->dtype == TPURT_F64 ? *(const double *)bp
                   : bv->dtype == TPURT_F32 ? *(const float *)bp
                   : bv->dtype == TPURT_BF16 ? tpurt__bf16_to_f32(*(const uint16_t *)bp)
                                             : tpurt__f16_to_f32(*(const uint16_t *)bp);
        for (int64_t n = 0; n < N; n++) {
          if (f64) {
            double *yp = (double *)y + (n * Co + c) * L;
            for (int64_t l = 0; l < L; l++) yp[l] += b;
          } else {
            float *yp = (float *)y + (n * Co + c) * L;
            float bf = (float)b;
            for (int64_t l = 0; l < L; l++) yp[l] += bf;
          }
        }
      }
    }
    if (!direct) xfer(&a->out0, y, f64, 1);
  } else if (a->kind == CONV_BWD_IN) {
    const char *dy = load4(&a->in0, 0, f64);
    const char *w = load4(&a->in1, 1, f64);
    int direct;
    char *dx = out4(&a->out0, 4, f64, &direct);
    int64_t nb = one ? 1 : COL_BUDGET / ((Kd * L > 0 ? Kd * L : 1) * (int64_t)es);
    if (nb < 1) nb = 1;
    if (nb > N) nb = N;
    /* unit stride: dx is the convolution of dy with the weights
     * transposed (in/out channels) and flipped, padded by dil * (k - 1) -
     * pad (an implicit GEMM; no col2im) */
    int flipped = implicit && p->stride[1] == 1 && p->stride[2] == 1;
    if (flipped) {
      float *wt = tpurt__scratch(3, sizeof(float) * (size_t)(Cig * Cog * kk));
      int64_t pad[3] = {0, p->dilation[1] * (kh - 1) - p->padding[1], p->dilation[2] * (kw - 1) - p->padding[2]};
      for (int64_t g = 0; g < G && wt; g++) {
        const float *wg = (const float *)w + g * Cog * Kd;
        for (int64_t ci = 0; ci < Cig; ci++)
          for (int64_t co = 0; co < Cog; co++)
            for (int64_t t = 0; t < kk; t++) wt[(ci * Cog + co) * kk + (kk - 1 - t)] = wg[(co * Cig + ci) * kk + t];
        tpurt_conv_cols cc = conv_cols((const float *)dy + g * Cog * L, Co * L, Cog, Ho, Wo, N, H, W, kh, kw,
                                       p->stride, pad, p->dilation);
        tpurt__sgemm_conv(0, &cc, Cig, wt, Cog * kk, (float *)dx + g * Cig * HW, Ci * HW, 0.0f, ig_flags);
      }
      if (!wt) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "conv: no host memory for %" PRId64 " weights",
                                 Cig * Cog * kk);
    }
    /* other strides, few input channels per group: one unit-stride
     * implicit GEMM per phase of dx. Paired (tpurt_bench_ab conv, 3 x 3
     * stride 2, phases / GEMM + col2im): 32 -> 64 channels 1.32-1.41,
     * 64 -> 128 1.11-1.15 (1.33 at 56 x 56), 96 -> 96 1.24, but 128 ->
     * 256 0.72-0.79 and 256 -> 512 0.27 (rearranging many weights per
     * phase, one product per phase), and 1 x 1 kernels 0.77-1.06 (three
     * phases of four are zeros: dx is all scatter). */
    if (implicit && !flipped && !one && a->phases && Cig <= PHASE_MAX_CIN && kh * kw > 1 &&
        bwd_input_phases((const float *)dy, (const float *)w, (float *)dx, N, Ci, H, W, Co, Ho, Wo, kh, kw, G, p,
                         ig_flags))
      flipped = 1; /* done */
    char *col = one || flipped ? NULL : tpurt__scratch(3, (size_t)(Kd * L * nb) * es);
    char *dyp = one || flipped ? NULL : tpurt__scratch(5, (size_t)(Cog * L * nb) * es);
    for (int64_t g = 0; g < G && !flipped; g++) {
      const char *wg = w + (size_t)(g * Cog * Kd) * es;
      if (one && batched) {
        tpurt__sgemm_batched(1, 0, N, Cig, L, Cog, 1.0f, (const float *)wg, Kd, 0, (const float *)dy + g * Cog * L,
                             L, Co * L, 0.0f, (float *)dx + g * Cig * HW, L, Ci * HW);
        continue;
      }
      for (int64_t n0 = 0; n0 < N; n0 += nb) {
        int64_t cnt = N - n0 < nb ? N - n0 : nb;
        const char *dyg = dy + (size_t)((n0 * Co + g * Cog) * L) * es;
        char *dxg = dx + (size_t)((n0 * Ci + g * Cig) * HW) * es;
        if (one) {
          gemm_rt(f64, 1, 0, Cig, L, Cog, wg, Kd, dyg, L, 0.0, dxg, L, prec);
          continue;
        }
        gather_cl(dyp, dyg, Cog, L, cnt, Co * L, es);
        gemm_rt(f64, 1, 0, Kd, cnt * L, Cog, wg, Kd, dyp, cnt * L, 0.0, col, cnt * L, prec);
        ic.img = dxg;
        ic.col = col;
        ic.nb = cnt;
        ic.ld = cnt * L;
        tpurt_parallel_for(Cig * cnt, 1, col2im_chans, &ic);
      }
    }
    if (a->has1) { /* bias over dx's channels (transposed convolution) */
      const tpurt_view *bv = &a->out1;
      const char *bb = hv(bv->ptr);
      size_t bes = tpurt_dtype_size(bv->dtype);
      for (int64_t c = 0; c < Ci; c++) {
        const char *bp = bb + (ptrdiff_t)(c * bv->strides[0]) * (ptrdiff_t)bes;
        double b = bv->dtype == TPURT_F64 ? *(const double *)bp
                   : bv->dtype == TPURT_F32 ? *(const float *)bp
                   : bv->dtype == TPURT_BF16 ? tpurt__bf16_to_f32(*(const uint16_t *)bp)
                                             : tpurt__f16_to_f32(*(const uint16_t *)bp);
        for (int64_t n = 0; n < N; n++) {
          if (f64) {
            double *xp = (double *)dx + (n * Ci + c) * HW;
            for (int64_t l = 0; l < HW; l++) xp[l] += b;
          } else {
            float *xp = (float *)dx + (n * Ci + c) * HW;
            float bf = (float)b;
            for (int64_t l = 0; l < HW; l++) xp[l] += bf;
          }
        }
      }
    }
    if (!direct) xfer(&a->out0, dx, f64, 1);
  } else {
    const char *dy = load4(&a->in0, 0, f64);
    if (a->has0) {
      const char *x = load4(&a->in1, 1, f64);
      int direct;
      char *dw = out4(&a->out0, 4, f64, &direct);
      int done = batched && a->direct_mode && N > 0 && tpurt__conv_direct_applies(Cig, kd, D, Do) &&
                 tpurt__conv_direct_dw_f32((const float *)x, (const float *)dy, (float *)dw, N, Ci, H, W, Co, Ho,
                                           Wo, kh, kw, G, p->stride + 1, p->padding + 1, p->dilation + 1,
                                           a->direct_mode == 2);
      for (int64_t g = 0; g < G && implicit && !done; g++) {
        tpurt_conv_cols cc = conv_cols((const float *)x + g * Cig * HW, Ci * HW, Cig, H, W, N, Ho, Wo, kh, kw,
                                       p->stride, p->padding, p->dilation);
        tpurt__sgemm_conv(1, &cc, Cog, (float *)dw + g * Cog * Kd, Kd, (float *)dy + g * Cog * L, Co * L, 0.0f,
                          ig_flags);
      }
      done = done || implicit;
      int64_t nb = done ? 0 : COL_BUDGET / ((Kd * L > 0 ? Kd * L : 1) * (int64_t)es);
      if (nb < 1) nb = 1;
      if (nb > N) nb = N;
      char *col = done ? NULL : tpurt__scratch(3, (size_t)(Kd * L * nb) * es);
      char *dyp = done ? NULL : tpurt__scratch(5, (size_t)(Cog * L * nb) * es);
      for (int64_t g = 0; g < G && !done; g++) {
        char *dwg = dw + (size_t)(g * Cog * Kd) * es;
        if (N == 0) memset(dwg, 0, (size_t)(Cog * Kd) * es);
        for (int64_t n0 = 0; n0 < N; n0 += nb) {
          int64_t cnt = N - n0 < nb ? N - n0 : nb;
          ic.img = x + (size_t)((n0 * Ci + g * Cig) * HW) * es;
          ic.col = col;
          ic.nb = cnt;
          ic.ld = cnt * L;
          tpurt_parallel_for(Kd * cnt, 1 + 4096 / (L + 1), im2col_rows, &ic);
          gather_cl(dyp, dy + (size_t)((n0 * Co + g * Cog) * L) * es, Cog, L, cnt, Co * L, es);
          gemm_rt(f64, 0, 1, Cog, Kd, cnt * L, dyp, cnt * L, col, cnt * L, n0 == 0 ? 0.0 : 1.0, dwg, Kd, prec);
        }
      }
      if (!direct) xfer(&a->out0, dw, f64, 1);
    }
    if (a->has1) bias_grad(&a->out1, (const char *)dy, f64 ? TPURT_F64 : TPURT_F32, Co * L, L, L, 1, N, Co, 1, L);
  }
  tpurt__scratch_trim();
  return TPURT_OK;
}

/* ---------------------------------------------------------- launch */

static int is_float(tpurt_dtype d) { return d == TPURT_F32 || d == TPURT_F64 || d == TPURT_F16 || d == TPURT_BF16; }

static tpurt_status check_geom(const char *op, const tpurt_view *x, const tpurt_view *w, const tpurt_view *y,
                               const tpurt_conv3d_params *p) {
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  for (int k = 0; k < 3; k++)
    if (p->stride[k] < 1 || p->dilation[k] < 1 || p->padding[k] < 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "%s: stride and dilation must be positive and padding non-negative", op);
  if (p->groups < 1) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: groups must be positive", op);
  int64_t N = x->sizes[0], Ci = x->sizes[1], Co = w->sizes[0];
  if (Ci % p->groups || Co % p->groups)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: channels (%" PRId64 " in, %" PRId64
                      " out) must be divisible by groups (%" PRId64 ")", op, Ci, Co, p->groups);
  if (w->sizes[1] * p->groups != Ci)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: weight of size [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                      "] expects %" PRId64 " input channels, got %" PRId64, op, w->sizes[0], w->sizes[1],
                      w->sizes[2], w->sizes[3], w->sizes[4],
                      w->sizes[1] * p->groups, Ci);
  for (int k = 0; k < 3; k++) {
    int64_t in = x->sizes[2 + k], kern = w->sizes[2 + k];
    int64_t eff = p->dilation[k] * (kern - 1) + 1;
    int64_t o = in + 2 * p->padding[k] - eff;
    o = o < 0 ? -1 : o / p->stride[k] + 1;
    if (o < 1 && N > 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: kernel size (%" PRId64 ") larger than padded input (%" PRId64
                        ")", op, eff, in + 2 * p->padding[k]);
    /* smaller outputs are allowed: a transposed convolution with
     * output_padding >= stride has input rows no window reaches */
    if (y->sizes[2 + k] > (o < 0 ? 0 : o))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output size %" PRId64 " does not match %" PRId64
                        " in spatial dimension %d", op, y->sizes[2 + k], o, k);
  }
  if (y->sizes[0] != N || y->sizes[1] != Co)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output batch/channels do not match", op);
  if (!is_float(x->dtype) || x->dtype != w->dtype || x->dtype != y->dtype)
    return tpurt__err(x->dtype == w->dtype && x->dtype == y->dtype ? TPURT_ERR_NOT_SUPPORTED
                                                                   : TPURT_ERR_INVALID_ARGUMENT,
                      "%s: input, weight and output must share one floating dtype (got %s, %s, %s)", op,
                      tpurt_dtype_name(x->dtype), tpurt_dtype_name(w->dtype), tpurt_dtype_name(y->dtype));
  return TPURT_OK;
}

static tpurt_status launch_conv(tpurt_stream *s, conv_args *a, const char *op, const tpurt_view *x,
                                const tpurt_view *w, const tpurt_view *y) {
  tpurt_status st;
  if ((st = check_geom(op, x, w, y, &a->p))) return st;
  if ((unsigned)a->prec > TPURT_PRECISION_HIGHEST)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: invalid precision", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(x->ptr)))) return st;
  return tpurt_launch(s, op, k_conv, a, sizeof *a);
}

static tpurt_status check_bias(const tpurt_view *b, int64_t n, const char *op) {
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(b, 1, op, "bias"))) return st;
  if (b->sizes[0] != n)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bias has %" PRId64 " elements, expected %" PRId64, op,
                      b->sizes[0], n);
  if (!is_float(b->dtype)) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bias must be floating", op);
  return TPURT_OK;
}

/* Algorithm switches for A/B measurements and tests, read per launch on
 * the host: "0" off, "portable" without AVX2, anything else on (1).
 * TORCH_TPU_CONV_DIRECT: the direct forward / weight gradient for few
 * input channels (else im2col + GEMM); TORCH_TPU_CONV_IMPLICIT: the
 * implicit GEMM for f32 2-D (else im2col + GEMM + col2im);
 * TORCH_TPU_CONV_PHASES: a strided input gradient by phases (else GEMM
 * + col2im). */
static int conv_env_mode(const char *name) {
  const char *e = getenv(name);
  if (!e || !*e) return 1;
  if (!strcmp(e, "0")) return 0;
  if (!strcmp(e, "portable")) return 2;
  return 1;
}
#define conv_direct_mode() conv_env_mode("TORCH_TPU_CONV_DIRECT")
#define conv_implicit_mode() conv_env_mode("TORCH_TPU_CONV_IMPLICIT")
#define conv_phases_mode() (conv_env_mode("TORCH_TPU_CONV_PHASES") != 0)

tpurt_status tpurt_conv3d(tpurt_stream *s, const tpurt_view *y, const tpurt_view *x, const tpurt_view *w,
                          const tpurt_view *bias, const tpurt_conv3d_params *p, tpurt_precision precision) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  const char *op = "conv3d";
  if ((st = tpurt__check_kernel_view(y, 5, op, "output")) || (st = tpurt__check_kernel_input(x, 5, op, "input")) ||
      (st = tpurt__check_kernel_input(w, 5, op, "weight")))
    return st;
  if (bias && (st = check_bias(bias, w->sizes[0], op))) return st;
  conv_args a;
  memset(&a, 0, sizeof a);
  a.kind = CONV_FWD;
  a.implicit = conv_implicit_mode();
  a.phases = conv_phases_mode();
  a.direct_mode = conv_direct_mode();
  a.out0 = *y;
  a.in0 = *x;
  a.in1 = *w;
  if (bias) a.has1 = 1, a.out1 = *bias;
  if (p) a.p = *p;
  a.prec = precision;
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  if (tpurt__view_numel(y) == 0) {
    if ((st = check_geom(op, x, w, y, p))) return st;
    return TPURT_OK;
  }
  return launch_conv(s, &a, op, x, w, y);
}

tpurt_status tpurt_conv3d_backward_input(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dy,
                                         const tpurt_view *w, const tpurt_view *bias, const tpurt_conv3d_params *p,
                                         tpurt_precision precision) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  const char *op = "conv3d_backward_input";
  if ((st = tpurt__check_kernel_view(dx, 5, op, "grad_input")) ||
      (st = tpurt__check_kernel_input(dy, 5, op, "grad_output")) || (st = tpurt__check_kernel_input(w, 5, op, "weight")))
    return st;
  if (bias && (st = check_bias(bias, dx->sizes[1], op))) return st;
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  conv_args a;
  memset(&a, 0, sizeof a);
  a.kind = CONV_BWD_IN;
  a.implicit = conv_implicit_mode();
  a.phases = conv_phases_mode();
  a.out0 = *dx;
  a.in0 = *dy;
  a.in1 = *w;
  if (bias) a.has1 = 1, a.out1 = *bias;
  a.p = *p;
  a.prec = precision;
  if (tpurt__view_numel(dx) == 0) return check_geom(op, dx, w, dy, p);
  return launch_conv(s, &a, op, dx, w, dy);
}

tpurt_status tpurt_conv3d_backward_weight(tpurt_stream *s, const tpurt_view *dw, const tpurt_view *db,
                                          const tpurt_view *dy, const tpurt_view *x, const tpurt_conv3d_params *p,
                                          tpurt_precision precision) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  const char *op = "conv3d_backward_weight";
  if ((st = tpurt__check_kernel_input(dy, 5, op, "grad_output"))) return st;
  if (!dw && !db) return TPURT_OK;
  if (db && (st = check_bias(db, dy->sizes[1], op))) return st;
  conv_args a;
  memset(&a, 0, sizeof a);
  a.kind = CONV_BWD_W;
  a.implicit = conv_implicit_mode();
  a.phases = conv_phases_mode();
  a.direct_mode = conv_direct_mode();
  a.in0 = *dy;
  if (db) a.has1 = 1, a.out1 = *db;
  a.prec = precision;
  if (!dw) { /* bias gradient only */
    if (!is_float(dy->dtype))
      return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: not implemented for dtype %s", op, tpurt_dtype_name(dy->dtype));
    a.p.groups = 1;
    a.in1 = *dy;
    a.out0 = *dy;
    a.out0.sizes[2] = a.out0.sizes[3] = a.out0.sizes[4] = 1; /* 1x1 weight geometry, unused */
    a.out0.sizes[0] = dy->sizes[1];
    if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(dy->ptr)))) return st;
    return tpurt_launch(s, op, k_conv, &a, sizeof a);
  }
  if ((st = tpurt__check_kernel_view(dw, 5, op, "grad_weight")) || (st = tpurt__check_kernel_input(x, 5, op, "input")))
    return st;
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  a.has0 = 1;
  a.out0 = *dw;
  a.in1 = *x;
  a.p = *p;
  if (tpurt__view_numel(dw) == 0 && !db) return check_geom(op, x, dw, dy, p);
  return launch_conv(s, &a, op, x, dw, dy);
}

/* ------------------------------------------- 2-D entry points (D = 1) */

static tpurt_view to5(const tpurt_view *v) {
  tpurt_view r = *v;
  if (v->ndim != 4) return r; /* rejected by the 3-D validation */
  r.ndim = 5;
  for (int k = 4; k >= 3; k--) r.sizes[k] = v->sizes[k - 1], r.strides[k] = v->strides[k - 1];
  r.sizes[2] = 1, r.strides[2] = 0;
  return r;
}
static tpurt_conv3d_params p3(const tpurt_conv_params *p) {
  tpurt_conv3d_params q = {{1, p->stride[0], p->stride[1]}, {0, p->padding[0], p->padding[1]},
                           {1, p->dilation[0], p->dilation[1]}, p->groups};
  return q;
}
static tpurt_status chk4(const tpurt_view *v, const char *op, const char *what) {
  return v ? tpurt__check_kernel_view(v, 4, op, what) : TPURT_OK;
}
static tpurt_status chk4_in(const tpurt_view *v, const char *op, const char *what) {
  return v ? tpurt__check_kernel_input(v, 4, op, what) : TPURT_OK;
}

tpurt_status tpurt_conv2d(tpurt_stream *s, const tpurt_view *y, const tpurt_view *x, const tpurt_view *w,
                          const tpurt_view *bias, const tpurt_conv_params *p, tpurt_precision precision) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((st = chk4(y, "conv2d", "output")) || (st = chk4_in(x, "conv2d", "input")) || (st = chk4_in(w, "conv2d", "weight")))
    return st;
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "conv2d: params is NULL");
  tpurt_view y5 = to5(y), x5 = to5(x), w5 = to5(w);
  tpurt_conv3d_params q = p3(p);
  return tpurt_conv3d(s, &y5, &x5, &w5, bias, &q, precision);
}

tpurt_status tpurt_conv2d_backward_input(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dy,
                                         const tpurt_view *w, const tpurt_view *bias, const tpurt_conv_params *p,
                                         tpurt_precision precision) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  const char *op = "conv2d_backward_input";
  if ((st = chk4(dx, op, "grad_input")) || (st = chk4_in(dy, op, "grad_output")) || (st = chk4_in(w, op, "weight")))
    return st;
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  tpurt_view a = to5(dx), b = to5(dy), c = to5(w);
  tpurt_conv3d_params q = p3(p);
  return tpurt_conv3d_backward_input(s, &a, &b, &c, bias, &q, precision);
}

tpurt_status tpurt_conv2d_backward_weight(tpurt_stream *s, const tpurt_view *dw, const tpurt_view *db,
                                          const tpurt_view *dy, const tpurt_view *x, const tpurt_conv_params *p,
                                          tpurt_precision precision) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  const char *op = "conv2d_backward_weight";
  if ((st = chk4_in(dy, op, "grad_output"))) return st;
  if (dw && ((st = chk4(dw, op, "grad_weight")) || (st = chk4_in(x, op, "input")))) return st;
  if (dw && !p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  tpurt_view a = dw ? to5(dw) : (tpurt_view){0}, b = to5(dy), c = x ? to5(x) : (tpurt_view){0};
  tpurt_conv3d_params q = p ? p3(p) : (tpurt_conv3d_params){{1, 1, 1}, {0, 0, 0}, {1, 1, 1}, 1};
  return tpurt_conv3d_backward_weight(s, dw ? &a : NULL, db, &b, x ? &c : NULL, p ? &q : NULL, precision);
}
