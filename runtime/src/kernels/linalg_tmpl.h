/* linalg_tmpl.h — per-dtype bodies of the LAPACK kernels (linalg.c).
 * Included once per real type with T (float / double), F(x) (function
 * name suffix), LA(x) (LAPACKE *_work routine) and CB(x) (CBLAS routine).
 * Every matrix is copied into a column-major scratch buffer, factored or
 * solved there and copied back to its strided destination. */

static void F(load)(T *d, int64_t ld, const tpurt_view *v, const la_args *g, int64_t b, int64_t rows, int64_t cols) {
  const T *s = (const T *)la_ptr(v, g, b);
  int64_t rs = v->strides[g->nb], cs = v->strides[g->nb + 1];
  for (int64_t j = 0; j < cols; j++)
    for (int64_t i = 0; i < rows; i++) d[i + j * ld] = s[i * rs + j * cs];
}

static void F(store)(const tpurt_view *v, const la_args *g, int64_t b, const T *src, int64_t ld, int64_t rows,
                     int64_t cols) {
  if (!la_present(v)) return;
  T *d = (T *)la_ptr(v, g, b);
  int64_t rs = v->strides[g->nb], cs = v->strides[g->nb + 1];
  for (int64_t j = 0; j < cols; j++)
    for (int64_t i = 0; i < rows; i++) d[i * rs + j * cs] = src[i + j * ld];
}

/* The triangle opposite to `upper` (strictly) of a column-major n x n matrix. */
static void F(zero_tri)(T *a, int64_t ld, int64_t rows, int64_t cols, int upper) {
  for (int64_t j = 0; j < cols; j++)
    for (int64_t i = 0; i < rows; i++)
      if (upper ? i > j : i < j) a[i + j * ld] = 0;
}

static void F(vstore)(const tpurt_view *v, const la_args *g, int64_t b, const T *src, int64_t n) {
  if (!la_present(v)) return;
  T *d = (T *)la_ptr(v, g, b);
  int64_t st = n > 0 ? v->strides[g->nb] : 0;
  for (int64_t i = 0; i < n; i++) d[i * st] = src[i];
}

static void F(eye_store)(const tpurt_view *v, const la_args *g, int64_t b, int64_t n) {
  if (!la_present(v)) return;
  T *d = (T *)la_ptr(v, g, b);
  int64_t rs = v->strides[g->nb], cs = v->strides[g->nb + 1];
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < n; i++) d[i * rs + j * cs] = i == j;
}

/* ---------------------------------------------------------------- SVD */
static tpurt_status F(svd)(la_args *g, char *err, size_t errlen) {
  const tpurt_view *A = &g->in[0], *U = &g->out[0], *S = &g->out[1], *V = &g->out[2];
  int full = (int)g->f[0], uv = (int)g->f[1];
  int m = (int)A->sizes[g->nb], n = (int)A->sizes[g->nb + 1], k = m < n ? m : n;
  if (k == 0) {
    if (uv && full)
      for (int64_t b = 0; b < g->nbatch; b++) {
        F(eye_store)(U, g, b, m);
        F(eye_store)(V, g, b, n);
      }
    return TPURT_OK;
  }
  char jobz = uv ? (full ? 'A' : 'S') : 'N';
  int ucols = full ? m : k, vrows = full ? n : k;
  int ldu = m, ldvt = uv ? vrows : 1;
  T *a = tpurt__scratch(0, (size_t)m * n * sizeof(T));
  T *u = tpurt__scratch(1, (size_t)(uv ? (int64_t)m * ucols : 1) * sizeof(T));
  T *vt = tpurt__scratch(2, (size_t)(uv ? (int64_t)vrows * n : 1) * sizeof(T));
  T *s = tpurt__scratch(3, (size_t)k * sizeof(T));
  lapack_int *iw = tpurt__scratch(4, (size_t)8 * k * sizeof(lapack_int));
  T wq = 0;
  LA(gesdd)(LAPACK_COL_MAJOR, jobz, m, n, a, m, s, u, ldu, vt, ldvt, &wq, -1, iw);
  lapack_int lw = (lapack_int)wq + 1;
  T *work = tpurt__scratch(5, (size_t)lw * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, m, A, g, b, m, n);
    int finite = 1;
    for (int64_t i = 0; i < (int64_t)m * n; i++) finite &= isfinite(a[i]) != 0;
    lapack_int info = finite ? LA(gesdd)(LAPACK_COL_MAJOR, jobz, m, n, a, m, s, u, ldu, vt, ldvt, work, lw, iw) : -4;
    if (info == -4 || info > 0) {
      if (info == -4)
        snprintf(err, errlen, "linalg.svd: The algorithm failed to converge because the input matrix contained "
                              "non-finite values.");
      else
        snprintf(err, errlen, "linalg.svd: The algorithm failed to converge because the input matrix is "
                              "ill-conditioned or has too many repeated singular values (error code: %d).", (int)info);
      return TPURT_ERR_KERNEL;
    }
    F(vstore)(S, g, b, s, k);
    if (uv) {
      F(store)(U, g, b, u, ldu, m, ucols);
      F(store)(V, g, b, vt, ldvt, vrows, n);
    }
  }
  return TPURT_OK;
}

