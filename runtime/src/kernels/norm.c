/*
 * norm.c — layer norm / RMS norm, batch norm and group norm, forward and
 * backward. Rows are loaded into f64 buffers (statistics are computed in
 * two passes in f64), the results converted on store; batch and group
 * norm's f32 / bf16 rows of unit stride go from memory into f64 vector
 * lanes directly (AVX-512, or the same lanes in AVX2 registers). Paired (alternating processes, device kernel times, 16 x 32 x
 * 32 x 32): forward 163-182 -> 105-135 us, backward 244-262 -> 115-160 us. Forward and the input
 * gradient run in parallel over rows (layer norm), channels (batch norm) or
 * (sample, group) pairs (group norm); weight / bias gradients run in
 * parallel over column blocks or channels, so no atomics or partial buffers
 * are needed and results are deterministic.
 */
#include "fused.h"
#include "rk_common.h"
#include "gemm_internal.h" /* tpurt__cpu_has_avx512 */
#include "bf16_simd.h"      /* rne_bf16 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define NCH 1024 /* load chunk (elements) */

/* dims [d0, d1) of v (size-1 dims ignored) as one (count, stride); 0 if they
 * do not merge */
static int flat_range(const tpurt_view *v, int d0, int d1, int64_t *n, int64_t *st) {
  int64_t cnt = 1, s = 1;
  int first = 1;
  for (int k = 0; k < v->ndim; k++)
    if (v->sizes[k] == 0) { /* no element (here or in the other range): any strides address it */
      for (int j = d0; j < d1; j++) cnt *= v->sizes[j];
      *n = cnt;
      *st = 1;
      return 1;
    }
  for (int k = d1 - 1; k >= d0; k--) {
    if (v->sizes[k] == 1) continue;
    if (first) {
      s = v->strides[k];
      first = 0;
    } else if (v->strides[k] != cnt * s) {
      return 0;
    }
    cnt *= v->sizes[k];
  }
  *n = cnt;
  *st = s;
  return 1;
}

/* an optional 1-D-addressable vector of n elements */
typedef struct {
  tpurt_devptr ptr;
  tpurt_dtype dt;
  int64_t st;
  int on;
} vec;

static tpurt_status get_vec(int dev, const tpurt_view *v, int64_t n, vec *out, const char *nm, const char *what) {
  memset(out, 0, sizeof *out);
  if (!v) return TPURT_OK;
  tpurt_status st;
  if ((st = rk_check_view(v, nm))) return st;
  int64_t cnt, s;
  if (!flat_range(v, 0, v->ndim, &cnt, &s) || cnt != n)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must have %" PRId64 " elements addressable with one stride",
                      nm, what, n);
  if ((st = rk_check_range(dev, v, nm))) return st;
  out->ptr = v->ptr;
  out->dt = v->dtype;
  out->st = s;
  out->on = 1;
  return TPURT_OK;
}

static inline char *vptr(const vec *v) { return v->on ? rk_hv(v->ptr) : NULL; }
static inline double vget(const vec *v, const char *base, int64_t i, double dflt) {
  if (!base) return dflt;
  double d;
  rk_load_f64(&d, base + i * v->st * (int64_t)tpurt_dtype_size(v->dt), v->dt, 1, 1);
  return d;
}
static inline void vset(const vec *v, char *base, int64_t i, double x) {
  if (base) rk_store_d(base + i * v->st * (int64_t)tpurt_dtype_size(v->dt), v->dt, x);
}
/* loads the whole vector (n elements) as f64, or fills dflt */
static void vload(const vec *v, const char *base, int64_t n, double *d, double dflt) {
  if (!base) {
    for (int64_t i = 0; i < n; i++) d[i] = dflt;
    return;
  }
  rk_load_f64(d, base, v->dt, v->st, n);
}

/* a 2-D strided matrix [rows, cols] */
typedef struct {
  tpurt_devptr ptr;
  tpurt_dtype dt;
  int64_t rs, cs;
  int on;
} mat;
static inline char *mrow(const mat *m, char *base, int64_t r) {
  return base + r * m->rs * (int64_t)tpurt_dtype_size(m->dt);
}

/* y = (x - mean) * inv * w + b over one row in the data's own type (f32 or
 * f64), one rounding per operation in this order and no contraction into
 * fma: bitwise what norm_apply's elementwise program computes. Strict eager
 * runs this inside the statistics kernel; DeferAndFuse records the program
 * (to fuse and recompute it), and both modes agree to the bit. An absent
 * mean, w or b is 0, 1 or -0.0 here: x - 0, x * 1 and x + -0.0 are x for
 * every x (signed zeros included), so they stand for the skipped
 * instruction — except an absent b after a present w in layer and batch
 * norm (not RMS norm), which is +0.0 and a real addition in the program
 * too: the CPU's layer norm adds its zero bias, so an exact zero times a
 * negative weight comes out +0, not -0. w and b hold same-typed values as f64, per element
 * (wst 1) or one for the row (wst 0). */
typedef struct {
  double mean, inv;
  const double *w, *b;
  int64_t wst;
} apply_k;
#define APPLY_ROW(NAME, T)                                                                                   \
  __attribute__((optimize("fp-contract=off"))) static void NAME(char *yr, int64_t ys, const char *xr,       \
                                                                  int64_t xs, int64_t n, const apply_k *k) { \
    T *restrict y = (T *)yr;                                                                                 \
    const T *restrict x = (const T *)xr;                                                                     \
    const T m = (T)k->mean, r = (T)k->inv;                                                                   \
    const double *restrict w = k->w, *restrict b = k->b;                                                     \
    if (xs == 1 && ys == 1 && k->wst == 1) {                                                                 \
      for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - m) * r) * (T)w[i] + (T)b[i];                          \
    } else if (xs == 1 && ys == 1) {                                                                         \
      const T w0 = (T)w[0], b0 = (T)b[0];                                                                    \
      for (int64_t i = 0; i < n; i++) y[i] = ((x[i] - m) * r) * w0 + b0;                                     \
    } else {                                                                                                 \
      for (int64_t i = 0; i < n; i++) y[i * ys] = ((x[i * xs] - m) * r) * (T)w[i * k->wst] + (T)b[i * k->wst]; \
    }                                                                                                        \
  }
APPLY_ROW(apply_row_f32, float)
APPLY_ROW(apply_row_f64, double)
static void apply_row(tpurt_dtype dt, char *yr, int64_t ys, const char *xr, int64_t xs, int64_t n, const apply_k *k) {
  if (dt == TPURT_F32)
    apply_row_f32(yr, ys, xr, xs, n, k);
  else
    apply_row_f64(yr, ys, xr, xs, n, k);
}

/* =========================================================== layer norm */

typedef struct {
  int rms, fwd; /* fwd: statistics (and y when given) */
  int ew_apply; /* y by apply_row (the split form's arithmetic), not in f64 */
  double eps;
  int64_t rows, cols;
  mat x, y, dy, dx;
  vec w, b, mean, rstd, dw, db;
} lnplan;

typedef struct {
  const lnplan *p;
  char *x, *y, *dy, *dx, *w, *b, *mean, *rstd, *dw, *db;
  int failed;
  int64_t parts; /* row parts of the weight / bias gradient sums */
  double *part;  /* their partial sums: [parts][dw cols, db cols] */
} lnctx;

/* Row r's statistics (mean, and var = the sum of squares about it) saved
 * and its output written (row values in buf, as f64). */
static void ln_fwd_finish(const lnctx *x, int64_t r, double *buf, double mean, double var, const double *w,
                          const double *b) {
  const lnplan *p = x->p;
  int64_t n = p->cols, xes = (int64_t)tpurt_dtype_size(p->x.dt), yes = (int64_t)tpurt_dtype_size(p->y.dt);
  var /= (double)n;
  double rstd = 1.0 / sqrt(var + p->eps);
  vset(&p->mean, x->mean, r, mean);
  vset(&p->rstd, x->rstd, r, rstd);
  if (x->y && p->ew_apply) {
    apply_k k = {mean, rstd, w, b, 1};
    apply_row(p->x.dt, x->y + r * p->y.rs * yes, p->y.cs, x->x + r * p->x.rs * xes, p->x.cs, n, &k);
  } else if (x->y) {
    for (int64_t i = 0; i < n; i++) buf[i] = (buf[i] - mean) * rstd * w[i] + b[i];
    rk_store_row_f64(x->y + r * p->y.rs * yes, p->y.dt, p->y.cs, buf, n);
  }
}

/* Rows two at a time: their moment passes run in one loop (the same sums
 * per row, see rk_moments_lanes2). */
static void ln_fwd_rows(void *c, int64_t rb, int64_t re) {
  lnctx *x = c;
  const lnplan *p = x->p;
  int64_t n = p->cols;
  double *buf = malloc(sizeof(double) * (size_t)n * 4);
  if (!buf) {
    x->failed = 1;
    return;
  }
  double *buf2 = buf + n, *w = buf + 2 * n, *b = buf + 3 * n;
  vload(&p->w, x->w, n, w, 1.0);
  vload(&p->b, x->b, n, b, p->w.on && !p->rms ? 0.0 : -0.0); /* see apply_k */
  int64_t xes = (int64_t)tpurt_dtype_size(p->x.dt);
#ifdef __AVX__
  /* f32 rows of unit stride whose output (if any) apply_row writes from x itself: pairs of rows are read
   * in place, without their double copies (the same sums, rk_moments_lanes2_f32) */
  int fast = p->x.dt == TPURT_F32 && p->x.cs == 1 && (!x->y || p->ew_apply);
#endif
  for (int64_t r = rb; r < re; r += 2) {
    int two = r + 1 < re;
#ifdef __AVX__
    if (fast && two) {
      const float *xa = (const float *)(x->x + r * p->x.rs * xes), *xb = (const float *)(x->x + (r + 1) * p->x.rs * xes);
      double sa, qa, sb, qb, ma = 0.0, mb = 0.0;
      rk_moments_lanes2_f32(xa, 0.0, xb, 0.0, n, &sa, &qa, &sb, &qb);
      if (!p->rms) {
        ma = sa / (double)n;
        mb = sb / (double)n;
        rk_moments_lanes2_f32(xa, ma, xb, mb, n, &sa, &qa, &sb, &qb);
      }
      ln_fwd_finish(x, r, buf, ma, qa, w, b);
      ln_fwd_finish(x, r + 1, buf2, mb, qb, w, b);
      continue;
    }
#endif
    rk_load_f64(buf, x->x + r * p->x.rs * xes, p->x.dt, p->x.cs, n);
    if (two) rk_load_f64(buf2, x->x + (r + 1) * p->x.rs * xes, p->x.dt, p->x.cs, n);
    /* sum and sum of squares; layer norm then sums squared deviations from
     * the mean, RMS norm's mean square is the first pass's */
    double sa, qa, sb = 0.0, qb = 0.0, ma = 0.0, mb = 0.0;
    if (two)
      rk_moments_lanes2(buf, 0.0, buf2, 0.0, n, &sa, &qa, &sb, &qb);
    else
      rk_moments_lanes(buf, 0.0, n, &sa, &qa);
    if (!p->rms) {
      ma = sa / (double)n;
      mb = sb / (double)n;
      if (two)
        rk_moments_lanes2(buf, ma, buf2, mb, n, &sa, &qa, &sb, &qb);
      else
        rk_moments_lanes(buf, ma, n, &sa, &qa);
    }
    ln_fwd_finish(x, r, buf, ma, qa, w, b);
    if (two) ln_fwd_finish(x, r + 1, buf2, mb, qb, w, b);
  }
  free(buf);
}

/* One f32 row of the backward with unit column strides, read in place: the
 * arithmetic of the general loop below (in double, one rounding per
 * operation, no contraction), fused into one pass with rk_gdot_lanes's
 * sums — element i into lane i % 8 in order of i, folded by RK_FOLD — so
 * the bits are the general path's; h and g keep x-hat and dy * w for the
 * input gradient. The general path converted both rows to f64 buffers
 * first and summed in a pass of its own (three passes over the row more,
 * at double width: layer norm's backward took 3.4x the CPU's time). */
