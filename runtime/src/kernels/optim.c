/*
 * optim.c — multi-tensor kernels: fused Adam/AdamW and SGD steps, the AMP
 * helpers (unscale + non-finite check, loss-scale update) and the foreach
 * list ops (elementwise and per-tensor norms).
 *
 * Launch side: validates every view, coalesces the dims of each tuple
 * (tensor i of every list) jointly and packs the tuples into one argument
 * blob. Kernel side: the tuples are cut into (tensor, chunk) pairs of at
 * most CHUNK elements; the pairs are spread over the thread pool and each
 * pair is walked row by row in blocks of BLK elements (optim_tmpl.h).
 * Device scalars (lr, grad_scale, found_inf, steps ...) are read when the
 * kernel runs, never on the host.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "../internal.h"
#include "fused.h"

#define BLK 512
#define CHUNK (64 * 1024)    /* elements per (tensor, chunk) pair */
#define TASK_ELEMS (32 * 1024) /* minimum elements per pool task */
#define MAXOPS 16 /* operands of a tuple: a foreach launch has at most 4, a chain CHAIN_MAX_SLOTS */
#define CHAIN_MAX_MEMBERS TPURT__FE_CHAIN_MAX
#define CHAIN_MAX_SLOTS MAXOPS

/* ------------------------------------------------------------- helpers */

static double val_to_double(tpurt__val v) {
  switch (v.cls) {
    case 0: return (double)v.i;
    case 1: return (double)v.u;
    default: return v.re;
  }
}

static double dscalar_read(const tpurt_dscalar *d) {
  if (!d->ptr) return d->value;
  return val_to_double(tpurt__load(d->dtype, tpurt__host_view(d->ptr)));
}

static int is_float_dtype(tpurt_dtype t) {
  return t == TPURT_F32 || t == TPURT_F64 || t == TPURT_F16 || t == TPURT_BF16;
}

/* ------------------------------------------------------ kernel contexts */

typedef struct {
  int op, has_b, has_c;
  double s, alpha;
} fe_ctx;

typedef struct {
  double beta1, beta2, weight_decay, eps, lr, grad_scale;
  double step_size, bc2_sqrt; /* per tuple */
  int amsgrad, maximize, decoupled, has_grad_scale;
} adam_ctx;

typedef struct {
  double lr, momentum, dampening, weight_decay, grad_scale;
  int nesterov, maximize, first_step, has_buf, has_grad_scale;
} sgd_ctx;

typedef struct {
  double inv_scale;
  _Atomic int found;
} unscale_ctx;

enum { NORM_L2, NORM_L1, NORM_L0, NORM_INF, NORM_NINF, NORM_P };
typedef struct {
  int kind;
  double ord, acc;
} norm_acc;

/* A chain of foreach launches run as one pass (see "chains" below): slot
 * flags, and one slot per distinct view of a tuple. */
enum { SLOT_LOAD = 1, SLOT_WRITTEN = 2, SLOT_STORE = 4 };
typedef struct {
  int32_t t;          /* tuple */
  uint8_t m, o;       /* first appearance: operand o of member m */
  uint8_t flags;
} chain_slot;

typedef struct {
  int op, has_scalars;
  double s, alpha;
  const int64_t *scalars; /* per-tuple scalars (double bits) when has_scalars */
} chain_member;

typedef struct {
  int k, n;
  chain_member mem[CHAIN_MAX_MEMBERS];
  const uint8_t *map;   /* [n][k][4]: slot of out, a, b, c (0xFF: none) */
  const int32_t *sbeg;  /* [n + 1]: tuple t's slots are [sbeg[t], sbeg[t + 1]) */
  const chain_slot *slots;
} chain_ctx;

/* float and double instantiations of the block loops */
#define T float
#define SFX f
#define NATIVE_DT TPURT_F32
#define SQRT sqrtf
#define EXP expf
#define POW powf
#define FABS fabsf
#include "optim_tmpl.h"
#undef T
#undef SFX
#undef NATIVE_DT
#undef SQRT
#undef EXP
#undef POW
#undef FABS
#define T double
#define SFX d
#define NATIVE_DT TPURT_F64
#define SQRT sqrt
#define EXP exp
#define POW pow
#define FABS fabs
#include "optim_tmpl.h"
#undef T
#undef SFX
#undef NATIVE_DT
#undef SQRT
#undef EXP
#undef POW
#undef FABS

typedef void (*block_fn)(void *ctx, int t, char **p, const int64_t *st, const int *dt, int64_t n);

/* ------------------------------------------------------- argument blob
 *
 * words: [0, n)        offset of tuple t's record
 *        [n, 2n+1)     first pair of tuple t (prefix; [n + n] = npairs)
 *        [2n+1, 3n+1)  per-tuple scalars (double bits), when used
 *        records:      numel, ndim, ptr[nops], dtype[nops], sizes[ndim],
 *                      strides[nops][ndim] (bytes)
 */
enum { K_FOREACH, K_ADAM, K_SGD, K_UNSCALE, K_NORM };

typedef struct {
  int kind, n, nops;
  int64_t npairs, total;
  union {
    fe_ctx fe;
    adam_ctx adam;
    sgd_ctx sgd;
    norm_acc norm;
    double inv_scale;
  } u;
  tpurt_dscalar lr, grad_scale, found_inf, scalar, inv_scale;
  int has_found_inf;
  int has_scalars;
  size_t nwords;
  int64_t words[];
} blob;

typedef struct {
  int64_t *w;
  size_t len, cap;
} arena;

static int ar_reserve(arena *a, size_t extra) {
  if (a->len + extra <= a->cap) return 0;
  size_t cap = a->cap ? a->cap : 256;
  while (cap < a->len + extra) cap *= 2;
  int64_t *w = realloc(a->w, cap * sizeof *w);
  if (!w) return -1;
  a->w = w;
  a->cap = cap;
  return 0;
}

static tpurt_status check_view(const tpurt_view *v, const char *op, const char *what, int i) {
  if (!v) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s[%d] is NULL", op, what, i);
  if ((unsigned)v->dtype >= TPURT_NUM_DTYPES)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s[%d] has an invalid dtype %d", op, what, i, (int)v->dtype);
  if (v->ndim < 0 || v->ndim > TPURT_MAX_DIMS)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s[%d] has an invalid number of dimensions %d", op, what, i,
                      v->ndim);
  for (int k = 0; k < v->ndim; k++)
    if (v->sizes[k] < 0)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s[%d] has a negative size in dimension %d", op, what, i, k);
  return TPURT_OK;
}

