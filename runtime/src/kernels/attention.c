/*
 * attention.c — fused scaled dot-product attention (forward and backward).
 *
 * Forward (flash-attention style): the work items are (batch, head, block of
 * BQ query rows; BQ / 2 for a short causal attention, see query_rows). An item walks the keys in blocks of BK: scores
 * S = scale * Q K^T (+ bias, causal mask) for the tile, an online softmax
 * keeps the running row maximum m and the running sum l of exp(S - m), and
 * the output accumulator O (f32) is rescaled whenever m grows. Dropout is
 * applied to the probabilities after the normalisation statistics (as
 * softmax-then-dropout does). At the end O /= l and the log-sum-exp
 * lse = m + log(l) of every row is stored for the backward.
 *
 * Backward: the work items are (batch, key/value head). An item owns the
 * f32 accumulators dK, dV of its head (shared by the query heads of a GQA
 * group) and a dQ accumulator per query block, so no two threads ever write
 * the same output. P is recomputed from lse (P = exp(S - lse)), then
 *   dV += Pd^T dO, dP = (dO V^T) * Z, dS = P * (dP - D), D = rowsum(dO * O),
 *   dK += scale dS^T Q, dQ += scale dS K
 * with Z the dropout keep mask scaled by 1 / (1 - p) and Pd = P * Z.
 *
 * Tiles are multiplied by the library GEMM (tpurt__sgemm) on f32 data: f32
 * operands whose rows are unit-stride are used in place, anything else
 * (f16/bf16, general strides, broadcasts) is converted into per-thread
 * scratch. exp is a polynomial the compiler vectorizes.
 *
 * Dropout keep mask: element (bh, i, j) (bh = batch * H + head) is kept iff
 * u >= p, u = the 24-bit uniform of word j % 4 of the Philox block
 * offset + (bh * L + i) * ceil(S / 4) + j / 4 under key seed.
 *
 * Rows whose keys are all masked give 0 (output and gradients), like
 * PyTorch's CPU kernels.
 */
#include "gemm_internal.h"
#include "kcommon.h"
#include "vmath.h"

#define BQ 64
#define BK 128

/* ------------------------------------------------------------ helpers */

/* Vector helpers (GCC vector extensions): one register of the widest
 * float vectors the build targets — 16 lanes with AVX-512, else 8. */
