/*
 * rk_common.h — helpers shared by the reduction-family kernels (reduce.c,
 * scan.c, softmax.c, norm.c): view validation, row loads that convert any
 * dtype into a compute type (f32, f64, i64), and value / row stores.
 */
#ifndef TPURT_RK_COMMON_H
#define TPURT_RK_COMMON_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../internal.h"

/* host view of a device address; NULL for the null address (empty tensors) */
static inline void *rk_hv(tpurt_devptr p) { return p ? tpurt__host_view(p) : NULL; }

/* compute classes */
enum { RK_F32 = 0, RK_F64 = 1, RK_I64 = 2 };

static inline int rk_is_float(tpurt_dtype dt) {
  return dt == TPURT_F16 || dt == TPURT_BF16 || dt == TPURT_F32 || dt == TPURT_F64;
}
static inline int rk_is_complex(tpurt_dtype dt) { return dt == TPURT_C64 || dt == TPURT_C128; }
/* compute class of a value of dtype dt */
static inline int rk_class(tpurt_dtype dt) {
  if (dt == TPURT_F64) return RK_F64;
  if (rk_is_float(dt)) return RK_F32;
  return RK_I64;
}
/* dtype the compute class reads without conversion */
static inline tpurt_dtype rk_native(int cls) { return cls == RK_F32 ? TPURT_F32 : cls == RK_F64 ? TPURT_F64 : TPURT_I64; }
static inline size_t rk_csize(int cls) { return cls == RK_F32 ? 4 : 8; }

/* launch-side view checks: see view.c */
static inline tpurt_status rk_check_view(const tpurt_view *v, const char *what) { return tpurt__check_view(v, what); }
static inline int64_t rk_numel(const tpurt_view *v) { return tpurt__view_numel(v); }
static inline tpurt_status rk_check_range(int dev, const tpurt_view *v, const char *what) {
  return tpurt__check_view_range(dev, v, what);
}

static inline int rk_same_shape(const tpurt_view *a, const tpurt_view *b) {
  if (a->ndim != b->ndim) return 0;
  for (int k = 0; k < a->ndim; k++)
    if (a->sizes[k] != b->sizes[k]) return 0;
  return 1;
}

/* ------------------------------------------------ lines along one dim */
/* Work along one dim of up to RK_LINES_MAX same-shape views (softmax,
 * scans): the other dims enumerate the lines; view v's line l starts at
 * element offset rk_line_offsets(...)[v] and steps by step[v]. */
#define RK_LINES_MAX 3
typedef struct {
  int64_t D;      /* length of each line */
  int64_t nlines; /* number of lines */
  int no;         /* number of (non-trivial) outer dims */
  int64_t step[RK_LINES_MAX];
  int64_t osz[TPURT_MAX_DIMS];
  int64_t ost[RK_LINES_MAX][TPURT_MAX_DIMS];
} rk_lines;

/* shape gives the sizes; v[i] may be NULL (its strides are then 0). */
static inline void rk_lines_plan(rk_lines *L, const tpurt_view *shape, int dim, const tpurt_view *const *v, int nv) {
  int nd = shape->ndim;
  memset(L, 0, sizeof *L);
  L->D = nd ? shape->sizes[dim] : 1;
  for (int i = 0; i < nv; i++) L->step[i] = nd && v[i] ? v[i]->strides[dim] : 0;
  L->nlines = 1;
  for (int k = 0; k < nd; k++) {
    if (k == dim || shape->sizes[k] == 1) continue;
    L->osz[L->no] = shape->sizes[k];
    for (int i = 0; i < nv; i++) L->ost[i][L->no] = v[i] ? v[i]->strides[k] : 0;
    L->nlines *= shape->sizes[k];
    /* an outer dim that continues the previous one in every view (the
     * previous one's step is this one's size times its step) is merged
     * into it: the same lines in the same order, one division fewer per
     * line in rk_line_offsets (a [16, 4, 64, 64] softmax had three) */
    int merge = L->no > 0;
    for (int i = 0; i < nv && merge; i++) merge = L->ost[i][L->no - 1] == L->ost[i][L->no] * L->osz[L->no];
    if (merge) {
      L->osz[L->no - 1] *= L->osz[L->no];
      for (int i = 0; i < nv; i++) L->ost[i][L->no - 1] = L->ost[i][L->no];
      for (int i = 0; i < RK_LINES_MAX; i++) L->ost[i][L->no] = 0;
      L->osz[L->no] = 0;
    } else {
      L->no++;
    }
  }
}

