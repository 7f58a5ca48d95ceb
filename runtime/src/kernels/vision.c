/*
 * vision.c — 3-D pooling (max, average, adaptive, fractional), plane
 * scatters (max pooling backward, max_unpool), separable interpolation
 * (nearest, nearest-exact, linear, cubic, antialiased) with its adjoint,
 * grid sampling (bilinear / nearest / bicubic, three padding modes) with
 * gradients, and im2col / col2im.
 *
 * Every spatial view is 5-D [N, C, D, H, W]. Work is split over the N*C
 * planes (grid sampling: over the batch), so backward scatters need no
 * atomics. Values are computed in double and stored in the view's dtype.
 */
#include "kcommon.h"
#include "gemm_internal.h"

typedef double acc_t;

/* loads/stores of the float dtypes (kcommon.h) */
#define ld kc_ld
#define st kc_st
#define is_float kc_is_float

/* A 5-D view with byte strides. */
typedef struct {
  char *base;
  tpurt_dtype dt;
  int64_t C, D, H, W;
  int64_t sn, sc, sd, sh, sw;
} v5;

static v5 mk5(const tpurt_view *v) {
  v5 p;
  int64_t es = (int64_t)tpurt_dtype_size(v->dtype);
  p.base = v->ptr ? tpurt__host_view(v->ptr) : NULL;
  p.dt = v->dtype;
  p.C = v->sizes[1], p.D = v->sizes[2], p.H = v->sizes[3], p.W = v->sizes[4];
  p.sn = v->strides[0] * es, p.sc = v->strides[1] * es, p.sd = v->strides[2] * es;
  p.sh = v->strides[3] * es, p.sw = v->strides[4] * es;
  return p;
}
static inline char *plane5(const v5 *v, int64_t nc) { return v->base + (nc / v->C) * v->sn + (nc % v->C) * v->sc; }
#define AT5(v, pl, d, h, w) ((pl) + (d) * (v).sd + (h) * (v).sh + (w) * (v).sw)

/* ------------------------------------------------------------ launch */

enum { K_MAX, K_AVG, K_AVG_BWD, K_AMAX, K_AAVG, K_AAVG_BWD, K_FRAC, K_SCATTER, K_INTERP, K_INTERP_BWD };

typedef struct {
  int kind;
  tpurt_view out, idx, in, aux; /* aux: samples (fractional) */
  int has_idx, accumulate, mode, align;
  tpurt_pool3d_params p;
  int64_t fk[3];
  int smap[3];
  double scales[3];
} vargs;

typedef struct {
  int64_t n, K; /* outputs, taps per output */
  int64_t *idx; /* [n * K] */
  double *w;    /* [n * K] */
} taps;

typedef struct {
  const vargs *a;
  taps t[3];
  kc_err err;
} vctx;

