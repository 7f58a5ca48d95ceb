/*
 * copy.c — byte copies (host<->device, device<->device incl. across chips),
 * strided copy with dtype conversion, and fill. Launch-side code validates
 * and coalesces dimensions; kernels run on the stream worker and split big
 * jobs over the thread pool.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "internal.h"
#include "kernels/fused.h"
#include "kernels/gemm_internal.h" /* tpurt__cpu_has_avx512 */

#define PAR_BYTES (4ll << 20) /* memcpy split threshold */
/* Copies of this many bytes or more store around the caches (non-temporal
 * stores): their destination cannot stay cached (L3 32 MiB, shared), and
 * a store that skips the read for ownership of its line leaves the memory
 * bus to the data. */
#define NT_BYTES (32ll << 20)
#define GRAIN_ELEMS 32768

/* ------------------------------------------------------------ memcpy */

enum { DIR_H2D, DIR_D2H, DIR_D2D };
typedef struct {
  int dir;
  void *host;
  tpurt_devptr dst, src;
  size_t n;
} memcpy_args;

/* n bytes from s to d (not overlapping) in 64-byte vectors, four at a
 * time; nt: non-temporal stores (the head up to d's next 64-byte line by
 * memcpy). glibc's memcpy on the Zen 5 host (2.36, rep movsb from a few KiB
 * on) copied cache-resident runs of 1-4 MiB at 42-60 GB/s on one core
 * where this loop ran 59-88; for 128 MiB over two cores memcpy ran 37,
 * this loop 38, with non-temporal stores 54 GB/s. */
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static void copy_avx512(unsigned char *d, const unsigned char *s, size_t n, int nt) {
  size_t i = 0;
  if (nt) {
    i = (64 - ((uintptr_t)d & 63)) & 63;
    if (i > n) i = n;
    memcpy(d, s, i);
    for (; i + 256 <= n; i += 256) {
      __m512i a = _mm512_loadu_si512(s + i), b = _mm512_loadu_si512(s + i + 64);
      __m512i c = _mm512_loadu_si512(s + i + 128), e = _mm512_loadu_si512(s + i + 192);
      _mm512_stream_si512((void *)(d + i), a);
      _mm512_stream_si512((void *)(d + i + 64), b);
      _mm512_stream_si512((void *)(d + i + 128), c);
      _mm512_stream_si512((void *)(d + i + 192), e);
    }
    _mm_sfence();
  } else {
    for (; i + 256 <= n; i += 256) {
      __m512i a = _mm512_loadu_si512(s + i), b = _mm512_loadu_si512(s + i + 64);
      __m512i c = _mm512_loadu_si512(s + i + 128), e = _mm512_loadu_si512(s + i + 192);
      _mm512_storeu_si512(d + i, a);
      _mm512_storeu_si512(d + i + 64, b);
      _mm512_storeu_si512(d + i + 128, c);
      _mm512_storeu_si512(d + i + 192, e);
    }
  }
  memcpy(d + i, s + i, n - i);
}
#endif

static void copy_bytes(unsigned char *d, const unsigned char *s, size_t n, int nt) {
#if defined(__x86_64__) || defined(__i386__)
  if (n >= 4096 && tpurt__cpu_has_avx512()) {
    copy_avx512(d, s, n, nt);
    return;
  }
#endif
  memcpy(d, s, n);
}

typedef struct {
  unsigned char *d;
  const unsigned char *s;
  int nt;
} pcopy_ctx;
static void pcopy_chunk(void *c, int64_t b, int64_t e) {
  pcopy_ctx *x = c;
  copy_bytes(x->d + b * (1 << 20), x->s + b * (1 << 20), (size_t)(e - b) * (1 << 20), x->nt);
}

static void big_memcpy(void *d, const void *s, size_t n) {
  if ((int64_t)n < PAR_BYTES) {
    copy_bytes(d, s, n, 0);
    return;
  }
  /* 1 MiB units over the pool, tail inline */
  pcopy_ctx x = {d, s, (int64_t)n >= NT_BYTES};
  int64_t units = (int64_t)(n >> 20);
  tpurt_parallel_for(units, 1, pcopy_chunk, &x);
  size_t done = (size_t)units << 20;
  if (done < n) copy_bytes((unsigned char *)d + done, (const unsigned char *)s + done, n - done, x.nt);
}

static tpurt_status k_memcpy(void *a, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  memcpy_args *m = a;
  switch (m->dir) {
    case DIR_H2D: big_memcpy(tpurt__host_view(m->dst), m->host, m->n); break;
    case DIR_D2H: big_memcpy(m->host, tpurt__host_view(m->src), m->n); break;
    default: {
      unsigned char *d = tpurt__host_view(m->dst);
      const unsigned char *s = tpurt__host_view(m->src);
      if (d == s) break;
      if ((d < s + m->n) && (s < d + m->n))
        memmove(d, s, m->n);
      else
        big_memcpy(d, s, m->n);
    }
  }
  return TPURT_OK;
}

static tpurt_status finish_copy(tpurt_stream *s, uint64_t seq, int non_blocking) {
  if (non_blocking) return TPURT_OK;
  tpurt__stream_wait_seq(s, seq);
  return tpurt__stream_take_error_upto(s, seq);
}

