/*
 * index.c — indexing and shape kernels: index_select, gather, scatter
 * (assign and reductions), index_add, advanced indexing (index /
 * index_put), masked_fill, nonzero, tril/triu, reflection / replication
 * padding (+ backward), arange and linspace.
 *
 * Launch validates views on the host; kernels check every index they read
 * and report the first bad one as TPURT_ERR_INDEX. Kernels that combine
 * values into one destination split their work so that every destination
 * is owned by one thread and is updated in index order (deterministic).
 */
#include "kcommon.h"

/* ------------------------------------------------------------ helpers */

static tpurt_status stream_for(tpurt_stream **s, const tpurt_view *v) {
  return tpurt__resolve_stream(s, tpurt_devptr_device(v->ptr));
}

static int same_shape(const tpurt_view *a, const tpurt_view *b) {
  if (a->ndim != b->ndim) return 0;
  for (int k = 0; k < a->ndim; k++)
    if (a->sizes[k] != b->sizes[k]) return 0;
  return 1;
}

/* view without dimension dim */
static tpurt_view drop_dim(const tpurt_view *v, int dim) {
  tpurt_view r = *v;
  r.ndim = 0;
  for (int k = 0; k < v->ndim; k++) {
    if (k == dim) continue;
    r.sizes[r.ndim] = v->sizes[k];
    r.strides[r.ndim] = v->strides[k];
    r.ndim++;
  }
  return r;
}

/* copies a slice described by a 2-operand walker (dst, src) */
static void copy_slice(const kc_iter *it, char *d, const char *s, int es) {
  int64_t rows = kc_iter_rows(it), inner = kc_iter_inner(it);
  int64_t off[KC_MAXOPS];
  int64_t ds = it->str[0][it->ndim - 1], ss = it->str[1][it->ndim - 1];
  for (int64_t r = 0; r < rows; r++) {
    kc_iter_row(it, r, off);
    char *dp = d + off[0];
    const char *sp = s + off[1];
    if (ds == es && ss == es) {
      memcpy(dp, sp, (size_t)(inner * es));
    } else {
      for (int64_t i = 0; i < inner; i++) kc_move(dp + i * ds, sp + i * ss, es);
    }
  }
}

/* --------------------------------------------------------- index_select */

typedef struct {
  tpurt_view out, self, index;
  int dim;
} isel_args;

typedef struct {
  isel_args *a;
  kc_iter it; /* slice walker (out slice, self slice) */
  char *out, *self;
  const char *idx;
  int one; /* slices of one element, strides multiples of the element size */
  kc_err err;
} isel_ctx;

/* slices of one element (a vector, or [n, 1] rows): a typed loop per
 * element size and index type instead of a slice copy an element */
#define ISEL_ONE(ET, IT)                                                    \
  do {                                                                      \
    const IT *ip = (const IT *)x->idx;                                      \
    int64_t is = istr / (int64_t)sizeof(IT);                                \
    int64_t os = ostr / (int64_t)sizeof(ET), ss = sstr / (int64_t)sizeof(ET); \
    ET *op = (ET *)x->out;                                                  \
    const ET *sp = (const ET *)x->self;                                     \
    for (int64_t j = b; j < e; j++) {                                       \
      int64_t v = ip[j * is];                                               \
      bad |= (uint64_t)v >= (uint64_t)n_dim;                                \
      op[j * os] = sp[(bad ? 0 : v) * ss];                                  \
    }                                                                       \
  } while (0)
#define ISEL_ONE_ES(IT)                          \
  switch (es) {                                  \
    case 1: ISEL_ONE(uint8_t, IT); break;        \
    case 2: ISEL_ONE(uint16_t, IT); break;       \
    case 4: ISEL_ONE(uint32_t, IT); break;       \
    default: ISEL_ONE(uint64_t, IT); break;      \
  }

static void isel_chunk(void *c, int64_t b, int64_t e) {
  isel_ctx *x = c;
  isel_args *a = x->a;
  int es = (int)tpurt_dtype_size(a->out.dtype);
  int64_t isz = (int64_t)tpurt_dtype_size(a->index.dtype);
  int64_t istr = a->index.ndim ? a->index.strides[0] * isz : 0;
  int64_t n_dim = a->self.sizes[a->dim];
  int64_t ostr = a->out.strides[a->dim] * es, sstr = a->self.strides[a->dim] * es;
  if (x->one && es <= 8 && (es & (es - 1)) == 0) {
    int bad = 0;
    if (a->index.dtype == TPURT_I64)
      ISEL_ONE_ES(int64_t)
    else
      ISEL_ONE_ES(int32_t)
    if (!bad) return;
    /* find the first bad index for the message below */
  }
  for (int64_t j = b; j < e; j++) {
    int64_t v = kc_ld_idx(a->index.dtype, x->idx + j * istr);
    if (v < 0 || v >= n_dim) {
      kc_err_index(&x->err, "index %" PRId64 " is out of bounds for dimension %d with size %" PRId64, v, a->dim,
                   n_dim);
      return;
    }
    copy_slice(&x->it, x->out + j * ostr, x->self + v * sstr, es);
  }
}

static tpurt_status k_index_select(void *p, char *err, size_t errlen) {
  isel_args *a = p;
  isel_ctx *x = malloc(sizeof *x);
  if (!x) return TPURT_ERR_OUT_OF_MEMORY;
  x->a = a;
  tpurt_view os = drop_dim(&a->out, a->dim), ss = drop_dim(&a->self, a->dim);
  const tpurt_view *vs[2] = {&os, &ss};
  kc_iter_init(&x->it, 2, vs, &os);
  x->out = tpurt__host_view(a->out.ptr);
  x->self = tpurt__host_view(a->self.ptr);
  x->idx = tpurt__host_view(a->index.ptr);
  atomic_init(&x->err.set, 0);
  int64_t n = a->out.sizes[a->dim];
  int64_t slice = kc_numel(&os);
  x->one = slice == 1;
  tpurt_parallel_for(n, slice >= KC_GRAIN ? 1 : KC_GRAIN / (slice + 1) + 1, isel_chunk, x);
  tpurt_status st = kc_err_finish(&x->err, TPURT_ERR_INDEX, err, errlen);
  free(x);
  return st;
}

tpurt_status tpurt_index_select(tpurt_stream *s, const tpurt_view *out, const tpurt_view *self, int dim,
                                const tpurt_view *index) {
  TPURT__INIT_OR_RETURN();
  const char *op = "index_select";
  tpurt_status st;
  if (!out || !self || !index) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, out))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check_in(s->dev, self, op, "self")) ||
      (st = kc_check_in(s->dev, index, op, "index")))
    return st;
  if (!kc_is_index_dtype(index->dtype) || index->ndim > 1)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: index must be a 0-D or 1-D int64/int32 view", op);
  if (self->ndim == 0 || out->ndim != self->ndim || dim < 0 || dim >= self->ndim || out->dtype != self->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out/self mismatch or bad dim %d", op, dim);
  for (int k = 0; k < self->ndim; k++)
    if (k != dim && out->sizes[k] != self->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out and self differ in dimension %d", op, k);
  if (out->sizes[dim] != kc_numel(index))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out has %" PRId64 " entries in dim %d, index has %" PRId64, op,
                      out->sizes[dim], dim, kc_numel(index));
  if (kc_numel(out) == 0) return TPURT_OK;
  isel_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.self = *self;
  a.index = *index;
  a.dim = dim;
  return tpurt_launch(s, op, k_index_select, &a, sizeof a);
}

/* -------------------------------------------------------------- gather */

typedef struct {
  tpurt_view out, self, index;
  int dim;
} gather_args;

typedef struct {
  gather_args *a;
  kc_iter it; /* out, index, self (stride 0 in dim) */
  char *out, *self, *idx;
  kc_err err;
} gather_ctx;

static void gather_chunk(void *c, int64_t b, int64_t e) {
  gather_ctx *x = c;
  gather_args *a = x->a;
  int es = (int)tpurt_dtype_size(a->out.dtype);
  tpurt_dtype idt = a->index.dtype;
  int64_t inner = kc_iter_inner(&x->it), nd = x->it.ndim;
  int64_t os = x->it.str[0][nd - 1], is = x->it.str[1][nd - 1], ss = x->it.str[2][nd - 1];
  int64_t sdim = a->self.strides[a->dim] * es, lim = a->self.sizes[a->dim];
  int64_t off[KC_MAXOPS];
  for (int64_t r = b; r < e; r++) {
    kc_iter_row(&x->it, r, off);
    char *op = x->out + off[0];
    const char *ip = x->idx + off[1];
    const char *sp = x->self + off[2];
    for (int64_t i = 0; i < inner; i++) {
      int64_t v = kc_ld_idx(idt, ip + i * is);
      if (v < 0 || v >= lim) {
        kc_err_index(&x->err, "index %" PRId64 " is out of bounds for dimension %d with size %" PRId64, v, a->dim,
                     lim);
        return;
      }
      kc_move(op + i * os, sp + i * ss + v * sdim, es);
    }
  }
}