#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif
typedef float vecf __attribute__((vector_size(4 * VW)));
typedef int32_t veci __attribute__((vector_size(4 * VW)));
static inline vecf vec_load(const float *p) {
  vecf v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void vec_store(float *p, vecf v) { memcpy(p, &v, sizeof v); }
static inline vecf vec_splat(float x) { return (vecf){} + x; }
static inline vecf vec_sel(veci m, vecf a, vecf b) { return (vecf)(((veci)a & m) | ((veci)b & ~m)); }
static inline vecf vec_exp(vecf x) {
  veci lo = x < vec_splat(-87.0f), hi = x > vec_splat(88.0f);
  vecf xc = vec_sel(lo, vec_splat(-87.0f), vec_sel(hi, vec_splat(88.0f), x));
  vecf magic = vec_splat(12582912.0f);
  vecf t = xc * vec_splat(1.44269504088896341f) + magic;
  vecf n = t - magic;
  vecf r = xc - n * vec_splat(0.693145751953125f);
  r = r - n * vec_splat(1.428606765330187045e-06f);
  vecf p = vec_splat(1.0f / 720.0f);
  p = p * r + vec_splat(1.0f / 120.0f);
  p = p * r + vec_splat(1.0f / 24.0f);
  p = p * r + vec_splat(1.0f / 6.0f);
  p = p * r + vec_splat(0.5f);
  p = p * r + vec_splat(1.0f);
  p = p * r + vec_splat(1.0f);
  veci e = (((veci)t - 0x4B400000) + 127) << 23;
  return vec_sel(lo, vec_splat(0.0f), p * (vecf)e);
}

/* s[c] = exp(s[c] - m); returns the sum. */
static float exp_row(float *restrict s, int64_t n, float m) {
  vecf acc = vec_splat(0.0f), mv = vec_splat(m);
  int64_t c = 0;
  for (; c + VW <= n; c += VW) {
    vecf e = vec_exp(vec_load(s + c) - mv);
    vec_store(s + c, e);
    acc += e;
  }
  float sum = 0;
  for (; c < n; c++) {
    float e = tpurt__vexpf(s[c] - m);
    s[c] = e;
    sum += e;
  }
  for (int k = 0; k < VW; k++) sum += acc[k];
  return sum;
}

static float max_row(const float *restrict s, int64_t n, float m) {
  vecf acc = vec_splat(m);
  int64_t c = 0;
  for (; c + VW <= n; c += VW) {
    vecf v = vec_load(s + c);
    acc = vec_sel(v > acc, v, acc);
  }
  for (; c < n; c++) m = s[c] > m ? s[c] : m;
  for (int k = 0; k < VW; k++) m = acc[k] > m ? acc[k] : m;
  return m;
}

/* n elements of dtype dt (f32/f16/bf16) at p with element stride cs -> f32 */
static void load_f32(float *restrict d, const char *p, tpurt_dtype dt, int64_t cs, int64_t n) {
  if (dt == TPURT_F32) {
    const float *s = (const float *)p;
    if (cs == 1)
      memcpy(d, s, (size_t)n * 4);
    else
      for (int64_t j = 0; j < n; j++) d[j] = s[j * cs];
  } else if (dt == TPURT_BF16) {
    const uint16_t *s = (const uint16_t *)p;
    for (int64_t j = 0; j < n; j++) d[j] = tpurt__bf16_to_f32(s[j * cs]);
  } else {
    const uint16_t *s = (const uint16_t *)p;
    for (int64_t j = 0; j < n; j++) d[j] = tpurt__f16_to_f32(s[j * cs]);
  }
}

static void store_f32(char *p, tpurt_dtype dt, int64_t cs, const float *restrict x, int64_t n, float mul) {
  if (dt == TPURT_F32) {
    float *d = (float *)p;
    for (int64_t j = 0; j < n; j++) d[j * cs] = x[j] * mul;
  } else if (dt == TPURT_BF16) {
    uint16_t *d = (uint16_t *)p;
    for (int64_t j = 0; j < n; j++) d[j * cs] = tpurt__f32_to_bf16(x[j] * mul);
  } else {
    uint16_t *d = (uint16_t *)p;
    for (int64_t j = 0; j < n; j++) d[j * cs] = tpurt__f32_to_f16(x[j] * mul);
  }
}

/* A rows x cols matrix (element strides rs, cs) as f32 rows: in place when
 * it already is (f32, unit column stride), else converted into buf. */
static const float *tile_f32(const char *p, tpurt_dtype dt, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                             float *buf, int64_t *ld) {
  if (dt == TPURT_F32 && (cs == 1 || cols == 1) && (rows == 1 || (rs >= cols && rs <= INT32_MAX))) {
    *ld = rows == 1 ? (cols > 0 ? cols : 1) : rs;
    return (const float *)p;
  }
  size_t es = tpurt_dtype_size(dt);
  for (int64_t r = 0; r < rows; r++) load_f32(buf + r * cols, p + r * rs * (int64_t)es, dt, cs, cols);
  *ld = cols > 0 ? cols : 1;
  return buf;
}

/* Keep factors of row i, columns [j0, j0 + n) (j0 a multiple of 4):
 * z[c] = keep ? scale : 0 (the uniforms are drawn into z first). */
static void dropout_row(float *restrict z, uint64_t seed, uint64_t base, int64_t j0, int64_t n, float p,
                        float scale) {
  tpurt__philox_uniform(seed, base + (uint64_t)(j0 / 4), 0, n, z);
  for (int64_t c = 0; c < n; c++) z[c] = z[c] >= p ? scale : 0.0f;
}

/* ------------------------------------------------------------ arguments */

typedef struct {
  tpurt_view out, lse, q, k, v, mask;                /* forward */
  tpurt_view dq, dk, dv, dmask, dout;                /* backward */
  int has_mask, has_dmask, has_dk, has_dv, has_dq;
  tpurt_attention_params p;
  int64_t B, H, Hk, L, S, D, Dv;
} att_args;

typedef struct {
  const att_args *a;
  _Atomic int oom;
  char *out, *lse, *q, *k, *v, *mask, *dq, *dk, *dv, *dmask, *dout;
  int64_t nqb, bq; /* query blocks of bq rows (see query_rows) */
} att_ctx;

#define P4(v, b, h) ((int64_t)(b) * (v).strides[0] + (int64_t)(h) * (v).strides[1])

/* Adds the bias / mask and the causal mask to the tile rows i0.., cols j0.. */
static void bias_tile(const att_ctx *x, float *s, int64_t ld, int64_t b, int64_t h, int64_t i0, int64_t nr,
                      int64_t j0, int64_t nc) {
  const att_args *a = x->a;
  if (a->has_mask) {
    const tpurt_view *mv = &a->mask;
    size_t es = tpurt_dtype_size(mv->dtype);
    int64_t rs = mv->strides[2], cs = mv->strides[3];
    const char *base = x->mask + (P4(*mv, b, h) + i0 * rs + j0 * cs) * (int64_t)es;
    for (int64_t r = 0; r < nr; r++) {
      float *row = s + r * ld;
      const char *mp = base + r * rs * (int64_t)es;
      switch (mv->dtype) {
        case TPURT_BOOL: {
          const uint8_t *m = (const uint8_t *)mp;
          for (int64_t c = 0; c < nc; c++) row[c] = m[c * cs] ? row[c] : -INFINITY;
          break;
        }
        case TPURT_F32: {
          const float *m = (const float *)mp;
          for (int64_t c = 0; c < nc; c++) row[c] += m[c * cs];
          break;
        }
        case TPURT_BF16: {
          const uint16_t *m = (const uint16_t *)mp;
          for (int64_t c = 0; c < nc; c++) row[c] += tpurt__bf16_to_f32(m[c * cs]);
          break;
        }
        case TPURT_F16: {
          const uint16_t *m = (const uint16_t *)mp;
          for (int64_t c = 0; c < nc; c++) row[c] += tpurt__f16_to_f32(m[c * cs]);
          break;
        }
        default: {
          for (int64_t c = 0; c < nc; c++) row[c] += (float)kc_ld(mv->dtype, mp + c * cs * (int64_t)es);
        }
      }
    }
  }
  if (a->p.is_causal && j0 + nc - 1 > i0) {
    for (int64_t r = 0; r < nr; r++) {
      int64_t first = i0 + r + 1 - j0; /* first masked column of the row */
      if (first < 0) first = 0;
      float *row = s + r * ld;
      for (int64_t c = first; c < nc; c++) row[c] = -INFINITY;
    }
  }
}

/* Columns of row i of the tile at key j0 (nc wide) that exp_row and the
 * row loops must cover: all nc, or under the causal mask the visible ones
 * (keys <= i) rounded up to whole vectors. The columns past it are masked
 * (-inf scores, probability 0): skipping them leaves every sum as it was,
 * since exp_row adds a masked column's 0 to its lane (or to its scalar
 * tail, which then holds 0), and the diagonal tiles of a causal attention
 * are half masked. */
static inline int64_t row_cols(const att_args *a, int64_t i, int64_t j0, int64_t nc) {
  if (!a->p.is_causal) return nc;
  int64_t vis = i + 1 - j0;
  if (vis <= 0) return 0;
  vis = (vis + VW - 1) / VW * VW;
  return vis < nc ? vis : nc;
}

/* Key range visible from query rows [i0, i1). */
static inline int64_t key_end(const att_args *a, int64_t i1) {
  if (a->p.is_causal) return i1 < a->S ? i1 : a->S;
  return a->S;
}

/* ------------------------------------------------------------- forward */

static void fwd_items(void *c, int64_t begin, int64_t end) {
  const att_ctx *x = c;
  const att_args *a = x->a;
  int64_t D = a->D, Dv = a->Dv, S = a->S, L = a->L, grp = a->H / a->Hk;
  float scale = (float)a->p.scale;
  int drop = a->p.dropout_p > 0;
  float dp = (float)a->p.dropout_p, dscale = dp < 1 ? 1.0f / (1.0f - dp) : 0.0f;
  size_t need = (size_t)(BQ * D + BK * D + BK * Dv + BQ * BK + BQ * Dv + BK + 2 * BQ) * 4;
  float *buf = tpurt__scratch(0, need);
  if (!buf) {
    atomic_store(&((att_ctx *)c)->oom, 1);
    return;
  }
  float *qb = buf, *kb = qb + BQ * D, *vb = kb + BK * D, *sb = vb + BK * Dv, *ob = sb + BQ * BK, *zb = ob + BQ * Dv;
  float *mrow = zb + BK, *lrow = mrow + BQ;
  size_t qes = tpurt_dtype_size(a->q.dtype), kes = tpurt_dtype_size(a->k.dtype), ves = tpurt_dtype_size(a->v.dtype);
  size_t oes = tpurt_dtype_size(a->out.dtype);
  for (int64_t it = begin; it < end; it++) {
    int64_t qbk = it % x->nqb, bh = it / x->nqb, h = bh % a->H, b = bh / a->H, hk = h / grp;
    int64_t i0 = qbk * x->bq, nr = L - i0 < x->bq ? L - i0 : x->bq;
    int64_t lq;
    const float *Q = tile_f32(x->q + (P4(a->q, b, h) + i0 * a->q.strides[2]) * (int64_t)qes, a->q.dtype, nr, D,
                              a->q.strides[2], a->q.strides[3], qb, &lq);
    for (int64_t r = 0; r < nr; r++) {
      mrow[r] = -INFINITY;
      lrow[r] = 0;
    }
    memset(ob, 0, (size_t)(nr * Dv) * 4);
    int64_t kend = key_end(a, i0 + nr);
    const char *kbase = x->k + P4(a->k, b, hk) * (int64_t)kes, *vbase = x->v + P4(a->v, b, hk) * (int64_t)ves;
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
      int64_t nc = kend - j0 < BK ? kend - j0 : BK, lk, lv;
      const float *K = tile_f32(kbase + j0 * a->k.strides[2] * (int64_t)kes, a->k.dtype, nc, D, a->k.strides[2],
                                a->k.strides[3], kb, &lk);
      tpurt__sgemm(0, 1, nr, nc, D, scale, Q, lq, K, lk, 0.0f, sb, BK, a->p.precision);
      bias_tile(x, sb, BK, b, h, i0, nr, j0, nc);
      int any = 0;
      for (int64_t r = 0; r < nr; r++) {
        float *row = sb + r * BK;
        int64_t ncr = row_cols(a, i0 + r, j0, nc);
        float mo = mrow[r], mn = max_row(row, ncr, mo);
        if (mn == -INFINITY) { /* nothing visible yet in this row */
          memset(row, 0, (size_t)nc * 4);
          continue;
        }
        float alpha = tpurt__vexpf(mo - mn);
        float sum = exp_row(row, ncr, mn);
        memset(row + ncr, 0, (size_t)(nc - ncr) * 4); /* exp of the masked columns */
        lrow[r] = lrow[r] * alpha + sum;
        mrow[r] = mn;
        if (alpha != 1.0f) {
          float *o = ob + r * Dv;
          for (int64_t d = 0; d < Dv; d++) o[d] *= alpha;
        }
        if (drop) { /* (the masked columns hold 0) */
          dropout_row(zb, a->p.seed, a->p.offset + (uint64_t)((bh * L + i0 + r) * ((S + 3) / 4)), j0, ncr, dp,
                      dscale);
          for (int64_t cc = 0; cc < ncr; cc++) row[cc] *= zb[cc];
        }
        any = 1;
      }
      if (!any) continue;
      const float *V = tile_f32(vbase + j0 * a->v.strides[2] * (int64_t)ves, a->v.dtype, nc, Dv, a->v.strides[2],
                                a->v.strides[3], vb, &lv);
      tpurt__sgemm(0, 0, nr, Dv, nc, 1.0f, sb, BK, V, lv, 1.0f, ob, Dv, a->p.precision);
    }
    char *obase = x->out + (P4(a->out, b, h) + i0 * a->out.strides[2]) * (int64_t)oes;
    for (int64_t r = 0; r < nr; r++) {
      float l = lrow[r];
      float inv = l > 0 ? 1.0f / l : 0.0f;
      if (!(l > 0)) memset(ob + r * Dv, 0, (size_t)Dv * 4);
      store_f32(obase + r * a->out.strides[2] * (int64_t)oes, a->out.dtype, a->out.strides[3], ob + r * Dv, Dv, inv);
      if (x->lse) {
        float lse = l > 0 ? mrow[r] + logf(l) : -INFINITY;
        ((float *)x->lse)[P4(a->lse, b, h) + (i0 + r) * a->lse.strides[2]] = lse;
      }
    }
  }
}

