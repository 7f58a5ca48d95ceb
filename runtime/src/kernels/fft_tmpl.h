/*
 * fft_tmpl.h — the precision-dependent part of the FFT (included by fft.c
 * twice: FN(x) = x##_f for float32 / complex64 data, FN(x) = x##_d for
 * float64 / complex128; ST is the stored type, FT the compute type — double
 * in both, so float32 transforms are exact to about one float rounding).
 *
 * Complex lines are held split (real parts, imaginary parts) so the
 * butterfly loops vectorize. A transform of length n is a sequence of
 * Stockham stages (self-sorting, out of place, ping-pong between the line
 * and a scratch line): stage k with radix r, remaining length L = r m and
 * stride s treats the s interleaved sub-sequences x[q + s j] (j < L): for
 * every p < m it takes the r values x[q + s (p + t m)], t < r, applies a
 * radix-r DFT, multiplies output u by w_L^(p u) and stores it at
 * y[q + s (r p + u)]; the next stage sees length m and stride s r. After
 * the last stage (m = 1) the sequence is in natural order.
 */

/* ----------------------------------------------------------- one stage */

/* runs BODY for every (p, q); the s == 1 form keeps p innermost so it vectorizes */
#define FFT_LOOP_PQ(...)                                     \
  do {                                                       \
    if (s == 1) {                                            \
      for (int64_t p = p0; p < p1; p++) {                    \
        const int64_t q = 0;                                 \
        __VA_ARGS__                                          \
      }                                                      \
    } else {                                                 \
      for (int64_t p = p0; p < p1; p++)                      \
        for (int64_t q = q0; q < q1; q++) {                  \
          __VA_ARGS__                                        \
        }                                                    \
    }                                                        \
  } while (0)

/* (ar, ai) * (wr, wi) stored at y[o] */
#define FFT_STW(o, ar_, ai_, wr_, wi_)            \
  do {                                            \
    FT xr_ = (ar_), xi_ = (ai_);                  \
    yr[o] = xr_ * (wr_) - xi_ * (wi_);            \
    yi[o] = xr_ * (wi_) + xi_ * (wr_);            \
  } while (0)

