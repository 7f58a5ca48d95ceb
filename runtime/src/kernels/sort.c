/*
 * sort.c — stable sort along a dim (values + int64 indices), topk and the
 * run-length pass of unique over sorted data.
 *
 * Each line (all positions but dim) is loaded into a (key, index) buffer,
 * sorted stably — by an LSD radix sort from 512 elements on, else merge-
 * sorted — and written back; lines are spread over the pool. topk of a few
 * entries selects them instead (kselect.h). Float keys order NaN above +inf
 * (PyTorch's convention).
 */
#include "gemm_internal.h" /* tpurt__scratch */
#include "kcommon.h"
#include "kselect.h"

typedef struct {
  double k;
  int64_t i;
} fkey;
typedef struct {
  int64_t k;
  int64_t i;
} ikey;

/* a strictly before b in ascending order (NaN last) */
#define F_LT(a, b) (!isnan((a).k) && (isnan((b).k) || (a).k < (b).k))
#define F_GT(a, b) F_LT(b, a)
#define I_LT(a, b) ((a).k < (b).k)
#define I_GT(a, b) ((b).k < (a).k)

#define DEF_MSORT(NAME, T, BEFORE)                                                \
  DEF_ISORT(NAME##_isort, T, BEFORE)                                              \
  static void NAME(T *a, T *tmp, int64_t n) {                                    \
    /* bottom-up merge sort with insertion-sorted runs of 16 */                  \
    const int64_t RUN = 16;                                                       \
    for (int64_t lo = 0; lo < n; lo += RUN) NAME##_isort(a, lo, lo + RUN < n ? lo + RUN : n); \
    T *src = a, *dst = tmp;                                                       \
    for (int64_t w = RUN; w < n; w *= 2) {                                        \
      for (int64_t lo = 0; lo < n; lo += 2 * w) {                                 \
        int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n; \
        int64_t i = lo, j = mid, k = lo;                                          \
        while (i < mid && j < hi) dst[k++] = BEFORE(src[j], src[i]) ? src[j++] : src[i++]; \
        while (i < mid) dst[k++] = src[i++];                                      \
        while (j < hi) dst[k++] = src[j++];                                       \
      }                                                                           \
      T *t = src;                                                                 \
      src = dst;                                                                  \
      dst = t;                                                                    \
    }                                                                             \
    if (src != a) memcpy(a, src, (size_t)n * sizeof(T));                          \
  }
DEF_MSORT(msort_f_asc, fkey, F_LT)
DEF_MSORT(msort_f_desc, fkey, F_GT)
DEF_MSORT(msort_i_asc, ikey, I_LT)
DEF_MSORT(msort_i_desc, ikey, I_GT)

/* topk with k well below the line's length: the k first of the stable
 * sort's order (ties by position) selected, then only they sorted — the
 * same k entries, in the same order, in O(n + k log k) (1M floats, k = 100:
 * a whole stable sort took ~130 ms) */
#define F_LT_T(a, b) (F_LT(a, b) || (!F_LT(b, a) && (a).i < (b).i))
#define F_GT_T(a, b) (F_GT(a, b) || (!F_GT(b, a) && (a).i < (b).i))
#define I_LT_T(a, b) (I_LT(a, b) || (!I_LT(b, a) && (a).i < (b).i))
#define I_GT_T(a, b) (I_GT(a, b) || (!I_GT(b, a) && (a).i < (b).i))
DEF_KSELECT(ksel_f_asc, fkey, F_LT_T)
DEF_KSELECT(ksel_f_desc, fkey, F_GT_T)
DEF_KSELECT(ksel_i_asc, ikey, I_LT_T)
DEF_KSELECT(ksel_i_desc, ikey, I_GT_T)
#define TOPK_SELECTS(k, n) ((k) > 0 && (k) <= (n) / 4)

/* order_S(k, tmp, n, kk, desc): the kk first of the line's n keys in order
 * in k[0, kk) — by the bounded heap or a selection (topk), else the whole
 * line merge-sorted (tmp: scratch) */
#define DEF_ORDER(S)                                                                    \
  static void order_##S(S##key *k, S##key *tmp, int64_t n, int64_t kk, int desc) {      \
    if (KSELECT_BY_HEAP(kk, n)) {                                                       \
      if (desc)                                                                         \
        ksel_##S##_desc_first(k, n, kk);                                                \
      else                                                                              \
        ksel_##S##_asc_first(k, n, kk);                                                 \
    } else if (TOPK_SELECTS(kk, n)) {                                                   \
      if (desc) {                                                                       \
        ksel_##S##_desc(k, n, kk - 1);                                                  \
        ksel_##S##_desc_heapsort(k, 0, kk - 1);                                         \
      } else {                                                                          \
        ksel_##S##_asc(k, n, kk - 1);                                                   \
        ksel_##S##_asc_heapsort(k, 0, kk - 1);                                          \
      }                                                                                 \
    } else if (desc) {                                                                  \
      msort_##S##_desc(k, tmp, n);                                                      \
    } else {                                                                            \
      msort_##S##_asc(k, tmp, n);                                                       \
    }                                                                                   \
  }
