/*
 * loss_more.c — multi-class / multi-label margin losses, p-norm distances
 * (cdist, pdist) and the CTC loss, forward and backward.
 *
 * Per-sample work runs over the pool; reductions over samples happen once
 * at the end in sample order (deterministic whatever the thread count).
 * Everything is computed in double and stored in the view's dtype.
 */
#include "kcommon.h"
#include "gemm_internal.h"

static inline char *hp(const tpurt_view *v) { return v->ptr ? tpurt__host_view(v->ptr) : NULL; }
static inline int64_t esz(const tpurt_view *v) { return (int64_t)tpurt_dtype_size(v->dtype); }
/* element (i) of a 1-D view, (i, j) of a 2-D view, (i, j, k) of a 3-D view */
#define E1(v, b, i) ((b) + (i) * (v)->strides[0] * esz(v))
#define E2(v, b, i, j) ((b) + ((i) * (v)->strides[0] + (j) * (v)->strides[1]) * esz(v))
#define E3(v, b, i, j, k) ((b) + ((i) * (v)->strides[0] + (j) * (v)->strides[1] + (k) * (v)->strides[2]) * esz(v))

static tpurt_status need_float(const char *op, const tpurt_view *v) {
  if (!kc_is_float(v->dtype))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: not implemented for dtype %s", op, tpurt_dtype_name(v->dtype));
  return TPURT_OK;
}

/* ------------------------------------------------------------ margins */

enum { MM_FWD, MM_BWD, ML_FWD, ML_BWD };

typedef struct {
  int kind, has_w, p, reduction;
  double margin;
  tpurt_view out, in, target, weight, aux, gout; /* aux: is_target */
} mm_args;

typedef struct {
  const mm_args *a;
  double *per;
  kc_err err;
} mm_ctx;

static void mm_chunk(void *c, int64_t b, int64_t e) {
  mm_ctx *x = c;
  const mm_args *a = x->a;
  int64_t C = a->in.sizes[1];
  char *in = hp(&a->in), *tg = hp(&a->target), *w = a->has_w ? hp(&a->weight) : NULL, *out = hp(&a->out);
  char *aux = a->kind == ML_FWD || a->kind == ML_BWD ? hp(&a->aux) : NULL;
  char *go = a->kind == MM_BWD || a->kind == ML_BWD ? hp(&a->gout) : NULL;
  int64_t N = a->in.sizes[0];
  for (int64_t i = b; i < e; i++) {
    double g = 0;
    if (go) {
      g = kc_ld(a->gout.dtype, a->gout.ndim ? E1(&a->gout, go, i) : go);
      if (a->reduction == 1) g /= (double)N;
    }
    if (a->kind == MM_FWD || a->kind == MM_BWD) {
      int64_t y = kc_ld_idx(a->target.dtype, E1(&a->target, tg, i));
      if (y < 0 || y >= C) {
        kc_err_index(&x->err, "target %" PRId64 " is out of bounds.", y);
        if (a->kind == MM_FWD) x->per[i] = 0;
        continue;
      }
      double xy = kc_ld(a->in.dtype, E2(&a->in, in, i, y));
      double wy = w ? kc_ld(a->weight.dtype, E1(&a->weight, w, y)) : 1.0;
      double s = 0, gy = 0;
      for (int64_t j = 0; j < C; j++) {
        double z = a->margin - xy + kc_ld(a->in.dtype, E2(&a->in, in, i, j));
        if (a->kind == MM_BWD) {
          double gj = 0;
          if (j != y && z > 0) gj = (a->p == 1 ? 1.0 : 2 * z) * wy / (double)C * g;
          gy -= gj;
          kc_st(a->out.dtype, E2(&a->out, out, i, j), gj);
          continue;
        }
        if (j == y || z <= 0) continue;
        s += (a->p == 1 ? z : z * z) * wy;
      }
      if (a->kind == MM_BWD) kc_st(a->out.dtype, E2(&a->out, out, i, y), gy);
      else x->per[i] = s / (double)C;
    } else {
      /* labels: target row up to the first -1 */
      int64_t L = 0;
      while (L < C && kc_ld_idx(a->target.dtype, E2(&a->target, tg, i, L)) >= 0) L++;
      if (a->kind == ML_FWD)
        for (int64_t j = 0; j < C; j++) kc_st(a->aux.dtype, E2(&a->aux, aux, i, j), 0);
      int bad = 0;
      for (int64_t k = 0; k < L; k++) {
        int64_t y = kc_ld_idx(a->target.dtype, E2(&a->target, tg, i, k));
        if (y >= C) {
          kc_err_index(&x->err, "target %" PRId64 " is out of bounds.", y);
          bad = 1;
          break;
        }
        if (a->kind == ML_FWD) kc_st(a->aux.dtype, E2(&a->aux, aux, i, y), 1);
      }
      if (bad) {
        if (a->kind == ML_FWD) x->per[i] = 0;
        continue;
      }
      if (a->kind == ML_BWD)
        for (int64_t j = 0; j < C; j++) kc_st(a->out.dtype, E2(&a->out, out, i, j), 0);
      double s = 0;
      for (int64_t k = 0; k < L; k++) {
        int64_t y = kc_ld_idx(a->target.dtype, E2(&a->target, tg, i, k));
        double xy = kc_ld(a->in.dtype, E2(&a->in, in, i, y));
        for (int64_t j = 0; j < C; j++) {
          if (kc_ld(a->aux.dtype, E2(&a->aux, aux, i, j)) != 0) continue;
          double z = 1 - xy + kc_ld(a->in.dtype, E2(&a->in, in, i, j));
          if (z <= 0) continue;
          if (a->kind == ML_FWD) {
            s += z;
          } else {
            double gj = g / (double)C;
            char *pj = E2(&a->out, out, i, j), *py = E2(&a->out, out, i, y);
            kc_st(a->out.dtype, pj, kc_ld(a->out.dtype, pj) + gj);
            kc_st(a->out.dtype, py, kc_ld(a->out.dtype, py) - gj);
          }
        }
      }
      if (a->kind == ML_FWD) x->per[i] = s / (double)C;
    }
  }
}