static void ln_bwd_row_f32(const float *restrict xr, const float *restrict dyr, double mean, double rstd,
                           const double *restrict wv, double *restrict ab, double *restrict aw, double *restrict h,
                           double *restrict g, int64_t n, double *sg, double *sgx) {
  double s[RK_LANES] = {0}, d[RK_LANES] = {0};
  int64_t i = 0;
/* elements i + o on of the rows in vectors V (intrinsics prefix P), CVT(q) the floats at q widened; S, D the lanes' sums */
#define LN_BWD_STEP(V, P, CVT, o, S, D)                                                          \
  {                                                                                              \
    V hv = P##_mul_pd(P##_sub_pd(CVT(xr + i + o), vm), vr), dv = CVT(dyr + i + o);               \
    P##_storeu_pd(h + i + o, hv);                                                                \
    P##_storeu_pd(ab + i + o, P##_add_pd(P##_loadu_pd(ab + i + o), dv));                         \
    P##_storeu_pd(aw + i + o, P##_add_pd(P##_loadu_pd(aw + i + o), P##_mul_pd(dv, hv)));         \
    V gv = P##_mul_pd(dv, P##_loadu_pd(wv + i + o));                                             \
    P##_storeu_pd(g + i + o, gv);                                                                \
    S = P##_add_pd(S, gv);                                                                       \
    D = P##_add_pd(D, P##_mul_pd(gv, P##_sub_pd(hv, vz)));                                       \
  }
#ifdef __AVX512F__
  /* the eight lanes in one register (AVX-512 builds): the same lanes, the same order */
#define LN_CVT8(q) _mm512_cvtps_pd(_mm256_loadu_ps(q))
  __m512d vm = _mm512_set1_pd(mean), vr = _mm512_set1_pd(rstd), vz = _mm512_setzero_pd(), s8 = vz, d8 = vz;
  for (; i + RK_LANES <= n; i += RK_LANES) LN_BWD_STEP(__m512d, _mm512, LN_CVT8, 0, s8, d8)
  _mm512_storeu_pd(s, s8);
  _mm512_storeu_pd(d, d8);
#undef LN_CVT8
#elif defined(__AVX__)
#define LN_CVT4(q) _mm256_cvtps_pd(_mm_loadu_ps(q))
  __m256d vm = _mm256_set1_pd(mean), vr = _mm256_set1_pd(rstd), vz = _mm256_setzero_pd();
  __m256d s0 = vz, s1 = vz, d0 = vz, d1 = vz;
  for (; i + RK_LANES <= n; i += RK_LANES) {
    LN_BWD_STEP(__m256d, _mm256, LN_CVT4, 0, s0, d0)
    LN_BWD_STEP(__m256d, _mm256, LN_CVT4, 4, s1, d1)
  }
  rk_lanes_out(s0, s1, s);
  rk_lanes_out(d0, d1, d);
#undef LN_CVT4
#endif
#undef LN_BWD_STEP
  for (; i < n; i++) {
    double hh = ((double)xr[i] - mean) * rstd, dd = dyr[i];
    h[i] = hh;
    ab[i] += dd;
    aw[i] += dd * hh;
    g[i] = dd * wv[i];
    s[i & 7] += g[i];
    d[i & 7] += g[i] * (hh - 0.0);
  }
  *sg = RK_FOLD(s);
  *sgx = RK_FOLD(d);
}

/* Row buffers of the backward are LN_PAD(n) doubles apart: rows of 512 or
 * 1,024 columns otherwise put every array 4 KiB apart, where a load after a
 * store to another array of the same offset stalls as if it overlapped
 * (4K aliasing: the AVX-512 pass ran 0.84x the 256-bit one at 512 columns). */
#define LN_PAD(n) ((n) + 8)

/* Backward over row parts: each part reads its rows of x and dy once,
 * writes their input gradient and adds the rows' weight / bias gradient
 * terms into the part's own partial sums (x->part[part]: dw cols, then db
 * cols). The parts are a function of the shape only and their sums are
 * added in part order afterwards, so the result is the same on every run. */
static void ln_bwd_parts(void *c, int64_t tb, int64_t te) {
  lnctx *x = c;
  const lnplan *p = x->p;
  int64_t n = p->cols, np = LN_PAD(n);
  double *buf = malloc(sizeof(double) * (size_t)np * 5);
  if (!buf) {
    x->failed = 1;
    return;
  }
  double *g = buf + np, *w = buf + 2 * np, *spare = buf + 3 * np; /* spare: sums nobody asked for */
  vload(&p->w, x->w, n, w, 1.0);
  int64_t xes = (int64_t)tpurt_dtype_size(p->x.dt), des = (int64_t)tpurt_dtype_size(p->dy.dt),
          oes = x->dx ? (int64_t)tpurt_dtype_size(p->dx.dt) : 0;
  /* f32 rows of unit stride with an f32 input gradient: read and written in place (ln_bwd_row_f32) */
  int fast = p->x.dt == TPURT_F32 && p->x.cs == 1 && p->dy.dt == TPURT_F32 && p->dy.cs == 1 && x->dx &&
             p->dx.dt == TPURT_F32 && p->dx.cs == 1;
  for (int64_t t = tb; t < te; t++) {
    int64_t r0 = p->rows * t / x->parts, r1 = p->rows * (t + 1) / x->parts;
    double *restrict aw = x->dw ? x->part + 2 * t * np : spare, *restrict ab = x->db ? x->part + 2 * t * np + np : spare + np;
    memset(aw, 0, sizeof(double) * (size_t)n);
    memset(ab, 0, sizeof(double) * (size_t)n);
    for (int64_t r = r0; r < r1; r++) {
      double mean = p->rms ? 0.0 : vget(&p->mean, x->mean, r, 0.0), rstd = vget(&p->rstd, x->rstd, r, 1.0);
      double sg, sgx; /* the sums of dy * w and of dy * w * xhat */
      if (fast) {
        ln_bwd_row_f32((const float *)(x->x + r * p->x.rs * xes), (const float *)(x->dy + r * p->dy.rs * des), mean,
                       rstd, w, ab, aw, buf, g, n, &sg, &sgx);
      } else {
        rk_load_f64(buf, x->x + r * p->x.rs * xes, p->x.dt, p->x.cs, n);
        rk_load_f64(g, x->dy + r * p->dy.rs * des, p->dy.dt, p->dy.cs, n);
        double *restrict xh = buf, *restrict gw = g;
        const double *restrict wv = w;
        for (int64_t i = 0; i < n; i++) { /* one pass: xhat, both sums, dy * w */
          double h = (xh[i] - mean) * rstd, d = gw[i];
          xh[i] = h;
          ab[i] += d;
          aw[i] += d * h;
          gw[i] = d * wv[i];
        }
        if (!x->dx) continue;
        rk_gdot_lanes(g, buf, 0.0, n, &sg, &sgx);
      }
      sg /= (double)n;
      sgx /= (double)n;
      if (p->rms) sg = 0;
      const double *restrict hh = buf;
      double *restrict gg = g;
      if (fast) { /* written as floats right away: a conversion pass of its own cost the kernel 10-24 % */
        float *restrict dx = (float *)(x->dx + r * p->dx.rs * oes);
        for (int64_t i = 0; i < n; i++) dx[i] = (float)(rstd * (gg[i] - sg - hh[i] * sgx));
      } else {
        for (int64_t i = 0; i < n; i++) gg[i] = rstd * (gg[i] - sg - hh[i] * sgx);
        rk_store_row_f64(x->dx + r * p->dx.rs * oes, p->dx.dt, p->dx.cs, g, n);
      }
    }
  }
  free(buf);
}

static tpurt_status k_ln(void *a, char *err, size_t errlen) {
  const lnplan *p = a;
  lnctx x = {p, rk_hv(p->x.ptr), p->y.on ? rk_hv(p->y.ptr) : NULL,
             p->dy.on ? rk_hv(p->dy.ptr) : NULL, p->dx.on ? rk_hv(p->dx.ptr) : NULL,
             vptr(&p->w), vptr(&p->b), vptr(&p->mean), vptr(&p->rstd), vptr(&p->dw), vptr(&p->db), 0, 1, NULL};
  int64_t grain = 16384 / (p->cols + 1) + 1;
  if (p->fwd) {
    tpurt_parallel_for(p->rows, grain, ln_fwd_rows, &x);
  } else {
    /* parts of at least ~8K elements (whole rows), at most 16 */
    int64_t parts = p->rows * p->cols / 8192;
    parts = parts < 1 ? 1 : parts > 16 ? 16 : parts > p->rows ? p->rows : parts;
    x.parts = parts;
    if ((x.dw || x.db) && !(x.part = malloc(sizeof(double) * 2 * (size_t)(parts * LN_PAD(p->cols))))) {
      snprintf(err, errlen, "out of host memory for %" PRId64 " partial sums of %" PRId64 " columns", parts, p->cols);
      return TPURT_ERR_OUT_OF_MEMORY;
    }
    tpurt_parallel_for(parts, 1, ln_bwd_parts, &x);
    if (x.part && !x.failed) {
      for (int64_t j = 0; j < p->cols; j++) {
        double sw = 0, sb = 0;
        for (int64_t q = 0; q < parts; q++) {
          sw += x.part[2 * q * LN_PAD(p->cols) + j];
          sb += x.part[2 * q * LN_PAD(p->cols) + LN_PAD(p->cols) + j];
        }
        vset(&p->dw, x.dw, j, sw);
        vset(&p->db, x.db, j, sb);
      }
    }
    free(x.part);
  }
  if (x.failed) {
    snprintf(err, errlen, "out of host memory for rows of %" PRId64 " elements", p->cols);
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  return TPURT_OK;
}

static tpurt_status get_mat_r(int dev, const tpurt_view *v, const tpurt_view *ref, int norm_ndim, mat *m,
                              const char *nm, const char *what, int range) {
  memset(m, 0, sizeof *m);
  if (!v) return TPURT_OK;
  tpurt_status st;
  if ((st = rk_check_view(v, nm))) return st;
  if (!rk_same_shape(v, ref))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s has a different shape than the input", nm, what);
  int64_t r, c;
  if (!flat_range(v, 0, v->ndim - norm_ndim, &r, &m->rs) || !flat_range(v, v->ndim - norm_ndim, v->ndim, &c, &m->cs))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: %s must be addressable as rows x columns with one stride each",
                      nm, what);
  if (range && (st = rk_check_range(dev, v, nm))) return st;
  m->ptr = v->ptr;
  m->dt = v->dtype;
  m->on = 1;
  return TPURT_OK;
}
/* rows x columns view of v checked against the chip's memory (the check
 * notes it for a launch being recorded) */
static tpurt_status get_mat(int dev, const tpurt_view *v, const tpurt_view *ref, int norm_ndim, mat *m, const char *nm,
                            const char *what) {
  return get_mat_r(dev, v, ref, norm_ndim, m, nm, what, 1);
}

static tpurt_status ln_launch(tpurt_stream *s, const char *nm, lnplan *p, const tpurt_view *x, int norm_ndim) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((st = rk_check_view(x, nm))) return st;
  if (norm_ndim < 0 || norm_ndim > x->ndim)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: cannot normalize over %d of %d dimensions", nm, norm_ndim,
                      x->ndim);
  if (!rk_is_float(x->dtype)) return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: expected a floating point input", nm);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(x->ptr)))) return st;
  p->rows = 1;
  p->cols = 1;
  for (int k = 0; k < x->ndim; k++) {
    if (k < x->ndim - norm_ndim) p->rows *= x->sizes[k];
    else p->cols *= x->sizes[k];
  }
  return TPURT_OK;
}

/* A [d0, d1, d2] view. */
static tpurt_view view3(tpurt_devptr ptr, tpurt_dtype dt, const int64_t *sizes, int64_t s0, int64_t s1, int64_t s2) {
  tpurt_view v;
  memset(&v, 0, sizeof v);
  v.ptr = ptr;
  v.dtype = dt;
  v.ndim = 3;
  for (int k = 0; k < 3; k++) v.sizes[k] = sizes[k];
  v.strides[0] = s0, v.strides[1] = s1, v.strides[2] = s2;
  return v;
}

/* Loads vector v broadcast along every dim of the [d0, d1, d2] shape but axis. */
static int load_vec(tpurt_ew_program *pr, tpurt_view *ins, int *nin, const vec *v, const int64_t *sizes, int axis) {
  ins[*nin] = view3(v->ptr, v->dt, sizes, axis == 0 ? v->st : 0, axis == 1 ? v->st : 0, axis == 2 ? v->st : 0);
  return tpurt__ew_emit(pr, TPURT_EW_LOAD, 0, 0, (*nin)++);
}

/* y = (x - mean) * inv * w + b over the [d0, d1, d2] shape `sizes` (x's
 * strides xs, y's ys) as an elementwise program in x's dtype; the
 * statistics vary along stat_axis, w and b along param_axis; mean, w and b
 * may be NULL. */