static tpurt_status launch_memcpy(tpurt_stream *s, memcpy_args *m, const char *name, int non_blocking) {
  uint64_t seq = 0;
  int placed = 0; /* enqueued inside a deferred graph */
  tpurt_status st;
  if (TPURT__TRACE_ON()) tpurt__trace_emit(TPURT_TRACE_COPY, tpurt__now_ns(), 0, name, NULL, s->dev, (int)s->id, 0, tpurt__trace_corr, (int64_t)m->n, m->dir == DIR_H2D ? 0 : m->dir == DIR_D2H ? 1 : 2);
  if (tpurt__deferring()) {
    /* host->device: the data is staged now, so the host buffer is free to
     * change (pinned or not); device->host: the graph runs, the copy placed
     * right after the last kernel that writes the bytes it reads (the host
     * goes on while the rest of the graph runs) */
    if (m->dir == DIR_H2D) return tpurt__defer_record_h2d(s, m->dst, m->host, m->n);
    if (m->dir != DIR_D2H) return tpurt__defer_record_launch(s, name, k_memcpy, m, sizeof *m);
    tpurt__host_read r = {s, name, k_memcpy, m, sizeof *m, m->src, m->n, 0, 0};
    if ((st = tpurt__defer_flush_for_read(TPURT_FLUSH_TO_HOST, &r))) return st;
    placed = r.placed, seq = r.seq;
  }
  if (!placed && (st = tpurt__enqueue(s, name, k_memcpy, m, sizeof *m, &seq))) return st;
  if (atomic_load_explicit(&tpurt__blocking, memory_order_relaxed)) non_blocking = 0;
  return finish_copy(s, seq, non_blocking);
}

tpurt_status tpurt_memcpy_h2d(tpurt_stream *s, tpurt_devptr dst, const void *src, size_t n, int non_blocking) {
  TPURT__INIT_OR_RETURN();
  int dev = tpurt_devptr_device(dst);
  tpurt_status st = tpurt__resolve_stream(&s, dev);
  if (st) return st;
  if (n == 0) return TPURT_OK;
  if (!src) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "copy_h2d: host source is NULL");
  if ((st = tpurt__check_dev_range(s->dev, dst, 0, (int64_t)n, "copy_h2d"))) return st;
  memcpy_args m = {DIR_H2D, (void *)src, dst, 0, n};
  return launch_memcpy(s, &m, "copy_h2d", non_blocking);
}

tpurt_status tpurt_memcpy_d2h(tpurt_stream *s, void *dst, tpurt_devptr src, size_t n, int non_blocking) {
  TPURT__INIT_OR_RETURN();
  int dev = tpurt_devptr_device(src);
  tpurt_status st = tpurt__resolve_stream(&s, dev);
  if (st) return st;
  if (n == 0) return TPURT_OK;
  if (!dst) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "copy_d2h: host destination is NULL");
  if ((st = tpurt__check_dev_range(s->dev, src, 0, (int64_t)n, "copy_d2h"))) return st;
  memcpy_args m = {DIR_D2H, dst, 0, src, n};
  return launch_memcpy(s, &m, "copy_d2h", non_blocking);
}

tpurt_status tpurt_memory_window(tpurt_stream *s, tpurt_devptr p, size_t n, void **host) {
  TPURT__INIT_OR_RETURN();
  if (!host) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "memory_window: host is NULL");
  *host = NULL;
  int dev = tpurt_devptr_device(p);
  tpurt_status st = tpurt__resolve_stream(&s, dev);
  if (st) return st;
  if ((st = tpurt__check_dev_range(s->dev, p, 0, (int64_t)(n ? n : 1), "memory_window"))) return st;
  if ((st = tpurt__stream_sync(s, TPURT_FLUSH_COLLECTIVE))) return st;
  if (tpurt__is_promise(p) && !atomic_load(&tpurt__promise_get(tpurt__promise_id(p))->real))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "memory_window: 0x%016" PRIx64 " has no memory (the deferred graph that made it failed)", p);
  *host = tpurt__host_view(p);
  return TPURT_OK;
}

/* Orders s after the source chip's current stream, and that stream after s
 * (so the source chip does not reuse the memory before the copy is done). */
static tpurt_status cross_chip_begin(tpurt_stream *s, int src_dev, tpurt_stream **src_stream) {
  tpurt_stream *o = tpurt_stream_current(src_dev);
  if (!o) return tpurt__err(TPURT_ERR_INTERNAL, "could not get the current stream of TPU %d", src_dev);
  tpurt_event *e;
  tpurt_status st = tpurt_event_create(0, &e);
  if (st) return st;
  st = tpurt_event_record(e, o);
  if (!st) st = tpurt_stream_wait_event(s, e);
  tpurt_event_destroy(e);
  *src_stream = o;
  return st;
}
static tpurt_status cross_chip_end(tpurt_stream *s, tpurt_stream *o) {
  tpurt_event *e;
  tpurt_status st = tpurt_event_create(0, &e);
  if (st) return st;
  st = tpurt_event_record(e, s);
  if (!st) st = tpurt_stream_wait_event(o, e);
  tpurt_event_destroy(e);
  return st;
}

