/*
 * pool.c — 2-D pooling (max with indices, average, adaptive average and
 * max) and upsampling (nearest, bilinear) with their backward forms, over
 * NCHW views with any strides.
 *
 * Work is split over the N*C planes (planes are independent, so backward
 * scatters need no atomics). Values are computed in f32 (f64 for f64 data);
 * the dtype switch of the loads sits in small inline helpers whose branch
 * is loop-invariant.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gemm_internal.h"
#include "kcommon.h"

typedef double acc_t;

/* loads/stores of the float dtypes (kcommon.h) */
#define ld kc_ld
#define st kc_st

/* A plane (n, c) of a 4-D view. */
typedef struct {
  char *base;
  tpurt_dtype dt;
  int64_t es, C, H, W, sn, sc, sh, sw;
} pl_view;

static pl_view plv(const tpurt_view *v) {
  pl_view p;
  p.base = v->ptr ? tpurt__host_view(v->ptr) : NULL;
  p.dt = v->dtype;
  p.es = (int64_t)tpurt_dtype_size(v->dtype);
  p.C = v->sizes[1], p.H = v->sizes[2], p.W = v->sizes[3];
  p.sn = v->strides[0] * p.es, p.sc = v->strides[1] * p.es, p.sh = v->strides[2] * p.es, p.sw = v->strides[3] * p.es;
  return p;
}
static inline char *plane(const pl_view *v, int64_t nc) {
  return v->base + (nc / v->C) * v->sn + (nc % v->C) * v->sc;
}
#define AT(v, pl, h, w) ((pl) + (h) * (v).sh + (w) * (v).sw)

static int is_float(tpurt_dtype d) { return d == TPURT_F32 || d == TPURT_F64 || d == TPURT_F16 || d == TPURT_BF16; }

/* -------------------------------------------------------- launch utils */

typedef struct {
  int kind;
  tpurt_view out, out2, in, in2;
  int has_out2;
  tpurt_pool_params p;
  int mode, align;
  double sh, sw;
} pool_args;

enum { K_MAX, K_MAX_BWD, K_AVG, K_AVG_BWD, K_ADAPT_AVG, K_ADAPT_MAX, K_ADAPT_AVG_BWD, K_UP, K_UP_BWD };

static tpurt_status k_pool(void *a, char *err, size_t errlen);

static tpurt_status launch(tpurt_stream *s, pool_args *a, const char *op) {
  tpurt_status stt;
  if ((stt = tpurt__resolve_stream(&s, tpurt_devptr_device(a->out.ptr)))) return stt;
  if (tpurt__view_numel(&a->out) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_pool, a, sizeof *a);
}

static tpurt_status check4(const char *op, const tpurt_view *v, const char *what) {
  tpurt_status s = tpurt__check_kernel_view(v, 4, op, what);
  if (s) return s;
  if (!is_float(v->dtype))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: not implemented for dtype %s", op, tpurt_dtype_name(v->dtype));
  return TPURT_OK;
}