static tpurt_status check5(const char *op, const tpurt_view *v, const char *what) {
  tpurt_status s = tpurt__check_kernel_view(v, 5, op, what);
  if (s) return s;
  if (!is_float(v->dtype))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: not implemented for dtype %s", op, tpurt_dtype_name(v->dtype));
  return TPURT_OK;
}
static tpurt_status check_planes(const char *op, const tpurt_view *a, const tpurt_view *b) {
  if (a->sizes[0] != b->sizes[0] || a->sizes[1] != b->sizes[1])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: batch and channel sizes differ ([%" PRId64 ", %" PRId64 "] vs [%" PRId64 ", %" PRId64 "])",
                      op, a->sizes[0], a->sizes[1], b->sizes[0], b->sizes[1]);
  if (a->dtype != b->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: dtypes differ (%s vs %s)", op, tpurt_dtype_name(a->dtype),
                      tpurt_dtype_name(b->dtype));
  return TPURT_OK;
}
static tpurt_status check_idx(const char *op, const tpurt_view *idx, const tpurt_view *like) {
  tpurt_status s = tpurt__check_kernel_view(idx, 5, op, "indices");
  if (s) return s;
  if (idx->dtype != TPURT_I64) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: indices must be int64", op);
  for (int k = 0; k < 5; k++)
    if (idx->sizes[k] != like->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: indices and values shapes differ", op);
  return TPURT_OK;
}
static tpurt_status check_p3(const char *op, const tpurt_pool3d_params *p) {
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  for (int k = 0; k < 3; k++)
    if (p->kernel[k] < 1 || p->stride[k] < 1 || p->dilation[k] < 1 || p->padding[k] < 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "%s: kernel, stride and dilation must be positive, padding non-negative", op);
  return TPURT_OK;
}

/* ------------------------------------------------------------ pooling */

static void max_fwd(const vargs *a, int64_t nc) {
  v5 o = mk5(&a->out), i = mk5(&a->in), x = mk5(&a->idx);
  const tpurt_pool3d_params *p = &a->p;
  char *po = plane5(&o, nc), *pi = plane5(&i, nc), *px = a->has_idx ? plane5(&x, nc) : NULL;
  int64_t isz[3] = {i.D, i.H, i.W};
  for (int64_t od = 0; od < o.D; od++)
    for (int64_t oh = 0; oh < o.H; oh++)
      for (int64_t ow = 0; ow < o.W; ow++) {
        int64_t s0[3], e0[3], oo[3] = {od, oh, ow};
        for (int k = 0; k < 3; k++) {
          s0[k] = oo[k] * p->stride[k] - p->padding[k];
          e0[k] = s0[k] + (p->kernel[k] - 1) * p->dilation[k] + 1;
          while (s0[k] < 0) s0[k] += p->dilation[k];
          if (e0[k] > isz[k]) e0[k] = isz[k];
        }
        int64_t best = (s0[0] * i.H + s0[1]) * i.W + s0[2];
        acc_t m = -INFINITY;
        for (int64_t d = s0[0]; d < e0[0]; d += p->dilation[0])
          for (int64_t h = s0[1]; h < e0[1]; h += p->dilation[1])
            for (int64_t w = s0[2]; w < e0[2]; w += p->dilation[2]) {
              acc_t v = ld(i.dt, AT5(i, pi, d, h, w));
              if (v > m || isnan(v)) {
                m = v;
                best = (d * i.H + h) * i.W + w;
                if (isnan(v)) goto done;
              }
            }
      done:
        st(o.dt, AT5(o, po, od, oh, ow), m);
        if (px) *(int64_t *)AT5(x, px, od, oh, ow) = best;
      }
}

/* clamped window of an average pool along one dim; returns the padded size */
static inline int64_t avg_win(int64_t o, int64_t k, int64_t s, int64_t pad, int64_t n, int64_t *b, int64_t *e) {
  int64_t st0 = o * s - pad, en = st0 + k;
  if (en > n + pad) en = n + pad;
  int64_t pool = en - st0;
  if (st0 < 0) st0 = 0;
  if (en > n) en = n;
  *b = st0, *e = en;
  return pool;
}

static void avg_fwd_bwd(const vargs *a, int64_t nc, int bwd, acc_t *acc) {
  /* fwd: out <- in. bwd: out = grad_in (acc over its plane), in = grad_out */
  v5 o = mk5(&a->out), i = mk5(&a->in);
  const tpurt_pool3d_params *p = &a->p;
  char *po = plane5(&o, nc), *pi = plane5(&i, nc);
  const v5 *big = bwd ? &o : &i, *small = bwd ? &i : &o;
  if (bwd) memset(acc, 0, sizeof(acc_t) * (size_t)(o.D * o.H * o.W));
  for (int64_t od = 0; od < small->D; od++)
    for (int64_t oh = 0; oh < small->H; oh++)
      for (int64_t ow = 0; ow < small->W; ow++) {
        int64_t b[3], e[3];
        int64_t pool = avg_win(od, p->kernel[0], p->stride[0], p->padding[0], big->D, &b[0], &e[0]) *
                       avg_win(oh, p->kernel[1], p->stride[1], p->padding[1], big->H, &b[1], &e[1]) *
                       avg_win(ow, p->kernel[2], p->stride[2], p->padding[2], big->W, &b[2], &e[2]);
        int64_t div = p->divisor_override ? p->divisor_override
                      : p->count_include_pad ? pool
                                             : (e[0] - b[0]) * (e[1] - b[1]) * (e[2] - b[2]);
        if (!bwd) {
          acc_t s = 0;
          for (int64_t d = b[0]; d < e[0]; d++)
            for (int64_t h = b[1]; h < e[1]; h++)
              for (int64_t w = b[2]; w < e[2]; w++) s += ld(i.dt, AT5(i, pi, d, h, w));
          st(o.dt, AT5(o, po, od, oh, ow), div ? s / (acc_t)div : NAN);
        } else {
          acc_t g = ld(i.dt, AT5(i, pi, od, oh, ow)) / (acc_t)div;
          for (int64_t d = b[0]; d < e[0]; d++)
            for (int64_t h = b[1]; h < e[1]; h++)
              for (int64_t w = b[2]; w < e[2]; w++) acc[(d * o.H + h) * o.W + w] += g;
        }
      }
  if (bwd)
    for (int64_t d = 0; d < o.D; d++)
      for (int64_t h = 0; h < o.H; h++)
        for (int64_t w = 0; w < o.W; w++) st(o.dt, AT5(o, po, d, h, w), acc[(d * o.H + h) * o.W + w]);
}

static inline int64_t a_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
static inline int64_t a_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

static void adapt(const vargs *a, int64_t nc, int kind, acc_t *acc) {
  v5 o = mk5(&a->out), i = mk5(&a->in), x = mk5(&a->idx);
  char *po = plane5(&o, nc), *pi = plane5(&i, nc), *px = a->has_idx ? plane5(&x, nc) : NULL;
  int bwd = kind == K_AAVG_BWD;
  const v5 *big = bwd ? &o : &i, *small = bwd ? &i : &o;
  if (bwd) memset(acc, 0, sizeof(acc_t) * (size_t)(o.D * o.H * o.W));
  for (int64_t od = 0; od < small->D; od++) {
    int64_t ds = a_start(od, big->D, small->D), de = a_end(od, big->D, small->D);
    for (int64_t oh = 0; oh < small->H; oh++) {
      int64_t hs = a_start(oh, big->H, small->H), he = a_end(oh, big->H, small->H);
      for (int64_t ow = 0; ow < small->W; ow++) {
        int64_t ws = a_start(ow, big->W, small->W), we = a_end(ow, big->W, small->W);
        int64_t cnt = (de - ds) * (he - hs) * (we - ws);
        if (kind == K_AMAX) {
          acc_t m = -INFINITY;
          int64_t best = (ds * i.H + hs) * i.W + ws;
          for (int64_t d = ds; d < de; d++)
            for (int64_t h = hs; h < he; h++)
              for (int64_t w = ws; w < we; w++) {
                acc_t v = ld(i.dt, AT5(i, pi, d, h, w));
                if (v > m || isnan(v)) {
                  m = v;
                  best = (d * i.H + h) * i.W + w;
                  if (isnan(v)) goto done;
                }
              }
        done:
          st(o.dt, AT5(o, po, od, oh, ow), m);
          if (px) *(int64_t *)AT5(x, px, od, oh, ow) = best;
        } else if (kind == K_AAVG) {
          acc_t s = 0;
          for (int64_t d = ds; d < de; d++)
            for (int64_t h = hs; h < he; h++)
              for (int64_t w = ws; w < we; w++) s += ld(i.dt, AT5(i, pi, d, h, w));
          st(o.dt, AT5(o, po, od, oh, ow), s / (acc_t)cnt);
        } else {
          acc_t g = ld(i.dt, AT5(i, pi, od, oh, ow)) / (acc_t)cnt;
          for (int64_t d = ds; d < de; d++)
            for (int64_t h = hs; h < he; h++)
              for (int64_t w = ws; w < we; w++) acc[(d * o.H + h) * o.W + w] += g;
        }
      }
    }
  }
  if (bwd)
    for (int64_t d = 0; d < o.D; d++)
      for (int64_t h = 0; h < o.H; h++)
        for (int64_t w = 0; w < o.W; w++) st(o.dt, AT5(o, po, d, h, w), acc[(d * o.H + h) * o.W + w]);
}

/* Fractional pooling window starts along one dim (PyTorch's interval rule,
 * computed in the data's precision class). */
static void frac_seq(int64_t *seq, double sample, int64_t in, int64_t out, int64_t k, int f64) {
  if (out > 1) {
    if (f64) {
      double alpha = (double)(in - k) / (double)(out - 1);
      for (int64_t i = 0; i < out - 1; i++)
        seq[i] = (int64_t)(((double)i + sample) * alpha) - (int64_t)(sample * alpha);
    } else {
      float alpha = (float)(in - k) / (float)(out - 1), sf = (float)sample;
      for (int64_t i = 0; i < out - 1; i++) seq[i] = (int64_t)(((float)i + sf) * alpha) - (int64_t)(sf * alpha);
    }
  }
  if (out > 0) seq[out - 1] = in - k;
}

static void frac_fwd(const vargs *a, int64_t nc, int64_t *seqbuf) {
  v5 o = mk5(&a->out), i = mk5(&a->in), x = mk5(&a->idx);
  char *po = plane5(&o, nc), *pi = plane5(&i, nc), *px = plane5(&x, nc);
  const tpurt_view *sv = &a->aux;
  int64_t ses = (int64_t)tpurt_dtype_size(sv->dtype);
  const char *sb = tpurt__host_view(sv->ptr);
  int64_t n = nc / o.C, c = nc % o.C;
  int64_t isz[3] = {i.D, i.H, i.W}, osz[3] = {o.D, o.H, o.W};
  int64_t *seq[3] = {seqbuf, seqbuf + o.D, seqbuf + o.D + o.H};
  for (int k = 0; k < 3; k++) {
    double smp = 0;
    if (a->smap[k] >= 0)
      smp = ld(sv->dtype, sb + (n * sv->strides[0] + c * sv->strides[1] + a->smap[k] * sv->strides[2]) * ses);
    frac_seq(seq[k], smp, isz[k], osz[k], a->fk[k], i.dt == TPURT_F64);
  }
  for (int64_t od = 0; od < o.D; od++)
    for (int64_t oh = 0; oh < o.H; oh++)
      for (int64_t ow = 0; ow < o.W; ow++) {
        int64_t d0 = seq[0][od], h0 = seq[1][oh], w0 = seq[2][ow];
        int64_t best = (d0 * i.H + h0) * i.W + w0;
        acc_t m = -INFINITY;
        for (int64_t d = d0; d < d0 + a->fk[0]; d++)
          for (int64_t h = h0; h < h0 + a->fk[1]; h++)
            for (int64_t w = w0; w < w0 + a->fk[2]; w++) {
              acc_t v = ld(i.dt, AT5(i, pi, d, h, w));
              if (v > m || isnan(v)) {
                m = v;
                best = (d * i.H + h) * i.W + w;
                if (isnan(v)) goto done;
              }
            }
      done:
        st(o.dt, AT5(o, po, od, oh, ow), m);
        *(int64_t *)AT5(x, px, od, oh, ow) = best;
      }
}

/* out = 0; out[idx] (+)= in */
static void scatter(vctx *cx, int64_t nc, acc_t *acc) {
  const vargs *a = cx->a;
  v5 o = mk5(&a->out), i = mk5(&a->in), x = mk5(&a->idx);
  char *po = plane5(&o, nc), *pi = plane5(&i, nc), *px = plane5(&x, nc);
  int64_t P = o.D * o.H * o.W;
  memset(acc, 0, sizeof(acc_t) * (size_t)P);
  for (int64_t d = 0; d < i.D; d++)
    for (int64_t h = 0; h < i.H; h++)
      for (int64_t w = 0; w < i.W; w++) {
        int64_t k = *(const int64_t *)AT5(x, px, d, h, w);
        if (k < 0 || k >= P) {
          if (!a->accumulate)
            kc_err_index(&cx->err, "Found an invalid max index: %" PRId64 " (output volumes are of size %" PRId64
                         "x%" PRId64 "x%" PRId64 ")", k, o.D, o.H, o.W);
          continue;
        }
        acc_t v = ld(i.dt, AT5(i, pi, d, h, w));
        if (a->accumulate) acc[k] += v;
        else acc[k] = v;
      }
  for (int64_t d = 0; d < o.D; d++)
    for (int64_t h = 0; h < o.H; h++)
      for (int64_t w = 0; w < o.W; w++) st(o.dt, AT5(o, po, d, h, w), acc[(d * o.H + h) * o.W + w]);
}

/* -------------------------------------------------------- interpolation */

static double i_scale(int64_t in, int64_t out, int align, double scale) {
  if (align) return out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0;
  return scale > 0 ? 1.0 / scale : (double)in / (double)out;
}
static inline double cub1(double x, double A) { return ((A + 2) * x - (A + 3)) * x * x + 1; }
static inline double cub2(double x, double A) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; }
static inline double aa_filter(int cubic, double x) {
  if (x < 0) x = -x;
  if (!cubic) return x < 1 ? 1 - x : 0;
  const double a = -0.5;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
  return 0;
}

