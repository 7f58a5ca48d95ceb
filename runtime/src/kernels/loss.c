/*
 * loss.c — nll_loss (+2d through the [N, C, D] layout) forward/backward and
 * pointwise losses (mse, l1, smooth_l1, huber, binary cross entropy) with
 * their backward. Reductions accumulate in double over fixed blocks of
 * LBLK elements summed in block order, so results do not depend on the
 * number of threads.
 */
#include "kcommon.h"

#define LBLK 4096

static inline double ld_at(const tpurt_view *v, const char *base, int64_t l, int dense) {
  int64_t es = (int64_t)tpurt_dtype_size(v->dtype);
  return kc_ld(v->dtype, base + (dense ? l : kc_lin_off(v, l)) * es);
}
static inline void st_at(const tpurt_view *v, char *base, int64_t l, int dense, double x) {
  int64_t es = (int64_t)tpurt_dtype_size(v->dtype);
  kc_st(v->dtype, base + (dense ? l : kc_lin_off(v, l)) * es, x);
}

/* ------------------------------------------------------------ nll_loss */

typedef struct {
  tpurt_view out, tw, input, target, weight, gout; /* gout/out reused by backward */
  int has_tw, has_w, reduction, backward;
  int64_t ignore;
} nll_args;

typedef struct {
  nll_args *a;
  char *o, *in, *tg, *w, *tw, *go;
  double *psum, *pw;
  kc_err err;
} nll_ctx;

/* element (n, d) of the [N, D] target */
static void nll_fwd_chunk(void *c, int64_t b, int64_t e) {
  nll_ctx *x = c;
  nll_args *a = x->a;
  int64_t N = a->input.sizes[0], C = a->input.sizes[1], D = a->input.sizes[2];
  int64_t tot = N * D;
  int64_t ies = (int64_t)tpurt_dtype_size(a->input.dtype), tes = (int64_t)tpurt_dtype_size(a->target.dtype);
  int64_t wes = a->has_w ? (int64_t)tpurt_dtype_size(a->weight.dtype) : 0;
  for (int64_t blk = b; blk < e; blk++) {
    int64_t l0 = blk * LBLK, l1 = l0 + LBLK < tot ? l0 + LBLK : tot;
    double s = 0, sw = 0;
    for (int64_t l = l0; l < l1; l++) {
      int64_t n = l / D, d = l % D;
      int64_t t = kc_ld_idx(a->target.dtype, x->tg + (n * a->target.strides[0] + d * a->target.strides[1]) * tes);
      double v = 0;
      if (t != a->ignore) {
        if (t < 0 || t >= C) {
          kc_err_index(&x->err, "Target %" PRId64 " is out of bounds.", t);
          return;
        }
        double w = a->has_w ? kc_ld(a->weight.dtype, x->w + t * a->weight.strides[0] * wes) : 1.0;
        double xi = kc_ld(a->input.dtype,
                          x->in + (n * a->input.strides[0] + t * a->input.strides[1] + d * a->input.strides[2]) * ies);
        v = -w * xi;
        sw += w;
      }
      if (a->reduction == 0)
        kc_st(a->out.dtype, x->o + (n * a->out.strides[0] + d * a->out.strides[1]) *
                                       (int64_t)tpurt_dtype_size(a->out.dtype), v);
      else
        s += v;
    }
    x->psum[blk] = s;
    x->pw[blk] = sw;
  }
}

