/*
 * linalg.c — dense linear algebra on LAPACK (the LAPACKE and CBLAS entry
 * points of the OpenBLAS library that gemm.c uses).
 *
 * One launch handles a whole batch: every view has the same `nb` leading
 * batch dims (inputs may broadcast with stride 0), followed by the op's
 * matrix / vector dims. On the worker each matrix is copied into a
 * column-major per-thread scratch buffer, LAPACK works there and results
 * are copied to their strided destinations. Workspace sizes are queried
 * once per launch (every matrix of a batch has the same shape), so the
 * batch loop allocates nothing once the scratch buffers are warm.
 *
 * Factorizations report failures as LAPACK does, in int32 `info` outputs
 * (the _ex operators); routines without an info output fail the op with
 * PyTorch's message instead.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>
#include <lapacke.h>

#include "gemm_internal.h"
#include "kcommon.h"

#define LA_MAXV 5

typedef struct {
  tpurt_linalg_op op;
  tpurt_dtype dt;
  int nb, nin, nout;
  int64_t nbatch;
  int64_t bsz[TPURT_MAX_DIMS];
  tpurt_view in[LA_MAXV], out[LA_MAXV];
  int64_t f[4];
  double rcond;
} la_args;

static inline int la_present(const tpurt_view *v) { return v->ndim >= 0 && v->ptr != 0; }

/* Host address of batch entry b of v. */
static char *la_ptr(const tpurt_view *v, const la_args *g, int64_t b) {
  int64_t off = 0;
  for (int d = g->nb - 1; d >= 0; d--) {
    int64_t i = b % g->bsz[d];
    b /= g->bsz[d];
    off += i * v->strides[d];
  }
  return (char *)tpurt__host_view(v->ptr) + off * (int64_t)tpurt_dtype_size(v->dtype);
}

static void la_store_piv(const tpurt_view *v, const la_args *g, int64_t b, const lapack_int *ip, int64_t k) {
  if (!la_present(v) || k == 0) return;
  char *d = la_ptr(v, g, b);
  size_t es = tpurt_dtype_size(v->dtype);
  for (int64_t i = 0; i < k; i++) kc_sti(v->dtype, d + (ptrdiff_t)(i * v->strides[g->nb]) * (ptrdiff_t)es, ip[i]);
}
static void la_load_piv(lapack_int *ip, const tpurt_view *v, const la_args *g, int64_t b, int64_t k) {
  if (k == 0) return;
  const char *s = la_ptr(v, g, b);
  size_t es = tpurt_dtype_size(v->dtype);
  for (int64_t i = 0; i < k; i++)
    ip[i] = (lapack_int)kc_ldi(v->dtype, s + (ptrdiff_t)(i * v->strides[g->nb]) * (ptrdiff_t)es);
}
static void la_store_info(const tpurt_view *v, const la_args *g, int64_t b, lapack_int info) {
  if (!la_present(v)) return;
  kc_sti(v->dtype, la_ptr(v, g, b), info);
}

#define T float
#define F(x) x##_f32
#define LA(x) scipy_LAPACKE_s##x##_work
#define CB(x) scipy_cblas_s##x
#include "linalg_tmpl.h"
#undef T
#undef F
#undef LA
#undef CB
#define T double
#define F(x) x##_f64
#define LA(x) scipy_LAPACKE_d##x##_work
#define CB(x) scipy_cblas_d##x
#include "linalg_tmpl.h"
#undef T
#undef F
#undef LA
#undef CB