DEF_ORDER(f)
DEF_ORDER(i)

typedef struct {
  tpurt_view values, indices, in;
  int has_values, has_indices, dim, descending;
  int64_t k; /* entries written per line (sort: all) */
} sort_args;

typedef struct {
  sort_args *a;
  char *vb, *ib, *inb;
  int isint;
  kc_err err;
} sort_ctx;

/* byte offset of line r (over all dims but dim) in view v */
static int64_t line_off(const tpurt_view *v, const tpurt_view *shape, int dim, int64_t r) {
  int64_t off = 0;
  for (int k = shape->ndim - 1; k >= 0; k--) {
    if (k == dim) continue;
    int64_t i = r % shape->sizes[k];
    r /= shape->sizes[k];
    off += i * v->strides[k];
  }
  return off * (int64_t)tpurt_dtype_size(v->dtype);
}

/* ------------------------------------------------------------ radix sort
 *
 * Long lines of a whole sort go through an LSD radix sort of order-
 * preserving unsigned keys (8-bit digits, a pass skipped where every key has
 * the same digit) with the positions carried along: stable, so equal keys
 * keep their order as in the merge sort — the same result — in O(n) passes
 * instead of O(n log n) comparisons (1M floats: ~125 ms merged). Keys: a
 * float's bits made monotonic (sign flipped, negatives inverted), -0.0 as
 * +0.0 and every NaN as the largest key (the merge sort's equalities and
 * NaN last); an integer with its sign bit flipped; descending: every key
 * inverted (NaN first, equal keys still in order). */
#define RADIX_MIN 512

static uint32_t key_f32(float f) {
  uint32_t u;
  if (f != f) return UINT32_MAX;
  if (f == 0) f = 0; /* -0.0 sorts as +0.0 */
  memcpy(&u, &f, 4);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}
static uint64_t key_f64(double f) {
  uint64_t u;
  if (f != f) return UINT64_MAX;
  if (f == 0) f = 0;
  memcpy(&u, &f, 8);
  return u & 0x8000000000000000ull ? ~u : u | 0x8000000000000000ull;
}

/* sorts (k, ix) by k, stable, using (k2, ix2) as scratch; returns the
 * position array that holds the result */
#define DEF_RADIX(NAME, K, BYTES)                                                      \
  static uint32_t *NAME(K *k, uint32_t *ix, K *k2, uint32_t *ix2, int64_t n) {         \
    static _Thread_local uint32_t cnt[BYTES][256];                                      \
    memset(cnt, 0, sizeof cnt);                                                         \
    for (int64_t i = 0; i < n; i++)                                                     \
      for (int d = 0; d < BYTES; d++) cnt[d][(k[i] >> (8 * d)) & 255]++;                \
    for (int d = 0; d < BYTES; d++) {                                                   \
      if (cnt[d][(k[0] >> (8 * d)) & 255] == (uint32_t)n) continue; /* one digit */     \
      uint32_t off[256], sum = 0;                                                       \
      for (int v = 0; v < 256; v++) {                                                   \
        off[v] = sum;                                                                   \
        sum += cnt[d][v];                                                               \
      }                                                                                 \
      for (int64_t i = 0; i < n; i++) {                                                 \
        uint32_t p = off[(k[i] >> (8 * d)) & 255]++;                                    \
        k2[p] = k[i];                                                                   \
        ix2[p] = ix[i];                                                                 \
      }                                                                                 \
      K *tk = k;                                                                        \
      k = k2;                                                                           \
      k2 = tk;                                                                          \
      uint32_t *ti = ix;                                                                \
      ix = ix2;                                                                         \
      ix2 = ti;                                                                         \
    }                                                                                   \
    return ix;                                                                          \
  }