static tpurt_status k_margin(void *pa, char *err, size_t errlen) {
  mm_args *a = pa;
  mm_ctx c;
  memset(&c, 0, sizeof c);
  c.a = a;
  int64_t N = a->in.sizes[0];
  int fwd = a->kind == MM_FWD || a->kind == ML_FWD;
  if (fwd) {
    c.per = malloc(sizeof(double) * (size_t)(N + 1));
    if (!c.per) {
      snprintf(err, errlen, "out of host memory");
      return TPURT_ERR_OUT_OF_MEMORY;
    }
  }
  tpurt_parallel_for(N, 1 + 4096 / (a->in.sizes[1] + 1), mm_chunk, &c);
  tpurt_status st = kc_err_finish(&c.err, TPURT_ERR_INDEX, err, errlen);
  if (fwd && !st) {
    char *o = hp(&a->out);
    if (a->reduction == 0) {
      for (int64_t i = 0; i < N; i++) kc_st(a->out.dtype, a->out.ndim ? E1(&a->out, o, i) : o, c.per[i]);
    } else {
      double s = 0;
      for (int64_t i = 0; i < N; i++) s += c.per[i];
      if (a->reduction == 1) s = N ? s / (double)N : NAN;
      kc_st(a->out.dtype, o, s);
    }
  }
  free(c.per);
  return st;
}

static tpurt_status mm_launch(tpurt_stream *s, mm_args *a, const char *op) {
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(&a->in, 2, op, "input")) || (st = need_float(op, &a->in))) return st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(a->in.ptr)))) return st;
  if (a->in.sizes[0] == 0 && a->reduction == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_margin, a, sizeof *a);
}