/* cross product along the last dim (size 3) of out, a, b; any real dtype. */
static tpurt_status la_cross(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *O = &g->out[0], *A = &g->in[0], *B = &g->in[1];
  tpurt_dtype dt = O->dtype;
  size_t es = tpurt_dtype_size(dt);
  int64_t so = O->strides[g->nb] * (int64_t)es, sa = A->strides[g->nb] * (int64_t)es,
          sb = B->strides[g->nb] * (int64_t)es;
  int isf = kc_is_float(dt);
  for (int64_t b = 0; b < g->nbatch; b++) {
    char *o = la_ptr(O, g, b);
    const char *a = la_ptr(A, g, b), *c = la_ptr(B, g, b);
    if (dt == TPURT_F32) {
      float x[3], y[3];
      for (int i = 0; i < 3; i++) memcpy(&x[i], a + i * sa, 4), memcpy(&y[i], c + i * sb, 4);
      float r[3] = {x[1] * y[2] - x[2] * y[1], x[2] * y[0] - x[0] * y[2], x[0] * y[1] - x[1] * y[0]};
      for (int i = 0; i < 3; i++) memcpy(o + i * so, &r[i], 4);
    } else if (isf) {
      double x[3], y[3];
      for (int i = 0; i < 3; i++) x[i] = kc_ld(dt, a + i * sa), y[i] = kc_ld(dt, c + i * sb);
      double r[3] = {x[1] * y[2] - x[2] * y[1], x[2] * y[0] - x[0] * y[2], x[0] * y[1] - x[1] * y[0]};
      for (int i = 0; i < 3; i++) kc_st(dt, o + i * so, r[i]);
    } else {
      uint64_t x[3], y[3]; /* wraps like the narrow type */
      for (int i = 0; i < 3; i++) x[i] = (uint64_t)kc_ldi(dt, a + i * sa), y[i] = (uint64_t)kc_ldi(dt, c + i * sb);
      uint64_t r[3] = {x[1] * y[2] - x[2] * y[1], x[2] * y[0] - x[0] * y[2], x[0] * y[1] - x[1] * y[0]};
      for (int i = 0; i < 3; i++) kc_sti(dt, o + i * so, (int64_t)r[i]);
    }
  }
  return TPURT_OK;
}

typedef tpurt_status (*la_fn)(la_args *, char *, size_t);
#define PAIR(x) {x##_f32, x##_f64}
static const la_fn g_table[TPURT_LA_NUM_OPS][2] = {
    [TPURT_LA_SVD] = PAIR(svd),
    [TPURT_LA_TRSM] = PAIR(trsm),
    [TPURT_LA_LU] = PAIR(lu),
    [TPURT_LA_LU_SOLVE] = PAIR(lu_solve),
    [TPURT_LA_LU_UNPACK] = PAIR(lu_unpack),
    [TPURT_LA_SOLVE] = PAIR(solve),
    [TPURT_LA_INV] = PAIR(inv),
    [TPURT_LA_DET] = PAIR(det),
    [TPURT_LA_EIGH] = PAIR(eigh),
    [TPURT_LA_GEQRF] = PAIR(geqrf),
    [TPURT_LA_ORGQR] = PAIR(orgqr),
    [TPURT_LA_ORMQR] = PAIR(ormqr),
    [TPURT_LA_CHOLESKY] = PAIR(cholesky),
    [TPURT_LA_CHOLESKY_SOLVE] = PAIR(cholesky_solve),
    [TPURT_LA_CHOLESKY_INVERSE] = PAIR(cholesky_inverse),
    [TPURT_LA_EIG] = PAIR(eig),
    [TPURT_LA_LDL] = PAIR(ldl),
    [TPURT_LA_LDL_SOLVE] = PAIR(ldl_solve),
    [TPURT_LA_LSTSQ] = PAIR(lstsq),
    [TPURT_LA_MATRIX_EXP] = PAIR(matrix_exp),
    [TPURT_LA_CROSS] = {la_cross, la_cross},
};