/* ------------------------------------------------------------ backward */

static void bwd_items(void *c, int64_t begin, int64_t end) {
  const att_ctx *x = c;
  const att_args *a = x->a;
  int64_t D = a->D, Dv = a->Dv, S = a->S, L = a->L, grp = a->H / a->Hk;
  float scale = (float)a->p.scale;
  int drop = a->p.dropout_p > 0;
  float dp = (float)a->p.dropout_p, dscale = dp < 1 ? 1.0f / (1.0f - dp) : 0.0f;
  size_t need = (size_t)(S * D + S * Dv + S * D + S * Dv +                /* K, V, dK, dV */
                         BQ * D + BQ * Dv + BQ * D + 3 * BQ * BK + BK + BQ * Dv + 2 * BQ) * 4;
  float *buf = tpurt__scratch(0, need);
  if (!buf) {
    atomic_store(&((att_ctx *)c)->oom, 1);
    return;
  }
  float *kf = buf, *vf = kf + S * D, *dkacc = vf + S * Dv, *dvacc = dkacc + S * D, *qb = dvacc + S * Dv;
  float *dob = qb + BQ * D, *dqacc = dob + BQ * Dv, *sb = dqacc + BQ * D, *dpb = sb + BQ * BK, *pdb = dpb + BQ * BK;
  float *zb = pdb + BQ * BK, *ob = zb + BK, *lse = ob + BQ * Dv, *drow = lse + BQ;
  size_t qes = tpurt_dtype_size(a->q.dtype), kes = tpurt_dtype_size(a->k.dtype), ves = tpurt_dtype_size(a->v.dtype);
  size_t oes = tpurt_dtype_size(a->out.dtype), does = tpurt_dtype_size(a->dout.dtype);
  for (int64_t it = begin; it < end; it++) {
    int64_t hk = it % a->Hk, b = it / a->Hk;
    int64_t lk, lv;
    const float *K = tile_f32(x->k + P4(a->k, b, hk) * (int64_t)kes, a->k.dtype, S, D, a->k.strides[2],
                              a->k.strides[3], kf, &lk);
    const float *V = tile_f32(x->v + P4(a->v, b, hk) * (int64_t)ves, a->v.dtype, S, Dv, a->v.strides[2],
                              a->v.strides[3], vf, &lv);
    memset(dkacc, 0, (size_t)(S * D) * 4);
    memset(dvacc, 0, (size_t)(S * Dv) * 4);
    for (int64_t h = hk * grp; h < (hk + 1) * grp; h++) {
      int64_t bh = b * a->H + h;
      for (int64_t i0 = 0; i0 < L; i0 += x->bq) {
        int64_t nr = L - i0 < x->bq ? L - i0 : x->bq, lq, ldo;
        const float *Q = tile_f32(x->q + (P4(a->q, b, h) + i0 * a->q.strides[2]) * (int64_t)qes, a->q.dtype, nr, D,
                                  a->q.strides[2], a->q.strides[3], qb, &lq);
        const float *dO = tile_f32(x->dout + (P4(a->dout, b, h) + i0 * a->dout.strides[2]) * (int64_t)does,
                                   a->dout.dtype, nr, Dv, a->dout.strides[2], a->dout.strides[3], dob, &ldo);
        /* D_i = dO_i . O_i, lse_i */
        for (int64_t r = 0; r < nr; r++) {
          int64_t lo;
          const float *o = tile_f32(x->out + (P4(a->out, b, h) + (i0 + r) * a->out.strides[2]) * (int64_t)oes,
                                    a->out.dtype, 1, Dv, a->out.strides[2], a->out.strides[3], ob, &lo);
          const float *g = dO + r * ldo;
          float acc = 0;
          for (int64_t d = 0; d < Dv; d++) acc += g[d] * o[d];
          drow[r] = acc;
          lse[r] = ((const float *)x->lse)[P4(a->lse, b, h) + (i0 + r) * a->lse.strides[2]];
        }
        memset(dqacc, 0, (size_t)(nr * D) * 4);
        int64_t kend = key_end(a, i0 + nr);
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
          int64_t nc = kend - j0 < BK ? kend - j0 : BK;
          const float *Kj = K + j0 * lk, *Vj = V + j0 * lv;
          tpurt__sgemm(0, 1, nr, nc, D, scale, Q, lq, Kj, lk, 0.0f, sb, BK, a->p.precision);
          bias_tile(x, sb, BK, b, h, i0, nr, j0, nc);
          tpurt__sgemm(0, 1, nr, nc, Dv, 1.0f, dO, ldo, Vj, lv, 0.0f, dpb, BK, a->p.precision);
          for (int64_t r = 0; r < nr; r++) {
            float *s = sb + r * BK, *dpr = dpb + r * BK, *pd = pdb + r * BK;
            float l = lse[r], dd = drow[r];
            if (l == -INFINITY) {
              memset(s, 0, (size_t)nc * 4);
              memset(pd, 0, (size_t)nc * 4);
              continue;
            }
            int64_t ncr = row_cols(a, i0 + r, j0, nc);
            exp_row(s, ncr, l); /* P */
            if (drop) {
              dropout_row(zb, a->p.seed, a->p.offset + (uint64_t)((bh * L + i0 + r) * ((S + 3) / 4)), j0, ncr, dp,
                          dscale);
              for (int64_t cc = 0; cc < ncr; cc++) {
                pd[cc] = s[cc] * zb[cc];
                s[cc] = s[cc] * (dpr[cc] * zb[cc] - dd); /* dS */
              }
            } else {
              for (int64_t cc = 0; cc < ncr; cc++) {
                pd[cc] = s[cc];
                s[cc] = s[cc] * (dpr[cc] - dd);
              }
            }
            memset(s + ncr, 0, (size_t)(nc - ncr) * 4); /* masked: P = 0, dS = 0 */
            memset(pd + ncr, 0, (size_t)(nc - ncr) * 4);
          }
          /* dV_j += Pd^T dO_i ; dK_j += scale dS^T Q_i ; dQ_i += scale dS K_j */
          tpurt__sgemm(1, 0, nc, Dv, nr, 1.0f, pdb, BK, dO, ldo, 1.0f, dvacc + j0 * Dv, Dv, a->p.precision);
          tpurt__sgemm(1, 0, nc, D, nr, scale, sb, BK, Q, lq, 1.0f, dkacc + j0 * D, D, a->p.precision);
          tpurt__sgemm(0, 0, nr, D, nc, scale, sb, BK, Kj, lk, 1.0f, dqacc, D, a->p.precision);
          if (x->dmask) {
            const tpurt_view *mv = &a->dmask;
            size_t es = tpurt_dtype_size(mv->dtype);
            for (int64_t r = 0; r < nr; r++)
              store_f32(x->dmask + (P4(*mv, b, h) + (i0 + r) * mv->strides[2] + j0 * mv->strides[3]) * (int64_t)es,
                        mv->dtype, mv->strides[3], sb + r * BK, nc, 1.0f);
          }
        }
        if (x->dq) {
          size_t es = tpurt_dtype_size(a->dq.dtype);
          for (int64_t r = 0; r < nr; r++)
            store_f32(x->dq + (P4(a->dq, b, h) + (i0 + r) * a->dq.strides[2]) * (int64_t)es, a->dq.dtype,
                      a->dq.strides[3], dqacc + r * D, D, 1.0f);
        }
      }
    }
    if (x->dk) {
      size_t es = tpurt_dtype_size(a->dk.dtype);
      for (int64_t j = 0; j < S; j++)
        store_f32(x->dk + (P4(a->dk, b, hk) + j * a->dk.strides[2]) * (int64_t)es, a->dk.dtype, a->dk.strides[3],
                  dkacc + j * D, D, 1.0f);
    }
    if (x->dv) {
      size_t es = tpurt_dtype_size(a->dv.dtype);
      for (int64_t j = 0; j < S; j++)
        store_f32(x->dv + (P4(a->dv, b, hk) + j * a->dv.strides[2]) * (int64_t)es, a->dv.dtype, a->dv.strides[3],
                  dvacc + j * Dv, Dv, 1.0f);
    }
  }
}