/* --------------------------------------------------- triangular solve */
static tpurt_status F(trsm)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0], *B = &g->in[1], *X = &g->out[0];
  int64_t n = B->sizes[g->nb], r = B->sizes[g->nb + 1];
  if (n == 0 || r == 0) return TPURT_OK;
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T)), *x = tpurt__scratch(1, (size_t)n * r * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, A, g, b, n, n);
    F(load)(x, n, B, g, b, n, r);
    CB(trsm)(CblasColMajor, CblasLeft, g->f[0] ? CblasUpper : CblasLower, g->f[1] ? CblasTrans : CblasNoTrans,
             g->f[2] ? CblasUnit : CblasNonUnit, (int)n, (int)r, (T)1, a, (int)n, x, (int)n);
    F(store)(X, g, b, x, n, n, r);
  }
  return TPURT_OK;
}

/* ------------------------------------------------------------------ LU */
/* LU with pivots (1-based int32) and info; returns the info. */
static lapack_int F(getrf)(T *a, int m, int n, lapack_int *ipiv) {
  if (m == 0 || n == 0) return 0;
  return LA(getrf)(LAPACK_COL_MAJOR, m, n, a, m > 1 ? m : 1, ipiv);
}

static tpurt_status F(lu)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0], *LU = &g->out[0], *P = &g->out[1], *INF = &g->out[2];
  int m = (int)A->sizes[g->nb], n = (int)A->sizes[g->nb + 1], k = m < n ? m : n;
  T *a = tpurt__scratch(0, (size_t)m * n * sizeof(T));
  lapack_int *ip = tpurt__scratch(1, (size_t)(k + 1) * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, m, A, g, b, m, n);
    lapack_int info = F(getrf)(a, m, n, ip);
    F(store)(LU, g, b, a, m, m, n);
    la_store_piv(P, g, b, ip, k);
    la_store_info(INF, g, b, info);
  }
  return TPURT_OK;
}

static tpurt_status F(lu_solve)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *LU = &g->in[0], *P = &g->in[1], *B = &g->in[2], *X = &g->out[0];
  int n = (int)B->sizes[g->nb], r = (int)B->sizes[g->nb + 1];
  if (n == 0 || r == 0) return TPURT_OK;
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T)), *x = tpurt__scratch(1, (size_t)n * r * sizeof(T));
  lapack_int *ip = tpurt__scratch(2, (size_t)n * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, LU, g, b, n, n);
    F(load)(x, n, B, g, b, n, r);
    la_load_piv(ip, P, g, b, n);
    LA(getrs)(LAPACK_COL_MAJOR, g->f[0] ? 'T' : 'N', n, r, a, n, ip, x, n);
    F(store)(X, g, b, x, n, n, r);
  }
  return TPURT_OK;
}