static tpurt_status k_gather(void *p, char *err, size_t errlen) {
  gather_args *a = p;
  gather_ctx *x = malloc(sizeof *x);
  if (!x) return TPURT_ERR_OUT_OF_MEMORY;
  x->a = a;
  tpurt_view sv = a->self;
  for (int k = 0; k < sv.ndim; k++) sv.sizes[k] = a->index.sizes[k];
  sv.strides[a->dim] = 0;
  const tpurt_view *vs[3] = {&a->out, &a->index, &sv};
  kc_iter_init(&x->it, 3, vs, &a->index);
  x->out = tpurt__host_view(a->out.ptr);
  x->self = tpurt__host_view(a->self.ptr);
  x->idx = tpurt__host_view(a->index.ptr);
  atomic_init(&x->err.set, 0);
  int64_t inner = kc_iter_inner(&x->it);
  tpurt_parallel_for(kc_iter_rows(&x->it), KC_GRAIN / inner + 1, gather_chunk, x);
  tpurt_status st = kc_err_finish(&x->err, TPURT_ERR_INDEX, err, errlen);
  free(x);
  return st;
}

static tpurt_status check_gather_shapes(const char *op, const tpurt_view *self, int dim, const tpurt_view *index,
                                        const tpurt_view *other) {
  if (!kc_is_index_dtype(index->dtype))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: index must be an int64/int32 view", op);
  int nd = self->ndim;
  if (index->ndim != nd || (other && other->ndim != nd) || dim < 0 || dim >= (nd ? nd : 1))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: self, index (and src) must have the same number of "
                      "dimensions, dim %d", op, dim);
  for (int k = 0; k < nd; k++) {
    if (k != dim && index->sizes[k] > self->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "%s: index size %" PRId64 " exceeds self size %" PRId64 " in dimension %d", op,
                        index->sizes[k], self->sizes[k], k);
    if (other && index->sizes[k] > other->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: index larger than src in dimension %d", op, k);
  }
  return TPURT_OK;
}

tpurt_status tpurt_gather(tpurt_stream *s, const tpurt_view *out, const tpurt_view *self, int dim,
                          const tpurt_view *index) {
  TPURT__INIT_OR_RETURN();
  const char *op = "gather";
  tpurt_status st;
  if (!out || !self || !index) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, out))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check_in(s->dev, self, op, "self")) ||
      (st = kc_check_in(s->dev, index, op, "index")))
    return st;
  if (!same_shape(out, index) || out->dtype != self->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out must have index's shape and self's dtype", op);
  if ((st = check_gather_shapes(op, self, dim, index, NULL))) return st;
  if (kc_numel(out) == 0) return TPURT_OK;
  gather_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.self = *self;
  a.index = *index;
  a.dim = dim;
  if (self->ndim == 0) { /* 0-D: treat as 1-D of one element */
    a.out.ndim = a.self.ndim = a.index.ndim = 1;
    a.out.sizes[0] = a.self.sizes[0] = a.index.sizes[0] = 1;
    a.out.strides[0] = a.self.strides[0] = a.index.strides[0] = 1;
    a.dim = 0;
  }
  return tpurt_launch(s, op, k_gather, &a, sizeof a);
}

/* ------------------------------------------------------------- scatter */

typedef struct {
  tpurt_view self, index, src;
  int has_src, dim, op, include_self;
  unsigned char value[16]; /* value in self's dtype */
} scatter_args;

typedef struct {
  scatter_args *a;
  kc_iter it; /* self (stride 0 in dim), index, src over index's shape without dim */
  char *self, *idx, *src;
  kc_err err;
} scatter_ctx;

static int is_int_dtype(tpurt_dtype d) { return !kc_is_float(d) && !kc_is_complex(d); }

/* the identity of amax / amin over an integer dtype: its lowest / highest value (a narrower
 * dtype cannot hold INT64_MIN: stored, it would keep its low bits, 0) */
static int64_t int_lowest(tpurt_dtype d) {
  switch (d) {
    case TPURT_I8: return INT8_MIN;
    case TPURT_I16: return INT16_MIN;
    case TPURT_I32: return INT32_MIN;
    case TPURT_I64: return INT64_MIN;
    default: return 0; /* bool and the unsigned dtypes */
  }
}
static int64_t int_highest(tpurt_dtype d) {
  switch (d) {
    case TPURT_BOOL: return 1;
    case TPURT_U8: return UINT8_MAX;
    case TPURT_I8: return INT8_MAX;
    case TPURT_I16: return INT16_MAX;
    case TPURT_U16: return UINT16_MAX;
    case TPURT_I32: return INT32_MAX;
    case TPURT_U32: return UINT32_MAX;
    default: return INT64_MAX; /* int64; uint64 values above it are not representable in the kernel's int64 */
  }
}

static void scatter_chunk(void *c, int64_t b, int64_t e) {
  scatter_ctx *x = c;
  scatter_args *a = x->a;
  tpurt_dtype dt = a->self.dtype, idt = a->index.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int64_t n = a->index.sizes[a->dim];
  int64_t lim = a->self.sizes[a->dim];
  int64_t sd = a->self.strides[a->dim] * es;
  int64_t id = a->index.strides[a->dim] * (int64_t)tpurt_dtype_size(idt);
  int64_t rd = a->has_src ? a->src.strides[a->dim] * es : 0;
  int isint = is_int_dtype(dt);
  int op = a->op;
  int64_t *cnt = NULL;
  if (op == TPURT_SCATTER_MEAN) {
    cnt = calloc((size_t)lim, sizeof *cnt);
    if (!cnt) {
      kc_err_index(&x->err, "out of host memory");
      return;
    }
  }
  int64_t off[KC_MAXOPS];
  for (int64_t r = b; r < e; r++) {
    kc_iter_row(&x->it, r, off);
    char *sp = x->self + off[0];
    const char *ip = x->idx + off[1];
    const char *rp = a->has_src ? x->src + off[2] : (const char *)a->value;
    /* validate the line first */
    for (int64_t j = 0; j < n; j++) {
      int64_t v = kc_ld_idx(idt, ip + j * id);
      if (v < 0 || v >= lim) {
        kc_err_index(&x->err, "index %" PRId64 " is out of bounds for dimension %d with size %" PRId64, v, a->dim,
                     lim);
        free(cnt);
        return;
      }
    }
    if (op == TPURT_SCATTER_ASSIGN) {
      for (int64_t j = 0; j < n; j++) kc_move(sp + kc_ld_idx(idt, ip + j * id) * sd, rp + j * rd, es);
      continue;
    }
    if (!a->include_self) {
      for (int64_t j = 0; j < n; j++) {
        char *d = sp + kc_ld_idx(idt, ip + j * id) * sd;
        switch (op) {
          case TPURT_SCATTER_SUM: case TPURT_SCATTER_MEAN: kc_st(dt, d, 0); break;
          case TPURT_SCATTER_PROD: kc_st(dt, d, 1); break;
          case TPURT_SCATTER_AMAX:
            if (isint) kc_sti(dt, d, int_lowest(dt)); else kc_st(dt, d, -INFINITY);
            break;
          case TPURT_SCATTER_AMIN:
            if (isint) kc_sti(dt, d, int_highest(dt)); else kc_st(dt, d, INFINITY);
            break;
        }
      }
    }
    for (int64_t j = 0; j < n; j++) {
      int64_t v = kc_ld_idx(idt, ip + j * id);
      char *d = sp + v * sd;
      const char *q = rp + j * rd;
      if (cnt) cnt[v]++;
      if (isint) {
        int64_t acc = kc_ldi(dt, d), y = kc_ldi(dt, q);
        switch (op) {
          case TPURT_SCATTER_SUM: case TPURT_SCATTER_MEAN: acc = (int64_t)((uint64_t)acc + (uint64_t)y); break;
          case TPURT_SCATTER_PROD: acc = (int64_t)((uint64_t)acc * (uint64_t)y); break;
          case TPURT_SCATTER_AMAX: acc = y > acc ? y : acc; break;
          case TPURT_SCATTER_AMIN: acc = y < acc ? y : acc; break;
        }
        kc_sti(dt, d, acc);
      } else {
        double acc = kc_ld(dt, d), y = kc_ld(dt, q);
        switch (op) {
          case TPURT_SCATTER_SUM: case TPURT_SCATTER_MEAN: acc = acc + y; break;
          case TPURT_SCATTER_PROD: acc = acc * y; break;
          case TPURT_SCATTER_AMAX: acc = (isnan(y) || y > acc) ? y : acc; break;
          case TPURT_SCATTER_AMIN: acc = (isnan(y) || y < acc) ? y : acc; break;
        }
        if (dt == TPURT_F32) acc = (float)acc;
        kc_st(dt, d, acc);
      }
    }
    if (cnt) {
      for (int64_t j = 0; j < n; j++) {
        int64_t v = kc_ld_idx(idt, ip + j * id);
        if (!cnt[v]) continue;
        int64_t c2 = cnt[v] + (a->include_self ? 1 : 0);
        char *d = sp + v * sd;
        if (isint) {
          int64_t q = kc_ldi(dt, d), r2 = q / c2;
          if ((q % c2 != 0) && ((q < 0) != (c2 < 0))) r2--;
          kc_sti(dt, d, r2);
        } else {
          kc_st(dt, d, kc_ld(dt, d) / (double)c2);
        }
        cnt[v] = 0;
      }
    }
  }
  free(cnt);
}