static tpurt_status check_planes(const char *op, const tpurt_view *a, const tpurt_view *b) {
  if (a->sizes[0] != b->sizes[0] || a->sizes[1] != b->sizes[1])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: batch and channel sizes differ ([%" PRId64 ", %" PRId64
                      "] vs [%" PRId64 ", %" PRId64 "])", op, a->sizes[0], a->sizes[1], b->sizes[0], b->sizes[1]);
  if (a->dtype != b->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: dtypes differ (%s vs %s)", op, tpurt_dtype_name(a->dtype),
                      tpurt_dtype_name(b->dtype));
  return TPURT_OK;
}

static tpurt_status check_idx(const char *op, const tpurt_view *idx, const tpurt_view *out) {
  tpurt_status s = tpurt__check_kernel_view(idx, 4, op, "indices");
  if (s) return s;
  if (idx->dtype != TPURT_I64) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: indices must be int64", op);
  for (int k = 0; k < 4; k++)
    if (idx->sizes[k] != out->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: indices and output shapes differ", op);
  return TPURT_OK;
}

static tpurt_status check_params(const char *op, const tpurt_pool_params *p) {
  if (!p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: params is NULL", op);
  for (int k = 0; k < 2; k++)
    if (p->kernel[k] < 1 || p->stride[k] < 1 || p->dilation[k] < 1 || p->padding[k] < 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: kernel, stride and dilation must be positive, padding "
                        "non-negative", op);
  return TPURT_OK;
}

/* ------------------------------------------------------------- bodies */

static void max_fwd(const pool_args *a, int64_t nc) {
  pl_view o = plv(&a->out), i = plv(&a->in), x = plv(&a->out2);
  const tpurt_pool_params *p = &a->p;
  char *po = plane(&o, nc), *pi = plane(&i, nc), *px = a->has_out2 ? plane(&x, nc) : NULL;
  for (int64_t oh = 0; oh < o.H; oh++)
    for (int64_t ow = 0; ow < o.W; ow++) {
      int64_t h0 = oh * p->stride[0] - p->padding[0], w0 = ow * p->stride[1] - p->padding[1];
      int64_t h1 = h0 + (p->kernel[0] - 1) * p->dilation[0] + 1, w1 = w0 + (p->kernel[1] - 1) * p->dilation[1] + 1;
      while (h0 < 0) h0 += p->dilation[0];
      while (w0 < 0) w0 += p->dilation[1];
      if (h1 > i.H) h1 = i.H;
      if (w1 > i.W) w1 = i.W;
      int64_t best = h0 * i.W + w0;
      acc_t m = -INFINITY;
      for (int64_t h = h0; h < h1; h += p->dilation[0])
        for (int64_t w = w0; w < w1; w += p->dilation[1]) {
          acc_t v = ld(i.dt, AT(i, pi, h, w));
          if (v > m || isnan(v)) {
            m = v;
            best = h * i.W + w;
            if (isnan(v)) goto done;
          }
        }
    done:
      st(o.dt, AT(o, po, oh, ow), m);
      if (px) *(int64_t *)AT(x, px, oh, ow) = best;
    }
}

static void max_bwd(const pool_args *a, int64_t nc) {
  /* out = grad_in, in = grad_out, in2 = indices */
  pl_view gi = plv(&a->out), go = plv(&a->in), ix = plv(&a->in2);
  char *pgi = plane(&gi, nc), *pgo = plane(&go, nc), *pix = plane(&ix, nc);
  int64_t HW = gi.H * gi.W;
  acc_t stackbuf[1024];
  acc_t *acc = HW <= 1024 ? stackbuf : calloc((size_t)HW, sizeof(acc_t));
  if (HW <= 1024) memset(acc, 0, sizeof(acc_t) * (size_t)HW);
  for (int64_t oh = 0; oh < go.H; oh++)
    for (int64_t ow = 0; ow < go.W; ow++) {
      int64_t k = *(int64_t *)AT(ix, pix, oh, ow);
      if (k >= 0 && k < HW) acc[k] += ld(go.dt, AT(go, pgo, oh, ow));
    }
  for (int64_t h = 0; h < gi.H; h++)
    for (int64_t w = 0; w < gi.W; w++) st(gi.dt, AT(gi, pgi, h, w), acc[h * gi.W + w]);
  if (acc != stackbuf) free(acc);
}

static inline int64_t avg_divisor(const tpurt_pool_params *p, int64_t h0, int64_t w0, int64_t H, int64_t W,
                                  int64_t *hs, int64_t *he, int64_t *ws, int64_t *we) {
  int64_t h1 = h0 + p->kernel[0], w1 = w0 + p->kernel[1];
  if (h1 > H + p->padding[0]) h1 = H + p->padding[0];
  if (w1 > W + p->padding[1]) w1 = W + p->padding[1];
  int64_t pool = (h1 - h0) * (w1 - w0);
  if (h0 < 0) h0 = 0;
  if (w0 < 0) w0 = 0;
  if (h1 > H) h1 = H;
  if (w1 > W) w1 = W;
  *hs = h0, *he = h1, *ws = w0, *we = w1;
  if (p->divisor_override) return p->divisor_override;
  return p->count_include_pad ? pool : (h1 - h0) * (w1 - w0);
}

static void avg_fwd(const pool_args *a, int64_t nc) {
  pl_view o = plv(&a->out), i = plv(&a->in);
  const tpurt_pool_params *p = &a->p;
  char *po = plane(&o, nc), *pi = plane(&i, nc);
  for (int64_t oh = 0; oh < o.H; oh++)
    for (int64_t ow = 0; ow < o.W; ow++) {
      int64_t hs, he, ws, we;
      int64_t div = avg_divisor(p, oh * p->stride[0] - p->padding[0], ow * p->stride[1] - p->padding[1], i.H, i.W,
                                &hs, &he, &ws, &we);
      acc_t s = 0;
      for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) s += ld(i.dt, AT(i, pi, h, w));
      st(o.dt, AT(o, po, oh, ow), div ? s / (acc_t)div : NAN);
    }
}

static void avg_bwd(const pool_args *a, int64_t nc) {
  pl_view gi = plv(&a->out), go = plv(&a->in);
  const tpurt_pool_params *p = &a->p;
  char *pgi = plane(&gi, nc), *pgo = plane(&go, nc);
  int64_t HW = gi.H * gi.W;
  acc_t *acc = calloc((size_t)HW + 1, sizeof(acc_t));
  for (int64_t oh = 0; oh < go.H; oh++)
    for (int64_t ow = 0; ow < go.W; ow++) {
      int64_t hs, he, ws, we;
      int64_t div = avg_divisor(p, oh * p->stride[0] - p->padding[0], ow * p->stride[1] - p->padding[1], gi.H, gi.W,
                                &hs, &he, &ws, &we);
      acc_t g = ld(go.dt, AT(go, pgo, oh, ow)) / (acc_t)div;
      for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) acc[h * gi.W + w] += g;
    }
  for (int64_t h = 0; h < gi.H; h++)
    for (int64_t w = 0; w < gi.W; w++) st(gi.dt, AT(gi, pgi, h, w), acc[h * gi.W + w]);
  free(acc);
}

static inline int64_t a_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
static inline int64_t a_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

static void adapt_fwd(const pool_args *a, int64_t nc, int max) {
  pl_view o = plv(&a->out), i = plv(&a->in), x = plv(&a->out2);
  char *po = plane(&o, nc), *pi = plane(&i, nc), *px = a->has_out2 ? plane(&x, nc) : NULL;
  for (int64_t oh = 0; oh < o.H; oh++) {
    int64_t hs = a_start(oh, i.H, o.H), he = a_end(oh, i.H, o.H);
    for (int64_t ow = 0; ow < o.W; ow++) {
      int64_t ws = a_start(ow, i.W, o.W), we = a_end(ow, i.W, o.W);
      if (max) {
        acc_t m = -INFINITY;
        int64_t best = hs * i.W + ws;
        for (int64_t h = hs; h < he; h++)
          for (int64_t w = ws; w < we; w++) {
            acc_t v = ld(i.dt, AT(i, pi, h, w));
            if (v > m || isnan(v)) {
              m = v;
              best = h * i.W + w;
              if (isnan(v)) goto done;
            }
          }
      done:
        st(o.dt, AT(o, po, oh, ow), m);
        if (px) *(int64_t *)AT(x, px, oh, ow) = best;
      } else {
        acc_t s = 0;
        for (int64_t h = hs; h < he; h++)
          for (int64_t w = ws; w < we; w++) s += ld(i.dt, AT(i, pi, h, w));
        st(o.dt, AT(o, po, oh, ow), s / (acc_t)((he - hs) * (we - ws)));
      }
    }
  }
}

static void adapt_avg_bwd(const pool_args *a, int64_t nc) {
  pl_view gi = plv(&a->out), go = plv(&a->in);
  char *pgi = plane(&gi, nc), *pgo = plane(&go, nc);
  acc_t *acc = calloc((size_t)(gi.H * gi.W) + 1, sizeof(acc_t));
  for (int64_t oh = 0; oh < go.H; oh++) {
    int64_t hs = a_start(oh, gi.H, go.H), he = a_end(oh, gi.H, go.H);
    for (int64_t ow = 0; ow < go.W; ow++) {
      int64_t ws = a_start(ow, gi.W, go.W), we = a_end(ow, gi.W, go.W);
      acc_t g = ld(go.dt, AT(go, pgo, oh, ow)) / (acc_t)((he - hs) * (we - ws));
      for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) acc[h * gi.W + w] += g;
    }
  }
  for (int64_t h = 0; h < gi.H; h++)
    for (int64_t w = 0; w < gi.W; w++) st(gi.dt, AT(gi, pgi, h, w), acc[h * gi.W + w]);
  free(acc);
}