static tpurt_status F(lu_unpack)(la_args *g, char *err, size_t errlen) {
  const tpurt_view *LU = &g->in[0], *Pv = &g->in[1], *P = &g->out[0], *L = &g->out[1], *U = &g->out[2];
  int64_t m = LU->sizes[g->nb], n = LU->sizes[g->nb + 1], k = m < n ? m : n;
  T *a = tpurt__scratch(0, (size_t)m * n * sizeof(T));
  T *p = tpurt__scratch(1, (size_t)m * m * sizeof(T));
  int64_t *perm = tpurt__scratch(2, (size_t)(m + 1) * sizeof(int64_t));
  lapack_int *ip = tpurt__scratch(3, (size_t)(k + 1) * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    if (la_present(L) || la_present(U)) {
      F(load)(a, m, LU, g, b, m, n);
      if (la_present(U)) { /* k x n upper part */
        T *d = (T *)la_ptr(U, g, b);
        int64_t rs = U->strides[g->nb], cs = U->strides[g->nb + 1];
        for (int64_t j = 0; j < n; j++)
          for (int64_t i = 0; i < k; i++) d[i * rs + j * cs] = i <= j ? a[i + j * m] : 0;
      }
      if (la_present(L)) { /* m x k unit lower part */
        T *d = (T *)la_ptr(L, g, b);
        int64_t rs = L->strides[g->nb], cs = L->strides[g->nb + 1];
        for (int64_t j = 0; j < k; j++)
          for (int64_t i = 0; i < m; i++) d[i * rs + j * cs] = i > j ? a[i + j * m] : i == j ? 1 : 0;
      }
    }
    if (la_present(P)) {
      la_load_piv(ip, Pv, g, b, k);
      for (int64_t i = 0; i < m; i++) perm[i] = i;
      for (int64_t i = 0; i < k; i++) {
        int64_t t = ip[i] - 1;
        if (t < 0 || t >= m) {
          snprintf(err, errlen, "lu_unpack: pivot %" PRId64 " is out of range [1, %" PRId64 "]", t + 1, m);
          return TPURT_ERR_INDEX;
        }
        int64_t s = perm[i];
        perm[i] = perm[t];
        perm[t] = s;
      }
      memset(p, 0, (size_t)m * m * sizeof(T));
      for (int64_t i = 0; i < m; i++) p[perm[i] + i * m] = 1; /* P[perm[i], i] = 1 */
      F(store)(P, g, b, p, m, m, m);
    }
  }
  return TPURT_OK;
}

/* solve: X, LU, pivots, info from A, B (left side). */
static tpurt_status F(solve)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0], *B = &g->in[1];
  const tpurt_view *X = &g->out[0], *LU = &g->out[1], *P = &g->out[2], *INF = &g->out[3];
  int n = (int)A->sizes[g->nb], r = (int)B->sizes[g->nb + 1];
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T)), *x = tpurt__scratch(1, (size_t)n * r * sizeof(T));
  lapack_int *ip = tpurt__scratch(2, (size_t)(n + 1) * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, A, g, b, n, n);
    lapack_int info = F(getrf)(a, n, n, ip);
    if (n > 0 && r > 0) {
      F(load)(x, n, B, g, b, n, r);
      LA(getrs)(LAPACK_COL_MAJOR, 'N', n, r, a, n, ip, x, n);
      F(store)(X, g, b, x, n, n, r);
    }
    F(store)(LU, g, b, a, n, n, n);
    la_store_piv(P, g, b, ip, n);
    la_store_info(INF, g, b, info);
  }
  return TPURT_OK;
}

static tpurt_status F(inv)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0], *X = &g->out[0], *INF = &g->out[1];
  int n = (int)A->sizes[g->nb];
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T)), *x = tpurt__scratch(1, (size_t)n * n * sizeof(T));
  lapack_int *ip = tpurt__scratch(2, (size_t)(n + 1) * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, A, g, b, n, n);
    lapack_int info = F(getrf)(a, n, n, ip);
    if (n > 0) {
      memset(x, 0, (size_t)n * n * sizeof(T));
      for (int i = 0; i < n; i++) x[i + (int64_t)i * n] = 1;
      LA(getrs)(LAPACK_COL_MAJOR, 'N', n, n, a, n, ip, x, n);
      F(store)(X, g, b, x, n, n, n);
    }
    la_store_info(INF, g, b, info);
  }
  return TPURT_OK;
}

/* det (f[0] = 0) -> out0 = det; slogdet (f[0] = 1) -> out0 = sign, out1 =
 * log|det|. Then LU and pivots (outs 2, 3, may be absent). */
