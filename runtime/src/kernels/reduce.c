/*
 * reduce.c — reductions (sum, prod, mean, max/min with indices, argmax/min,
 * var/var_mean, norms, logsumexp, any/all, nansum).
 *
 * Launch (host): classify every dim as output or reduced, drop size-1 dims,
 * reorder (reduced dims by decreasing input stride, output dims likewise) and
 * merge dims that are contiguous relative to each other. Then one of two
 * strategies runs on the worker:
 *   inner: the innermost reduced dim is contiguous (or nothing is): every
 *          output walks its reduced space as rows; rows go through
 *          vectorized row kernels (several accumulators) in chunks.
 *   outer: the innermost output dim is contiguous: a block of adjacent
 *          outputs accumulates whole contiguous rows (one per reduced index).
 * Work is split over outputs; when there are fewer outputs than threads and
 * much to reduce, the reduced range is split too and partial states are
 * combined in a fixed order. f16/bf16/f32 data are computed as f32 (row
 * partial sums in f32 with 32 accumulators, combined in f64), f64 as f64,
 * integers as i64.
 *
 * DeferAndFuse (k_reduce_fused): the elementwise launch that computes the
 * input can run inside the walk (a prologue: each contiguous run of the
 * input is computed into the thread's buffer as the walk reaches it, never
 * stored), and the one that reads the outputs after it (an epilogue: on
 * the outputs each inner chunk has written, or whole after the walk). The
 * walk itself is unchanged, so the bits are strict mode's.
 */
#include "fused.h"
#include "rk_common.h"

#define CH 2048 /* row chunk (elements) */
#define CB 1024 /* column block of the outer strategy */

typedef struct {
  int op, cls, outer, has2, arg, sqrt_out;
  double p0;
  tpurt_dtype idt, odt, o2dt;
  tpurt_devptr in, out, out2;
  int no, nr;
  int64_t nout, nred;
  int64_t osz[TPURT_MAX_DIMS], oist[TPURT_MAX_DIMS], oost[TPURT_MAX_DIMS], oo2st[TPURT_MAX_DIMS];
  int64_t rsz[TPURT_MAX_DIMS], rst[TPURT_MAX_DIMS];
} rplan;

typedef struct {
  union {
    double d;
    int64_t i;
  } a;
  double b;
  int64_t k;
} rstate;

static int is_arg(int op) { return op == TPURT_RED_ARGMAX || op == TPURT_RED_ARGMIN; }
static int is_maxlike(int op) { return op == TPURT_RED_MAX || op == TPURT_RED_ARGMAX; }

static void st_init(const rplan *p, rstate *s) {
  s->b = 0;
  s->k = 0;
  int f = p->cls != RK_I64;
  switch (p->op) {
    case TPURT_RED_PROD:
      if (f) s->a.d = 1; else s->a.i = 1;
      break;
    case TPURT_RED_MAX: case TPURT_RED_ARGMAX:
      if (f) s->a.d = -INFINITY; else s->a.i = INT64_MIN;
      s->k = -1;
      break;
    case TPURT_RED_MIN: case TPURT_RED_ARGMIN:
      if (f) s->a.d = INFINITY; else s->a.i = INT64_MAX;
      s->k = -1;
      break;
    case TPURT_RED_NORM:
      s->a.d = (isinf(p->p0) && p->p0 < 0) ? INFINITY : 0.0;
      break;
    case TPURT_RED_LOGSUMEXP: s->a.d = -INFINITY; break;
    case TPURT_RED_ALL: s->k = 1; break;
    default:
      if (f) s->a.d = 0; else s->a.i = 0;
  }
}

/* does value x (at a later position) replace the current extreme c? */
static inline int better_d(int mx, double x, double c) { return c == c && (x != x || (mx ? x > c : x < c)); }
static inline int better_i(int mx, int64_t x, int64_t c) { return mx ? x > c : x < c; }

/* folds state b (covering later positions) into a */
static void st_combine(const rplan *p, rstate *a, const rstate *b) {
  int f = p->cls != RK_I64;
  switch (p->op) {
    case TPURT_RED_SUM: case TPURT_RED_MEAN: case TPURT_RED_NANSUM:
      if (f) a->a.d += b->a.d; else a->a.i = (int64_t)((uint64_t)a->a.i + (uint64_t)b->a.i);
      break;
    case TPURT_RED_PROD:
      if (f) a->a.d *= b->a.d; else a->a.i = (int64_t)((uint64_t)a->a.i * (uint64_t)b->a.i);
      break;
    case TPURT_RED_MAX: case TPURT_RED_MIN: case TPURT_RED_ARGMAX: case TPURT_RED_ARGMIN: {
      if (b->k < 0) break;
      int mx = is_maxlike(p->op);
      if (a->k < 0 || (f ? better_d(mx, b->a.d, a->a.d) : better_i(mx, b->a.i, a->a.i))) *a = *b;
      break;
    }
    case TPURT_RED_VAR: {
      if (b->k == 0) break;
      if (a->k == 0) { *a = *b; break; }
      double na = (double)a->k, nb = (double)b->k, n = na + nb, d = b->a.d - a->a.d;
      a->a.d += d * nb / n;
      a->b += b->b + d * d * na * nb / n;
      a->k += b->k;
      break;
    }
    case TPURT_RED_NORM:
      if (isinf(p->p0)) a->a.d = p->p0 > 0 ? rk_maxnan(a->a.d, b->a.d) : rk_minnan(a->a.d, b->a.d);
      else a->a.d += b->a.d;
      break;
    case TPURT_RED_LOGSUMEXP: {
      double m = rk_maxnan(a->a.d, b->a.d);
      if (isfinite(m)) a->b = a->b * exp(a->a.d - m) + b->b * exp(b->a.d - m);
      a->a.d = m;
      break;
    }
    case TPURT_RED_ANY: a->k |= b->k; break;
    case TPURT_RED_ALL: a->k &= b->k; break;
  }
}

/* ------------------------------------------------------------ row kernels */

static double rsum_f(const float *x, int64_t n) {
  float acc[32] = {0};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 32; k++) acc[k] += x[i + k];
  float t = 0;
  for (; i < n; i++) t += x[i];
  for (int k = 0; k < 16; k++) acc[k] += acc[k + 16];
  for (int k = 0; k < 8; k++) acc[k] += acc[k + 8];
  double s = t;
  for (int k = 0; k < 8; k++) s += acc[k];
  return s;
}
static double rsum_d(const double *x, int64_t n) {
  double acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += x[i + k];
  double t = 0;
  for (; i < n; i++) t += x[i];
  for (int k = 0; k < 8; k++) acc[k] += acc[k + 8];
  for (int k = 0; k < 8; k++) t += acc[k];
  return t;
}
static int64_t rsum_i(const int64_t *x, int64_t n) {
  uint64_t acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += (uint64_t)x[i + k];
  uint64_t t = 0;
  for (; i < n; i++) t += (uint64_t)x[i];
  for (int k = 0; k < 8; k++) t += acc[k];
  return (int64_t)t;
}
static double rnansum_f(const float *x, int64_t n) {
  float acc[32] = {0};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 32; k++) acc[k] += x[i + k] == x[i + k] ? x[i + k] : 0.0f;
  double s = 0;
  for (; i < n; i++) s += x[i] == x[i] ? x[i] : 0.0f;
  for (int k = 0; k < 32; k++) s += acc[k];
  return s;
}
static double rnansum_d(const double *x, int64_t n) {
  double acc[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) acc[k] += x[i + k] == x[i + k] ? x[i + k] : 0.0;
  double s = 0;
  for (; i < n; i++) s += x[i] == x[i] ? x[i] : 0.0;
  for (int k = 0; k < 16; k++) s += acc[k];
  return s;
}
/* NaN-propagating max / min of a float row (n >= 1), with GCC vector
 * extensions: compare + select per lane, NaN lanes tracked in a mask */