tpurt_status tpurt_memcpy_d2d(tpurt_stream *s, tpurt_devptr dst, tpurt_devptr src, size_t n) {
  TPURT__INIT_OR_RETURN();
  int dev = tpurt_devptr_device(dst);
  tpurt_status st = tpurt__resolve_stream(&s, dev);
  if (st) return st;
  if (n == 0) return TPURT_OK;
  if ((st = tpurt__check_dev_range(s->dev, dst, 0, (int64_t)n, "copy_d2d (destination)"))) return st;
  int sdev = tpurt_devptr_device(src);
  if (sdev < 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "copy_d2d: source 0x%016" PRIx64 " is not a TPU device address", src);
  if ((st = tpurt__check_dev_range(sdev, src, 0, (int64_t)n, "copy_d2d (source)"))) return st;
  memcpy_args m = {DIR_D2D, NULL, dst, src, n};
  if (sdev == s->dev) return launch_memcpy(s, &m, "copy_d2d", 1);
  tpurt_stream *o = NULL;
  if ((st = cross_chip_begin(s, sdev, &o))) return st;
  if ((st = launch_memcpy(s, &m, "copy_d2d", 1))) return st;
  return cross_chip_end(s, o);
}

/* ------------------------------------------------------- strided copy */

typedef void (*row_fn)(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, const void *aux);

typedef struct {
  int ndim;
  int64_t sizes[TPURT_MAX_DIMS];
  int64_t dstr[TPURT_MAX_DIMS]; /* byte strides */
  int64_t sstr[TPURT_MAX_DIMS];
} nd_shape;

typedef struct {
  tpurt_devptr dst, src;
  tpurt_dtype ddt, sdt;
  int overlap;
  nd_shape sh;
} strided_args;

/* same-dtype rows */
#define COPY_ROW(NAME, T)                                                                  \
  static void NAME(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, const void *aux) { \
    (void)aux;                                                                             \
    if (ds == (int64_t)sizeof(T) && ss == (int64_t)sizeof(T)) {                            \
      memcpy(d, s, (size_t)n * sizeof(T));                                                 \
      return;                                                                              \
    }                                                                                      \
    for (int64_t i = 0; i < n; i++) memcpy(d + i * ds, s + i * ss, sizeof(T));             \
  }
typedef struct {
  unsigned char b[16];
} u128;
COPY_ROW(row_copy1, uint8_t)
COPY_ROW(row_copy2, uint16_t)
COPY_ROW(row_copy4, uint32_t)
COPY_ROW(row_copy8, uint64_t)
COPY_ROW(row_copy16, u128)

/* converting rows */
#define CONV_ROW(NAME, ST, DT, CONV)                                                       \
  static void NAME(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, const void *aux) { \
    (void)aux;                                                                             \
    if (ds == (int64_t)sizeof(DT) && ss == (int64_t)sizeof(ST)) {                          \
      for (int64_t i = 0; i < n; i++) {                                                    \
        ST v;                                                                              \
        memcpy(&v, s + i * (int64_t)sizeof(ST), sizeof v);                                 \
        DT r = CONV(v);                                                                    \
        memcpy(d + i * (int64_t)sizeof(DT), &r, sizeof r);                                 \
      }                                                                                    \
      return;                                                                              \
    }                                                                                      \
    for (int64_t i = 0; i < n; i++) {                                                      \
      ST v;                                                                                \
      memcpy(&v, s + i * ss, sizeof v);                                                    \
      DT r = CONV(v);                                                                      \
      memcpy(d + i * ds, &r, sizeof r);                                                    \
    }                                                                                      \
  }
#define CV_CAST_F(v) ((float)(v))
#define CV_CAST_D(v) ((double)(v))
#define CV_F2I32(v) (tpurt__f2i32((double)(v)))
#define CV_F2I64(v) (tpurt__f2i64((double)(v)))
CONV_ROW(row_f32_bf16, float, uint16_t, tpurt__f32_to_bf16)
CONV_ROW(row_bf16_f32, uint16_t, float, tpurt__bf16_to_f32)
CONV_ROW(row_f32_f16, float, uint16_t, tpurt__f32_to_f16)
CONV_ROW(row_f16_f32, uint16_t, float, tpurt__f16_to_f32)
CONV_ROW(row_f32_f64, float, double, CV_CAST_D)
CONV_ROW(row_f64_f32, double, float, CV_CAST_F)
CONV_ROW(row_i32_f32, int32_t, float, CV_CAST_F)
CONV_ROW(row_i64_f32, int64_t, float, CV_CAST_F)
CONV_ROW(row_i32_f64, int32_t, double, CV_CAST_D)
CONV_ROW(row_i64_f64, int64_t, double, CV_CAST_D)
CONV_ROW(row_f32_i32, float, int32_t, CV_F2I32)
CONV_ROW(row_f32_i64, float, int64_t, CV_F2I64)
CONV_ROW(row_f64_i32, double, int32_t, CV_F2I32)
CONV_ROW(row_f64_i64, double, int64_t, CV_F2I64)
/* float16 -> uint32 goes through int64 on PyTorch's CPU backend (NaN and -inf -> 0), unlike the other float
 * sources (dtype.c) */
#define CV_H2U32(v) ((uint32_t)(uint64_t)tpurt__f2i64((double)tpurt__f16_to_f32(v)))
CONV_ROW(row_f16_u32, uint16_t, uint32_t, CV_H2U32)

typedef struct {
  tpurt_dtype ddt, sdt;
} generic_aux;
static void row_generic(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, const void *aux) {
  const generic_aux *g = aux;
  for (int64_t i = 0; i < n; i++) tpurt__store(g->ddt, d + i * ds, tpurt__load(g->sdt, s + i * ss));
}

