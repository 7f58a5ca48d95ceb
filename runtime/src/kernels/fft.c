/*
 * fft.c — discrete Fourier transforms over any set of dims of a strided
 * view: complex-to-complex (forward / inverse), real-to-complex (one- or
 * two-sided) and complex-to-real (Hermitian input), in f32 (c64) and f64
 * (c128), any length.
 *
 * Algorithms (written from the textbook descriptions):
 *   - lengths whose prime factors are all <= FFT_MAX_RADIX: mixed-radix
 *     Stockham autosort stages with radix 4, 2, 3, 5 butterflies and a
 *     direct DFT for other small primes (fft_tmpl.h);
 *   - other lengths: Bluestein's chirp-z algorithm, a circular convolution
 *     of power-of-two length M >= 2n - 1;
 *   - real transforms of even length n: one complex transform of length
 *     n / 2 over the interleaved samples plus a split step; odd lengths use
 *     a complex transform of length n.
 * Plans (factorization, twiddles computed in double, Bluestein chirp and
 * its transform) are built once per (n, precision, direction, real) and
 * cached process-wide behind a mutex; plans are immutable once published.
 *
 * A multi-dim transform is a sequence of 1-d passes: each pass walks the
 * lines along one dim (the other dims enumerate them), loads a line into a
 * split complex buffer, transforms it and stores it; lines are split over
 * the thread pool. The first pass reads the input, later passes work in
 * place on the output (c2r: on the work buffer, the last pass writes the
 * output). The normalization factor is applied by the last pass.
 */
#include <math.h>

#include "rk_common.h"

#define FFT_MAX_RADIX 61 /* larger prime factors go through Bluestein */
#define FFT_MAX_STAGES 64
#define FFT_PAR_MIN (1 << 15) /* lines this long split their stages over the pool */

typedef struct fft_stage_t {
  int r;
  int64_t m, s;
  void *twr, *twi; /* (r - 1) m twiddles w_L^(p u), index (u - 1) m + p */
  void *gr, *gi;   /* generic radix: w_r^k, k < r */
} fft_stage_t;

typedef struct fft_plan {
  int64_t n;
  int dbl, sign, real;
  struct fft_plan *next; /* cache list */
  /* complex, mixed radix */
  int nst;
  fft_stage_t st[FFT_MAX_STAGES];
  /* complex, Bluestein */
  int blue;
  int64_t bm;
  struct fft_plan *sub; /* forward complex plan of bm */
  void *cr, *ci;        /* chirp c_j = exp(sign i pi j^2 / n), j < n */
  void *br, *bi;        /* FFT(conj c extended circularly) / bm */
  /* real */
  struct fft_plan *half; /* even n: complex plan of n / 2 */
  void *rr, *ri;         /* even n: w_n^k = exp(sign 2 pi i k / n), k <= n / 2 */
  struct fft_plan *full; /* odd n: complex plan of n */
  int64_t scratch;       /* scalar elements of scratch an exec needs */
} fft_plan;

enum { FFT_PASS_C2C = 0, FFT_PASS_R2C = 1, FFT_PASS_C2R = 2 };

typedef struct fft_pass {
  int kind;
  const fft_plan *plan;
  int64_t n, nsrc, ndst; /* transform length, line lengths of src and dst */
  void *src, *dst;       /* host views */
  rk_lines L;            /* 0: src, 1: dst (element strides of their dtype) */
  double scale;
  _Atomic int oom;
} fft_pass;

/* ----------------------------------------------------------- plans */

static void *fft_talloc(int64_t count, int dbl) {
  size_t bytes = (size_t)(count > 0 ? count : 1) * (dbl ? 8 : 4);
  return aligned_alloc(64, (bytes + 63) / 64 * 64);
}
static inline void fft_tset(void *a, int dbl, int64_t i, double v) {
  if (dbl)
    ((double *)a)[i] = v;
  else
    ((float *)a)[i] = (float)v;
}
static inline double fft_tget(const void *a, int dbl, int64_t i) {
  return dbl ? ((const double *)a)[i] : (double)((const float *)a)[i];
}
/* exp(sign 2 pi i k / n), computed in double from the angle reduced to
 * the first octant (quadrant and complement symmetries) for accuracy. */