typedef float rk_v8f __attribute__((vector_size(32)));
typedef int32_t rk_v8i __attribute__((vector_size(32)));
typedef double rk_v4d __attribute__((vector_size(32)));
typedef int64_t rk_v4i __attribute__((vector_size(32)));
#define REXT1(NAME, T, VT, VI, W, CMP, COMB)                                    \
  static T NAME(const T *x, int64_t n) {                                        \
    T r = x[0];                                                                 \
    int64_t i = 0;                                                              \
    if (n >= 2 * W) {                                                           \
      VT a0, a1, v0, v1;                                                        \
      VI nan = {0};                                                             \
      memcpy(&a0, x, sizeof a0);                                                \
      a1 = a0;                                                                  \
      for (; i + 2 * W <= n; i += 2 * W) {                                      \
        memcpy(&v0, x + i, sizeof v0);                                          \
        memcpy(&v1, x + i + W, sizeof v1);                                      \
        VI m0 = v0 CMP a0, m1 = v1 CMP a1;                                      \
        a0 = (VT)(((VI)v0 & m0) | ((VI)a0 & ~m0));                              \
        a1 = (VT)(((VI)v1 & m1) | ((VI)a1 & ~m1));                              \
        nan |= (v0 != v0) | (v1 != v1);                                         \
      }                                                                         \
      for (int k = 0; k < W; k++) {                                             \
        if (nan[k]) return (T)NAN;                                              \
        r = (T)COMB(r, a0[k]);                                                  \
        r = (T)COMB(r, a1[k]);                                                  \
      }                                                                         \
    }                                                                           \
    for (; i < n; i++) r = (T)COMB(r, x[i]);                                    \
    return r;                                                                   \
  }
REXT1(rmax_f, float, rk_v8f, rk_v8i, 8, >, rk_maxnan)
REXT1(rmin_f, float, rk_v8f, rk_v8i, 8, <, rk_minnan)
REXT1(rmax_d, double, rk_v4d, rk_v4i, 4, >, rk_maxnan)
REXT1(rmin_d, double, rk_v4d, rk_v4i, 4, <, rk_minnan)
static inline float rext_f(const float *x, int64_t n, int mx) { return mx ? rmax_f(x, n) : rmin_f(x, n); }
static inline double rext_d(const double *x, int64_t n, int mx) { return mx ? rmax_d(x, n) : rmin_d(x, n); }

/* the state update of one contiguous compute-typed row x[0..n) whose first
 * element has linear index lin in the reduced space */
static void row_op(const rplan *p, const void *xv, int64_t n, int64_t lin, rstate *s) {
  if (n <= 0) return;
  int op = p->op, cls = p->cls;
  if (cls == RK_I64) {
    const int64_t *x = xv;
    switch (op) {
      case TPURT_RED_SUM: case TPURT_RED_MEAN: case TPURT_RED_NANSUM:
        s->a.i = (int64_t)((uint64_t)s->a.i + (uint64_t)rsum_i(x, n));
        return;
      case TPURT_RED_PROD: {
        uint64_t r = (uint64_t)s->a.i;
        for (int64_t i = 0; i < n; i++) r *= (uint64_t)x[i];
        s->a.i = (int64_t)r;
        return;
      }
      case TPURT_RED_MAX: case TPURT_RED_MIN: case TPURT_RED_ARGMAX: case TPURT_RED_ARGMIN: {
        int mx = is_maxlike(op);
        int64_t c = s->a.i, ci = s->k, i0 = 0;
        if (ci < 0) { c = x[0]; ci = lin; i0 = 1; }
        if (mx) { for (int64_t i = i0; i < n; i++) if (x[i] > c) { c = x[i]; ci = lin + i; } }
        else { for (int64_t i = i0; i < n; i++) if (x[i] < c) { c = x[i]; ci = lin + i; } }
        s->a.i = c;
        s->k = ci;
        return;
      }
      case TPURT_RED_ANY: {
        int64_t r = 0;
        for (int64_t i = 0; i < n; i++) r |= x[i] != 0;
        s->k |= r;
        return;
      }
      case TPURT_RED_ALL: {
        int64_t r = 1;
        for (int64_t i = 0; i < n; i++) r &= x[i] != 0;
        s->k &= r;
        return;
      }
      default: { /* float-only ops on integer data: go through f64 */
        double buf[CH];
        rstate t;
        rplan q = *p;
        q.cls = RK_F64;
        for (int64_t o = 0; o < n; o += CH) {
          int64_t c = n - o < CH ? n - o : CH;
          for (int64_t i = 0; i < c; i++) buf[i] = (double)x[o + i];
          st_init(&q, &t);
          row_op(&q, buf, c, lin + o, &t);
          st_combine(&q, s, &t);
        }
        return;
      }
    }
  }
  const float *xf = xv;
  const double *xd = xv;
  int f32 = cls == RK_F32;
#define AT(i) (f32 ? (double)xf[i] : xd[i])
  switch (op) {
    case TPURT_RED_SUM: case TPURT_RED_MEAN:
      s->a.d += f32 ? rsum_f(xf, n) : rsum_d(xd, n);
      return;
    case TPURT_RED_NANSUM:
      s->a.d += f32 ? rnansum_f(xf, n) : rnansum_d(xd, n);
      return;
    case TPURT_RED_PROD: {
      double r = s->a.d;
      for (int64_t i = 0; i < n; i++) r *= AT(i);
      s->a.d = r;
      return;
    }
    case TPURT_RED_MAX: case TPURT_RED_MIN:
      if (!p->has2) {
        int mx = op == TPURT_RED_MAX;
        double r = f32 ? rext_f(xf, n, mx) : rext_d(xd, n, mx);
        if (s->k < 0) s->a.d = r;
        else s->a.d = mx ? rk_maxnan(s->a.d, r) : rk_minnan(s->a.d, r);
        s->k = 0;
        return;
      }
      /* value + index: */
      __attribute__((fallthrough));
    case TPURT_RED_ARGMAX: case TPURT_RED_ARGMIN: {
      int mx = is_maxlike(op);
      double c = s->a.d;
      int64_t ci = s->k, i0 = 0;
      if (ci < 0) { c = AT(0); ci = lin; i0 = 1; }
      if (c != c) { /* a NaN wins: the row's first element, or one seen before */
        s->a.d = c;
        s->k = ci;
        return;
      }
      for (int64_t i = i0; i < n; i++) {
        double v = AT(i);
        if (v != v) { c = v; ci = lin + i; break; }
        if (mx ? v > c : v < c) { c = v; ci = lin + i; }
      }
      s->a.d = c;
      s->k = ci;
      return;
    }
    case TPURT_RED_VAR: {
      /* two-pass over the row, then Chan's combination */
      double sum = f32 ? rsum_f(xf, n) : rsum_d(xd, n);
      double m = sum / (double)n, m2 = 0;
      if (f32) {
        float mf = (float)m, acc[16] = {0};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
          for (int k = 0; k < 16; k++) { float d = xf[i + k] - mf; acc[k] += d * d; }
        for (; i < n; i++) { double d = xf[i] - m; m2 += d * d; }
        for (int k = 0; k < 16; k++) m2 += acc[k];
        /* correct for the f32 rounding of the mean (not when the deviations overflow: m2 is then
         * rightly infinite, and inf - inf would make it NaN) */
        double corr = 0;
        for (int64_t j = 0; j < n; j++) corr += (double)xf[j] - m;
        if (isfinite(corr) && isfinite(m2)) m2 -= corr * (corr / (double)n);
        if (m2 < 0) m2 = 0; /* equal values: the correction cancels m2 up to rounding (seed 19389) */
      } else {
        double acc[8] = {0}, corr = 0;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
          for (int k = 0; k < 8; k++) { double d = xd[i + k] - m; acc[k] += d * d; }
        for (; i < n; i++) { double d = xd[i] - m; m2 += d * d; }
        for (int k = 0; k < 8; k++) m2 += acc[k];
        for (int64_t j = 0; j < n; j++) corr += xd[j] - m;
        /* as above; and when the squares overflow m2 is rightly infinite, and corr * corr may be too */
        if (isfinite(corr) && isfinite(m2)) m2 -= corr * (corr / (double)n);
        if (m2 < 0) m2 = 0; /* equal values: the correction cancels m2 up to rounding (seed 19389) */
      }
      rstate t = {{.d = m}, m2, n};
      st_combine(p, s, &t);
      return;
    }
    case TPURT_RED_NORM: {
      double ord = p->p0, r = 0;
      if (ord == 2) {
        if (f32) {
          float acc[32] = {0};
          int64_t i = 0;
          for (; i + 32 <= n; i += 32)
            for (int k = 0; k < 32; k++) acc[k] += xf[i + k] * xf[i + k];
          for (; i < n; i++) r += (double)xf[i] * xf[i];
          for (int k = 0; k < 32; k++) r += acc[k];
        } else {
          for (int64_t i = 0; i < n; i++) r += xd[i] * xd[i];
        }
        s->a.d += r;
      } else if (ord == 1) {
        for (int64_t i = 0; i < n; i++) r += fabs(AT(i));
        s->a.d += r;
      } else if (ord == 0) {
        for (int64_t i = 0; i < n; i++) r += AT(i) != 0;
        s->a.d += r;
      } else if (isinf(ord)) {
        double c = s->a.d;
        for (int64_t i = 0; i < n; i++) c = ord > 0 ? rk_maxnan(c, fabs(AT(i))) : rk_minnan(c, fabs(AT(i)));
        s->a.d = c;
      } else {
        for (int64_t i = 0; i < n; i++) r += pow(fabs(AT(i)), ord);
        s->a.d += r;
      }
      return;
    }
    case TPURT_RED_LOGSUMEXP: {
      double m = f32 ? rext_f(xf, n, 1) : rext_d(xd, n, 1);
      rstate t = {{.d = m}, 0, 0};
      if (isfinite(m)) {
        double acc = 0;
        for (int64_t i = 0; i < n; i++) acc += exp(AT(i) - m);
        t.b = acc;
      }
      st_combine(p, s, &t);
      return;
    }
    case TPURT_RED_ANY: {
      int64_t r = 0;
      for (int64_t i = 0; i < n; i++) r |= AT(i) != 0;
      s->k |= r;
      return;
    }
    case TPURT_RED_ALL: {
      int64_t r = 1;
      for (int64_t i = 0; i < n; i++) r &= AT(i) != 0;
      s->k &= r;
      return;
    }
  }
#undef AT
}