static tpurt_status check_range(int dev, const tpurt_view *v, const char *op, const char *what, int i) {
  if (tpurt__view_numel(v) == 0) return TPURT_OK;
  char buf[96];
  snprintf(buf, sizeof buf, "%s (%s[%d])", op, what, i);
  if (tpurt_devptr_device(v->ptr) != dev)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s[%d] is not on TPU %d (the stream's device)", op, what, i,
                      dev);
  return tpurt__check_view_range(dev, v, buf);
}

static tpurt_status check_dscalar(int dev, const tpurt_dscalar *d, const char *op, const char *what) {
  if (!d->ptr) return TPURT_OK;
  if ((unsigned)d->dtype >= TPURT_NUM_DTYPES || d->dtype == TPURT_C64 || d->dtype == TPURT_C128)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s has an unsupported dtype", op, what);
  if (tpurt_devptr_device(d->ptr) != dev)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s is not on TPU %d (the stream's device)", op, what, dev);
  return tpurt__check_dev_range(dev, d->ptr, 0, (int64_t)tpurt_dtype_size(d->dtype), what);
}

/* A list of tuples being packed. */
typedef struct {
  const char *op;
  int dev, n, nops;
  const tpurt_view *const *lists; /* nops lists of n views */
  const char *const *names;
  int need_float;                 /* every view must be f32/f64/f16/bf16 */
} pack_spec;

/* Validates the lists and packs the tuples into a blob (malloc'd). */
static tpurt_status pack(const pack_spec *ps, int with_scalars, blob **out, size_t *out_size) {
  int n = ps->n, nops = ps->nops;
  arena a = {0};
  tpurt_status st = TPURT_OK;
  size_t head = (size_t)n + (size_t)n + 1 + (with_scalars ? (size_t)n : 0);
  if (ar_reserve(&a, head + (size_t)n * (size_t)(2 + 2 * nops + 2))) goto oom;
  a.len = head;
  int64_t pairs = 0, total = 0;
  for (int i = 0; i < n; i++) {
    const tpurt_view *v0 = &ps->lists[0][i];
    for (int o = 0; o < nops; o++) {
      const tpurt_view *v = &ps->lists[o][i];
      if ((st = check_view(v, ps->op, ps->names[o], i))) goto fail;
      if (ps->need_float && !is_float_dtype(v->dtype)) {
        st = tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: %s[%d] has dtype %s; expected a floating point dtype", ps->op,
                        ps->names[o], i, tpurt_dtype_name(v->dtype));
        goto fail;
      }
      int same = v->ndim == v0->ndim;
      for (int k = 0; same && k < v->ndim; k++) same = v->sizes[k] == v0->sizes[k];
      if (!same) {
        st = tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s[%d] and %s[%d] have different shapes", ps->op,
                        ps->names[0], i, ps->names[o], i);
        goto fail;
      }
      if ((st = check_range(ps->dev, v, ps->op, ps->names[o], i))) goto fail;
    }
    int64_t numel = tpurt__view_numel(v0);
    /* coalesce jointly: drop size-1 dims, merge dims contiguous in every view */
    int64_t sizes[TPURT_MAX_DIMS], strides[MAXOPS][TPURT_MAX_DIMS];
    int nd = 0;
    for (int k = 0; k < v0->ndim; k++) {
      int64_t sz = v0->sizes[k];
      if (sz == 1) continue;
      int merge = nd > 0;
      for (int o = 0; merge && o < nops; o++) {
        const tpurt_view *v = &ps->lists[o][i];
        int64_t b = v->strides[k] * (int64_t)tpurt_dtype_size(v->dtype);
        merge = strides[o][nd - 1] == sz * b;
      }
      for (int o = 0; o < nops; o++) {
        const tpurt_view *v = &ps->lists[o][i];
        int64_t b = v->strides[k] * (int64_t)tpurt_dtype_size(v->dtype);
        strides[o][merge ? nd - 1 : nd] = b;
      }
      if (merge) {
        sizes[nd - 1] *= sz;
      } else {
        sizes[nd] = sz;
        nd++;
      }
    }
    if (nd == 0) {
      sizes[0] = 1;
      for (int o = 0; o < nops; o++) strides[o][0] = (int64_t)tpurt_dtype_size(ps->lists[o][i].dtype);
      nd = 1;
    }
    if (ar_reserve(&a, (size_t)(2 + 2 * nops + nd + nops * nd))) goto oom;
    a.w[i] = (int64_t)a.len;
    a.w[n + i] = pairs;
    int64_t *r = a.w + a.len;
    r[0] = numel;
    r[1] = nd;
    for (int o = 0; o < nops; o++) {
      r[2 + o] = (int64_t)ps->lists[o][i].ptr;
      r[2 + nops + o] = (int64_t)ps->lists[o][i].dtype;
    }
    int64_t *sz = r + 2 + 2 * nops;
    for (int k = 0; k < nd; k++) sz[k] = sizes[k];
    for (int o = 0; o < nops; o++)
      for (int k = 0; k < nd; k++) sz[nd + o * nd + k] = strides[o][k];
    a.len += (size_t)(2 + 2 * nops + nd + nops * nd);
    pairs += (numel + CHUNK - 1) / CHUNK;
    total += numel;
  }
  a.w[n + n] = pairs;
  size_t bytes = sizeof(blob) + a.len * sizeof(int64_t);
  blob *b = calloc(1, bytes);
  if (!b) goto oom;
  b->n = n;
  b->nops = nops;
  b->npairs = pairs;
  b->total = total;
  b->has_scalars = with_scalars;
  b->nwords = a.len;
  memcpy(b->words, a.w, a.len * sizeof(int64_t));
  free(a.w);
  *out = b;
  *out_size = bytes;
  return TPURT_OK;
oom:
  free(a.w);
  return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory packing %d tensors", ps->op, n);
fail:
  free(a.w);
  return st;
}