static row_fn pick_row(tpurt_dtype ddt, tpurt_dtype sdt) {
  if (ddt == sdt) {
    switch (tpurt_dtype_size(ddt)) {
      case 1: return row_copy1;
      case 2: return row_copy2;
      case 4: return row_copy4;
      case 8: return row_copy8;
      default: return row_copy16;
    }
  }
#define P(S, D) (sdt == TPURT_##S && ddt == TPURT_##D)
  if (P(F16, U32)) return row_f16_u32;
  if (P(F32, BF16)) return row_f32_bf16;
  if (P(BF16, F32)) return row_bf16_f32;
  if (P(F32, F16)) return row_f32_f16;
  if (P(F16, F32)) return row_f16_f32;
  if (P(F32, F64)) return row_f32_f64;
  if (P(F64, F32)) return row_f64_f32;
  if (P(I32, F32)) return row_i32_f32;
  if (P(I64, F32)) return row_i64_f32;
  if (P(I32, F64)) return row_i32_f64;
  if (P(I64, F64)) return row_i64_f64;
  if (P(F32, I32)) return row_f32_i32;
  if (P(F32, I64)) return row_f32_i64;
  if (P(F64, I32)) return row_f64_i32;
  if (P(F64, I64)) return row_f64_i64;
#undef P
  return row_generic;
}

typedef struct {
  const nd_shape *sh;
  char *d;
  const char *s;
  row_fn row;
  const void *aux;
  int64_t copy_esz; /* element size of a same-dtype copy (row is row_copyN), else 0 */
} nd_ctx;

/* Moves the position (idx, *d, *s) n steps along dim k (n <= the steps
 * left in that dim), wrapping full dims to 0 and carrying outward. */
static inline void nd_advance(const nd_shape *sh, int64_t *idx, char **d, const char **s, int k, int64_t n) {
  idx[k] += n;
  *d += n * sh->dstr[k];
  *s += n * sh->sstr[k];
  for (; k > 0 && idx[k] == sh->sizes[k]; k--) {
    *d += sh->dstr[k - 1] - idx[k] * sh->dstr[k];
    *s += sh->sstr[k - 1] - idx[k] * sh->sstr[k];
    idx[k] = 0;
    idx[k - 1]++;
  }
}

/* runs elements [b, e) (linear, row-major over sh) */
static void nd_chunk(void *c, int64_t b, int64_t e) {
  nd_ctx *x = c;
  const nd_shape *sh = x->sh;
  int nd = sh->ndim;
  int64_t idx[TPURT_MAX_DIMS];
  int64_t rem = b;
  char *d = x->d;
  const char *s = x->s;
  for (int k = nd - 1; k >= 0; k--) {
    idx[k] = rem % sh->sizes[k];
    rem /= sh->sizes[k];
    d += idx[k] * sh->dstr[k];
    s += idx[k] * sh->sstr[k];
  }
  int in = nd - 1;
  int64_t left = e - b;
  /* bytes of a whole inner row when it is contiguous in both views and the
   * copy moves raw elements: such rows go one memcpy each, straight down
   * the next dim (a head transpose [B, T, H, D] -> [B, H, T, D] is rows of
   * D floats: the per-row dispatch and carry took more time than the
   * copying) */
  int64_t rowb = nd >= 2 && x->copy_esz && sh->dstr[in] == x->copy_esz && sh->sstr[in] == x->copy_esz
                     ? sh->sizes[in] * x->copy_esz
                     : 0;
  while (left > 0) {
    if (rowb && idx[in] == 0) {
      int o = in - 1;
      int64_t rows = sh->sizes[o] - idx[o], full = left / sh->sizes[in];
      if (rows > full) rows = full;
      if (rows > 1) {
        for (int64_t r = 0; r < rows; r++) memcpy(d + r * sh->dstr[o], s + r * sh->sstr[o], (size_t)rowb);
        left -= rows * sh->sizes[in];
        if (left > 0) nd_advance(sh, idx, &d, &s, o, rows);
        continue;
      }
    }
    int64_t cnt = sh->sizes[in] - idx[in];
    if (cnt > left) cnt = left;
    x->row(d, sh->dstr[in], s, sh->sstr[in], cnt, x->aux);
    left -= cnt;
    if (left > 0) nd_advance(sh, idx, &d, &s, in, cnt); /* the inner dim wraps to 0 */
  }
}

static int64_t shape_numel(const nd_shape *sh) {
  int64_t n = 1;
  for (int k = 0; k < sh->ndim; k++) n *= sh->sizes[k];
  return n;
}

/* Transpose-like copies (the source's fastest dim is not the destination's)
 * go tile by tile (TILE x TILE over the last two dims) to stay in cache. */
#define TILE 16
typedef struct {
  const nd_shape *sh;
  char *d;
  const char *s;
  row_fn row;
  const void *aux;
  int64_t tb0, tb1;
  int64_t ses, des; /* element sizes of the source and the destination */
} tile_ctx;

/* Other transposes (2-byte elements, or a dtype conversion on the way):
 * the tile's source runs (contiguous along the destination's rows' index)
 * gathered into a small buffer in the destination's order, then each row
 * converted or copied with unit strides on both sides. Strided element
 * loops had a bf16 1024 x 512 transpose at 27 GB/s and a converting one
 * (bf16 -> f32 of a transposed view) at 1.4 ms. */