/* ------------------------------------------------------- column kernels */

typedef struct {
  double ad[CB], b[CB];
  int64_t ai[CB], k[CB];
} cols;

static void cols_init(const rplan *p, cols *c, int64_t n) {
  rstate s;
  st_init(p, &s);
  for (int64_t j = 0; j < n; j++) {
    c->ad[j] = s.a.d;
    c->ai[j] = s.a.i;
    c->b[j] = s.b;
    c->k[j] = s.k;
  }
}
static rstate cols_get(const rplan *p, const cols *c, int64_t j) {
  rstate s;
  if (p->cls == RK_I64) s.a.i = c->ai[j]; else s.a.d = c->ad[j];
  s.b = c->b[j];
  s.k = c->k[j];
  return s;
}

/* folds one row of n adjacent outputs' values (reduced index lin, the
 * cnt-th row of this range, counting from 1) into the column states */
static void col_op(const rplan *p, const void *xv, int64_t n, int64_t lin, int64_t cnt, cols *c) {
  int op = p->op;
  if (p->cls == RK_I64) {
    const int64_t *x = xv;
    switch (op) {
      case TPURT_RED_SUM: case TPURT_RED_MEAN: case TPURT_RED_NANSUM:
        for (int64_t j = 0; j < n; j++) c->ai[j] = (int64_t)((uint64_t)c->ai[j] + (uint64_t)x[j]);
        return;
      case TPURT_RED_PROD:
        for (int64_t j = 0; j < n; j++) c->ai[j] = (int64_t)((uint64_t)c->ai[j] * (uint64_t)x[j]);
        return;
      case TPURT_RED_ANY: for (int64_t j = 0; j < n; j++) c->k[j] |= x[j] != 0; return;
      case TPURT_RED_ALL: for (int64_t j = 0; j < n; j++) c->k[j] &= x[j] != 0; return;
      case TPURT_RED_MAX: case TPURT_RED_ARGMAX:
        if (cnt == 1) { for (int64_t j = 0; j < n; j++) { c->ai[j] = x[j]; c->k[j] = lin; } return; }
        for (int64_t j = 0; j < n; j++) if (x[j] > c->ai[j]) { c->ai[j] = x[j]; c->k[j] = lin; }
        return;
      case TPURT_RED_MIN: case TPURT_RED_ARGMIN:
        if (cnt == 1) { for (int64_t j = 0; j < n; j++) { c->ai[j] = x[j]; c->k[j] = lin; } return; }
        for (int64_t j = 0; j < n; j++) if (x[j] < c->ai[j]) { c->ai[j] = x[j]; c->k[j] = lin; }
        return;
      default: {
        double buf[CB];
        rplan q = *p;
        q.cls = RK_F64;
        for (int64_t j = 0; j < n; j++) buf[j] = (double)x[j];
        col_op(&q, buf, n, lin, cnt, c);
        return;
      }
    }
  }
  const float *xf = xv;
  const double *xd = xv;
  if (p->cls == RK_F32 && (op == TPURT_RED_SUM || op == TPURT_RED_MEAN)) {
    /* widen and add in one pass (the common column sum: bias gradients) */
    double *a = c->ad;
    for (int64_t j = 0; j < n; j++) a[j] += (double)xf[j];
    return;
  }
  if (p->cls == RK_F32) {
    /* widen once; the loops below then run on doubles */
    static _Thread_local double wide[CB];
    for (int64_t j = 0; j < n; j++) wide[j] = xf[j];
    xd = wide;
  }
  double *a = c->ad;
  switch (op) {
    case TPURT_RED_SUM: case TPURT_RED_MEAN:
      for (int64_t j = 0; j < n; j++) a[j] += xd[j];
      return;
    case TPURT_RED_NANSUM:
      for (int64_t j = 0; j < n; j++) a[j] += xd[j] == xd[j] ? xd[j] : 0.0;
      return;
    case TPURT_RED_PROD:
      for (int64_t j = 0; j < n; j++) a[j] *= xd[j];
      return;
    case TPURT_RED_MAX: case TPURT_RED_MIN: case TPURT_RED_ARGMAX: case TPURT_RED_ARGMIN: {
      if (cnt == 1) {
        for (int64_t j = 0; j < n; j++) { a[j] = xd[j]; c->k[j] = lin; }
        return;
      }
      int mx = is_maxlike(op);
      if (!p->has2 && !p->arg) {
        if (mx) for (int64_t j = 0; j < n; j++) a[j] = a[j] != a[j] ? a[j] : (xd[j] > a[j] || xd[j] != xd[j]) ? xd[j] : a[j];
        else for (int64_t j = 0; j < n; j++) a[j] = a[j] != a[j] ? a[j] : (xd[j] < a[j] || xd[j] != xd[j]) ? xd[j] : a[j];
        return;
      }
      for (int64_t j = 0; j < n; j++)
        if (better_d(mx, xd[j], a[j])) { a[j] = xd[j]; c->k[j] = lin; }
      return;
    }
    case TPURT_RED_VAR: { /* Welford, same count for every column */
      double inv = 1.0 / (double)cnt;
      for (int64_t j = 0; j < n; j++) {
        double d = xd[j] - a[j];
        a[j] += d * inv;
        c->b[j] += d * (xd[j] - a[j]);
      }
      for (int64_t j = 0; j < n; j++) c->k[j] = cnt;
      return;
    }
    case TPURT_RED_NORM: {
      double ord = p->p0;
      if (ord == 2) for (int64_t j = 0; j < n; j++) a[j] += xd[j] * xd[j];
      else if (ord == 1) for (int64_t j = 0; j < n; j++) a[j] += fabs(xd[j]);
      else if (ord == 0) for (int64_t j = 0; j < n; j++) a[j] += xd[j] != 0;
      else if (isinf(ord) && ord > 0) for (int64_t j = 0; j < n; j++) a[j] = rk_maxnan(a[j], fabs(xd[j]));
      else if (isinf(ord)) for (int64_t j = 0; j < n; j++) a[j] = rk_minnan(a[j], fabs(xd[j]));
      else for (int64_t j = 0; j < n; j++) a[j] += pow(fabs(xd[j]), ord);
      return;
    }
    case TPURT_RED_LOGSUMEXP:
      for (int64_t j = 0; j < n; j++) {
        double m = rk_maxnan(a[j], xd[j]);
        if (isfinite(m)) c->b[j] = c->b[j] * exp(a[j] - m) + exp(xd[j] - m);
        a[j] = m;
      }
      return;
    case TPURT_RED_ANY: for (int64_t j = 0; j < n; j++) c->k[j] |= xd[j] != 0; return;
    case TPURT_RED_ALL: for (int64_t j = 0; j < n; j++) c->k[j] &= xd[j] != 0; return;
  }
}