/* ------------------------------------------------------------ upsample */

/* PyTorch's source-index rules, computed in f32 (its opmath for f32 data). */
static float area_scale(int64_t in, int64_t out, int align, double scale) {
  if (align) return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
  return scale > 0 ? (float)(1.0 / scale) : (float)in / (float)out;
}

typedef struct {
  int64_t i0, i1;
  float l0, l1;
} lin_tab;

static void make_tab(lin_tab *t, int64_t in, int64_t out, int mode, int align, double scale) {
  float sc = mode == TPURT_UPSAMPLE_NEAREST ? (scale > 0 ? (float)(1.0 / scale) : (float)in / (float)out)
                                            : area_scale(in, out, align, scale);
  for (int64_t o = 0; o < out; o++) {
    if (mode == TPURT_UPSAMPLE_NEAREST) {
      int64_t s;
      if (out == in) s = o;
      else if (out == 2 * in) s = o >> 1;
      else {
        s = (int64_t)floorf((float)o * sc);
        if (s > in - 1) s = in - 1;
      }
      t[o].i0 = t[o].i1 = s;
      t[o].l0 = 1.0f, t[o].l1 = 0.0f;
    } else {
      float src = align ? sc * (float)o : sc * ((float)o + 0.5f) - 0.5f;
      if (!align && src < 0) src = 0;
      int64_t i0 = (int64_t)src;
      if (i0 > in - 1) i0 = in - 1;
      int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
      float l1 = src - (float)i0;
      if (l1 > 1.0f) l1 = 1.0f;
      t[o].i0 = i0, t[o].i1 = i1;
      t[o].l1 = l1, t[o].l0 = 1.0f - l1;
    }
  }
}