static int64_t taps_per_out(int mode, int64_t in, int64_t out, int align, double scale) {
  switch (mode) {
    case TPURT_INTERP_NEAREST:
    case TPURT_INTERP_NEAREST_EXACT: return 1;
    case TPURT_INTERP_LINEAR: return 2;
    case TPURT_INTERP_CUBIC: return 4;
    default: {
      double sc = i_scale(in, out, align, scale);
      double support = (mode == TPURT_INTERP_CUBIC_AA ? 2.0 : 1.0) * (sc >= 1.0 ? sc : 1.0);
      return (int64_t)ceil(support) * 2 + 1;
    }
  }
}

/* Taps of every output position along one dim. f32: scale and source
 * positions in float like PyTorch's opmath for reduced/single precision. */
static void make_taps(taps *t, int mode, int64_t in, int64_t out, int align, double scale, int f64) {
  int64_t K = t->K;
  for (int64_t o = 0; o < out; o++) {
    int64_t *ix = t->idx + o * K;
    double *w = t->w + o * K;
    for (int64_t k = 0; k < K; k++) ix[k] = 0, w[k] = 0;
    switch (mode) {
      case TPURT_INTERP_NEAREST: {
        float sc = scale > 0 ? (float)(1.0 / scale) : (float)in / (float)out;
        int64_t s;
        if (out == in) s = o;
        else if (out == 2 * in) s = o >> 1;
        else {
          s = (int64_t)floorf((float)o * sc);
          if (s > in - 1) s = in - 1;
        }
        ix[0] = s, w[0] = 1;
        break;
      }
      case TPURT_INTERP_NEAREST_EXACT: {
        float sc = scale > 0 ? (float)(1.0 / scale) : (float)in / (float)out;
        int64_t s = (int64_t)floorf(((float)o + 0.5f) * sc);
        if (s > in - 1) s = in - 1;
        ix[0] = s, w[0] = 1;
        break;
      }
      case TPURT_INTERP_LINEAR: {
        double src;
        if (f64) {
          double sc = i_scale(in, out, align, scale);
          src = align ? sc * (double)o : sc * ((double)o + 0.5) - 0.5;
          if (!align && src < 0) src = 0;
        } else {
          float sc = (float)i_scale(in, out, align, scale);
          if (!align && scale <= 0) sc = (float)in / (float)out;
          float s = align ? sc * (float)o : sc * ((float)o + 0.5f) - 0.5f;
          if (!align && s < 0) s = 0;
          src = s;
        }
        int64_t i0 = (int64_t)src;
        if (i0 > in - 1) i0 = in - 1;
        int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
        double l1 = src - (double)i0;
        if (l1 > 1) l1 = 1;
        if (l1 < 0) l1 = 0;
        if (!f64) l1 = (float)l1;
        ix[0] = i0, ix[1] = i1, w[0] = 1 - l1, w[1] = l1;
        break;
      }
      case TPURT_INTERP_CUBIC: {
        double src;
        if (f64) {
          double sc = i_scale(in, out, align, scale);
          src = align ? sc * (double)o : sc * ((double)o + 0.5) - 0.5;
        } else {
          float sc = (float)i_scale(in, out, align, scale);
          src = align ? sc * (float)o : sc * ((float)o + 0.5f) - 0.5f;
        }
        double f = floor(src), tt = src - f;
        const double A = -0.75;
        double c[4] = {cub2(tt + 1, A), cub1(tt, A), cub1(1 - tt, A), cub2(2 - tt, A)};
        for (int k = 0; k < 4; k++) {
          int64_t j = (int64_t)f - 1 + k;
          ix[k] = j < 0 ? 0 : j > in - 1 ? in - 1 : j;
          w[k] = c[k];
        }
        break;
      }
      default: { /* antialiased */
        int cubic = mode == TPURT_INTERP_CUBIC_AA;
        double sc = i_scale(in, out, align, scale);
        double support = (cubic ? 2.0 : 1.0) * (sc >= 1.0 ? sc : 1.0);
        double center = sc * ((double)o + 0.5);
        double inv = sc >= 1.0 ? 1.0 / sc : 1.0;
        int64_t xmin = (int64_t)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int64_t xmax = (int64_t)(center + support + 0.5);
        if (xmax > in) xmax = in;
        int64_t n = xmax - xmin;
        if (n > K) n = K;
        double tot = 0;
        for (int64_t j = 0; j < n; j++) {
          w[j] = aa_filter(cubic, ((double)(j + xmin) - center + 0.5) * inv);
          ix[j] = xmin + j;
          tot += w[j];
        }
        if (tot != 0)
          for (int64_t j = 0; j < n; j++) w[j] /= tot;
        for (int64_t j = n; j < K; j++) ix[j] = xmin < in ? xmin : in - 1, w[j] = 0;
        break;
      }
    }
  }
}