/* ----------------------------------------------------------- finalize */

static void finalize(const rplan *p, const rstate *s, char *o, char *o2) {
  int f = p->cls != RK_I64;
  double n = (double)p->nred;
  switch (p->op) {
    case TPURT_RED_SUM: case TPURT_RED_NANSUM: case TPURT_RED_PROD:
      if (f) rk_store_d(o, p->odt, s->a.d); else rk_store_i(o, p->odt, s->a.i);
      break;
    case TPURT_RED_MEAN:
      if (f) rk_store_d(o, p->odt, s->a.d / n); else rk_store_i(o, p->odt, p->nred ? s->a.i / p->nred : 0);
      break;
    case TPURT_RED_MAX: case TPURT_RED_MIN:
      if (f) rk_store_d(o, p->odt, s->a.d); else rk_store_i(o, p->odt, s->a.i);
      if (o2) rk_store_i(o2, p->o2dt, s->k < 0 ? 0 : s->k);
      break;
    case TPURT_RED_ARGMAX: case TPURT_RED_ARGMIN: rk_store_i(o, p->odt, s->k < 0 ? 0 : s->k); break;
    case TPURT_RED_VAR: {
      double div = n - p->p0;
      if (div < 0) div = 0;
      double v = p->nred ? s->b / div : NAN;
      rk_store_d(o, p->odt, p->sqrt_out ? sqrt(v) : v);
      if (o2) rk_store_d(o2, p->o2dt, p->nred ? s->a.d : NAN);
      break;
    }
    case TPURT_RED_NORM: {
      double ord = p->p0, v = s->a.d;
      if (ord == 2) v = sqrt(v);
      else if (!(ord == 1 || ord == 0 || isinf(ord))) v = pow(v, 1.0 / ord);
      rk_store_d(o, p->odt, v);
      break;
    }
    case TPURT_RED_LOGSUMEXP:
      rk_store_d(o, p->odt, isfinite(s->a.d) ? s->a.d + log(s->b) : s->a.d);
      break;
    case TPURT_RED_ANY: case TPURT_RED_ALL: rk_store_i(o, p->odt, s->k); break;
  }
}

/* ------------------------------------------------------------- walking */

typedef struct {
  const rplan *p;
  const char *in;
  char *out, *out2;
  int64_t P;        /* parts the reduced range is split into */
  int64_t nblk;     /* outer: column blocks per output row */
  int64_t W;        /* outer: columns per block (a multiple of CB) */
  rstate *partial;  /* P > 1: partial states */
  int failed;
  /* a fused prologue (k_reduce_fused): the launch computing the input, run
   * by ranges into each thread's buffer instead of read from memory */
  tpurt__ew_epi *pro;
  _Atomic int pro_failed;
  tpurt_status pro_st;
  char pro_err[256];
  /* a fused epilogue (k_reduce_fused) run by ranges of outputs: each
   * inner chunk runs it over the outputs it has just written */
  tpurt__ew_epi *epi;
} rctx;

/* Where a thread reads the input from: memory, or the prologue's clone on
 * this thread writing into tmp (room for max(CH, W) elements). */
typedef struct {
  tpurt__ew_epi *e;
  char *tmp;
} rsrc;

static int src_begin(rctx *x, rsrc *r) {
  r->e = NULL;
  r->tmp = NULL;
  if (!x->pro) return 1;
  int64_t n = x->W > CH ? x->W : CH;
  r->e = tpurt__ew_epi_clone(x->pro);
  r->tmp = malloc((size_t)n * 8);
  if (r->e && r->tmp) return 1;
  free(r->tmp);
  free(r->e);
  x->failed = 1;
  return 0;
}

static void src_end(rctx *x, rsrc *r) {
  free(r->tmp);
  if (!r->e) return;
  char err[256];
  tpurt_status st = tpurt__ew_epi_end(r->e, err, sizeof err);
  int zero = 0;
  if (st && atomic_compare_exchange_strong(&x->pro_failed, &zero, 1)) {
    x->pro_st = st;
    snprintf(x->pro_err, sizeof x->pro_err, "%s", err);
  }
}

/* The n input elements from element offset `at` (contiguous), computed by
 * the prologue into r->tmp (converted into buf where the class needs). */
static const void *pro_run(const rplan *p, const rsrc *r, void *buf, int64_t at, int64_t n) {
  tpurt__ew_into_range(r->e, r->tmp, at, at + n);
  return rk_load(p->cls, buf, r->tmp, p->idt, 1, n);
}

/* offsets (elements) of output linear index o over the first `nd` output dims */
static void out_offsets(const rplan *p, int nd, int64_t o, int64_t *io, int64_t *oo, int64_t *oo2) {
  int64_t a = 0, b = 0, c = 0;
  for (int k = nd - 1; k >= 0; k--) {
    int64_t i = o % p->osz[k];
    o /= p->osz[k];
    a += i * p->oist[k];
    b += i * p->oost[k];
    c += i * p->oo2st[k];
  }
  *io = a;
  *oo = b;
  *oo2 = c;
}

/* inner strategy: folds reduced indices [b, e) of the input at element
 * offset io (from memory at `in`, or from the prologue when r->e) */
static void inner_range(const rplan *p, const rsrc *r, const char *in, int64_t io, int64_t b, int64_t e,
                        rstate *s) {
  if (b >= e) return;
  int nr = p->nr;
  size_t es = tpurt_dtype_size(p->idt);
  int64_t R = p->rsz[nr - 1], rs = p->rst[nr - 1];
  int64_t idx[TPURT_MAX_DIMS];
  int64_t row = b / R, col = b % R, off = 0;
  for (int k = nr - 2; k >= 0; k--) {
    idx[k] = row % p->rsz[k];
    row /= p->rsz[k];
    off += idx[k] * p->rst[k];
  }
  _Alignas(32) double buf[CH];
  int64_t l = b;
  while (l < e) {
    int64_t cnt = R - col < e - l ? R - col : e - l;
    int64_t at = io + off + col * rs;
    for (int64_t o = 0; o < cnt; o += CH) {
      int64_t c = cnt - o < CH ? cnt - o : CH;
      const void *v = r->e ? pro_run(p, r, buf, at + o, c) /* rs == 1: k_reduce_fused */
                           : rk_load(p->cls, buf, in + (at + o * rs) * (int64_t)es, p->idt, rs, c);
      row_op(p, v, c, l + o, s);
    }
    l += cnt;
    col = 0;
    for (int k = nr - 2; k >= 0; k--) {
      idx[k]++;
      off += p->rst[k];
      if (idx[k] < p->rsz[k]) break;
      off -= idx[k] * p->rst[k];
      idx[k] = 0;
    }
  }
}