/* Walks elements [b, e) (row-major over the record's shape) in blocks. */
static void walk(const int64_t *rec, int nops, int t, int64_t b, int64_t e, block_fn fn, void *ctx) {
  int nd = (int)rec[1];
  const int64_t *sizes = rec + 2 + 2 * nops;
  const int64_t *strd = sizes + nd;
  char *base[MAXOPS], *ptr[MAXOPS];
  int dts[MAXOPS];
  int64_t inner[MAXOPS];
  for (int o = 0; o < nops; o++) {
    base[o] = rec[2 + o] ? tpurt__host_view((tpurt_devptr)rec[2 + o]) : NULL; /* 0: a chain slot without memory */
    dts[o] = (int)rec[2 + nops + o];
    inner[o] = strd[o * nd + nd - 1];
  }
  int64_t idx[TPURT_MAX_DIMS];
  int64_t rem = b;
  for (int k = nd - 1; k >= 0; k--) {
    idx[k] = rem % sizes[k];
    rem /= sizes[k];
  }
  int in = nd - 1;
  int64_t left = e - b;
  while (left > 0) {
    for (int o = 0; o < nops; o++) {
      char *q = base[o];
      for (int k = 0; k < nd; k++) q += idx[k] * strd[o * nd + k];
      ptr[o] = q;
    }
    int64_t cnt = sizes[in] - idx[in];
    if (cnt > left) cnt = left;
    /* blocks of a chain with many slots are halved: its buffers stay in L1 */
    const int64_t blk = nops > 12 ? BLK / 2 : BLK;
    for (int64_t off = 0; off < cnt; off += blk) {
      int64_t m = cnt - off < blk ? cnt - off : blk;
      char *p[MAXOPS];
      for (int o = 0; o < nops; o++) p[o] = ptr[o] + off * inner[o];
      fn(ctx, t, p, inner, dts, m);
    }
    left -= cnt;
    idx[in] += cnt;
    for (int k = in; k > 0 && idx[k] >= sizes[k]; k--) {
      idx[k] = 0;
      idx[k - 1]++;
    }
  }
}

/* ------------------------------------------------------------- kernels */

typedef struct {
  blob *b;
  double *partials; /* norm: one per pair */
  unscale_ctx us;
} run_ctx;

/* Tuple t's packed record. */
static const int64_t *rec_of(const blob *b, int t) { return b->words + b->words[t]; }