static tpurt_status norm_apply(tpurt_stream *s, const char *nm, const tpurt_view *y, const tpurt_view *x,
                               const int64_t *sizes, const int64_t *xs, const int64_t *ys, const vec *mean,
                               const vec *inv, int stat_axis, const vec *w, const vec *b, int param_axis) {
  tpurt_ew_program pr;
  memset(&pr, 0, sizeof pr);
  pr.compute = x->dtype;
  tpurt_view ins[5];
  int nin = 1;
  ins[0] = view3(x->ptr, x->dtype, sizes, xs[0], xs[1], xs[2]);
  int r = tpurt__ew_emit(&pr, TPURT_EW_LOAD, 0, 0, 0);
  if (mean) r = tpurt__ew_emit(&pr, TPURT_EW_SUB, r, load_vec(&pr, ins, &nin, mean, sizes, stat_axis), 1.0);
  r = tpurt__ew_emit(&pr, TPURT_EW_MUL, r, load_vec(&pr, ins, &nin, inv, sizes, stat_axis), 0);
  if (w) r = tpurt__ew_emit(&pr, TPURT_EW_MUL, r, load_vec(&pr, ins, &nin, w, sizes, param_axis), 0);
  if (b)
    r = tpurt__ew_emit(&pr, TPURT_EW_ADD, r, load_vec(&pr, ins, &nin, b, sizes, param_axis), 1.0);
  else if (w && mean) /* + 0: layer norm adds an absent bias (see apply_k) */
    r = tpurt__ew_emit(&pr, TPURT_EW_ADD, r, tpurt__ew_emit(&pr, TPURT_EW_CONST, 0, 0, 0.0), 1.0);
  pr.nout = 1;
  pr.out_reg[0] = (uint8_t)r;
  tpurt_view out = view3(y->ptr, y->dtype, sizes, ys[0], ys[1], ys[2]);
  return tpurt__elementwise_named(s, &pr, &out, ins, nin, NULL, 0, nm);
}

tpurt_status tpurt_layer_norm(tpurt_stream *s, const tpurt_view *y, const tpurt_view *mean, const tpurt_view *rstd,
                              const tpurt_view *x, const tpurt_view *w, const tpurt_view *b, int norm_ndim, double eps,
                              int rms) {
  const char *nm = rms ? "rms_norm" : "layer_norm";
  lnplan p;
  memset(&p, 0, sizeof p);
  tpurt_status st = ln_launch(s, nm, &p, x, norm_ndim);
  if (st) return st;
  if (!y) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output view is NULL", nm);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(x->ptr)))) return st;
  int dev = s->dev;
  p.rms = rms;
  p.eps = eps;
  /* y's memory is checked by the kernel that writes it (see split) */
  if ((st = get_mat_r(dev, y, x, norm_ndim, &p.y, nm, "output", 0))) return st;
  if (p.rows * p.cols == 0) {
    /* empty rows still get their statistics (NaN like a mean of nothing) */
    if (p.cols != 0 || p.rows == 0) return TPURT_OK;
  }
  tpurt__defer_note_reads(1);
  if (!(st = get_mat(dev, x, x, norm_ndim, &p.x, nm, "input")) && !(st = get_vec(dev, w, p.cols, &p.w, nm, "weight")))
    st = get_vec(dev, b, p.cols, &p.b, nm, "bias");
  tpurt__defer_note_reads(0);
  if (st || (st = get_vec(dev, mean, p.rows, &p.mean, nm, "mean")) ||
      (st = get_vec(dev, rstd, p.rows, &p.rstd, nm, "rstd")))
    return st;
  p.fwd = 1;
  tpurt_dtype dt = p.x.dt;
  int split = (dt == TPURT_F32 || dt == TPURT_F64) && p.y.dt == dt && p.rows * p.cols > 0 && p.rstd.on &&
              p.rstd.dt == dt && (rms || (p.mean.on && p.mean.dt == dt)) && (!p.w.on || p.w.dt == dt) &&
              (!p.b.on || p.b.dt == dt);
  if (!split || !tpurt__deferring()) {
    p.ew_apply = split;
    return (st = rk_check_range(dev, y, nm)) ? st : tpurt_launch(s, nm, k_ln, &p, sizeof p);
  }
  /* f32 / f64 while deferring: the statistics kernel, then y = (x - mean) *
   * rstd * w + b as an elementwise program, so that DeferAndFuse fuses it
   * with its neighbours and can recompute y from x and the statistics
   * instead of keeping it for the backward pass (strict eager computes the
   * same program's arithmetic in the statistics kernel: one pass less) */
  lnplan ps = p;
  memset(&ps.y, 0, sizeof ps.y);
  if ((st = tpurt_launch(s, nm, k_ln, &ps, sizeof ps))) return st;
  const int64_t sizes[3] = {1, p.rows, p.cols}, xs[3] = {0, p.x.rs, p.x.cs}, ys[3] = {0, p.y.rs, p.y.cs};
  return norm_apply(s, nm, y, x, sizes, xs, ys, rms ? NULL : &p.mean, &p.rstd, 1, p.w.on ? &p.w : NULL,
                    p.b.on ? &p.b : NULL, 2);
}

tpurt_status tpurt_layer_norm_backward(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dw,
                                       const tpurt_view *db, const tpurt_view *dy, const tpurt_view *x,
                                       const tpurt_view *mean, const tpurt_view *rstd, const tpurt_view *w,
                                       int norm_ndim, int rms) {
  const char *nm = rms ? "rms_norm_backward" : "layer_norm_backward";
  lnplan p;
  memset(&p, 0, sizeof p);
  tpurt_status st = ln_launch(s, nm, &p, x, norm_ndim);
  if (st) return st;
  if (!dy) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grad_output view is NULL", nm);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(x->ptr)))) return st;
  int dev = s->dev;
  p.rms = rms;
  tpurt__defer_note_reads(1); /* the inputs are only read */
  if (!(st = get_mat(dev, x, x, norm_ndim, &p.x, nm, "input")) &&
      !(st = get_mat(dev, dy, x, norm_ndim, &p.dy, nm, "grad_output")) &&
      !(st = get_vec(dev, w, p.cols, &p.w, nm, "weight")) && !(st = get_vec(dev, mean, p.rows, &p.mean, nm, "mean")))
    st = get_vec(dev, rstd, p.rows, &p.rstd, nm, "rstd");
  tpurt__defer_note_reads(0);
  if (st || (st = get_mat(dev, dx, x, norm_ndim, &p.dx, nm, "grad_input")) ||
      (st = get_vec(dev, dw, p.cols, &p.dw, nm, "grad_weight")) || (st = get_vec(dev, db, p.cols, &p.db, nm, "grad_bias")))
    return st;
  if (p.cols == 0) return TPURT_OK;
  if (p.rows == 0) {
    /* sums over no rows: zero the parameter gradients */
    tpurt_scalar z = {TPURT_SCALAR_INT, 0, 0, 0};
    if (dw && (st = tpurt_fill(s, dw, z))) return st;
    if (db && (st = tpurt_fill(s, db, z))) return st;
    return TPURT_OK;
  }
  if (!p.mean.on && !rms) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: mean is required", nm);
  if (!p.rstd.on) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: rstd is required", nm);
  return tpurt_launch(s, nm, k_ln, &p, sizeof p);
}

/* ============================================= batch norm and group norm */

/* x viewed as [N, C, S] */
typedef struct {
  tpurt_devptr ptr;
  tpurt_dtype dt;
  int64_t sn, sc, ss;
  int on;
  int es;  /* element size in bytes */
  int vec; /* rows read as vectors (t3_vec_rows) */
} t3;

typedef struct {
  int training, groups, fwd; /* fwd: batch norm statistics (and y when given) */
  int ew_apply;                /* y by apply_row (the split form's arithmetic) */
  double momentum, eps;
  int64_t N, C, S;
  t3 x, y, dy, dx;
  vec w, b, rm, rv, smean, sinv, dw, db; /* group norm: smean/sinv are [N * G] */
} bnplan;

typedef struct {
  const bnplan *p;
  char *x, *y, *dy, *dx, *w, *b, *rm, *rv, *smean, *sinv, *dw, *db;
  double *parts;       /* group norm backward: per (n, ch) the sums of dy and dy (x - mean), from gn_bwd_dx */
  _Atomic int failed;  /* a work item ran out of host memory */
} bnctx;

static inline const char *t3row(const t3 *t, const char *base, int64_t n, int64_t c) {
  return base + (n * t->sn + c * t->sc) * t->es;
}

/* f32 and bf16 rows with unit spatial stride (the common layout) go
 * straight from memory into double accumulators of BN_LANES lanes: no load into a
 * double buffer per 1024 elements and no dtype switch per chunk (a 4 x 4
 * plane was one 16-element chunk per row; a bf16 batch norm of
 * 16 x 256 x 4 x 4 took 169 us against 35 for the CPU's). The same double
 * arithmetic per element; only the order of the lanes' partial sums
 * differs from the buffered path. */
#define BN_LANES 16
/* channels per bn_affine_rows call (batch norm's passes, group norm) */
#define AFFINE_BLOCK 64
#define BN_SHORT 256 /* measured: f32 rows of 49 elements 1.19x, of 64 0.94x (paired) */
#define BN_SAMPLES 4 /* a channel's rows of this many samples between its accumulators' loads and stores */
static inline int t3_vec_rows(const t3 *t) { return t->vec; }

#if defined(__x86_64__) || defined(__i386__)
#define BN_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl")))
#else
#define BN_TARGET
#endif

/* Over the rows (n, ch) of samples [n0, n1) and channels [c0, c1) (f32 or
 * bf16 rows of S elements): with g, the sums of g and of g * (x - c);
 * without, the sums of (x - c) and of (x - c)^2. Lane i % 16 of a 16-element
 * chunk takes its element i (a tail's missing lanes add nothing) into one of
 * four accumulator sets: a row's 64-element blocks feed the four in turn and
 * its remaining chunks take the next set in a rotation over the call, so four
 * independent add chains run instead of one (one chain held the add's latency:
 * a 4 M-element group norm ran at a third of the memory's speed). The sets are
 * added pairwise and the lanes once at the end: the order depends only on the
 * rows, not on the thread that reads them. */
#if defined(__x86_64__) || defined(__i386__)
#define BN_ACC(K, pl, ph, dl, dh)                                                                     \
  do {                                                                                                \
    a##K##l = _mm512_add_pd(a##K##l, pl), a##K##h = _mm512_add_pd(a##K##h, ph);                      \
    b##K##l = _mm512_fmadd_pd(pl, dl, b##K##l), b##K##h = _mm512_fmadd_pd(ph, dh, b##K##h);           \
  } while (0)
/* a full chunk at element i of the row into set K */
#define BN_CHUNK(K, i)                                                                                \
  do {                                                                                                \
    __m512d xl_, xh_, gl_, gh_;                                                                       \
    LOAD16_PD(x + (i) * xes, xb, 16, xl_, xh_);                                                       \
    __m512d dl_ = _mm512_sub_pd(xl_, vc), dh_ = _mm512_sub_pd(xh_, vc);                               \
    if (hasg) {                                                                                       \
      LOAD16_PD(g + (i) * ges, gbf, 16, gl_, gh_);                                                    \
      BN_ACC(K, gl_, gh_, dl_, dh_);                                                                  \
    } else {                                                                                          \
      BN_ACC(K, dl_, dh_, dl_, dh_);                                                                  \
    }                                                                                                 \
  } while (0)
#endif

BN_TARGET static inline __attribute__((always_inline)) void
bn_sums_body(int hasg, const t3 *gt, const char *gbase, const t3 *xt, const char *xbase, int64_t n0, int64_t n1,
             int64_t c0, int64_t c1, int64_t S, double c, double *sa, double *sb) {
#if defined(__x86_64__) || defined(__i386__)
  int xb = xt->dt == TPURT_BF16, gbf = hasg && gt->dt == TPURT_BF16;
  int64_t xes = xb ? 2 : 4, ges = gbf ? 2 : 4;
  __m512d vc = _mm512_set1_pd(c), z = _mm512_setzero_pd();
  __m512d a0l = z, a0h = z, b0l = z, b0h = z, a1l = z, a1h = z, b1l = z, b1h = z;
  __m512d a2l = z, a2h = z, b2l = z, b2h = z, a3l = z, a3h = z, b3l = z, b3h = z;
  unsigned j = 0;
  for (int64_t n = n0; n < n1; n++)
    for (int64_t ch = c0; ch < c1; ch++) {
      const char *x = t3row(xt, xbase, n, ch), *g = hasg ? t3row(gt, gbase, n, ch) : NULL;
      int64_t i = 0;
      for (; i + 4 * BN_LANES <= S; i += 4 * BN_LANES) {
        BN_CHUNK(0, i);
        BN_CHUNK(1, i + BN_LANES);
        BN_CHUNK(2, i + 2 * BN_LANES);
        BN_CHUNK(3, i + 3 * BN_LANES);
      }
      for (; i < S; i += BN_LANES, j++) {
        int m = S - i < BN_LANES ? (int)(S - i) : BN_LANES;
        __m512d xl, xh, pl, ph;
        LOAD16_PD(x + i * xes, xb, m, xl, xh);
        __mmask8 kl = (__mmask8)(m >= 8 ? 0xff : (1u << m) - 1u), kh = (__mmask8)(m > 8 ? (1u << (m - 8)) - 1u : 0);
        __m512d dl = _mm512_maskz_sub_pd(kl, xl, vc), dh = _mm512_maskz_sub_pd(kh, xh, vc);
        if (hasg)
          LOAD16_PD(g + i * ges, gbf, m, pl, ph);
        else
          pl = dl, ph = dh;
        switch (j & 3) {
        case 0: BN_ACC(0, pl, ph, dl, dh); break;
        case 1: BN_ACC(1, pl, ph, dl, dh); break;
        case 2: BN_ACC(2, pl, ph, dl, dh); break;
        default: BN_ACC(3, pl, ph, dl, dh); break;
        }
      }
    }
  a0l = _mm512_add_pd(_mm512_add_pd(a0l, a1l), _mm512_add_pd(a2l, a3l));
  a0h = _mm512_add_pd(_mm512_add_pd(a0h, a1h), _mm512_add_pd(a2h, a3h));
  b0l = _mm512_add_pd(_mm512_add_pd(b0l, b1l), _mm512_add_pd(b2l, b3l));
  b0h = _mm512_add_pd(_mm512_add_pd(b0h, b1h), _mm512_add_pd(b2h, b3h));
  /* the lanes by a tree (16 sequential adds per sum took as long as a
   * 64-element row) */
  *sa = _mm512_reduce_add_pd(_mm512_add_pd(a0l, a0h));
  *sb = _mm512_reduce_add_pd(_mm512_add_pd(b0l, b0h));
#else
  (void)hasg, (void)gt, (void)gbase, (void)xt, (void)xbase, (void)n0, (void)n1, (void)c0, (void)c1, (void)S, (void)c;
  *sa = *sb = 0;
#endif
}