/* Element offsets of line l in each of the nv views. */
static inline void rk_line_offsets(const rk_lines *L, int64_t l, int nv, int64_t *off) {
  for (int i = 0; i < nv; i++) off[i] = 0;
  for (int k = L->no - 1; k >= 0; k--) {
    int64_t j = l % L->osz[k];
    l /= L->osz[k];
    for (int i = 0; i < nv; i++) off[i] += j * L->ost[i][k];
  }
}

/* ------------------------------------------------------------ row loads */
/* d[i] = convert(src[i * st]) for i < n; st in elements of dt. */
#define RK_LOAD_LOOP(T, CONV)                                  \
  do {                                                         \
    const T *s_ = (const T *)p;                                \
    if (st == 1)                                               \
      for (int64_t i = 0; i < n; i++) d[i] = CONV(s_[i]);      \
    else                                                       \
      for (int64_t i = 0; i < n; i++) d[i] = CONV(s_[i * st]); \
  } while (0)
#define RK_ID(x) (x)
#define RK_B(x) ((x) != 0)

#define RK_DEFINE_LOAD(NAME, CT, FF, HF, BF)                                           \
  static inline void NAME(CT *d, const char *p, tpurt_dtype dt, int64_t st, int64_t n) { \
    switch (dt) {                                                                      \
      case TPURT_F32: RK_LOAD_LOOP(float, FF); break;                                  \
      case TPURT_F64: RK_LOAD_LOOP(double, FF); break;                                 \
      case TPURT_F16: RK_LOAD_LOOP(uint16_t, HF); break;                               \
      case TPURT_BF16: RK_LOAD_LOOP(uint16_t, BF); break;                              \
      case TPURT_BOOL: RK_LOAD_LOOP(uint8_t, (CT)RK_B); break;                         \
      case TPURT_U8: RK_LOAD_LOOP(uint8_t, (CT)); break;                               \
      case TPURT_I8: RK_LOAD_LOOP(int8_t, (CT)); break;                                \
      case TPURT_I16: RK_LOAD_LOOP(int16_t, (CT)); break;                              \
      case TPURT_I32: RK_LOAD_LOOP(int32_t, (CT)); break;                              \
      case TPURT_I64: RK_LOAD_LOOP(int64_t, (CT)); break;                              \
      case TPURT_U16: RK_LOAD_LOOP(uint16_t, (CT)); break;                             \
      case TPURT_U32: RK_LOAD_LOOP(uint32_t, (CT)); break;                             \
      case TPURT_U64: RK_LOAD_LOOP(uint64_t, (CT)); break;                             \
      case TPURT_C64: {                                                                \
        const float *s_ = (const float *)p;                                            \
        for (int64_t i = 0; i < n; i++) d[i] = FF(s_[2 * i * st]);                      \
        break;                                                                         \
      }                                                                                \
      default: {                                                                       \
        const double *s_ = (const double *)p;                                          \
        for (int64_t i = 0; i < n; i++) d[i] = FF(s_[2 * i * st]);                      \
        break;                                                                         \
      }                                                                                \
    }                                                                                  \
  }