static int tuple_of(const blob *b, int64_t pair) {
  const int64_t *pre = b->words + b->n;
  int lo = 0, hi = b->n - 1;
  while (lo < hi) { /* last t with pre[t] <= pair (skipping empty tuples) */
    int mid = (lo + hi + 1) / 2;
    if (pre[mid] <= pair)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

static void run_pairs(void *c, int64_t pb, int64_t pe) {
  run_ctx *r = c;
  blob *b = r->b;
  const int64_t *pre = b->words + b->n;
  int t = tuple_of(b, pb);
  for (int64_t pair = pb; pair < pe; pair++) {
    while (pre[t + 1] <= pair) t++;
    const int64_t *rec = rec_of(b, t);
    int64_t k = pair - pre[t];
    int64_t e0 = k * CHUNK, e1 = e0 + CHUNK < rec[0] ? e0 + CHUNK : rec[0];
    int f64 = rec[2 + b->nops] == TPURT_F64; /* compute type follows the first operand */
    switch (b->kind) {
      case K_FOREACH: {
        fe_ctx x = b->u.fe;
        if (b->has_scalars) memcpy(&x.s, &b->words[2 * b->n + 1 + t], sizeof(double));
        walk(rec, b->nops, t, e0, e1, f64 ? blk_foreach_d : blk_foreach_f, &x);
        break;
      }
      case K_ADAM: {
        adam_ctx x = b->u.adam;
        double step;
        memcpy(&step, &b->words[2 * b->n + 1 + t], sizeof(double));
        double bc1 = 1 - pow(x.beta1, step), bc2 = 1 - pow(x.beta2, step);
        x.step_size = x.lr / bc1;
        x.bc2_sqrt = sqrt(bc2);
        walk(rec, b->nops, t, e0, e1, f64 ? blk_adam_d : blk_adam_f, &x);
        break;
      }
      case K_SGD: {
        sgd_ctx x = b->u.sgd;
        walk(rec, b->nops, t, e0, e1, f64 ? blk_sgd_d : blk_sgd_f, &x);
        break;
      }
      case K_UNSCALE: walk(rec, b->nops, t, e0, e1, f64 ? blk_unscale_d : blk_unscale_f, &r->us); break;
      case K_NORM: {
        norm_acc x = b->u.norm;
        x.acc = x.kind == NORM_INF ? 0 : x.kind == NORM_NINF ? INFINITY : 0;
        walk(rec, b->nops, t, e0, e1, f64 ? blk_norm_d : blk_norm_f, &x);
        r->partials[pair] = x.acc;
        break;
      }
    }
  }
}

/* Runs fn over b's (tuple, chunk) pairs on the pool, about TASK_ELEMS
 * elements a task. */
static void for_pairs(const blob *b, tpurt_parallel_fn fn, void *ctx) {
  if (b->npairs == 0) return;
  int64_t grain = 1;
  if (b->total > 0) {
    grain = (int64_t)((double)b->npairs * TASK_ELEMS / (double)b->total);
    if (grain < 1) grain = 1;
  }
  tpurt_parallel_for(b->npairs, grain, fn, ctx);
}

static void run_all(run_ctx *r) { for_pairs(r->b, run_pairs, r); }

/* steps are stored as (devptr, dtype) pairs after the record words */
static tpurt_status k_adam(void *a, char *err, size_t errlen) {
  blob *b = a;
  (void)err;
  (void)errlen;
  if (b->has_found_inf && dscalar_read(&b->found_inf) != 0) return TPURT_OK;
  b->u.adam.lr = dscalar_read(&b->lr);
  if (b->u.adam.has_grad_scale) b->u.adam.grad_scale = dscalar_read(&b->grad_scale);
  /* step tensors: devptr in the scalar slot, dtype in the word after the records */
  const int64_t *dtw = b->words + b->nwords - b->n;
  for (int t = 0; t < b->n; t++) {
    int64_t *slot = &b->words[2 * b->n + 1 + t];
    tpurt_dscalar d = {0, (tpurt_devptr)*slot, (tpurt_dtype)dtw[t]};
    double step = dscalar_read(&d);
    memcpy(slot, &step, sizeof step);
  }
  run_ctx r = {b, NULL, {0, 0}};
  run_all(&r);
  return TPURT_OK;
}

static tpurt_status k_sgd(void *a, char *err, size_t errlen) {
  blob *b = a;
  (void)err;
  (void)errlen;
  if (b->has_found_inf && dscalar_read(&b->found_inf) != 0) return TPURT_OK;
  b->u.sgd.lr = dscalar_read(&b->lr);
  if (b->u.sgd.has_grad_scale) b->u.sgd.grad_scale = dscalar_read(&b->grad_scale);
  run_ctx r = {b, NULL, {0, 0}};
  run_all(&r);
  return TPURT_OK;
}

static tpurt_status k_foreach(void *a, char *err, size_t errlen) {
  blob *b = a;
  (void)err;
  (void)errlen;
  if (!b->has_scalars) b->u.fe.s = dscalar_read(&b->scalar);
  run_ctx r = {b, NULL, {0, 0}};
  run_all(&r);
  return TPURT_OK;
}

static tpurt_status k_unscale(void *a, char *err, size_t errlen) {
  blob *b = a;
  (void)err;
  (void)errlen;
  run_ctx r = {b, NULL, {dscalar_read(&b->inv_scale), 0}};
  run_all(&r);
  if (atomic_load(&r.us.found)) {
    tpurt__val one;
    memset(&one, 0, sizeof one);
    one.cls = 2;
    one.re = 1.0;
    tpurt__store(b->found_inf.dtype, tpurt__host_view(b->found_inf.ptr), one);
  }
  return TPURT_OK;
}

typedef struct {
  tpurt_devptr ptr;
  tpurt_dtype dtype;
} norm_out;

static tpurt_status k_norm(void *a, char *err, size_t errlen) {
  blob *b = a;
  double *partials = NULL;
  if (b->npairs > 0) {
    partials = malloc((size_t)b->npairs * sizeof(double));
    if (!partials) {
      snprintf(err, errlen, "out of host memory for %" PRId64 " partial norms", b->npairs);
      return TPURT_ERR_OUT_OF_MEMORY;
    }
  }
  run_ctx r = {b, partials, {0, 0}};
  run_all(&r);
  const int64_t *pre = b->words + b->n;
  const norm_out *outs = (const norm_out *)(const void *)(b->words + b->nwords - 2 * (size_t)b->n);
  int kind = b->u.norm.kind;
  for (int t = 0; t < b->n; t++) {
    double acc = kind == NORM_NINF ? INFINITY : 0;
    for (int64_t p = pre[t]; p < pre[t + 1]; p++) {
      double v = partials[p];
      if (kind == NORM_INF)
        acc = (acc != acc || v > acc || v != v) ? (acc != acc ? acc : v) : acc;
      else if (kind == NORM_NINF)
        acc = (acc != acc || v < acc || v != v) ? (acc != acc ? acc : v) : acc;
      else
        acc += v;
    }
    if (kind == NORM_L2)
      acc = sqrt(acc);
    else if (kind == NORM_P)
      acc = pow(acc, 1.0 / b->u.norm.ord);
    tpurt__val x;
    memset(&x, 0, sizeof x);
    x.cls = 2;
    x.re = acc;
    tpurt__store(outs[t].dtype, tpurt__host_view(outs[t].ptr), x);
  }
  free(partials);
  return TPURT_OK;
}

/* ------------------------------------------------------------ launches */

/* Appends extra words to a packed blob (realloc). */
static tpurt_status blob_append(blob **b, size_t *size, const int64_t *w, size_t nw, const char *op) {
  blob *nb = realloc(*b, *size + nw * sizeof(int64_t));
  if (!nb) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
  memcpy(nb->words + nb->nwords, w, nw * sizeof(int64_t));
  nb->nwords += nw;
  *size += nw * sizeof(int64_t);
  *b = nb;
  return TPURT_OK;
}

static tpurt_status launch_blob(tpurt_stream *s, const char *name, tpurt_kernel_fn fn, blob *b, size_t size) {
  tpurt_status st = tpurt_launch(s, name, fn, b, size);
  free(b);
  return st;
}

static tpurt_status check_amp(int dev, const tpurt_amp_args *amp, const char *op) {
  tpurt_status st;
  if ((st = check_dscalar(dev, &amp->grad_scale, op, "grad_scale"))) return st;
  return check_dscalar(dev, &amp->found_inf, op, "found_inf");
}

tpurt_status tpurt_fused_adam(tpurt_stream *s, int n, const tpurt_view *params, const tpurt_view *grads,
                              const tpurt_view *exp_avgs, const tpurt_view *exp_avg_sqs,
                              const tpurt_view *max_exp_avg_sqs, const tpurt_view *steps,
                              const tpurt_adam_config *cfg) {
  TPURT__INIT_OR_RETURN();
  const char *op = cfg && cfg->decoupled ? "fused_adamw" : "fused_adam";
  if (!cfg) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: config is NULL", op);
  if (n < 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: negative list length %d", op, n);
  if (n == 0) return TPURT_OK;
  if (!params || !grads || !exp_avgs || !exp_avg_sqs || !steps || (cfg->amsgrad && !max_exp_avg_sqs))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: a tensor list is NULL", op);
  tpurt_status st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(params[0].ptr)))) return st;
  if ((st = check_amp(s->dev, &cfg->amp, op)) || (st = check_dscalar(s->dev, &cfg->lr, op, "lr"))) return st;
  const tpurt_view *lists[5] = {params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs};
  const char *names[5] = {"params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"};
  pack_spec ps = {op, s->dev, n, cfg->amsgrad ? 5 : 4, lists, names, 1};
  /* step tensors: one element each, read by the kernel */
  int64_t *extra = malloc((size_t)n * sizeof(int64_t));
  if (!extra) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
  for (int i = 0; i < n; i++) {
    if ((st = check_view(&steps[i], op, "state_steps", i))) goto fail_extra;
    if (tpurt__view_numel(&steps[i]) != 1 || !is_float_dtype(steps[i].dtype)) {
      st = tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: state_steps[%d] must be a one-element floating point tensor",
                      op, i);
      goto fail_extra;
    }
    if ((st = check_range(s->dev, &steps[i], op, "state_steps", i))) goto fail_extra;
    extra[i] = (int64_t)steps[i].dtype;
  }
  blob *b;
  size_t size;
  if ((st = pack(&ps, 1, &b, &size))) goto fail_extra;
  for (int i = 0; i < n; i++) b->words[2 * n + 1 + i] = (int64_t)steps[i].ptr;
  st = blob_append(&b, &size, extra, (size_t)n, op);
  free(extra);
  if (st) {
    free(b);
    return st;
  }
  b->kind = K_ADAM;
  adam_ctx *x = &b->u.adam;
  x->beta1 = cfg->beta1;
  x->beta2 = cfg->beta2;
  x->weight_decay = cfg->weight_decay;
  x->eps = cfg->eps;
  x->amsgrad = cfg->amsgrad != 0;
  x->maximize = cfg->maximize != 0;
  x->decoupled = cfg->decoupled != 0;
  x->has_grad_scale = cfg->amp.has_grad_scale != 0;
  x->grad_scale = cfg->amp.grad_scale.value;
  b->lr = cfg->lr;
  b->grad_scale = cfg->amp.grad_scale;
  b->found_inf = cfg->amp.found_inf;
  b->has_found_inf = cfg->amp.has_found_inf != 0;
  return launch_blob(s, op, k_adam, b, size);