/* The vector rows on AVX2 hosts (no AVX-512): the same functions in
 * 4-lane registers, each 16-element chunk as quarters q0..q3 (elements 0-3,
 * 4-7, 8-11, 12-15: the AVX-512 path's low half is q0, q1, its high half
 * q2, q3). Every element takes the same operations into the same lane and
 * accumulator set, and the lanes are added by the tree of
 * _mm512_reduce_add_pd, so both paths give the same bits. The buffered
 * path (double copies of 1,024-element chunks, one add chain a lane) ran
 * AVX2 hosts' batch and group norms. */
#if defined(__x86_64__) || defined(__i386__)
#define BN2_TARGET __attribute__((target("avx2,fma")))
/* 16 f32 or bf16 values at p widened to doubles in q[0..3] */
BN2_TARGET static inline __attribute__((always_inline)) void bn2_load16_full(const char *p, int bf, __m256d *q) {
  if (bf) {
    __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
    __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p + 1)), 16);
    q[0] = _mm256_cvtps_pd(_mm256_castps256_ps128(_mm256_castsi256_ps(lo)));
    q[1] = _mm256_cvtps_pd(_mm256_extractf128_ps(_mm256_castsi256_ps(lo), 1));
    q[2] = _mm256_cvtps_pd(_mm256_castps256_ps128(_mm256_castsi256_ps(hi)));
    q[3] = _mm256_cvtps_pd(_mm256_extractf128_ps(_mm256_castsi256_ps(hi), 1));
  } else {
    const float *f = (const float *)p;
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_pd(_mm_loadu_ps(f + 4 * k));
  }
}
/* the first m (1..16) of them, zero past m */
BN2_TARGET static inline __attribute__((always_inline)) void bn2_load16(const char *p, int bf, int m, __m256d *q) {
  if (m < 16) {
    _Alignas(32) unsigned char t[64] = {0};
    memcpy(t, p, (size_t)m * (bf ? 2 : 4));
    bn2_load16_full((const char *)t, bf, q);
  } else {
    bn2_load16_full(p, bf, q);
  }
}
/* lanes k of quarter j below m: all ones (the masks of the AVX-512 path's zeroing subtractions) */
BN2_TARGET static inline __m256d bn2_mask(int m, int j) {
  __m256i idx = _mm256_setr_epi64x(4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3);
  return _mm256_castsi256_pd(_mm256_cmpgt_epi64(_mm256_set1_epi64x(m), idx));
}
/* _mm512_reduce_add_pd of the 8-lane vector (lo, hi) */
BN2_TARGET static inline double bn2_reduce8(__m256d lo, __m256d hi) {
  __m256d t = _mm256_add_pd(hi, lo);
  __m128d u = _mm_add_pd(_mm256_extractf128_pd(t, 1), _mm256_castpd256_pd128(t));
  return u[0] + u[1];
}
/* 8 f32 -> bf16 rounded as tpurt__f32_to_bf16 (nearest even, NaN quiet) */
BN2_TARGET static inline __m128i bn2_rne_bf16(__m256 v) {
  __m256i x = _mm256_castps_si256(v), hi = _mm256_srli_epi32(x, 16);
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(x, _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff))),
      16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* bn_sums_body on AVX2. Its four accumulator sets of 4 x 2 vectors (32
 * AVX2 registers: held at once, most lived on the stack) are computed one
 * set a pass: set K takes chunk K of every 64-element block (one 64-byte
 * line of an f32 row: the passes read disjoint lines) and the tail chunks
 * whose place in the rotation is K — the same additions in the same order
 * as one pass with all four sets. */
BN2_TARGET static inline __attribute__((always_inline)) void
bn2_sums_body(int hasg, const t3 *gt, const char *gbase, const t3 *xt, const char *xbase, int64_t n0, int64_t n1,
              int64_t c0, int64_t c1, int64_t S, double c, double *sa, double *sb) {
  int xb = xt->dt == TPURT_BF16, gbf = hasg && gt->dt == TPURT_BF16;
  int64_t xes = xb ? 2 : 4, ges = gbf ? 2 : 4, main = S / (4 * BN_LANES) * (4 * BN_LANES);
  int64_t tails = (S - main + BN_LANES - 1) / BN_LANES; /* tail chunks a row */
  __m256d vc = _mm256_set1_pd(c), sets_a[4][4], sets_b[4][4];
/* the chunk of m elements at element i of the row into a, b */
#define BN2_CHUNK(i, m)                                                     \
  do {                                                                      \
    __m256d xq_[4], gq_[4];                                                 \
    bn2_load16(x + (i) * xes, xb, m, xq_);                                  \
    if (hasg) bn2_load16(g + (i) * ges, gbf, m, gq_);                       \
    for (int j_ = 0; j_ < 4; j_++) {                                        \
      __m256d d_ = _mm256_sub_pd(xq_[j_], vc);                              \
      if ((m) < BN_LANES) d_ = _mm256_and_pd(d_, bn2_mask(m, j_));          \
      __m256d p_ = hasg ? gq_[j_] : d_;                                     \
      a[j_] = _mm256_add_pd(a[j_], p_);                                     \
      b[j_] = _mm256_fmadd_pd(p_, d_, b[j_]);                               \
    }                                                                       \
  } while (0)
  for (int K = 0; K < 4; K++) {
    __m256d a[4], b[4];
    for (int j = 0; j < 4; j++) a[j] = b[j] = _mm256_setzero_pd();
    int64_t jj = 0; /* tail chunks of the rows before this one */
    for (int64_t n = n0; n < n1; n++)
      for (int64_t ch = c0; ch < c1; ch++, jj += tails) {
        const char *x = t3row(xt, xbase, n, ch), *g = hasg ? t3row(gt, gbase, n, ch) : NULL;
        for (int64_t i = K * BN_LANES; i < main; i += 4 * BN_LANES) BN2_CHUNK(i, BN_LANES);
        for (int64_t t = (K - jj) & 3; t < tails; t += 4) {
          int64_t i = main + t * BN_LANES;
          int m = S - i < BN_LANES ? (int)(S - i) : BN_LANES;
          BN2_CHUNK(i, m);
        }
      }
    for (int j = 0; j < 4; j++) sets_a[K][j] = a[j], sets_b[K][j] = b[j];
  }
#undef BN2_CHUNK
  __m256d sq[4], dq[4];
  for (int j = 0; j < 4; j++) {
    sq[j] = _mm256_add_pd(_mm256_add_pd(sets_a[0][j], sets_a[1][j]), _mm256_add_pd(sets_a[2][j], sets_a[3][j]));
    dq[j] = _mm256_add_pd(_mm256_add_pd(sets_b[0][j], sets_b[1][j]), _mm256_add_pd(sets_b[2][j], sets_b[3][j]));
  }
  *sa = bn2_reduce8(_mm256_add_pd(sq[0], sq[2]), _mm256_add_pd(sq[1], sq[3]));
  *sb = bn2_reduce8(_mm256_add_pd(dq[0], dq[2]), _mm256_add_pd(dq[1], dq[3]));
}

BN2_TARGET static void bn2_moments_rows(const t3 *t, const char *base, int64_t n0, int64_t n1, int64_t c0, int64_t c1,
                                        int64_t S, double c, double *sum, double *sq) {
  bn2_sums_body(0, NULL, NULL, t, base, n0, n1, c0, c1, S, c, sum, sq);
}

BN2_TARGET static void bn2_gdot_rows(const bnplan *p, const bnctx *x, int64_t n0, int64_t n1, int64_t ch, double c,
                                     double *sum, double *dot) {
  int64_t S = p->S;
  if (n1 - n0 != 1 || S >= 8 * BN_LANES) {
    bn2_sums_body(1, &p->dy, x->dy, &p->x, x->x, n0, n1, ch, ch + 1, S, c, sum, dot);
    return;
  }
  int gbf = p->dy.dt == TPURT_BF16, xb = p->x.dt == TPURT_BF16;
  int64_t ges = gbf ? 2 : 4, xes = xb ? 2 : 4;
  const char *g = t3row(&p->dy, x->dy, n0, ch), *xr = t3row(&p->x, x->x, n0, ch);
  __m256d vc = _mm256_set1_pd(c), a[4], b[4];
  for (int j = 0; j < 4; j++) a[j] = b[j] = _mm256_setzero_pd();
  for (int64_t i = 0; i < S; i += BN_LANES) {
    int m = S - i < BN_LANES ? (int)(S - i) : BN_LANES;
    __m256d gq[4], xq[4];
    bn2_load16(g + i * ges, gbf, m, gq);
    bn2_load16(xr + i * xes, xb, m, xq);
    for (int j = 0; j < 4; j++) {
      a[j] = _mm256_add_pd(a[j], gq[j]);
      b[j] = _mm256_fmadd_pd(gq[j], _mm256_sub_pd(xq[j], vc), b[j]);
    }
  }
  *sum = bn2_reduce8(_mm256_add_pd(a[0], a[2]), _mm256_add_pd(a[1], a[3]));
  *dot = bn2_reduce8(_mm256_add_pd(b[0], b[2]), _mm256_add_pd(b[1], b[3]));
}

BN2_TARGET static void bn2_sums_block(int hasg, const bnplan *p, const bnctx *x, int64_t c0, int64_t c1,
                                      const double *c, double *sum, double *dot) {
  __m256d acc[AFFINE_BLOCK][8]; /* a (quarters 0-3), then b */
  int gbf = p->dy.dt == TPURT_BF16, xb = p->x.dt == TPURT_BF16;
  int64_t ges = gbf ? 2 : 4, xes = xb ? 2 : 4, S = p->S;
  for (int64_t ch = c0; ch < c1; ch++)
    for (int k = 0; k < 8; k++) acc[ch - c0][k] = _mm256_setzero_pd();
  for (int64_t n0 = 0; n0 < p->N; n0 += BN_SAMPLES) {
    int64_t n1 = n0 + BN_SAMPLES < p->N ? n0 + BN_SAMPLES : p->N;
    for (int64_t ch = c0; ch < c1; ch++) {
      __m256d vc = _mm256_set1_pd(c[ch - c0]), *ac = acc[ch - c0], r[8];
      for (int k = 0; k < 8; k++) r[k] = ac[k];
      for (int64_t n = n0; n < n1; n++) {
        const char *g = hasg ? t3row(&p->dy, x->dy, n, ch) : NULL, *xr = t3row(&p->x, x->x, n, ch);
        for (int64_t i = 0; i < S; i += BN_LANES) {
          int m = S - i < BN_LANES ? (int)(S - i) : BN_LANES;
          __m256d xq[4], gq[4], dq[4];
          bn2_load16(xr + i * xes, xb, m, xq);
          for (int j = 0; j < 4; j++) {
            dq[j] = _mm256_sub_pd(xq[j], vc);
            if (m < 16) dq[j] = _mm256_and_pd(dq[j], bn2_mask(m, j));
            gq[j] = dq[j];
          }
          if (hasg) bn2_load16(g + i * ges, gbf, m, gq);
          for (int j = 0; j < 4; j++) {
            r[j] = _mm256_add_pd(r[j], gq[j]);
            r[4 + j] = _mm256_fmadd_pd(gq[j], dq[j], r[4 + j]);
          }
        }
      }
      for (int k = 0; k < 8; k++) ac[k] = r[k];
    }
  }
  for (int64_t ch = c0; ch < c1; ch++) {
    const __m256d *ac = acc[ch - c0];
    sum[ch - c0] = bn2_reduce8(_mm256_add_pd(ac[0], ac[2]), _mm256_add_pd(ac[1], ac[3]));
    dot[ch - c0] = bn2_reduce8(_mm256_add_pd(ac[4], ac[6]), _mm256_add_pd(ac[5], ac[7]));
  }
}