static void interp_fwd(const vctx *cx, int64_t nc) {
  const vargs *a = cx->a;
  v5 o = mk5(&a->out), i = mk5(&a->in);
  char *po = plane5(&o, nc), *pi = plane5(&i, nc);
  const taps *td = &cx->t[0], *th = &cx->t[1], *tw = &cx->t[2];
  for (int64_t od = 0; od < o.D; od++)
    for (int64_t oh = 0; oh < o.H; oh++)
      for (int64_t ow = 0; ow < o.W; ow++) {
        acc_t s = 0;
        for (int64_t a0 = 0; a0 < td->K; a0++) {
          double wd = td->w[od * td->K + a0];
          if (wd == 0) continue;
          int64_t id = td->idx[od * td->K + a0];
          for (int64_t a1 = 0; a1 < th->K; a1++) {
            double wh = th->w[oh * th->K + a1];
            if (wh == 0) continue;
            const char *row = pi + id * i.sd + th->idx[oh * th->K + a1] * i.sh;
            acc_t r = 0;
            for (int64_t a2 = 0; a2 < tw->K; a2++)
              r += tw->w[ow * tw->K + a2] * ld(i.dt, row + tw->idx[ow * tw->K + a2] * i.sw);
            s += wd * wh * r;
          }
        }
        st(o.dt, AT5(o, po, od, oh, ow), s);
      }
}

static void interp_bwd(const vctx *cx, int64_t nc, acc_t *acc) {
  const vargs *a = cx->a;
  v5 gi = mk5(&a->out), go = mk5(&a->in);
  char *pgi = plane5(&gi, nc), *pgo = plane5(&go, nc);
  const taps *td = &cx->t[0], *th = &cx->t[1], *tw = &cx->t[2];
  memset(acc, 0, sizeof(acc_t) * (size_t)(gi.D * gi.H * gi.W));
  for (int64_t od = 0; od < go.D; od++)
    for (int64_t oh = 0; oh < go.H; oh++)
      for (int64_t ow = 0; ow < go.W; ow++) {
        acc_t g = ld(go.dt, AT5(go, pgo, od, oh, ow));
        for (int64_t a0 = 0; a0 < td->K; a0++) {
          double wd = td->w[od * td->K + a0];
          if (wd == 0) continue;
          int64_t id = td->idx[od * td->K + a0];
          for (int64_t a1 = 0; a1 < th->K; a1++) {
            double wh = th->w[oh * th->K + a1];
            if (wh == 0) continue;
            acc_t *row = acc + (id * gi.H + th->idx[oh * th->K + a1]) * gi.W;
            double gw = g * wd * wh;
            for (int64_t a2 = 0; a2 < tw->K; a2++) row[tw->idx[ow * tw->K + a2]] += gw * tw->w[ow * tw->K + a2];
          }
        }
      }
  for (int64_t d = 0; d < gi.D; d++)
    for (int64_t h = 0; h < gi.H; h++)
      for (int64_t w = 0; w < gi.W; w++) st(gi.dt, AT5(gi, pgi, d, h, w), acc[(d * gi.H + h) * gi.W + w]);
}

/* -------------------------------------------------------------- kernel */

static int64_t scratch_elems(const vargs *a) {
  const tpurt_view *v = a->kind == K_SCATTER || a->kind == K_AVG_BWD || a->kind == K_AAVG_BWD ||
                                a->kind == K_INTERP_BWD
                            ? &a->out
                            : NULL;
  if (a->kind == K_FRAC) return a->out.sizes[2] + a->out.sizes[3] + a->out.sizes[4];
  return v ? v->sizes[2] * v->sizes[3] * v->sizes[4] : 0;
}

static void chunk(void *c, int64_t b, int64_t e) {
  vctx *cx = c;
  const vargs *a = cx->a;
  int64_t ne = scratch_elems(a);
  void *buf = ne ? malloc(sizeof(acc_t) * (size_t)(ne + 1)) : NULL;
  if (ne && !buf) {
    kc_err_index(&cx->err, "out of host memory");
    return;
  }
  for (int64_t nc = b; nc < e; nc++) switch (a->kind) {
      case K_MAX: max_fwd(a, nc); break;
      case K_AVG: avg_fwd_bwd(a, nc, 0, NULL); break;
      case K_AVG_BWD: avg_fwd_bwd(a, nc, 1, buf); break;
      case K_AMAX:
      case K_AAVG:
      case K_AAVG_BWD: adapt(a, nc, a->kind, buf); break;
      case K_FRAC: frac_fwd(a, nc, buf); break;
      case K_SCATTER: scatter(cx, nc, buf); break;
      case K_INTERP: interp_fwd(cx, nc); break;
      case K_INTERP_BWD: interp_bwd(cx, nc, buf); break;
      default: break;
    }
  free(buf);
}

static tpurt_status k_vision(void *pa, char *err, size_t errlen) {
  vargs *a = pa;
  vctx cx;
  memset(&cx, 0, sizeof cx);
  cx.a = a;
  tpurt_status ret = TPURT_OK;
  if (a->kind == K_INTERP || a->kind == K_INTERP_BWD) {
    const tpurt_view *small = a->kind == K_INTERP ? &a->in : &a->out, *big = a->kind == K_INTERP ? &a->out : &a->in;
    int f64 = a->in.dtype == TPURT_F64;
    for (int k = 0; k < 3; k++) {
      int64_t in = small->sizes[2 + k], out = big->sizes[2 + k];
      cx.t[k].n = out;
      cx.t[k].K = taps_per_out(a->mode, in, out, a->align, a->scales[k]);
      cx.t[k].idx = malloc(sizeof(int64_t) * (size_t)(out * cx.t[k].K + 1));
      cx.t[k].w = malloc(sizeof(double) * (size_t)(out * cx.t[k].K + 1));
      if (!cx.t[k].idx || !cx.t[k].w) {
        snprintf(err, errlen, "interpolate: out of host memory");
        ret = TPURT_ERR_OUT_OF_MEMORY;
        goto out;
      }
      make_taps(&cx.t[k], a->mode, in, out, a->align, a->scales[k], f64);
    }
  }
  {
    int64_t planes = a->out.sizes[0] * a->out.sizes[1];
    int64_t per = 1;
    for (int k = 2; k < 5; k++) per *= a->out.sizes[k] > a->in.sizes[k] ? a->out.sizes[k] : a->in.sizes[k];
    tpurt_parallel_for(planes, 1 + 16384 / (per + 1), chunk, &cx);
  }
  ret = kc_err_finish(&cx.err, TPURT_ERR_INVALID_ARGUMENT, err, errlen);
out:
  for (int k = 0; k < 3; k++) free(cx.t[k].idx), free(cx.t[k].w);
  return ret;
}