typedef struct {
  const pool_args *a;
  lin_tab *th, *tw;
} up_ctx;

/* Nearest: each output the value of its source element (a copy, not the
 * bilinear form with zero weights, whose 0 * inf made an infinite input a
 * NaN); an output row equal to the one above it is copied whole. */
static void up_fwd_nearest(const up_ctx *u, pl_view o, pl_view i, char *po, const char *pi) {
  for (int64_t oh = 0; oh < o.H; oh++) {
    int64_t ih = u->th[oh].i0;
    char *orow = AT(o, po, oh, 0);
    if (oh > 0 && u->th[oh - 1].i0 == ih && o.sw == o.es) {
      memcpy(orow, AT(o, po, oh - 1, 0), (size_t)(o.W * o.es));
      continue;
    }
    const char *irow = AT(i, pi, ih, 0);
    if (o.dt != i.dt) {
      for (int64_t ow = 0; ow < o.W; ow++) st(o.dt, orow + ow * o.sw, ld(i.dt, irow + u->tw[ow].i0 * i.sw));
    } else if (o.es == 2) {
      for (int64_t ow = 0; ow < o.W; ow++) memcpy(orow + ow * o.sw, irow + u->tw[ow].i0 * i.sw, 2);
    } else if (o.es == 4) {
      for (int64_t ow = 0; ow < o.W; ow++) memcpy(orow + ow * o.sw, irow + u->tw[ow].i0 * i.sw, 4);
    } else {
      for (int64_t ow = 0; ow < o.W; ow++) memcpy(orow + ow * o.sw, irow + u->tw[ow].i0 * i.sw, (size_t)o.es);
    }
  }
}