static tpurt_status F(det)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0];
  int n = (int)A->sizes[g->nb];
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T));
  lapack_int *ip = tpurt__scratch(2, (size_t)(n + 1) * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, A, g, b, n, n);
    F(getrf)(a, n, n, ip);
    int neg = 0;
    for (int i = 0; i < n; i++) neg ^= ip[i] != i + 1;
    if (g->f[0] == 0) {
      T d = neg ? -1 : 1;
      for (int i = 0; i < n; i++) d *= a[i + (int64_t)i * n];
      *(T *)la_ptr(&g->out[0], g, b) = d;
    } else {
      T sg = neg ? -1 : 1, la = 0;
      for (int i = 0; i < n; i++) {
        T v = a[i + (int64_t)i * n];
        if (v < 0) sg = -sg, v = -v;
        if (v == 0) sg = 0;
        la += (T)log((double)v);
      }
      if (isnan(la)) sg = (T)NAN;
      *(T *)la_ptr(&g->out[0], g, b) = sg;
      *(T *)la_ptr(&g->out[1], g, b) = la;
    }
    F(store)(&g->out[2], g, b, a, n, n, n);
    la_store_piv(&g->out[3], g, b, ip, n);
  }
  return TPURT_OK;
}

/* ------------------------------------------------------ eigh (syevd) */
static tpurt_status F(eigh)(la_args *g, char *err, size_t errlen) {
  const tpurt_view *A = &g->in[0], *L = &g->out[0], *V = &g->out[1];
  int n = (int)A->sizes[g->nb];
  if (n == 0) return TPURT_OK;
  char jobz = la_present(V) ? 'V' : 'N', uplo = g->f[0] ? 'U' : 'L';
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T)), *w = tpurt__scratch(1, (size_t)n * sizeof(T));
  T wq = 0;
  lapack_int iq = 0;
  LA(syevd)(LAPACK_COL_MAJOR, jobz, uplo, n, a, n, w, &wq, -1, &iq, -1);
  lapack_int lw = (lapack_int)wq + 1, liw = iq + 1;
  T *work = tpurt__scratch(2, (size_t)lw * sizeof(T));
  lapack_int *iw = tpurt__scratch(3, (size_t)liw * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, A, g, b, n, n);
    lapack_int info = LA(syevd)(LAPACK_COL_MAJOR, jobz, uplo, n, a, n, w, work, lw, iw, liw);
    if (info > 0) {
      snprintf(err, errlen, "linalg.eigh: The algorithm failed to converge because the input matrix is "
                            "ill-conditioned or has too many repeated eigenvalues (error code: %d).", (int)info);
      return TPURT_ERR_KERNEL;
    }
    F(vstore)(L, g, b, w, n);
    if (jobz == 'V') F(store)(V, g, b, a, n, n, n);
  }
  return TPURT_OK;
}

/* ---------------------------------------------------------------- QR */
static tpurt_status F(geqrf)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0], *QR = &g->out[0], *TAU = &g->out[1];
  int m = (int)A->sizes[g->nb], n = (int)A->sizes[g->nb + 1], k = m < n ? m : n;
  if (m == 0 || n == 0) return TPURT_OK;
  T *a = tpurt__scratch(0, (size_t)m * n * sizeof(T)), *tau = tpurt__scratch(1, (size_t)k * sizeof(T));
  T wq = 0;
  LA(geqrf)(LAPACK_COL_MAJOR, m, n, a, m, tau, &wq, -1);
  lapack_int lw = (lapack_int)wq + 1;
  T *work = tpurt__scratch(2, (size_t)lw * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, m, A, g, b, m, n);
    LA(geqrf)(LAPACK_COL_MAJOR, m, n, a, m, tau, work, lw);
    F(store)(QR, g, b, a, m, m, n);
    F(vstore)(TAU, g, b, tau, k);
  }
  return TPURT_OK;
}

/* Q (m x c) from reflectors QR (m x n) and tau (t): the first min(t, c)
 * reflectors applied to the identity (orgqr). */
static tpurt_status F(orgqr)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *QR = &g->in[0], *TAU = &g->in[1], *Q = &g->out[0];
  int m = (int)QR->sizes[g->nb], n = (int)QR->sizes[g->nb + 1], c = (int)Q->sizes[g->nb + 1];
  int t = (int)TAU->sizes[g->nb];
  int kk = t < c ? t : c, nc = n < c ? n : c;
  if (m == 0 || c == 0) return TPURT_OK;
  T *a = tpurt__scratch(0, (size_t)m * c * sizeof(T)), *tau = tpurt__scratch(1, (size_t)(t + 1) * sizeof(T));
  T wq = 0;
  LA(orgqr)(LAPACK_COL_MAJOR, m, c, kk, a, m, tau, &wq, -1);
  lapack_int lw = (lapack_int)wq + 1;
  T *work = tpurt__scratch(2, (size_t)lw * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    memset(a, 0, (size_t)m * c * sizeof(T));
    F(load)(a, m, QR, g, b, m, nc);
    const T *tp = (const T *)la_ptr(TAU, g, b);
    for (int i = 0; i < kk; i++) tau[i] = tp[i * TAU->strides[g->nb]];
    LA(orgqr)(LAPACK_COL_MAJOR, m, c, kk, a, m, tau, work, lw);
    F(store)(Q, g, b, a, m, m, c);
  }
  return TPURT_OK;
}