/* The part p0 <= p < p1, q0 <= q < q1 of a stage (the s == 1 form ignores q). */
static void FN(fft_stage)(const fft_stage_t *S, int sign, const FT *restrict xr, const FT *restrict xi,
                          FT *restrict yr, FT *restrict yi, int64_t p0, int64_t p1, int64_t q0, int64_t q1) {
  const int64_t m = S->m, s = S->s;
  const FT *restrict twr = (const FT *)S->twr, *restrict twi = (const FT *)S->twi;
  const FT sg = (FT)sign;
  switch (S->r) {
    case 2:
      FFT_LOOP_PQ({
        int64_t i0 = q + s * p, i1 = i0 + s * m;
        int64_t o0 = q + s * 2 * p, o1 = o0 + s;
        FT ar = xr[i0], ai = xi[i0], br = xr[i1], bi = xi[i1];
        yr[o0] = ar + br;
        yi[o0] = ai + bi;
        FFT_STW(o1, ar - br, ai - bi, twr[p], twi[p]);
      });
      break;
    case 3: {
      const FT c = (FT)0.86602540378443864676 * sg; /* sign * sin(2 pi / 3) */
      FFT_LOOP_PQ({
        int64_t i0 = q + s * p, i1 = i0 + s * m, i2 = i1 + s * m;
        int64_t o0 = q + s * 3 * p, o1 = o0 + s, o2 = o1 + s;
        FT a0r = xr[i0], a0i = xi[i0];
        FT tr = xr[i1] + xr[i2], ti = xi[i1] + xi[i2];
        FT dr = xr[i1] - xr[i2], di = xi[i1] - xi[i2];
        FT mr = a0r - (FT)0.5 * tr, mi = a0i - (FT)0.5 * ti;
        FT nr = -c * di, ni = c * dr; /* i c d */
        yr[o0] = a0r + tr;
        yi[o0] = a0i + ti;
        FFT_STW(o1, mr + nr, mi + ni, twr[p], twi[p]);
        FFT_STW(o2, mr - nr, mi - ni, twr[m + p], twi[m + p]);
      });
      break;
    }
    case 4:
      FFT_LOOP_PQ({
        int64_t i0 = q + s * p, i1 = i0 + s * m, i2 = i1 + s * m, i3 = i2 + s * m;
        int64_t o0 = q + s * 4 * p, o1 = o0 + s, o2 = o1 + s, o3 = o2 + s;
        FT t0r = xr[i0] + xr[i2], t0i = xi[i0] + xi[i2];
        FT t1r = xr[i0] - xr[i2], t1i = xi[i0] - xi[i2];
        FT t2r = xr[i1] + xr[i3], t2i = xi[i1] + xi[i3];
        FT t3r = xr[i1] - xr[i3], t3i = xi[i1] - xi[i3];
        FT ur = -sg * t3i, ui = sg * t3r; /* w_4 t3 = sign i t3 */
        yr[o0] = t0r + t2r;
        yi[o0] = t0i + t2i;
        FFT_STW(o1, t1r + ur, t1i + ui, twr[p], twi[p]);
        FFT_STW(o2, t0r - t2r, t0i - t2i, twr[m + p], twi[m + p]);
        FFT_STW(o3, t1r - ur, t1i - ui, twr[2 * m + p], twi[2 * m + p]);
      });
      break;
    case 5: {
      const FT c1 = (FT)0.30901699437494742410, c2 = (FT)-0.80901699437494742410;
      const FT s1 = (FT)0.95105651629515357212 * sg, s2 = (FT)0.58778525229247312917 * sg;
      FFT_LOOP_PQ({
        int64_t i0 = q + s * p, i1 = i0 + s * m, i2 = i1 + s * m, i3 = i2 + s * m, i4 = i3 + s * m;
        int64_t o0 = q + s * 5 * p, o1 = o0 + s, o2 = o1 + s, o3 = o2 + s, o4 = o3 + s;
        FT a0r = xr[i0], a0i = xi[i0];
        FT t1r = xr[i1] + xr[i4], t1i = xi[i1] + xi[i4];
        FT t2r = xr[i2] + xr[i3], t2i = xi[i2] + xi[i3];
        FT t3r = xr[i1] - xr[i4], t3i = xi[i1] - xi[i4];
        FT t4r = xr[i2] - xr[i3], t4i = xi[i2] - xi[i3];
        FT m1r = a0r + c1 * t1r + c2 * t2r, m1i = a0i + c1 * t1i + c2 * t2i;
        FT m2r = a0r + c2 * t1r + c1 * t2r, m2i = a0i + c2 * t1i + c1 * t2i;
        /* n = i (s1 t3 + s2 t4), i (s2 t3 - s1 t4) */
        FT n1r = -(s1 * t3i + s2 * t4i), n1i = s1 * t3r + s2 * t4r;
        FT n2r = -(s2 * t3i - s1 * t4i), n2i = s2 * t3r - s1 * t4r;
        yr[o0] = a0r + t1r + t2r;
        yi[o0] = a0i + t1i + t2i;
        FFT_STW(o1, m1r + n1r, m1i + n1i, twr[p], twi[p]);
        FFT_STW(o2, m2r + n2r, m2i + n2i, twr[m + p], twi[m + p]);
        FFT_STW(o3, m2r - n2r, m2i - n2i, twr[2 * m + p], twi[2 * m + p]);
        FFT_STW(o4, m1r - n1r, m1i - n1i, twr[3 * m + p], twi[3 * m + p]);
      });
      break;
    }
    default: { /* any small prime: direct DFT of the r values */
      const int r = S->r;
      const FT *gr = (const FT *)S->gr, *gi = (const FT *)S->gi;
      FT ar[FFT_MAX_RADIX], ai[FFT_MAX_RADIX];
      for (int64_t p = p0; p < p1; p++)
        for (int64_t q = (s == 1 ? 0 : q0); q < (s == 1 ? 1 : q1); q++) {
          for (int t = 0; t < r; t++) {
            ar[t] = xr[q + s * (p + t * m)];
            ai[t] = xi[q + s * (p + t * m)];
          }
          int64_t o = q + s * r * p;
          for (int u = 0; u < r; u++) {
            FT sr = 0, si = 0;
            int k = 0;
            for (int t = 0; t < r; t++) {
              sr += ar[t] * gr[k] - ai[t] * gi[k];
              si += ar[t] * gi[k] + ai[t] * gr[k];
              k += u;
              if (k >= r) k -= r;
            }
            if (u == 0) {
              yr[o] = sr;
              yi[o] = si;
            } else {
              FFT_STW(o + s * u, sr, si, twr[(u - 1) * m + p], twi[(u - 1) * m + p]);
            }
          }
        }
    }
  }
}
#undef FFT_LOOP_PQ
#undef FFT_STW

