/*
 * kcommon.h — helpers shared by the indexing, random and loss kernels:
 * launch-side view validation, element access by dtype and an N-d walker
 * over several views that advances row by row (the innermost dim is a
 * plain strided loop).
 */
#ifndef TPURT_KCOMMON_H
#define TPURT_KCOMMON_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../internal.h"

#define KC_MAXOPS 16

static inline int64_t kc_numel(const tpurt_view *v) { return tpurt__view_numel(v); }
/* element offset of the l-th element (row-major) of view v */
static inline int64_t kc_lin_off(const tpurt_view *v, int64_t l) {
  int64_t off = 0;
  for (int k = v->ndim - 1; k >= 0; k--) {
    int64_t i = l % v->sizes[k];
    l /= v->sizes[k];
    off += i * v->strides[k];
  }
  return off;
}
/* 1 if view v is row-major contiguous (size-1 dims aside): element l at offset l */
static inline int kc_dense(const tpurt_view *v) {
  int64_t st = 1;
  for (int k = v->ndim - 1; k >= 0; k--) {
    if (v->sizes[k] != 1 && v->strides[k] != st) return 0;
    st *= v->sizes[k];
  }
  return 1;
}

/* Validates a view and that its whole extent lies in dev's memory. */
static inline tpurt_status kc_check(int dev, const tpurt_view *v, const char *op, const char *what) {
  char buf[96];
  snprintf(buf, sizeof buf, "%s (%s)", op, what);
  tpurt_status st = tpurt__check_view(v, buf);
  return st ? st : tpurt__check_view_range(dev, v, buf);
}

/* kc_check of a view the kernel only reads: DeferAndFuse notes it
 * read-only (a launch's unmarked views count as written, which keeps
 * values from being recomputed across it and ends an early run, graph/execute.c). */
static inline tpurt_status kc_check_in(int dev, const tpurt_view *v, const char *op, const char *what) {
  tpurt__defer_note_reads(1);
  tpurt_status st = kc_check(dev, v, op, what);
  tpurt__defer_note_reads(0);
  return st;
}

static inline int kc_is_index_dtype(tpurt_dtype d) { return d == TPURT_I64 || d == TPURT_I32; }
static inline int kc_is_float(tpurt_dtype d) {
  return d == TPURT_F32 || d == TPURT_F64 || d == TPURT_F16 || d == TPURT_BF16;
}
static inline int kc_is_complex(tpurt_dtype d) { return d == TPURT_C64 || d == TPURT_C128; }

static inline int64_t kc_ld_idx(tpurt_dtype d, const char *p) {
  if (d == TPURT_I64) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
  }
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

/* Real element as double (bool/ints exact up to 2^53). */
static inline double kc_ld(tpurt_dtype d, const char *p) {
  switch (d) {
    case TPURT_F32: { float v; memcpy(&v, p, 4); return v; }
    case TPURT_F64: { double v; memcpy(&v, p, 8); return v; }
    case TPURT_BF16: { uint16_t v; memcpy(&v, p, 2); return tpurt__bf16_to_f32(v); }
    case TPURT_F16: { uint16_t v; memcpy(&v, p, 2); return tpurt__f16_to_f32(v); }
    case TPURT_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case TPURT_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case TPURT_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case TPURT_I8: return (double)*(const int8_t *)p;
    case TPURT_U8: return (double)*(const uint8_t *)p;
    case TPURT_BOOL: return *(const uint8_t *)p != 0;
    default: {
      tpurt__val v = tpurt__load(d, p);
      return v.cls == 2 ? v.re : v.cls == 1 ? (double)v.u : (double)v.i;
    }
  }
}
static inline void kc_st(tpurt_dtype d, char *p, double x) {
  switch (d) {
    case TPURT_F32: { float v = (float)x; memcpy(p, &v, 4); return; }
    case TPURT_F64: memcpy(p, &x, 8); return;
    case TPURT_BF16: { uint16_t v = tpurt__f32_to_bf16((float)x); memcpy(p, &v, 2); return; }
    case TPURT_F16: { uint16_t v = tpurt__f32_to_f16((float)x); memcpy(p, &v, 2); return; }
    case TPURT_BOOL: *(uint8_t *)p = x != 0; return;
    default: {
      tpurt__val v = {2, 0, 0, x, 0};
      tpurt__store(d, p, v);
    }
  }
}
/* Integer element as int64 (exact for every integer dtype but u64 > 2^63). */
static inline int64_t kc_ldi(tpurt_dtype d, const char *p) {
  switch (d) {
    case TPURT_I64: { int64_t v; memcpy(&v, p, 8); return v; }
    case TPURT_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case TPURT_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case TPURT_I8: return *(const int8_t *)p;
    case TPURT_U8: return *(const uint8_t *)p;
    case TPURT_BOOL: return *(const uint8_t *)p != 0;
    default: {
      tpurt__val v = tpurt__load(d, p);
      return v.cls == 2 ? (int64_t)v.re : v.cls == 1 ? (int64_t)v.u : v.i;
    }
  }
}
static inline void kc_sti(tpurt_dtype d, char *p, int64_t x) {
  switch (d) {
    case TPURT_I64: memcpy(p, &x, 8); return;
    case TPURT_I32: { int32_t v = (int32_t)x; memcpy(p, &v, 4); return; }
    case TPURT_I16: { int16_t v = (int16_t)x; memcpy(p, &v, 2); return; }
    case TPURT_I8: *(int8_t *)p = (int8_t)x; return;
    case TPURT_U8: *(uint8_t *)p = (uint8_t)x; return;
    case TPURT_BOOL: *(uint8_t *)p = x != 0; return;
    default: {
      tpurt__val v = {0, x, (uint64_t)x, (double)x, 0};
      tpurt__store(d, p, v);
    }
  }
}