#define GATHER_TILE(T)                                                                      \
  for (int64_t q = 0; q < n1; q++) {                                                         \
    const T *src = (const T *)(s + q * sc);                                                  \
    T *o = (T *)buf + q;                                                                     \
    for (int64_t r = 0; r < n0; r++) o[r * TILE] = src[r];                                   \
  }
static void tile_buffered(const tile_ctx *x, char *d, int64_t drs, const char *s, int64_t sc, int64_t n0,
                          int64_t n1) {
  _Alignas(64) unsigned char buf[TILE * TILE * 8];
  switch (x->ses) {
    case 1: GATHER_TILE(uint8_t) break;
    case 2: GATHER_TILE(uint16_t) break;
    case 4: GATHER_TILE(uint32_t) break;
    default: GATHER_TILE(uint64_t) break;
  }
  for (int64_t r = 0; r < n0; r++) x->row(d + r * drs, x->des, (const char *)buf + r * TILE * x->ses, x->ses, n1, x->aux);
}
#undef GATHER_TILE

/* A 4-byte 8 x 8 block: dst row i (8 contiguous elements from d + i * drs)
 * from source column i (8 contiguous elements from s + k * scs, k = 0..7, at
 * element i). Eight vector loads, 24 shuffles, eight stores. */
typedef float tv8 __attribute__((vector_size(32)));
static inline tv8 tv8_load(const char *p) {
  tv8 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static void transpose8x8_4(char *d, int64_t drs, const char *s, int64_t scs) {
  tv8 r[8], t[8], u[8];
  for (int k = 0; k < 8; k++) r[k] = tv8_load(s + k * scs);
  for (int k = 0; k < 8; k += 2) {
    t[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = __builtin_shufflevector(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 1] = __builtin_shufflevector(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[k + 2] = __builtin_shufflevector(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[k + 3] = __builtin_shufflevector(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int k = 0; k < 4; k++) {
    tv8 lo = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    tv8 hi = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    memcpy(d + k * drs, &lo, sizeof lo);
    memcpy(d + (k + 4) * drs, &hi, sizeof hi);
  }
}

static void tile_chunk(void *c, int64_t b, int64_t e) {
  tile_ctx *x = c;
  const nd_shape *sh = x->sh;
  int nd = sh->ndim;
  int a0 = nd - 2, a1 = nd - 1;
  for (int64_t t = b; t < e; t++) {
    int64_t t1 = t % x->tb1, rest = t / x->tb1;
    int64_t t0 = rest % x->tb0, o = rest / x->tb0;
    char *d = x->d;
    const char *s = x->s;
    for (int k = nd - 3; k >= 0; k--) {
      int64_t ik = o % sh->sizes[k];
      o /= sh->sizes[k];
      d += ik * sh->dstr[k];
      s += ik * sh->sstr[k];
    }
    int64_t i0 = t0 * TILE, i1 = t1 * TILE;
    int64_t n0 = sh->sizes[a0] - i0 < TILE ? sh->sizes[a0] - i0 : TILE;
    int64_t n1 = sh->sizes[a1] - i1 < TILE ? sh->sizes[a1] - i1 : TILE;
    /* a plain 4-byte transpose (destination rows and source columns
     * contiguous) goes 8 x 8 block by block */
    int blocks = x->row == row_copy4 && sh->dstr[a1] == 4 && sh->sstr[a0] == 4;
    if (!blocks && sh->sstr[a0] == x->ses && sh->dstr[a1] == x->des && x->ses <= 8 && x->row != row_generic) {
      tile_buffered(x, d + i0 * sh->dstr[a0] + i1 * sh->dstr[a1], sh->dstr[a0], s + i0 * sh->sstr[a0] + i1 * sh->sstr[a1],
                    sh->sstr[a1], n0, n1);
      continue;
    }
    for (int64_t r = 0; r < n0; r += blocks ? 8 : n0) {
      int64_t nr = blocks && n0 - r >= 8 ? 8 : n0 - r, q = 0;
      char *dr = d + (i0 + r) * sh->dstr[a0] + i1 * sh->dstr[a1];
      const char *sr = s + (i0 + r) * sh->sstr[a0] + i1 * sh->sstr[a1];
      if (blocks && nr == 8)
        for (; q + 8 <= n1; q += 8) transpose8x8_4(dr + q * 4, sh->dstr[a0], sr + q * sh->sstr[a1], sh->sstr[a1]);
      if (q < n1)
        for (int64_t i = 0; i < nr; i++)
          x->row(dr + i * sh->dstr[a0] + q * sh->dstr[a1], sh->dstr[a1],
                 sr + i * sh->sstr[a0] + q * sh->sstr[a1], sh->sstr[a1], n1 - q, x->aux);
    }
  }
}

static int64_t iabs64(int64_t v) { return v < 0 ? -v : v; }

static void run_nd(const nd_shape *sh, char *d, const char *s, tpurt_dtype ddt, tpurt_dtype sdt) {
  generic_aux aux = {ddt, sdt};
  nd_ctx x = {sh, d, s, pick_row(ddt, sdt), &aux, ddt == sdt ? (int64_t)tpurt_dtype_size(ddt) : 0};
  int64_t n = shape_numel(sh);
  size_t esz = tpurt_dtype_size(ddt) > tpurt_dtype_size(sdt) ? tpurt_dtype_size(ddt) : tpurt_dtype_size(sdt);
  /* contiguous same-dtype: plain (parallel) memcpy */
  if (ddt == sdt && sh->ndim == 1 && sh->dstr[0] == (int64_t)esz && sh->sstr[0] == (int64_t)esz) {
    big_memcpy(d, s, (size_t)n * esz);
    return;
  }
  int64_t grain = GRAIN_ELEMS;
  if (x.row == row_generic) grain /= 8;
  int nd = sh->ndim;
  /* an innermost dim of a few elements (pixel_shuffle's 2, a permute that
   * ends on a short dim) made a row of a few elements per step: a dim that
   * reads contiguous source elements becomes the inner one instead. The
   * destination has no repeated element (coalesce orders it by stride; a
   * zero stride stays out of this), so only the order of the writes moves. */
  nd_shape re;
  int64_t ses = (int64_t)tpurt_dtype_size(sdt);
  if (nd >= 2 && sh->sizes[nd - 1] < 8 && sh->sstr[nd - 1] != ses) {
    int k = -1, zero = 0;
    for (int j = 0; j < nd; j++) {
      zero |= sh->dstr[j] == 0;
      if (j < nd - 1 && sh->sstr[j] == ses && sh->sizes[j] >= 16) k = j;
    }
    if (k >= 0 && !zero) {
      re = *sh;
      for (int j = k; j < nd - 1; j++) {
        re.sizes[j] = sh->sizes[j + 1], re.dstr[j] = sh->dstr[j + 1], re.sstr[j] = sh->sstr[j + 1];
      }
      re.sizes[nd - 1] = sh->sizes[k], re.dstr[nd - 1] = sh->dstr[k], re.sstr[nd - 1] = sh->sstr[k];
      sh = &re;
      x.sh = sh;
    }
  }
  if (nd >= 2 && n >= 4 * TILE * TILE && sh->sizes[nd - 1] >= TILE / 2 && sh->sizes[nd - 2] >= TILE / 2 &&
      iabs64(sh->sstr[nd - 2]) < iabs64(sh->sstr[nd - 1]) && iabs64(sh->dstr[nd - 1]) <= iabs64(sh->dstr[nd - 2])) {
    tile_ctx t = {sh, d, s, x.row, &aux, (sh->sizes[nd - 2] + TILE - 1) / TILE, (sh->sizes[nd - 1] + TILE - 1) / TILE,
                  (int64_t)tpurt_dtype_size(sdt), (int64_t)tpurt_dtype_size(ddt)};
    int64_t ntiles = n / (sh->sizes[nd - 2] * sh->sizes[nd - 1]) * t.tb0 * t.tb1;
    tpurt_parallel_for(ntiles, grain / (TILE * TILE) + 1, tile_chunk, &t);
    return;
  }
  tpurt_parallel_for(n, grain, nd_chunk, &x);
}

static tpurt_status k_strided(void *a, char *err, size_t errlen) {
  strided_args *x = a;
  char *d = tpurt__host_view(x->dst);
  const char *s = tpurt__host_view(x->src);
  nd_shape sh = x->sh;
  void *tmp = NULL;
  if (x->overlap) {
    int64_t n = shape_numel(&sh);
    size_t es = tpurt_dtype_size(x->sdt);
    tmp = malloc((size_t)n * es);
    if (!tmp) {
      snprintf(err, errlen, "out of host memory for an overlapping copy of %" PRId64 " elements", n);
      return TPURT_ERR_OUT_OF_MEMORY;
    }
    nd_shape t = sh;
    int64_t st = (int64_t)es;
    for (int k = t.ndim - 1; k >= 0; k--) {
      t.dstr[k] = st;
      st *= t.sizes[k];
    }
    run_nd(&t, tmp, s, x->sdt, x->sdt);
    for (int k = 0; k < sh.ndim; k++) sh.sstr[k] = t.dstr[k];
    s = tmp;
  }
  run_nd(&sh, d, s, x->ddt, x->sdt);
  free(tmp);
  return TPURT_OK;
}

/* drop size-1 dims and merge dims contiguous relative to each other in all
 * views (strides given in elements, output in bytes). */
static void coalesce(const tpurt_view *v0, const tpurt_view *v1, nd_shape *sh) {
  int64_t e0 = (int64_t)tpurt_dtype_size(v0->dtype), e1 = v1 ? (int64_t)tpurt_dtype_size(v1->dtype) : 0;
  /* dims in the destination's memory order (largest stride first; stable):
   * a copy between two views with the same permuted layout (x.t().float()
   * keeps x.t()'s strides) is then one contiguous run instead of a walk
   * along the permuted dims (1024 x 512 bf16 -> f32: 1.1 ms). Not when the
   * destination repeats elements (a zero stride): which write lands last
   * then follows the view's own order. */
  int ord[TPURT_MAX_DIMS], zero = 0;
  for (int k = 0; k < v0->ndim; k++) {
    ord[k] = k;
    zero |= v0->sizes[k] > 1 && v0->strides[k] == 0;
  }
  for (int i = 1; !zero && i < v0->ndim; i++)
    for (int j = i; j > 0 && iabs64(v0->strides[ord[j]]) > iabs64(v0->strides[ord[j - 1]]); j--) {
      int t = ord[j];
      ord[j] = ord[j - 1];
      ord[j - 1] = t;
    }
  int n = 0;
  for (int i = 0; i < v0->ndim; i++) {
    int k = ord[i];
    if (v0->sizes[k] == 1) continue;
    int64_t sz = v0->sizes[k], a = v0->strides[k] * e0, b = v1 ? v1->strides[k] * e1 : 0;
    if (n > 0 && sh->dstr[n - 1] == sz * a && sh->sstr[n - 1] == sz * b) {
      sh->sizes[n - 1] *= sz;
      sh->dstr[n - 1] = a;
      sh->sstr[n - 1] = b;
      continue;
    }
    sh->sizes[n] = sz;
    sh->dstr[n] = a;
    sh->sstr[n] = b;
    n++;
  }
  if (n == 0) {
    sh->sizes[0] = 1;
    sh->dstr[0] = e0;
    sh->sstr[0] = e1;
    n = 1;
  }
  sh->ndim = n;
}

/* The compute type of an elementwise program (a load and a store) that
 * converts src's dtype to dst's with the bits this copy gives (dtype.c's
 * conversions: the program's loads and stores make the same casts), or
 * TPURT_NUM_DTYPES where it would not: complex and uint64 (other rules);
 * float16 -> uint32 (through int64 here, row_f16_u32; a program's store
 * of a float value to uint32 takes float32's rule: NaN and -inf differ);
 * copies within half, bfloat16 or bool, which move bytes here and values
 * there (a NaN's payload, a bool byte other than 0 or 1 could change). In
 * DeferAndFuse such a copy is recorded as that program, so that it fuses
 * with the elementwise ops around it and its result need not take memory
 * (x.float() * w, autocast's casts; a copy next to the arithmetic that
 * produces or reads it); a copy that fuses with nothing runs as this copy
 * kernel all the same (graph/execute.c, lone_copy). */
static tpurt_dtype copy_compute(tpurt_dtype d, tpurt_dtype s) {
#define OTHER(t) ((t) == TPURT_C64 || (t) == TPURT_C128 || (t) == TPURT_U64 || (unsigned)(t) >= TPURT_NUM_DTYPES)
#define BYTES(t) ((t) == TPURT_F16 || (t) == TPURT_BF16 || (t) == TPURT_BOOL)
#define FLT(t) ((t) == TPURT_F16 || (t) == TPURT_BF16 || (t) == TPURT_F32 || (t) == TPURT_F64)
  if (OTHER(d) || OTHER(s) || (d == s && BYTES(d)) || (s == TPURT_F16 && d == TPURT_U32)) return TPURT_NUM_DTYPES;
  if (d == TPURT_F64 || s == TPURT_F64) return TPURT_F64;
  if (FLT(d) || FLT(s)) return TPURT_F32;
  return TPURT_I64;
#undef OTHER
#undef BYTES
#undef FLT
}

/* Which copies DeferAndFuse records as programs: casts and layout copies
 * within a dtype (contiguous() of a transpose, a stack's halves, an
 * expanded tensor made dense) by default; TORCH_TPU_DEFER_COPIES=casts
 * only dtype casts, =0 none. A layout copy joins the group that computes
 * its input also where that group walks the elements in another order
 * (RoPE's stack after the arithmetic in the projection's order: plan.c,
 * permuted members), and a copy whose result the backward pass reads is
 * recomputed instead of kept (Llama: peak 0.667x strict's against 0.702x
 * as casts only). Read per copy, for paired A/B runs. */
static int copies_as_programs(tpurt_dtype d, tpurt_dtype s) {
  const char *e = getenv("TORCH_TPU_DEFER_COPIES");
  if (e && *e == '0') return 0;
  if (e && strcmp(e, "casts") == 0) return d != s;
  return 1;
}

tpurt_status tpurt_copy_strided(tpurt_stream *s, const tpurt_view *dst, const tpurt_view *src) {
  return tpurt__copy_strided_named(s, dst, src, "copy_strided");
}

tpurt_status tpurt__copy_strided_named(tpurt_stream *s, const tpurt_view *dst, const tpurt_view *src,
                                       const char *name) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((st = tpurt__check_view(dst, "copy_strided (destination)")) || (st = tpurt__check_view(src, "copy_strided (source)")))
    return st;
  if (dst->ndim != src->ndim)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "copy_strided: shapes differ (%d vs %d dimensions)", dst->ndim,
                      src->ndim);
  for (int k = 0; k < dst->ndim; k++)
    if (dst->sizes[k] != src->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "copy_strided: shapes differ in dimension %d (%" PRId64 " vs %" PRId64 ")", k, dst->sizes[k],
                        src->sizes[k]);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(dst->ptr)))) return st;
  if (tpurt__view_numel(dst) == 0) return TPURT_OK;
  int64_t dlo, dhi, slo, shi;
  tpurt__view_extent(dst, &dlo, &dhi);
  tpurt__view_extent(src, &slo, &shi);
  if ((st = tpurt__check_dev_range(s->dev, dst->ptr, dlo, dhi, "copy_strided (destination)"))) return st;
  if ((st = tpurt__check_dev_range(s->dev, src->ptr, slo, shi, "copy_strided (source)"))) return st;
  strided_args a;
  memset(&a, 0, sizeof a);
  a.dst = dst->ptr;
  a.src = src->ptr;
  a.ddt = dst->dtype;
  a.sdt = src->dtype;
  coalesce(dst, src, &a.sh);
  /* overlapping, non-identical ranges: go through a temporary */
  uint64_t d0 = dst->ptr + (uint64_t)dlo, d1 = dst->ptr + (uint64_t)dhi;
  uint64_t s0 = src->ptr + (uint64_t)slo, s1 = src->ptr + (uint64_t)shi;
  if (d0 < s1 && s0 < d1) {
    int same = dst->ptr == src->ptr && dst->dtype == src->dtype;
    for (int k = 0; same && k < dst->ndim; k++) same = dst->sizes[k] == 1 || dst->strides[k] == src->strides[k];
    if (same) {
      /* identical: nothing to do unless dst has broadcasts (a no-op anyway) */
      return TPURT_OK;
    }
    a.overlap = 1;
  }
  if (!a.overlap && tpurt__deferring() && copies_as_programs(dst->dtype, src->dtype)) {
    tpurt_dtype c = copy_compute(dst->dtype, src->dtype);
    int bcast = 0; /* a destination that repeats an element (stride 0) */
    for (int k = 0; k < dst->ndim; k++) bcast |= dst->sizes[k] > 1 && dst->strides[k] == 0;
    if (c != TPURT_NUM_DTYPES && !bcast) {
      tpurt_ew_program prog = {.compute = c, .ninst = 1, .nout = 1};
      prog.inst[0].op = TPURT_EW_LOAD; /* dst = src[0], p0 = 0 */
      return tpurt__elementwise_named(s, &prog, dst, src, 1, NULL, 0, "copy");
    }
  }
  return tpurt_launch(s, name, k_strided, &a, sizeof a);
}