static tpurt_status k_scatter(void *p, char *err, size_t errlen) {
  scatter_args *a = p;
  scatter_ctx *x = malloc(sizeof *x);
  if (!x) return TPURT_ERR_OUT_OF_MEMORY;
  x->a = a;
  tpurt_view iv = drop_dim(&a->index, a->dim);
  tpurt_view sv = a->self, rv = a->has_src ? a->src : a->index;
  for (int k = 0; k < sv.ndim; k++) sv.sizes[k] = a->index.sizes[k];
  sv = drop_dim(&sv, a->dim);
  if (!a->has_src) {
    for (int k = 0; k < rv.ndim; k++) rv.strides[k] = 0;
  } else {
    for (int k = 0; k < rv.ndim; k++) rv.sizes[k] = a->index.sizes[k];
  }
  rv = drop_dim(&rv, a->dim);
  const tpurt_view *vs[3] = {&sv, &iv, &rv};
  kc_iter_init(&x->it, 3, vs, &iv);
  /* rows here are lines of single elements: use all positions as rows */
  x->it.sizes[x->it.ndim] = 1;
  for (int o = 0; o < 3; o++) x->it.str[o][x->it.ndim] = 0;
  x->it.ndim++;
  x->self = tpurt__host_view(a->self.ptr);
  x->idx = tpurt__host_view(a->index.ptr);
  x->src = a->has_src ? tpurt__host_view(a->src.ptr) : NULL;
  atomic_init(&x->err.set, 0);
  int64_t n = a->index.sizes[a->dim];
  tpurt_parallel_for(kc_iter_rows(&x->it), KC_GRAIN / (n + 1) + 1, scatter_chunk, x);
  tpurt_status st = kc_err_finish(&x->err, TPURT_ERR_INDEX, err, errlen);
  free(x);
  return st;
}