static void up_fwd(const up_ctx *u, int64_t nc) {
  pl_view o = plv(&u->a->out), i = plv(&u->a->in);
  char *po = plane(&o, nc), *pi = plane(&i, nc);
  if (u->a->mode == TPURT_UPSAMPLE_NEAREST) {
    up_fwd_nearest(u, o, i, po, pi);
    return;
  }
  for (int64_t oh = 0; oh < o.H; oh++) {
    const lin_tab *h = &u->th[oh];
    for (int64_t ow = 0; ow < o.W; ow++) {
      const lin_tab *w = &u->tw[ow];
      acc_t v = h->l0 * (w->l0 * ld(i.dt, AT(i, pi, h->i0, w->i0)) + w->l1 * ld(i.dt, AT(i, pi, h->i0, w->i1))) +
                h->l1 * (w->l0 * ld(i.dt, AT(i, pi, h->i1, w->i0)) + w->l1 * ld(i.dt, AT(i, pi, h->i1, w->i1)));
      st(o.dt, AT(o, po, oh, ow), v);
    }
  }
}

static void up_bwd(const up_ctx *u, int64_t nc) {
  pl_view gi = plv(&u->a->out), go = plv(&u->a->in);
  char *pgi = plane(&gi, nc), *pgo = plane(&go, nc);
  acc_t *acc = calloc((size_t)(gi.H * gi.W) + 1, sizeof(acc_t));
  if (u->a->mode == TPURT_UPSAMPLE_NEAREST) { /* one source each (no 0 * g terms: an infinite g stays one) */
    for (int64_t oh = 0; oh < go.H; oh++) {
      acc_t *arow = acc + u->th[oh].i0 * gi.W;
      const char *grow = AT(go, pgo, oh, 0);
      if (go.dt == TPURT_F32)
        for (int64_t ow = 0; ow < go.W; ow++) {
          float g;
          memcpy(&g, grow + ow * go.sw, 4);
          arow[u->tw[ow].i0] += g;
        }
      else if (go.dt == TPURT_BF16)
        for (int64_t ow = 0; ow < go.W; ow++) {
          uint16_t g;
          memcpy(&g, grow + ow * go.sw, 2);
          arow[u->tw[ow].i0] += tpurt__bf16_to_f32(g);
        }
      else
        for (int64_t ow = 0; ow < go.W; ow++) arow[u->tw[ow].i0] += ld(go.dt, grow + ow * go.sw);
    }
  } else {
    for (int64_t oh = 0; oh < go.H; oh++) {
      const lin_tab *h = &u->th[oh];
      for (int64_t ow = 0; ow < go.W; ow++) {
        const lin_tab *w = &u->tw[ow];
        acc_t g = ld(go.dt, AT(go, pgo, oh, ow));
        acc[h->i0 * gi.W + w->i0] += h->l0 * w->l0 * g;
        acc[h->i0 * gi.W + w->i1] += h->l0 * w->l1 * g;
        acc[h->i1 * gi.W + w->i0] += h->l1 * w->l0 * g;
        acc[h->i1 * gi.W + w->i1] += h->l1 * w->l1 * g;
      }
    }
  }
  for (int64_t hh = 0; hh < gi.H; hh++)
    for (int64_t ww = 0; ww < gi.W; ww++) st(gi.dt, AT(gi, pgi, hh, ww), acc[hh * gi.W + ww]);
  free(acc);
}

/* -------------------------------------------------------------- kernel */

typedef struct {
  const pool_args *a;
  up_ctx *u;
} chunk_ctx;