/* ------------------------------------------------------------- kernels */

static char *hv(const tpurt_view *v, int on) { return on && v->ptr ? tpurt__host_view(v->ptr) : NULL; }

static tpurt_status oom_status(att_ctx *x, char *err, size_t errlen) {
  if (!atomic_load(&x->oom)) return TPURT_OK;
  snprintf(err, errlen, "out of host memory for the attention work buffers");
  return TPURT_ERR_OUT_OF_MEMORY;
}

/* Items a pool task takes at least: ATT_MIN_MACS of products each. A
 * decode step's attention (one query row, 8 heads of 32 over 64 keys: 32K
 * multiply-adds in all) ran 7.8 us a call split over two threads against
 * 1.5 us on one (Zen 5, compiled Llama decode): the helper's wake-up and
 * the wait for it cost more than the work. */
#define ATT_MIN_MACS (1 << 16)
static int64_t att_grain(int64_t macs_per_item) {
  return macs_per_item >= ATT_MIN_MACS ? 1 : ATT_MIN_MACS / (macs_per_item > 0 ? macs_per_item : 1) + 1;
}

/* Query rows a block: BQ, or BQ / 2 for a causal attention of at most BQ
 * queries, whose key range ends at the block's last row (key_end): the
 * first half-block's products then skip its masked keys (a quarter of the
 * multiply-adds). tpurt_bench_ab attention, Zen 3, paired medians of 31
 * (BQ / 2 against BQ): 16 x 4 heads of 64 x 32 forward 1.05x, backward
 * 1.07x; longer sequences lose as much on the smaller products as they
 * skip (256 x 64: 0.99x, 0.97x; 128 x 32: 1.00x, 0.99x). */