tpurt_status tpurt_scatter(tpurt_stream *s, const tpurt_view *self, int dim, const tpurt_view *index,
                           const tpurt_view *src, tpurt_scalar value, tpurt_scatter_op op, int include_self) {
  TPURT__INIT_OR_RETURN();
  const char *name = op == TPURT_SCATTER_ASSIGN ? "scatter" : op == TPURT_SCATTER_SUM ? "scatter_add" : "scatter_reduce";
  tpurt_status st;
  if (!self || !index) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", name);
  if ((unsigned)op > TPURT_SCATTER_AMIN) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad reduction", name);
  if ((st = stream_for(&s, self))) return st;
  if ((st = kc_check(s->dev, self, name, "self")) || (st = kc_check_in(s->dev, index, name, "index")) ||
      (src && (st = kc_check_in(s->dev, src, name, "src"))))
    return st;
  if (src && src->dtype != self->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: src and self must have the same dtype", name);
  if (kc_is_complex(self->dtype) && op != TPURT_SCATTER_ASSIGN)
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: reductions of complex tensors are not supported", name);
  if ((st = check_gather_shapes(name, self, dim, index, src))) return st;
  if (kc_numel(index) == 0) return TPURT_OK;
  scatter_args a;
  memset(&a, 0, sizeof a);
  a.self = *self;
  a.index = *index;
  if (src) a.src = *src;
  a.has_src = src != NULL;
  a.dim = dim;
  a.op = op;
  a.include_self = include_self;
  tpurt__store(self->dtype, a.value, tpurt__scalar_val(value));
  if (self->ndim == 0) {
    a.self.ndim = a.index.ndim = a.src.ndim = 1;
    a.self.sizes[0] = a.index.sizes[0] = a.src.sizes[0] = 1;
    a.self.strides[0] = a.index.strides[0] = a.src.strides[0] = 1;
    a.dim = 0;
  }
  return tpurt_launch(s, name, k_scatter, &a, sizeof a);
}

/* ----------------------------------------------------------- index_add */

typedef struct {
  tpurt_view self, index, src;
  int dim, scale_by_freq;
  double alpha;
  int64_t skip;
} iadd_args;

typedef struct {
  iadd_args *a;
  kc_iter it; /* self slice, src slice */
  char *self, *idx, *src;
  int64_t *freq;
  /* bfloat16 / float16: the source rows by destination (pairs (v, j)
   * sorted, ng groups starting at gstart[g]) */
  int64_t (*order)[2];
  int64_t *gstart, ng;
  int64_t cb; /* > 0: units are blocks of cb columns of the one row (iadd_cols), not rows */
} iadd_ctx;

/* bfloat16 / float16 slices: every destination's contributions summed in
 * float in index order and rounded once (the CPU's index_add of reduced
 * floats sums so; rounding after each addition lost up to a few ulps of the
 * partial sums' magnitude where contributions cancel: fuzz seed 58105). */
static void iadd_groups(iadd_ctx *x, int64_t b, int64_t e) {
  iadd_args *a = x->a;
  tpurt_dtype dt = a->self.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int64_t sd = a->self.strides[a->dim] * es, rd = a->src.strides[a->dim] * es;
  int64_t inner = kc_iter_inner(&x->it), nd = x->it.ndim;
  int64_t ds = x->it.str[0][nd - 1], ss = x->it.str[1][nd - 1];
  int64_t off[KC_MAXOPS];
  for (int64_t g = 0; g < x->ng; g++) {
    int64_t g0 = x->gstart[g], g1 = x->gstart[g + 1], v = x->order[g0][0];
    float al = (float)(x->freq ? a->alpha / (double)x->freq[v] : a->alpha);
    for (int64_t r = b; r < e; r++) {
      kc_iter_row(&x->it, r, off);
      char *d = x->self + off[0] + v * sd;
      for (int64_t i = 0; i < inner; i++) {
        float acc = (float)kc_ld(dt, d + i * ds);
        for (int64_t k = g0; k < g1; k++) acc += al * (float)kc_ld(dt, x->src + off[1] + x->order[k][1] * rd + i * ss);
        kc_st(dt, d + i * ds, acc);
      }
    }
  }
}

/* One-dimensional self (bincount, a histogram by index_add): integer
 * destinations are counted in private per-chunk bins over the index, then
 * added bin by bin (exact in any order); floating ones add in index order,
 * one typed loop (no row iterator an element). Returns 0 when this is not
 * such a launch, -1 when host memory runs out. */
typedef struct {
  iadd_ctx *x;
  int64_t lim, n, istr, sd, rd, nchunks;
  int64_t *bins; /* nchunks x lim */
} iadd1_ctx;

static void iadd1_count(void *c, int64_t b, int64_t e) {
  iadd1_ctx *y = c;
  iadd_args *a = y->x->a;
  tpurt_dtype idt = a->index.dtype, dt = a->self.dtype;
  for (int64_t ch = b; ch < e; ch++) {
    int64_t *bins = y->bins + ch * (y->lim + 1); /* + a slot the skipped index counts into */
    memset(bins, 0, (size_t)(y->lim + 1) * sizeof(int64_t));
    int64_t j0 = y->n * ch / y->nchunks, j1 = y->n * (ch + 1) / y->nchunks;
    if (idt == TPURT_I64 && dt == TPURT_I64 && y->istr == 8 && y->rd == 8) { /* bincount's launch */
      const int64_t *ix = (const int64_t *)y->x->idx, *sv = (const int64_t *)y->x->src;
      for (int64_t j = j0; j < j1; j++) bins[ix[j] == a->skip ? y->lim : ix[j]] += sv[j];
      continue;
    }
    for (int64_t j = j0; j < j1; j++) {
      int64_t v = kc_ld_idx(idt, y->x->idx + j * y->istr);
      if (v == a->skip) continue;
      bins[v] += kc_ldi(dt, y->x->src + j * y->rd);
    }
  }
}

static void iadd1_merge(void *c, int64_t b, int64_t e) {
  iadd1_ctx *y = c;
  iadd_args *a = y->x->a;
  tpurt_dtype dt = a->self.dtype;
  int64_t al = (int64_t)a->alpha;
  for (int64_t v = b; v < e; v++) {
    uint64_t t = 0;
    for (int64_t ch = 0; ch < y->nchunks; ch++) t += (uint64_t)y->bins[ch * (y->lim + 1) + v];
    char *d = y->x->self + v * y->sd;
    kc_sti(dt, d, (int64_t)((uint64_t)kc_ldi(dt, d) + (uint64_t)al * t));
  }
}

static int iadd_1d(iadd_ctx *x) {
  iadd_args *a = x->a;
  if (a->self.ndim != 1 || x->order || x->freq) return 0;
  tpurt_dtype dt = a->self.dtype, idt = a->index.dtype;
  int es = (int)tpurt_dtype_size(dt);
  iadd1_ctx y = {x, a->self.sizes[0], kc_numel(&a->index),
                 a->index.ndim ? a->index.strides[0] * (int64_t)tpurt_dtype_size(idt) : 0, a->self.strides[0] * es,
                 a->src.strides[0] * es, 0, NULL};
  int isint = is_int_dtype(dt) && dt != TPURT_BOOL && dt != TPURT_U64;
  int nt = tpurt_num_threads();
  if (isint && y.n >= 8192 && (double)y.lim * 8.0 * nt * 4 <= 64.0 * (1 << 20)) {
    y.nchunks = (int64_t)nt * 4;
    if (y.nchunks > y.n / 2048) y.nchunks = y.n / 2048;
    y.bins = malloc((size_t)(y.nchunks * (y.lim + 1)) * sizeof(int64_t));
    if (!y.bins) return -1;
    tpurt_parallel_for(y.nchunks, 1, iadd1_count, &y);
    tpurt_parallel_for(y.lim, 16384, iadd1_merge, &y);
    free(y.bins);
    return 1;
  }
  if (dt != TPURT_F32 && dt != TPURT_F64) return 0;
  for (int64_t j = 0; j < y.n; j++) {
    int64_t v = kc_ld_idx(idt, x->idx + j * y.istr);
    if (v == a->skip) continue;
    char *d = x->self + v * y.sd;
    const char *q = x->src + j * y.rd;
    if (dt == TPURT_F32) {
      float dv, sv, al = (float)a->alpha;
      memcpy(&dv, d, 4);
      memcpy(&sv, q, 4);
      dv += al * sv;
      memcpy(d, &dv, 4);
    } else {
      double dv, sv;
      memcpy(&dv, d, 8);
      memcpy(&sv, q, 8);
      dv += a->alpha * sv;
      memcpy(d, &dv, 8);
    }
  }
  return 1;
}

static int cmp_pair(const void *p, const void *q) {
  const int64_t *x = p, *y = q;
  return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* d[i * ds] += alpha * q[i * ss] for i in [c0, c1) (byte strides): the
 * adding of iadd_cols and iadd_chunk. Float sums are fused multiply-adds,
 * self + alpha * src rounded once, as PyTorch's vectorized CPU kernel adds
 * (its fmadd): the same bits; float rows of unit stride add as vectors. */
static void iadd_span(tpurt_dtype dt, char *d, int64_t ds, const char *q, int64_t ss, int64_t c0, int64_t c1,
                      double alpha) {
  if (dt == TPURT_F32 && ds == 4 && ss == 4) {
    float al = (float)alpha, *dp = (float *)d;
    const float *qp = (const float *)q;
    for (int64_t i = c0; i < c1; i++) dp[i] = fmaf(al, qp[i], dp[i]);
  } else if (dt == TPURT_F32) {
    float al = (float)alpha;
    for (int64_t i = c0; i < c1; i++) {
      float dv, sv;
      memcpy(&dv, d + i * ds, 4);
      memcpy(&sv, q + i * ss, 4);
      dv = fmaf(al, sv, dv);
      memcpy(d + i * ds, &dv, 4);
    }
  } else if (is_int_dtype(dt)) {
    int64_t al = (int64_t)alpha;
    for (int64_t i = c0; i < c1; i++) kc_sti(dt, d + i * ds, kc_ldi(dt, d + i * ds) + al * kc_ldi(dt, q + i * ss));
  } else {
    for (int64_t i = c0; i < c1; i++) kc_st(dt, d + i * ds, fma(alpha, kc_ld(dt, q + i * ss), kc_ld(dt, d + i * ds)));
  }
}

/* The slices of self and src are one row (index_add along dim 0 of a
 * matrix: a graph network's scatter of messages): units [b, e) are blocks
 * of x->cb of its columns, every index in order within each, so every
 * element of self takes its contributions in index order, as in one
 * thread (iadd_span adds each span). */
static void iadd_cols(void *c, int64_t b, int64_t e) {
  iadd_ctx *x = c;
  iadd_args *a = x->a;
  tpurt_dtype dt = a->self.dtype, idt = a->index.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int64_t n = kc_numel(&a->index), inner = kc_iter_inner(&x->it), nd = x->it.ndim;
  int64_t istr = a->index.ndim ? a->index.strides[0] * (int64_t)tpurt_dtype_size(idt) : 0;
  int64_t sd = a->self.strides[a->dim] * es, rd = a->src.strides[a->dim] * es;
  int64_t ds = x->it.str[0][nd - 1], ss = x->it.str[1][nd - 1];
  int64_t c0 = b * x->cb, c1 = e * x->cb < inner ? e * x->cb : inner;
  int64_t off[KC_MAXOPS];
  kc_iter_row(&x->it, 0, off);
  for (int64_t j = 0; j < n; j++) {
    int64_t v = kc_ld_idx(idt, x->idx + j * istr);
    if (v == a->skip) continue;
    double alpha = x->freq ? a->alpha / (double)x->freq[v] : a->alpha;
    iadd_span(dt, x->self + off[0] + v * sd, ds, x->src + off[1] + j * rd, ss, c0, c1, alpha);
  }
}

static void iadd_chunk(void *c, int64_t b, int64_t e) {
  iadd_ctx *x = c;
  if (x->cb) {
    iadd_cols(c, b, e);
    return;
  }
  if (x->order) {
    iadd_groups(x, b, e);
    return;
  }
  iadd_args *a = x->a;
  tpurt_dtype dt = a->self.dtype, idt = a->index.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int64_t n = kc_numel(&a->index);
  int64_t istr = a->index.ndim ? a->index.strides[0] * (int64_t)tpurt_dtype_size(idt) : 0;
  int64_t sd = a->self.strides[a->dim] * es, rd = a->src.strides[a->dim] * es;
  int64_t inner = kc_iter_inner(&x->it), nd = x->it.ndim;
  int64_t ds = x->it.str[0][nd - 1], ss = x->it.str[1][nd - 1];
  int64_t off[KC_MAXOPS];
  for (int64_t j = 0; j < n; j++) {
    int64_t v = kc_ld_idx(idt, x->idx + j * istr);
    if (v == a->skip) continue;
    double alpha = a->alpha;
    if (x->freq) alpha /= (double)x->freq[v];
    for (int64_t r = b; r < e; r++) {
      kc_iter_row(&x->it, r, off);
      iadd_span(dt, x->self + off[0] + v * sd, ds, x->src + off[1] + j * rd, ss, 0, inner, alpha);
    }
  }
}

static tpurt_status k_index_add(void *p, char *err, size_t errlen) {
  iadd_args *a = p;
  tpurt_dtype idt = a->index.dtype;
  const char *idx = tpurt__host_view(a->index.ptr);
  int64_t n = kc_numel(&a->index), lim = a->self.sizes[a->dim];
  int64_t istr = a->index.ndim ? a->index.strides[0] * (int64_t)tpurt_dtype_size(idt) : 0;
  int64_t j0 = 0;
  if (idt == TPURT_I64 && istr == 8) { /* a typed pass finds whether any index is bad */
    const int64_t *ix = (const int64_t *)idx;
    int bad = 0;
    for (int64_t j = 0; j < n; j++) bad |= ((uint64_t)ix[j] >= (uint64_t)lim) & (ix[j] != a->skip);
    j0 = bad ? 0 : n;
  }
  for (int64_t j = j0; j < n; j++) {
    int64_t v = kc_ld_idx(idt, idx + j * istr);
    if (v == a->skip) continue;
    if (v < 0 || v >= lim) {
      /* the CPU's words and, through the glue, its classes: IndexError
       * for a vector, RuntimeError otherwise */
      if (a->self.ndim == 1)
        snprintf(err, errlen, "index out of range in self (index %" PRId64 ", size %" PRId64 ")", v, lim);
      else
        snprintf(err, errlen, "index %" PRId64 " is out of bounds for dimension %d with size %" PRId64, v, a->dim,
                 lim);
      return TPURT_ERR_INDEX;
    }
  }
  iadd_ctx *x = malloc(sizeof *x);
  if (!x) return TPURT_ERR_OUT_OF_MEMORY;
  x->a = a;
  x->freq = NULL;
  if (a->scale_by_freq) {
    x->freq = calloc((size_t)lim, sizeof(int64_t));
    if (!x->freq) {
      free(x);
      return TPURT_ERR_OUT_OF_MEMORY;
    }
    for (int64_t j = 0; j < n; j++) {
      int64_t v = kc_ld_idx(idt, idx + j * istr);
      if (v != a->skip) x->freq[v]++;
    }
  }
  x->order = NULL;
  x->gstart = NULL;
  x->ng = 0;
  if (a->self.dtype == TPURT_BF16 || a->self.dtype == TPURT_F16) {
    x->order = malloc(sizeof *x->order * (size_t)(n ? n : 1));
    x->gstart = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!x->order || !x->gstart) {
      free(x->order);
      free(x->gstart);
      free(x->freq);
      free(x);
      return TPURT_ERR_OUT_OF_MEMORY;
    }
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++) {
      int64_t v = kc_ld_idx(idt, idx + j * istr);
      if (v == a->skip) continue;
      x->order[m][0] = v;
      x->order[m++][1] = j;
    }
    qsort(x->order, (size_t)m, sizeof *x->order, cmp_pair);
    for (int64_t k = 0; k < m; k++)
      if (k == 0 || x->order[k][0] != x->order[k - 1][0]) x->gstart[x->ng++] = k;
    x->gstart[x->ng] = m;
  }
  tpurt_view ds = drop_dim(&a->self, a->dim), rs = drop_dim(&a->src, a->dim);
  const tpurt_view *vs[2] = {&ds, &rs};
  kc_iter_init(&x->it, 2, vs, &rs);
  x->self = tpurt__host_view(a->self.ptr);
  x->src = tpurt__host_view(a->src.ptr);
  x->idx = (char *)idx;
  int64_t inner = kc_iter_inner(&x->it);
  int done = iadd_1d(x);
  /* one row of slices (dim 0 of a matrix): its columns in blocks of 16 share
   * the work; else the rows do */
  x->cb = kc_iter_rows(&x->it) == 1 && !x->order && inner >= 32 ? 16 : 0;
  if (done == 0 && x->cb)
    tpurt_parallel_for((inner + 15) / 16, KC_GRAIN / (16 * (n + 1)) + 1, iadd_chunk, x);
  else if (done == 0)
    tpurt_parallel_for(kc_iter_rows(&x->it), KC_GRAIN / ((n + 1) * inner) + 1, iadd_chunk, x);
  free(x->order);
  free(x->gstart);
  free(x->freq);
  free(x);
  if (done < 0) {
    snprintf(err, errlen, "index_add: out of host memory");
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  return TPURT_OK;
}

tpurt_status tpurt_index_add(tpurt_stream *s, const tpurt_view *self, int dim, const tpurt_view *index,
                             const tpurt_view *src, double alpha, int64_t skip_index, int scale_by_freq) {
  TPURT__INIT_OR_RETURN();
  const char *op = "index_add";
  tpurt_status st;
  if (!self || !index || !src) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, self))) return st;
  if ((st = kc_check(s->dev, self, op, "self")) || (st = kc_check_in(s->dev, index, op, "index")) ||
      (st = kc_check_in(s->dev, src, op, "src")))
    return st;
  if (!kc_is_index_dtype(index->dtype) || index->ndim > 1)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: index must be a 0-D or 1-D int64/int32 view", op);
  if (self->ndim == 0 || src->ndim != self->ndim || dim < 0 || dim >= self->ndim || src->dtype != self->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: self/src mismatch or bad dim %d", op, dim);
  if (kc_is_complex(self->dtype)) return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: complex is not supported", op);
  for (int k = 0; k < self->ndim; k++)
    if ((k != dim && src->sizes[k] != self->sizes[k]) || (k == dim && src->sizes[k] != kc_numel(index)))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: src and self/index differ in dimension %d", op, k);
  if (kc_numel(src) == 0) return TPURT_OK;
  iadd_args a;
  memset(&a, 0, sizeof a);
  a.self = *self;
  a.index = *index;
  a.src = *src;
  a.dim = dim;
  a.alpha = alpha;
  a.skip = skip_index;
  a.scale_by_freq = scale_by_freq;
  return tpurt_launch(s, op, k_index_add, &a, sizeof a);
}