BN2_TARGET static void bn2_affine_rows(const t3 *ot, char *ob_, const t3 *gt, const char *gb_, const t3 *xt,
                                       const char *xb_, int64_t n0, int64_t n1, int64_t c0, int64_t c1, int64_t S,
                                       const double *k1, const double *mean, const double *k2, int kstep,
                                       const double *k3) {
  int ob = ot->dt == TPURT_BF16, gb = gt->dt == TPURT_BF16, xb = xt && xt->dt == TPURT_BF16;
  int64_t oes = ob ? 2 : 4, ges = gb ? 2 : 4, xes = xb ? 2 : 4;
  __m256d vm = _mm256_set1_pd(mean[0]), v2 = _mm256_set1_pd(k2[0]);
  for (int64_t n = n0; n < n1; n++)
    for (int64_t ch = c0; ch < c1; ch++) {
      __m256d v1 = _mm256_set1_pd(k1[ch - c0]), v3 = _mm256_set1_pd(k3[ch - c0]);
      if (kstep) vm = _mm256_set1_pd(mean[ch - c0]), v2 = _mm256_set1_pd(k2[ch - c0]);
      char *o = (char *)t3row(ot, ob_, n, ch);
      const char *g = t3row(gt, gb_, n, ch), *x = xt ? t3row(xt, xb_, n, ch) : NULL;
      for (int64_t i = 0; i < S; i += BN_LANES) {
        int m = S - i < BN_LANES ? (int)(S - i) : BN_LANES;
        __m256d gq[4], xq[4];
        __m128 f[4];
        bn2_load16(g + i * ges, gb, m, gq);
        if (x) bn2_load16(x + i * xes, xb, m, xq);
        for (int j = 0; j < 4; j++) {
          __m256d r = _mm256_mul_pd(gq[j], v1);
          if (x) r = _mm256_add_pd(r, _mm256_mul_pd(_mm256_sub_pd(xq[j], vm), v2));
          f[j] = _mm256_cvtpd_ps(_mm256_add_pd(r, v3));
        }
        _Alignas(32) unsigned char t[64];
        char *d = m == BN_LANES ? o + i * oes : (char *)t;
        if (ob) {
          _mm_storeu_si128((__m128i *)d, bn2_rne_bf16(_mm256_set_m128(f[1], f[0])));
          _mm_storeu_si128((__m128i *)d + 1, bn2_rne_bf16(_mm256_set_m128(f[3], f[2])));
        } else {
          for (int j = 0; j < 4; j++) _mm_storeu_ps((float *)d + 4 * j, f[j]);
        }
        if (m < BN_LANES) memcpy(o + i * oes, t, (size_t)m * (size_t)oes);
      }
    }
}
#endif

/* sum of (x - c) and of (x - c)^2 over channels [c0, c1) of samples [n0, n1) */
BN_TARGET static void bn5_moments_rows(const t3 *t, const char *base, int64_t n0, int64_t n1, int64_t c0, int64_t c1,
                                       int64_t S, double c, double *sum, double *sq) {
  bn_sums_body(0, NULL, NULL, t, base, n0, n1, c0, c1, S, c, sum, sq);
}

/* sums of dy and of dy * (x - mean) over channel ch of samples [n0, n1);
 * one row shorter than 128 elements (group norm's rows of small planes) in
 * one accumulator set: the four sets' setup and reduction cost more than
 * such a row's chain */
BN_TARGET static void bn5_gdot_rows(const bnplan *p, const bnctx *x, int64_t n0, int64_t n1, int64_t ch, double c,
                                    double *sum, double *dot) {
  int64_t S = p->S;
  if (n1 - n0 != 1 || S >= 8 * BN_LANES) {
    bn_sums_body(1, &p->dy, x->dy, &p->x, x->x, n0, n1, ch, ch + 1, S, c, sum, dot);
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  int gbf = p->dy.dt == TPURT_BF16, xb = p->x.dt == TPURT_BF16;
  int64_t ges = gbf ? 2 : 4, xes = xb ? 2 : 4;
  const char *g = t3row(&p->dy, x->dy, n0, ch), *xr = t3row(&p->x, x->x, n0, ch);
  __m512d vc = _mm512_set1_pd(c), al = _mm512_setzero_pd(), ah = al, bl = al, bh = al;
  for (int64_t i = 0; i < S; i += BN_LANES) {
    int m = S - i < BN_LANES ? (int)(S - i) : BN_LANES;
    __m512d gl, gh, xl, xh;
    LOAD16_PD(g + i * ges, gbf, m, gl, gh);
    LOAD16_PD(xr + i * xes, xb, m, xl, xh);
    al = _mm512_add_pd(al, gl), ah = _mm512_add_pd(ah, gh);
    bl = _mm512_fmadd_pd(gl, _mm512_sub_pd(xl, vc), bl), bh = _mm512_fmadd_pd(gh, _mm512_sub_pd(xh, vc), bh);
  }
  *sum = _mm512_reduce_add_pd(_mm512_add_pd(al, ah));
  *dot = _mm512_reduce_add_pd(_mm512_add_pd(bl, bh));
#else
  (void)x, (void)ch, (void)c;
  *sum = *dot = 0;
#endif
}

/* Batch norm's sums over every sample, channels [c0, c1) (at most
 * AFFINE_BLOCK), with hasg of dy and of dy * (x - c[ch - c0]), without of
 * (x - c[ch - c0]) and of its square; rows shorter than BN_SHORT bytes
 * read in memory order, sample by sample (a channel at a time read each
 * sample's row C x S elements apart: 512 channels at 4 x 4 put a channel's
 * 64 rows into one set of the L1 cache), BN_SAMPLES samples at a time. A
 * channel's lanes take its rows' chunks in sample order, one chain a
 * channel (the block's channels are the independent chains); the lanes are
 * added by a tree at the end. The
 * order depends only on the shape, not on the thread. */
BN_TARGET static void bn5_sums_block(int hasg, const bnplan *p, const bnctx *x, int64_t c0, int64_t c1,
                                     const double *c, double *sum, double *dot) {
#if defined(__x86_64__) || defined(__i386__)
  __m512d acc[AFFINE_BLOCK][4];
  int gbf = p->dy.dt == TPURT_BF16, xb = p->x.dt == TPURT_BF16;
  int64_t ges = gbf ? 2 : 4, xes = xb ? 2 : 4, S = p->S;
  for (int64_t ch = c0; ch < c1; ch++)
    for (int k = 0; k < 4; k++) acc[ch - c0][k] = _mm512_setzero_pd();
  for (int64_t n0 = 0; n0 < p->N; n0 += BN_SAMPLES) {
    int64_t n1 = n0 + BN_SAMPLES < p->N ? n0 + BN_SAMPLES : p->N;
    for (int64_t ch = c0; ch < c1; ch++) {
      __m512d vc = _mm512_set1_pd(c[ch - c0]), *a = acc[ch - c0];
      __m512d a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3]; /* in registers over the rows' chunks */
      for (int64_t n = n0; n < n1; n++) {
        const char *g = hasg ? t3row(&p->dy, x->dy, n, ch) : NULL, *xr = t3row(&p->x, x->x, n, ch);
        for (int64_t i = 0; i < S; i += BN_LANES) {
          int m = S - i < BN_LANES ? (int)(S - i) : BN_LANES;
          __m512d xl, xh;
          LOAD16_PD(xr + i * xes, xb, m, xl, xh);
          __mmask16 k = (__mmask16)((1u << m) - 1u); /* a tail's missing lanes add nothing */
          __m512d dl = _mm512_maskz_sub_pd((__mmask8)k, xl, vc), dh = _mm512_maskz_sub_pd((__mmask8)(k >> 8), xh, vc);
          __m512d gl = dl, gh = dh;
          if (hasg) LOAD16_PD(g + i * ges, gbf, m, gl, gh);
          a0 = _mm512_add_pd(a0, gl), a1 = _mm512_add_pd(a1, gh);
          a2 = _mm512_fmadd_pd(gl, dl, a2), a3 = _mm512_fmadd_pd(gh, dh, a3);
        }
      }
      a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
    }
  }
  for (int64_t ch = c0; ch < c1; ch++) {
    sum[ch - c0] = _mm512_reduce_add_pd(_mm512_add_pd(acc[ch - c0][0], acc[ch - c0][1]));
    dot[ch - c0] = _mm512_reduce_add_pd(_mm512_add_pd(acc[ch - c0][2], acc[ch - c0][3]));
  }
#else
  (void)hasg, (void)p, (void)x, (void)c0, (void)c1, (void)c, (void)sum, (void)dot;
#endif
}

/* Rows (n, ch) of samples [n0, n1) and channels [c0, c1): o = g * k1 + k3
 * (x NULL) or g * k1 + (x - mean) * k2 + k3 with channel ch's k1[ch - c0]
 * and k3[ch - c0], and mean[j], k2[j] with j = (ch - c0) * kstep (kstep 0:
 * one value for all; a group's channels, or a block of batch norm channels,
 * in one call: one call per row took longer than a small plane's row), in
 * double, each product and sum rounded
 * on its own as in the scalar loops, then rounded to float (and that to
 * bf16 where o is bf16: the buffered path's rk_store_row_f64); each of o,
 * g, x f32 or bf16 rows of S elements. */
/* bn_affine_rows' chunk of m elements at element i of its rows */
#define BN_AFFINE16(i, m)                                                                             \
  do {                                                                                                \
    __m512d gl, gh, rl, rh;                                                                           \
    LOAD16_PD(g + (i) * ges, gb, m, gl, gh);                                                          \
    rl = _mm512_mul_pd(gl, v1);                                                                       \
    rh = _mm512_mul_pd(gh, v1);                                                                       \
    if (x) {                                                                                          \
      __m512d xl, xh;                                                                                 \
      LOAD16_PD(x + (i) * xes, xb, m, xl, xh);                                                        \
      rl = _mm512_add_pd(rl, _mm512_mul_pd(_mm512_sub_pd(xl, vm), v2));                               \
      rh = _mm512_add_pd(rh, _mm512_mul_pd(_mm512_sub_pd(xh, vm), v2));                               \
    }                                                                                                 \
    rl = _mm512_add_pd(rl, v3);                                                                       \
    rh = _mm512_add_pd(rh, v3);                                                                       \
    __mmask16 k = (__mmask16)((1u << (m)) - 1u);                                                      \
    if (ob) {                                                                                         \
      __m512 r = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(rl)), _mm512_cvtpd_ps(rh), 1); \
      _mm256_mask_storeu_epi16((uint16_t *)(o + (i) * oes), k, _mm512_cvtepi32_epi16(rne_bf16(r)));   \
    } else {                                                                                          \
      _mm256_mask_storeu_ps((float *)(o + (i) * oes), (__mmask8)k, _mm512_cvtpd_ps(rl));              \
      _mm256_mask_storeu_ps((float *)(o + (i) * oes) + 8, (__mmask8)(k >> 8), _mm512_cvtpd_ps(rh));   \
    }                                                                                                 \
  } while (0)

BN_TARGET static void bn5_affine_rows(const t3 *ot, char *ob_, const t3 *gt, const char *gb_, const t3 *xt,
                                      const char *xb_, int64_t n0, int64_t n1, int64_t c0, int64_t c1, int64_t S,
                                      const double *k1, const double *mean, const double *k2, int kstep,
                                      const double *k3) {
#if defined(__x86_64__) || defined(__i386__)
  int ob = ot->dt == TPURT_BF16, gb = gt->dt == TPURT_BF16, xb = xt && xt->dt == TPURT_BF16;
  int64_t oes = ob ? 2 : 4, ges = gb ? 2 : 4, xes = xb ? 2 : 4;
  __m512d vm = _mm512_set1_pd(mean[0]), v2 = _mm512_set1_pd(k2[0]);
  for (int64_t n = n0; n < n1; n++)
    for (int64_t ch = c0; ch < c1; ch++) {
      __m512d v1 = _mm512_set1_pd(k1[ch - c0]), v3 = _mm512_set1_pd(k3[ch - c0]);
      if (kstep) vm = _mm512_set1_pd(mean[ch - c0]), v2 = _mm512_set1_pd(k2[ch - c0]);
      char *o = (char *)t3row(ot, ob_, n, ch);
      const char *g = t3row(gt, gb_, n, ch), *x = xt ? t3row(xt, xb_, n, ch) : NULL;
      int64_t i = 0;
      for (; i + BN_LANES <= S; i += BN_LANES) BN_AFFINE16(i, BN_LANES); /* constant masks: plain loads, stores */
      if (i < S) BN_AFFINE16(i, (int)(S - i));
    }
#else
  (void)ot, (void)ob_, (void)gt, (void)gb_, (void)xt, (void)xb_, (void)n0, (void)n1, (void)c0, (void)c1, (void)S,
      (void)k1, (void)mean, (void)k2, (void)kstep, (void)k3;
#endif
}