/* ---------------------------------------------------------------- fill */

typedef struct {
  tpurt_devptr dst;
  int esize;
  unsigned char pat[16];
  nd_shape sh;
} fill_args;

typedef struct {
  const nd_shape *sh;
  char *d;
  int esize;
  const unsigned char *pat;
} fill_ctx;

#define FILL_T(T)                                                  \
  do {                                                             \
    T v;                                                           \
    memcpy(&v, pat, sizeof v);                                     \
    if (ds == (int64_t)sizeof(T)) {                                \
      for (int64_t i = 0; i < n; i++) memcpy(d + i * (int64_t)sizeof(T), &v, sizeof v); \
    } else {                                                       \
      for (int64_t i = 0; i < n; i++) memcpy(d + i * ds, &v, sizeof v); \
    }                                                              \
  } while (0)

static void fill_row(char *d, int64_t ds, const unsigned char *pat, int esize, int64_t n) {
  int uniform = 1;
  for (int i = 1; i < esize; i++) uniform &= pat[i] == pat[0];
  if (uniform && ds == esize) {
    memset(d, pat[0], (size_t)(n * esize));
    return;
  }
  switch (esize) {
    case 1: FILL_T(uint8_t); break;
    case 2: FILL_T(uint16_t); break;
    case 4: FILL_T(uint32_t); break;
    case 8: FILL_T(uint64_t); break;
    default: FILL_T(u128); break;
  }
}