DEF_RADIX(radix32, uint32_t, 4)
DEF_RADIX(radix64, uint64_t, 8)

/* A line of RADIX_PAR elements or more (one long line: a 1-D sort, unique,
 * argsort) sorts with its passes split over the pool: RP_UNITS contiguous
 * parts count their digits, every part's first position for each digit is
 * the count of smaller digits plus the same digit in the parts before it,
 * and each part scatters its elements in order from there — the same
 * stable order as one thread's pass (1M keys: ~1.6x on 2 threads). Inside
 * a pool task (lines sorted in parallel) the passes run on the caller. */
#define RADIX_PAR 65536
#define RP_UNITS 8

typedef struct {
  const void *k;
  void *k2;
  const uint32_t *ix;
  uint32_t *ix2;
  int64_t n;
  int shift, wide;
  uint32_t (*pos)[256]; /* RP_UNITS parts: digit counts, then first positions */
  uint32_t (*all)[8][256]; /* rp_count_all: every part's counts of every digit */
} rp_job;

static inline unsigned rp_digit(const rp_job *j, int64_t i) {
  return j->wide ? (unsigned)(((const uint64_t *)j->k)[i] >> j->shift) & 255u
                 : (unsigned)(((const uint32_t *)j->k)[i] >> j->shift) & 255u;
}

static void rp_count(void *c, int64_t b, int64_t e) {
  rp_job *j = c;
  for (int64_t u = b; u < e; u++) {
    int64_t lo = j->n * u / RP_UNITS, hi = j->n * (u + 1) / RP_UNITS;
    uint32_t *cnt = j->pos[u];
    memset(cnt, 0, 256 * sizeof(uint32_t));
    for (int64_t i = lo; i < hi; i++) cnt[rp_digit(j, i)]++;
  }
}

/* every digit's counts per part in one read (which passes to skip) */
static void rp_count_all(void *c, int64_t b, int64_t e) {
  rp_job *j = c;
  int nd = j->wide ? 8 : 4;
  for (int64_t u = b; u < e; u++) {
    int64_t lo = j->n * u / RP_UNITS, hi = j->n * (u + 1) / RP_UNITS;
    uint32_t(*cnt)[256] = j->all[u];
    memset(cnt, 0, sizeof(uint32_t[8][256]));
    if (j->wide) {
      const uint64_t *k = j->k;
      for (int64_t i = lo; i < hi; i++)
        for (int d = 0; d < 8; d++) cnt[d][(k[i] >> (8 * d)) & 255]++;
    } else {
      const uint32_t *k = j->k;
      for (int64_t i = lo; i < hi; i++)
        for (int d = 0; d < nd; d++) cnt[d][(k[i] >> (8 * d)) & 255]++;
    }
  }
}

static void rp_scatter(void *c, int64_t b, int64_t e) {
  rp_job *j = c;
  for (int64_t u = b; u < e; u++) {
    int64_t lo = j->n * u / RP_UNITS, hi = j->n * (u + 1) / RP_UNITS;
    uint32_t *off = j->pos[u];
#define RP_SCATTER(T)                                   \
  do {                                                  \
    const T *k = j->k;                                  \
    T *k2 = j->k2;                                      \
    for (int64_t i = lo; i < hi; i++) {                 \
      uint32_t p = off[(k[i] >> j->shift) & 255]++;     \
      k2[p] = k[i];                                     \
      j->ix2[p] = j->ix[i];                             \
    }                                                   \
  } while (0)
    if (j->wide)
      RP_SCATTER(uint64_t);
    else
      RP_SCATTER(uint32_t);
#undef RP_SCATTER
  }
}