#define RK_F_FF(x) ((float)(x))
#define RK_F_HF(x) tpurt__f16_to_f32(x)
#define RK_F_BF(x) tpurt__bf16_to_f32(x)
#define RK_D_FF(x) ((double)(x))
#define RK_D_HF(x) ((double)tpurt__f16_to_f32(x))
#define RK_D_BF(x) ((double)tpurt__bf16_to_f32(x))
#define RK_I_FF(x) tpurt__f2i64((double)(x))
#define RK_I_HF(x) tpurt__f2i64((double)tpurt__f16_to_f32(x))
#define RK_I_BF(x) tpurt__f2i64((double)tpurt__bf16_to_f32(x))
RK_DEFINE_LOAD(rk_load_f32, float, RK_F_FF, RK_F_HF, RK_F_BF)
RK_DEFINE_LOAD(rk_load_f64, double, RK_D_FF, RK_D_HF, RK_D_BF)
RK_DEFINE_LOAD(rk_load_i64, int64_t, RK_I_FF, RK_I_HF, RK_I_BF)

/* loads n elements into buf as compute class cls; returns a pointer to the
 * compute-typed data (p itself when no conversion is needed). */
static inline const void *rk_load(int cls, void *buf, const char *p, tpurt_dtype dt, int64_t st, int64_t n) {
  if (st == 1 && dt == rk_native(cls)) return p;
  if (cls == RK_F32)
    rk_load_f32(buf, p, dt, st, n);
  else if (cls == RK_F64)
    rk_load_f64(buf, p, dt, st, n);
  else
    rk_load_i64(buf, p, dt, st, n);
  return buf;
}

/* ---------------------------------------------------------------- stores */
static inline void rk_store_d(char *p, tpurt_dtype dt, double v) {
  switch (dt) {
    case TPURT_F32: *(float *)p = (float)v; break;
    case TPURT_F64: *(double *)p = v; break;
    case TPURT_F16: *(uint16_t *)p = tpurt__f32_to_f16((float)v); break;
    case TPURT_BF16: *(uint16_t *)p = tpurt__f32_to_bf16((float)v); break;
    default: {
      tpurt__val x = {2, 0, 0, v, 0.0};
      tpurt__store(dt, p, x);
    }
  }
}
static inline void rk_store_i(char *p, tpurt_dtype dt, int64_t v) {
  switch (dt) {
    case TPURT_I64: *(int64_t *)p = v; break;
    case TPURT_BOOL: *(uint8_t *)p = v != 0; break;
    case TPURT_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v; break;
    case TPURT_F32: *(float *)p = (float)v; break;
    case TPURT_F64: *(double *)p = (double)v; break;
    default: {
      tpurt__val x = {0, v, (uint64_t)v, 0.0, 0.0};
      tpurt__store(dt, p, x);
    }
  }
}

/* dst[i * st] = convert(src[i]) from f32 / f64 rows */
#define RK_STORE_LOOP(T, CONV)                               \
  do {                                                       \
    T *d_ = (T *)p;                                          \
    if (st == 1)                                             \
      for (int64_t i = 0; i < n; i++) d_[i] = CONV(s[i]);    \
    else                                                     \
      for (int64_t i = 0; i < n; i++) d_[i * st] = CONV(s[i]); \
  } while (0)
#define RK_DEFINE_STORE(NAME, CT)                                                 \
  static inline void NAME(char *p, tpurt_dtype dt, int64_t st, const CT *s, int64_t n) { \
    switch (dt) {                                                                 \
      case TPURT_F32: RK_STORE_LOOP(float, (float)); break;                       \
      case TPURT_F64: RK_STORE_LOOP(double, (double)); break;                     \
      case TPURT_F16: RK_STORE_LOOP(uint16_t, tpurt__f32_to_f16); break;          \
      case TPURT_BF16: RK_STORE_LOOP(uint16_t, tpurt__f32_to_bf16); break;        \
      default:                                                                    \
        for (int64_t i = 0; i < n; i++)                                           \
          rk_store_d(p + i * st * (int64_t)tpurt_dtype_size(dt), dt, (double)s[i]); \
    }                                                                             \
  }
RK_DEFINE_STORE(rk_store_row_f32, float)
RK_DEFINE_STORE(rk_store_row_f64, double)