static const char *const g_names[TPURT_LA_NUM_OPS] = {
    [TPURT_LA_SVD] = "linalg_svd", [TPURT_LA_TRSM] = "linalg_solve_triangular", [TPURT_LA_LU] = "linalg_lu_factor",
    [TPURT_LA_LU_SOLVE] = "linalg_lu_solve", [TPURT_LA_LU_UNPACK] = "lu_unpack", [TPURT_LA_SOLVE] = "linalg_solve",
    [TPURT_LA_INV] = "linalg_inv", [TPURT_LA_DET] = "linalg_det", [TPURT_LA_EIGH] = "linalg_eigh",
    [TPURT_LA_GEQRF] = "geqrf", [TPURT_LA_ORGQR] = "linalg_householder_product", [TPURT_LA_ORMQR] = "ormqr",
    [TPURT_LA_CHOLESKY] = "linalg_cholesky", [TPURT_LA_CHOLESKY_SOLVE] = "cholesky_solve",
    [TPURT_LA_CHOLESKY_INVERSE] = "cholesky_inverse", [TPURT_LA_EIG] = "linalg_eig",
    [TPURT_LA_LDL] = "linalg_ldl_factor", [TPURT_LA_LDL_SOLVE] = "linalg_ldl_solve", [TPURT_LA_LSTSQ] = "linalg_lstsq",
    [TPURT_LA_MATRIX_EXP] = "linalg_matrix_exp", [TPURT_LA_CROSS] = "linalg_cross",
};

const char *tpurt_linalg_op_name(tpurt_linalg_op op) {
  return (unsigned)op < TPURT_LA_NUM_OPS ? g_names[op] : "linalg";
}

static tpurt_status k_linalg(void *p, char *err, size_t errlen) {
  la_args *g = p;
  tpurt__gemm_lib_init();
  tpurt_status st = g_table[g->op][g->dt == TPURT_F64](g, err, errlen);
  tpurt__scratch_trim();
  return st;
}

/* Expected trailing dims (after the batch dims) of each operand. */
static int trailing(tpurt_linalg_op op, int is_out, int i) {
  static const signed char ins[TPURT_LA_NUM_OPS][LA_MAXV] = {
      [TPURT_LA_SVD] = {2}, [TPURT_LA_TRSM] = {2, 2}, [TPURT_LA_LU] = {2}, [TPURT_LA_LU_SOLVE] = {2, 1, 2},
      [TPURT_LA_LU_UNPACK] = {2, 1}, [TPURT_LA_SOLVE] = {2, 2}, [TPURT_LA_INV] = {2}, [TPURT_LA_DET] = {2},
      [TPURT_LA_EIGH] = {2}, [TPURT_LA_GEQRF] = {2}, [TPURT_LA_ORGQR] = {2, 1}, [TPURT_LA_ORMQR] = {2, 1, 2},
      [TPURT_LA_CHOLESKY] = {2}, [TPURT_LA_CHOLESKY_SOLVE] = {2, 2}, [TPURT_LA_CHOLESKY_INVERSE] = {2},
      [TPURT_LA_EIG] = {2}, [TPURT_LA_LDL] = {2}, [TPURT_LA_LDL_SOLVE] = {2, 1, 2}, [TPURT_LA_LSTSQ] = {2, 2},
      [TPURT_LA_MATRIX_EXP] = {2}, [TPURT_LA_CROSS] = {1, 1}};
  static const signed char outs[TPURT_LA_NUM_OPS][LA_MAXV] = {
      [TPURT_LA_SVD] = {2, 1, 2}, [TPURT_LA_TRSM] = {2}, [TPURT_LA_LU] = {2, 1, 0}, [TPURT_LA_LU_SOLVE] = {2},
      [TPURT_LA_LU_UNPACK] = {2, 2, 2}, [TPURT_LA_SOLVE] = {2, 2, 1, 0}, [TPURT_LA_INV] = {2, 0},
      [TPURT_LA_DET] = {0, 0, 2, 1}, [TPURT_LA_EIGH] = {1, 2}, [TPURT_LA_GEQRF] = {2, 1}, [TPURT_LA_ORGQR] = {2},
      [TPURT_LA_ORMQR] = {2}, [TPURT_LA_CHOLESKY] = {2, 0}, [TPURT_LA_CHOLESKY_SOLVE] = {2},
      [TPURT_LA_CHOLESKY_INVERSE] = {2}, [TPURT_LA_EIG] = {1, 2}, [TPURT_LA_LDL] = {2, 1, 0},
      [TPURT_LA_LDL_SOLVE] = {2}, [TPURT_LA_LSTSQ] = {2, 0, 1}, [TPURT_LA_MATRIX_EXP] = {2}, [TPURT_LA_CROSS] = {1}};
  return is_out ? outs[op][i] : ins[op][i];
}