tpurt_status tpurt_multi_margin_loss(tpurt_stream *s, const tpurt_view *out, const tpurt_view *input,
                                     const tpurt_view *target, const tpurt_view *weight, int p, double margin,
                                     int reduction) {
  TPURT__INIT_OR_RETURN();
  const char *op = "multi_margin_loss";
  if (p != 1 && p != 2) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: only p == 1 and p == 2 supported", op);
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(target, 1, op, "target"))) return st;
  if (!kc_is_index_dtype(target->dtype) || target->sizes[0] != input->sizes[0])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: target must be an int64 [N] tensor", op);
  mm_args a;
  memset(&a, 0, sizeof a);
  a.kind = MM_FWD, a.out = *out, a.in = *input, a.target = *target, a.p = p, a.margin = margin;
  a.reduction = reduction;
  if (weight) a.has_w = 1, a.weight = *weight;
  return mm_launch(s, &a, op);
}

tpurt_status tpurt_multi_margin_loss_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                              const tpurt_view *input, const tpurt_view *target,
                                              const tpurt_view *weight, int p, double margin, int reduction) {
  TPURT__INIT_OR_RETURN();
  const char *op = "multi_margin_loss_backward";
  if (p != 1 && p != 2) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: only p == 1 and p == 2 supported", op);
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(grad_in, 2, op, "grad_input"))) return st;
  mm_args a;
  memset(&a, 0, sizeof a);
  a.kind = MM_BWD, a.out = *grad_in, a.in = *input, a.target = *target, a.p = p, a.margin = margin;
  a.reduction = reduction, a.gout = *grad_out;
  if (reduction != 0) a.gout.ndim = 0;
  if (weight) a.has_w = 1, a.weight = *weight;
  return mm_launch(s, &a, op);
}

tpurt_status tpurt_multilabel_margin_loss(tpurt_stream *s, const tpurt_view *out, const tpurt_view *is_target,
                                          const tpurt_view *input, const tpurt_view *target, int reduction) {
  TPURT__INIT_OR_RETURN();
  const char *op = "multilabel_margin_loss";
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(target, 2, op, "target")) ||
      (st = tpurt__check_kernel_view(is_target, 2, op, "is_target")))
    return st;
  if (!kc_is_index_dtype(target->dtype) || target->sizes[0] != input->sizes[0] ||
      target->sizes[1] != input->sizes[1])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: inconsistent target size", op);
  mm_args a;
  memset(&a, 0, sizeof a);
  a.kind = ML_FWD, a.out = *out, a.aux = *is_target, a.in = *input, a.target = *target, a.reduction = reduction;
  return mm_launch(s, &a, op);
}

tpurt_status tpurt_multilabel_margin_loss_backward(tpurt_stream *s, const tpurt_view *grad_in,
                                                   const tpurt_view *grad_out, const tpurt_view *input,
                                                   const tpurt_view *target, const tpurt_view *is_target,
                                                   int reduction) {
  TPURT__INIT_OR_RETURN();
  const char *op = "multilabel_margin_loss_backward";
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(grad_in, 2, op, "grad_input"))) return st;
  mm_args a;
  memset(&a, 0, sizeof a);
  a.kind = ML_BWD, a.out = *grad_in, a.aux = *is_target, a.in = *input, a.target = *target;
  a.reduction = reduction, a.gout = *grad_out;
  if (reduction != 0) a.gout.ndim = 0;
  return mm_launch(s, &a, op);
}

/* ------------------------------------------------------------ distances */

typedef struct {
  int bwd, pd;
  double p;
  tpurt_view out, x1, x2, gout, dist;
} dist_args;

static inline double pw_dist_acc(double p, double acc, double d) {
  d = fabs(d);
  if (p == 0) return acc + (d != 0);
  if (p == 1) return acc + d;
  if (p == 2) return acc + d * d;
  if (isinf(p)) return d > acc ? d : (isnan(d) ? d : acc);
  return acc + pow(d, p);
}
static inline double pw_dist_fin(double p, double acc) {
  if (p == 0 || p == 1 || isinf(p)) return acc;
  if (p == 2) return sqrt(acc);
  return pow(acc, 1.0 / p);
}
/* d dist / d diff */
static inline double pw_grad(double p, double diff, double dist, int f32) {
  if (f32) diff = (float)diff; /* the forward rounded |diff| to the data type */
  if (p == 0) return 0;
  double sg = (diff > 0) - (diff < 0);
  if (p == 1) return sg;
  if (isinf(p)) return sg * (fabs(diff) == dist ? 1.0 : 0.0);
  if (dist == 0) return 0;
  if (p == 2) return diff / dist;
  if (p < 1 && diff == 0) return 0;
  return sg * pow(fabs(diff), p - 1) / pow(dist, p - 1);
}