static int64_t query_rows(const att_args *a) { return a->p.is_causal && a->L <= BQ ? BQ / 2 : BQ; }

static tpurt_status k_attention(void *p, char *err, size_t errlen) {
  att_args *a = p;
  tpurt__gemm_lib_init();
  int64_t bq = query_rows(a);
  att_ctx x = {a, 0, hv(&a->out, 1), hv(&a->lse, a->lse.ptr != 0), hv(&a->q, 1), hv(&a->k, 1), hv(&a->v, 1),
               hv(&a->mask, a->has_mask), NULL, NULL, NULL, NULL, NULL, (a->L + bq - 1) / bq, bq};
  int64_t items = a->B * a->H * x.nqb, rows = a->L < bq ? a->L : bq;
  tpurt_parallel_for(items, att_grain(rows * a->S * (a->D + a->Dv)), fwd_items, &x);
  tpurt__scratch_trim();
  return oom_status(&x, err, errlen);
}

static tpurt_status k_attention_bwd(void *p, char *err, size_t errlen) {
  att_args *a = p;
  tpurt__gemm_lib_init();
  att_ctx x = {a, 0, hv(&a->out, 1), hv(&a->lse, 1), hv(&a->q, 1), hv(&a->k, 1), hv(&a->v, 1),
               hv(&a->mask, a->has_mask), hv(&a->dq, a->has_dq), hv(&a->dk, a->has_dk), hv(&a->dv, a->has_dv),
               hv(&a->dmask, a->has_dmask), hv(&a->dout, 1), 0, query_rows(a)};
  tpurt_parallel_for(a->B * a->Hk, att_grain(2 * (a->H / a->Hk) * a->L * a->S * (a->D + a->Dv)), bwd_items, &x);
  tpurt__scratch_trim();
  return oom_status(&x, err, errlen);
}