typedef struct {
  const fft_stage_t *S;
  int sign;
  const FT *xr, *xi;
  FT *yr, *yi;
} FN(fft_stage_ctx);
static void FN(fft_stage_p)(void *c, int64_t b, int64_t e) {
  FN(fft_stage_ctx) *x = c;
  FN(fft_stage)(x->S, x->sign, x->xr, x->xi, x->yr, x->yi, b, e, 0, x->S->s);
}
static void FN(fft_stage_q)(void *c, int64_t b, int64_t e) {
  FN(fft_stage_ctx) *x = c;
  FN(fft_stage)(x->S, x->sign, x->xr, x->xi, x->yr, x->yi, 0, x->S->m, b, e);
}

/* ------------------------------------------------------ complex lines */

/* In-place transform of (xr, xi) (length p->n); w: p->scratch elements. */
static void FN(fft_c2c)(const fft_plan *p, FT *restrict xr, FT *restrict xi, FT *restrict w) {
  const int64_t n = p->n;
  if (n <= 1) return;
  if (p->blue) {
    /* Bluestein: x_k = c_k sum_j (x_j c_j) conj(c_(k-j)), a circular
     * convolution of length M evaluated with the power-of-two sub-plan;
     * B = FFT(conj(c)) / M is precomputed. The inverse FFT of the product
     * is conj(FFT(conj(.))). */
    const int64_t M = p->bm;
    FT *Ar = w, *Ai = w + M, *ws = w + 2 * M;
    const FT *cr = (const FT *)p->cr, *ci = (const FT *)p->ci;
    const FT *Br = (const FT *)p->br, *Bi = (const FT *)p->bi;
    for (int64_t j = 0; j < n; j++) {
      Ar[j] = xr[j] * cr[j] - xi[j] * ci[j];
      Ai[j] = xr[j] * ci[j] + xi[j] * cr[j];
    }
    for (int64_t j = n; j < M; j++) Ar[j] = Ai[j] = 0;
    FN(fft_c2c)(p->sub, Ar, Ai, ws);
    for (int64_t k = 0; k < M; k++) {
      FT r = Ar[k] * Br[k] - Ai[k] * Bi[k];
      FT i = Ar[k] * Bi[k] + Ai[k] * Br[k];
      Ar[k] = r;
      Ai[k] = -i;
    }
    FN(fft_c2c)(p->sub, Ar, Ai, ws);
    for (int64_t k = 0; k < n; k++) { /* x_k = c_k conj(A_k) */
      FT r = Ar[k], i = -Ai[k];
      xr[k] = r * cr[k] - i * ci[k];
      xi[k] = r * ci[k] + i * cr[k];
    }
    return;
  }
  FT *ar = xr, *ai = xi, *br = w, *bi = w + n;
  for (int k = 0; k < p->nst; k++) {
    const fft_stage_t *S = &p->st[k];
    if (n >= FFT_PAR_MIN) { /* long line: the stage is split over the pool (inline when nested) */
      FN(fft_stage_ctx) c = {S, p->sign, ar, ai, br, bi};
      int by_p = S->s == 1 || S->m >= 64;
      tpurt_parallel_for(by_p ? S->m : S->s, by_p ? 1 + 4096 / S->s : 4096, by_p ? FN(fft_stage_p) : FN(fft_stage_q), &c);
    } else {
      FN(fft_stage)(S, p->sign, ar, ai, br, bi, 0, S->m, 0, S->s);
    }
    FT *t = ar;
    ar = br;
    br = t;
    t = ai;
    ai = bi;
    bi = t;
  }
  if (ar != xr) {
    memcpy(xr, ar, (size_t)n * sizeof(FT));
    memcpy(xi, ai, (size_t)n * sizeof(FT));
  }
}