/* radix32 / radix64 over the pool (wide: 64-bit keys); NULL when host
 * memory for the counts is exhausted (the caller sorts on one thread) */
static uint32_t *radix_par(void *k, uint32_t *ix, void *k2, uint32_t *ix2, int64_t n, int wide) {
  uint32_t(*pos)[256] = malloc(sizeof(uint32_t[RP_UNITS][256]));
  uint32_t(*all)[8][256] = malloc(sizeof(uint32_t[RP_UNITS][8][256]));
  if (!pos || !all) {
    free(pos);
    free(all);
    return NULL;
  }
  int ks = wide ? 8 : 4, fresh = 1; /* fresh: the parts still hold their first elements */
  rp_job j0 = {k, k2, ix, ix2, n, 0, wide, pos, all};
  tpurt_parallel_for(RP_UNITS, 1, rp_count_all, &j0);
  for (int d = 0; d < ks; d++) {
    rp_job j = {k, k2, ix, ix2, n, 8 * d, wide, pos, all};
    uint32_t same = 0;
    unsigned first = rp_digit(&j, 0);
    for (int u = 0; u < RP_UNITS; u++) same += all[u][d][first]; /* totals do not depend on the order */
    if (same == (uint32_t)n) continue; /* one digit: the pass changes nothing */
    if (fresh)
      for (int u = 0; u < RP_UNITS; u++) memcpy(pos[u], all[u][d], sizeof pos[u]);
    else
      tpurt_parallel_for(RP_UNITS, 1, rp_count, &j);
    fresh = 0;
    uint32_t sum = 0;
    for (int v = 0; v < 256; v++)
      for (int u = 0; u < RP_UNITS; u++) {
        uint32_t c = pos[u][v];
        pos[u][v] = sum;
        sum += c;
      }
    tpurt_parallel_for(RP_UNITS, 1, rp_scatter, &j);
    void *tk = k;
    k = k2;
    k2 = tk;
    uint32_t *ti = ix;
    ix = ix2;
    ix2 = ti;
  }
  free(pos);
  free(all);
  return ix;
}

/* Has dt an order-preserving key (radix_keys)? */
static int radix_dtype(tpurt_dtype dt) {
  switch (dt) {
    case TPURT_F64: case TPURT_I64: case TPURT_F32: case TPURT_BF16: case TPURT_F16: case TPURT_I32:
    case TPURT_I16: case TPURT_I8: case TPURT_U8: case TPURT_BOOL: return 1;
    default: return 0;
  }
}

/* Positions and order-preserving keys of elements [lo, hi) of a line (see
 * above; 64-bit keys for f64 / i64) of a dtype radix_dtype takes. */
static void radix_keys(tpurt_dtype dt, const char *ip, int64_t is, int64_t n, int desc, void *buf, int64_t lo,
                      int64_t hi) {
  uint32_t inv32 = desc ? UINT32_MAX : 0;
  uint64_t inv64 = desc ? UINT64_MAX : 0;
  uint32_t *ix = (uint32_t *)((char *)buf + (size_t)n * 8);
  for (int64_t i = lo; i < hi; i++) ix[i] = (uint32_t)i;
  if (dt == TPURT_F64 || dt == TPURT_I64) {
    uint64_t *k = buf;
    for (int64_t i = lo; i < hi; i++) {
      const char *p = ip + i * is;
      if (dt == TPURT_F64) {
        double f;
        memcpy(&f, p, 8);
        k[i] = key_f64(f) ^ inv64;
      } else {
        int64_t v;
        memcpy(&v, p, 8);
        k[i] = ((uint64_t)v ^ 0x8000000000000000ull) ^ inv64;
      }
    }
    return;
  }
  uint32_t *k = buf;
  for (int64_t i = lo; i < hi; i++) {
    const char *p = ip + i * is;
    uint32_t key;
    switch (dt) {
      case TPURT_F32: { float f; memcpy(&f, p, 4); key = key_f32(f); break; }
      case TPURT_BF16: { uint16_t h; memcpy(&h, p, 2); key = key_f32(tpurt__bf16_to_f32(h)); break; }
      case TPURT_F16: { uint16_t h; memcpy(&h, p, 2); key = key_f32(tpurt__f16_to_f32(h)); break; }
      case TPURT_I32: { int32_t v; memcpy(&v, p, 4); key = (uint32_t)v ^ 0x80000000u; break; }
      case TPURT_I16: { int16_t v; memcpy(&v, p, 2); key = (uint32_t)(int32_t)v ^ 0x80000000u; break; }
      case TPURT_I8: key = (uint32_t)(int32_t) * (const int8_t *)p ^ 0x80000000u; break;
      case TPURT_U8: key = *(const uint8_t *)p; break;
      case TPURT_BOOL: key = *(const uint8_t *)p != 0; break;
      default: key = 0; break; /* not taken (radix_dtype) */
    }
    k[i] = key ^ inv32;
  }
}