/* pdist: pair index of (i, j), i < j, in row-major upper-triangle order */
static inline int64_t pair_index(int64_t n, int64_t i, int64_t j) { return i * n - i * (i + 1) / 2 + (j - i - 1); }

static void dist_chunk(void *c, int64_t b, int64_t e) {
  const dist_args *a = c;
  char *x1 = hp(&a->x1), *x2 = a->pd ? x1 : hp(&a->x2), *o = hp(&a->out);
  const tpurt_view *v1 = &a->x1, *v2 = a->pd ? &a->x1 : &a->x2;
  if (a->pd) {
    int64_t N = v1->sizes[0], M = v1->sizes[1];
    for (int64_t i = b; i < e; i++) {
      if (!a->bwd) {
        for (int64_t j = i + 1; j < N; j++) {
          double acc = 0;
          for (int64_t k = 0; k < M; k++)
            acc = pw_dist_acc(a->p, acc, kc_ld(v1->dtype, E2(v1, x1, i, k)) - kc_ld(v1->dtype, E2(v1, x1, j, k)));
          kc_st(a->out.dtype, E1(&a->out, o, pair_index(N, i, j)), pw_dist_fin(a->p, acc));
        }
      } else {
        char *go = hp(&a->gout), *dd = hp(&a->dist);
        for (int64_t k = 0; k < M; k++) {
          double s = 0, xi = kc_ld(v1->dtype, E2(v1, x1, i, k));
          for (int64_t j = 0; j < N; j++) {
            if (j == i) continue;
            int64_t q = i < j ? pair_index(N, i, j) : pair_index(N, j, i);
            double g = kc_ld(a->gout.dtype, E1(&a->gout, go, q)), dist = kc_ld(a->dist.dtype, E1(&a->dist, dd, q));
            s += g * pw_grad(a->p, xi - kc_ld(v1->dtype, E2(v1, x1, j, k)), dist, v1->dtype != TPURT_F64);
          }
          kc_st(a->out.dtype, E2(&a->out, o, i, k), s);
        }
      }
    }
    return;
  }
  int64_t P = v1->sizes[1], R = v2->sizes[1], M = v1->sizes[2];
  for (int64_t u = b; u < e; u++) {
    int64_t bb = u / P, i = u % P;
    if (!a->bwd) {
      for (int64_t j = 0; j < R; j++) {
        double acc = 0;
        for (int64_t k = 0; k < M; k++)
          acc = pw_dist_acc(a->p, acc,
                            kc_ld(v1->dtype, E3(v1, x1, bb, i, k)) - kc_ld(v2->dtype, E3(v2, x2, bb, j, k)));
        kc_st(a->out.dtype, E3(&a->out, o, bb, i, j), pw_dist_fin(a->p, acc));
      }
    } else {
      char *go = hp(&a->gout), *dd = hp(&a->dist);
      for (int64_t k = 0; k < M; k++) {
        double s = 0, xi = kc_ld(v1->dtype, E3(v1, x1, bb, i, k));
        for (int64_t j = 0; j < R; j++) {
          double g = kc_ld(a->gout.dtype, E3(&a->gout, go, bb, i, j));
          double dist = kc_ld(a->dist.dtype, E3(&a->dist, dd, bb, i, j));
          s += g * pw_grad(a->p, xi - kc_ld(v2->dtype, E3(v2, x2, bb, j, k)), dist, v1->dtype != TPURT_F64);
        }
        kc_st(a->out.dtype, E3(&a->out, o, bb, i, k), s);
      }
    }
  }
}