/* ---------------------------------------------------------- real lines */

/* Forward transform of the real line x (length n, preserved only when n is
 * odd) into X_k, k <= n / 2 (outr/outi). p: real plan of n, sign -1. */
static void FN(fft_r2c)(const fft_plan *p, const FT *restrict x, FT *restrict outr, FT *restrict outi,
                        FT *restrict w) {
  const int64_t n = p->n;
  if (n & 1) {
    FT *zr = w, *zi = w + n;
    for (int64_t j = 0; j < n; j++) {
      zr[j] = x[j];
      zi[j] = 0;
    }
    FN(fft_c2c)(p->full, zr, zi, w + 2 * n);
    for (int64_t k = 0; k <= n / 2; k++) {
      outr[k] = zr[k];
      outi[k] = zi[k];
    }
    return;
  }
  /* even n = 2h: z_j = x_2j + i x_2j+1, Z = FFT_h(z); with E, O the
   * transforms of the even / odd samples, X_k = E_k + w_n^k O_k where
   * E_k = (Z_k + conj Z_(h-k)) / 2, O_k = (Z_k - conj Z_(h-k)) / 2i. */
  const int64_t h = n / 2;
  FT *zr = w, *zi = w + h;
  for (int64_t j = 0; j < h; j++) {
    zr[j] = x[2 * j];
    zi[j] = x[2 * j + 1];
  }
  FN(fft_c2c)(p->half, zr, zi, w + 2 * h);
  const FT *rr = (const FT *)p->rr, *ri = (const FT *)p->ri;
  for (int64_t k = 0; k <= h; k++) {
    int64_t a = k == h ? 0 : k, b = k == 0 ? 0 : h - k;
    FT Zr = zr[a], Zi = zi[a], Cr = zr[b], Ci = -zi[b];
    FT Er = (FT)0.5 * (Zr + Cr), Ei = (FT)0.5 * (Zi + Ci);
    FT Or = (FT)0.5 * (Zi - Ci), Oi = (FT)-0.5 * (Zr - Cr);
    outr[k] = Er + Or * rr[k] - Oi * ri[k];
    outi[k] = Ei + Or * ri[k] + Oi * rr[k];
  }
}

/* Inverse (unnormalized) transform of the Hermitian half spectrum X_k,
 * k <= n / 2 (inr/ini, overwritten; the imaginary parts of X_0 and, for
 * even n, X_(n/2) are ignored) into the real line x of length n.
 * p: real plan of n, sign +1. */