/* A long line's key building and writing back, split over the pool. */
typedef struct {
  tpurt_dtype dt;
  const char *ip;
  int64_t is, n;
  int desc;
  void *buf;
  /* write-back: */
  const uint32_t *order;
  char *vp, *xp;
  int64_t vs, xs;
  int es;
} rl_job;

static void rl_keys(void *c, int64_t b, int64_t e) {
  rl_job *j = c;
  radix_keys(j->dt, j->ip, j->is, j->n, j->desc, j->buf, b, e);
}

/* entries [lo, hi) of the sorted line: values and positions by its order */
static void rl_write(rl_job *j, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; i++) {
    int64_t p = j->order[i];
    if (j->vp) kc_move(j->vp + i * j->vs, j->ip + p * j->is, j->es);
    if (j->xp) memcpy(j->xp + i * j->xs, &p, 8);
  }
}

static void rl_write_chunk(void *c, int64_t b, int64_t e) { rl_write(c, b, e); }

/* The line's order by radix sort into the returned positions (buf and tmp:
 * 16 n bytes each); 0 if the dtype has no key here. A line of RADIX_PAR
 * elements or more outside a pool task builds its keys and runs its passes
 * over the pool. */
static uint32_t *radix_line(tpurt_dtype dt, const char *ip, int64_t is, int64_t n, int desc, void *buf, void *tmp) {
  int wide = dt == TPURT_F64 || dt == TPURT_I64, par = n >= RADIX_PAR && !tpurt__pool_nested();
  if (!radix_dtype(dt)) return NULL;
  if (par) {
    rl_job j = {.dt = dt, .ip = ip, .is = is, .n = n, .desc = desc, .buf = buf};
    tpurt_parallel_for(n, 65536, rl_keys, &j);
  } else {
    radix_keys(dt, ip, is, n, desc, buf, 0, n);
  }
  uint32_t *ix = (uint32_t *)((char *)buf + (size_t)n * 8), *ix2 = (uint32_t *)((char *)tmp + (size_t)n * 8);
  uint32_t *r = par ? radix_par(buf, ix, tmp, ix2, n, wide) : NULL;
  if (r) return r;
  return wide ? radix64(buf, ix, tmp, ix2, n) : radix32(buf, ix, tmp, ix2, n);
}