/* ---------------------------------------------------- advanced indexing */

#define MAX_IDX (KC_MAXOPS - 2)
typedef struct {
  tpurt_view data, other; /* index: data = src, other = out; put: data = dst, other = values */
  tpurt_view idx[MAX_IDX];
  int nidx, put, accumulate;
  int64_t sizes[MAX_IDX], strides[MAX_IDX];
} adv_args;

typedef struct {
  adv_args *a;
  kc_iter it; /* other, data, idx... */
  char *base[KC_MAXOPS];
  kc_err err;
} adv_ctx;

static void adv_chunk(void *c, int64_t b, int64_t e) {
  adv_ctx *x = c;
  adv_args *a = x->a;
  tpurt_dtype dt = a->data.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int nops = 2 + a->nidx, nd = x->it.ndim;
  int64_t inner = kc_iter_inner(&x->it);
  int64_t off[KC_MAXOPS];
  int isint = is_int_dtype(dt);
  for (int64_t r = b; r < e; r++) {
    kc_iter_row(&x->it, r, off);
    for (int64_t i = 0; i < inner; i++) {
      int64_t doff = 0;
      for (int k = 0; k < a->nidx; k++) {
        int64_t v = kc_ld_idx(a->idx[k].dtype, x->base[2 + k] + off[2 + k] + i * x->it.str[2 + k][nd - 1]);
        int64_t sz = a->sizes[k];
        if (v < -sz || v >= sz) {
          kc_err_index(&x->err, "index %" PRId64 " is out of bounds for dimension %d with size %" PRId64, v, k, sz);
          return;
        }
        if (v < 0) v += sz;
        doff += v * a->strides[k];
      }
      char *o = x->base[0] + off[0] + i * x->it.str[0][nd - 1];
      char *d = x->base[1] + off[1] + i * x->it.str[1][nd - 1] + doff * es;
      if (!a->put) {
        kc_move(o, d, es);
      } else if (!a->accumulate) {
        kc_move(d, o, es);
      } else if (isint) {
        kc_sti(dt, d, (int64_t)((uint64_t)kc_ldi(dt, d) + (uint64_t)kc_ldi(dt, o)));
      } else if (dt == TPURT_F32) {
        float dv, ov;
        memcpy(&dv, d, 4);
        memcpy(&ov, o, 4);
        dv += ov;
        memcpy(d, &dv, 4);
      } else {
        kc_st(dt, d, kc_ld(dt, d) + kc_ld(dt, o));
      }
    }
  }
  (void)nops;
}

static tpurt_status k_adv(void *p, char *err, size_t errlen) {
  adv_args *a = p;
  adv_ctx *x = malloc(sizeof *x);
  if (!x) return TPURT_ERR_OUT_OF_MEMORY;
  x->a = a;
  const tpurt_view *vs[KC_MAXOPS];
  vs[0] = &a->other;
  vs[1] = &a->data;
  for (int k = 0; k < a->nidx; k++) vs[2 + k] = &a->idx[k];
  int nops = 2 + a->nidx;
  const tpurt_view *shape = a->put ? &a->data : &a->other;
  kc_iter_init(&x->it, nops, vs, shape);
  for (int o = 0; o < nops; o++) x->base[o] = tpurt__host_view(vs[o]->ptr);
  atomic_init(&x->err.set, 0);
  int64_t rows = kc_iter_rows(&x->it), inner = kc_iter_inner(&x->it);
  if (a->put && a->accumulate)
    adv_chunk(x, 0, rows); /* duplicates accumulate in order */
  else
    tpurt_parallel_for(rows, KC_GRAIN / inner + 1, adv_chunk, x);
  tpurt_status st = kc_err_finish(&x->err, TPURT_ERR_INDEX, err, errlen);
  free(x);
  return st;
}

static tpurt_status launch_adv(tpurt_stream *s, const char *op, const tpurt_view *data, const tpurt_view *other,
                               const tpurt_view *idx, int nidx, const int64_t *sizes, const int64_t *strides, int put,
                               int accumulate) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if (!data || !other || (nidx > 0 && (!idx || !sizes || !strides)))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
  if (nidx < 0 || nidx > MAX_IDX)
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: at most %d index tensors are supported, got %d", op, MAX_IDX,
                      nidx);
  if ((st = stream_for(&s, data))) return st;
  const tpurt_view *shape = put ? data : other;
  if (put && !same_shape(data, other))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: values must be broadcast to the iteration shape", op);
  if ((st = kc_check(s->dev, other, op, put ? "values" : "out"))) return st;
  if (data->dtype != other->dtype) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: dtypes differ", op);
  if (put && accumulate && kc_is_complex(data->dtype))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: accumulate of complex tensors is not supported", op);
  for (int k = 0; k < nidx; k++) {
    if ((st = kc_check(s->dev, &idx[k], op, "indices"))) return st;
    if (!kc_is_index_dtype(idx[k].dtype) || !same_shape(&idx[k], shape))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: index %d must be int64/int32 of the iteration shape", op, k);
  }
  if (kc_numel(shape) == 0) return TPURT_OK;
  /* data extent: the strided view plus the indexed region */
  tpurt_view ext = *data;
  ext.ndim = data->ndim + nidx;
  if (ext.ndim > TPURT_MAX_DIMS) return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: too many dimensions", op);
  for (int k = 0; k < nidx; k++) {
    if (sizes[k] <= 0) return tpurt__err(TPURT_ERR_INDEX, "index is out of bounds for dimension %d with size 0", k);
    ext.sizes[data->ndim + k] = sizes[k];
    ext.strides[data->ndim + k] = strides[k];
  }
  if ((st = kc_check(s->dev, &ext, op, put ? "self" : "src"))) return st;
  adv_args *a = calloc(1, sizeof *a);
  if (!a) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
  a->data = *data;
  a->other = *other;
  for (int k = 0; k < nidx; k++) {
    a->idx[k] = idx[k];
    a->sizes[k] = sizes[k];
    a->strides[k] = strides[k];
  }
  a->nidx = nidx;
  a->put = put;
  a->accumulate = accumulate;
  st = tpurt_launch(s, op, k_adv, a, sizeof *a);
  free(a);
  return st;
}

tpurt_status tpurt_index(tpurt_stream *s, const tpurt_view *out, const tpurt_view *src, const tpurt_view *idx,
                         int nidx, const int64_t *sizes, const int64_t *strides) {
  if (out && src && !same_shape(out, src))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "index: src must be restrided to out's shape");
  return launch_adv(s, "index", src, out, idx, nidx, sizes, strides, 0, 0);
}

tpurt_status tpurt_index_put(tpurt_stream *s, const tpurt_view *dst, const tpurt_view *values, const tpurt_view *idx,
                             int nidx, const int64_t *sizes, const int64_t *strides, int accumulate) {
  return launch_adv(s, "index_put_", dst, values, idx, nidx, sizes, strides, 1, accumulate);
}

/* ------------------------------------------------------------- nonzero */

static int is_nz(tpurt_dtype dt, const char *p) {
  switch (dt) {
    case TPURT_F32: { float v; memcpy(&v, p, 4); return v != 0; }
    case TPURT_F64: { double v; memcpy(&v, p, 8); return v != 0; }
    case TPURT_F16: case TPURT_BF16: { uint16_t v; memcpy(&v, p, 2); return (v & 0x7fff) != 0; }
    case TPURT_C64: { float v[2]; memcpy(v, p, 8); return v[0] != 0 || v[1] != 0; }
    case TPURT_C128: { double v[2]; memcpy(v, p, 16); return v[0] != 0 || v[1] != 0; }
    default: {
      size_t n = tpurt_dtype_size(dt);
      for (size_t i = 0; i < n; i++)
        if (p[i]) return 1;
      return 0;
    }
  }
}