static void FN(fft_c2r)(const fft_plan *p, FT *restrict inr, FT *restrict ini, FT *restrict x, FT *restrict w) {
  const int64_t n = p->n;
  ini[0] = 0;
  if (n & 1) {
    FT *zr = w, *zi = w + n;
    zr[0] = inr[0];
    zi[0] = 0;
    for (int64_t k = 1; k <= n / 2; k++) {
      zr[k] = zr[n - k] = inr[k];
      zi[k] = ini[k];
      zi[n - k] = -ini[k];
    }
    FN(fft_c2c)(p->full, zr, zi, w + 2 * n);
    for (int64_t j = 0; j < n; j++) x[j] = zr[j];
    return;
  }
  /* even n = 2h: Z_k = 2 E_k + 2i O_k with 2 E_k = X_k + conj X_(h-k),
   * 2 O_k = (X_k - conj X_(h-k)) w_n^-k; IFFT_h(Z) interleaves the samples. */
  const int64_t h = n / 2;
  ini[h] = 0;
  FT *zr = w, *zi = w + h;
  const FT *rr = (const FT *)p->rr, *ri = (const FT *)p->ri;
  for (int64_t k = 0; k < h; k++) {
    FT Ar = inr[k], Ai = ini[k], Cr = inr[h - k], Ci = -ini[h - k];
    FT Er = Ar + Cr, Ei = Ai + Ci, Dr = Ar - Cr, Di = Ai - Ci;
    FT Or = Dr * rr[k] - Di * ri[k], Oi = Dr * ri[k] + Di * rr[k];
    zr[k] = Er - Oi;
    zi[k] = Ei + Or;
  }
  FN(fft_c2c)(p->half, zr, zi, w + 2 * h);
  for (int64_t j = 0; j < h; j++) {
    x[2 * j] = zr[j];
    x[2 * j + 1] = zi[j];
  }
}

/* ------------------------------------------------- a pass over lines */

/* Lines are processed in blocks of up to FFT_BLK lines that are adjacent in
 * memory (consecutive along an outer dim of unit stride in src and dst):
 * element j of the block's lines is then one short contiguous run, so the
 * gathers and scatters of strided lines use whole cache lines. */