static const int g_nin[TPURT_LA_NUM_OPS] = {
    [TPURT_LA_SVD] = 1, [TPURT_LA_TRSM] = 2, [TPURT_LA_LU] = 1, [TPURT_LA_LU_SOLVE] = 3, [TPURT_LA_LU_UNPACK] = 2,
    [TPURT_LA_SOLVE] = 2, [TPURT_LA_INV] = 1, [TPURT_LA_DET] = 1, [TPURT_LA_EIGH] = 1, [TPURT_LA_GEQRF] = 1,
    [TPURT_LA_ORGQR] = 2, [TPURT_LA_ORMQR] = 3, [TPURT_LA_CHOLESKY] = 1, [TPURT_LA_CHOLESKY_SOLVE] = 2,
    [TPURT_LA_CHOLESKY_INVERSE] = 1, [TPURT_LA_EIG] = 1, [TPURT_LA_LDL] = 1, [TPURT_LA_LDL_SOLVE] = 3,
    [TPURT_LA_LSTSQ] = 2, [TPURT_LA_MATRIX_EXP] = 1, [TPURT_LA_CROSS] = 2};
static const int g_nout[TPURT_LA_NUM_OPS] = {
    [TPURT_LA_SVD] = 3, [TPURT_LA_TRSM] = 1, [TPURT_LA_LU] = 3, [TPURT_LA_LU_SOLVE] = 1, [TPURT_LA_LU_UNPACK] = 3,
    [TPURT_LA_SOLVE] = 4, [TPURT_LA_INV] = 2, [TPURT_LA_DET] = 4, [TPURT_LA_EIGH] = 2, [TPURT_LA_GEQRF] = 2,
    [TPURT_LA_ORGQR] = 1, [TPURT_LA_ORMQR] = 1, [TPURT_LA_CHOLESKY] = 2, [TPURT_LA_CHOLESKY_SOLVE] = 1,
    [TPURT_LA_CHOLESKY_INVERSE] = 1, [TPURT_LA_EIG] = 2, [TPURT_LA_LDL] = 3, [TPURT_LA_LDL_SOLVE] = 1,
    [TPURT_LA_LSTSQ] = 3, [TPURT_LA_MATRIX_EXP] = 1, [TPURT_LA_CROSS] = 1};

/* Minimal sizes of the data operands, so no kernel reads or writes past a
 * view: checks the shapes each kernel relies on. */