typedef struct {
  tpurt_view out, in;
  int count_only;
} nz_args;

typedef struct {
  const tpurt_view *in;
  const char *base;
  int64_t *counts; /* per chunk */
  int64_t chunk;
} nzc_ctx;

/* the dtypes of the typed passes, each with its test of element p[l] */
#define NZ_DTYPES(X)                                                        \
  case TPURT_F32: X(float, p[l] != 0); break;                              \
  case TPURT_F64: X(double, p[l] != 0); break;                             \
  case TPURT_F16: case TPURT_BF16: X(uint16_t, (p[l] & 0x7fff) != 0); break; \
  case TPURT_I64: X(int64_t, p[l] != 0); break;                            \
  case TPURT_I32: X(int32_t, p[l] != 0); break;                            \
  case TPURT_I16: X(int16_t, p[l] != 0); break;                            \
  case TPURT_I8: case TPURT_U8: case TPURT_BOOL: X(uint8_t, p[l] != 0); break;

/* nonzeros of elements [b, e) of a contiguous view of a real dtype, in a
 * loop per element size the compiler vectorizes (floats: -0.0 is zero,
 * NaN is not; 16-bit floats by their bits but the sign); -1 for the others */
static int64_t nz_count_dense(tpurt_dtype dt, const char *base, int64_t b, int64_t e) {
  int64_t cnt = 0;
#define NZ_COUNT(T, TEST)                                  \
  do {                                                     \
    const T *p = (const T *)base;                          \
    for (int64_t l = b; l < e; l++) cnt += (TEST) ? 1 : 0; \
  } while (0)
  switch (dt) {
    NZ_DTYPES(NZ_COUNT)
    default: return -1;
  }
#undef NZ_COUNT
  return cnt;
}

/* the writing pass over a contiguous view: a typed test an element, the
 * coordinates of each nonzero from its linear index (none to compute for a
 * vector); -1 for the dtypes nz_count_dense leaves to the generic walk */
static int64_t nz_write_dense(const tpurt_view *v, const char *base, int64_t b, int64_t e, int64_t *out,
                              int64_t rs, int64_t cs) {
  int nd = v->ndim;
  int64_t cnt = 0;
#define NZ_WRITE(T, TEST)                                                        \
  do {                                                                           \
    const T *p = (const T *)base;                                                \
    if (nd == 1) {                                                               \
      for (int64_t l = b; l < e; l++)                                            \
        if (TEST) out[cnt++ * rs] = l;                                           \
    } else {                                                                     \
      for (int64_t l = b; l < e; l++)                                            \
        if (TEST) {                                                              \
          int64_t r = l;                                                         \
          for (int k = nd - 1; k >= 0; k--) {                                    \
            out[cnt * rs + k * cs] = r % v->sizes[k];                            \
            r /= v->sizes[k];                                                    \
          }                                                                      \
          cnt++;                                                                 \
        }                                                                        \
    }                                                                            \
  } while (0)
  switch (v->dtype) {
    NZ_DTYPES(NZ_WRITE)
    default: return -1;
  }
#undef NZ_WRITE
  return cnt;
}

static int64_t nz_range(const tpurt_view *v, const char *base, int64_t b, int64_t e, int64_t *out_rows,
                        int64_t row_stride, int64_t col_stride) {
  int nd = v->ndim, dense = kc_dense(v);
  if (dense) {
    int64_t c = out_rows ? nz_write_dense(v, base, b, e, out_rows, row_stride, col_stride)
                         : nz_count_dense(v->dtype, base, b, e);
    if (c >= 0) return c;
  }
  int64_t coord[TPURT_MAX_DIMS];
  kc_unravel(b, nd, v->sizes, coord);
  int64_t es = (int64_t)tpurt_dtype_size(v->dtype), cnt = 0;
  for (int64_t l = b; l < e; l++) {
    int64_t off = 0;
    if (dense)
      off = l;
    else
      for (int k = 0; k < nd; k++) off += coord[k] * v->strides[k];
    if (is_nz(v->dtype, base + off * es)) {
      if (out_rows)
        for (int k = 0; k < nd; k++) out_rows[cnt * row_stride + k * col_stride] = coord[k];
      cnt++;
    }
    for (int k = nd - 1; k >= 0; k--) {
      if (++coord[k] < v->sizes[k]) break;
      coord[k] = 0;
    }
  }
  return cnt;
}

static void nzc_chunk(void *c, int64_t b, int64_t e) {
  nzc_ctx *x = c;
  int64_t n = kc_numel(x->in);
  for (int64_t ch = b; ch < e; ch++) {
    int64_t lo = ch * x->chunk, hi = lo + x->chunk < n ? lo + x->chunk : n;
    x->counts[ch] = nz_range(x->in, x->base, lo, hi, NULL, 0, 0);
  }
}

typedef struct {
  nzc_ctx *c;
  int64_t *prefix;
  int64_t *out;
  int64_t rs, cs, cap;
} nzw_ctx;

static void nzw_chunk(void *c, int64_t b, int64_t e) {
  nzw_ctx *x = c;
  int64_t n = kc_numel(x->c->in);
  for (int64_t ch = b; ch < e; ch++) {
    int64_t lo = ch * x->c->chunk, hi = lo + x->c->chunk < n ? lo + x->c->chunk : n;
    if (x->prefix[ch] + x->c->counts[ch] > x->cap) continue; /* fewer rows than nonzeros: skip overflow */
    nz_range(x->c->in, x->c->base, lo, hi, x->out + x->prefix[ch] * x->rs, x->rs, x->cs);
  }
}

static tpurt_status k_nonzero(void *p, char *err, size_t errlen) {
  nz_args *a = p;
  int64_t n = kc_numel(&a->in);
  nzc_ctx c;
  c.in = &a->in;
  c.base = tpurt__host_view(a->in.ptr);
  c.chunk = 65536;
  int64_t nch = (n + c.chunk - 1) / c.chunk;
  if (nch == 0) nch = 1;
  c.counts = calloc((size_t)nch, sizeof(int64_t));
  int64_t *prefix = calloc((size_t)nch, sizeof(int64_t));
  if (!c.counts || !prefix) {
    free(c.counts);
    free(prefix);
    snprintf(err, errlen, "out of host memory");
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  if (n > 0) tpurt_parallel_for(nch, 1, nzc_chunk, &c);
  int64_t total = 0;
  for (int64_t i = 0; i < nch; i++) {
    prefix[i] = total;
    total += c.counts[i];
  }
  if (a->count_only) {
    int64_t *o = tpurt__host_view(a->out.ptr);
    *o = total;
  } else if (n > 0 && a->out.sizes[0] > 0) {
    int64_t cap = a->out.sizes[0];
    nzw_ctx w = {&c, prefix, tpurt__host_view(a->out.ptr), a->out.strides[0], a->out.ndim > 1 ? a->out.strides[1] : 1,
                 cap};
    if (a->in.ndim > 0) tpurt_parallel_for(nch, 1, nzw_chunk, &w);
  }
  free(c.counts);
  free(prefix);
  return TPURT_OK;
}

tpurt_status tpurt_count_nonzero(tpurt_stream *s, const tpurt_view *count, const tpurt_view *in) {
  TPURT__INIT_OR_RETURN();
  const char *op = "nonzero";
  tpurt_status st;
  if (!count || !in) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, count))) return st;
  if ((st = kc_check(s->dev, count, op, "count")) || (st = kc_check(s->dev, in, op, "input"))) return st;
  if (count->ndim != 0 || count->dtype != TPURT_I64)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: count must be a 0-D int64 view", op);
  nz_args a;
  memset(&a, 0, sizeof a);
  a.out = *count;
  a.in = *in;
  a.count_only = 1;
  return tpurt_launch(s, op, k_nonzero, &a, sizeof a);
}

tpurt_status tpurt_nonzero(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in) {
  TPURT__INIT_OR_RETURN();
  const char *op = "nonzero";
  tpurt_status st;
  if (!out || !in) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, out))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, in, op, "input"))) return st;
  if (out->ndim != 2 || out->dtype != TPURT_I64 || out->sizes[1] != in->ndim)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out must be int64 [n, %d]", op, in->ndim);
  if (kc_numel(out) == 0) return TPURT_OK;
  nz_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.in = *in;
  return tpurt_launch(s, op, k_nonzero, &a, sizeof a);
}

/* ---------------------------------------------------------- tril, triu */

typedef struct {
  tpurt_view out, in;
  int64_t diag;
  int upper;
} tril_args;

typedef struct {
  tril_args *a;
  char *o;
  const char *i;
} tril_ctx;

static int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* the columns [*lo, *hi) of row i (of nrow x ncol) in the lower (upper = 0)
 * or upper triangle of diagonal k: tril / triu keep them, tril_indices /
 * triu_indices list them; k of any int64 (clamped first: no overflow) */
static void tri_row_cols(int upper, int64_t i, int64_t k, int64_t nrow, int64_t ncol, int64_t *lo, int64_t *hi) {
  int64_t lim = i + (k > ncol ? ncol : k < -nrow - 1 ? -nrow - 1 : k);
  *lo = upper ? clamp_i64(lim, 0, ncol) : 0;
  *hi = upper ? ncol : clamp_i64(lim + 1, 0, ncol);
}