static inline void kc_move(char *d, const char *s, int es) {
  switch (es) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, 16); break;
  }
}

/* N-d walk over a shape shared by nops views (byte strides). */
typedef struct kc_iter {
  int ndim, nops;
  int64_t sizes[TPURT_MAX_DIMS];
  int64_t str[KC_MAXOPS][TPURT_MAX_DIMS]; /* bytes */
} kc_iter;

/* Builds the walker from the views' element strides over shape (sizes of
 * views[0] unless shape given). Size-1 dims are dropped, mergeable dims
 * are merged. */
static inline void kc_iter_init(kc_iter *it, int nops, const tpurt_view *const *views, const tpurt_view *shape) {
  const tpurt_view *sh = shape ? shape : views[0];
  it->nops = nops;
  int n = 0;
  for (int k = 0; k < sh->ndim; k++) {
    int64_t sz = sh->sizes[k];
    if (sz == 1) continue;
    int merge = n > 0;
    for (int o = 0; o < nops && merge; o++) {
      int64_t st = views[o]->strides[k] * (int64_t)tpurt_dtype_size(views[o]->dtype);
      merge = it->str[o][n - 1] == sz * st;
    }
    if (merge) {
      it->sizes[n - 1] *= sz;
      for (int o = 0; o < nops; o++)
        it->str[o][n - 1] = views[o]->strides[k] * (int64_t)tpurt_dtype_size(views[o]->dtype);
      continue;
    }
    it->sizes[n] = sz;
    for (int o = 0; o < nops; o++)
      it->str[o][n] = views[o]->strides[k] * (int64_t)tpurt_dtype_size(views[o]->dtype);
    n++;
  }
  if (n == 0) {
    it->sizes[0] = 1;
    for (int o = 0; o < nops; o++) it->str[o][0] = 0;
    n = 1;
  }
  it->ndim = n;
}
static inline int64_t kc_iter_rows(const kc_iter *it) {
  int64_t r = 1;
  for (int k = 0; k < it->ndim - 1; k++) r *= it->sizes[k];
  return r;
}
static inline int64_t kc_iter_inner(const kc_iter *it) { return it->sizes[it->ndim - 1]; }
/* Byte offsets of row r (all dims but the innermost) for every operand. */
static inline void kc_iter_row(const kc_iter *it, int64_t r, int64_t *off) {
  for (int o = 0; o < it->nops; o++) off[o] = 0;
  for (int k = it->ndim - 2; k >= 0; k--) {
    int64_t i = r % it->sizes[k];
    r /= it->sizes[k];
    for (int o = 0; o < it->nops; o++) off[o] += i * it->str[o][k];
  }
}
/* Element strides of row-major linear index -> coordinate decomposition. */
static inline void kc_unravel(int64_t lin, int nd, const int64_t *sizes, int64_t *coord) {
  for (int k = nd - 1; k >= 0; k--) {
    coord[k] = sizes[k] ? lin % sizes[k] : 0;
    lin = sizes[k] ? lin / sizes[k] : 0;
  }
}

/* Per-kernel error slot (first error wins) shared by parallel chunks. */
typedef struct kc_err {
  _Atomic int set;
  char msg[256];
} kc_err;
static inline void kc_err_index(kc_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void kc_err_index(kc_err *e, const char *fmt, ...) {
  int exp = 0;
  if (!atomic_compare_exchange_strong(&e->set, &exp, 1)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
}
static inline tpurt_status kc_err_finish(kc_err *e, tpurt_status st, char *err, size_t errlen) {
  if (!atomic_load(&e->set)) return TPURT_OK;
  snprintf(err, errlen, "%s", e->msg);
  return st;
}

#define KC_GRAIN 16384

#endif