static tpurt_status k_dist(void *pa, char *err, size_t errlen) {
  (void)err, (void)errlen;
  dist_args *a = pa;
  int64_t rows = a->pd ? a->x1.sizes[0] : a->x1.sizes[0] * a->x1.sizes[1];
  tpurt_parallel_for(rows, 1, dist_chunk, a);
  return TPURT_OK;
}

static tpurt_status dist_launch(tpurt_stream *s, dist_args *a, const char *op) {
  tpurt_status st;
  if (a->p < 0 || isnan(a->p))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: p value must be >= 0", op);
  if ((st = need_float(op, &a->x1)) || (st = need_float(op, &a->out))) return st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(a->x1.ptr)))) return st;
  if (tpurt__view_numel(&a->out) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_dist, a, sizeof *a);
}

tpurt_status tpurt_cdist(tpurt_stream *s, const tpurt_view *out, const tpurt_view *x1, const tpurt_view *x2,
                         double p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "cdist";
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(out, 3, op, "output")) || (st = tpurt__check_kernel_view(x1, 3, op, "x1")) ||
      (st = tpurt__check_kernel_view(x2, 3, op, "x2")))
    return st;
  if (x1->sizes[0] != x2->sizes[0] || x1->sizes[2] != x2->sizes[2] || out->sizes[0] != x1->sizes[0] ||
      out->sizes[1] != x1->sizes[1] || out->sizes[2] != x2->sizes[1])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: shapes of x1, x2 and output do not match", op);
  dist_args a;
  memset(&a, 0, sizeof a);
  a.p = p, a.out = *out, a.x1 = *x1, a.x2 = *x2;
  return dist_launch(s, &a, op);
}

tpurt_status tpurt_cdist_backward(tpurt_stream *s, const tpurt_view *grad_x1, const tpurt_view *grad_out,
                                  const tpurt_view *x1, const tpurt_view *x2, const tpurt_view *dist, double p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "cdist_backward";
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(grad_x1, 3, op, "grad_x1")) ||
      (st = tpurt__check_kernel_view(grad_out, 3, op, "grad")) || (st = tpurt__check_kernel_view(x1, 3, op, "x1")) ||
      (st = tpurt__check_kernel_view(x2, 3, op, "x2")) || (st = tpurt__check_kernel_view(dist, 3, op, "cdist")))
    return st;
  for (int k = 0; k < 3; k++)
    if (grad_x1->sizes[k] != x1->sizes[k] || grad_out->sizes[k] != dist->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: shapes do not match", op);
  if (x1->sizes[0] != x2->sizes[0] || x1->sizes[2] != x2->sizes[2] || dist->sizes[1] != x1->sizes[1] ||
      dist->sizes[2] != x2->sizes[1] || dist->sizes[0] != x1->sizes[0])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: shapes of x1, x2 and cdist do not match", op);
  dist_args a;
  memset(&a, 0, sizeof a);
  a.bwd = 1, a.p = p, a.out = *grad_x1, a.x1 = *x1, a.x2 = *x2, a.gout = *grad_out, a.dist = *dist;
  return dist_launch(s, &a, op);
}

tpurt_status tpurt_pdist(tpurt_stream *s, const tpurt_view *out, const tpurt_view *x, double p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "pdist";
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(out, 1, op, "output")) || (st = tpurt__check_kernel_view(x, 2, op, "input")))
    return st;
  int64_t N = x->sizes[0];
  if (out->sizes[0] != (N > 1 ? N * (N - 1) / 2 : 0))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output must have N (N - 1) / 2 elements", op);
  dist_args a;
  memset(&a, 0, sizeof a);
  a.pd = 1, a.p = p, a.out = *out, a.x1 = *x;
  return dist_launch(s, &a, op);
}