static void part_range(const rctx *x, int64_t part, int64_t *b, int64_t *e) {
  int64_t n = x->p->nred, P = x->P;
  *b = n / P * part + (part < n % P ? part : n % P);
  *e = *b + n / P + (part < n % P ? 1 : 0);
}

static void inner_chunk(void *c, int64_t ub, int64_t ue) {
  rctx *x = c;
  const rplan *p = x->p;
  size_t ies = tpurt_dtype_size(p->idt), oes = tpurt_dtype_size(p->odt), o2es = p->has2 ? tpurt_dtype_size(p->o2dt) : 0;
  rsrc r;
  if (!src_begin(x, &r)) return;
  int64_t R = p->rsz[p->nr - 1];
  if (r.e && x->P == 1 && p->nr == 1 && p->rst[0] == 1 && R <= CH / 2 && (p->no == 0 || (p->no == 1 && p->oist[0] == R))) {
    /* prologue over short rows that follow each other: the rows of several
     * outputs computed in one range, then each folded as from memory */
    rsrc mem = {NULL, NULL};
    int64_t k = CH / R;
    for (int64_t u = ub; u < ue; u += k) {
      int64_t kk = ue - u < k ? ue - u : k;
      tpurt__ew_into_range(r.e, r.tmp, u * R, (u + kk) * R);
      for (int64_t j = 0; j < kk; j++) {
        int64_t io, oo, oo2;
        out_offsets(p, p->no, u + j, &io, &oo, &oo2);
        rstate s;
        st_init(p, &s);
        inner_range(p, &mem, r.tmp + j * R * (int64_t)ies, 0, 0, R, &s);
        finalize(p, &s, x->out + oo * (int64_t)oes, x->out2 ? x->out2 + oo2 * (int64_t)o2es : NULL);
      }
    }
    src_end(x, &r);
    if (x->epi) tpurt__ew_epi_range(x->epi, ub, ue);
    return;
  }
  for (int64_t u = ub; u < ue; u++) {
    int64_t o = u / x->P, part = u % x->P, io, oo, oo2, b, e;
    out_offsets(p, p->no, o, &io, &oo, &oo2);
    part_range(x, part, &b, &e);
    rstate s;
    st_init(p, &s);
    inner_range(p, &r, x->in, io, b, e, &s);
    if (x->P > 1)
      x->partial[u] = s;
    else
      finalize(p, &s, x->out + oo * (int64_t)oes, x->out2 ? x->out2 + oo2 * (int64_t)o2es : NULL);
  }
  src_end(x, &r);
  if (x->epi) tpurt__ew_epi_range(x->epi, ub, ue); /* x->P == 1: outputs ub..ue, written */
}

/* the next reduced index of the walk (odometer over the reduced dims) and
 * its input offset */
static inline void walk_next(const rplan *p, int64_t *idx, int64_t *off) {
  for (int k = p->nr - 1; k >= 0; k--) {
    idx[k]++;
    *off += p->rst[k];
    if (idx[k] < p->rsz[k]) break;
    *off -= idx[k] * p->rst[k];
    idx[k] = 0;
  }
}

/* a[j] += rows[0][o + j], then rows[1][o + j], ... (k of them), widened */
#define SUM_ROWS 8
#define COL_SUM_K(K)                                                   \
  for (int64_t j = 0; j < n; j++) {                                    \
    double t = a[j];                                                   \
    for (int r = 0; r < (K); r++) t += (double)rows[r][o + j];         \
    a[j] = t;                                                          \
  }
static void col_sum_rows(double *restrict a, const float *const *rows, int k, int64_t o, int64_t n) {
  switch (k) {
    case 8: COL_SUM_K(8) break;
    case 4: COL_SUM_K(4) break;
    default:
      for (int r = 0; r < k; r++)
        for (int64_t j = 0; j < n; j++) a[j] += (double)rows[r][o + j];
      break;
  }
}
#undef COL_SUM_K

/* outer strategy: a work item is (output row, block of W columns, part of
 * the reduced range); rows of the block are read whole, in CB-column
 * pieces, so the input streams contiguously */
static void outer_chunk(void *c, int64_t ub, int64_t ue) {
  rctx *x = c;
  const rplan *p = x->p;
  int no = p->no, nr = p->nr;
  size_t ies = tpurt_dtype_size(p->idt), oes = tpurt_dtype_size(p->odt), o2es = p->has2 ? tpurt_dtype_size(p->o2dt) : 0;
  int64_t L = p->osz[no - 1], W = x->W;
  cols *cs = malloc(sizeof(cols) * (size_t)((W + CB - 1) / CB));
  rsrc r;
  if (!cs || !src_begin(x, &r)) {
    free(cs);
    x->failed = 1;
    return;
  }
  _Alignas(32) double buf[CB];
  for (int64_t u = ub; u < ue; u++) {
    int64_t part = u % x->P, item = u / x->P;
    int64_t blk = item % x->nblk, orow = item / x->nblk;
    int64_t io, oo, oo2, b, e;
    out_offsets(p, no - 1, orow, &io, &oo, &oo2);
    int64_t j0 = blk * W, n = L - j0 < W ? L - j0 : W, nb = (n + CB - 1) / CB;
    part_range(x, part, &b, &e);
    /* a float sum or mean whose states are not combined later needs only its
     * running sums, and its results are stored a row at a time (the general
     * path's per-column state and finalize dominated sums over few rows: the
     * gradients of broadcasts) */
    int sums = x->P == 1 && (p->op == TPURT_RED_SUM || p->op == TPURT_RED_MEAN) && p->cls != RK_I64;
    for (int64_t q = 0; q < nb; q++) {
      int64_t nq = n - q * CB < CB ? n - q * CB : CB;
      if (sums)
        memset(cs[q].ad, 0, sizeof(double) * (size_t)nq);
      else
        cols_init(p, &cs[q], nq);
    }
    /* walk reduced indices [b, e) */
    int64_t idx[TPURT_MAX_DIMS], rem = b, off = 0;
    for (int k = nr - 1; k >= 0; k--) {
      idx[k] = rem % p->rsz[k];
      rem /= p->rsz[k];
      off += idx[k] * p->rst[k];
    }
    /* with a prologue: the block's row into tmp, or whole rows that follow
     * each other several at a time */
    int64_t kb = r.e && nr == 1 && p->rst[0] == L && n == L && L <= CH / 2 ? CH / L : 1;
    /* f32 sums of rows read in place: up to SUM_ROWS rows a pass over the
     * block's sums, each sum kept in a register across them (the same
     * additions in the same order as a row at a time, whose loads and stores
     * of the sums bound the loop: a 1024 x 512 column sum ran at ~1 element a
     * cycle) */
    int rows_in_place = !r.e && p->cls == RK_F32 && p->idt == TPURT_F32 &&
                        (p->op == TPURT_RED_SUM || p->op == TPURT_RED_MEAN);
    for (int64_t l = b; l < e && rows_in_place;) {
      const float *rows[SUM_ROWS] = {0};
      int k = 0;
      for (; k < SUM_ROWS && l < e; k++, l++) {
        rows[k] = (const float *)(x->in + (io + j0 + off) * (int64_t)ies);
        walk_next(p, idx, &off);
      }
      for (int64_t q = 0; q < nb; q++) {
        int64_t nq = n - q * CB < CB ? n - q * CB : CB;
        col_sum_rows(cs[q].ad, rows, k, q * CB, nq);
      }
    }
    for (int64_t l = b; l < e && !rows_in_place; l++) {
      const char *row;
      if (!r.e) {
        row = x->in + (io + j0 + off) * (int64_t)ies;
      } else {
        int64_t j = (l - b) % kb;
        if (j == 0) {
          int64_t kk = e - l < kb ? e - l : kb;
          tpurt__ew_into_range(r.e, r.tmp, io + j0 + off, io + j0 + off + (kk - 1) * p->rst[0] + n);
        }
        row = r.tmp + j * L * (int64_t)ies;
      }
      for (int64_t q = 0; q < nb; q++) {
        int64_t nq = n - q * CB < CB ? n - q * CB : CB;
        const void *v = rk_load(p->cls, buf, row + q * CB * (int64_t)ies, p->idt, 1, nq);
        col_op(p, v, nq, l, l - b + 1, &cs[q]);
      }
      walk_next(p, idx, &off);
    }
    if (sums) {
      double nred = (double)p->nred;
      for (int64_t q = 0; q < nb; q++) {
        int64_t nq = n - q * CB < CB ? n - q * CB : CB;
        double *a = cs[q].ad;
        if (p->op == TPURT_RED_MEAN)
          for (int64_t j = 0; j < nq; j++) a[j] /= nred;
        rk_store_row_f64(x->out + (oo + (j0 + q * CB) * p->oost[no - 1]) * (int64_t)oes, p->odt, p->oost[no - 1], a,
                         nq);
      }
      continue;
    }
    for (int64_t j = 0; j < n; j++) {
      rstate s = cols_get(p, &cs[j / CB], j % CB);
      if (x->P > 1)
        x->partial[u * W + j] = s;
      else
        finalize(p, &s, x->out + (oo + (j0 + j) * p->oost[no - 1]) * (int64_t)oes,
                 x->out2 ? x->out2 + (oo2 + (j0 + j) * p->oo2st[no - 1]) * (int64_t)o2es : NULL);
    }
  }
  src_end(x, &r);
  free(cs);
}