/* ------------------------------------------------------------- launch */

static int att_float(tpurt_dtype d) { return d == TPURT_F32 || d == TPURT_F16 || d == TPURT_BF16; }

static tpurt_status chk(int dev, const tpurt_view *v, int ndim, const char *op, const char *what) {
  tpurt_status st = kc_check(dev, v, op, what);
  if (st) return st;
  if (v->ndim != ndim)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must have %d dims, got %d", op, what, ndim, v->ndim);
  return TPURT_OK;
}

static tpurt_status same4(const tpurt_view *v, int64_t d0, int64_t d1, int64_t d2, int64_t d3, const char *op,
                          const char *what) {
  if (v->sizes[0] != d0 || v->sizes[1] != d1 || v->sizes[2] != d2 || v->sizes[3] != d3)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: %s has shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "], expected [%" PRId64
                      ", %" PRId64 ", %" PRId64 ", %" PRId64 "]",
                      op, what, v->sizes[0], v->sizes[1], v->sizes[2], v->sizes[3], d0, d1, d2, d3);
  return TPURT_OK;
}

/* An optional gradient output of shape [d0, d1, d2, d3]: checked, then
 * stored in *dst with *has set. */
static tpurt_status opt_grad(int dev, const tpurt_view *g, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                             const char *op, const char *what, tpurt_view *dst, int *has) {
  if (!g) return TPURT_OK;
  tpurt_status st;
  if ((st = chk(dev, g, 4, op, what)) || (st = same4(g, d0, d1, d2, d3, op, what))) return st;
  *dst = *g;
  *has = 1;
  return TPURT_OK;
}