static void fft_root(int64_t k, int64_t n, int sign, double *re, double *im) {
  k %= n;
  if (k < 0) k += n;
  __int128 k4 = (__int128)4 * k;
  int q = (int)(k4 / n);
  int64_t r = (int64_t)(k4 - (__int128)q * n); /* angle = pi/2 (q + r / n) */
  int swap = 0;
  if (2 * r > n) {
    r = n - r;
    swap = 1;
  }
  double b = 1.57079632679489661923 * (double)r / (double)n;
  double c = cos(b), s = sin(b);
  if (swap) {
    double t = c;
    c = s;
    s = t;
  }
  switch (q) {
    case 0: *re = c; *im = s; break;
    case 1: *re = -s; *im = c; break;
    case 2: *re = -c; *im = -s; break;
    default: *re = s; *im = -c; break;
  }
  *im *= sign;
}

static void fft_plan_free(fft_plan *p) {
  if (!p) return;
  for (int k = 0; k < p->nst; k++) {
    free(p->st[k].twr);
    free(p->st[k].twi);
    free(p->st[k].gr);
    free(p->st[k].gi);
  }
  free(p->cr);
  free(p->ci);
  free(p->br);
  free(p->bi);
  free(p->rr);
  free(p->ri);
  free(p); /* sub-plans belong to the cache */
}

static pthread_mutex_t fft_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static fft_plan *fft_cache;
static int fft_cache_count;

static fft_plan *fft_get_plan(int64_t n, int dbl, int sign, int real);

static void fft_exec_c2c_d(const fft_plan *p, double *xr, double *xi, double *w);

/* Builds a plan (NULL on allocation failure). */
static fft_plan *fft_build(int64_t n, int dbl, int sign, int real) {
  fft_plan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n;
  p->dbl = dbl;
  p->sign = sign;
  p->real = real;
  if (real) {
    if (n % 2 == 0) {
      int64_t h = n / 2;
      p->half = fft_get_plan(h, dbl, sign, 0);
      p->rr = fft_talloc(h + 1, dbl);
      p->ri = fft_talloc(h + 1, dbl);
      if (!p->half || !p->rr || !p->ri) goto fail;
      for (int64_t k = 0; k <= h; k++) {
        double c, s;
        fft_root(k, n, sign, &c, &s);
        fft_tset(p->rr, dbl, k, c);
        fft_tset(p->ri, dbl, k, s);
      }
      p->scratch = 2 * h + p->half->scratch;
    } else {
      p->full = fft_get_plan(n, dbl, sign, 0);
      if (!p->full) goto fail;
      p->scratch = 2 * n + p->full->scratch;
    }
    return p;
  }
  /* factorize: 4s, then 2, 3, 5, then other primes */
  int radix[FFT_MAX_STAGES], nr = 0, big = 0;
  int64_t rem = n;
  while (rem % 4 == 0) radix[nr++] = 4, rem /= 4;
  while (rem % 2 == 0) radix[nr++] = 2, rem /= 2;
  for (int64_t f = 3; rem > 1; f += 2) {
    if (f * f > rem) f = rem; /* what is left is prime */
    while (rem % f == 0) {
      if (f > FFT_MAX_RADIX) {
        big = 1;
        break;
      }
      radix[nr++] = (int)f;
      rem /= f;
    }
    if (big) break;
  }
  if (big) {
    int64_t M = 1;
    while (M < 2 * n - 1) M *= 2;
    p->blue = 1;
    p->bm = M;
    p->sub = fft_get_plan(M, dbl, -1, 0);
    p->cr = fft_talloc(n, dbl);
    p->ci = fft_talloc(n, dbl);
    p->br = fft_talloc(M, dbl);
    p->bi = fft_talloc(M, dbl);
    fft_plan *subd = dbl ? p->sub : fft_get_plan(M, 1, -1, 0);
    if (!p->sub || !subd || !p->cr || !p->ci || !p->br || !p->bi) goto fail;
    double *tr = malloc((size_t)M * sizeof(double)), *ti = malloc((size_t)M * sizeof(double));
    double *tw = malloc((size_t)subd->scratch * sizeof(double) + 8);
    if (!tr || !ti || !tw) {
      free(tr);
      free(ti);
      free(tw);
      goto fail;
    }
    for (int64_t j = 0; j < M; j++) tr[j] = ti[j] = 0;
    for (int64_t j = 0; j < n; j++) {
      /* j^2 mod 2n keeps the angle exact */
      uint64_t j2 = (uint64_t)((__int128)j * j % (2 * n));
      double c, s;
      fft_root((int64_t)j2, 2 * n, sign, &c, &s);
      fft_tset(p->cr, dbl, j, c);
      fft_tset(p->ci, dbl, j, s);
      tr[j] = c;
      ti[j] = -s;
      if (j) {
        tr[M - j] = c;
        ti[M - j] = -s;
      }
    }
    fft_exec_c2c_d(subd, tr, ti, tw);
    for (int64_t j = 0; j < M; j++) {
      fft_tset(p->br, dbl, j, tr[j] / (double)M);
      fft_tset(p->bi, dbl, j, ti[j] / (double)M);
    }
    free(tr);
    free(ti);
    free(tw);
    p->scratch = 2 * M + p->sub->scratch;
    return p;
  }
  /* Stockham stages */
  int64_t L = n, s = 1;
  for (int k = 0; k < nr; k++) {
    fft_stage_t *S = &p->st[k];
    int r = radix[k];
    S->r = r;
    S->m = L / r;
    S->s = s;
    S->twr = fft_talloc((r - 1) * S->m, dbl);
    S->twi = fft_talloc((r - 1) * S->m, dbl);
    if (!S->twr || !S->twi) goto fail;
    p->nst = k + 1;
    for (int u = 1; u < r; u++)
      for (int64_t q = 0; q < S->m; q++) {
        double c, sn;
        fft_root(q * u, L, sign, &c, &sn);
        fft_tset(S->twr, dbl, (u - 1) * S->m + q, c);
        fft_tset(S->twi, dbl, (u - 1) * S->m + q, sn);
      }
    if (r > 5) {
      S->gr = fft_talloc(r, dbl);
      S->gi = fft_talloc(r, dbl);
      if (!S->gr || !S->gi) goto fail;
      for (int t = 0; t < r; t++) {
        double c, sn;
        fft_root(t, r, sign, &c, &sn);
        fft_tset(S->gr, dbl, t, c);
        fft_tset(S->gi, dbl, t, sn);
      }
    }
    L /= r;
    s *= r;
  }
  p->scratch = 2 * n;
  return p;
fail:
  fft_plan_free(p);
  return NULL;
}