/* How the walk splits: parts P of the reduced range, and for the outer
 * strategy W columns per block in nblk blocks per output row; returns the
 * work items before the split into parts (outputs, or output row blocks). */
static int64_t walk_geometry(const rplan *p, int nth, int64_t *P, int64_t *W, int64_t *nblk) {
  *P = 1;
  *W = CB;
  *nblk = 1;
  if (!p->outer) {
    if (p->nout < nth && p->nred >= 32768) {
      int64_t want = (nth + p->nout - 1) / p->nout * 2;
      *P = p->nred / 16384 < want ? p->nred / 16384 : want;
      if (*P < 1) *P = 1;
    }
    return p->nout;
  }
  int64_t L = p->osz[p->no - 1];
  *W = (L + CB - 1) / CB * CB;
  if (*W > 8 * CB) *W = 8 * CB;
  *nblk = (L + *W - 1) / *W;
  int64_t items = p->nout / L * *nblk;
  if (items < nth && p->nred >= 4096) {
    int64_t want = (nth + items - 1) / items * 2;
    *P = p->nred / 1024 < want ? p->nred / 1024 : want;
    if (*P < 1) *P = 1;
  }
  return items;
}

/* Work items per parallel chunk. */
static int64_t walk_grain(const rplan *p, int64_t P, int64_t W) {
  if (P > 1) return 1;
  if (!p->outer) return 16384 / (p->nred > 0 ? p->nred : 1) + 1;
  int64_t L = p->osz[p->no - 1], per = p->nred * (L < W ? L : W);
  return 65536 / (per > 0 ? per : 1) + 1;
}

static tpurt_status reduce_walk(rctx *x, char *err, size_t errlen);

/* The status of a walk whose chunks may have run out of host memory. */
static tpurt_status reduce_failed(const rctx *x, char *err, size_t errlen) {
  if (!x->failed) return TPURT_OK;
  snprintf(err, errlen, "out of host memory for reduction state");
  return TPURT_ERR_OUT_OF_MEMORY;
}

/* The reduction p of the input at host address in, or computed by the
 * prologue pro (in NULL); epi (or NULL) runs on the outputs each inner
 * chunk writes (epi_by_ranges). */
static tpurt_status reduce_run(const rplan *p, const char *in, tpurt__ew_epi *pro, tpurt__ew_epi *epi, char *err,
                               size_t errlen) {
  rctx x = {.p = p, .in = in, .out = rk_hv(p->out), .out2 = p->has2 ? rk_hv(p->out2) : NULL,
            .P = 1, .nblk = 1, .W = CB, .pro = pro, .epi = epi};
  tpurt_status st = reduce_walk(&x, err, errlen);
  if (!st && atomic_load(&x.pro_failed)) {
    snprintf(err, errlen, "%s", x.pro_err);
    st = x.pro_st;
  }
  return st;
}

static tpurt_status k_reduce(void *a, char *err, size_t errlen) {
  const rplan *p = a;
  return reduce_run(p, p->nred ? rk_hv(p->in) : NULL, NULL, NULL, err, errlen);
}

static tpurt_status reduce_walk(rctx *x, char *err, size_t errlen) {
  const rplan *p = x->p;
  int64_t items = walk_geometry(p, tpurt_num_threads(), &x->P, &x->W, &x->nblk);
  size_t oes = tpurt_dtype_size(p->odt), o2es = p->has2 ? tpurt_dtype_size(p->o2dt) : 0;
  if (!p->outer) {
    if (x->P > 1) {
      x->partial = malloc(sizeof(rstate) * (size_t)(p->nout * x->P));
      if (!x->partial) {
        snprintf(err, errlen, "out of host memory for reduction partials");
        return TPURT_ERR_OUT_OF_MEMORY;
      }
    }
    tpurt_parallel_for(p->nout * x->P, walk_grain(p, x->P, x->W), inner_chunk, x);
    if (x->P > 1) {
      for (int64_t o = 0; o < p->nout; o++) {
        int64_t io, oo, oo2;
        out_offsets(p, p->no, o, &io, &oo, &oo2);
        rstate s = x->partial[o * x->P];
        for (int64_t q = 1; q < x->P; q++) st_combine(p, &s, &x->partial[o * x->P + q]);
        finalize(p, &s, x->out + oo * (int64_t)oes, x->out2 ? x->out2 + oo2 * (int64_t)o2es : NULL);
      }
      free(x->partial);
    }
    return reduce_failed(x, err, errlen);
  }
  int64_t L = p->osz[p->no - 1];
  if (x->P > 1) {
    x->partial = malloc(sizeof(rstate) * (size_t)(items * x->P * x->W));
    if (!x->partial) {
      snprintf(err, errlen, "out of host memory for reduction partials");
      return TPURT_ERR_OUT_OF_MEMORY;
    }
  }
  tpurt_parallel_for(items * x->P, walk_grain(p, x->P, x->W), outer_chunk, x);
  if (x->P > 1) {
    int no = p->no;
    for (int64_t it = 0; it < items; it++) {
      int64_t blk = it % x->nblk, orow = it / x->nblk, io, oo, oo2;
      out_offsets(p, no - 1, orow, &io, &oo, &oo2);
      int64_t j0 = blk * x->W, n = L - j0 < x->W ? L - j0 : x->W;
      for (int64_t j = 0; j < n; j++) {
        rstate s = x->partial[(it * x->P) * x->W + j];
        for (int64_t q = 1; q < x->P; q++) st_combine(p, &s, &x->partial[(it * x->P + q) * x->W + j]);
        finalize(p, &s, x->out + (oo + (j0 + j) * p->oost[no - 1]) * (int64_t)oes,
                 x->out2 ? x->out2 + (oo2 + (j0 + j) * p->oo2st[no - 1]) * (int64_t)o2es : NULL);
      }
    }
  }
  free(x->partial);
  return reduce_failed(x, err, errlen);
}