static void nll_bwd_chunk(void *c, int64_t b, int64_t e) {
  nll_ctx *x = c;
  nll_args *a = x->a;
  /* a->out is grad_input [N, C, D]; a->gout grad_out [N, D] or 0-D */
  int64_t C = a->out.sizes[1], D = a->out.sizes[2];
  int64_t ges = (int64_t)tpurt_dtype_size(a->out.dtype), tes = (int64_t)tpurt_dtype_size(a->target.dtype);
  int64_t wes = a->has_w ? (int64_t)tpurt_dtype_size(a->weight.dtype) : 0;
  double scale = 1.0;
  if (a->reduction != 0) {
    scale = kc_ld(a->gout.dtype, x->go);
    if (a->reduction == 1) scale /= kc_ld(a->tw.dtype, x->tw);
  }
  for (int64_t l = b; l < e; l++) {
    int64_t n = l / D, d = l % D;
    for (int64_t cc = 0; cc < C; cc++)
      kc_st(a->out.dtype, x->o + (n * a->out.strides[0] + cc * a->out.strides[1] + d * a->out.strides[2]) * ges, 0);
    int64_t t = kc_ld_idx(a->target.dtype, x->tg + (n * a->target.strides[0] + d * a->target.strides[1]) * tes);
    if (t == a->ignore) continue;
    if (t < 0 || t >= C) {
      kc_err_index(&x->err, "Target %" PRId64 " is out of bounds.", t);
      return;
    }
    double w = a->has_w ? kc_ld(a->weight.dtype, x->w + t * a->weight.strides[0] * wes) : 1.0;
    double g = a->reduction == 0
                   ? kc_ld(a->gout.dtype, x->go + (n * a->gout.strides[0] + d * a->gout.strides[1]) *
                                                      (int64_t)tpurt_dtype_size(a->gout.dtype))
                   : scale;
    kc_st(a->out.dtype, x->o + (n * a->out.strides[0] + t * a->out.strides[1] + d * a->out.strides[2]) * ges, -w * g);
  }
}