tpurt_status tpurt_pdist_backward(tpurt_stream *s, const tpurt_view *grad_x, const tpurt_view *grad_out,
                                  const tpurt_view *x, const tpurt_view *dist, double p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "pdist_backward";
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(grad_x, 2, op, "grad_input")) ||
      (st = tpurt__check_kernel_view(grad_out, 1, op, "grad")) || (st = tpurt__check_kernel_view(x, 2, op, "input")) ||
      (st = tpurt__check_kernel_view(dist, 1, op, "pdist")))
    return st;
  int64_t N = x->sizes[0], np = N > 1 ? N * (N - 1) / 2 : 0;
  if (grad_x->sizes[0] != N || grad_x->sizes[1] != x->sizes[1] || grad_out->sizes[0] != np || dist->sizes[0] != np)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: shapes do not match", op);
  dist_args a;
  memset(&a, 0, sizeof a);
  a.pd = 1, a.bwd = 1, a.p = p, a.out = *grad_x, a.x1 = *x, a.gout = *grad_out, a.dist = *dist;
  if (np == 0) {
    /* no pairs: the gradient is zero */
    tpurt_scalar z = {TPURT_SCALAR_FLOAT, 0, 0, 0};
    return tpurt_fill(s, grad_x, z);
  }
  return dist_launch(s, &a, op);
}

/* ------------------------------------------------------------------ CTC */

typedef struct {
  int bwd, zero_inf;
  int64_t blank, tgt_stride;
  tpurt_view nll, la, lp, tg, il, tl, toff, grad, gout;
} ctc_args;

static inline double lse2(double a, double b) {
  double m = a > b ? a : b;
  if (m == -INFINITY) return -INFINITY;
  return m + log(exp(a - m) + exp(b - m));
}

typedef struct {
  const ctc_args *a;
  kc_err err;
} ctc_ctx;