/* The cached plan of (n, precision, direction, real); NULL if out of memory. */
static fft_plan *fft_get_plan(int64_t n, int dbl, int sign, int real) {
  pthread_mutex_lock(&fft_cache_mu);
  for (fft_plan *p = fft_cache; p; p = p->next)
    if (p->n == n && p->dbl == dbl && p->sign == sign && p->real == real) {
      pthread_mutex_unlock(&fft_cache_mu);
      return p;
    }
  pthread_mutex_unlock(&fft_cache_mu);
  /* built outside the lock (sub-plans take it themselves) */
  fft_plan *np = fft_build(n, dbl, sign, real);
  if (!np) return NULL;
  pthread_mutex_lock(&fft_cache_mu);
  for (fft_plan *p = fft_cache; p; p = p->next)
    if (p->n == n && p->dbl == dbl && p->sign == sign && p->real == real) { /* lost a race */
      pthread_mutex_unlock(&fft_cache_mu);
      fft_plan_free(np);
      return p;
    }
  np->next = fft_cache;
  fft_cache = np;
  fft_cache_count++;
  pthread_mutex_unlock(&fft_cache_mu);
  return np;
}

/* ------------------------------------------------ both precisions */

/* float32 data is transformed in double (PyTorch's CPU results come from a
 * library whose float32 error is below what a float32 Stockham reaches on
 * multi-dim, odd-length transforms; computing in double keeps the results
 * within about one float32 rounding of the exact transform). */
#define ST float
#define FT double
#define FN(x) x##_f
#include "fft_tmpl.h"
#undef ST
#undef FT
#undef FN
#define ST double
#define FT double
#define FN(x) x##_d
#include "fft_tmpl.h"
#undef ST
#undef FT
#undef FN

static void fft_exec_c2c_d(const fft_plan *p, double *xr, double *xi, double *w) { fft_c2c_d(p, xr, xi, w); }

/* -------------------------------------------------------- the kernel */

typedef struct fft_args {
  int kind; /* tpurt_fft_kind */
  int dbl;
  int ndims;
  int dims[TPURT_MAX_DIMS]; /* pass order: dims[0] first */
  const fft_plan *plans[TPURT_MAX_DIMS];
  int64_t n[TPURT_MAX_DIMS];
  double scale;
  int has_work;
  tpurt_view in, out, work;
} fft_args;