/* X = op(Q) C (left) or C op(Q) with Q from reflectors (ormqr). */
static tpurt_status F(ormqr)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *QR = &g->in[0], *TAU = &g->in[1], *C = &g->in[2], *X = &g->out[0];
  int left = (int)g->f[0], tr = (int)g->f[1];
  int mc = (int)C->sizes[g->nb], nc = (int)C->sizes[g->nb + 1], nq = left ? mc : nc;
  int k = (int)TAU->sizes[g->nb];
  if (mc == 0 || nc == 0) return TPURT_OK;
  if (k > nq) k = nq;
  T *a = tpurt__scratch(0, (size_t)nq * (k + 1) * sizeof(T)), *tau = tpurt__scratch(1, (size_t)(k + 1) * sizeof(T));
  T *x = tpurt__scratch(3, (size_t)mc * nc * sizeof(T));
  T wq = 0;
  char side = left ? 'L' : 'R', trans = tr ? 'T' : 'N';
  LA(ormqr)(LAPACK_COL_MAJOR, side, trans, mc, nc, k, a, nq, tau, x, mc, &wq, -1);
  lapack_int lw = (lapack_int)wq + 1;
  T *work = tpurt__scratch(2, (size_t)lw * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, nq, QR, g, b, nq, k);
    const T *tp = (const T *)la_ptr(TAU, g, b);
    for (int i = 0; i < k; i++) tau[i] = tp[i * TAU->strides[g->nb]];
    F(load)(x, mc, C, g, b, mc, nc);
    if (k > 0) LA(ormqr)(LAPACK_COL_MAJOR, side, trans, mc, nc, k, a, nq, tau, x, mc, work, lw);
    F(store)(X, g, b, x, mc, mc, nc);
  }
  return TPURT_OK;
}

/* ---------------------------------------------------------- Cholesky */
static tpurt_status F(cholesky)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0], *L = &g->out[0], *INF = &g->out[1];
  int n = (int)A->sizes[g->nb], up = (int)g->f[0];
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    lapack_int info = 0;
    if (n > 0) {
      F(load)(a, n, A, g, b, n, n);
      info = LA(potrf)(LAPACK_COL_MAJOR, up ? 'U' : 'L', n, a, n);
      F(zero_tri)(a, n, n, n, up);
      F(store)(L, g, b, a, n, n, n);
    }
    la_store_info(INF, g, b, info);
  }
  return TPURT_OK;
}

static tpurt_status F(cholesky_solve)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *B = &g->in[0], *L = &g->in[1], *X = &g->out[0];
  int n = (int)B->sizes[g->nb], r = (int)B->sizes[g->nb + 1];
  if (n == 0 || r == 0) return TPURT_OK;
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T)), *x = tpurt__scratch(1, (size_t)n * r * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, L, g, b, n, n);
    F(load)(x, n, B, g, b, n, r);
    LA(potrs)(LAPACK_COL_MAJOR, g->f[0] ? 'U' : 'L', n, r, a, n, x, n);
    F(store)(X, g, b, x, n, n, r);
  }
  return TPURT_OK;
}

static tpurt_status F(cholesky_inverse)(la_args *g, char *err, size_t errlen) {
  const tpurt_view *L = &g->in[0], *X = &g->out[0];
  int n = (int)L->sizes[g->nb], up = (int)g->f[0];
  if (n == 0) return TPURT_OK;
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, L, g, b, n, n);
    lapack_int info = LA(potri)(LAPACK_COL_MAJOR, up ? 'U' : 'L', n, a, n);
    if (info > 0) {
      snprintf(err, errlen, "cholesky_inverse: The diagonal element %d is zero, the inversion could not be "
                            "completed because the input matrix is singular.", (int)info);
      return TPURT_ERR_KERNEL;
    }
    for (int j = 0; j < n; j++) /* mirror the computed triangle */
      for (int i = 0; i < n; i++)
        if (up ? i > j : i < j) a[i + (int64_t)j * n] = a[j + (int64_t)i * n];
    F(store)(X, g, b, a, n, n, n);
  }
  return TPURT_OK;
}