/* The vector rows' entry points: the AVX-512 functions at the avx512 level
 * and above, their AVX2 forms below it (dispatched here, outside both:
 * code inlined into an AVX-512 function may be compiled to AVX-512
 * instructions, which an AVX2 host cannot run). */
#if defined(__x86_64__) || defined(__i386__)
#define BN_PICK(F5, F2) (tpurt__cpu_has_avx512() ? (F5) : (F2))
#else
#define BN_PICK(F5, F2) (F5)
#endif
static void bn_moments_rows(const t3 *t, const char *base, int64_t n0, int64_t n1, int64_t c0, int64_t c1, int64_t S,
                            double c, double *sum, double *sq) {
  BN_PICK(bn5_moments_rows, bn2_moments_rows)(t, base, n0, n1, c0, c1, S, c, sum, sq);
}
static void bn_gdot_rows(const bnplan *p, const bnctx *x, int64_t n0, int64_t n1, int64_t ch, double c, double *sum,
                         double *dot) {
  BN_PICK(bn5_gdot_rows, bn2_gdot_rows)(p, x, n0, n1, ch, c, sum, dot);
}
static void bn_sums_block(int hasg, const bnplan *p, const bnctx *x, int64_t c0, int64_t c1, const double *c,
                          double *sum, double *dot) {
  BN_PICK(bn5_sums_block, bn2_sums_block)(hasg, p, x, c0, c1, c, sum, dot);
}
static void bn_affine_rows(const t3 *ot, char *ob_, const t3 *gt, const char *gb_, const t3 *xt, const char *xb_,
                           int64_t n0, int64_t n1, int64_t c0, int64_t c1, int64_t S, const double *k1,
                           const double *mean, const double *k2, int kstep, const double *k3) {
  BN_PICK(bn5_affine_rows, bn2_affine_rows)(ot, ob_, gt, gb_, xt, xb_, n0, n1, c0, c1, S, k1, mean, k2, kstep, k3);
}
#undef BN_PICK

/* sum and sum of squared deviations from `center` over channels [c0, c1) of samples [n0, n1) */
static void t3_moments(const t3 *t, const char *base, int64_t n0, int64_t n1, int64_t c0, int64_t c1, int64_t S,
                       double center, double *sum, double *sq) {
  if (t3_vec_rows(t)) {
    bn_moments_rows(t, base, n0, n1, c0, c1, S, center, sum, sq);
    return;
  }
  double buf[NCH], s = 0, q = 0;
  int64_t es = (int64_t)tpurt_dtype_size(t->dt);
  for (int64_t n = n0; n < n1; n++)
    for (int64_t c = c0; c < c1; c++) {
      const char *row = t3row(t, base, n, c);
      for (int64_t o = 0; o < S; o += NCH) {
        int64_t cnt = S - o < NCH ? S - o : NCH;
        rk_load_f64(buf, row + o * t->ss * es, t->dt, t->ss, cnt);
        double cs, cq;
        rk_moments_lanes(buf, center, cnt, &cs, &cq);
        s += cs;
        q += cq;
      }
    }
  *sum = s;
  *sq = q;
}

/* mean and (biased) variance of channels [c0, c1) of samples [n0, n1):
 * inputs of at most 24 significant bits (f32, bf16, f16) in one pass of
 * double sums centred on the first element (its squares are exact in
 * double and the centre is one of the values, so the single-pass formula
 * keeps far more than f32's precision: a second pass cost a third of a
 * group norm's time); f64 in two passes (the sum, then the deviations from
 * the mean) */
/* mean and variance of M values from their sums s and q of deviations from
 * c and of their squares (c: the mean already, for the two-pass f64) */
static void stats_of_sums(double M, double c, double s, double q, int two_pass, double *mean, double *var) {
  *mean = two_pass ? c : c + s / M;
  double v = (q - s * s / M) / M;
  *var = v < 0 ? 0 : v;
}

static void t3_stats(const t3 *t, const char *base, int64_t n0, int64_t n1, int64_t c0, int64_t c1, int64_t S,
                     double *mean, double *var) {
  double M = (double)((n1 - n0) * (c1 - c0) * S), c = 0, s, q;
  if (t->dt != TPURT_F64 && M > 0) rk_load_f64(&c, t3row(t, base, n0, c0), t->dt, 1, 1);
  t3_moments(t, base, n0, n1, c0, c1, S, c, &s, &q);
  if (t->dt == TPURT_F64) {
    c = s / M;
    t3_moments(t, base, n0, n1, c0, c1, S, c, &s, &q);
  }
  stats_of_sums(M, c, s, q, t->dt == TPURT_F64, mean, var);
}

/* y[n, c, :] = x * scale + shift for samples n of [n0, n1) */
static void t3_affine(const t3 *x, const char *xb, const t3 *y, char *yb, int64_t n0, int64_t n1, int64_t c, int64_t S,
                      double scale, double shift) {
  if (t3_vec_rows(x) && t3_vec_rows(y)) {
    const double zero = 0.0;
    bn_affine_rows(y, yb, x, xb, NULL, NULL, n0, n1, c, c + 1, S, &scale, &zero, &zero, 0, &shift);
    return;
  }
  double buf[NCH];
  int64_t xes = (int64_t)tpurt_dtype_size(x->dt), yes = (int64_t)tpurt_dtype_size(y->dt);
  for (int64_t n = n0; n < n1; n++) {
    const char *xr = t3row(x, xb, n, c);
    char *yr = (char *)t3row(y, yb, n, c);
    for (int64_t o = 0; o < S; o += NCH) {
      int64_t cnt = S - o < NCH ? S - o : NCH;
      rk_load_f64(buf, xr + o * x->ss * xes, x->dt, x->ss, cnt);
      for (int64_t i = 0; i < cnt; i++) buf[i] = buf[i] * scale + shift;
      rk_store_row_f64(yr + o * y->ss * yes, y->dt, y->ss, buf, cnt);
    }
  }
}

/* sums of dy and dy * (x - mean) over channel c of samples [n0, n1) */
static void t3_dsums(const bnplan *p, const bnctx *x, int64_t n0, int64_t n1, int64_t c, const double *mean_of_n,
                     double mean, double *sdy, double *sdyx, int per_n_inv, const double *inv_of_n) {
  int vec = t3_vec_rows(&p->x) && t3_vec_rows(&p->dy);
  if (vec && !mean_of_n && !per_n_inv) { /* one mean: the samples' rows in the same lanes */
    bn_gdot_rows(p, x, n0, n1, c, mean, sdy, sdyx);
    return;
  }
  double xb[NCH], gb[NCH], a = 0, b = 0;
  int64_t xes = (int64_t)tpurt_dtype_size(p->x.dt), ges = (int64_t)tpurt_dtype_size(p->dy.dt);
  for (int64_t n = n0; n < n1; n++) {
    double m = mean_of_n ? mean_of_n[n] : mean, sc = per_n_inv ? inv_of_n[n] : 1.0, rb = 0;
    const char *xr = t3row(&p->x, x->x, n, c), *gr = t3row(&p->dy, x->dy, n, c);
    if (vec) {
      double cs, cd;
      bn_gdot_rows(p, x, n, n + 1, c, m, &cs, &cd);
      a += cs;
      b += cd * sc;
      continue;
    }
    for (int64_t o = 0; o < p->S; o += NCH) {
      int64_t cnt = p->S - o < NCH ? p->S - o : NCH;
      rk_load_f64(xb, xr + o * p->x.ss * xes, p->x.dt, p->x.ss, cnt);
      rk_load_f64(gb, gr + o * p->dy.ss * ges, p->dy.dt, p->dy.ss, cnt);
      double cs, cd;
      rk_gdot_lanes(gb, xb, m, cnt, &cs, &cd);
      a += cs;
      rb += cd;
    }
    b += rb * sc;
  }
  *sdy = a;
  *sdyx = b;
}

/* one row of t3_dx's buffered path */
static void t3_dx_row(const bnplan *p, const bnctx *x, int64_t n, int64_t c, double mean, double k1, double k2,
                      double k3, double *xb, double *gb, int64_t xes, int64_t ges, int64_t oes) {
  const char *xr = t3row(&p->x, x->x, n, c), *gr = t3row(&p->dy, x->dy, n, c);
  char *orow = (char *)t3row(&p->dx, x->dx, n, c);
  for (int64_t o = 0; o < p->S; o += NCH) {
    int64_t cnt = p->S - o < NCH ? p->S - o : NCH;
    rk_load_f64(gb, gr + o * p->dy.ss * ges, p->dy.dt, p->dy.ss, cnt);
    if (k2 != 0) {
      rk_load_f64(xb, xr + o * p->x.ss * xes, p->x.dt, p->x.ss, cnt);
      for (int64_t i = 0; i < cnt; i++) gb[i] = gb[i] * k1 + (xb[i] - mean) * k2 + k3;
    } else {
      for (int64_t i = 0; i < cnt; i++) gb[i] = gb[i] * k1 + k3;
    }
    rk_store_row_f64(orow + o * p->dx.ss * oes, p->dx.dt, p->dx.ss, gb, cnt);
  }
}

/* dx[n, c, :] = dy * k1 + (x - mean) * k2 + k3 for samples n of [n0, n1) */
static void t3_dx(const bnplan *p, const bnctx *x, int64_t n0, int64_t n1, int64_t c, double mean, double k1, double k2,
                  double k3) {
  if (t3_vec_rows(&p->x) && t3_vec_rows(&p->dy) && t3_vec_rows(&p->dx)) {
    /* k2 == 0: x is not read (as below) */
    bn_affine_rows(&p->dx, x->dx, &p->dy, x->dy, k2 != 0 ? &p->x : NULL, x->x, n0, n1, c, c + 1, p->S, &k1, &mean, &k2,
                   0, &k3);
    return;
  }
  double xb[NCH], gb[NCH];
  int64_t xes = (int64_t)tpurt_dtype_size(p->x.dt), ges = (int64_t)tpurt_dtype_size(p->dy.dt),
          oes = (int64_t)tpurt_dtype_size(p->dx.dt);
  for (int64_t n = n0; n < n1; n++) t3_dx_row(p, x, n, c, mean, k1, k2, k3, xb, gb, xes, ges, oes);
}


/* ---- batch norm: one channel per work item */
/* Batch norm reads a block of channels twice, for their statistics and then
 * for the affine map: a block's rows of every sample stay within this many
 * bytes (of L2) so the second pass finds them there. 64 channels of 64 x 8 x
 * 8 f32 samples (2 MiB of x and dy) read the second time from L3 made the
 * backward pass 0.92x a channel at a time. */
#define BN_BLOCK_BYTES (256 << 10)

/* channels a batch norm block takes: the rows of every sample of x (and dy
 * in the backward pass) within BN_BLOCK_BYTES, 1 to AFFINE_BLOCK */
static int64_t bn_block(const bnplan *p, int bwd) {
  int64_t per = p->N * p->S * (int64_t)(tpurt_dtype_size(p->x.dt) + (bwd ? tpurt_dtype_size(p->dy.dt) : 0));
  int64_t k = per > 0 ? BN_BLOCK_BYTES / per : AFFINE_BLOCK;
  return k < 1 ? 1 : k > AFFINE_BLOCK ? AFFINE_BLOCK : k;
}