/* Shared validation of q, k, v, mask; fills the sizes of a. */
static tpurt_status check_qkv(int dev, att_args *a, const tpurt_view *q, const tpurt_view *k, const tpurt_view *v,
                              const tpurt_view *mask, const tpurt_attention_params *p, const char *op) {
  tpurt_status st;
  if (!q || !k || !v || !p) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
  if ((st = chk(dev, q, 4, op, "query")) || (st = chk(dev, k, 4, op, "key")) || (st = chk(dev, v, 4, op, "value")))
    return st;
  if (!att_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: query, key and value must be float32, float16 or bfloat16 of one dtype (got %s, %s, %s)",
                      op, tpurt_dtype_name(q->dtype), tpurt_dtype_name(k->dtype), tpurt_dtype_name(v->dtype));
  a->B = q->sizes[0];
  a->H = q->sizes[1];
  a->L = q->sizes[2];
  a->D = q->sizes[3];
  a->Hk = k->sizes[1];
  a->S = k->sizes[2];
  a->Dv = v->sizes[3];
  if (k->sizes[0] != a->B || v->sizes[0] != a->B || v->sizes[1] != a->Hk || v->sizes[2] != a->S ||
      k->sizes[3] != a->D)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: key [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] and value [%" PRId64 ", %" PRId64
                      ", %" PRId64 ", %" PRId64 "] do not match query [%" PRId64 ", %" PRId64 ", %" PRId64
                      ", %" PRId64 "]",
                      op, k->sizes[0], k->sizes[1], k->sizes[2], k->sizes[3], v->sizes[0], v->sizes[1], v->sizes[2],
                      v->sizes[3], a->B, a->H, a->L, a->D);
  if (a->Hk == 0 ? a->H != 0 : a->H % a->Hk != 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "%s: number of query heads (%" PRId64 ") must be a multiple of the key/value heads (%" PRId64
                      ")",
                      op, a->H, a->Hk);
  if (a->D > 4096 || a->Dv > 4096)
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "%s: head dimension above 4096", op);
  if (!(p->dropout_p >= 0 && p->dropout_p <= 1))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: dropout probability must be in [0, 1]", op);
  if (mask) {
    if ((st = chk(dev, mask, 4, op, "mask"))) return st;
    if ((st = same4(mask, a->B, a->H, a->L, a->S, op, "mask"))) return st;
    if (!att_float(mask->dtype) && mask->dtype != TPURT_BOOL && mask->dtype != TPURT_F64)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: mask must be bool or floating point, got %s", op,
                        tpurt_dtype_name(mask->dtype));
    a->mask = *mask;
    a->has_mask = 1;
  }
  a->q = *q;
  a->k = *k;
  a->v = *v;
  a->p = *p;
  return TPURT_OK;
}