/* -------------------------------------------------------------- launch */

static const char *red_name(int op) {
  static const char *n[] = {"sum", "prod", "mean", "max", "min", "argmax", "argmin", "var", "norm", "logsumexp",
                            "any", "all", "nansum"};
  return op >= 0 && op < TPURT_RED_NUM_OPS ? n[op] : "reduce";
}

static int64_t iabs64(int64_t v) { return v < 0 ? -v : v; }

static tpurt_status reduce_impl(tpurt_stream *s, tpurt_reduce_op op, const tpurt_view *out, const tpurt_view *out2,
                                const tpurt_view *in, double p0, int sqrt_out);

tpurt_status tpurt_reduce(tpurt_stream *s, tpurt_reduce_op op, const tpurt_view *out, const tpurt_view *out2,
                          const tpurt_view *in, double p0) {
  return reduce_impl(s, op, out, out2, in, p0, 0);
}

tpurt_status tpurt_reduce_std(tpurt_stream *s, const tpurt_view *out, const tpurt_view *mean_out, const tpurt_view *in,
                              double correction) {
  return reduce_impl(s, TPURT_RED_VAR, out, mean_out, in, correction, 1);
}

static tpurt_status reduce_impl(tpurt_stream *s, tpurt_reduce_op op, const tpurt_view *out, const tpurt_view *out2,
                                const tpurt_view *in, double p0, int sqrt_out) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((unsigned)op >= TPURT_RED_NUM_OPS) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "reduce: invalid op %d", (int)op);
  const char *nm = sqrt_out ? "std" : red_name(op);
  if ((st = rk_check_view(out, nm))) return st;
  tpurt__defer_note_reads(1); /* the input is only read */
  st = rk_check_view(in, nm);
  tpurt__defer_note_reads(0);
  if (st) return st;
  if (out2 && (st = rk_check_view(out2, nm))) return st;
  if (out->ndim != in->ndim)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output has %d dimensions, input %d", nm, out->ndim, in->ndim);
  if (out2 && !rk_same_shape(out, out2))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: the two outputs differ in shape", nm);
  if (out2 && !(op == TPURT_RED_MAX || op == TPURT_RED_MIN || op == TPURT_RED_VAR))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: a second output is only for max, min and var", nm);
  if (rk_is_complex(in->dtype) || rk_is_complex(out->dtype))
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: complex tensors are not supported", nm);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;

  rplan *p = calloc(1, sizeof *p);
  if (!p) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", nm);
  p->op = op;
  p->p0 = p0;
  p->sqrt_out = sqrt_out;
  p->arg = is_arg(op);
  p->idt = in->dtype;
  p->odt = out->dtype;
  p->has2 = out2 != NULL;
  p->o2dt = out2 ? out2->dtype : TPURT_I64;
  p->in = in->ptr;
  p->out = out->ptr;
  p->out2 = out2 ? out2->ptr : 0;
  /* compute class: value ops follow the output, comparisons the input */
  int by_in = op == TPURT_RED_MAX || op == TPURT_RED_MIN || is_arg(op) || op == TPURT_RED_ANY || op == TPURT_RED_ALL;
  p->cls = rk_class(by_in ? in->dtype : out->dtype);
  if (!by_in && rk_is_float(in->dtype) && p->cls == RK_I64 && op != TPURT_RED_SUM && op != TPURT_RED_PROD)
    p->cls = rk_class(in->dtype);
  p->nout = 1;
  p->nred = 1;
  int nred_dims = 0;
  /* classify */
  int oord[TPURT_MAX_DIMS], rord[TPURT_MAX_DIMS], no = 0, nr = 0;
  for (int k = 0; k < in->ndim; k++) {
    int64_t is = in->sizes[k], os = out->sizes[k];
    int reduced = (os == 1 && is != 1) || (out->strides[k] == 0 && is > 1 && os == is);
    if (reduced) {
      nred_dims++;
      p->nred *= is;
      rord[nr++] = k;
    } else if (os == is) {
      p->nout *= is;
      if (is != 1) oord[no++] = k;
    } else {
      free(p);
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                        "%s: output size %" PRId64 " does not match input size %" PRId64 " in dimension %d", nm, os, is,
                        k);
    }
  }
  if (out2 && op != TPURT_RED_VAR && nred_dims > 1) {
    free(p);
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: values and indices need a single reduced dimension", nm);
  }
  if (p->nout == 0) {
    free(p);
    return TPURT_OK;
  }
  if (p->nred == 0 && (op == TPURT_RED_MAX || op == TPURT_RED_MIN || is_arg(op))) {
    free(p);
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim "
                      "with the 'dim' argument.",
                      nm);
  }
  tpurt__defer_note_reads(1);
  st = rk_check_range(s->dev, in, nm);
  tpurt__defer_note_reads(0);
  if (st || (st = rk_check_range(s->dev, out, nm)) ||
      (out2 && (st = rk_check_range(s->dev, out2, nm)))) {
    free(p);
    return st;
  }
  /* order: reduced dims by decreasing |stride| (kept in order for arg ops),
   * output dims likewise; insertion sorts (stable) */
  if (!p->arg) {
    for (int i = 1; i < nr; i++)
      for (int j = i; j > 0 && iabs64(in->strides[rord[j - 1]]) < iabs64(in->strides[rord[j]]); j--) {
        int t = rord[j]; rord[j] = rord[j - 1]; rord[j - 1] = t;
      }
  }
  for (int i = 1; i < no; i++)
    for (int j = i; j > 0 && iabs64(in->strides[oord[j - 1]]) < iabs64(in->strides[oord[j]]); j--) {
      int t = oord[j]; oord[j] = oord[j - 1]; oord[j - 1] = t;
    }
  /* merge */
  for (int i = 0; i < nr; i++) {
    int k = rord[i];
    int64_t sz = in->sizes[k], str = in->strides[k];
    if (sz == 1) continue;
    if (p->nr > 0 && p->rst[p->nr - 1] == sz * str) {
      p->rsz[p->nr - 1] *= sz;
      p->rst[p->nr - 1] = str;
      continue;
    }
    p->rsz[p->nr] = sz;
    p->rst[p->nr] = str;
    p->nr++;
  }
  for (int i = 0; i < no; i++) {
    int k = oord[i];
    int64_t sz = in->sizes[k], a = in->strides[k], b = out->strides[k], c = out2 ? out2->strides[k] : 0;
    int m = p->no - 1;
    if (p->no > 0 && p->oist[m] == sz * a && p->oost[m] == sz * b && p->oo2st[m] == sz * c) {
      p->osz[m] *= sz;
      p->oist[m] = a;
      p->oost[m] = b;
      p->oo2st[m] = c;
      continue;
    }
    p->osz[p->no] = sz;
    p->oist[p->no] = a;
    p->oost[p->no] = b;
    p->oo2st[p->no] = c;
    p->no++;
  }
  int inner_contig = p->nr > 0 && p->rst[p->nr - 1] == 1;
  int outer_contig = p->no > 0 && p->oist[p->no - 1] == 1;
  if (p->nr == 0) {
    p->nr = 1;
    p->rsz[0] = p->nred; /* 1 (or 0 for an empty reduction) */
    p->rst[0] = 0;
  }
  p->outer = outer_contig && (!inner_contig || p->rsz[p->nr - 1] < 8) && p->nred > 0;
  st = tpurt_launch(s, nm, k_reduce, p, sizeof *p);
  free(p);
  return st;
}