/* ------------------------------------------------------- eig (geev) */
/* W [n] and V [n, n] complex (pairs of T) from a real A. */
static tpurt_status F(eig)(la_args *g, char *err, size_t errlen) {
  const tpurt_view *A = &g->in[0], *W = &g->out[0], *V = &g->out[1];
  int n = (int)A->sizes[g->nb];
  if (n == 0) return TPURT_OK;
  int wantv = la_present(V);
  char jobvr = wantv ? 'V' : 'N';
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T)), *wr = tpurt__scratch(1, (size_t)2 * n * sizeof(T));
  T *wi = wr + n, *vr = tpurt__scratch(3, (size_t)n * n * sizeof(T)), vl = 0;
  T wq = 0;
  LA(geev)(LAPACK_COL_MAJOR, 'N', jobvr, n, a, n, wr, wi, &vl, 1, vr, n, &wq, -1);
  lapack_int lw = (lapack_int)wq + 1;
  T *work = tpurt__scratch(2, (size_t)lw * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, A, g, b, n, n);
    lapack_int info = LA(geev)(LAPACK_COL_MAJOR, 'N', jobvr, n, a, n, wr, wi, &vl, 1, vr, n, work, lw);
    if (info > 0) {
      snprintf(err, errlen, "linalg.eig: The QR algorithm failed to compute all the eigenvalues, and no "
                            "eigenvectors have been computed. (error code: %d).", (int)info);
      return TPURT_ERR_KERNEL;
    }
    T *w = (T *)la_ptr(W, g, b);
    int64_t ws = W->strides[g->nb];
    for (int i = 0; i < n; i++) w[2 * i * ws] = wr[i], w[2 * i * ws + 1] = wi[i];
    if (wantv) {
      T *v = (T *)la_ptr(V, g, b);
      int64_t rs = V->strides[g->nb], cs = V->strides[g->nb + 1];
      for (int j = 0; j < n; j++) {
        if (wi[j] != 0 && j + 1 < n) { /* conjugate pair in columns j, j + 1 */
          for (int i = 0; i < n; i++) {
            T re = vr[i + (int64_t)j * n], im = vr[i + (int64_t)(j + 1) * n];
            T *d0 = v + 2 * (i * rs + j * cs), *d1 = v + 2 * (i * rs + (j + 1) * cs);
            d0[0] = re, d0[1] = im, d1[0] = re, d1[1] = -im;
          }
          j++;
        } else {
          for (int i = 0; i < n; i++) {
            T *d = v + 2 * (i * rs + j * cs);
            d[0] = vr[i + (int64_t)j * n], d[1] = 0;
          }
        }
      }
    }
  }
  return TPURT_OK;
}

/* ------------------------------------------------------- LDL (sytrf) */
static tpurt_status F(ldl)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0], *LD = &g->out[0], *P = &g->out[1], *INF = &g->out[2];
  int n = (int)A->sizes[g->nb], up = (int)g->f[0];
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T));
  lapack_int *ip = tpurt__scratch(1, (size_t)(n + 1) * sizeof(lapack_int));
  T wq = 0;
  lapack_int lw = 1;
  if (n > 0) {
    LA(sytrf)(LAPACK_COL_MAJOR, up ? 'U' : 'L', n, a, n, ip, &wq, -1);
    lw = (lapack_int)wq + 1;
  }
  T *work = tpurt__scratch(2, (size_t)lw * sizeof(T));
  for (int64_t b = 0; b < g->nbatch; b++) {
    lapack_int info = 0;
    if (n > 0) {
      F(load)(a, n, A, g, b, n, n);
      info = LA(sytrf)(LAPACK_COL_MAJOR, up ? 'U' : 'L', n, a, n, ip, work, lw);
      F(zero_tri)(a, n, n, n, up);
      F(store)(LD, g, b, a, n, n, n);
      la_store_piv(P, g, b, ip, n);
    }
    la_store_info(INF, g, b, info);
  }
  return TPURT_OK;
}