fail_extra:
  free(extra);
  return st;
}

tpurt_status tpurt_fused_sgd(tpurt_stream *s, int n, const tpurt_view *params, const tpurt_view *grads,
                             const tpurt_view *momentum_bufs, const tpurt_sgd_config *cfg) {
  TPURT__INIT_OR_RETURN();
  const char *op = "fused_sgd";
  if (!cfg) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: config is NULL", op);
  if (n < 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: negative list length %d", op, n);
  if (n == 0) return TPURT_OK;
  if (!params || !grads) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: a tensor list is NULL", op);
  int has_buf = cfg->momentum != 0;
  if (has_buf && !momentum_bufs)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: momentum %g needs momentum buffers", op, cfg->momentum);
  tpurt_status st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(params[0].ptr)))) return st;
  if ((st = check_amp(s->dev, &cfg->amp, op)) || (st = check_dscalar(s->dev, &cfg->lr, op, "lr"))) return st;
  const tpurt_view *lists[3] = {params, grads, momentum_bufs};
  const char *names[3] = {"params", "grads", "momentum_buffer_list"};
  pack_spec ps = {op, s->dev, n, has_buf ? 3 : 2, lists, names, 1};
  blob *b;
  size_t size;
  if ((st = pack(&ps, 0, &b, &size))) return st;
  b->kind = K_SGD;
  sgd_ctx *x = &b->u.sgd;
  x->momentum = cfg->momentum;
  x->dampening = cfg->dampening;
  x->weight_decay = cfg->weight_decay;
  x->nesterov = cfg->nesterov != 0;
  x->maximize = cfg->maximize != 0;
  x->first_step = cfg->first_step != 0;
  x->has_buf = has_buf;
  x->has_grad_scale = cfg->amp.has_grad_scale != 0;
  x->grad_scale = cfg->amp.grad_scale.value;
  b->lr = cfg->lr;
  b->grad_scale = cfg->amp.grad_scale;
  b->found_inf = cfg->amp.found_inf;
  b->has_found_inf = cfg->amp.has_found_inf != 0;
  return launch_blob(s, op, k_sgd, b, size);
}

static tpurt_status one_f32(int dev, const tpurt_view *v, const char *op, const char *what, tpurt_dtype want) {
  tpurt_status st;
  if ((st = check_view(v, op, what, 0))) return st;
  if (tpurt__view_numel(v) != 1)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must be a one-element tensor (got %" PRId64 " elements)",
                      op, what, tpurt__view_numel(v));
  if (v->dtype != want)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must be a %s tensor (got %s)", op, what,
                      tpurt_dtype_name(want), tpurt_dtype_name(v->dtype));
  return check_range(dev, v, op, what, 0);
}

tpurt_status tpurt_amp_unscale(tpurt_stream *s, int n, const tpurt_view *grads, const tpurt_view *found_inf,
                               const tpurt_view *inv_scale) {
  TPURT__INIT_OR_RETURN();
  const char *op = "amp_foreach_non_finite_check_and_unscale";
  if (n < 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: negative list length %d", op, n);
  tpurt_status st;
  if (!found_inf || !inv_scale) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: found_inf or inv_scale is NULL", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(found_inf->ptr)))) return st;
  if ((st = one_f32(s->dev, found_inf, op, "found_inf", TPURT_F32)) ||
      (st = one_f32(s->dev, inv_scale, op, "inv_scale", TPURT_F32)))
    return st;
  if (n == 0) return TPURT_OK;
  if (!grads) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grads is NULL", op);
  const tpurt_view *lists[1] = {grads};
  const char *names[1] = {"grads"};
  pack_spec ps = {op, s->dev, n, 1, lists, names, 1};
  blob *b;
  size_t size;
  if ((st = pack(&ps, 0, &b, &size))) return st;
  b->kind = K_UNSCALE;
  b->inv_scale = (tpurt_dscalar){0, inv_scale->ptr, inv_scale->dtype};
  b->found_inf = (tpurt_dscalar){0, found_inf->ptr, found_inf->dtype};
  return launch_blob(s, op, k_unscale, b, size);
}

typedef struct {
  tpurt_devptr scale, tracker, found;
  double growth, backoff;
  int64_t interval;
} update_args;

static tpurt_status k_update_scale(void *a, char *err, size_t errlen) {
  update_args *u = a;
  (void)err;
  (void)errlen;
  float *scale = tpurt__host_view(u->scale);
  int32_t *tracker = tpurt__host_view(u->tracker);
  const float *found = tpurt__host_view(u->found);
  if (*found != 0) {
    *scale = (float)(*scale * u->backoff);
    *tracker = 0;
    return TPURT_OK;
  }
  int64_t good = (int64_t)*tracker + 1;
  if (good >= u->interval) {
    float grown = (float)(*scale * u->growth);
    if (isfinite(grown)) *scale = grown;
    *tracker = 0;
  } else {
    *tracker = (int32_t)good;
  }
  return TPURT_OK;
}

tpurt_status tpurt_amp_update_scale(tpurt_stream *s, const tpurt_view *scale, const tpurt_view *growth_tracker,
                                    const tpurt_view *found_inf, double growth_factor, double backoff_factor,
                                    int64_t growth_interval) {
  TPURT__INIT_OR_RETURN();
  const char *op = "amp_update_scale";
  if (!scale || !growth_tracker || !found_inf)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: a tensor is NULL", op);
  tpurt_status st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(scale->ptr)))) return st;
  if ((st = one_f32(s->dev, scale, op, "scale", TPURT_F32)) ||
      (st = one_f32(s->dev, growth_tracker, op, "growth_tracker", TPURT_I32)) ||
      (st = one_f32(s->dev, found_inf, op, "found_inf", TPURT_F32)))
    return st;
  update_args u = {scale->ptr, growth_tracker->ptr, found_inf->ptr, growth_factor, backoff_factor, growth_interval};
  return tpurt_launch(s, op, k_update_scale, &u, sizeof u);
}

static const char *const fe_names[TPURT_FE_NUM_OPS] = {
    "foreach_copy", "foreach_neg", "foreach_abs", "foreach_sqrt", "foreach_exp", "foreach_reciprocal",
    "foreach_sign", "foreach_add", "foreach_mul", "foreach_div", "foreach_maximum", "foreach_minimum",
    "foreach_pow", "foreach_pow", "foreach_addcmul", "foreach_addcdiv", "foreach_lerp"};