static tpurt_status k_nll(void *p, char *err, size_t errlen) {
  nll_args *a = p;
  nll_ctx x;
  x.a = a;
  x.o = tpurt__host_view(a->out.ptr);
  x.in = a->backward ? NULL : tpurt__host_view(a->input.ptr);
  x.tg = tpurt__host_view(a->target.ptr);
  x.w = a->has_w ? tpurt__host_view(a->weight.ptr) : NULL;
  x.tw = a->has_tw ? tpurt__host_view(a->tw.ptr) : NULL;
  x.go = a->backward ? tpurt__host_view(a->gout.ptr) : NULL;
  atomic_init(&x.err.set, 0);
  if (a->backward) {
    int64_t tot = a->out.sizes[0] * a->out.sizes[2];
    x.psum = x.pw = NULL;
    tpurt_parallel_for(tot, 1024, nll_bwd_chunk, &x);
    return kc_err_finish(&x.err, TPURT_ERR_INDEX, err, errlen);
  }
  int64_t tot = a->input.sizes[0] * a->input.sizes[2];
  int64_t nblk = (tot + LBLK - 1) / LBLK;
  x.psum = calloc((size_t)(nblk + 1), sizeof(double));
  x.pw = calloc((size_t)(nblk + 1), sizeof(double));
  if (!x.psum || !x.pw) {
    free(x.psum);
    free(x.pw);
    snprintf(err, errlen, "out of host memory");
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  tpurt_parallel_for(nblk, 1, nll_fwd_chunk, &x);
  tpurt_status st = kc_err_finish(&x.err, TPURT_ERR_INDEX, err, errlen);
  if (!st) {
    double s = 0, sw = 0;
    for (int64_t i = 0; i < nblk; i++) {
      s += x.psum[i];
      sw += x.pw[i];
    }
    if (a->reduction != 0) kc_st(a->out.dtype, x.o, a->reduction == 1 ? s / sw : s);
    if (a->has_tw) kc_st(a->tw.dtype, x.tw, sw);
  }
  free(x.psum);
  free(x.pw);
  return st;
}

static tpurt_status nll_common(tpurt_stream **s, const char *op, const tpurt_view *main, const tpurt_view *target,
                               const tpurt_view *weight, const tpurt_view *tw, int reduction) {
  tpurt_status st;
  if (!main || !target) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = tpurt__resolve_stream(s, tpurt_devptr_device(main->ptr)))) return st;
  int dev = (*s)->dev;
  if ((st = kc_check(dev, main, op, "input")) || (st = kc_check_in(dev, target, op, "target")) ||
      (weight && (st = kc_check_in(dev, weight, op, "weight"))) || (tw && (st = kc_check(dev, tw, op, "total_weight"))))
    return st;
  if (main->ndim != 3 || target->ndim != 2 || main->sizes[0] != target->sizes[0] ||
      main->sizes[2] != target->sizes[1] || !kc_is_index_dtype(target->dtype) || !kc_is_float(main->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected input [N, C, D] and target [N, D]", op);
  if (weight && (weight->ndim != 1 || weight->sizes[0] != main->sizes[1]))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: weight must have C entries", op);
  if (tw && tw->ndim != 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: total_weight must be 0-D", op);
  if (reduction < 0 || reduction > 2) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad reduction", op);
  return TPURT_OK;
}

tpurt_status tpurt_nll_loss(tpurt_stream *s, const tpurt_view *out, const tpurt_view *total_weight,
                            const tpurt_view *input, const tpurt_view *target, const tpurt_view *weight, int reduction,
                            int64_t ignore_index) {
  TPURT__INIT_OR_RETURN();
  const char *op = "nll_loss";
  tpurt_status st = nll_common(&s, op, input, target, weight, total_weight, reduction);
  if (st) return st;
  if (!out || (st = kc_check(s->dev, out, op, "out"))) return out ? st : tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL out", op);
  if (reduction == 0 ? (out->ndim != 2 || out->sizes[0] != target->sizes[0] || out->sizes[1] != target->sizes[1])
                     : out->ndim != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad out shape", op);
  if (reduction == 0 && kc_numel(out) == 0) return TPURT_OK;
  nll_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.input = *input;
  a.target = *target;
  if (weight) a.weight = *weight;
  if (total_weight) a.tw = *total_weight;
  a.has_w = weight != NULL;
  a.has_tw = total_weight != NULL;
  a.reduction = reduction;
  a.ignore = ignore_index;
  return tpurt_launch(s, op, k_nll, &a, sizeof a);
}

tpurt_status tpurt_nll_loss_backward(tpurt_stream *s, const tpurt_view *grad_input, const tpurt_view *grad_out,
                                     const tpurt_view *target, const tpurt_view *weight,
                                     const tpurt_view *total_weight, int reduction, int64_t ignore_index) {
  TPURT__INIT_OR_RETURN();
  const char *op = "nll_loss_backward";
  tpurt_status st = nll_common(&s, op, grad_input, target, weight, total_weight, reduction);
  if (st) return st;
  if (!grad_out || (st = kc_check(s->dev, grad_out, op, "grad_output")))
    return grad_out ? st : tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL grad_output", op);
  if (reduction == 0 ? (grad_out->ndim != 2 || grad_out->sizes[0] != target->sizes[0] ||
                        grad_out->sizes[1] != target->sizes[1])
                     : grad_out->ndim != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad grad_output shape", op);
  if (reduction == 1 && !total_weight)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: mean needs total_weight", op);
  if (kc_numel(grad_input) == 0) return TPURT_OK;
  nll_args a;
  memset(&a, 0, sizeof a);
  a.out = *grad_input;
  a.gout = *grad_out;
  a.target = *target;
  if (weight) a.weight = *weight;
  if (total_weight) a.tw = *total_weight;
  a.has_w = weight != NULL;
  a.has_tw = total_weight != NULL;
  a.reduction = reduction;
  a.ignore = ignore_index;
  a.backward = 1;
  return tpurt_launch(s, op, k_nll, &a, sizeof a);
}

/* ------------------------------------------------------ pointwise losses */

typedef struct {
  tpurt_view out, input, target, weight, gout;
  int kind, reduction, has_w, backward;
  double p;
} pl_args;

typedef struct {
  pl_args *a;
  char *o, *x, *y, *w, *g;
  int dense_o, dense_x, dense_y, dense_w, dense_g;
  double *part;
  int64_t n;
  kc_err err;
} pl_ctx;

/* LBLK elements of a view from linear index l0 into dst (double): typed
 * loops for dense float32 / float64 / bfloat16, element by element
 * otherwise */
static void pl_load(const tpurt_view *v, const char *base, int64_t l0, int n, int dense, double *restrict dst) {
  if (dense && v->dtype == TPURT_F32) {
    const float *p = (const float *)base + l0;
    for (int i = 0; i < n; i++) dst[i] = p[i];
  } else if (dense && v->dtype == TPURT_F64) {
    memcpy(dst, (const double *)base + l0, (size_t)n * sizeof(double));
  } else if (dense && v->dtype == TPURT_BF16) {
    const uint16_t *p = (const uint16_t *)base + l0;
    for (int i = 0; i < n; i++) dst[i] = tpurt__bf16_to_f32(p[i]);
  } else {
    for (int i = 0; i < n; i++) dst[i] = ld_at(v, base, l0 + i, dense);
  }
}
static void pl_store(const tpurt_view *v, char *base, int64_t l0, int n, int dense, const double *restrict src) {
  if (dense && v->dtype == TPURT_F32) {
    float *p = (float *)base + l0;
    for (int i = 0; i < n; i++) p[i] = (float)src[i];
  } else if (dense && v->dtype == TPURT_F64) {
    memcpy((double *)base + l0, src, (size_t)n * sizeof(double));
  } else {
    for (int i = 0; i < n; i++) st_at(v, base, l0 + i, dense, src[i]);
  }
}

/* the loss of each element (x input, y target, w weight or NULL) into v:
 * one loop per kind, so that the compiler vectorizes it (a switch per
 * element kept mse_loss at 0.14x PyTorch CPU's speed) */
static void pl_values(int kind, const double *restrict x, const double *restrict y, const double *restrict w,
                      double p, double *restrict v, int n) {
  switch (kind) {
    case TPURT_LOSS_MSE:
      for (int i = 0; i < n; i++) v[i] = (x[i] - y[i]) * (x[i] - y[i]);
      break;
    case TPURT_LOSS_L1:
      for (int i = 0; i < n; i++) v[i] = fabs(x[i] - y[i]);
      break;
    case TPURT_LOSS_SMOOTH_L1:
      if (p == 0) {
        for (int i = 0; i < n; i++) v[i] = fabs(x[i] - y[i]);
        break;
      }
      for (int i = 0; i < n; i++) {
        double d = x[i] - y[i], ad = fabs(d);
        v[i] = ad < p ? 0.5 * d * d / p : ad - 0.5 * p;
      }
      break;
    case TPURT_LOSS_HUBER:
      for (int i = 0; i < n; i++) {
        double d = x[i] - y[i], ad = fabs(d);
        v[i] = ad <= p ? 0.5 * d * d : p * (ad - 0.5 * p);
      }
      break;
    default: /* BCE */
      for (int i = 0; i < n; i++) {
        double lx = log(x[i]), l1x = log1p(-x[i]);
        if (lx < -100) lx = -100;
        if (l1x < -100) l1x = -100;
        v[i] = -(w ? w[i] : 1.0) * (y[i] * lx + (1 - y[i]) * l1x);
      }
  }
}

/* the gradient of each element's loss times g[i] * scale into v */
static void pl_grads(int kind, const double *restrict x, const double *restrict y, const double *restrict w,
                     const double *restrict g, double p, double scale, double *restrict v, int n) {
  for (int i = 0; i < n; i++) {
    double d = x[i] - y[i], ad = fabs(d);
    double sg = d > 0 ? 1 : (d < 0 ? -1 : 0), r;
    switch (kind) {
      case TPURT_LOSS_MSE: r = 2 * d; break;
      case TPURT_LOSS_L1: r = sg; break;
      case TPURT_LOSS_SMOOTH_L1: r = p == 0 ? sg : (ad < p ? d / p : sg); break;
      case TPURT_LOSS_HUBER: r = ad <= p ? d : p * sg; break;
      default: {
        double den = (1 - x[i]) * x[i];
        den = den < 1e-12 ? 1e-12 : den;
        r = (w ? w[i] : 1.0) * d / den;
      }
    }
    v[i] = r * g[i] * scale;
  }
}

#define PL_SUB 1024 /* elements converted to double at a time (40 KiB of stack) */

static void pl_chunk(void *c, int64_t b, int64_t e) {
  pl_ctx *x = c;
  pl_args *a = x->a;
  int bce = a->kind == TPURT_LOSS_BCE;
  double inv_n = a->reduction == 1 ? 1.0 / (double)x->n : 1.0;
  double xs[PL_SUB], ys[PL_SUB], ws[PL_SUB], gs[PL_SUB], v[PL_SUB];
  for (int64_t blk = b; blk < e; blk++) {
    int64_t end = blk * LBLK + LBLK < x->n ? blk * LBLK + LBLK : x->n;
    /* 32 lanes (four vector accumulators, not one latency chain), summed
     * in order: the same sum on every run and thread count */
    double acc[32] = {0};
    for (int64_t l0 = blk * LBLK; l0 < end; l0 += PL_SUB) {
      int n = (int)(end - l0 < PL_SUB ? end - l0 : PL_SUB);
      pl_load(&a->input, x->x, l0, n, x->dense_x, xs);
      pl_load(&a->target, x->y, l0, n, x->dense_y, ys);
      if (a->has_w) pl_load(&a->weight, x->w, l0, n, x->dense_w, ws);
      if (bce) {
        int bad = 0;
        for (int i = 0; i < n; i++) bad |= !(xs[i] >= 0 && xs[i] <= 1);
        if (bad) {
          kc_err_index(&x->err, "all elements of input should be between 0 and 1");
          return;
        }
      }
      if (a->backward) {
        pl_load(&a->gout, x->g, l0, n, x->dense_g, gs);
        pl_grads(a->kind, xs, ys, a->has_w ? ws : NULL, gs, a->p, inv_n, v, n);
        pl_store(&a->out, x->o, l0, n, x->dense_o, v);
        continue;
      }
      pl_values(a->kind, xs, ys, a->has_w ? ws : NULL, a->p, v, n);
      if (a->reduction == 0) {
        pl_store(&a->out, x->o, l0, n, x->dense_o, v);
        continue;
      }
      int i = 0;
      for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 32; j++) acc[j] += v[i + j];
      for (; i < n; i++) acc[i & 31] += v[i];
    }
    for (int w = 16; w >= 1; w /= 2)
      for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    if (x->part) x->part[blk] = acc[0];
  }
}

static tpurt_status k_pl(void *p, char *err, size_t errlen) {
  pl_args *a = p;
  pl_ctx x;
  memset(&x, 0, sizeof x);
  x.a = a;
  x.o = tpurt__host_view(a->out.ptr);
  x.x = tpurt__host_view(a->input.ptr);
  x.y = tpurt__host_view(a->target.ptr);
  x.w = a->has_w ? tpurt__host_view(a->weight.ptr) : NULL;
  x.g = a->backward ? tpurt__host_view(a->gout.ptr) : NULL;
  x.dense_o = kc_dense(&a->out);
  x.dense_x = kc_dense(&a->input);
  x.dense_y = kc_dense(&a->target);
  x.dense_w = a->has_w && kc_dense(&a->weight);
  x.dense_g = a->backward && kc_dense(&a->gout);
  x.n = kc_numel(&a->input);
  atomic_init(&x.err.set, 0);
  int64_t nblk = (x.n + LBLK - 1) / LBLK;
  if (!a->backward && a->reduction != 0) {
    x.part = calloc((size_t)(nblk + 1), sizeof(double));
    if (!x.part) {
      snprintf(err, errlen, "out of host memory");
      return TPURT_ERR_OUT_OF_MEMORY;
    }
  }
  tpurt_parallel_for(nblk, 1, pl_chunk, &x);
  tpurt_status st = kc_err_finish(&x.err, TPURT_ERR_INVALID_ARGUMENT, err, errlen);
  if (!st && x.part) {
    double s = 0;
    for (int64_t i = 0; i < nblk; i++) s += x.part[i];
    if (a->reduction == 1) s /= (double)x.n; /* 0/0 = NaN for empty input, like PyTorch */
    kc_st(a->out.dtype, x.o, s);
  }
  free(x.part);
  return st;
}

static int same_shape(const tpurt_view *a, const tpurt_view *b) {
  if (a->ndim != b->ndim) return 0;
  for (int k = 0; k < a->ndim; k++)
    if (a->sizes[k] != b->sizes[k]) return 0;
  return 1;
}

static const char *pl_name(tpurt_loss_kind k, int bwd) {
  static const char *f[] = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy"};
  static const char *b[] = {"mse_loss_backward", "l1_loss_backward", "smooth_l1_loss_backward", "huber_loss_backward",
                            "binary_cross_entropy_backward"};
  return bwd ? b[k] : f[k];
}

static tpurt_status pl_launch(tpurt_stream *s, tpurt_loss_kind kind, const tpurt_view *out, const tpurt_view *input,
                              const tpurt_view *target, const tpurt_view *weight, const tpurt_view *gout,
                              int reduction, double p, int backward) {
  TPURT__INIT_OR_RETURN();
  if ((unsigned)kind > TPURT_LOSS_BCE) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "loss: bad kind");
  const char *op = pl_name(kind, backward);
  tpurt_status st;
  if (!out || !input || !target || (backward && !gout))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, input, op, "input")) ||
      (st = kc_check(s->dev, target, op, "target")) || (weight && (st = kc_check(s->dev, weight, op, "weight"))) ||
      (gout && (st = kc_check(s->dev, gout, op, "grad_output"))))
    return st;
  if (!kc_is_float(input->dtype) || !kc_is_float(out->dtype))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: only floating dtypes are supported", op);
  if (!same_shape(input, target) || (weight && !same_shape(input, weight)) || (gout && !same_shape(input, gout)))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: views must be broadcast to input's shape", op);
  if (reduction < 0 || reduction > 2) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad reduction", op);
  int full = backward || reduction == 0;
  if (full ? !same_shape(out, input) : out->ndim != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad out shape", op);
  if (full && kc_numel(out) == 0) return TPURT_OK;
  pl_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.input = *input;
  a.target = *target;
  if (weight) a.weight = *weight;
  if (gout) a.gout = *gout;
  a.has_w = weight != NULL;
  a.kind = kind;
  a.reduction = reduction;
  a.backward = backward;
  a.p = p;
  return tpurt_launch(s, op, k_pl, &a, sizeof a);
}

tpurt_status tpurt_pointwise_loss(tpurt_stream *s, tpurt_loss_kind kind, const tpurt_view *out,
                                  const tpurt_view *input, const tpurt_view *target, const tpurt_view *weight,
                                  int reduction, double p) {
  return pl_launch(s, kind, out, input, target, weight, NULL, reduction, p, 0);
}

tpurt_status tpurt_pointwise_loss_backward(tpurt_stream *s, tpurt_loss_kind kind, const tpurt_view *grad_input,
                                           const tpurt_view *grad_out, const tpurt_view *input,
                                           const tpurt_view *target, const tpurt_view *weight, int reduction,
                                           double p) {
  return pl_launch(s, kind, grad_input, input, target, weight, grad_out, reduction, p, 1);
}