static void sort_chunk(void *c, int64_t b, int64_t e) {
  sort_ctx *x = c;
  sort_args *a = x->a;
  int dim = a->dim;
  int64_t n = a->in.sizes[dim];
  tpurt_dtype dt = a->in.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int64_t is = a->in.strides[dim] * es;
  size_t bytes = (size_t)n * 16;
  /* the thread's grow-only buffers: a 1M-element line's 32 MB freshly
   * allocated and given back every call took ~6,000 page faults (a third of
   * a 1-D sort's time) */
  void *buf = tpurt__scratch(9, bytes ? bytes : 16), *tmp = tpurt__scratch(10, bytes ? bytes : 16);
  if (!buf || !tmp) {
    kc_err_index(&x->err, "out of host memory");
    return;
  }
  for (int64_t r = b; r < e; r++) {
    const char *ip = x->inb + line_off(&a->in, &a->in, dim, r);
    char *vp = a->has_values ? x->vb + line_off(&a->values, &a->in, dim, r) : NULL;
    char *xp = a->has_indices ? x->ib + line_off(&a->indices, &a->in, dim, r) : NULL;
    int64_t vs = a->has_values ? a->values.strides[dim] * es : 0;
    int64_t xs = a->has_indices ? a->indices.strides[dim] * 8 : 0;
    uint32_t *order = n >= RADIX_MIN && n <= UINT32_MAX && !TOPK_SELECTS(a->k, n)
                          ? radix_line(dt, ip, is, n, a->descending, buf, tmp)
                          : NULL;
    if (order) {
      rl_job w = {.ip = ip, .is = is, .order = order, .vp = vp, .xp = xp, .vs = vs, .xs = xs, .es = es};
      if (a->k >= RADIX_PAR && !tpurt__pool_nested())
        tpurt_parallel_for(a->k, 65536, rl_write_chunk, &w);
      else
        rl_write(&w, 0, a->k);
    } else if (x->isint) {
      ikey *k = buf;
      for (int64_t i = 0; i < n; i++) {
        k[i].k = kc_ldi(dt, ip + i * is);
        k[i].i = i;
      }
      order_i(k, tmp, n, a->k, a->descending);
      for (int64_t i = 0; i < a->k; i++) {
        if (vp) kc_move(vp + i * vs, ip + k[i].i * is, es);
        if (xp) memcpy(xp + i * xs, &k[i].i, 8);
      }
    } else {
      fkey *k = buf;
      if (dt == TPURT_F32) {
        for (int64_t i = 0; i < n; i++) {
          float f;
          memcpy(&f, ip + i * is, 4);
          k[i].k = f;
          k[i].i = i;
        }
      } else {
        for (int64_t i = 0; i < n; i++) {
          k[i].k = kc_ld(dt, ip + i * is);
          k[i].i = i;
        }
      }
      order_f(k, tmp, n, a->k, a->descending);
      for (int64_t i = 0; i < a->k; i++) {
        if (vp) kc_move(vp + i * vs, ip + k[i].i * is, es);
        if (xp) memcpy(xp + i * xs, &k[i].i, 8);
      }
    }
  }
}

static tpurt_status k_sort(void *p, char *err, size_t errlen) {
  sort_args *a = p;
  sort_ctx x;
  x.a = a;
  x.vb = a->has_values ? tpurt__host_view(a->values.ptr) : NULL;
  x.ib = a->has_indices ? tpurt__host_view(a->indices.ptr) : NULL;
  /* in-place sort (values aliasing input): sort a private copy of each line.
   * line buffers hold keys + original positions, and values are re-read
   * from the input, so alias requires a snapshot of the input */
  x.inb = tpurt__host_view(a->in.ptr);
  x.isint = !kc_is_float(a->in.dtype);
  atomic_init(&x.err.set, 0);
  int64_t n = a->in.sizes[a->dim];
  int64_t lines = kc_numel(&a->in) / (n ? n : 1);
  char *snap = NULL;
  if (a->has_values && a->values.ptr == a->in.ptr) {
    /* snapshot the input densely and sort from there */
    int64_t tot = kc_numel(&a->in);
    int es = (int)tpurt_dtype_size(a->in.dtype);
    snap = malloc((size_t)(tot * es));
    if (!snap) {
      snprintf(err, errlen, "out of host memory");
      return TPURT_ERR_OUT_OF_MEMORY;
    }
    int64_t coord[TPURT_MAX_DIMS];
    for (int64_t l = 0; l < tot; l++) {
      kc_unravel(l, a->in.ndim, a->in.sizes, coord);
      int64_t off = 0;
      for (int k = 0; k < a->in.ndim; k++) off += coord[k] * a->in.strides[k];
      kc_move(snap + l * es, x.inb + off * es, es);
    }
    int64_t st = 1;
    for (int k = a->in.ndim - 1; k >= 0; k--) {
      a->in.strides[k] = st;
      st *= a->in.sizes[k];
    }
    x.inb = snap;
  }
  tpurt_parallel_for(lines, n >= 4096 ? 1 : 4096 / (n + 1) + 1, sort_chunk, &x);
  free(snap);
  return kc_err_finish(&x.err, TPURT_ERR_OUT_OF_MEMORY, err, errlen);
}