static void bn_fwd_ch(void *c, int64_t cb, int64_t ce) {
  bnctx *x = c;
  const bnplan *p = x->p;
  double M = (double)(p->N * p->S);
  /* vector rows: the affine maps of a block of channels in one call, rows
   * in memory order (sample by sample): a channel at a time wrote a row of
   * every sample, C x S elements apart (512 channels at 4 x 4: a 32-byte
   * store every 16 KiB, each a line fetched for writing); short rows: the
   * block's statistics in memory order too (bn_sums_block) */
  int blocked = x->y && !p->ew_apply && t3_vec_rows(&p->x) && t3_vec_rows(&p->y);
  int short_rows = p->training && t3_vec_rows(&p->x) && p->x.dt != TPURT_F64 &&
                   p->S * (int64_t)tpurt_dtype_size(p->x.dt) < BN_SHORT;
  int64_t blk = blocked || short_rows ? bn_block(p, 0) : 1;
  double k1[AFFINE_BLOCK], k3[AFFINE_BLOCK], cv[AFFINE_BLOCK], sv[AFFINE_BLOCK], qv[AFFINE_BLOCK];
  for (int64_t c0 = cb; c0 < ce; c0 += blk) {
    int64_t c1 = c0 + blk < ce ? c0 + blk : ce;
    if (short_rows) { /* centred on each channel's first element, as t3_stats */
      for (int64_t ch = c0; ch < c1; ch++) rk_load_f64(&cv[ch - c0], t3row(&p->x, x->x, 0, ch), p->x.dt, 1, 1);
      bn_sums_block(0, p, x, c0, c1, cv, sv, qv);
    }
    for (int64_t ch = c0; ch < c1; ch++) {
      double mean, invstd;
      if (p->training) {
        double var;
        if (short_rows)
          stats_of_sums(M, cv[ch - c0], sv[ch - c0], qv[ch - c0], 0, &mean, &var);
        else
          t3_stats(&p->x, x->x, 0, p->N, ch, ch + 1, p->S, &mean, &var);
        invstd = 1.0 / sqrt(var + p->eps);
        vset(&p->smean, x->smean, ch, mean);
        vset(&p->sinv, x->sinv, ch, invstd);
        if (x->rm) vset(&p->rm, x->rm, ch, (1 - p->momentum) * vget(&p->rm, x->rm, ch, 0) + p->momentum * mean);
        if (x->rv)
          vset(&p->rv, x->rv, ch,
               (1 - p->momentum) * vget(&p->rv, x->rv, ch, 0) + p->momentum * var * M / (M - 1));
      } else {
        mean = vget(&p->rm, x->rm, ch, 0.0);
        invstd = 1.0 / sqrt(vget(&p->rv, x->rv, ch, 1.0) + p->eps);
      }
      double w = vget(&p->w, x->w, ch, 1.0), b = vget(&p->b, x->b, ch, 0.0);
      if (x->y && p->ew_apply) {
        double bb = x->b ? b : x->w ? 0.0 : -0.0; /* see apply_k */
        apply_k k = {mean, invstd, &w, &bb, 0};
        for (int64_t n = 0; n < p->N; n++)
          apply_row(p->x.dt, (char *)t3row(&p->y, x->y, n, ch), p->y.ss, t3row(&p->x, x->x, n, ch), p->x.ss, p->S,
                    &k);
      } else if (blocked) {
        k1[ch - c0] = invstd * w, k3[ch - c0] = b - mean * k1[ch - c0];
      } else if (x->y) {
        double scale = invstd * w, shift = b - mean * scale;
        t3_affine(&p->x, x->x, &p->y, x->y, 0, p->N, ch, p->S, scale, shift);
      }
    }
    if (blocked) {
      const double zero = 0.0;
      bn_affine_rows(&p->y, x->y, &p->x, x->x, NULL, NULL, 0, p->N, c0, c1, p->S, k1, &zero, &zero, 0, k3);
    }
  }
}

/* dx of channels [c0, c1) (at most bn_block's) from their k1, mean,
 * k2, k3 (index ch - c0), every sample: vector rows in memory order, sample
 * by sample (a channel at a time stored a row of every sample, C x S
 * elements apart: 512 channels at 4 x 4 put each of a channel's 64 rows
 * 16 KiB from the last, into one set of the L1 cache); x is read for the
 * channels whose k2 is not 0, as t3_dx (a block mixing both is split). */
static void bn_dx_block(const bnplan *p, const bnctx *x, int64_t c0, int64_t c1, const double *k1, const double *mean,
                        const double *k2, const double *k3) {
  int64_t a = c0;
  while (a < c1) {
    int reads = k2[a - c0] != 0;
    int64_t b = a + 1;
    while (b < c1 && (k2[b - c0] != 0) == reads) b++;
    bn_affine_rows(&p->dx, x->dx, &p->dy, x->dy, reads ? &p->x : NULL, x->x, 0, p->N, a, b, p->S, k1 + (a - c0),
                   mean + (a - c0), k2 + (a - c0), 1, k3 + (a - c0));
    a = b;
  }
}

/* mean and invstd of batch norm channel ch */
static void bn_stats_of(const bnplan *p, const bnctx *x, int64_t ch, double *mean, double *invstd) {
  if (p->training) {
    *mean = vget(&p->smean, x->smean, ch, 0.0);
    *invstd = vget(&p->sinv, x->sinv, ch, 1.0);
  } else {
    *mean = vget(&p->rm, x->rm, ch, 0.0);
    *invstd = 1.0 / sqrt(vget(&p->rv, x->rv, ch, 1.0) + p->eps);
  }
}

static void bn_bwd_ch(void *c, int64_t cb, int64_t ce) {
  bnctx *x = c;
  const bnplan *p = x->p;
  double M = (double)(p->N * p->S);
  int vec = t3_vec_rows(&p->x) && t3_vec_rows(&p->dy);
  int blocked = x->dx && vec && t3_vec_rows(&p->dx);
  /* short rows: the sums of a block of channels in memory order too */
  int short_rows = vec && p->S * (int64_t)tpurt_dtype_size(p->x.dt) < BN_SHORT;
  int64_t blk = blocked || short_rows ? bn_block(p, 1) : 1;
  double k1v[AFFINE_BLOCK], mv[AFFINE_BLOCK], k2v[AFFINE_BLOCK], k3v[AFFINE_BLOCK], iv[AFFINE_BLOCK];
  double sdyv[AFFINE_BLOCK], sdyxv[AFFINE_BLOCK];
  for (int64_t c0 = cb; c0 < ce; c0 += blk) {
    int64_t c1 = c0 + blk < ce ? c0 + blk : ce;
    for (int64_t ch = c0; ch < c1; ch++) bn_stats_of(p, x, ch, &mv[ch - c0], &iv[ch - c0]);
    if (short_rows)
      bn_sums_block(1, p, x, c0, c1, mv, sdyv, sdyxv);
    else
      for (int64_t ch = c0; ch < c1; ch++)
        t3_dsums(p, x, 0, p->N, ch, NULL, mv[ch - c0], &sdyv[ch - c0], &sdyxv[ch - c0], 0, NULL);
    for (int64_t ch = c0; ch < c1; ch++) {
      double sdy = sdyv[ch - c0], sdyx = sdyxv[ch - c0], invstd = iv[ch - c0];
      vset(&p->dw, x->dw, ch, sdyx * invstd);
      vset(&p->db, x->db, ch, sdy);
      double w = vget(&p->w, x->w, ch, 1.0);
      double k1 = invstd * w, k2 = 0, k3 = 0;
      if (p->training) {
        k2 = -invstd * invstd * sdyx / M * k1;
        k3 = -sdy / M * k1;
      }
      k1v[ch - c0] = k1, k2v[ch - c0] = k2, k3v[ch - c0] = k3;
      if (x->dx && !blocked) t3_dx(p, x, 0, p->N, ch, mv[ch - c0], k1, k2, k3);
    }
    if (blocked) bn_dx_block(p, x, c0, c1, k1v, mv, k2v, k3v);
  }
}

/* ---- group norm: one (sample, group) per work item */

/* Vector rows of sample n, group g, in blocks of AFFINE_BLOCK channels, one
 * bn_affine_rows call each, k1 = rstd w[ch]: forward (fwd), y = x k1 +
 * (b[ch] - mean k1); backward, dx = dy k1 + (x - mean) k2 + k3 (x not read
 * where k2 == 0, as t3_dx). */
static void gn_affine(const bnplan *p, const bnctx *x, int64_t n, int64_t g, int fwd, double rstd, double mean,
                      double k2, double k3) {
  int64_t Cg = p->C / p->groups, cend = (g + 1) * Cg;
  double k1v[AFFINE_BLOCK], k3v[AFFINE_BLOCK];
  for (int64_t c0 = g * Cg; c0 < cend; c0 += AFFINE_BLOCK) {
    int64_t c1 = c0 + AFFINE_BLOCK < cend ? c0 + AFFINE_BLOCK : cend;
    for (int64_t ch = c0; ch < c1; ch++) {
      k1v[ch - c0] = rstd * vget(&p->w, x->w, ch, 1.0);
      k3v[ch - c0] = fwd ? vget(&p->b, x->b, ch, 0.0) - mean * k1v[ch - c0] : k3;
    }
    const double zero = 0.0;
    if (fwd)
      bn_affine_rows(&p->y, x->y, &p->x, x->x, NULL, NULL, n, n + 1, c0, c1, p->S, k1v, &zero, &zero, 0, k3v);
    else
      bn_affine_rows(&p->dx, x->dx, &p->dy, x->dy, k2 != 0 ? &p->x : NULL, x->x, n, n + 1, c0, c1, p->S, k1v, &mean,
                     &k2, 0, k3v);
  }
}
static void gn_fwd(void *c, int64_t ib, int64_t ie) {
  bnctx *x = c;
  const bnplan *p = x->p;
  int64_t G = p->groups, Cg = p->C / G;
  for (int64_t it = ib; it < ie; it++) {
    int64_t n = it / G, g = it % G;
    double mean, var;
    t3_stats(&p->x, x->x, n, n + 1, g * Cg, (g + 1) * Cg, p->S, &mean, &var);
    double rstd = 1.0 / sqrt(var + p->eps);
    vset(&p->smean, x->smean, it, mean);
    vset(&p->sinv, x->sinv, it, rstd);
    if (t3_vec_rows(&p->x) && t3_vec_rows(&p->y)) {
      gn_affine(p, x, n, g, 1, rstd, mean, 0.0, 0.0);
      continue;
    }
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
      double w = vget(&p->w, x->w, ch, 1.0), b = vget(&p->b, x->b, ch, 0.0);
      double scale = rstd * w;
      t3_affine(&p->x, x->x, &p->y, x->y, n, n + 1, ch, p->S, scale, b - mean * scale);
    }
  }
}

static void gn_bwd_dx(void *c, int64_t ib, int64_t ie) {
  bnctx *x = c;
  const bnplan *p = x->p;
  int64_t G = p->groups, Cg = p->C / G;
  double M = (double)(Cg * p->S);
  for (int64_t it = ib; it < ie; it++) {
    int64_t n = it / G, g = it % G;
    double mean = vget(&p->smean, x->smean, it, 0.0), rstd = vget(&p->sinv, x->sinv, it, 1.0);
    /* sg = sum(dy * w), sgx = sum(dy * w * xhat) over the group */
    double sg = 0, sgx = 0;
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
      double w = vget(&p->w, x->w, ch, 1.0), a, b;
      t3_dsums(p, x, n, n + 1, ch, NULL, mean, &a, &b, 0, NULL);
      if (x->parts) x->parts[2 * (n * p->C + ch)] = a, x->parts[2 * (n * p->C + ch) + 1] = b;
      sg += a * w;
      sgx += b * rstd * w;
    }
    sg /= M;
    sgx /= M;
    /* dx = rstd * (dy * w - sg - xhat * sgx) */
    if (t3_vec_rows(&p->x) && t3_vec_rows(&p->dy) && t3_vec_rows(&p->dx)) {
      gn_affine(p, x, n, g, 0, rstd, mean, -rstd * rstd * sgx, -rstd * sg);
      continue;
    }
    for (int64_t ch = g * Cg; ch < (g + 1) * Cg; ch++) {
      double w = vget(&p->w, x->w, ch, 1.0);
      t3_dx(p, x, n, n + 1, ch, mean, rstd * w, -rstd * rstd * sgx, -rstd * sg);
    }
  }
}

/* dw, db of channels [cb, ce): from the rows' sums gn_bwd_dx kept (the
 * same row sums t3_dsums gives below, added in the same order: the same
 * bits, one pass over dy and x fewer), or read again */
static void gn_bwd_params(void *c, int64_t cb, int64_t ce) {
  bnctx *x = c;
  const bnplan *p = x->p;
  int64_t G = p->groups, Cg = p->C / G;
  if (x->parts) {
    for (int64_t ch = cb; ch < ce; ch++) {
      double sdy = 0, sdyx = 0;
      for (int64_t n = 0; n < p->N; n++) {
        const double *q = x->parts + 2 * (n * p->C + ch);
        sdy += q[0];
        sdyx += q[1] * vget(&p->sinv, x->sinv, n * G + ch / Cg, 1.0);
      }
      vset(&p->dw, x->dw, ch, sdyx);
      vset(&p->db, x->db, ch, sdy);
    }
    return;
  }
  double *means = malloc(sizeof(double) * (size_t)p->N * 2);
  if (!means) {
    x->failed = 1;
    return;
  }
  double *invs = means + p->N;
  for (int64_t ch = cb; ch < ce; ch++) {
    int64_t g = ch / Cg;
    for (int64_t n = 0; n < p->N; n++) {
      means[n] = vget(&p->smean, x->smean, n * G + g, 0.0);
      invs[n] = vget(&p->sinv, x->sinv, n * G + g, 1.0);
    }
    double sdy, sdyx;
    t3_dsums(p, x, 0, p->N, ch, means, 0.0, &sdy, &sdyx, 1, invs);
    vset(&p->dw, x->dw, ch, sdyx);
    vset(&p->db, x->db, ch, sdy);
  }
  free(means);
}