static tpurt_status launch(tpurt_stream *s, vargs *a, const char *op) {
  tpurt_status stt;
  if ((stt = tpurt__resolve_stream(&s, tpurt_devptr_device(a->out.ptr)))) return stt;
  if (tpurt__view_numel(&a->out) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_vision, a, sizeof *a);
}

static tpurt_status pool_common(tpurt_stream *s, int kind, const char *op, const tpurt_view *out,
                                const tpurt_view *idx, const tpurt_view *in, const tpurt_pool3d_params *p) {
  TPURT__INIT_OR_RETURN();
  tpurt_status stt;
  int bwd = kind == K_AVG_BWD || kind == K_AAVG_BWD;
  if ((stt = check5(op, out, bwd ? "grad_input" : "output")) || (stt = check5(op, in, bwd ? "grad_output" : "input")) ||
      (stt = check_planes(op, out, in)))
    return stt;
  if (p && (stt = check_p3(op, p))) return stt;
  if (idx && (stt = check_idx(op, idx, out))) return stt;
  if (!bwd && tpurt__view_numel(in) == 0 && tpurt__view_numel(out) != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: empty input", op);
  vargs a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.out = *out;
  a.in = *in;
  if (idx) a.has_idx = 1, a.idx = *idx;
  if (p) a.p = *p;
  return launch(s, &a, op);
}

tpurt_status tpurt_max_pool3d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx, const tpurt_view *in,
                              const tpurt_pool3d_params *p) {
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "max_pool3d: params is NULL");
  return pool_common(s, K_MAX, "max_pool3d", out, idx, in, p);
}
tpurt_status tpurt_avg_pool3d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in,
                              const tpurt_pool3d_params *p) {
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "avg_pool3d: params is NULL");
  return pool_common(s, K_AVG, "avg_pool3d", out, NULL, in, p);
}
tpurt_status tpurt_avg_pool3d_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                       const tpurt_pool3d_params *p) {
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "avg_pool3d_backward: params is NULL");
  return pool_common(s, K_AVG_BWD, "avg_pool3d_backward", grad_in, NULL, grad_out, p);
}
tpurt_status tpurt_adaptive_pool3d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx,
                                   const tpurt_view *in, int max) {
  TPURT__INIT_OR_RETURN();
  const char *op = max ? "adaptive_max_pool3d" : "adaptive_avg_pool3d";
  tpurt_status stt;
  if ((stt = tpurt__check_kernel_view(in, 5, op, "input"))) return stt;
  if ((in->sizes[2] == 0 || in->sizes[3] == 0 || in->sizes[4] == 0) && tpurt__view_numel(out) != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: empty spatial input", op);
  return pool_common(s, max ? K_AMAX : K_AAVG, op, out, idx, in, NULL);
}
tpurt_status tpurt_adaptive_avg_pool3d_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                const tpurt_view *grad_out) {
  return pool_common(s, K_AAVG_BWD, "adaptive_avg_pool3d_backward", grad_in, NULL, grad_out, NULL);
}