const char *tpurt_foreach_op_name(tpurt_foreach_op op) {
  return (unsigned)op < TPURT_FE_NUM_OPS ? fe_names[op] : "foreach_?";
}

tpurt_status tpurt_foreach(tpurt_stream *s, tpurt_foreach_op op, int n, const tpurt_foreach_operands *o) {
  TPURT__INIT_OR_RETURN();
  if ((unsigned)op >= TPURT_FE_NUM_OPS)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "foreach: invalid op %d", (int)op);
  const char *name = fe_names[op];
  if (!o) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: operands are NULL", name);
  if (n < 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: negative list length %d", name, n);
  if (n == 0) return TPURT_OK;
  if (!o->out || !o->a) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out or a is NULL", name);
  int ternary = op >= TPURT_FE_ADDCMUL;
  int unary = op <= TPURT_FE_SIGN;
  if (unary && (o->b || o->c)) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: unary op given b or c", name);
  if (!ternary && o->c) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: binary op given c", name);
  if ((op == TPURT_FE_ADDCMUL || op == TPURT_FE_ADDCDIV || op == TPURT_FE_LERP) && !o->b)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: needs the tensor list b", name);
  if ((op == TPURT_FE_ADDCMUL || op == TPURT_FE_ADDCDIV) && !o->c)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: needs the tensor list c", name);
  tpurt_status st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(o->out[0].ptr)))) return st;
  if ((st = check_dscalar(s->dev, &o->scalar, name, "scalar"))) return st;
  const tpurt_view *lists[4];
  const char *names[4];
  int k = 0;
  lists[k] = o->out;
  names[k++] = "out";
  lists[k] = o->a;
  names[k++] = "self";
  if (o->b) {
    lists[k] = o->b;
    names[k++] = "other";
  }
  if (o->c) {
    lists[k] = o->c;
    names[k++] = "tensor2";
  }
  int with_scalars = o->scalars != NULL;
  pack_spec ps = {name, s->dev, n, k, lists, names, 1};
  blob *b;
  size_t size;
  if ((st = pack(&ps, with_scalars, &b, &size))) return st;
  if (with_scalars) memcpy(&b->words[2 * n + 1], o->scalars, (size_t)n * sizeof(double));
  b->kind = K_FOREACH;
  b->u.fe.op = op;
  b->u.fe.has_b = o->b != NULL;
  b->u.fe.has_c = o->c != NULL;
  b->u.fe.alpha = op == TPURT_FE_ADD ? o->alpha : 1.0;
  b->scalar = o->scalar;
  return launch_blob(s, name, k_foreach, b, size);
}

tpurt_status tpurt_foreach_norm(tpurt_stream *s, int n, const tpurt_view *out, const tpurt_view *in, double ord) {
  TPURT__INIT_OR_RETURN();
  const char *op = "foreach_norm";
  if (n < 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: negative list length %d", op, n);
  if (n == 0) return TPURT_OK;
  if (!out || !in) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out or in is NULL", op);
  if (ord != ord || (ord < 0 && !isinf(ord)))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: unsupported norm order %g", op, ord);
  tpurt_status st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(in[0].ptr)))) return st;
  int64_t *extra = malloc(2 * (size_t)n * sizeof(int64_t));
  if (!extra) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
  norm_out *outs = (norm_out *)(void *)extra;
  for (int i = 0; i < n; i++) {
    if ((st = check_view(&out[i], op, "out", i))) goto fail;
    if (tpurt__view_numel(&out[i]) != 1 || !is_float_dtype(out[i].dtype)) {
      st = tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out[%d] must be a one-element floating point tensor", op, i);
      goto fail;
    }
    if ((st = check_range(s->dev, &out[i], op, "out", i))) goto fail;
    if (ord < 0 && tpurt__view_numel(&in[i]) == 0) {
      st = tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: the -inf norm of the empty tensor %d is undefined (no minimum of nothing)", op, i);
      goto fail;
    }
    outs[i].ptr = out[i].ptr;
    outs[i].dtype = out[i].dtype;
  }
  const tpurt_view *lists[1] = {in};
  const char *names[1] = {"self"};
  pack_spec ps = {op, s->dev, n, 1, lists, names, 1};
  blob *b;
  size_t size;
  if ((st = pack(&ps, 0, &b, &size))) goto fail;
  st = blob_append(&b, &size, extra, 2 * (size_t)n, op);
  free(extra);
  if (st) {
    free(b);
    return st;
  }
  b->kind = K_NORM;
  b->u.norm.ord = ord;
  b->u.norm.kind = ord == 2 ? NORM_L2 : ord == 1 ? NORM_L1 : ord == 0 ? NORM_L0 : isinf(ord) ? (ord > 0 ? NORM_INF : NORM_NINF) : NORM_P;
  return launch_blob(s, op, k_norm, b, size);
fail:
  free(extra);
  return st;
}

/* ------------------------------------------------------------- chains
 *
 * DeferAndFuse runs consecutive foreach launches over the same tuples as
 * one pass (an optimizer's update written as a chain of _foreach_* ops):
 * each (tuple, chunk) pair is walked once, every member computing block by
 * block from registers, so a value one member writes and a later one reads
 * never goes through memory, and a list that dies inside the chain (Adam's
 * sqrt(v) / bias + eps) is never stored at all. Order of work changes from
 * launch-major to tuple-major, so a chain is formed only when no two
 * distinct views it touches overlap where one of them is written (across
 * all tuples), and a member's device scalar is written by no member. Every
 * member computes exactly as its own launch would (same compute type, same
 * operations, values rounded to their dtype as a store would round them).
 */

struct tpurt__fe_chain {
  size_t bytes; /* of the struct and its arrays */
  int k, n, nslots;
  size_t map_off, sbeg_off, slot_off; /* offsets of the arrays in data */
  _Alignas(8) unsigned char data[];
};

int tpurt__fe_chainable(tpurt_kernel_fn fn) { return fn == k_foreach; }


/* Byte range [lo, hi) of operand o of a packed tuple record. */
static void rec_range(const int64_t *rec, int nops, int o, uint64_t *lo, uint64_t *hi) {
  int nd = (int)rec[1];
  const int64_t *sizes = rec + 2 + 2 * nops, *strd = sizes + nd + o * nd;
  uint64_t p = (uint64_t)rec[2 + o];
  int64_t a = 0, b = (int64_t)tpurt_dtype_size((tpurt_dtype)rec[2 + nops + o]);
  if (rec[0] == 0) b = 0;
  for (int d = 0; d < nd && rec[0] > 0; d++) {
    int64_t ext = (sizes[d] - 1) * strd[d];
    if (ext < 0)
      a += ext;
    else
      b += ext;
  }
  *lo = p + (uint64_t)a;
  *hi = p + (uint64_t)b;
}