uint64_t tpurt_attention_dropout_blocks(int64_t bh, int64_t L, int64_t S) {
  if (bh <= 0 || L <= 0 || S <= 0) return 0;
  return (uint64_t)bh * (uint64_t)L * (uint64_t)((S + 3) / 4);
}

tpurt_status tpurt_attention(tpurt_stream *s, const tpurt_view *out, const tpurt_view *lse, const tpurt_view *q,
                             const tpurt_view *k, const tpurt_view *v, const tpurt_view *mask,
                             const tpurt_attention_params *p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "scaled_dot_product_attention";
  tpurt_status st;
  if (!out || !q) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(q->ptr)))) return st;
  att_args a;
  memset(&a, 0, sizeof a);
  if ((st = check_qkv(s->dev, &a, q, k, v, mask, p, op))) return st;
  if ((st = chk(s->dev, out, 4, op, "out")) || (st = same4(out, a.B, a.H, a.L, a.Dv, op, "out"))) return st;
  if (out->dtype != q->dtype) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: out must have query's dtype", op);
  if (lse) {
    if ((st = chk(s->dev, lse, 3, op, "logsumexp"))) return st;
    if (lse->dtype != TPURT_F32 || lse->sizes[0] != a.B || lse->sizes[1] != a.H || lse->sizes[2] != a.L)
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: logsumexp must be float32 [B, H, L]", op);
    a.lse = *lse;
  }
  a.out = *out;
  if (kc_numel(out) == 0 && !(lse && kc_numel(lse) > 0)) return TPURT_OK;
  return tpurt_launch(s, "aten::_scaled_dot_product_fused_attention_overrideable", k_attention, &a, sizeof a);
}

tpurt_status tpurt_attention_backward(tpurt_stream *s, const tpurt_view *dq, const tpurt_view *dk,
                                      const tpurt_view *dv, const tpurt_view *dmask, const tpurt_view *dout,
                                      const tpurt_view *q, const tpurt_view *k, const tpurt_view *v,
                                      const tpurt_view *out, const tpurt_view *lse, const tpurt_view *mask,
                                      const tpurt_attention_params *p) {
  TPURT__INIT_OR_RETURN();
  const char *op = "scaled_dot_product_attention_backward";
  tpurt_status st;
  if (!q || !out || !lse || !dout) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: NULL view", op);
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(q->ptr)))) return st;
  att_args a;
  memset(&a, 0, sizeof a);
  if ((st = check_qkv(s->dev, &a, q, k, v, mask, p, op))) return st;
  if ((st = chk(s->dev, out, 4, op, "out")) || (st = same4(out, a.B, a.H, a.L, a.Dv, op, "out")) ||
      (st = chk(s->dev, dout, 4, op, "grad_out")) || (st = same4(dout, a.B, a.H, a.L, a.Dv, op, "grad_out")) ||
      (st = chk(s->dev, lse, 3, op, "logsumexp")))
    return st;
  if (!att_float(out->dtype) || !att_float(dout->dtype) || lse->dtype != TPURT_F32 || lse->sizes[0] != a.B ||
      lse->sizes[1] != a.H || lse->sizes[2] != a.L)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: bad out / grad_out / logsumexp views", op);
  if ((st = opt_grad(s->dev, dq, a.B, a.H, a.L, a.D, op, "grad_query", &a.dq, &a.has_dq)) ||
      (st = opt_grad(s->dev, dk, a.B, a.Hk, a.S, a.D, op, "grad_key", &a.dk, &a.has_dk)) ||
      (st = opt_grad(s->dev, dv, a.B, a.Hk, a.S, a.Dv, op, "grad_value", &a.dv, &a.has_dv)) ||
      (st = opt_grad(s->dev, dmask, a.B, a.H, a.L, a.S, op, "grad_mask", &a.dmask, &a.has_dmask)))
    return st;
  const tpurt_view *outs[4] = {dq, dk, dv, dmask};
  for (int i = 0; i < 4; i++)
    if (outs[i] && !att_float(outs[i]->dtype))
      return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: gradients must be float32, float16 or bfloat16", op);
  a.out = *out;
  a.lse = *lse;
  a.dout = *dout;
  if (a.B * a.Hk == 0) return TPURT_OK;
  return tpurt_launch(s, "aten::_scaled_dot_product_fused_attention_overrideable_backward", k_attention_bwd, &a,
                      sizeof a);
}