static void chunk(void *c, int64_t b, int64_t e) {
  chunk_ctx *x = c;
  const pool_args *a = x->a;
  for (int64_t nc = b; nc < e; nc++) switch (a->kind) {
      case K_MAX: max_fwd(a, nc); break;
      case K_MAX_BWD: max_bwd(a, nc); break;
      case K_AVG: avg_fwd(a, nc); break;
      case K_AVG_BWD: avg_bwd(a, nc); break;
      case K_ADAPT_AVG: adapt_fwd(a, nc, 0); break;
      case K_ADAPT_MAX: adapt_fwd(a, nc, 1); break;
      case K_ADAPT_AVG_BWD: adapt_avg_bwd(a, nc); break;
      case K_UP: up_fwd(x->u, nc); break;
      case K_UP_BWD: up_bwd(x->u, nc); break;
      default: break;
    }
}

static tpurt_status k_pool(void *pa, char *err, size_t errlen) {
  pool_args *a = pa;
  up_ctx u = {a, NULL, NULL};
  int64_t planes = a->out.sizes[0] * a->out.sizes[1];
  if (a->kind == K_UP || a->kind == K_UP_BWD) {
    const tpurt_view *small = a->kind == K_UP ? &a->in : &a->out, *big = a->kind == K_UP ? &a->out : &a->in;
    u.th = malloc(sizeof(lin_tab) * (size_t)(big->sizes[2] + 1));
    u.tw = malloc(sizeof(lin_tab) * (size_t)(big->sizes[3] + 1));
    if (!u.th || !u.tw) {
      free(u.th);
      free(u.tw);
      snprintf(err, errlen, "upsample: out of host memory");
      return TPURT_ERR_OUT_OF_MEMORY;
    }
    make_tab(u.th, small->sizes[2], big->sizes[2], a->mode, a->align, a->sh);
    make_tab(u.tw, small->sizes[3], big->sizes[3], a->mode, a->align, a->sw);
  }
  chunk_ctx c = {a, &u};
  int64_t per = a->out.sizes[2] * a->out.sizes[3] + a->in.sizes[2] * a->in.sizes[3] + 1;
  tpurt_parallel_for(planes, 1 + 16384 / per, chunk, &c);
  free(u.th);
  free(u.tw);
  return TPURT_OK;
}

/* ------------------------------------------------------------ public */

tpurt_status tpurt_max_pool2d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx, const tpurt_view *in,
                              const tpurt_pool_params *p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "max_pool2d";
  tpurt_status stt;
  if ((stt = check4(op, out, "output")) || (stt = check4(op, in, "input")) || (stt = check_planes(op, out, in)) ||
      (stt = check_params(op, p)))
    return stt;
  if (idx && (stt = check_idx(op, idx, out))) return stt;
  if (tpurt__view_numel(in) == 0 && tpurt__view_numel(out) != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: empty input", op);
  pool_args a;
  memset(&a, 0, sizeof a);
  a.kind = K_MAX;
  a.out = *out;
  a.in = *in;
  if (idx) a.has_out2 = 1, a.out2 = *idx;
  a.p = *p;
  return launch(s, &a, op);
}

tpurt_status tpurt_max_pool2d_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                       const tpurt_view *idx) {
  TPURT__INIT_OR_RETURN();
  const char *op = "max_pool2d_backward";
  tpurt_status stt;
  if ((stt = check4(op, grad_in, "grad_input")) || (stt = check4(op, grad_out, "grad_output")) ||
      (stt = check_planes(op, grad_in, grad_out)) || (stt = check_idx(op, idx, grad_out)))
    return stt;
  pool_args a;
  memset(&a, 0, sizeof a);
  a.kind = K_MAX_BWD;
  a.out = *grad_in;
  a.in = *grad_out;
  a.in2 = *idx;
  return launch(s, &a, op);
}

tpurt_status tpurt_avg_pool2d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in,
                              const tpurt_pool_params *p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "avg_pool2d";
  tpurt_status stt;
  if ((stt = check4(op, out, "output")) || (stt = check4(op, in, "input")) || (stt = check_planes(op, out, in)) ||
      (stt = check_params(op, p)))
    return stt;
  pool_args a;
  memset(&a, 0, sizeof a);
  a.kind = K_AVG;
  a.out = *out;
  a.in = *in;
  a.p = *p;
  return launch(s, &a, op);
}