/* Sums over eight independent lanes, combined in a fixed order (so results
 * stay deterministic): a plain `s += a[i]` is one dependent chain of double
 * adds (~4 cycles an element), the lanes are vector adds. With AVX the main
 * loop is two 4-lane registers per sum (gcc's own vectorization of the
 * plain-C lanes spilled them to the stack); the lanes, their order and the
 * scalar tail are the same as the portable loop's. */
#define RK_LANES 8
#define RK_FOLD(acc) \
  (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])))
#ifdef __AVX__
#include <immintrin.h>
static inline void rk_lanes_out(__m256d lo, __m256d hi, double *acc) {
  _mm256_storeu_pd(acc, lo);
  _mm256_storeu_pd(acc + 4, hi);
}
#endif
/* Running lane sums of (a - c) and (a - c)^2 over [0, n) (mom: s[8], q[8]). */
typedef struct {
  double s[RK_LANES], q[RK_LANES];
} rk_mom;
#ifdef __AVX__
typedef struct {
  __m256d s0, s1, q0, q1;
} rk_mom_v;
/* one step of eight elements x0 (lanes 0-3), x1 (lanes 4-7) */
static inline void rk_mom_step_v(rk_mom_v *m, __m256d x0, __m256d x1, __m256d vc) {
  __m256d d0 = _mm256_sub_pd(x0, vc), d1 = _mm256_sub_pd(x1, vc);
  m->s0 = _mm256_add_pd(m->s0, d0);
  m->s1 = _mm256_add_pd(m->s1, d1);
  m->q0 = _mm256_add_pd(m->q0, _mm256_mul_pd(d0, d0));
  m->q1 = _mm256_add_pd(m->q1, _mm256_mul_pd(d1, d1));
}
static inline void rk_mom_step(rk_mom_v *m, const double *a, __m256d vc) {
  rk_mom_step_v(m, _mm256_loadu_pd(a), _mm256_loadu_pd(a + 4), vc);
}
/* the same on f32 elements, each widened exactly */
static inline void rk_mom_step_f32(rk_mom_v *m, const float *a, __m256d vc) {
  rk_mom_step_v(m, _mm256_cvtps_pd(_mm_loadu_ps(a)), _mm256_cvtps_pd(_mm_loadu_ps(a + 4)), vc);
}
static inline void rk_mom_out(const rk_mom_v *m, rk_mom *o) {
  rk_lanes_out(m->s0, m->s1, o->s);
  rk_lanes_out(m->q0, m->q1, o->q);
}
#endif
/* the lanes' scalar tail from i, and the fold (T: the row's element type) */
#define RK_MOM_FINISH(NAME, T)                                                                           \
  static inline void NAME(rk_mom *m, const T *a, double c, int64_t i, int64_t n, double *sum, double *sq) { \
    for (; i < n; i++) {                                                                                 \
      double d = (double)a[i] - c;                                                                       \
      m->s[i & 7] += d;                                                                                  \
      m->q[i & 7] += d * d;                                                                              \
    }                                                                                                    \
    *sum = RK_FOLD(m->s);                                                                                \
    *sq = RK_FOLD(m->q);                                                                                 \
  }
RK_MOM_FINISH(rk_mom_finish, double)
RK_MOM_FINISH(rk_mom_finish_f32, float)
/* sum of (a - c) and of (a - c)^2 */
static inline void rk_moments_lanes(const double *a, double c, int64_t n, double *sum, double *sq) {
  rk_mom m = {{0}, {0}};
  int64_t i = 0;
#ifdef __AVX__
  __m256d vc = _mm256_set1_pd(c), z = _mm256_setzero_pd();
  rk_mom_v v = {z, z, z, z};
  for (; i + RK_LANES <= n; i += RK_LANES) rk_mom_step(&v, a + i, vc);
  rk_mom_out(&v, &m);
#else
  for (; i + RK_LANES <= n; i += RK_LANES)
    for (int j = 0; j < RK_LANES; j++) {
      double d = a[i + j] - c;
      m.s[j] += d;
      m.q[j] += d * d;
    }
#endif
  rk_mom_finish(&m, a, c, i, n, sum, sq);
}
/* The same for two rows a and b (centers ca, cb) in one loop: each row's
 * lanes get the same additions in the same order as in rk_moments_lanes
 * (the same bits), and the two rows' dependent add chains overlap (one
 * row's chains alone bound a 128-element row by the add latency).
 * rk_moments_lanes2_f32 reads two f32 rows in place, each element widened
 * exactly as a conversion to a double buffer would (the same bits). */