/* ------------------------------------------- prologue (DeferAndFuse) */

tpurt_kernel_fn tpurt__reduce_fn(void) { return k_reduce; }

static int stride_cmp(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  return (x[1] > y[1]) - (x[1] < y[1]);
}

/* Do the dims (sizes, strides) a[0..na) and b[0..nb) address exactly
 * elements [0, n), each once (a dense layout in some order)? */
static int dense_dims(const int64_t *asz, const int64_t *ast, int na, const int64_t *bsz, const int64_t *bst, int nb,
                      int64_t n) {
  int64_t d[2 * TPURT_MAX_DIMS][2];
  int nd = 0;
  for (int k = 0; k < na; k++)
    if (asz[k] != 1) d[nd][0] = asz[k], d[nd++][1] = ast[k];
  for (int k = 0; k < nb; k++)
    if (bsz[k] != 1) d[nd][0] = bsz[k], d[nd++][1] = bst[k];
  qsort(d, (size_t)nd, sizeof d[0], stride_cmp);
  int64_t want = 1;
  for (int k = 0; k < nd; k++) {
    if (d[k][1] != want) return 0;
    want *= d[k][0];
  }
  return want == n;
}

int tpurt__reduce_pro_target(const void *args, tpurt_devptr *in, int64_t *numel, tpurt_dtype *dt) {
  const rplan *p = args;
  if (p->nout <= 0 || p->nred <= 0) return 0;
  /* the walk reads contiguous runs: rows of the innermost reduced dim, or
   * of output columns */
  if (!p->outer && !(p->rsz[p->nr - 1] == 1 || p->rst[p->nr - 1] == 1)) return 0;
  /* the input's elements are exactly [0, n), each once */
  int64_t want = p->nout * p->nred;
  if (!dense_dims(p->osz, p->oist, p->no, p->rsz, p->rst, p->nr, want)) return 0;
  /* as many parallel chunks as threads: a prologue that a single chunk
   * computes would lose the threads its own launch uses */
  int nth = tpurt_num_threads();
  int64_t P, W, nblk, items = walk_geometry(p, nth, &P, &W, &nblk), g = walk_grain(p, P, W);
  if ((items * P + g - 1) / g < nth) return 0;
  *in = p->in;
  *numel = want;
  *dt = p->idt;
  return 1;
}

/* Can an epilogue run by ranges of outputs inside the walk? Inner
 * strategy unsplit, output o at element o of the output (one output dim,
 * dense, or a single output): each inner chunk then runs it over the
 * outputs it has written. Otherwise it runs whole after the walk. */
static int epi_by_ranges(const rplan *p) {
  int64_t P, W, nblk;
  walk_geometry(p, tpurt_num_threads(), &P, &W, &nblk);
  return !p->outer && P == 1 && (p->no == 0 || (p->no == 1 && p->oost[0] == 1));
}

int tpurt__reduce_epi_target(const void *args, tpurt_devptr *out, int64_t *numel, tpurt_dtype *dt) {
  const rplan *p = args;
  if (p->has2 || p->nout <= 0) return 0;
  /* the outputs are exactly elements [0, nout) of out, each once */
  int64_t want = p->nout;
  if (!dense_dims(p->osz, p->oost, p->no, NULL, NULL, 0, want)) return 0;
  *out = p->out;
  *numel = want;
  *dt = p->odt;
  return 1;
}

/* A reduction with the elementwise launch computing its input (prologue)
 * and / or the one reading its outputs (epilogue), as one kernel:
 * arguments rplan, this header, the prologue's launch (tpurt__ew_args) at
 * a 16-byte multiple, then the epilogue's. */
typedef struct {
  int32_t pro_out; /* the prologue's output that is the input; -1: no prologue */
  int32_t pad;
  uint64_t pro_size, epi_size;
} rfuse_hdr;

#define RF_ALIGN(n) (((n) + 15) & ~(size_t)15)

static tpurt_status k_reduce_fused(void *a, char *err, size_t errlen) {
  const rplan *p = a;
  const rfuse_hdr *h = (const rfuse_hdr *)((const char *)a + sizeof(rplan));
  const char *pro_args = (const char *)h + sizeof *h;
  void *epi_args = h->epi_size ? (char *)pro_args + RF_ALIGN(h->pro_size) : NULL;
  tpurt__ew_epi *epi = epi_args && epi_by_ranges(p) ? tpurt__ew_epi_begin(epi_args) : NULL;
  tpurt_status st = TPURT_OK;
  if (h->pro_out < 0) {
    st = reduce_run(p, p->nred ? rk_hv(p->in) : NULL, NULL, epi, err, errlen);
  } else if (!tpurt__ew_out_dense(pro_args, h->pro_out)) {
    snprintf(err, errlen, "%s: its fused input is not dense", red_name(p->op));
    st = TPURT_ERR_INTERNAL;
  } else {
    tpurt__ew_epi *e = tpurt__ew_into_begin(pro_args, h->pro_out);
    if (!e) {
      snprintf(err, errlen, "%s: out of host memory", red_name(p->op));
      st = TPURT_ERR_OUT_OF_MEMORY;
    } else if (tpurt__ew_into_ranges(e)) {
      st = reduce_run(p, NULL, e, epi, err, errlen);
      tpurt__ew_epi_end(e, NULL, 0);
    } else { /* the launch over short rows runs whole, into host memory of its own */
      char *tmp = malloc((size_t)(p->nout * p->nred) * tpurt_dtype_size(p->idt));
      if (tmp) {
        tpurt__ew_into_whole(e, tmp);
        st = tpurt__ew_epi_end(e, err, errlen);
        if (!st) st = reduce_run(p, tmp, NULL, epi, err, errlen);
        free(tmp);
      } else {
        tpurt__ew_epi_end(e, NULL, 0);
        snprintf(err, errlen, "%s: out of host memory", red_name(p->op));
        st = TPURT_ERR_OUT_OF_MEMORY;
      }
    }
  }
  if (epi) { /* ran by ranges: its own error, if any */
    char e2[256];
    tpurt_status es = tpurt__ew_epi_end(epi, e2, sizeof e2);
    if (!st && es) {
      snprintf(err, errlen, "%s", e2);
      st = es;
    }
  } else if (epi_args && !st) {
    st = tpurt__ew_kernel(epi_args, err, errlen);
  }
  return st;
}

tpurt_status tpurt__reduce_fused_enqueue(tpurt_stream *s, const char *name, const void *args, size_t size,
                                         const void *pro_args, size_t pro_size, int pro_out, const void *epi_args,
                                         size_t epi_size) {
  if (size != sizeof(rplan)) return tpurt__err(TPURT_ERR_INTERNAL, "%s: not the arguments of a reduction", name);
  _Alignas(16) unsigned char stackbuf[8192];
  size_t n = sizeof(rplan) + sizeof(rfuse_hdr) + RF_ALIGN(pro_size) + epi_size;
  unsigned char *buf = n <= sizeof stackbuf ? stackbuf : malloc(n);
  if (!buf) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
  rfuse_hdr h = {pro_args ? pro_out : -1, 0, pro_args ? pro_size : 0, epi_args ? epi_size : 0};
  unsigned char *q = buf;
  memcpy(q, args, sizeof(rplan));
  q += sizeof(rplan);
  memcpy(q, &h, sizeof h);
  q += sizeof h;
  if (pro_args) memcpy(q, pro_args, pro_size);
  q += RF_ALIGN(h.pro_size);
  if (epi_args) memcpy(q, epi_args, epi_size);
  tpurt_status st = tpurt__enqueue(s, name, k_reduce_fused, buf, n, NULL);
  if (buf != stackbuf) free(buf);
  return st;
}