#define FFT_BLK 8
static void FN(fft_pass_lines)(void *c, int64_t lb, int64_t le) {
  fft_pass *P = c;
  const fft_plan *pl = P->plan;
  const int64_t n = P->n;
  int64_t len = n > P->nsrc ? n : P->nsrc;
  if (P->ndst > len) len = P->ndst;
  len = (len + 2 + 15) / 16 * 16;
  const int64_t ss = P->L.step[0], ds = P->L.step[1];
  int64_t inner = 1; /* lines per run of adjacent lines */
  if (P->L.no > 0 && P->L.ost[0][P->L.no - 1] == 1 && P->L.ost[1][P->L.no - 1] == 1 && (ss != 1 || ds != 1))
    inner = P->L.osz[P->L.no - 1];
  const int bmax = inner > 1 ? FFT_BLK : 1;
  size_t total = (size_t)(3 * len * bmax + pl->scratch + 64);
  FT *buf = aligned_alloc(64, ((total * sizeof(FT)) + 63) / 64 * 64);
  if (!buf) {
    atomic_store(&P->oom, 1);
    return;
  }
  FT *LR = buf, *LI = buf + len * bmax, *LX = buf + 2 * len * bmax, *w = buf + 3 * len * bmax;
  const FT scale = (FT)P->scale;
  const int64_t nh = n / 2 + 1;
  for (int64_t l = lb; l < le;) {
    int64_t cnt = 1;
    if (bmax > 1) {
      cnt = inner - l % inner;
      if (cnt > bmax) cnt = bmax;
      if (cnt > le - l) cnt = le - l;
    }
    int64_t off[2];
    rk_line_offsets(&P->L, l, 2, off);
    if (P->kind == FFT_PASS_C2C) {
      const ST *src = (const ST *)P->src + 2 * off[0];
      ST *dst = (ST *)P->dst + 2 * off[1];
      if (cnt == 1) {
        for (int64_t j = 0; j < n; j++) {
          LR[j] = src[2 * j * ss];
          LI[j] = src[2 * j * ss + 1];
        }
      } else {
        for (int64_t j = 0; j < n; j++)
          for (int64_t b = 0; b < cnt; b++) {
            LR[b * len + j] = src[2 * (j * ss + b)];
            LI[b * len + j] = src[2 * (j * ss + b) + 1];
          }
      }
      for (int64_t b = 0; b < cnt; b++) FN(fft_c2c)(pl, LR + b * len, LI + b * len, w);
      if (cnt == 1) {
        for (int64_t j = 0; j < n; j++) {
          dst[2 * j * ds] = (ST)(LR[j] * scale);
          dst[2 * j * ds + 1] = (ST)(LI[j] * scale);
        }
      } else {
        for (int64_t j = 0; j < n; j++)
          for (int64_t b = 0; b < cnt; b++) {
            dst[2 * (j * ds + b)] = (ST)(LR[b * len + j] * scale);
            dst[2 * (j * ds + b) + 1] = (ST)(LI[b * len + j] * scale);
          }
      }
    } else if (P->kind == FFT_PASS_R2C) {
      const ST *src = (const ST *)P->src + off[0];
      ST *dst = (ST *)P->dst + 2 * off[1];
      int64_t nout = P->ndst;
      if (cnt == 1) {
        for (int64_t j = 0; j < n; j++) LX[j] = src[j * ss];
      } else {
        for (int64_t j = 0; j < n; j++)
          for (int64_t b = 0; b < cnt; b++) LX[b * len + j] = src[j * ss + b];
      }
      for (int64_t b = 0; b < cnt; b++) {
        FT *lr = LR + b * len, *li = LI + b * len;
        FN(fft_r2c)(pl, LX + b * len, lr, li, w);
        for (int64_t k = nh; k < nout; k++) { /* two-sided output: X_(n-k) = conj X_k */
          lr[k] = lr[n - k];
          li[k] = -li[n - k];
        }
      }
      if (cnt == 1) {
        for (int64_t j = 0; j < nout; j++) {
          dst[2 * j * ds] = (ST)(LR[j] * scale);
          dst[2 * j * ds + 1] = (ST)(LI[j] * scale);
        }
      } else {
        for (int64_t j = 0; j < nout; j++)
          for (int64_t b = 0; b < cnt; b++) {
            dst[2 * (j * ds + b)] = (ST)(LR[b * len + j] * scale);
            dst[2 * (j * ds + b) + 1] = (ST)(LI[b * len + j] * scale);
          }
      }
    } else { /* C2R */
      const ST *src = (const ST *)P->src + 2 * off[0];
      ST *dst = (ST *)P->dst + off[1];
      int64_t m = P->nsrc < nh ? P->nsrc : nh;
      if (cnt == 1) {
        for (int64_t j = 0; j < m; j++) {
          LR[j] = src[2 * j * ss];
          LI[j] = src[2 * j * ss + 1];
        }
      } else {
        for (int64_t j = 0; j < m; j++)
          for (int64_t b = 0; b < cnt; b++) {
            LR[b * len + j] = src[2 * (j * ss + b)];
            LI[b * len + j] = src[2 * (j * ss + b) + 1];
          }
      }
      for (int64_t b = 0; b < cnt; b++) {
        FT *lr = LR + b * len, *li = LI + b * len;
        for (int64_t j = m; j < nh; j++) lr[j] = li[j] = 0;
        FN(fft_c2r)(pl, lr, li, LX + b * len, w);
      }
      if (cnt == 1) {
        if (ds == 1)
          for (int64_t j = 0; j < n; j++) dst[j] = (ST)(LX[j] * scale);
        else
          for (int64_t j = 0; j < n; j++) dst[j * ds] = (ST)(LX[j] * scale);
      } else {
        for (int64_t j = 0; j < n; j++)
          for (int64_t b = 0; b < cnt; b++) dst[j * ds + b] = (ST)(LX[b * len + j] * scale);
      }
    }
    l += cnt;
  }
  free(buf);
}
#undef FFT_BLK