static tpurt_status sort_launch(tpurt_stream *s, const char *op, const tpurt_view *values, const tpurt_view *indices,
                                const tpurt_view *in, int dim, int descending, int64_t k) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if (!in) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL input", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(in->ptr)))) return st;
  if ((st = kc_check(s->dev, in, op, "input")) || (values && (st = kc_check(s->dev, values, op, "values"))) ||
      (indices && (st = kc_check(s->dev, indices, op, "indices"))))
    return st;
  if (kc_is_complex(in->dtype)) return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: complex is not supported", op);
  tpurt_view iv = *in;
  if (iv.ndim == 0) {
    iv.ndim = 1;
    iv.sizes[0] = 1;
    iv.strides[0] = 1;
  }
  if (dim < 0 || dim >= iv.ndim) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad dim %d", op, dim);
  const tpurt_view *outs[2] = {values, indices};
  tpurt_view ov[2];
  for (int o = 0; o < 2; o++) {
    if (!outs[o]) continue;
    ov[o] = *outs[o];
    if (ov[o].ndim == 0) {
      ov[o].ndim = 1;
      ov[o].sizes[0] = 1;
      ov[o].strides[0] = 1;
    }
    if (ov[o].ndim != iv.ndim) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output rank mismatch", op);
    for (int d = 0; d < iv.ndim; d++)
      if (ov[o].sizes[d] != (d == dim ? k : iv.sizes[d]))
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output size mismatch in dimension %d", op, d);
  }
  if (values && values->dtype != in->dtype) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: values dtype", op);
  if (indices && indices->dtype != TPURT_I64)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: indices must be int64", op);
  if (kc_numel(&iv) == 0 || k == 0) return TPURT_OK;
  sort_args a;
  memset(&a, 0, sizeof a);
  a.in = iv;
  if (values) a.values = ov[0];
  if (indices) a.indices = ov[1];
  a.has_values = values != NULL;
  a.has_indices = indices != NULL;
  a.dim = dim;
  a.descending = descending;
  a.k = k;
  return tpurt_launch(s, op, k_sort, &a, sizeof a);
}

tpurt_status tpurt_sort(tpurt_stream *s, const tpurt_view *values, const tpurt_view *indices, const tpurt_view *in,
                        int dim, int descending) {
  int64_t n = in ? (in->ndim ? in->sizes[dim < 0 || dim >= in->ndim ? 0 : dim] : 1) : 0;
  return sort_launch(s, "sort", values, indices, in, dim, descending, n);
}

tpurt_status tpurt_topk(tpurt_stream *s, const tpurt_view *values, const tpurt_view *indices, const tpurt_view *in,
                        int64_t k, int dim, int largest, int sorted) {
  (void)sorted; /* always sorted */
  if (in) {
    int64_t n = in->ndim ? (dim >= 0 && dim < in->ndim ? in->sizes[dim] : 0) : 1;
    if (k < 0 || k > n) return tpurt__err(TPURT_ERR_INDEX, "topk: selected index k out of range");
  }
  return sort_launch(s, "topk", values, indices, in, dim, largest, k);
}

/* --------------------------------------------------------------- unique */

typedef struct {
  tpurt_view out, count, inverse, counts, sorted, perm;
  int has_inv, has_counts;
} uniq_args;

/* Do the es bytes at a and b match? (fixed-size loads, not a memcmp call
 * per element: a third of a 1M unique's pass) */
static inline int same_bits(const char *a, const char *b, int es) {
  switch (es) {
    case 1: return *a == *b;
    case 2: { uint16_t x, y; memcpy(&x, a, 2); memcpy(&y, b, 2); return x == y; }
    case 4: { uint32_t x, y; memcpy(&x, a, 4); memcpy(&y, b, 4); return x == y; }
    case 8: { uint64_t x, y; memcpy(&x, a, 8); memcpy(&y, b, 8); return x == y; }
    default: return memcmp(a, b, (size_t)es) == 0;
  }
}