static void tril_chunk(void *c, int64_t b, int64_t e) {
  tril_ctx *x = c;
  tril_args *a = x->a;
  int nd = a->out.ndim, es = (int)tpurt_dtype_size(a->out.dtype);
  int64_t M = a->out.sizes[nd - 2], N = a->out.sizes[nd - 1];
  int64_t coord[TPURT_MAX_DIMS];
  int64_t ocs = a->out.strides[nd - 1] * es, ics = a->in.strides[nd - 1] * es;
  for (int64_t r = b; r < e; r++) {
    kc_unravel(r, nd - 1, a->out.sizes, coord); /* batch dims + row */
    int64_t oo = 0, io = 0;
    for (int k = 0; k < nd - 1; k++) {
      oo += coord[k] * a->out.strides[k];
      io += coord[k] * a->in.strides[k];
    }
    int64_t row = coord[nd - 2];
    char *op = x->o + oo * es;
    const char *ip = x->i + io * es;
    /* the row's kept columns [k0, k1), zeros on either side of them */
    int64_t k0, k1;
    tri_row_cols(a->upper, row, a->diag, M, N, &k0, &k1);
    if (ocs == es && ics == es) {
      memset(op, 0, (size_t)(k0 * es));
      if (op != ip && k1 > k0) memmove(op + k0 * es, ip + k0 * es, (size_t)((k1 - k0) * es));
      memset(op + k1 * es, 0, (size_t)((N - k1) * es));
      continue;
    }
    for (int64_t j = 0; j < k0; j++) memset(op + j * ocs, 0, (size_t)es);
    if (op != ip)
      for (int64_t j = k0; j < k1; j++) kc_move(op + j * ocs, ip + j * ics, es);
    for (int64_t j = k1; j < N; j++) memset(op + j * ocs, 0, (size_t)es);
  }
}

static tpurt_status k_tril(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  tril_args *a = p;
  tril_ctx x = {a, tpurt__host_view(a->out.ptr), tpurt__host_view(a->in.ptr)};
  int nd = a->out.ndim;
  int64_t rows = kc_numel(&a->out) / a->out.sizes[nd - 1];
  tpurt_parallel_for(rows, KC_GRAIN / a->out.sizes[nd - 1] + 1, tril_chunk, &x);
  return TPURT_OK;
}

tpurt_status tpurt_tril(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, int64_t diagonal, int upper) {
  TPURT__INIT_OR_RETURN();
  const char *op = upper ? "triu" : "tril";
  tpurt_status st;
  if (!out || !in) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = stream_for(&s, out))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, in, op, "input"))) return st;
  if (!same_shape(out, in) || out->ndim < 2 || out->dtype != in->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: input must have at least 2 dimensions and out its shape", op);
  if (kc_numel(out) == 0) return TPURT_OK;
  tril_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.in = *in;
  a.diag = diagonal;
  a.upper = upper;
  return tpurt_launch(s, op, k_tril, &a, sizeof a);
}

/* ------------------------------------------------------------- padding */

typedef struct {
  tpurt_view out, in; /* forward: out padded; backward: out = grad_out, in = grad_in */
  int mode, npad;
  int64_t pads[6];
} pad_args;

static inline int64_t pad_map(int mode, int64_t o, int64_t before, int64_t n) {
  int64_t i = o - before;
  if (mode == TPURT_PAD_REPLICATE) return i < 0 ? 0 : i >= n ? n - 1 : i;
  if (n == 1) return 0;
  int64_t period = 2 * (n - 1);
  i = i % period;
  if (i < 0) i += period;
  return i < n ? i : period - i;
}

typedef struct {
  pad_args *a;
  char *o, *i;
  int backward;
} pad_ctx;

/* forward: parallel over output rows */
static void pad_fwd_chunk(void *c, int64_t b, int64_t e) {
  pad_ctx *x = c;
  pad_args *a = x->a;
  int nd = a->out.ndim, es = (int)tpurt_dtype_size(a->out.dtype), first = nd - a->npad;
  int64_t coord[TPURT_MAX_DIMS];
  int64_t N = a->out.sizes[nd - 1];
  int64_t nin = a->in.sizes[nd - 1], before = a->pads[2 * (a->npad - 1)];
  for (int64_t r = b; r < e; r++) {
    kc_unravel(r, nd - 1, a->out.sizes, coord);
    int64_t oo = 0, io = 0;
    for (int k = 0; k < nd - 1; k++) {
      int64_t ic = coord[k];
      if (k >= first) ic = pad_map(a->mode, coord[k], a->pads[2 * (k - first)], a->in.sizes[k]);
      oo += coord[k] * a->out.strides[k];
      io += ic * a->in.strides[k];
    }
    for (int64_t j = 0; j < N; j++) {
      int64_t ij = pad_map(a->mode, j, before, nin);
      kc_move(x->o + (oo + j * a->out.strides[nd - 1]) * es, x->i + (io + ij * a->in.strides[nd - 1]) * es, es);
    }
  }
}

/* backward: parallel over planes (dims before the padded ones) */
static void pad_bwd_chunk(void *c, int64_t b, int64_t e) {
  pad_ctx *x = c;
  pad_args *a = x->a;
  int nd = a->out.ndim, first = nd - a->npad;
  tpurt_dtype dt = a->out.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int64_t pcoord[TPURT_MAX_DIMS], coord[TPURT_MAX_DIMS];
  int64_t inner = 1;
  for (int k = first; k < nd; k++) inner *= a->out.sizes[k];
  for (int64_t pl = b; pl < e; pl++) {
    kc_unravel(pl, first, a->out.sizes, pcoord);
    int64_t go0 = 0, gi0 = 0;
    for (int k = 0; k < first; k++) {
      go0 += pcoord[k] * a->out.strides[k];
      gi0 += pcoord[k] * a->in.strides[k];
    }
    for (int64_t l = 0; l < inner; l++) {
      kc_unravel(l, a->npad, a->out.sizes + first, coord);
      int64_t go = go0, gi = gi0;
      for (int k = 0; k < a->npad; k++) {
        go += coord[k] * a->out.strides[first + k];
        gi += pad_map(a->mode, coord[k], a->pads[2 * k], a->in.sizes[first + k]) * a->in.strides[first + k];
      }
      char *d = x->i + gi * es;
      const char *g = x->o + go * es;
      kc_st(dt, d, kc_ld(dt, d) + kc_ld(dt, g));
    }
  }
}

static tpurt_status k_pad(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  pad_args *a = p;
  pad_ctx x = {a, tpurt__host_view(a->out.ptr), tpurt__host_view(a->in.ptr), 0};
  int nd = a->out.ndim;
  int64_t rows = kc_numel(&a->out) / a->out.sizes[nd - 1];
  tpurt_parallel_for(rows, KC_GRAIN / a->out.sizes[nd - 1] + 1, pad_fwd_chunk, &x);
  return TPURT_OK;
}

static tpurt_status k_pad_bwd(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  pad_args *a = p;
  pad_ctx x = {a, tpurt__host_view(a->out.ptr), tpurt__host_view(a->in.ptr), 1};
  /* zero grad_in */
  tpurt_dtype dt = a->in.dtype;
  int64_t n = kc_numel(&a->in), coord[TPURT_MAX_DIMS];
  int es = (int)tpurt_dtype_size(dt);
  for (int64_t l = 0; l < n; l++) {
    kc_unravel(l, a->in.ndim, a->in.sizes, coord);
    int64_t off = 0;
    for (int k = 0; k < a->in.ndim; k++) off += coord[k] * a->in.strides[k];
    memset(x.i + off * es, 0, (size_t)es);
  }
  int first = a->out.ndim - a->npad;
  int64_t planes = 1;
  for (int k = 0; k < first; k++) planes *= a->out.sizes[k];
  tpurt_parallel_for(planes, 1, pad_bwd_chunk, &x);
  return TPURT_OK;
}

static tpurt_status pad_check(tpurt_stream **s, const char *op, const tpurt_view *out, const tpurt_view *in, int mode,
                              int npad, const int64_t *pads) {
  tpurt_status st;
  if (!out || !in || !pads) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
  if ((st = stream_for(s, out))) return st;
  if ((st = kc_check((*s)->dev, out, op, "out")) || (st = kc_check((*s)->dev, in, op, "input"))) return st;
  if (npad < 1 || npad > 3 || out->ndim != in->ndim || out->ndim < npad || out->dtype != in->dtype ||
      (unsigned)mode > TPURT_PAD_REPLICATE)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad arguments", op);
  int first = out->ndim - npad;
  for (int k = 0; k < out->ndim; k++) {
    int64_t want = in->sizes[k];
    if (k >= first) {
      want += pads[2 * (k - first)] + pads[2 * (k - first) + 1];
      if (in->sizes[k] == 0 && want > 0)
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: cannot pad an empty dimension", op);
      if (mode == TPURT_PAD_REFLECT &&
          (pads[2 * (k - first)] >= in->sizes[k] || pads[2 * (k - first) + 1] >= in->sizes[k]))
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: padding must be smaller than the input dimension", op);
    }
    if (out->sizes[k] != want)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out size %" PRId64 " != %" PRId64 " in dimension %d", op,
                        out->sizes[k], want, k);
  }
  return TPURT_OK;
}