#ifdef __AVX__
#define RK_MOMENTS2(NAME, T, STEP, FINISH)                                                                   \
  static inline void NAME(const T *a, double ca, const T *b, double cb, int64_t n, double *suma, double *sqa, \
                          double *sumb, double *sqb) {                                                        \
    rk_mom ma = {{0}, {0}}, mb = {{0}, {0}};                                                                  \
    int64_t i = 0;                                                                                            \
    __m256d va = _mm256_set1_pd(ca), vb = _mm256_set1_pd(cb), z = _mm256_setzero_pd();                        \
    rk_mom_v xa = {z, z, z, z}, xb = {z, z, z, z};                                                            \
    for (; i + RK_LANES <= n; i += RK_LANES) {                                                                \
      STEP(&xa, a + i, va);                                                                                   \
      STEP(&xb, b + i, vb);                                                                                   \
    }                                                                                                         \
    rk_mom_out(&xa, &ma);                                                                                     \
    rk_mom_out(&xb, &mb);                                                                                     \
    FINISH(&ma, a, ca, i, n, suma, sqa);                                                                      \
    FINISH(&mb, b, cb, i, n, sumb, sqb);                                                                      \
  }
RK_MOMENTS2(rk_moments_lanes2, double, rk_mom_step, rk_mom_finish)
RK_MOMENTS2(rk_moments_lanes2_f32, float, rk_mom_step_f32, rk_mom_finish_f32)
#else
static inline void rk_moments_lanes2(const double *a, double ca, const double *b, double cb, int64_t n, double *suma,
                                     double *sqa, double *sumb, double *sqb) {
  rk_moments_lanes(a, ca, n, suma, sqa);
  rk_moments_lanes(b, cb, n, sumb, sqb);
}
#endif
/* sum of g and of g * (x - c) */
static inline void rk_gdot_lanes(const double *g, const double *x, double c, int64_t n, double *sum, double *dot) {
  double s[RK_LANES] = {0}, d[RK_LANES] = {0};
  int64_t i = 0;
#ifdef __AVX__
  __m256d vc = _mm256_set1_pd(c), s0 = _mm256_setzero_pd(), s1 = s0, d0 = s0, d1 = s0;
  for (; i + RK_LANES <= n; i += RK_LANES) {
    __m256d g0 = _mm256_loadu_pd(g + i), g1 = _mm256_loadu_pd(g + i + 4);
    s0 = _mm256_add_pd(s0, g0);
    s1 = _mm256_add_pd(s1, g1);
    d0 = _mm256_add_pd(d0, _mm256_mul_pd(g0, _mm256_sub_pd(_mm256_loadu_pd(x + i), vc)));
    d1 = _mm256_add_pd(d1, _mm256_mul_pd(g1, _mm256_sub_pd(_mm256_loadu_pd(x + i + 4), vc)));
  }
  rk_lanes_out(s0, s1, s);
  rk_lanes_out(d0, d1, d);
#else
  for (; i + RK_LANES <= n; i += RK_LANES)
    for (int j = 0; j < RK_LANES; j++) {
      s[j] += g[i + j];
      d[j] += g[i + j] * (x[i + j] - c);
    }
#endif
  for (; i < n; i++) {
    s[i & 7] += g[i];
    d[i & 7] += g[i] * (x[i] - c);
  }
  *sum = RK_FOLD(s);
  *dot = RK_FOLD(d);
}

/* NaN-propagating max / min */
static inline double rk_maxnan(double a, double b) { return a != a ? a : (b != b || b > a) ? b : a; }
static inline double rk_minnan(double a, double b) { return a != a ? a : (b != b || b < a) ? b : a; }

#endif