static void ctc_chunk(void *c, int64_t b0, int64_t b1) {
  ctc_ctx *cx = c;
  const ctc_args *a = cx->a;
  const tpurt_view *lpv = &a->lp, *lav = &a->la;
  char *lp = hp(lpv), *la = hp(lav), *tg = hp(&a->tg);
  int64_t T = lpv->sizes[0], C = lpv->sizes[2], S2 = lav->sizes[2];
  for (int64_t b = b0; b < b1; b++) {
    int64_t Ti = kc_ld_idx(a->il.dtype, E1(&a->il, hp(&a->il), b));
    int64_t L = kc_ld_idx(a->tl.dtype, E1(&a->tl, hp(&a->tl), b));
    int64_t off = kc_ld_idx(a->toff.dtype, E1(&a->toff, hp(&a->toff), b));
    int64_t S = 2 * L + 1;
    if (Ti < 0 || Ti > T || L < 0 || S > S2) {
      kc_err_index(&cx->err, "ctc_loss: invalid input or target length for batch %" PRId64, b);
      continue;
    }
#define LBL(s) ((s) % 2 == 0 ? a->blank : kc_ld_idx(a->tg.dtype, tg + (off + ((s) / 2) * a->tgt_stride) * esz(&a->tg)))
#define LP(t, c) kc_ld(lpv->dtype, E3(lpv, lp, t, b, c))
#define LA(t, s) (*(double *)0)
    int bad = 0;
    for (int64_t s = 1; s < S; s += 2) {
      int64_t l = LBL(s);
      if (l < 0 || l >= C) bad = 1;
    }
    if (bad) {
      kc_err_index(&cx->err, "ctc_loss: target label out of range [0, %" PRId64 ") for batch %" PRId64, C, b);
      continue;
    }
    /* log_alpha [T, S2] of batch b, in the view's dtype; computed in a
     * double scratch */
    double *al = malloc(sizeof(double) * (size_t)((T > 0 ? T : 1) * S2));
    if (!al) {
      kc_err_index(&cx->err, "ctc_loss: out of host memory");
      continue;
    }
    for (int64_t i = 0; i < (T > 0 ? T : 1) * S2; i++) al[i] = -INFINITY;
    if (!a->bwd) {
      if (Ti > 0) {
        al[0] = LP(0, a->blank);
        if (S > 1) al[1] = LP(0, LBL(1));
      }
      for (int64_t t = 1; t < Ti; t++)
        for (int64_t s = 0; s < S; s++) {
          int64_t l = LBL(s);
          double v = al[(t - 1) * S2 + s];
          if (s > 0) v = lse2(v, al[(t - 1) * S2 + s - 1]);
          if (s > 1 && l != a->blank && LBL(s - 2) != l) v = lse2(v, al[(t - 1) * S2 + s - 2]);
          al[t * S2 + s] = v == -INFINITY ? -INFINITY : v + LP(t, l);
        }
      double ll = -INFINITY;
      if (Ti > 0) {
        ll = al[(Ti - 1) * S2 + S - 1];
        if (S > 1) ll = lse2(ll, al[(Ti - 1) * S2 + S - 2]);
      } else if (L == 0) {
        ll = 0;
      }
      kc_st(a->nll.dtype, E1(&a->nll, hp(&a->nll), b), -ll);
      for (int64_t t = 0; t < T; t++)
        for (int64_t s = 0; s < S2; s++) kc_st(lav->dtype, E3(lav, la, b, t, s), al[t * S2 + s]);
      free(al);
      continue;
    }
    /* backward: beta, then grad[t, c] = exp(lp) - exp(log(sum alpha beta) + nll - lp) */
    const tpurt_view *gv = &a->grad;
    char *gp = hp(gv);
    double nll = kc_ld(a->nll.dtype, E1(&a->nll, hp(&a->nll), b));
    double go = kc_ld(a->gout.dtype, a->gout.ndim ? E1(&a->gout, hp(&a->gout), b) : hp(&a->gout));
    double *lcab = malloc(sizeof(double) * (size_t)(C + 1));
    if (!lcab) {
      free(al);
      kc_err_index(&cx->err, "ctc_loss: out of host memory");
      continue;
    }
    if (Ti > 0) {
      al[(Ti - 1) * S2 + S - 1] = LP(Ti - 1, a->blank);
      if (S > 1) al[(Ti - 1) * S2 + S - 2] = LP(Ti - 1, LBL(S - 2));
    }
    for (int64_t t = Ti - 2; t >= 0; t--)
      for (int64_t s = 0; s < S; s++) {
        int64_t l = LBL(s);
        double v = al[(t + 1) * S2 + s];
        if (s < S - 1) v = lse2(v, al[(t + 1) * S2 + s + 1]);
        if (s < S - 2 && l != a->blank && LBL(s + 2) != l) v = lse2(v, al[(t + 1) * S2 + s + 2]);
        al[t * S2 + s] = v == -INFINITY ? -INFINITY : v + LP(t, l);
      }
    int zero = a->zero_inf && isinf(nll);
    for (int64_t t = 0; t < T; t++) {
      if (t >= Ti || zero) {
        for (int64_t cc = 0; cc < C; cc++) kc_st(gv->dtype, E3(gv, gp, t, b, cc), 0);
        continue;
      }
      for (int64_t cc = 0; cc < C; cc++) lcab[cc] = -INFINITY;
      for (int64_t s = 0; s < S; s++) {
        int64_t l = LBL(s);
        double ab = kc_ld(lav->dtype, E3(lav, la, b, t, s)) + al[t * S2 + s];
        lcab[l] = lse2(lcab[l], ab);
      }
      for (int64_t cc = 0; cc < C; cc++) {
        double lpv_ = LP(t, cc);
        double g = exp(lpv_) - exp(lcab[cc] + nll - lpv_);
        kc_st(gv->dtype, E3(gv, gp, t, b, cc), g * go);
      }
    }
    free(lcab);
    free(al);
#undef LBL
#undef LP
#undef LA
  }
}

static tpurt_status k_ctc(void *pa, char *err, size_t errlen) {
  ctc_args *a = pa;
  ctc_ctx c;
  memset(&c, 0, sizeof c);
  c.a = a;
  tpurt_parallel_for(a->lp.sizes[1], 1, ctc_chunk, &c);
  return kc_err_finish(&c.err, TPURT_ERR_INVALID_ARGUMENT, err, errlen);
}