tpurt_status tpurt_pad(tpurt_stream *s, const tpurt_view *out, const tpurt_view *in, tpurt_pad_mode mode, int npad,
                       const int64_t *pads) {
  TPURT__INIT_OR_RETURN();
  const char *op = mode == TPURT_PAD_REFLECT ? "reflection_pad" : "replication_pad";
  tpurt_status st = pad_check(&s, op, out, in, mode, npad, pads);
  if (st) return st;
  if (kc_numel(out) == 0) return TPURT_OK;
  pad_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.in = *in;
  a.mode = mode;
  a.npad = npad;
  for (int k = 0; k < 2 * npad; k++) a.pads[k] = pads[k];
  return tpurt_launch(s, op, k_pad, &a, sizeof a);
}

tpurt_status tpurt_pad_backward(tpurt_stream *s, const tpurt_view *grad_in, const tpurt_view *grad_out,
                                tpurt_pad_mode mode, int npad, const int64_t *pads) {
  TPURT__INIT_OR_RETURN();
  const char *op = mode == TPURT_PAD_REFLECT ? "reflection_pad_backward" : "replication_pad_backward";
  tpurt_status st = pad_check(&s, op, grad_out, grad_in, mode, npad, pads);
  if (st) return st;
  if (kc_numel(grad_in) == 0) return TPURT_OK;
  if (kc_is_complex(grad_in->dtype) || !kc_is_float(grad_in->dtype))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: only floating dtypes", op);
  pad_args a;
  memset(&a, 0, sizeof a);
  a.out = *grad_out;
  a.in = *grad_in;
  a.mode = mode;
  a.npad = npad;
  for (int k = 0; k < 2 * npad; k++) a.pads[k] = pads[k];
  return tpurt_launch(s, op, k_pad_bwd, &a, sizeof a);
}

/* ---------------------------------------------------- arange, linspace */

typedef struct {
  tpurt_view out;
  int isint, lin;
  int64_t istart, istep;
  double start, step, end;
} range_args;

typedef struct {
  range_args *a;
  char *o;
} range_ctx;

static void range_chunk(void *c, int64_t b, int64_t e) {
  range_ctx *x = c;
  range_args *a = x->a;
  tpurt_dtype dt = a->out.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int64_t st = a->out.strides[0] * es, n = a->out.sizes[0];
  if (a->isint) {
    for (int64_t i = b; i < e; i++) kc_sti(dt, x->o + i * st, a->istart + i * a->istep);
    return;
  }
  if (dt == TPURT_F32 && st == 4 && !a->lin) {
    float *o = (float *)x->o;
    for (int64_t i = b; i < e; i++) o[i] = (float)(a->start + (double)i * a->step);
    return;
  }
  for (int64_t i = b; i < e; i++) {
    double v;
    if (!a->lin || i < n / 2)
      v = a->start + (double)i * a->step;
    else
      v = a->end - (double)(n - 1 - i) * a->step;
    kc_st(dt, x->o + i * st, v);
  }
}

static tpurt_status k_range(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  range_args *a = p;
  range_ctx x = {a, tpurt__host_view(a->out.ptr)};
  tpurt_parallel_for(a->out.sizes[0], KC_GRAIN, range_chunk, &x);
  return TPURT_OK;
}

static tpurt_status range_launch(tpurt_stream *s, const char *op, range_args *a) {
  tpurt_status st;
  if ((st = stream_for(&s, &a->out))) return st;
  if ((st = kc_check(s->dev, &a->out, op, "out"))) return st;
  if (a->out.ndim != 1) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out must be 1-D", op);
  if (kc_is_complex(a->out.dtype)) return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: complex is not supported", op);
  if (a->out.sizes[0] == 0) return TPURT_OK;
  return tpurt_launch(s, op, k_range, a, sizeof *a);
}

tpurt_status tpurt_arange(tpurt_stream *s, const tpurt_view *out, tpurt_scalar start, tpurt_scalar step) {
  TPURT__INIT_OR_RETURN();
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "arange: NULL view");
  range_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  int fl = kc_is_float(out->dtype);
  a.isint = !fl;
  if (fl) {
    a.start = start.kind == TPURT_SCALAR_FLOAT || start.kind == TPURT_SCALAR_COMPLEX ? start.re : (double)start.i;
    a.step = step.kind == TPURT_SCALAR_FLOAT || step.kind == TPURT_SCALAR_COMPLEX ? step.re : (double)step.i;
  } else {
    a.istart = start.kind == TPURT_SCALAR_FLOAT ? (int64_t)start.re : start.i;
    a.istep = step.kind == TPURT_SCALAR_FLOAT ? (int64_t)step.re : step.i;
  }
  return range_launch(s, "arange", &a);
}

/* ------------------------------------------------- triangle indices
 *
 * Row i of a row x col matrix holds lower-triangle (offset k) columns
 * [0, clamp(i + k + 1, 0, col)) and upper-triangle columns
 * [clamp(i + k, 0, col), col). Counts and each row's first output position
 * are sums of clamp(i + c, 0, col) over rows: an arithmetic series between
 * two flat parts, in closed form (no loop over rows). */

/* sum over i in [0, rows) of clamp(i + c, 0, col) */
static int64_t ramp_sum(int64_t rows, int64_t col, int64_t c) {
  if (rows <= 0 || col <= 0) return 0;
  /* c may be any int64: keep the row bounds in 128 bits */
  __int128 a = -(__int128)c, b = (__int128)col - c; /* i + c <= 0 below a, >= col from b */
  a = a < 0 ? 0 : a > rows ? rows : a;
  b = b < a ? a : b > rows ? rows : b;
  __int128 n = b - a, series = n * (a + b - 1 + 2 * (__int128)c) / 2;
  return (int64_t)(series + ((__int128)rows - b) * col);
}

int64_t tpurt_tri_indices_count(int64_t row, int64_t col, int64_t offset, int upper) {
  if (row <= 0 || col <= 0) return 0;
  return upper ? (int64_t)((__int128)row * col - ramp_sum(row, col, offset)) : ramp_sum(row, col, offset + 1);
}

typedef struct {
  tpurt_view out;
  int64_t row, col, offset;
  int upper;
} tri_args;

typedef struct {
  const tri_args *a;
  char *o;
  int64_t r0; /* first row with an element */
} tri_ctx;

/* rows r0 + [b, e) */
static void tri_rows(void *c, int64_t b, int64_t e) {
  const tri_ctx *x = c;
  const tri_args *a = x->a;
  b += x->r0;
  e += x->r0;
  tpurt_dtype dt = a->out.dtype;
  int64_t es = (int64_t)tpurt_dtype_size(dt), s0 = a->out.strides[0] * es, s1 = a->out.strides[1] * es;
  int64_t p = tpurt_tri_indices_count(b, a->col, a->offset, a->upper); /* elements of rows [0, b) */
  for (int64_t i = b; i < e; i++) {
    int64_t lo, hi;
    tri_row_cols(a->upper, i, a->offset, a->row, a->col, &lo, &hi);
    for (int64_t j = lo; j < hi; j++, p++) {
      kc_sti(dt, x->o + p * s1, i);
      kc_sti(dt, x->o + s0 + p * s1, j);
    }
  }
}

static tpurt_status k_tri(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  const tri_args *a = p;
  /* rows that hold at least one element */
  int64_t r0 = a->upper ? 0 : clamp_i64(-a->offset, 0, a->row);
  int64_t r1 = a->upper ? clamp_i64(a->col - a->offset, 0, a->row) : a->row;
  tri_ctx x = {a, tpurt__host_view(a->out.ptr), r0};
  if (r1 > r0) tpurt_parallel_for(r1 - r0, KC_GRAIN / (a->col + 1) + 1, tri_rows, &x);
  return TPURT_OK;
}

tpurt_status tpurt_tri_indices(tpurt_stream *s, const tpurt_view *out, int64_t row, int64_t col, int64_t offset,
                               int upper) {
  TPURT__INIT_OR_RETURN();
  const char *op = upper ? "triu_indices" : "tril_indices";
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if (row < 0 || col < 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must be non-negative, got %" PRId64, op,
                      row < 0 ? "row" : "col", row < 0 ? row : col);
  tpurt_status st;
  if ((st = stream_for(&s, out))) return st;
  if ((st = kc_check(s->dev, out, op, "out"))) return st;
  int64_t n = tpurt_tri_indices_count(row, col, offset, upper);
  if (out->ndim != 2 || out->sizes[0] != 2 || out->sizes[1] != n || (out->dtype != TPURT_I64 && out->dtype != TPURT_I32))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out must be int32 or int64 of shape [2, %" PRId64 "]", op, n);
  if (n == 0) return TPURT_OK;
  tri_args a = {*out, row, col, offset, upper};
  return tpurt_launch(s, op, k_tri, &a, sizeof a);
}

tpurt_status tpurt_linspace(tpurt_stream *s, const tpurt_view *out, double start, double end) {
  TPURT__INIT_OR_RETURN();
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "linspace: NULL view");
  range_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  int64_t n = out->ndim == 1 ? out->sizes[0] : 0;
  a.lin = 1;
  a.start = start;
  a.end = end;
  a.step = n > 1 ? (end - start) / (double)(n - 1) : 0;
  if (!kc_is_float(out->dtype)) {
    /* integer linspace: computed in double, truncated */
    a.isint = 0;
  }
  return range_launch(s, "linspace", &a);
}