uint64_t tpurt__fe_signature(const void *args) {
  const blob *b = args;
  uint64_t h = 1469598103934665603ull;
#define H(x) (h = (h ^ (uint64_t)(x)) * 1099511628211ull)
  H(b->kind);
  H(b->n);
  H(b->nops);
  if (b->kind == K_FOREACH) {
    H(b->u.fe.op);
    H(b->u.fe.has_b | b->u.fe.has_c << 1 | b->has_scalars << 2 | (b->scalar.ptr != 0) << 3);
  }
  for (int t = 0; t < b->n; t++) {
    const int64_t *r = rec_of(b, t);
    int nd = (int)r[1];
    H(r[0]);
    H(nd);
    for (int o = 0; o < b->nops; o++) H(r[2 + b->nops + o]);
    for (int i = 0; i < nd + b->nops * nd; i++) H(r[2 + 2 * b->nops + i]);
  }
#undef H
  return h;
}

typedef struct {
  uint64_t lo, hi;
  int written;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Same view: pointer, dtype and strides of the (jointly coalesced) shape. */
static int same_operand(const int64_t *ra, int na, int oa, const int64_t *rb, int nb, int ob) {
  int nd = (int)ra[1];
  if (ra[2 + oa] != rb[2 + ob] || ra[2 + na + oa] != rb[2 + nb + ob]) return 0;
  const int64_t *sa = ra + 2 + 2 * na + nd + oa * nd, *sb = rb + 2 + 2 * nb + nd + ob * nd;
  for (int d = 0; d < nd; d++)
    if (sa[d] != sb[d]) return 0;
  return 1;
}

tpurt__fe_chain *tpurt__fe_chain_new(const void *const *args, int k) {
  if (k < 2 || k > CHAIN_MAX_MEMBERS) return NULL;
  const blob *const *m = (const blob *const *)args;
  int n = m[0]->n;
  for (int i = 0; i < k; i++)
    if (m[i]->kind != K_FOREACH || m[i]->n != n) return NULL;
  size_t map_off = 0, sbeg_off = ((size_t)n * (size_t)k * 4 + 7) & ~(size_t)7;
  size_t slot_off = sbeg_off + (((size_t)n + 1) * sizeof(int32_t) + 7) / 8 * 8;
  size_t cap = slot_off + (size_t)n * CHAIN_MAX_SLOTS * sizeof(chain_slot);
  tpurt__fe_chain *c = calloc(1, sizeof *c + cap);
  span *sp = malloc(sizeof *sp * ((size_t)n * CHAIN_MAX_SLOTS + (size_t)k));
  if (!c || !sp) goto no;
  uint8_t *map = c->data + map_off;
  int32_t *sbeg = (int32_t *)(void *)(c->data + sbeg_off);
  chain_slot *slots = (chain_slot *)(void *)(c->data + slot_off);
  int ns = 0, nsp = 0;
  for (int t = 0; t < n; t++) {
    const int64_t *r0 = rec_of(m[0], t);
    int nd = (int)r0[1];
    int f64 = r0[2 + m[0]->nops] == TPURT_F64;
    sbeg[t] = ns;
    for (int i = 0; i < k; i++) {
      const blob *b = m[i];
      const int64_t *r = rec_of(b, t);
      if (r[0] != r0[0] || r[1] != nd || (r[2 + b->nops] == TPURT_F64) != f64) goto no;
      for (int d = 0; d < nd; d++)
        if (r[2 + 2 * b->nops + d] != r0[2 + 2 * m[0]->nops + d]) goto no;
      uint8_t *mp = map + ((size_t)t * (size_t)k + (size_t)i) * 4;
      mp[2] = mp[3] = 0xFF;
      /* operands in access order: the inputs, then the output */
      int order[4], roles[4], nacc = 0; /* operand index in the blob, role: 0 out, 1 a, 2 b, 3 c */
      order[nacc] = 1, roles[nacc++] = 1;
      if (b->u.fe.has_b) order[nacc] = 2, roles[nacc++] = 2;
      if (b->u.fe.has_c) order[nacc] = 2 + b->u.fe.has_b, roles[nacc++] = 3;
      order[nacc] = 0, roles[nacc++] = 0;
      for (int q = 0; q < nacc; q++) {
        int o = order[q], s;
        for (s = sbeg[t]; s < ns; s++) {
          const chain_slot *S = &slots[s];
          if (same_operand(rec_of(m[S->m], t), m[S->m]->nops, S->o, r, b->nops, o)) break;
        }
        if (s == ns) {
          if (ns - sbeg[t] == CHAIN_MAX_SLOTS) goto no;
          slots[ns] = (chain_slot){t, (uint8_t)i, (uint8_t)o, roles[q] ? SLOT_LOAD : 0};
          ns++;
        }
        if (!roles[q]) slots[s].flags |= SLOT_WRITTEN | SLOT_STORE;
        mp[roles[q]] = (uint8_t)(s - sbeg[t]);
      }
    }
    for (int s = sbeg[t]; s < ns; s++) {
      rec_range(rec_of(m[slots[s].m], t), m[slots[s].m]->nops, slots[s].o, &sp[nsp].lo, &sp[nsp].hi);
      sp[nsp].written = (slots[s].flags & SLOT_WRITTEN) != 0;
      if (sp[nsp].hi > sp[nsp].lo) nsp++;
    }
  }
  sbeg[n] = ns;
  for (int i = 0; i < k; i++)
    if (m[i]->scalar.ptr && !m[i]->has_scalars) {
      sp[nsp].lo = m[i]->scalar.ptr;
      sp[nsp].hi = m[i]->scalar.ptr + tpurt_dtype_size(m[i]->scalar.dtype);
      sp[nsp++].written = 0;
    }
  /* no written range may overlap another range */
  qsort(sp, (size_t)nsp, sizeof *sp, span_cmp);
  for (int i = 0; i < nsp; i++)
    for (int j = i + 1; j < nsp && sp[j].lo < sp[i].hi; j++)
      if (sp[i].written || sp[j].written) goto no;
  free(sp);
  c->k = k;
  c->n = n;
  c->nslots = ns;
  c->map_off = map_off;
  c->sbeg_off = sbeg_off;
  c->slot_off = slot_off;
  c->bytes = sizeof *c + slot_off + (size_t)ns * sizeof(chain_slot);
  return c;
no:
  free(c);
  free(sp);
  return NULL;
}

int tpurt__fe_chain_nslots(const tpurt__fe_chain *c) { return c->nslots; }

static chain_slot *chain_slots(const tpurt__fe_chain *c) {
  return (chain_slot *)(void *)((unsigned char *)c->data + c->slot_off);
}

tpurt_devptr tpurt__fe_chain_slot(const tpurt__fe_chain *c, const void *const *args, int i, int *read_first) {
  const chain_slot *S = &chain_slots(c)[i];
  if (read_first) *read_first = (S->flags & SLOT_LOAD) != 0;
  return (tpurt_devptr)rec_of((const blob *)args[S->m], S->t)[2 + S->o];
}

void tpurt__fe_chain_drop_store(tpurt__fe_chain *c, int i) { chain_slots(c)[i].flags &= (uint8_t)~SLOT_STORE; }

int tpurt__fe_chain_stores(const tpurt__fe_chain *c) {
  int s = 0;
  for (int i = 0; i < c->nslots; i++) s += (chain_slots(c)[i].flags & SLOT_STORE) != 0;
  return s;
}

tpurt_devptr tpurt__fe_scalar_ptr(const void *args) {
  const blob *b = args;
  return b->has_scalars ? 0 : b->scalar.ptr;
}

typedef struct {
  chain_ctx x;
  const blob *b0;
  int64_t *recs;       /* per tuple: a record over its slots */
  const int64_t *roff; /* [n]: offset of tuple t's record in recs */
} chain_run;

static void run_chain_pairs(void *c, int64_t pb, int64_t pe) {
  chain_run *r = c;
  const blob *b = r->b0;
  const int64_t *pre = b->words + b->n;
  int t = tuple_of(b, pb);
  for (int64_t pair = pb; pair < pe; pair++) {
    while (pre[t + 1] <= pair) t++;
    const int64_t *rec = r->recs + r->roff[t];
    int ns = r->x.sbeg[t + 1] - r->x.sbeg[t];
    int64_t k = pair - pre[t];
    int64_t e0 = k * CHUNK, e1 = e0 + CHUNK < rec[0] ? e0 + CHUNK : rec[0];
    int f64 = rec_of(b, t)[2 + b->nops] == TPURT_F64;
    walk(rec, ns, t, e0, e1, f64 ? blk_chain_d : blk_chain_f, &r->x);
  }
}

/* Arguments: the chain, then k offsets (from the start) of the members'
 * argument blobs, then the blobs. */
static tpurt_status k_fe_chain(void *a, char *err, size_t errlen) {
  const tpurt__fe_chain *c = a;
  const uint64_t *off = (const uint64_t *)(const void *)((const unsigned char *)a + c->bytes);
  chain_run r;
  memset(&r, 0, sizeof r);
  r.x.k = c->k;
  r.x.n = c->n;
  r.x.map = c->data + c->map_off;
  r.x.sbeg = (const int32_t *)(const void *)(c->data + c->sbeg_off);
  r.x.slots = chain_slots(c);
  for (int i = 0; i < c->k; i++) {
    const blob *b = (const blob *)(const void *)((const unsigned char *)a + off[i]);
    chain_member *M = &r.x.mem[i];
    M->op = b->u.fe.op;
    M->has_scalars = b->has_scalars;
    M->alpha = b->u.fe.alpha;
    M->s = b->has_scalars ? 0 : dscalar_read(&b->scalar);
    M->scalars = b->words + 2 * b->n + 1;
    if (i == 0) r.b0 = b;
  }
  /* a record per tuple over its slots, each slot's view from its first appearance */
  size_t words = (size_t)c->n, need = 0;
  for (int t = 0; t < c->n; t++) {
    int ns = r.x.sbeg[t + 1] - r.x.sbeg[t], nd = (int)rec_of(r.b0, t)[1];
    need += (size_t)(2 + 2 * ns + nd + ns * nd);
  }
  int64_t *mem = malloc(sizeof(int64_t) * (words + need + 1));
  if (!mem) {
    snprintf(err, errlen, "out of host memory for a chain of %d foreach ops", c->k);
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  int64_t *roff = mem, *recs = mem + words, pos = 0;
  for (int t = 0; t < c->n; t++) {
    const int64_t *r0 = rec_of(r.b0, t);
    int ns = r.x.sbeg[t + 1] - r.x.sbeg[t], nd = (int)r0[1];
    int64_t *q = recs + pos;
    roff[t] = pos;
    q[0] = r0[0];
    q[1] = nd;
    memcpy(q + 2 + 2 * ns, r0 + 2 + 2 * r.b0->nops, sizeof(int64_t) * (size_t)nd);
    for (int s = 0; s < ns; s++) {
      const chain_slot *S = &r.x.slots[r.x.sbeg[t] + s];
      const blob *b = (const blob *)(const void *)((const unsigned char *)a + off[S->m]);
      const int64_t *rs = rec_of(b, t);
      /* a temporary the chain neither loads nor stores (its store dropped)
       * has no memory: 0, not translated (walk) */
      q[2 + s] = S->flags & (SLOT_LOAD | SLOT_STORE) ? rs[2 + S->o] : 0;
      q[2 + ns + s] = rs[2 + b->nops + S->o];
      memcpy(q + 2 + 2 * ns + nd + s * nd, rs + 2 + 2 * b->nops + nd + S->o * nd, sizeof(int64_t) * (size_t)nd);
    }
    pos += 2 + 2 * ns + nd + ns * nd;
  }
  r.recs = recs;
  r.roff = roff;
  for_pairs(r.b0, run_chain_pairs, &r);
  free(mem);
  return TPURT_OK;
}

tpurt_status tpurt__fe_chain_enqueue(tpurt_stream *s, const char *name, const tpurt__fe_chain *c,
                                     const void *const *args, const size_t *sizes) {
  size_t total = c->bytes + (size_t)c->k * sizeof(uint64_t);
  uint64_t off[CHAIN_MAX_MEMBERS];
  for (int i = 0; i < c->k; i++) {
    total = (total + 7) & ~(size_t)7;
    off[i] = total;
    total += sizes[i];
  }
  unsigned char *a = malloc(total);
  if (!a) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
  memcpy(a, c, c->bytes);
  memcpy(a + c->bytes, off, (size_t)c->k * sizeof(uint64_t));
  for (int i = 0; i < c->k; i++) memcpy(a + off[i], args[i], sizes[i]);
  tpurt_status st = tpurt__enqueue(s, name, k_fe_chain, a, total, NULL);
  free(a);
  return st;
}