tpurt_status tpurt_avg_pool2d_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                       const tpurt_pool_params *p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "avg_pool2d_backward";
  tpurt_status stt;
  if ((stt = check4(op, grad_in, "grad_input")) || (stt = check4(op, grad_out, "grad_output")) ||
      (stt = check_planes(op, grad_in, grad_out)) || (stt = check_params(op, p)))
    return stt;
  pool_args a;
  memset(&a, 0, sizeof a);
  a.kind = K_AVG_BWD;
  a.out = *grad_in;
  a.in = *grad_out;
  a.p = *p;
  return launch(s, &a, op);
}

tpurt_status tpurt_adaptive_pool2d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *idx,
                                   const tpurt_view *in, int max) {
  TPURT__INIT_OR_RETURN();
  const char *op = max ? "adaptive_max_pool2d" : "adaptive_avg_pool2d";
  tpurt_status stt;
  if ((stt = check4(op, out, "output")) || (stt = check4(op, in, "input")) || (stt = check_planes(op, out, in)))
    return stt;
  if (idx && (stt = check_idx(op, idx, out))) return stt;
  if ((in->sizes[2] == 0 || in->sizes[3] == 0) && tpurt__view_numel(out) != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: empty spatial input", op);
  pool_args a;
  memset(&a, 0, sizeof a);
  a.kind = max ? K_ADAPT_MAX : K_ADAPT_AVG;
  a.out = *out;
  a.in = *in;
  if (idx) a.has_out2 = 1, a.out2 = *idx;
  return launch(s, &a, op);
}

tpurt_status tpurt_adaptive_avg_pool2d_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                const tpurt_view *grad_out) {
  TPURT__INIT_OR_RETURN();
  const char *op = "adaptive_avg_pool2d_backward";
  tpurt_status stt;
  if ((stt = check4(op, grad_in, "grad_input")) || (stt = check4(op, grad_out, "grad_output")) ||
      (stt = check_planes(op, grad_in, grad_out)))
    return stt;
  pool_args a;
  memset(&a, 0, sizeof a);
  a.kind = K_ADAPT_AVG_BWD;
  a.out = *grad_in;
  a.in = *grad_out;
  return launch(s, &a, op);
}

static tpurt_status up_common(tpurt_stream *s, const tpurt_view *o, const tpurt_view *i, const char *op, int kind,
                              tpurt_upsample_mode mode, int align, double sh, double sw) {
  TPURT__INIT_OR_RETURN();
  tpurt_status stt;
  if ((stt = check4(op, o, "output")) || (stt = check4(op, i, "input")) || (stt = check_planes(op, o, i))) return stt;
  if ((unsigned)mode > TPURT_UPSAMPLE_BILINEAR)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: invalid mode %d", op, (int)mode);
  const tpurt_view *small = kind == K_UP ? i : o, *big = kind == K_UP ? o : i;
  if ((small->sizes[2] == 0 || small->sizes[3] == 0) && tpurt__view_numel(big) != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: input and output sizes should be greater than 0", op);
  pool_args a;
  memset(&a, 0, sizeof a);
  a.kind = kind;
  a.out = *o;
  a.in = *i;
  a.mode = mode;
  a.align = align;
  a.sh = sh;
  a.sw = sw;
  return launch(s, &a, op);
}

tpurt_status tpurt_upsample2d(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, tpurt_upsample_mode mode,
                              int align_corners, double scale_h, double scale_w) {
  return up_common(s, out, in, mode == TPURT_UPSAMPLE_NEAREST ? "upsample_nearest2d" : "upsample_bilinear2d", K_UP,
                   mode, align_corners, scale_h, scale_w);
}

tpurt_status tpurt_upsample2d_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                       tpurt_upsample_mode mode, int align_corners, double scale_h, double scale_w) {
  return up_common(s, grad_in, grad_out,
                   mode == TPURT_UPSAMPLE_NEAREST ? "upsample_nearest2d_backward" : "upsample_bilinear2d_backward",
                   K_UP_BWD, mode, align_corners, scale_h, scale_w);
}