static tpurt_status check_shapes(const la_args *g, const char *name) {
  const int nb = g->nb;
#define SZ(v, i) ((v)->sizes[nb + (i)])
  const tpurt_view *A = &g->in[0];
  int64_t m = g->op == TPURT_LA_CROSS ? 3 : SZ(A, 0), n = g->op == TPURT_LA_CROSS ? 3 : SZ(A, 1);
  int64_t k = m < n ? m : n;
  int ok = 1;
  const tpurt_view *o = g->out;
  const tpurt_view *in = g->in;
#define P(v) la_present(&(v))
  switch (g->op) {
    case TPURT_LA_SVD:
      ok = SZ(&o[1], 0) == k && (!P(o[0]) || (SZ(&o[0], 0) == m && SZ(&o[0], 1) <= m && SZ(&o[0], 1) >= (g->f[0] ? m : k))) &&
           (!P(o[2]) || (SZ(&o[2], 1) == n && SZ(&o[2], 0) <= n && SZ(&o[2], 0) >= (g->f[0] ? n : k)));
      break;
    case TPURT_LA_TRSM:
    case TPURT_LA_CHOLESKY_SOLVE: {
      const tpurt_view *Am = g->op == TPURT_LA_TRSM ? &in[0] : &in[1], *B = g->op == TPURT_LA_TRSM ? &in[1] : &in[0];
      ok = SZ(Am, 0) == SZ(Am, 1) && SZ(Am, 0) == SZ(B, 0) && SZ(&o[0], 0) == SZ(B, 0) && SZ(&o[0], 1) == SZ(B, 1);
      break;
    }
    case TPURT_LA_LU:
      ok = (!P(o[0]) || (SZ(&o[0], 0) == m && SZ(&o[0], 1) == n)) && (!P(o[1]) || SZ(&o[1], 0) == k);
      break;
    case TPURT_LA_LU_SOLVE:
    case TPURT_LA_LDL_SOLVE:
      ok = m == n && SZ(&in[1], 0) == n && SZ(&in[2], 0) == n && SZ(&o[0], 0) == n && SZ(&o[0], 1) == SZ(&in[2], 1);
      break;
    case TPURT_LA_LU_UNPACK:
      ok = SZ(&in[1], 0) >= (P(o[0]) ? k : 0) && (!P(o[0]) || (SZ(&o[0], 0) == m && SZ(&o[0], 1) == m)) &&
           (!P(o[1]) || (SZ(&o[1], 0) == m && SZ(&o[1], 1) == k)) && (!P(o[2]) || (SZ(&o[2], 0) == k && SZ(&o[2], 1) == n));
      break;
    case TPURT_LA_SOLVE:
      ok = m == n && SZ(&in[1], 0) == n && SZ(&o[0], 0) == n && SZ(&o[0], 1) == SZ(&in[1], 1) &&
           (!P(o[1]) || (SZ(&o[1], 0) == n && SZ(&o[1], 1) == n)) && (!P(o[2]) || SZ(&o[2], 0) == n);
      break;
    case TPURT_LA_INV:
    case TPURT_LA_CHOLESKY:
    case TPURT_LA_CHOLESKY_INVERSE:
    case TPURT_LA_MATRIX_EXP:
      ok = m == n && SZ(&o[0], 0) == n && SZ(&o[0], 1) == n;
      break;
    case TPURT_LA_DET:
      ok = m == n && (!P(o[2]) || (SZ(&o[2], 0) == n && SZ(&o[2], 1) == n)) && (!P(o[3]) || SZ(&o[3], 0) == n);
      break;
    case TPURT_LA_EIGH:
    case TPURT_LA_EIG:
      ok = m == n && SZ(&o[0], 0) == n && (!P(o[1]) || (SZ(&o[1], 0) == n && SZ(&o[1], 1) == n));
      break;
    case TPURT_LA_GEQRF:
      ok = SZ(&o[0], 0) == m && SZ(&o[0], 1) == n && SZ(&o[1], 0) == k;
      break;
    case TPURT_LA_ORGQR:
      ok = SZ(&o[0], 0) == m && SZ(&o[0], 1) <= m && SZ(&in[1], 0) <= SZ(&o[0], 1) + n;
      break;
    case TPURT_LA_ORMQR: {
      int64_t nq = g->f[0] ? SZ(&in[2], 0) : SZ(&in[2], 1);
      int64_t kk = SZ(&in[1], 0) < nq ? SZ(&in[1], 0) : nq;
      ok = m == nq && n >= kk && SZ(&o[0], 0) == SZ(&in[2], 0) && SZ(&o[0], 1) == SZ(&in[2], 1);
      break;
    }
    case TPURT_LA_LDL:
      ok = m == n && SZ(&o[0], 0) == n && SZ(&o[0], 1) == n && SZ(&o[1], 0) == n;
      break;
    case TPURT_LA_LSTSQ:
      ok = SZ(&in[1], 0) == m && SZ(&o[0], 0) == (m > n ? m : n) && SZ(&o[0], 1) == SZ(&in[1], 1) &&
           (!P(o[2]) || SZ(&o[2], 0) == k);
      break;
    case TPURT_LA_CROSS:
      ok = SZ(&in[0], 0) == 3 && SZ(&in[1], 0) == 3 && SZ(&o[0], 0) == 3;
      break;
    default: break;
  }
#undef P
#undef SZ
  if (!ok) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: operand shapes do not match", name);
  if (m > INT32_MAX / 8 || n > INT32_MAX / 8)
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: matrix too large for LAPACK", name);
  return TPURT_OK;
}