static tpurt_status F(ldl_solve)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *LD = &g->in[0], *P = &g->in[1], *B = &g->in[2], *X = &g->out[0];
  int n = (int)B->sizes[g->nb], r = (int)B->sizes[g->nb + 1];
  if (n == 0 || r == 0) return TPURT_OK;
  T *a = tpurt__scratch(0, (size_t)n * n * sizeof(T)), *x = tpurt__scratch(1, (size_t)n * r * sizeof(T));
  lapack_int *ip = tpurt__scratch(2, (size_t)n * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(a, n, LD, g, b, n, n);
    F(load)(x, n, B, g, b, n, r);
    la_load_piv(ip, P, g, b, n);
    LA(sytrs)(LAPACK_COL_MAJOR, g->f[0] ? 'U' : 'L', n, r, a, n, ip, x, n);
    F(store)(X, g, b, x, n, n, r);
  }
  return TPURT_OK;
}

/* --------------------------------------------------- least squares */
/* X [max(m, n), r] raw solution (LAPACK's layout: rows n.. hold the
 * residual data when m > n), rank (int64 [..], may be absent), S [k] (may
 * be absent). f[0] = driver (0 gels, 1 gelsy, 2 gelsd, 3 gelss). */
static tpurt_status F(lstsq)(la_args *g, char *err, size_t errlen) {
  const tpurt_view *A = &g->in[0], *B = &g->in[1], *X = &g->out[0], *RK = &g->out[1], *S = &g->out[2];
  int m = (int)A->sizes[g->nb], n = (int)A->sizes[g->nb + 1], r = (int)B->sizes[g->nb + 1];
  int mx = m > n ? m : n, k = m < n ? m : n, drv = (int)g->f[0];
  int lda = m > 1 ? m : 1, ldb = mx > 1 ? mx : 1;
  T rc = (T)g->rcond;
  T *a = tpurt__scratch(0, (size_t)m * n * sizeof(T)), *x = tpurt__scratch(1, (size_t)ldb * r * sizeof(T));
  T *s = tpurt__scratch(3, (size_t)(k + 1) * sizeof(T));
  lapack_int *iw = tpurt__scratch(4, (size_t)(n + 1) * sizeof(lapack_int));
  T wq = 0;
  lapack_int iq = 1, rank = 0, lw = 1, liw = 1;
  if (m > 0 && n > 0) {
    switch (drv) {
      case 0: LA(gels)(LAPACK_COL_MAJOR, 'N', m, n, r, a, lda, x, ldb, &wq, -1); break;
      case 1: LA(gelsy)(LAPACK_COL_MAJOR, m, n, r, a, lda, x, ldb, iw, rc, &rank, &wq, -1); break;
      case 2: LA(gelsd)(LAPACK_COL_MAJOR, m, n, r, a, lda, x, ldb, s, rc, &rank, &wq, -1, &iq); break;
      default: LA(gelss)(LAPACK_COL_MAJOR, m, n, r, a, lda, x, ldb, s, rc, &rank, &wq, -1); break;
    }
    lw = (lapack_int)wq + 1;
    liw = iq > 1 ? iq : 1;
  }
  T *work = tpurt__scratch(2, (size_t)lw * sizeof(T));
  if (drv == 2) iw = tpurt__scratch(4, (size_t)(liw + n + 1) * sizeof(lapack_int));
  for (int64_t b = 0; b < g->nbatch; b++) {
    lapack_int info = 0;
    rank = 0;
    memset(x, 0, (size_t)ldb * r * sizeof(T));
    if (m > 0 && n > 0) {
      F(load)(a, m, A, g, b, m, n);
      F(load)(x, ldb, B, g, b, m, r);
      switch (drv) {
        case 0: info = LA(gels)(LAPACK_COL_MAJOR, 'N', m, n, r, a, lda, x, ldb, work, lw); break;
        case 1:
          memset(iw, 0, (size_t)n * sizeof(lapack_int));
          info = LA(gelsy)(LAPACK_COL_MAJOR, m, n, r, a, lda, x, ldb, iw, rc, &rank, work, lw);
          break;
        case 2: info = LA(gelsd)(LAPACK_COL_MAJOR, m, n, r, a, lda, x, ldb, s, rc, &rank, work, lw, iw); break;
        default: info = LA(gelss)(LAPACK_COL_MAJOR, m, n, r, a, lda, x, ldb, s, rc, &rank, work, lw); break;
      }
      if (info > 0) {
        if (drv == 0)
          snprintf(err, errlen, "torch.linalg.lstsq: The least squares solution could not be computed because the "
                                "input matrix does not have full rank (error code: %d).", (int)info);
        else
          snprintf(err, errlen, "torch.linalg.lstsq: The algorithm failed to converge because the input matrix is "
                                "ill-conditioned or has too many repeated singular values (error code: %d).", (int)info);
        return TPURT_ERR_KERNEL;
      }
    }
    F(store)(X, g, b, x, ldb, mx, r);
    if (la_present(RK)) *(int64_t *)la_ptr(RK, g, b) = rank;
    if (la_present(S) && (drv == 2 || drv == 3)) F(vstore)(S, g, b, s, k);
  }
  return TPURT_OK;
}

