/*
 * embag.c — embedding bags (sum / mean / max over bags of rows of a weight
 * table, per-sample weights, padding index), their weight and per-sample
 * weight gradients, and embedding renormalization.
 *
 * Forward: bags are spread over the pool; each bag accumulates its rows in
 * f32 (f64 for f64 tables). The f32 table with unit row stride has a plain
 * contiguous loop the compiler vectorizes.
 * Backward: the rows of the gradient table are split into as many ranges as
 * the pool has threads; every range owner scans all indices in order and
 * updates only its rows, so accumulation is deterministic and race-free.
 */
#include "kcommon.h"

static tpurt_status stream_for(tpurt_stream **s, const tpurt_view *v) {
  return tpurt__resolve_stream(s, tpurt_devptr_device(v->ptr));
}

/* ------------------------------------------------------------ forward */

typedef struct {
  tpurt_view out, offset2bag, bag_size, max_idx, weight, indices, offsets, psw;
  int has_o2b, has_bs, has_mi, has_psw;
  int mode;
  int64_t padding_idx;
  int64_t nbags, noffsets;
} bag_args;

typedef struct {
  bag_args *a;
  char *out, *o2b, *bs, *mi, *w, *idx, *off, *psw;
  kc_err err;
} bag_ctx;

static inline int64_t ld_at(tpurt_dtype d, const char *base, int64_t i, int64_t stride_bytes) {
  return kc_ld_idx(d, base + i * stride_bytes);
}

enum { BAG_SKIP = -1, BAG_BAD = -2 };
/* Weight row of the j-th index: BAG_SKIP for padding_idx, BAG_BAD after
 * reporting an index out of [0, W). */
static inline int64_t bag_row(bag_ctx *x, int64_t j, tpurt_dtype idt, int64_t is, int64_t W) {
  int64_t r = ld_at(idt, x->idx, j, is);
  if (r < 0 || r >= W) {
    kc_err_index(&x->err, "index %" PRId64 " is out of bounds for dimension 0 with size %" PRId64, r, W);
    return BAG_BAD;
  }
  return r == x->a->padding_idx ? BAG_SKIP : r;
}