static void fill_chunk(void *c, int64_t b, int64_t e) {
  fill_ctx *x = c;
  const nd_shape *sh = x->sh;
  int nd = sh->ndim;
  int64_t idx[TPURT_MAX_DIMS];
  int64_t rem = b;
  char *d = x->d;
  for (int k = nd - 1; k >= 0; k--) {
    idx[k] = rem % sh->sizes[k];
    rem /= sh->sizes[k];
    d += idx[k] * sh->dstr[k];
  }
  int in = nd - 1;
  int64_t left = e - b;
  while (left > 0) {
    int64_t cnt = sh->sizes[in] - idx[in];
    if (cnt > left) cnt = left;
    fill_row(d, sh->dstr[in], x->pat, x->esize, cnt);
    left -= cnt;
    if (left <= 0) break;
    d -= idx[in] * sh->dstr[in];
    idx[in] = 0;
    for (int k = in - 1; k >= 0; k--) {
      idx[k]++;
      d += sh->dstr[k];
      if (idx[k] < sh->sizes[k]) break;
      d -= idx[k] * sh->dstr[k];
      idx[k] = 0;
    }
  }
}

static tpurt_status k_fill(void *a, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  fill_args *f = a;
  fill_ctx x = {&f->sh, tpurt__host_view(f->dst), f->esize, f->pat};
  int64_t n = shape_numel(&f->sh);
  tpurt_parallel_for(n, (int64_t)(PAR_BYTES / f->esize) / 4, fill_chunk, &x);
  return TPURT_OK;
}

tpurt_status tpurt_fill(tpurt_stream *s, const tpurt_view *dst, tpurt_scalar value) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((st = tpurt__check_view(dst, "fill"))) return st;
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(dst->ptr)))) return st;
  if (tpurt__view_numel(dst) == 0) return TPURT_OK;
  int64_t lo, hi;
  tpurt__view_extent(dst, &lo, &hi);
  if ((st = tpurt__check_dev_range(s->dev, dst->ptr, lo, hi, "fill"))) return st;
  fill_args f;
  memset(&f, 0, sizeof f);
  f.dst = dst->ptr;
  f.esize = (int)tpurt_dtype_size(dst->dtype);
  tpurt__store(dst->dtype, f.pat, tpurt__scalar_val(value));
  coalesce(dst, NULL, &f.sh);
  return tpurt_launch(s, "fill", k_fill, &f, sizeof f);
}