/* elements per pool task of batch and group norm (a 16 x 256 x 4 x 4 group
 * norm backward, 64 K elements, ran as one task of ~100 us) */
#define NORM_TASK 16384
static tpurt_status k_bn(void *a, char *err, size_t errlen) {
  const bnplan *p = a;
  bnctx x = {p,
             rk_hv(p->x.ptr),
             p->y.on ? rk_hv(p->y.ptr) : NULL,
             p->dy.on ? rk_hv(p->dy.ptr) : NULL,
             p->dx.on ? rk_hv(p->dx.ptr) : NULL,
             vptr(&p->w), vptr(&p->b), vptr(&p->rm), vptr(&p->rv), vptr(&p->smean), vptr(&p->sinv), vptr(&p->dw),
             vptr(&p->db), NULL, 0};
  int64_t per = p->N * p->S;
  if (p->groups == 0) {
    tpurt_parallel_for(p->C, NORM_TASK / (per + 1) + 1, p->fwd ? bn_fwd_ch : bn_bwd_ch, &x);
    return TPURT_OK;
  }
  int64_t items = p->N * p->groups, per_item = p->C / p->groups * p->S;
  if (p->y.on) {
    tpurt_parallel_for(items, NORM_TASK / (per_item + 1) + 1, gn_fwd, &x);
  } else {
    /* the weight and bias gradients from the input gradient's row sums
     * where both read the rows as vectors (the buffered path adds its
     * chunks in another order) */
    if (x.dx && (x.dw || x.db) && t3_vec_rows(&p->x) && t3_vec_rows(&p->dy))
      x.parts = malloc(sizeof(double) * 2 * (size_t)(p->N * p->C));
    if (x.dx) tpurt_parallel_for(items, NORM_TASK / (per_item + 1) + 1, gn_bwd_dx, &x);
    if (x.dw || x.db) tpurt_parallel_for(p->C, NORM_TASK / (per + 1) + 1, gn_bwd_params, &x);
    free(x.parts);
  }
  if (x.failed) {
    snprintf(err, errlen, "group_norm_backward: out of host memory");
    return TPURT_ERR_OUT_OF_MEMORY;
  }
  return TPURT_OK;
}

static tpurt_status get_t3_r(int dev, const tpurt_view *v, const tpurt_view *ref, t3 *t, const char *nm,
                             const char *what, int range) {
  memset(t, 0, sizeof *t);
  if (!v) return TPURT_OK;
  tpurt_status st;
  if ((st = rk_check_view(v, nm))) return st;
  if (v->ndim < 2) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s needs at least 2 dimensions", nm, what);
  if (ref && !rk_same_shape(v, ref))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s has a different shape than the input", nm, what);
  int64_t cnt;
  if (!flat_range(v, 2, v->ndim, &cnt, &t->ss))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: the spatial dims of %s must merge into one strided dim", nm, what);
  if (range && (st = rk_check_range(dev, v, nm))) return st;
  t->ptr = v->ptr;
  t->dt = v->dtype;
  t->sn = v->strides[0];
  t->sc = v->strides[1];
  t->on = 1;
  t->es = (int)tpurt_dtype_size(t->dt);
  t->vec = (t->dt == TPURT_F32 || t->dt == TPURT_BF16) && t->ss == 1 &&
           (tpurt__cpu_has_avx512() || tpurt__cpu_has_avx2_fma());
  return TPURT_OK;
}
static tpurt_status get_t3(int dev, const tpurt_view *v, const tpurt_view *ref, t3 *t, const char *nm, const char *what) {
  return get_t3_r(dev, v, ref, t, nm, what, 1);
}

static tpurt_status bn_common(tpurt_stream **s, const char *nm, bnplan *p, const tpurt_view *x) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((st = rk_check_view(x, nm))) return st;
  if (x->ndim < 2) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected an input with at least 2 dimensions", nm);
  if (!rk_is_float(x->dtype)) return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: expected a floating point input", nm);
  if ((st = tpurt__resolve_stream(s, tpurt_devptr_device(x->ptr)))) return st;
  p->N = x->sizes[0];
  p->C = x->sizes[1];
  p->S = 1;
  for (int k = 2; k < x->ndim; k++) p->S *= x->sizes[k];
  return get_t3((*s)->dev, x, NULL, &p->x, nm, "input");
}

tpurt_status tpurt_batch_norm(tpurt_stream *s, const tpurt_view *y, const tpurt_view *save_mean,
                              const tpurt_view *save_invstd, const tpurt_view *x, const tpurt_view *w,
                              const tpurt_view *b, const tpurt_view *running_mean, const tpurt_view *running_var,
                              int training, double momentum, double eps) {
  const char *nm = "batch_norm";
  bnplan p;
  memset(&p, 0, sizeof p);
  tpurt_status st = bn_common(&s, nm, &p, x);
  if (st) return st;
  int dev = s->dev;
  p.training = training;
  p.momentum = momentum;
  p.eps = eps;
  if (!y) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output view is NULL", nm);
  /* y's memory is checked by the kernel that writes it (see split) */
  if ((st = get_t3_r(dev, y, x, &p.y, nm, "output", 0))) return st;
  tpurt__defer_note_reads(1);
  if (!(st = get_vec(dev, w, p.C, &p.w, nm, "weight"))) st = get_vec(dev, b, p.C, &p.b, nm, "bias");
  tpurt__defer_note_reads(0);
  if (st || (st = get_vec(dev, running_mean, p.C, &p.rm, nm, "running_mean")) ||
      (st = get_vec(dev, running_var, p.C, &p.rv, nm, "running_var")) ||
      (st = get_vec(dev, save_mean, p.C, &p.smean, nm, "save_mean")) ||
      (st = get_vec(dev, save_invstd, p.C, &p.sinv, nm, "save_invstd")))
    return st;
  if (!training && (!running_mean || !running_var))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: running_mean and running_var are required in evaluation", nm);
  if (p.C == 0) return TPURT_OK;
  p.fwd = 1;
  tpurt_dtype dt = p.x.dt;
  int split = training && (dt == TPURT_F32 || dt == TPURT_F64) && p.y.dt == dt && p.N * p.S > 0 && p.smean.on &&
              p.sinv.on && p.smean.dt == dt && p.sinv.dt == dt && (!p.w.on || p.w.dt == dt) &&
              (!p.b.on || p.b.dt == dt);
  if (!split || !tpurt__deferring()) {
    p.ew_apply = split;
    return (st = rk_check_range(dev, y, nm)) ? st : tpurt_launch(s, nm, k_bn, &p, sizeof p);
  }
  /* training in f32 / f64 while deferring: the statistics kernel, then the
   * normalization as an elementwise program (with the ReLU after it one
   * kernel, and recomputable from x and the statistics); strict eager
   * computes the same arithmetic in the statistics kernel */
  bnplan ps = p;
  memset(&ps.y, 0, sizeof ps.y);
  if ((st = tpurt_launch(s, nm, k_bn, &ps, sizeof ps))) return st;
  const int64_t sizes[3] = {p.N, p.C, p.S}, xs[3] = {p.x.sn, p.x.sc, p.x.ss}, ys[3] = {p.y.sn, p.y.sc, p.y.ss};
  return norm_apply(s, nm, y, x, sizes, xs, ys, &p.smean, &p.sinv, 1, p.w.on ? &p.w : NULL, p.b.on ? &p.b : NULL, 1);
}

tpurt_status tpurt_batch_norm_backward(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dw,
                                       const tpurt_view *db, const tpurt_view *dy, const tpurt_view *x,
                                       const tpurt_view *w, const tpurt_view *running_mean,
                                       const tpurt_view *running_var, const tpurt_view *save_mean,
                                       const tpurt_view *save_invstd, int training, double eps) {
  const char *nm = "batch_norm_backward";
  bnplan p;
  memset(&p, 0, sizeof p);
  tpurt_status st = bn_common(&s, nm, &p, x);
  if (st) return st;
  int dev = s->dev;
  p.training = training;
  p.eps = eps;
  if (!dy) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grad_output view is NULL", nm);
  if ((st = get_t3(dev, dy, x, &p.dy, nm, "grad_output")) || (st = get_t3(dev, dx, x, &p.dx, nm, "grad_input")) ||
      (st = get_vec(dev, w, p.C, &p.w, nm, "weight")) || (st = get_vec(dev, dw, p.C, &p.dw, nm, "grad_weight")) ||
      (st = get_vec(dev, db, p.C, &p.db, nm, "grad_bias")) ||
      (st = get_vec(dev, running_mean, p.C, &p.rm, nm, "running_mean")) ||
      (st = get_vec(dev, running_var, p.C, &p.rv, nm, "running_var")) ||
      (st = get_vec(dev, save_mean, p.C, &p.smean, nm, "save_mean")) ||
      (st = get_vec(dev, save_invstd, p.C, &p.sinv, nm, "save_invstd")))
    return st;
  if (training && (!save_mean || !save_invstd))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: save_mean and save_invstd are required in training", nm);
  if (!training && (!running_mean || !running_var))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: running_mean and running_var are required in evaluation", nm);
  if (p.C == 0) return TPURT_OK;
  return tpurt_launch(s, nm, k_bn, &p, sizeof p);
}

tpurt_status tpurt_group_norm(tpurt_stream *s, const tpurt_view *y, const tpurt_view *mean, const tpurt_view *rstd,
                              const tpurt_view *x, const tpurt_view *w, const tpurt_view *b, int groups, double eps) {
  const char *nm = "group_norm";
  bnplan p;
  memset(&p, 0, sizeof p);
  tpurt_status st = bn_common(&s, nm, &p, x);
  if (st) return st;
  int dev = s->dev;
  if (groups <= 0 || p.C % groups != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: Expected number of channels in input to be divisible by num_groups, but got input of "
                      "shape with %" PRId64 " channels and num_groups=%d",
                      nm, p.C, groups);
  p.groups = groups;
  p.eps = eps;
  if (!y) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output view is NULL", nm);
  if ((st = get_t3(dev, y, x, &p.y, nm, "output")) || (st = get_vec(dev, w, p.C, &p.w, nm, "weight")) ||
      (st = get_vec(dev, b, p.C, &p.b, nm, "bias")) || (st = get_vec(dev, mean, p.N * groups, &p.smean, nm, "mean")) ||
      (st = get_vec(dev, rstd, p.N * groups, &p.sinv, nm, "rstd")))
    return st;
  if (p.N * p.C == 0) return TPURT_OK;
  return tpurt_launch(s, nm, k_bn, &p, sizeof p);
}

tpurt_status tpurt_group_norm_backward(tpurt_stream *s, const tpurt_view *dx, const tpurt_view *dw,
                                       const tpurt_view *db, const tpurt_view *dy, const tpurt_view *x,
                                       const tpurt_view *mean, const tpurt_view *rstd, const tpurt_view *w,
                                       int groups) {
  const char *nm = "group_norm_backward";
  bnplan p;
  memset(&p, 0, sizeof p);
  tpurt_status st = bn_common(&s, nm, &p, x);
  if (st) return st;
  int dev = s->dev;
  if (groups <= 0 || p.C % groups != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %" PRId64 " channels are not divisible into %d groups", nm, p.C,
                      groups);
  p.groups = groups;
  if (!dy) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: grad_output view is NULL", nm);
  if ((st = get_t3(dev, dy, x, &p.dy, nm, "grad_output")) || (st = get_t3(dev, dx, x, &p.dx, nm, "grad_input")) ||
      (st = get_vec(dev, w, p.C, &p.w, nm, "weight")) || (st = get_vec(dev, dw, p.C, &p.dw, nm, "grad_weight")) ||
      (st = get_vec(dev, db, p.C, &p.db, nm, "grad_bias")) ||
      (st = get_vec(dev, mean, p.N * groups, &p.smean, nm, "mean")) ||
      (st = get_vec(dev, rstd, p.N * groups, &p.sinv, nm, "rstd")))
    return st;
  if (p.C == 0) return TPURT_OK;
  if (p.N == 0) {
    tpurt_scalar z = {TPURT_SCALAR_INT, 0, 0, 0};
    if (dw && (st = tpurt_fill(s, dw, z))) return st;
    if (db && (st = tpurt_fill(s, db, z))) return st;
    return TPURT_OK;
  }
  return tpurt_launch(s, nm, k_bn, &p, sizeof p);
}