static tpurt_status k_fft(void *a, char *err, size_t errlen) {
  const fft_args *A = a;
  void *in = rk_hv(A->in.ptr), *out = rk_hv(A->out.ptr), *work = A->has_work ? rk_hv(A->work.ptr) : NULL;
  for (int i = 0; i < A->ndims; i++) {
    fft_pass P;
    memset(&P, 0, sizeof P);
    int d = A->dims[i], last = i == A->ndims - 1;
    const tpurt_view *sv, *dv;
    if (A->kind == TPURT_FFT_C2R) {
      /* c2c passes over the other dims first (input -> work), c2r last */
      const tpurt_view *cur = i == 0 ? &A->in : &A->work;
      sv = cur;
      dv = last ? &A->out : &A->work;
      P.kind = last ? FFT_PASS_C2R : FFT_PASS_C2C;
      P.src = i == 0 ? in : work;
      P.dst = last ? out : work;
    } else {
      sv = i == 0 ? &A->in : &A->out;
      dv = &A->out;
      P.kind = i == 0 && A->kind == TPURT_FFT_R2C ? FFT_PASS_R2C : FFT_PASS_C2C;
      P.src = i == 0 ? in : out;
      P.dst = out;
    }
    P.plan = A->plans[i];
    P.n = A->n[i];
    P.nsrc = sv->sizes[d];
    P.ndst = dv->sizes[d];
    P.scale = last ? A->scale : 1.0;
    const tpurt_view *vv[2] = {sv, dv};
    rk_lines_plan(&P.L, dv, d, vv, 2);
    int64_t grain = 32768 / (P.n + P.nsrc + 1) + 1;
    tpurt_parallel_for(P.L.nlines, grain, A->dbl ? fft_pass_lines_d : fft_pass_lines_f, &P);
    if (atomic_load(&P.oom)) {
      snprintf(err, errlen, "fft: out of host memory for the line buffers (length %" PRId64 ")", P.n);
      return TPURT_ERR_OUT_OF_MEMORY;
    }
  }
  return TPURT_OK;
}

static int fft_view_overlap(const tpurt_view *a, const tpurt_view *b) {
  if (rk_numel(a) == 0 || rk_numel(b) == 0) return 0;
  int64_t alo, ahi, blo, bhi;
  tpurt__view_extent(a, &alo, &ahi);
  tpurt__view_extent(b, &blo, &bhi);
  int64_t a0 = (int64_t)a->ptr + alo, a1 = (int64_t)a->ptr + ahi;
  int64_t b0 = (int64_t)b->ptr + blo, b1 = (int64_t)b->ptr + bhi;
  return a0 < b1 && b0 < a1;
}