tpurt_status tpurt_fractional_max_pool3d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx,
                                         const tpurt_view *in, const tpurt_view *samples, const int64_t kernel[3],
                                         const int sample_dim[3]) {
  TPURT__INIT_OR_RETURN();
  const char *op = "fractional_max_pool";
  tpurt_status stt;
  if ((stt = check5(op, out, "output")) || (stt = check5(op, in, "input")) || (stt = check_planes(op, out, in)) ||
      (stt = check_idx(op, idx, out)) || (stt = tpurt__check_kernel_view(samples, 3, op, "samples")))
    return stt;
  if (!is_float(samples->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: samples must be floating", op);
  if (samples->sizes[0] != in->sizes[0] || samples->sizes[1] != in->sizes[1])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: samples must be [N, C, K] of the input's N and C", op);
  vargs a;
  memset(&a, 0, sizeof a);
  for (int k = 0; k < 3; k++) {
    int64_t n = in->sizes[2 + k], o = out->sizes[2 + k];
    if (kernel[k] < 1 || (o > 0 && kernel[k] > n) || (o > 0 && o + kernel[k] - 1 > n))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output size %" PRId64 " with pool size %" PRId64
                        " too large for input size %" PRId64, op, o, kernel[k], n);
    if (sample_dim[k] >= samples->sizes[2])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: sample index out of range", op);
    a.fk[k] = kernel[k];
    a.smap[k] = sample_dim[k];
  }
  a.kind = K_FRAC;
  a.out = *out;
  a.in = *in;
  a.idx = *idx;
  a.has_idx = 1;
  a.aux = *samples;
  return launch(s, &a, op);
}

tpurt_status tpurt_scatter_planes(tpurt_stream *s, const tpurt_view *out, const tpurt_view *src,
                                  const tpurt_view *idx, int accumulate) {
  TPURT__INIT_OR_RETURN();
  const char *op = accumulate ? "max_pool_backward" : "max_unpool";
  tpurt_status stt;
  if ((stt = check5(op, out, "output")) || (stt = check5(op, src, "input")) || (stt = check_planes(op, out, src)) ||
      (stt = check_idx(op, idx, src)))
    return stt;
  vargs a;
  memset(&a, 0, sizeof a);
  a.kind = K_SCATTER;
  a.out = *out;
  a.in = *src;
  a.idx = *idx;
  a.has_idx = 1;
  a.accumulate = accumulate;
  return launch(s, &a, op);
}

static tpurt_status interp_common(tpurt_stream *s, int kind, const tpurt_view *o, const tpurt_view *i,
                                  tpurt_interp_mode mode, int align, const double scales[3]) {
  TPURT__INIT_OR_RETURN();
  const char *op = kind == K_INTERP ? "interpolate" : "interpolate_backward";
  tpurt_status stt;
  if ((stt = check5(op, o, "output")) || (stt = check5(op, i, "input")) || (stt = check_planes(op, o, i))) return stt;
  if ((unsigned)mode > TPURT_INTERP_CUBIC_AA)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: invalid mode %d", op, (int)mode);
  const tpurt_view *small = kind == K_INTERP ? i : o, *big = kind == K_INTERP ? o : i;
  for (int k = 2; k < 5; k++)
    if (small->sizes[k] == 0 && tpurt__view_numel(big) != 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: input and output sizes should be greater than 0", op);
  vargs a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.out = *o;
  a.in = *i;
  a.mode = mode;
  a.align = align;
  for (int k = 0; k < 3; k++) a.scales[k] = scales ? scales[k] : -1.0;
  return launch(s, &a, op);
}
tpurt_status tpurt_interpolate(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, tpurt_interp_mode mode,
                               int align_corners, const double scales[3]) {
  return interp_common(s, K_INTERP, out, in, mode, align_corners, scales);
}
tpurt_status tpurt_interpolate_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                        tpurt_interp_mode mode, int align_corners, const double scales[3]) {
  return interp_common(s, K_INTERP_BWD, grad_in, grad_out, mode, align_corners, scales);
}

/* ------------------------------------------------------- grid sampling */

typedef struct {
  tpurt_view out, in, grid, gout, gin, ggrid;
  int has_gin, has_ggrid, bwd, interp, padding, align, dims;
} gs_args;

static inline double gs_unnorm(double c, int64_t size, int align, double *mult) {
  if (align) {
    *mult = (double)(size - 1) / 2;
    return (c + 1) / 2 * (double)(size - 1);
  }
  *mult = (double)size / 2;
  return ((c + 1) * (double)size - 1) / 2;
}
static inline double gs_clip(double x, int64_t size, double *g) {
  double hi = (double)(size - 1);
  if (x <= 0) {
    *g = 0;
    return 0;
  }
  if (x >= hi) {
    *g = 0;
    return hi;
  }
  *g = 1;
  return x;
}
static inline double gs_reflect(double x, double lo2, double hi2, double *g) {
  if (lo2 == hi2) {
    *g = 0;
    return 0;
  }
  double mn = lo2 / 2, span = (hi2 - lo2) / 2;
  double sgn = 1;
  x -= mn;
  if (x < 0) sgn = -1, x = -x;
  double extra = fmod(x, span);
  int64_t flips = (int64_t)floor(x / span);
  if (flips % 2 == 0) {
    *g = sgn;
    return extra + mn;
  }
  *g = -sgn;
  return span - extra + mn;
}
/* padding applied to a source coordinate, with its derivative */
static inline double gs_pad(double x, int64_t size, int padding, int align, double *g) {
  *g = 1;
  if (padding == 1) return gs_clip(x, size, g);
  if (padding == 2) {
    double g1, g2;
    x = align ? gs_reflect(x, 0, 2.0 * (double)(size - 1), &g1) : gs_reflect(x, -1, 2.0 * (double)size - 1, &g1);
    x = gs_clip(x, size, &g2);
    *g = g1 * g2;
  }
  return x;
}

typedef struct {
  int n;
  int64_t idx[4];
  double w[4], dw[4];
  double mult; /* d coordinate / d grid value */
} gs_taps;

static inline void gs_make(gs_taps *t, double c, int64_t size, const gs_args *a) {
  double m;
  double x = gs_unnorm(c, size, a->align, &m);
  if (a->interp == 2) { /* bicubic: padding per tap */
    double f = floor(x), tt = x - f;
    const double A = -0.75;
    t->n = 4;
    t->mult = m;
    if (!isfinite(x)) {
      for (int k = 0; k < 4; k++) t->idx[k] = -1, t->w[k] = t->dw[k] = 0;
      return;
    }
    t->w[0] = cub2(tt + 1, A), t->w[1] = cub1(tt, A), t->w[2] = cub1(1 - tt, A), t->w[3] = cub2(2 - tt, A);
    /* derivatives of the coefficients with respect to tt */
    double x0 = tt + 1, x1 = tt, x2 = 1 - tt, x3 = 2 - tt;
    t->dw[0] = (3 * A * x0 - 10 * A) * x0 + 8 * A;
    t->dw[1] = (3 * (A + 2) * x1 - 2 * (A + 3)) * x1;
    t->dw[2] = -((3 * (A + 2) * x2 - 2 * (A + 3)) * x2);
    t->dw[3] = -((3 * A * x3 - 10 * A) * x3 + 8 * A);
    for (int k = 0; k < 4; k++) {
      double g;
      double p = gs_pad(f - 1 + k, size, a->padding, a->align, &g);
      t->idx[k] = (int64_t)p;
      if (p < 0 || p > (double)(size - 1)) t->idx[k] = -1;
    }
    t->mult = m;
    return;
  }
  double g;
  x = gs_pad(x, size, a->padding, a->align, &g);
  t->mult = m * g;
  if (a->interp == 1) {
    t->n = 1;
    double r = nearbyint(x);
    t->idx[0] = (r >= 0 && r <= (double)(size - 1)) ? (int64_t)r : -1;
    t->w[0] = 1, t->dw[0] = 0;
    return;
  }
  double f = floor(x), tt = x - f;
  t->n = 2;
  int64_t i0 = (int64_t)f;
  t->idx[0] = (f >= 0 && f <= (double)(size - 1)) ? i0 : -1;
  t->idx[1] = (f + 1 >= 0 && f + 1 <= (double)(size - 1)) ? i0 + 1 : -1;
  t->w[0] = 1 - tt, t->w[1] = tt;
  t->dw[0] = -1, t->dw[1] = 1;
  if (!isfinite(x)) t->idx[0] = t->idx[1] = -1;
}

typedef struct {
  const gs_args *a;
} gs_ctx;

/* the in-range taps of t as (x, y, z) index triples, z outermost and x
 * innermost: the order every sum over them follows */
static int gs_valid(const gs_taps t[3], unsigned char tl[64][3]) {
  int nt = 0;
  for (int z = 0; z < t[2].n; z++)
    for (int y = 0; y < t[1].n; y++)
      for (int x = 0; x < t[0].n; x++)
        if (t[2].idx[z] >= 0 && t[1].idx[y] >= 0 && t[0].idx[x] >= 0) {
          tl[nt][0] = (unsigned char)x, tl[nt][1] = (unsigned char)y, tl[nt][2] = (unsigned char)z;
          nt++;
        }
  return nt;
}

/* the taps along x, y, z of output position (n, od, oh, ow) from its grid point */
static void gs_point(const gs_args *a, const char *gb, const int64_t sz[3], int64_t n, int64_t od, int64_t oh,
                     int64_t ow, gs_taps t[3]) {
  const tpurt_view *gv = &a->grid;
  int64_t ges = (int64_t)tpurt_dtype_size(gv->dtype);
  const char *gp = gb + (n * gv->strides[0] + od * gv->strides[1] + oh * gv->strides[2] + ow * gv->strides[3]) * ges;
  for (int k = 0; k < 3; k++) {
    if (k < a->dims) gs_make(&t[k], ld(gv->dtype, gp + k * gv->strides[4] * ges), sz[k], a);
    else t[k].n = 1, t[k].idx[0] = 0, t[k].w[0] = 1, t[k].dw[0] = 0, t[k].mult = 0;
  }
}

/* Backward, a batch at a time (grad_input accumulates over its taps) */
static void gs_batch(void *c, int64_t b0, int64_t b1) {
  const gs_args *a = ((gs_ctx *)c)->a;
  unsigned char tl[64][3];
  int dims = a->dims;
  v5 in = mk5(&a->in);
  const char *gb = tpurt__host_view(a->grid.ptr);
  v5 o = mk5(&a->gout);
  v5 gi = mk5(&a->gin);
  const tpurt_view *ggv = &a->ggrid;
  char *ggb = a->has_ggrid ? tpurt__host_view(ggv->ptr) : NULL;
  int64_t gges = a->has_ggrid ? (int64_t)tpurt_dtype_size(ggv->dtype) : 0;
  int64_t C = in.C;
  int64_t sz[3] = {in.W, in.H, in.D}; /* grid component k: x -> W, y -> H, z -> D */
  for (int64_t n = b0; n < b1; n++) {
    if (a->has_gin)
      for (int64_t c = 0; c < C; c++) {
        char *pl = gi.base + n * gi.sn + c * gi.sc;
        for (int64_t d = 0; d < gi.D; d++)
          for (int64_t h = 0; h < gi.H; h++)
            for (int64_t w = 0; w < gi.W; w++) st(gi.dt, AT5(gi, pl, d, h, w), 0);
      }
    for (int64_t od = 0; od < o.D; od++)
      for (int64_t oh = 0; oh < o.H; oh++)
        for (int64_t ow = 0; ow < o.W; ow++) {
          gs_taps t[3];
          gs_point(a, gb, sz, n, od, oh, ow, t);
          int nt = gs_valid(t, tl);
          double gg[3] = {0, 0, 0};
          for (int64_t c = 0; c < C; c++) {
            const char *pin = in.base + n * in.sn + c * in.sc;
            double gout = ld(o.dt, AT5(o, o.base + n * o.sn + c * o.sc, od, oh, ow));
            char *pgi = a->has_gin ? gi.base + n * gi.sn + c * gi.sc : NULL;
            for (int k = 0; k < nt; k++) {
              int x = tl[k][0], y = tl[k][1], z = tl[k][2];
              if (pgi) {
                char *q = AT5(gi, pgi, t[2].idx[z], t[1].idx[y], t[0].idx[x]);
                st(gi.dt, q, ld(gi.dt, q) + t[0].w[x] * t[1].w[y] * t[2].w[z] * gout);
              }
              if (ggb && a->interp != 1) {
                double v = ld(in.dt, AT5(in, pin, t[2].idx[z], t[1].idx[y], t[0].idx[x])) * gout;
                gg[0] += t[0].dw[x] * t[1].w[y] * t[2].w[z] * v;
                gg[1] += t[0].w[x] * t[1].dw[y] * t[2].w[z] * v;
                gg[2] += t[0].w[x] * t[1].w[y] * t[2].dw[z] * v;
              }
            }
          }
          if (ggb) {
            char *q = ggb + (n * ggv->strides[0] + od * ggv->strides[1] + oh * ggv->strides[2] +
                             ow * ggv->strides[3]) * gges;
            for (int k = 0; k < dims; k++) st(ggv->dtype, q + k * ggv->strides[4] * gges, gg[k] * t[k].mult);
          }
        }
  }
}

/* Forward: output rows (n, od, oh) split over the threads; each output
 * position's in-range taps become byte offsets and weights once, then
 * every channel sums them in tap order with typed loads. */
static void gs_fwd_rows(void *c, int64_t u0, int64_t u1) {
  const gs_args *a = ((gs_ctx *)c)->a;
  v5 in = mk5(&a->in), o = mk5(&a->out);
  const char *gb = tpurt__host_view(a->grid.ptr);
  int64_t sz[3] = {in.W, in.H, in.D};
  int64_t off[64];
  double wt[64];
  unsigned char tl[64][3];
  for (int64_t u = u0; u < u1; u++) {
    int64_t oh = u % o.H, od = u / o.H % o.D, n = u / (o.H * o.D);
    for (int64_t ow = 0; ow < o.W; ow++) {
      gs_taps t[3];
      gs_point(a, gb, sz, n, od, oh, ow, t);
      int nt = gs_valid(t, tl);
      for (int k = 0; k < nt; k++) {
        int x = tl[k][0], y = tl[k][1], z = tl[k][2];
        wt[k] = t[0].w[x] * t[1].w[y] * t[2].w[z];
        off[k] = t[2].idx[z] * in.sd + t[1].idx[y] * in.sh + t[0].idx[x] * in.sw;
      }
      const char *pin = in.base + n * in.sn;
      char *po = AT5(o, o.base + n * o.sn, od, oh, ow);
      for (int64_t ch = 0; ch < in.C; ch++, pin += in.sc, po += o.sc) {
        double sum = 0;
        if (in.dt == TPURT_F32) {
          for (int k = 0; k < nt; k++) sum += wt[k] * *(const float *)(pin + off[k]);
          *(float *)po = (float)sum;
        } else {
          for (int k = 0; k < nt; k++) sum += wt[k] * ld(in.dt, pin + off[k]);
          st(o.dt, po, sum);
        }
      }
    }
  }
}

static tpurt_status k_grid(void *pa, char *err, size_t errlen) {
  (void)err, (void)errlen;
  gs_args *a = pa;
  gs_ctx c = {a};
  if (!a->bwd) {
    int64_t rows = a->out.sizes[0] * a->out.sizes[2] * a->out.sizes[3];
    int64_t per = a->out.sizes[4] * a->out.sizes[1] + 1;
    tpurt_parallel_for(rows, per >= 4096 ? 1 : 4096 / per + 1, gs_fwd_rows, &c);
    return TPURT_OK;
  }
  /* grad_input accumulates in its own dtype: for reduced precision that
   * would round per tap, so batches stay whole and f32/f64 are exact enough */
  tpurt_parallel_for(a->in.sizes[0], 1, gs_batch, &c);
  return TPURT_OK;
}

static tpurt_status gs_check(const char *op, const tpurt_view *in, const tpurt_view *grid, const tpurt_view *out,
                             int interp, int padding, int *dims) {
  tpurt_status stt;
  if ((stt = check5(op, in, "input")) || (stt = check5(op, out, "output")) ||
      (stt = tpurt__check_kernel_view(grid, 5, op, "grid")))
    return stt;
  if (grid->dtype != in->dtype || out->dtype != in->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: input, grid and output must share a dtype", op);
  *dims = (int)grid->sizes[4];
  if (*dims != 2 && *dims != 3)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grid's last dim must be 2 or 3", op);
  if (*dims == 2 && (in->sizes[2] != 1 || grid->sizes[1] != 1))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: 2-d sampling needs D = 1", op);
  if (interp < 0 || interp > 2 || padding < 0 || padding > 2 || (interp == 2 && *dims != 2))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: invalid interpolation or padding mode", op);
  if (grid->sizes[0] != in->sizes[0] || out->sizes[0] != in->sizes[0] || out->sizes[1] != in->sizes[1])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: batch sizes of input, grid and output differ", op);
  for (int k = 0; k < 3; k++)
    if (out->sizes[2 + k] != grid->sizes[1 + k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output and grid spatial sizes differ", op);
  return TPURT_OK;
}

tpurt_status tpurt_grid_sample(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, const tpurt_view *grid,
                               int interp, int padding, int align_corners) {
  TPURT__INIT_OR_RETURN();
  const char *op = "grid_sampler";
  tpurt_status stt;
  gs_args a;
  memset(&a, 0, sizeof a);
  if ((stt = gs_check(op, in, grid, out, interp, padding, &a.dims))) return stt;
  a.out = *out, a.in = *in, a.grid = *grid;
  a.interp = interp, a.padding = padding, a.align = align_corners;
  if ((stt = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return stt;
  if (tpurt__view_numel(out) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_grid, &a, sizeof a);
}

tpurt_status tpurt_grid_sample_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_grid,
                                        const tpurt_view *grad_out, const tpurt_view *in, const tpurt_view *grid,
                                        int interp, int padding, int align_corners) {
  TPURT__INIT_OR_RETURN();
  const char *op = "grid_sampler_backward";
  tpurt_status stt;
  gs_args a;
  memset(&a, 0, sizeof a);
  if ((stt = gs_check(op, in, grid, grad_out, interp, padding, &a.dims))) return stt;
  if (grad_in) {
    if ((stt = check5(op, grad_in, "grad_input"))) return stt;
    for (int k = 0; k < 5; k++)
      if (grad_in->sizes[k] != in->sizes[k])
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grad_input must have the input's shape", op);
    a.has_gin = 1, a.gin = *grad_in;
  }
  if (grad_grid) {
    if ((stt = check5(op, grad_grid, "grad_grid"))) return stt;
    for (int k = 0; k < 5; k++)
      if (grad_grid->sizes[k] != grid->sizes[k])
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grad_grid must have the grid's shape", op);
    a.has_ggrid = 1, a.ggrid = *grad_grid;
  }
  a.bwd = 1;
  a.gout = *grad_out, a.in = *in, a.grid = *grid;
  a.interp = interp, a.padding = padding, a.align = align_corners;
  if ((stt = tpurt__resolve_stream(&s, tpurt_devptr_device(in->ptr)))) return stt;
  if (!grad_in && !grad_grid) return TPURT_OK;
  if (tpurt__view_numel(grad_out) == 0 && (!grad_in || tpurt__view_numel(grad_in) == 0) &&
      (!grad_grid || tpurt__view_numel(grad_grid) == 0))
    return TPURT_OK;
  return tpurt_launch(s, op, k_grid, &a, sizeof a);
}

/* ------------------------------------------------------- im2col / col2im */

typedef struct {
  tpurt_view col, img;
  int64_t k[2];
  tpurt_conv_params p;
  int to_image;
  int64_t oh, ow;
} i2c_args;

static void i2c_chunk(void *c, int64_t b, int64_t e) {
  const i2c_args *a = c;
  const tpurt_view *cv = &a->col, *iv = &a->img;
  int64_t C = iv->sizes[1], H = iv->sizes[2], W = iv->sizes[3];
  int64_t kh = a->k[0], kw = a->k[1], L = a->oh * a->ow;
  int64_t ces = (int64_t)tpurt_dtype_size(cv->dtype), ies = (int64_t)tpurt_dtype_size(iv->dtype);
  char *cb = tpurt__host_view(cv->ptr), *ib = tpurt__host_view(iv->ptr);
  acc_t *acc = a->to_image ? malloc(sizeof(acc_t) * (size_t)(H * W + 1)) : NULL;
  for (int64_t nc = b; nc < e; nc++) {
    int64_t n = nc / C, ch = nc % C;
    char *ip = ib + (n * iv->strides[0] + ch * iv->strides[1]) * ies;
    if (acc) memset(acc, 0, sizeof(acc_t) * (size_t)(H * W));
    for (int64_t i = 0; i < kh; i++)
      for (int64_t j = 0; j < kw; j++) {
        int64_t r = (ch * kh + i) * kw + j;
        char *cp = cb + (n * cv->strides[0] + r * cv->strides[1]) * ces;
        for (int64_t y = 0; y < a->oh; y++) {
          int64_t ih = y * a->p.stride[0] - a->p.padding[0] + i * a->p.dilation[0];
          for (int64_t x = 0; x < a->ow; x++) {
            int64_t iw = x * a->p.stride[1] - a->p.padding[1] + j * a->p.dilation[1];
            char *q = cp + (y * a->ow + x) * cv->strides[2] * ces;
            int in = ih >= 0 && ih < H && iw >= 0 && iw < W;
            if (!a->to_image)
              st(cv->dtype, q, in ? ld(iv->dtype, ip + (ih * iv->strides[2] + iw * iv->strides[3]) * ies) : 0);
            else if (in)
              acc[ih * W + iw] += ld(cv->dtype, q);
          }
        }
      }
    if (acc)
      for (int64_t h = 0; h < H; h++)
        for (int64_t w = 0; w < W; w++) st(iv->dtype, ip + (h * iv->strides[2] + w * iv->strides[3]) * ies, acc[h * W + w]);
  }
  (void)L;
  free(acc);
}

static tpurt_status k_i2c(void *pa, char *err, size_t errlen) {
  (void)err, (void)errlen;
  i2c_args *a = pa;
  int64_t per = a->img.sizes[2] * a->img.sizes[3] * a->k[0] * a->k[1] + 1;
  tpurt_parallel_for(a->img.sizes[0] * a->img.sizes[1], 1 + 16384 / per, i2c_chunk, a);
  return TPURT_OK;
}

tpurt_status tpurt_im2col(tpurt_stream *s, const tpurt_view *col, const tpurt_view *img, const int64_t kernel[2],
                          const tpurt_conv_params *p, int to_image) {
  TPURT__INIT_OR_RETURN();
  const char *op = to_image ? "col2im" : "im2col";
  tpurt_status stt;
  if ((stt = tpurt__check_kernel_view(col, 3, op, "columns")) || (stt = tpurt__check_kernel_view(img, 4, op, "image")))
    return stt;
  if (!p || !kernel) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  if (!is_float(img->dtype) || img->dtype != col->dtype)
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: not implemented for dtypes %s / %s", op,
                      tpurt_dtype_name(img->dtype), tpurt_dtype_name(col->dtype));
  i2c_args a;
  memset(&a, 0, sizeof a);
  int64_t o[2];
  for (int k = 0; k < 2; k++) {
    if (kernel[k] < 1 || p->stride[k] < 1 || p->dilation[k] < 1 || p->padding[k] < 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: kernel, stride and dilation must be positive, padding "
                        "non-negative", op);
    int64_t num = img->sizes[2 + k] + 2 * p->padding[k] - p->dilation[k] * (kernel[k] - 1) - 1;
    o[k] = num < 0 ? 0 : num / p->stride[k] + 1;
  }
  if (col->sizes[0] != img->sizes[0] || col->sizes[1] != img->sizes[1] * kernel[0] * kernel[1] ||
      col->sizes[2] != o[0] * o[1])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: columns shape [%" PRId64 ", %" PRId64 ", %" PRId64
                      "] does not match the image and kernel (expected [%" PRId64 ", %" PRId64 ", %" PRId64 "])",
                      op, col->sizes[0], col->sizes[1], col->sizes[2], img->sizes[0],
                      img->sizes[1] * kernel[0] * kernel[1], o[0] * o[1]);
  a.col = *col, a.img = *img;
  a.k[0] = kernel[0], a.k[1] = kernel[1];
  a.p = *p;
  a.to_image = to_image;
  a.oh = o[0], a.ow = o[1];
  if ((stt = tpurt__resolve_stream(&s, tpurt_devptr_device(img->ptr)))) return stt;
  if (tpurt__view_numel(to_image ? img : col) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_i2c, &a, sizeof a);
}