static tpurt_status ctc_check(const char *op, const ctc_args *a) {
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(&a->lp, 3, op, "log_probs")) || (st = need_float(op, &a->lp)) ||
      (st = tpurt__check_kernel_view(&a->tg, 1, op, "targets")) ||
      (st = tpurt__check_kernel_view(&a->il, 1, op, "input_lengths")) ||
      (st = tpurt__check_kernel_view(&a->tl, 1, op, "target_lengths")) ||
      (st = tpurt__check_kernel_view(&a->toff, 1, op, "target offsets")) ||
      (st = tpurt__check_kernel_view(&a->nll, 1, op, "neg_log_likelihood")) ||
      (st = tpurt__check_kernel_view(&a->la, 3, op, "log_alpha")))
    return st;
  int64_t B = a->lp.sizes[1];
  if (a->il.sizes[0] != B || a->tl.sizes[0] != B || a->toff.sizes[0] != B || a->nll.sizes[0] != B ||
      a->la.sizes[0] != B || a->la.sizes[1] != a->lp.sizes[0])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: batch sizes do not match", op);
  if (!kc_is_index_dtype(a->tg.dtype) || !kc_is_index_dtype(a->il.dtype) || !kc_is_index_dtype(a->tl.dtype) ||
      !kc_is_index_dtype(a->toff.dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: targets and lengths must be integer tensors", op);
  if (a->blank < 0 || a->blank >= a->lp.sizes[2])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: blank must be in label range", op);
  return TPURT_OK;
}

tpurt_status tpurt_ctc_loss(tpurt_stream *s, const tpurt_view *nll, const tpurt_view *log_alpha,
                            const tpurt_view *log_probs, const tpurt_view *targets, const tpurt_view *input_lengths,
                            const tpurt_view *target_lengths, const tpurt_view *tgt_offsets, int64_t tgt_stride,
                            int64_t blank) {
  TPURT__INIT_OR_RETURN();
  const char *op = "ctc_loss";
  ctc_args a;
  memset(&a, 0, sizeof a);
  a.nll = *nll, a.la = *log_alpha, a.lp = *log_probs, a.tg = *targets, a.il = *input_lengths;
  a.tl = *target_lengths, a.toff = *tgt_offsets, a.tgt_stride = tgt_stride, a.blank = blank;
  tpurt_status st;
  if ((st = ctc_check(op, &a))) return st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(log_probs->ptr)))) return st;
  if (log_probs->sizes[1] == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_ctc, &a, sizeof a);
}

tpurt_status tpurt_ctc_loss_backward(tpurt_stream *s, const tpurt_view *grad, const tpurt_view *grad_out,
                                     const tpurt_view *log_probs, const tpurt_view *targets,
                                     const tpurt_view *input_lengths, const tpurt_view *target_lengths,
                                     const tpurt_view *tgt_offsets, int64_t tgt_stride, const tpurt_view *nll,
                                     const tpurt_view *log_alpha, int64_t blank, int zero_infinity) {
  TPURT__INIT_OR_RETURN();
  const char *op = "ctc_loss_backward";
  ctc_args a;
  memset(&a, 0, sizeof a);
  a.bwd = 1, a.zero_inf = zero_infinity;
  a.nll = *nll, a.la = *log_alpha, a.lp = *log_probs, a.tg = *targets, a.il = *input_lengths;
  a.tl = *target_lengths, a.toff = *tgt_offsets, a.tgt_stride = tgt_stride, a.blank = blank;
  a.grad = *grad, a.gout = *grad_out;
  tpurt_status st;
  if ((st = ctc_check(op, &a)) || (st = tpurt__check_kernel_view(grad, 3, op, "grad"))) return st;
  for (int k = 0; k < 3; k++)
    if (grad->sizes[k] != log_probs->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grad must have log_probs' shape", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(log_probs->ptr)))) return st;
  if (tpurt__view_numel(grad) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_ctc, &a, sizeof a);
}