tpurt_status tpurt_fft(tpurt_stream *s, tpurt_fft_kind kind, const tpurt_view *out, const tpurt_view *in,
                       const tpurt_view *work, int ndims, const int *dims, int forward, double scale) {
  TPURT__INIT_OR_RETURN();
  static const char *names[] = {"fft_c2c", "fft_r2c", "fft_c2r"};
  if ((unsigned)kind > TPURT_FFT_C2R) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "fft: invalid kind %d", (int)kind);
  const char *nm = names[kind];
  tpurt_status st;
  if ((st = rk_check_view(out, nm)) || (st = rk_check_view(in, nm))) return st;
  if (work && (st = rk_check_view(work, nm))) return st;
  tpurt_dtype idt = in->dtype, odt = out->dtype;
  int dbl;
  switch (kind) {
    case TPURT_FFT_C2C:
      if (!rk_is_complex(idt) || idt != odt)
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected complex input and output of one dtype, got %s and %s",
                          nm, tpurt_dtype_name(idt), tpurt_dtype_name(odt));
      dbl = idt == TPURT_C128;
      break;
    case TPURT_FFT_R2C:
      if (!((idt == TPURT_F32 && odt == TPURT_C64) || (idt == TPURT_F64 && odt == TPURT_C128)))
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected float32 -> complex64 or float64 -> complex128, got %s -> %s",
                          nm, tpurt_dtype_name(idt), tpurt_dtype_name(odt));
      dbl = idt == TPURT_F64;
      break;
    default:
      if (!((idt == TPURT_C64 && odt == TPURT_F32) || (idt == TPURT_C128 && odt == TPURT_F64)))
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected complex64 -> float32 or complex128 -> float64, got %s -> %s",
                          nm, tpurt_dtype_name(idt), tpurt_dtype_name(odt));
      dbl = idt == TPURT_C128;
  }
  int nd = in->ndim;
  if (out->ndim != nd) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: input has %d dims, output %d", nm, nd, out->ndim);
  if (ndims < 1 || ndims > nd)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected 1 to %d transform dims, got %d", nm, nd, ndims);
  int seen[TPURT_MAX_DIMS] = {0};
  for (int i = 0; i < ndims; i++) {
    if (dims[i] < 0 || dims[i] >= nd)
      return tpurt__err(TPURT_ERR_INDEX, "%s: dim %d out of range for a %d-d tensor", nm, dims[i], nd);
    if (seen[dims[i]]++) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: dim %d repeated", nm, dims[i]);
  }
  int lastd = dims[ndims - 1];
  for (int k = 0; k < nd; k++) {
    if (k == lastd && kind != TPURT_FFT_C2C) continue;
    if (in->sizes[k] != out->sizes[k])
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: input and output sizes differ in dim %d (%" PRId64 " vs %" PRId64 ")",
                        nm, k, in->sizes[k], out->sizes[k]);
  }
  int64_t nlast = kind == TPURT_FFT_C2R ? out->sizes[lastd] : in->sizes[lastd];
  if (kind == TPURT_FFT_R2C && out->sizes[lastd] != nlast / 2 + 1 && out->sizes[lastd] != nlast)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output size %" PRId64 " along dim %d must be %" PRId64 " or %" PRId64,
                      nm, out->sizes[lastd], lastd, nlast / 2 + 1, nlast);
  int need_work = kind == TPURT_FFT_C2R && ndims > 1;
  if (need_work) {
    if (!work || work->dtype != idt || !rk_same_shape(work, in))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: a multi-dim c2r needs a work view of the input's shape and dtype", nm);
  }
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(out->ptr)))) return st;
  if (rk_numel(out) == 0) return TPURT_OK;
  for (int i = 0; i < ndims; i++)
    if (in->sizes[dims[i]] == 0 && !(kind == TPURT_FFT_C2R && dims[i] == lastd))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: invalid number of data points (0) along dim %d", nm, dims[i]);
  if ((st = rk_check_range(s->dev, in, nm)) || (st = rk_check_range(s->dev, out, nm)) ||
      (need_work && (st = rk_check_range(s->dev, work, nm))))
    return st;
  if (fft_view_overlap(in, out) || (need_work && (fft_view_overlap(work, out) || fft_view_overlap(work, in))))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: output, input and work must not overlap", nm);
  fft_args *A = calloc(1, sizeof *A);
  if (!A) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", nm);
  A->kind = kind;
  A->dbl = dbl;
  A->ndims = ndims;
  A->scale = scale;
  A->in = *in;
  A->out = *out;
  A->has_work = need_work;
  if (need_work) A->work = *work;
  /* pass order: r2c / c2c start with the last listed dim (the one r2c halves),
   * c2r ends with it */
  for (int i = 0; i < ndims; i++) {
    int d;
    if (kind == TPURT_FFT_C2R)
      d = dims[i];
    else
      d = dims[ndims - 1 - i];
    A->dims[i] = d;
    int is_real_pass = (kind == TPURT_FFT_R2C && i == 0) || (kind == TPURT_FFT_C2R && i == ndims - 1);
    int64_t n = kind == TPURT_FFT_C2R ? out->sizes[d] : in->sizes[d];
    int sign = kind == TPURT_FFT_R2C ? -1 : kind == TPURT_FFT_C2R ? 1 : forward ? -1 : 1;
    A->n[i] = n;
    A->plans[i] = fft_get_plan(n, 1, sign, is_real_pass); /* computed in double (see above) */
    if (!A->plans[i]) {
      free(A);
      return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory building the plan of length %" PRId64, nm, n);
    }
  }
  st = tpurt_launch(s, nm, k_fft, A, sizeof *A);
  free(A);
  return st;
}

int tpurt_fft_plan_cache_size(void) {
  pthread_mutex_lock(&fft_cache_mu);
  int n = fft_cache_count;
  pthread_mutex_unlock(&fft_cache_mu);
  return n;
}