tpurt_status tpurt_linalg(tpurt_stream *s, tpurt_linalg_op op, int nb, const tpurt_view *outs, int nout,
                          const tpurt_view *ins, int nin, const int64_t *flags, double rcond) {
  TPURT__INIT_OR_RETURN();
  if ((unsigned)op >= TPURT_LA_NUM_OPS) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "linalg: invalid op %d", (int)op);
  const char *name = g_names[op];
  if (nin != g_nin[op] || nout != g_nout[op])
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: expected %d inputs and %d outputs, got %d and %d", name,
                      g_nin[op], g_nout[op], nin, nout);
  if (!outs || !ins || nb < 0 || nb > TPURT_MAX_DIMS - 2)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: invalid arguments", name);
  la_args a;
  memset(&a, 0, sizeof a);
  a.op = op;
  a.nb = nb;
  a.nin = nin;
  a.nout = nout;
  a.rcond = rcond;
  if (flags) memcpy(a.f, flags, sizeof a.f);
  a.dt = ins[0].dtype;
  if (op == TPURT_LA_CROSS) {
    a.dt = outs[0].dtype;
    if (a.dt == TPURT_C64 || a.dt == TPURT_C128 || a.dt == TPURT_BOOL)
      return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: not implemented for dtype %s", name, tpurt_dtype_name(a.dt));
  } else if (a.dt != TPURT_F32 && a.dt != TPURT_F64) {
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: not implemented for dtype %s (float32 and float64 only)", name,
                      tpurt_dtype_name(a.dt));
  }
  int dev = -1;
  a.nbatch = 1;
  for (int io = 0; io < 2; io++) {
    const tpurt_view *vs = io ? outs : ins;
    int cnt = io ? nout : nin;
    for (int i = 0; i < cnt; i++) {
      const tpurt_view *v = &vs[i];
      int want = nb + trailing(op, io, i);
      char what[48];
      snprintf(what, sizeof what, "%s %d", io ? "output" : "input", i);
      if (io && v->ndim < 0) { /* absent output */
        a.out[i] = *v;
        a.out[i].ptr = 0;
        continue;
      }
      tpurt_status st = tpurt__check_view(v, what);
      if (st) return st;
      if (v->ndim != want)
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must have %d dimensions, got %d", name, what, want,
                          v->ndim);
      if (i == 0 && io == 0)
        for (int d = 0; d < nb; d++) a.bsz[d] = v->sizes[d], a.nbatch *= v->sizes[d];
      for (int d = 0; d < nb; d++)
        if (v->sizes[d] != a.bsz[d])
          return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: batch dims of %s do not match", name, what);
      int is_data = op == TPURT_LA_CROSS || !(v->dtype == TPURT_I32 || v->dtype == TPURT_I64);
      if (op == TPURT_LA_EIG && io && (v->dtype != (a.dt == TPURT_F32 ? TPURT_C64 : TPURT_C128)))
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must be complex", name, what);
      if (op != TPURT_LA_EIG && is_data && v->dtype != a.dt)
        return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s has dtype %s, expected %s", name, what,
                          tpurt_dtype_name(v->dtype), tpurt_dtype_name(a.dt));
      if (tpurt__view_numel(v) > 0) {
        int d = tpurt_devptr_device(v->ptr);
        if (d < 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s is not a device address", name, what);
        if (dev < 0) dev = d;
        if ((st = tpurt__check_view_range(dev, v, what))) return st;
      }
      if (io)
        a.out[i] = *v;
      else
        a.in[i] = *v;
      if (io && tpurt__view_numel(v) == 0) a.out[i].ptr = 0;
    }
  }
  tpurt_status st = check_shapes(&a, name);
  if (st) return st;
  if (dev < 0) dev = tpurt_devptr_device(ins[0].ptr);
  if (dev < 0) dev = tpurt_stream_device(s ? s : tpurt_stream_current(tpurt_get_device()));
  if ((st = tpurt__resolve_stream(&s, dev))) return st;
  if (a.nbatch == 0) return TPURT_OK;
  int any = 0;
  for (int i = 0; i < nout; i++) any |= la_present(&a.out[i]);
  if (!any) return TPURT_OK;
  return tpurt_launch(s, name, k_linalg, &a, sizeof a);
}