static tpurt_status k_unique(void *p, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  uniq_args *a = p;
  tpurt_dtype dt = a->sorted.dtype;
  int es = (int)tpurt_dtype_size(dt);
  int isf = kc_is_float(dt);
  const char *sp = tpurt__host_view(a->sorted.ptr);
  char *op = tpurt__host_view(a->out.ptr);
  int64_t n = a->sorted.sizes[0], ss = a->sorted.strides[0] * es, os = a->out.strides[0] * es;
  const char *pp = a->has_inv ? tpurt__host_view(a->perm.ptr) : NULL;
  char *ivp = a->has_inv ? tpurt__host_view(a->inverse.ptr) : NULL;
  int64_t *cp = a->has_counts ? tpurt__host_view(a->counts.ptr) : NULL;
  int64_t ps = a->has_inv ? a->perm.strides[0] * 8 : 0, is = a->has_inv ? a->inverse.strides[0] : 0;
  int64_t cs = a->has_counts ? a->counts.strides[0] : 0;
  int64_t g = -1;
  for (int64_t i = 0; i < n; i++) {
    const char *v = sp + i * ss;
    int fresh = i == 0;
    if (!fresh) {
      const char *pv = v - ss;
      fresh = dt == TPURT_F32 ? !(*(const float *)v == *(const float *)pv)
              : isf           ? !(kc_ld(dt, v) == kc_ld(dt, pv))
                              : !same_bits(v, pv, es);
    }
    if (fresh) {
      g++;
      kc_move(op + g * os, v, es);
      if (cp) cp[g * cs] = 0;
    }
    if (cp) cp[g * cs]++;
    if (ivp) {
      int64_t orig;
      memcpy(&orig, pp + i * ps, 8);
      memcpy(ivp + orig * is * 8, &g, 8);
    }
  }
  int64_t *cnt = tpurt__host_view(a->count.ptr);
  *cnt = g + 1;
  return TPURT_OK;
}

tpurt_status tpurt_unique_sorted(tpurt_stream *s, const tpurt_view *out, const tpurt_view *count,
                                 const tpurt_view *inverse, const tpurt_view *counts, const tpurt_view *sorted,
                                 const tpurt_view *perm) {
  TPURT__INIT_OR_RETURN();
  const char *op = "unique";
  tpurt_status st;
  if (!out || !count || !sorted || (inverse && !perm))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if ((st = kc_check(s->dev, out, op, "out")) || (st = kc_check(s->dev, count, op, "count")) ||
      (st = kc_check(s->dev, sorted, op, "sorted")) || (inverse && (st = kc_check(s->dev, inverse, op, "inverse"))) ||
      (counts && (st = kc_check(s->dev, counts, op, "counts"))) || (perm && (st = kc_check(s->dev, perm, op, "perm"))))
    return st;
  if (sorted->ndim != 1 || out->ndim != 1 || out->sizes[0] < sorted->sizes[0] || out->dtype != sorted->dtype ||
      count->ndim != 0 || count->dtype != TPURT_I64)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad shapes", op);
  if ((inverse && (inverse->dtype != TPURT_I64 || perm->dtype != TPURT_I64 || inverse->ndim != 1 ||
                   perm->ndim != 1 || inverse->sizes[0] != sorted->sizes[0] || perm->sizes[0] != sorted->sizes[0])) ||
      (counts && (counts->dtype != TPURT_I64 || counts->ndim != 1 || counts->sizes[0] < sorted->sizes[0])))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad inverse/counts", op);
  uniq_args a;
  memset(&a, 0, sizeof a);
  a.out = *out;
  a.count = *count;
  a.sorted = *sorted;
  if (inverse) {
    a.inverse = *inverse;
    a.perm = *perm;
  }
  if (counts) a.counts = *counts;
  a.has_inv = inverse != NULL;
  a.has_counts = counts != NULL;
  return tpurt_launch(s, op, k_unique, &a, sizeof a);
}