/* --------------------------------------------------------- matrix exp */
/* exp(A) by scaling and squaring with a degree-[8/8] Pade approximant:
 * N = sum c_j X^j, D = sum (-1)^j c_j X^j, exp(X) ~ D^-1 N, X = A / 2^s
 * with ||X||_1 <= 1/2, then squared s times. */
static tpurt_status F(matrix_exp)(la_args *g, char *err, size_t errlen) {
  (void)err, (void)errlen;
  const tpurt_view *A = &g->in[0], *E = &g->out[0];
  int64_t n = A->sizes[g->nb];
  if (n == 0) return TPURT_OK;
  size_t sz = (size_t)n * n;
  T *x = tpurt__scratch(0, sz * 7 * sizeof(T));
  T *p = x + sz, *num = x + 2 * sz, *den = x + 3 * sz, *t = x + 4 * sz, *u = x + 5 * sz, *v = x + 6 * sz;
  lapack_int *ip = tpurt__scratch(1, (size_t)n * sizeof(lapack_int));
  enum { Q = 8 };
  double c[Q + 1];
  c[0] = 1;
  for (int j = 1; j <= Q; j++) c[j] = c[j - 1] * (double)(Q - j + 1) / (double)(j * (2 * Q - j + 1));
  for (int64_t b = 0; b < g->nbatch; b++) {
    F(load)(x, n, A, g, b, n, n);
    double nrm = 0;
    for (int64_t j = 0; j < n; j++) {
      double cs = 0;
      for (int64_t i = 0; i < n; i++) cs += fabs((double)x[i + j * n]);
      if (cs > nrm || isnan(cs)) nrm = cs;
    }
    int sq = 0;
    if (isfinite(nrm) && nrm > 0.5) sq = (int)ceil(log2(nrm / 0.5));
    if (sq > 1000) sq = 1000;
    T scale = (T)ldexp(1.0, -sq);
    for (size_t i = 0; i < sz; i++) x[i] *= scale;
    /* p = X^j accumulated; num = sum c_j p, den = sum (-1)^j c_j p */
    memset(num, 0, sz * sizeof(T));
    memset(den, 0, sz * sizeof(T));
    memset(p, 0, sz * sizeof(T));
    for (int64_t i = 0; i < n; i++) p[i + i * n] = 1;
    for (int j = 0; j <= Q; j++) {
      if (j > 0) {
        CB(gemm)(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, (T)1, p, (int)n, x, (int)n, (T)0, t,
                 (int)n);
        memcpy(p, t, sz * sizeof(T));
      }
      T cj = (T)c[j], dj = (T)((j & 1) ? -c[j] : c[j]);
      for (size_t i = 0; i < sz; i++) num[i] += cj * p[i], den[i] += dj * p[i];
    }
    LA(getrf)(LAPACK_COL_MAJOR, (int)n, (int)n, den, (int)n, ip);
    LA(getrs)(LAPACK_COL_MAJOR, 'N', (int)n, (int)n, den, (int)n, ip, num, (int)n);
    for (int s2 = 0; s2 < sq; s2++) {
      CB(gemm)(CblasColMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, (T)1, num, (int)n, num, (int)n, (T)0,
               u, (int)n);
      memcpy(num, u, sz * sizeof(T));
    }
    (void)v;
    F(store)(E, g, b, num, n, n, n);
  }
  return TPURT_OK;
}