static void bag_chunk(void *c, int64_t b0, int64_t b1) {
  bag_ctx *x = c;
  bag_args *a = x->a;
  int64_t N = a->indices.sizes[0], W = a->weight.sizes[0], D = a->weight.sizes[1];
  tpurt_dtype wd = a->weight.dtype, idt = a->indices.dtype, odt = a->offsets.dtype;
  int64_t wes = (int64_t)tpurt_dtype_size(wd);
  int64_t is = a->indices.strides[0] * (int64_t)tpurt_dtype_size(idt);
  int64_t os = a->offsets.strides[0] * (int64_t)tpurt_dtype_size(odt);
  int64_t wrs = a->weight.strides[0] * wes, wcs = a->weight.strides[1] * wes;
  int64_t ors = a->out.strides[0] * wes, ocs = a->out.strides[1] * wes;
  int64_t pss = a->has_psw ? a->psw.strides[0] * wes : 0;
  int fast = wd == TPURT_F32 && a->weight.strides[1] == 1 && a->out.strides[1] == 1;
  double *acc = NULL;
  if (!fast && a->mode != 2) {
    acc = malloc((size_t)(D > 0 ? D : 1) * sizeof(double));
    if (!acc) {
      kc_err_index(&x->err, "embedding_bag: out of host memory");
      return;
    }
  }
  for (int64_t b = b0; b < b1; b++) {
    int64_t beg = ld_at(odt, x->off, b, os);
    int64_t end = b + 1 < a->noffsets ? ld_at(odt, x->off, b + 1, os) : N;
    if (b == 0 && beg != 0) {
      kc_err_index(&x->err, "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                   "position 0. However, got %" PRId64, beg);
      break;
    }
    if (beg < 0 || end > N || beg > end) {
      kc_err_index(&x->err, "offsets of bag %" PRId64 " ([%" PRId64 ", %" PRId64 ")) are not increasing or exceed "
                   "the %" PRId64 " indices", b, beg, end, N);
      break;
    }
    char *orow = x->out + b * ors;
    int64_t cnt = 0;
    if (a->mode == 2) {
      /* max: first maximum wins (strict >), empty bag gives 0 / index -1 */
      int first = 1;
      for (int64_t j = beg; j < end; j++) {
        int64_t r = bag_row(x, j, idt, is, W);
        if (r == BAG_BAD) goto done;
        if (r == BAG_SKIP) continue;
        cnt++;
        const char *wrow = x->w + r * wrs;
        for (int64_t d = 0; d < D; d++) {
          double v = kc_ld(wd, wrow + d * wcs);
          char *op = orow + d * ocs;
          if (first || v > kc_ld(wd, op)) {
            kc_st(wd, op, v);
            if (a->has_mi) kc_sti(TPURT_I64, x->mi + (b * a->max_idx.strides[0] + d * a->max_idx.strides[1]) * 8, r);
          }
        }
        first = 0;
      }
      if (first) {
        for (int64_t d = 0; d < D; d++) {
          kc_st(wd, orow + d * ocs, 0.0);
          if (a->has_mi) kc_sti(TPURT_I64, x->mi + (b * a->max_idx.strides[0] + d * a->max_idx.strides[1]) * 8, -1);
        }
      }
    } else if (fast) {
      float *o = (float *)orow;
      for (int64_t d = 0; d < D; d++) o[d] = 0.f;
      for (int64_t j = beg; j < end; j++) {
        int64_t r = bag_row(x, j, idt, is, W);
        if (r == BAG_BAD) goto done;
        if (r == BAG_SKIP) continue;
        cnt++;
        const float *wr = (const float *)(x->w + r * wrs);
        if (a->has_psw) {
          float s = (float)kc_ld(wd, x->psw + j * pss);
          for (int64_t d = 0; d < D; d++) o[d] += s * wr[d];
        } else {
          for (int64_t d = 0; d < D; d++) o[d] += wr[d];
        }
      }
      if (a->mode == 1 && cnt > 0) {
        float inv = 1.0f / (float)cnt;
        for (int64_t d = 0; d < D; d++) o[d] *= inv;
      }
    } else {
      for (int64_t d = 0; d < D; d++) acc[d] = 0;
      for (int64_t j = beg; j < end; j++) {
        int64_t r = bag_row(x, j, idt, is, W);
        if (r == BAG_BAD) goto done;
        if (r == BAG_SKIP) continue;
        cnt++;
        const char *wrow = x->w + r * wrs;
        double s = a->has_psw ? kc_ld(wd, x->psw + j * pss) : 1.0;
        if (wd == TPURT_F64) {
          for (int64_t d = 0; d < D; d++) acc[d] += s * kc_ld(wd, wrow + d * wcs);
        } else {
          /* f16 / bf16: accumulate in f32 like the f32 path */
          for (int64_t d = 0; d < D; d++) acc[d] = (float)((float)acc[d] + (float)s * (float)kc_ld(wd, wrow + d * wcs));
        }
      }
      double inv = a->mode == 1 && cnt > 0 ? 1.0 / (double)cnt : 1.0;
      for (int64_t d = 0; d < D; d++) kc_st(wd, orow + d * ocs, acc[d] * inv);
    }
    if (a->has_bs) kc_sti(TPURT_I64, x->bs + b * a->bag_size.strides[0] * 8, cnt);
    if (a->has_o2b)
      for (int64_t j = beg; j < end; j++) kc_sti(TPURT_I64, x->o2b + j * a->offset2bag.strides[0] * 8, b);
  }
done:
  free(acc);
}

static tpurt_status k_embedding_bag(void *p, char *err, size_t errlen) {
  bag_args *a = p;
  bag_ctx x;
  x.a = a;
  x.out = tpurt__host_view(a->out.ptr);
  x.w = tpurt__host_view(a->weight.ptr);
  x.idx = a->indices.sizes[0] ? tpurt__host_view(a->indices.ptr) : NULL;
  x.off = tpurt__host_view(a->offsets.ptr);
  x.o2b = a->has_o2b ? tpurt__host_view(a->offset2bag.ptr) : NULL;
  x.bs = a->has_bs ? tpurt__host_view(a->bag_size.ptr) : NULL;
  x.mi = a->has_mi ? tpurt__host_view(a->max_idx.ptr) : NULL;
  x.psw = a->has_psw ? tpurt__host_view(a->psw.ptr) : NULL;
  atomic_init(&x.err.set, 0);
  if (a->has_o2b) {
    /* indices after the last bag (include_last_offset) belong to no bag */
    for (int64_t j = 0; j < a->offset2bag.sizes[0]; j++) kc_sti(TPURT_I64, x.o2b + j * a->offset2bag.strides[0] * 8, -1);
  }
  int64_t per = a->nbags ? a->indices.sizes[0] / a->nbags + 1 : 1;
  int64_t work = per * (a->weight.sizes[1] + 1);
  tpurt_parallel_for(a->nbags, work >= 4096 ? 1 : 4096 / work + 1, bag_chunk, &x);
  return kc_err_finish(&x.err, TPURT_ERR_INDEX, err, errlen);
}

tpurt_status tpurt_embedding_bag(tpurt_stream *s, const tpurt_view *out, const tpurt_view *offset2bag,
                                 const tpurt_view *bag_size, const tpurt_view *max_idx, const tpurt_view *weight,
                                 const tpurt_view *indices, const tpurt_view *offsets, const tpurt_view *psw,
                                 tpurt_bag_mode mode, int64_t padding_idx) {
  TPURT__INIT_OR_RETURN();
  const char *op = "embedding_bag";
  tpurt_status st;
  if (!out || !weight || !indices || !offsets) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, weight))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, weight, op, "weight")) ||
      (st = kc_check(s->dev, indices, op, "indices")) || (st = kc_check(s->dev, offsets, op, "offsets")))
    return st;
  if (weight->ndim != 2 || indices->ndim != 1 || offsets->ndim != 1 || out->ndim != 2)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected weight [W, D], indices [N], offsets [B(+1)], out [B, D]",
                      op);
  if (!kc_is_index_dtype(indices->dtype) || !kc_is_index_dtype(offsets->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: indices and offsets must be int64 or int32", op);
  if (!kc_is_float(weight->dtype) || out->dtype != weight->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: weight and out must have one floating dtype", op);
  int64_t B = out->sizes[0], D = weight->sizes[1];
  if (out->sizes[1] != D || (offsets->sizes[0] != B && offsets->sizes[0] != B + 1))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out [%" PRId64 ", %" PRId64 "] does not match weight or offsets",
                      op, out->sizes[0], out->sizes[1]);
  if (mode < TPURT_BAG_SUM || mode > TPURT_BAG_MAX)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad mode %d", op, (int)mode);
  bag_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.weight = *weight;
  a.indices = *indices;
  a.offsets = *offsets;
  a.mode = mode;
  a.padding_idx = padding_idx;
  a.nbags = B;
  a.noffsets = offsets->sizes[0];
  if (offset2bag) {
    if ((st = kc_check(s->dev, offset2bag, op, "offset2bag"))) return st;
    if (offset2bag->dtype != TPURT_I64 || offset2bag->ndim != 1 || offset2bag->sizes[0] != indices->sizes[0])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: offset2bag must be int64 [N]", op);
    a.offset2bag = *offset2bag;
    a.has_o2b = 1;
  }
  if (bag_size) {
    if ((st = kc_check(s->dev, bag_size, op, "bag_size"))) return st;
    if (bag_size->dtype != TPURT_I64 || bag_size->ndim != 1 || bag_size->sizes[0] != B)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bag_size must be int64 [B]", op);
    a.bag_size = *bag_size;
    a.has_bs = 1;
  }
  if (max_idx && mode == TPURT_BAG_MAX) {
    if ((st = kc_check(s->dev, max_idx, op, "max_indices"))) return st;
    if (max_idx->dtype != TPURT_I64 || max_idx->ndim != 2 || max_idx->sizes[0] != B || max_idx->sizes[1] != D)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: max_indices must be int64 [B, D]", op);
    a.max_idx = *max_idx;
    a.has_mi = 1;
  }
  if (psw) {
    if ((st = kc_check(s->dev, psw, op, "per_sample_weights"))) return st;
    if (mode != TPURT_BAG_SUM)
      return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: per_sample_weights only supported with mode='sum'", op);
    if (psw->ndim != 1 || psw->sizes[0] != indices->sizes[0] || psw->dtype != weight->dtype)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: per_sample_weights must be [N] of weight's dtype", op);
    a.psw = *psw;
    a.has_psw = 1;
  }
  if (B == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_embedding_bag, &a, sizeof a);
}

/* ----------------------------------------------------------- backward */

typedef struct {
  tpurt_view gw, grad, indices, offset2bag, bag_size, max_idx, psw;
  int has_psw;
  int mode, scale_by_freq;
  int64_t padding_idx;
} bagb_args;

typedef struct {
  bagb_args *a;
  char *gw, *g, *idx, *o2b, *bs, *mi, *psw;
  int64_t *freq;
  int64_t nparts;
  kc_err err;
} bagb_ctx;

static void bagb_part(void *c, int64_t p0, int64_t p1) {
  bagb_ctx *x = c;
  bagb_args *a = x->a;
  int64_t W = a->gw.sizes[0], D = a->gw.sizes[1], N = a->indices.sizes[0];
  tpurt_dtype dt = a->gw.dtype, idt = a->indices.dtype;
  int64_t es = (int64_t)tpurt_dtype_size(dt);
  int64_t is = a->indices.strides[0] * (int64_t)tpurt_dtype_size(idt);
  int64_t grs = a->gw.strides[0] * es, gcs = a->gw.strides[1] * es;
  int64_t Grs = a->grad.strides[0] * es, Gcs = a->grad.strides[1] * es;
  int fast = dt == TPURT_F32 && a->gw.strides[1] == 1 && a->grad.strides[1] == 1;
  for (int64_t part = p0; part < p1; part++) {
    int64_t lo = W * part / x->nparts, hi = W * (part + 1) / x->nparts;
    /* zero own rows */
    for (int64_t r = lo; r < hi; r++)
      for (int64_t d = 0; d < D; d++) kc_st(dt, x->gw + r * grs + d * gcs, 0.0);
    if (x->freq) {
      for (int64_t r = lo; r < hi; r++) x->freq[r] = 0;
      for (int64_t j = 0; j < N; j++) {
        int64_t r = ld_at(idt, x->idx, j, is);
        if (r >= lo && r < hi) x->freq[r]++;
      }
    }
    if (a->mode == 2) {
      int64_t B = a->max_idx.sizes[0];
      for (int64_t b = 0; b < B; b++)
        for (int64_t d = 0; d < D; d++) {
          int64_t r = kc_ldi(TPURT_I64, x->mi + (b * a->max_idx.strides[0] + d * a->max_idx.strides[1]) * 8);
          if (r < lo || r >= hi) continue;
          double g = kc_ld(dt, x->g + b * Grs + d * Gcs);
          if (x->freq) g /= (double)x->freq[r];
          char *pp = x->gw + r * grs + d * gcs;
          kc_st(dt, pp, kc_ld(dt, pp) + g);
        }
      continue;
    }
    for (int64_t j = 0; j < N; j++) {
      int64_t r = ld_at(idt, x->idx, j, is);
      if (r < lo || r >= hi || r == a->padding_idx) continue;
      int64_t b = kc_ldi(TPURT_I64, x->o2b + j * a->offset2bag.strides[0] * 8);
      if (b < 0) continue;
      double sc = 1.0;
      if (a->has_psw) sc *= kc_ld(dt, x->psw + j * a->psw.strides[0] * es);
      if (a->mode == 1) {
        int64_t n = kc_ldi(TPURT_I64, x->bs + b * a->bag_size.strides[0] * 8);
        if (n > 0) sc /= (double)n;
      }
      if (x->freq) sc /= (double)x->freq[r];
      if (fast) {
        float f = (float)sc;
        float *o = (float *)(x->gw + r * grs);
        const float *gg = (const float *)(x->g + b * Grs);
        for (int64_t d = 0; d < D; d++) o[d] += f * gg[d];
      } else {
        for (int64_t d = 0; d < D; d++) {
          char *pp = x->gw + r * grs + d * gcs;
          kc_st(dt, pp, kc_ld(dt, pp) + sc * kc_ld(dt, x->g + b * Grs + d * Gcs));
        }
      }
    }
  }
}

static tpurt_status k_embedding_bag_backward(void *p, char *err, size_t errlen) {
  bagb_args *a = p;
  bagb_ctx x;
  memset(&x, 0, sizeof x);
  x.a = a;
  x.gw = tpurt__host_view(a->gw.ptr);
  x.g = a->grad.sizes[0] ? tpurt__host_view(a->grad.ptr) : NULL;
  x.idx = a->indices.sizes[0] ? tpurt__host_view(a->indices.ptr) : NULL;
  if (a->mode != 2) {
    x.o2b = a->indices.sizes[0] ? tpurt__host_view(a->offset2bag.ptr) : NULL;
    x.bs = a->mode == 1 && a->bag_size.sizes[0] ? tpurt__host_view(a->bag_size.ptr) : NULL;
  } else {
    x.mi = a->max_idx.sizes[0] ? tpurt__host_view(a->max_idx.ptr) : NULL;
  }
  x.psw = a->has_psw && a->psw.sizes[0] ? tpurt__host_view(a->psw.ptr) : NULL;
  atomic_init(&x.err.set, 0);
  if (a->scale_by_freq) {
    x.freq = malloc((size_t)a->gw.sizes[0] * sizeof(int64_t));
    if (!x.freq) return TPURT_ERR_OUT_OF_MEMORY;
  }
  int64_t W = a->gw.sizes[0];
  int64_t work = (a->indices.sizes[0] + 1) * (a->gw.sizes[1] + 1);
  int64_t np = work < 32768 ? 1 : tpurt_num_threads();
  if (np > W) np = W;
  if (np < 1) np = 1;
  x.nparts = np;
  tpurt_parallel_for(np, 1, bagb_part, &x);
  free(x.freq);
  return kc_err_finish(&x.err, TPURT_ERR_INDEX, err, errlen);
}

tpurt_status tpurt_embedding_bag_backward(tpurt_stream *s, const tpurt_view *grad_weight, const tpurt_view *grad,
                                          const tpurt_view *indices, const tpurt_view *offset2bag,
                                          const tpurt_view *bag_size, const tpurt_view *max_idx,
                                          const tpurt_view *psw, tpurt_bag_mode mode, int64_t padding_idx,
                                          int scale_by_freq) {
  TPURT__INIT_OR_RETURN();
  const char *op = "embedding_bag_backward";
  tpurt_status st;
  if (!grad_weight || !grad || !indices) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, grad_weight))) return st;
  if ((st = kc_check(s->dev, grad_weight, op, "grad_weight")) || (st = kc_check(s->dev, grad, op, "grad")) ||
      (st = kc_check(s->dev, indices, op, "indices")))
    return st;
  if (grad_weight->ndim != 2 || grad->ndim != 2 || indices->ndim != 1 || grad->dtype != grad_weight->dtype ||
      !kc_is_float(grad->dtype) || grad->sizes[1] != grad_weight->sizes[1] || !kc_is_index_dtype(indices->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad grad_weight / grad / indices views", op);
  bagb_args a;
  memset(&a, 0, sizeof a);
  a.gw = *grad_weight;
  a.grad = *grad;
  a.indices = *indices;
  a.mode = mode;
  a.padding_idx = padding_idx;
  a.scale_by_freq = scale_by_freq;
  if (mode == TPURT_BAG_MAX) {
    if (!max_idx || (st = kc_check(s->dev, max_idx, op, "max_indices"))) return max_idx ? st : tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: max mode needs max_indices", op);
    if (max_idx->dtype != TPURT_I64 || max_idx->ndim != 2 || max_idx->sizes[0] != grad->sizes[0] ||
        max_idx->sizes[1] != grad->sizes[1])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: max_indices must be int64 of grad's shape", op);
    a.max_idx = *max_idx;
  } else {
    if (!offset2bag || (st = kc_check(s->dev, offset2bag, op, "offset2bag")))
      return offset2bag ? st : tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: offset2bag needed", op);
    if (offset2bag->dtype != TPURT_I64 || offset2bag->ndim != 1 || offset2bag->sizes[0] != indices->sizes[0])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: offset2bag must be int64 [N]", op);
    a.offset2bag = *offset2bag;
    if (mode == TPURT_BAG_MEAN) {
      if (!bag_size || (st = kc_check(s->dev, bag_size, op, "bag_size")))
        return bag_size ? st : tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bag_size needed", op);
      if (bag_size->dtype != TPURT_I64 || bag_size->ndim != 1 || bag_size->sizes[0] != grad->sizes[0])
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bag_size must be int64 [B]", op);
      a.bag_size = *bag_size;
    }
  }
  if (psw) {
    if ((st = kc_check(s->dev, psw, op, "per_sample_weights"))) return st;
    if (psw->ndim != 1 || psw->sizes[0] != indices->sizes[0] || psw->dtype != grad->dtype)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: per_sample_weights must be [N] of grad's dtype", op);
    a.psw = *psw;
    a.has_psw = 1;
  }
  if (kc_numel(grad_weight) == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_embedding_bag_backward, &a, sizeof a);
}

/* ------------------------------------------- per-sample weights grad */

typedef struct {
  tpurt_view out, grad, weight, indices, offset2bag;
  int64_t padding_idx;
} psw_args;

typedef struct {
  psw_args *a;
  char *out, *g, *w, *idx, *o2b;
} psw_ctx;

static void psw_chunk(void *c, int64_t j0, int64_t j1) {
  psw_ctx *x = c;
  psw_args *a = x->a;
  tpurt_dtype dt = a->weight.dtype, idt = a->indices.dtype;
  int64_t es = (int64_t)tpurt_dtype_size(dt), D = a->weight.sizes[1], W = a->weight.sizes[0];
  int64_t is = a->indices.strides[0] * (int64_t)tpurt_dtype_size(idt);
  int fast = dt == TPURT_F32 && a->weight.strides[1] == 1 && a->grad.strides[1] == 1;
  for (int64_t j = j0; j < j1; j++) {
    int64_t r = ld_at(idt, x->idx, j, is);
    int64_t b = kc_ldi(TPURT_I64, x->o2b + j * a->offset2bag.strides[0] * 8);
    double acc = 0;
    if (r != a->padding_idx && b >= 0 && r >= 0 && r < W) {
      const char *wr = x->w + r * a->weight.strides[0] * es, *gr = x->g + b * a->grad.strides[0] * es;
      if (fast) {
        const float *wf = (const float *)wr, *gf = (const float *)gr;
        float s = 0;
        for (int64_t d = 0; d < D; d++) s += wf[d] * gf[d];
        acc = s;
      } else {
        for (int64_t d = 0; d < D; d++)
          acc += kc_ld(dt, wr + d * a->weight.strides[1] * es) * kc_ld(dt, gr + d * a->grad.strides[1] * es);
      }
    }
    kc_st(dt, x->out + j * a->out.strides[0] * es, acc);
  }
}

static tpurt_status k_psw_backward(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  psw_args *a = p;
  psw_ctx x = {a, tpurt__host_view(a->out.ptr), tpurt__host_view(a->grad.ptr), tpurt__host_view(a->weight.ptr),
               tpurt__host_view(a->indices.ptr), tpurt__host_view(a->offset2bag.ptr)};
  int64_t D = a->weight.sizes[1] + 1;
  tpurt_parallel_for(a->indices.sizes[0], D >= 4096 ? 1 : 4096 / D + 1, psw_chunk, &x);
  return TPURT_OK;
}

tpurt_status tpurt_embedding_bag_psw_backward(tpurt_stream *s, const tpurt_view *out, const tpurt_view *grad,
                                              const tpurt_view *weight, const tpurt_view *indices,
                                              const tpurt_view *offset2bag, int64_t padding_idx) {
  TPURT__INIT_OR_RETURN();
  const char *op = "embedding_bag_per_sample_weights_backward";
  tpurt_status st;
  if (!out || !grad || !weight || !indices || !offset2bag)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, out))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, grad, op, "grad")) ||
      (st = kc_check(s->dev, weight, op, "weight")) || (st = kc_check(s->dev, indices, op, "indices")) ||
      (st = kc_check(s->dev, offset2bag, op, "offset2bag")))
    return st;
  if (out->ndim != 1 || indices->ndim != 1 || offset2bag->ndim != 1 || weight->ndim != 2 || grad->ndim != 2 ||
      out->sizes[0] != indices->sizes[0] || offset2bag->sizes[0] != indices->sizes[0] ||
      grad->sizes[1] != weight->sizes[1] || out->dtype != weight->dtype || grad->dtype != weight->dtype ||
      offset2bag->dtype != TPURT_I64 || !kc_is_index_dtype(indices->dtype) || !kc_is_float(weight->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad views", op);
  if (out->sizes[0] == 0) return TPURT_OK;
  psw_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.grad = *grad;
  a.weight = *weight;
  a.indices = *indices;
  a.offset2bag = *offset2bag;
  a.padding_idx = padding_idx;
  return tpurt_launch(s, op, k_psw_backward, &a, sizeof a);
}

/* ------------------------------------------------------------- renorm */

typedef struct {
  tpurt_view self, indices;
  double max_norm, norm_type;
} renorm_args;

typedef struct {
  renorm_args *a;
  char *self, *idx;
  unsigned char *seen;
  int64_t nparts;
  kc_err err;
} renorm_ctx;

static void renorm_part(void *c, int64_t p0, int64_t p1) {
  renorm_ctx *x = c;
  renorm_args *a = x->a;
  int64_t W = a->self.sizes[0], D = a->self.sizes[1], N = a->indices.sizes[0];
  tpurt_dtype dt = a->self.dtype, idt = a->indices.dtype;
  int64_t es = (int64_t)tpurt_dtype_size(dt), is = a->indices.strides[0] * (int64_t)tpurt_dtype_size(idt);
  double p = a->norm_type;
  for (int64_t part = p0; part < p1; part++) {
    int64_t lo = W * part / x->nparts, hi = W * (part + 1) / x->nparts;
    for (int64_t j = 0; j < N; j++) {
      int64_t r = ld_at(idt, x->idx, j, is);
      if (r < 0 || r >= W) {
        if (part == 0)
          kc_err_index(&x->err, "index %" PRId64 " is out of bounds for dimension 0 with size %" PRId64, r, W);
        continue;
      }
      if (r < lo || r >= hi || x->seen[r]) continue;
      x->seen[r] = 1;
      char *row = x->self + r * a->self.strides[0] * es;
      int64_t cs = a->self.strides[1] * es;
      double nrm = 0;
      if (isinf(p)) {
        for (int64_t d = 0; d < D; d++) {
          double v = fabs(kc_ld(dt, row + d * cs));
          nrm = p > 0 ? (v > nrm || d == 0 ? v : nrm) : (v < nrm || d == 0 ? v : nrm);
        }
      } else if (p == 0) {
        for (int64_t d = 0; d < D; d++) nrm += kc_ld(dt, row + d * cs) != 0;
      } else if (p == 1) {
        for (int64_t d = 0; d < D; d++) nrm += fabs(kc_ld(dt, row + d * cs));
      } else if (p == 2) {
        for (int64_t d = 0; d < D; d++) {
          double v = kc_ld(dt, row + d * cs);
          nrm += v * v;
        }
        nrm = sqrt(nrm);
      } else {
        for (int64_t d = 0; d < D; d++) nrm += pow(fabs(kc_ld(dt, row + d * cs)), p);
        nrm = pow(nrm, 1.0 / p);
      }
      if (nrm > a->max_norm) {
        double sc = a->max_norm / (nrm + 1e-7);
        for (int64_t d = 0; d < D; d++) kc_st(dt, row + d * cs, kc_ld(dt, row + d * cs) * sc);
      }
    }
  }
}

static tpurt_status k_embedding_renorm(void *p, char *err, size_t errlen) {
  renorm_args *a = p;
  renorm_ctx x;
  memset(&x, 0, sizeof x);
  x.a = a;
  x.self = tpurt__host_view(a->self.ptr);
  x.idx = tpurt__host_view(a->indices.ptr);
  x.seen = calloc((size_t)a->self.sizes[0], 1);
  if (!x.seen) return TPURT_ERR_OUT_OF_MEMORY;
  atomic_init(&x.err.set, 0);
  int64_t W = a->self.sizes[0];
  int64_t np = a->indices.sizes[0] * a->self.sizes[1] < 32768 ? 1 : tpurt_num_threads();
  if (np > W) np = W;
  x.nparts = np;
  tpurt_parallel_for(np, 1, renorm_part, &x);
  free(x.seen);
  return kc_err_finish(&x.err, TPURT_ERR_INDEX, err, errlen);
}

tpurt_status tpurt_embedding_renorm(tpurt_stream *s, const tpurt_view *self, const tpurt_view *indices,
                                    double max_norm, double norm_type) {
  TPURT__INIT_OR_RETURN();
  const char *op = "embedding_renorm_";
  tpurt_status st;
  if (!self || !indices) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, self))) return st;
  if ((st = kc_check(s->dev, self, op, "self")) || (st = kc_check(s->dev, indices, op, "indices"))) return st;
  if (self->ndim != 2 || indices->ndim != 1 || !kc_is_float(self->dtype) || !kc_is_index_dtype(indices->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected a floating [W, D] self and 1-D int indices", op);
  if (indices->sizes[0] == 0 || self->sizes[0] == 0) return TPURT_OK;
  renorm_args a;
  memset(&a, 0, sizeof a);
  a.self = *self;
  a.indices = *indices;
  a.max_norm = max_norm;
  a.norm_type = norm_type;
  return tpurt_launch(s, op, k_embedding_renorm, &a, sizeof a);
}
