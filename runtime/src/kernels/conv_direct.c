/*
 * conv_direct.c — direct f32 2-D convolution (forward and weight gradient)
 * for few input channels per group: the 7x7/2 stem of ResNets, 1-D
 * convolutions of signals with 1-4 channels, depthwise convolutions.
 *
 * Why not im2col + GEMM there: with C_in = 3 the reduction is only
 * K = 147 long, so the GEMM is a thin product (M = 64, K = 147) fed by a
 * column matrix of 147 x 12544 floats per image (7.4 MB, far outside L2)
 * that im2col writes with strided gathers and the GEMM packs again.
 * Profiled on the ResNet-18 stem (batch 4, fp32): about 40% of the time in
 * im2col and 60% in the GEMM, ~15 ms for 0.94 GFLOP. Here every output tile
 * of MR output channels x NV*8 output columns keeps its accumulators in
 * registers for the whole reduction over (c_in, kh, kw) and reads the input
 * straight from a padded, phase-split copy (below) that stays in L1/L2:
 * no column matrix, no packing, ~2.3x less CPU time on the stem.
 * Tile 4 x 3 vectors (12 accumulators, 3 loads + 4 broadcasts per 12 FMAs)
 * measured ~15% faster than 6 x 2 on the stem. AVX2+FMA tiles (16-lane ones
 * where the CPU has AVX-512) are chosen at run time
 * (tpurt__cpu_has_avx2_fma / _avx512); other CPUs run portable loops with
 * the same summation order.
 *
 * Input preparation: each image row is zero-padded and split into
 * `stride_w` phases (phase q holds padded columns q, q + s, q + 2s, ...),
 * so output column ow of tap kj reads phase (kj*dil) % s at offset
 * ow + (kj*dil) / s: unit stride, one unaligned vector load per 8 outputs
 * whatever the stride and dilation. Padding rows are stored as zero rows,
 * so the kernel has no bounds checks; rows get enough zero slack on the
 * right for the last (partial) tile's vector loads.
 *
 * Deterministic: one thread computes each output element with a fixed
 * summation order (forward: bias, then c_in, kh, kw in order, one fused
 * multiply-add each, padding taps included as zeros).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DC_X86 1
#else
#define DC_X86 0
#endif

#ifndef DC_MR
#define DC_MR 4 /* output channels per register tile (<= 6) */
#endif
#ifndef DC_NV
#define DC_NV 3 /* 8-float vectors of output columns per register tile (<= 3) */
#endif
#define DC_NR (8 * DC_NV)
#define DC_NR_WIDE (16 * DC_NV) /* columns of a 16-lane (AVX-512) tile */

typedef struct {
  const float *planes; /* [N][Ci][Hp][sw][Wq] */
  const float *wp;     /* per group, per oc block: [K][mr] */
  const float *bias;   /* [Co] or NULL */
  float *y;            /* [N][Co][Ho][Wo] */
  int64_t N, Ci, Co, G, Cig, Cog, Ho, Wo, Hp, Wq, kh, kw, sh, sw, dh, dw;
  int64_t nocb;          /* oc blocks per group */
  const int64_t *tapoff; /* [kw]: offset of tap kj inside a padded row's phases */
  int avx2;
  int avx512; /* 16-lane tiles */
} dc_ctx;

/* ------------------------------------------------------------ preparation */

typedef struct {
  const float *x; /* contiguous [N][Ci][H][W] */
  float *planes;
  int64_t Ci, H, W, Hp, Wq, ph, pw, sw;
} prep_ctx;

static void prep_rows(void *c, int64_t r0, int64_t r1) {
  prep_ctx *p = c;
  for (int64_t r = r0; r < r1; r++) { /* r = (n * Ci + ci) * Hp + row */
    int64_t row = r % p->Hp, img = r / p->Hp;
    float *dst = p->planes + r * p->sw * p->Wq;
    int64_t ih = row - p->ph;
    if (ih < 0 || ih >= p->H) {
      memset(dst, 0, sizeof(float) * (size_t)(p->sw * p->Wq));
      continue;
    }
    const float *src = p->x + (img * p->H + ih) * p->W;
    for (int64_t q = 0; q < p->sw; q++) {
      float *d = dst + q * p->Wq;
      /* padded column q + j*sw is input column q + j*sw - pw: zeros, then
       * a (strided) copy of the row, then zeros */
      int64_t lo = p->pw > q ? (p->pw - q + p->sw - 1) / p->sw : 0;
      int64_t hi = (p->W + p->pw - q + p->sw - 1) / p->sw;
      if (lo > p->Wq) lo = p->Wq;
      if (hi > p->Wq) hi = p->Wq;
      if (hi < lo) hi = lo;
      for (int64_t j = 0; j < lo; j++) d[j] = 0.0f;
      const float *sq = src + q - p->pw;
      if (p->sw == 1)
        memcpy(d + lo, sq + lo, sizeof(float) * (size_t)(hi - lo));
      else if (p->sw == 2)
        for (int64_t j = lo; j < hi; j++) d[j] = sq[2 * j];
      else
        for (int64_t j = lo; j < hi; j++) d[j] = sq[j * p->sw];
      for (int64_t j = hi; j < p->Wq; j++) d[j] = 0.0f;
    }
  }
}

/* ---------------------------------------------------------- AVX2 tiles */

#if DC_X86
/* One register tile: MR output channels x NV vectors of output columns,
 * starting at output row oh, column ow0 of image n. MR and NV are
 * compile-time constants of each instantiation (the accumulators live in
 * registers). `full` = all NV*8 columns are inside the row. */
/* The accumulators are named variables (gcc keeps an __m256 array of the
 * same shape on the stack and stores it back every iteration); the
 * `MR > m`, `NV > v` guards fold at compile time. */
#define DC_ACC(m, v) a##m##v
#define DC_FOR_ACC(X)                                                                                  \
  X(0, 0) X(0, 1) X(0, 2) X(1, 0) X(1, 1) X(1, 2) X(2, 0) X(2, 1) X(2, 2) X(3, 0) X(3, 1) X(3, 2) X(4, 0) X(4, 1) \
      X(4, 2) X(5, 0) X(5, 1) X(5, 2)
/* DCV: the register type, DCP(op): its intrinsic (defined around each
 * instantiation below). */
#define DC_DECL(m, v) DCV DC_ACC(m, v) = DCP(setzero_ps)();
#define DC_INIT(m, v) \
  if (TMR > m && TNV > v && bias) DC_ACC(m, v) = DCP(set1_ps)(bias[m]);
#define DC_ROW(m)                                                     \
  if (TMR > m) {                                                      \
    DCV w = DCP(set1_ps)(wp[m]);                                      \
    DC_ACC(m, 0) = DCP(fmadd_ps)(w, b0, DC_ACC(m, 0));                \
    if (TNV > 1) DC_ACC(m, 1) = DCP(fmadd_ps)(w, b1, DC_ACC(m, 1));   \
    if (TNV > 2) DC_ACC(m, 2) = DCP(fmadd_ps)(w, b2, DC_ACC(m, 2));   \
  }
#define DC_STORE(m, v) \
  if (TMR > m && TNV > v) DCP(storeu_ps)((nvalid == TL * TNV ? yo + m * ystride : t + m * TL * TNV) + TL * v, DC_ACC(m, v));

/* One register tile: MR output channels x NV vectors of L output columns,
 * starting at output row oh, column ow0 of image n; columns from nvalid on
 * are computed but not stored. */
#define DC_TILE(NAME, TARGET, L, MR, NV)                                                                     \
  __attribute__((target(TARGET))) static void NAME##_##MR##_##NV(                                            \
      const dc_ctx *c, const float *img, const float *wp, const float *bias, float *yo, int64_t ow0,         \
      int64_t oh, int64_t nvalid) {                                                                          \
    enum { TMR = MR, TNV = NV, TL = L };                                                                     \
    DC_FOR_ACC(DC_DECL)                                                                                      \
    DC_FOR_ACC(DC_INIT)                                                                                      \
    const int64_t rowlen = c->sw * c->Wq, kw = c->kw, rstep = c->dh * rowlen;                                \
    const int64_t *tapoff = c->tapoff;                                                                       \
    for (int64_t ci = 0; ci < c->Cig; ci++) {                                                                \
      const float *rb = img + (ci * c->Hp + oh * c->sh) * rowlen + ow0;                                     \
      for (int64_t ki = 0; ki < c->kh; ki++, rb += rstep) {                                                  \
        for (int64_t kj = 0; kj < kw; kj++, wp += MR) {                                                      \
          const float *b = rb + tapoff[kj];                                                                  \
          DCV b0 = DCP(loadu_ps)(b), b1 = b0, b2 = b0;                                                       \
          if (NV > 1) b1 = DCP(loadu_ps)(b + L);                                                             \
          if (NV > 2) b2 = DCP(loadu_ps)(b + 2 * L);                                                         \
          DC_ROW(0) DC_ROW(1) DC_ROW(2) DC_ROW(3) DC_ROW(4) DC_ROW(5)                                        \
        }                                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
    const int64_t ystride = c->Ho * c->Wo;                                                                   \
    float t[MR * L * NV];                                                                                    \
    DC_FOR_ACC(DC_STORE)                                                                                     \
    if (nvalid != L * NV)                                                                                    \
      for (int m = 0; m < MR; m++) memcpy(yo + m * ystride, t + m * L * NV, sizeof(float) * (size_t)nvalid); \
  }
/* every (MR, NV) up to (6, 3), 8-lane (AVX2) and 16-lane (AVX-512) */
#define DC_TILES(NAME, TARGET, L)                                                                        \
  DC_TILE(NAME, TARGET, L, 1, 1) DC_TILE(NAME, TARGET, L, 1, 2) DC_TILE(NAME, TARGET, L, 1, 3)             \
  DC_TILE(NAME, TARGET, L, 2, 1) DC_TILE(NAME, TARGET, L, 2, 2) DC_TILE(NAME, TARGET, L, 2, 3)             \
  DC_TILE(NAME, TARGET, L, 3, 1) DC_TILE(NAME, TARGET, L, 3, 2) DC_TILE(NAME, TARGET, L, 3, 3)             \
  DC_TILE(NAME, TARGET, L, 4, 1) DC_TILE(NAME, TARGET, L, 4, 2) DC_TILE(NAME, TARGET, L, 4, 3)             \
  DC_TILE(NAME, TARGET, L, 5, 1) DC_TILE(NAME, TARGET, L, 5, 2) DC_TILE(NAME, TARGET, L, 5, 3)             \
  DC_TILE(NAME, TARGET, L, 6, 1) DC_TILE(NAME, TARGET, L, 6, 2) DC_TILE(NAME, TARGET, L, 6, 3)
#define DCV __m256
#define DCP(op) _mm256_##op
DC_TILES(tile_avx, "avx2,fma", 8)
#undef DCV
#undef DCP
#define DCV __m512
#define DCP(op) _mm512_##op
DC_TILES(tile_512, "avx512f", 16)
#undef DCV
#undef DCP

typedef void (*tile_fn)(const dc_ctx *, const float *, const float *, const float *, float *, int64_t, int64_t,
                        int64_t);
#define DC_TABLE(NAME)                                                                       \
  {                                                                                          \
    {NAME##_1_1, NAME##_1_2, NAME##_1_3}, {NAME##_2_1, NAME##_2_2, NAME##_2_3},              \
        {NAME##_3_1, NAME##_3_2, NAME##_3_3}, {NAME##_4_1, NAME##_4_2, NAME##_4_3},          \
        {NAME##_5_1, NAME##_5_2, NAME##_5_3}, {NAME##_6_1, NAME##_6_2, NAME##_6_3},          \
  }
static const tile_fn g_tiles[6][3] = DC_TABLE(tile_avx);
static const tile_fn g_tiles512[6][3] = DC_TABLE(tile_512);
#endif

/* Portable tile (any mr <= DC_MR, nvalid <= DC_NR): plain loops over a
 * local accumulator block, the same summation order as the AVX2 tiles. */
static void tile_portable(const dc_ctx *c, const float *img, const float *wp, const float *bias, float *yo,
                          int64_t ow0, int64_t oh, int64_t nvalid, int mr) {
  float acc[DC_MR][DC_NR];
  for (int m = 0; m < mr; m++)
    for (int j = 0; j < DC_NR; j++) acc[m][j] = bias ? bias[m] : 0.0f;
  const int64_t rowlen = c->sw * c->Wq;
  for (int64_t ci = 0; ci < c->Cig; ci++) {
    const float *plane = img + (ci * c->Hp + oh * c->sh) * rowlen + ow0;
    for (int64_t ki = 0; ki < c->kh; ki++) {
      const float *rb = plane + ki * c->dh * rowlen;
      for (int64_t kj = 0; kj < c->kw; kj++) {
        const float *b = rb + c->tapoff[kj];
        for (int m = 0; m < mr; m++) {
          float w = wp[m];
          for (int64_t j = 0; j < nvalid; j++) acc[m][j] = fmaf(w, b[j], acc[m][j]);
        }
        wp += mr;
      }
    }
  }
  const int64_t ystride = c->Ho * c->Wo;
  for (int m = 0; m < mr; m++) memcpy(yo + m * ystride, acc[m], sizeof(float) * (size_t)nvalid);
}

/* work item u = ((n * G + g) * nocb + ocb) * Ho + oh: one output row of
 * one block of output channels */
static void dc_rows(void *cv, int64_t u0, int64_t u1) {
  const dc_ctx *c = cv;
  int64_t K = c->Cig * c->kh * c->kw;
  for (int64_t u = u0; u < u1; u++) {
    int64_t oh = u % c->Ho, t = u / c->Ho;
    int64_t ocb = t % c->nocb;
    t /= c->nocb;
    int64_t g = t % c->G, n = t / c->G;
    int64_t oc0 = ocb * DC_MR, mr = c->Cog - oc0 < DC_MR ? c->Cog - oc0 : DC_MR;
    int64_t oc = g * c->Cog + oc0;
    const float *img = c->planes + (n * c->Ci + g * c->Cig) * c->Hp * c->sw * c->Wq;
    const float *wp = c->wp + (g * c->Cog + oc0) * K; /* block packed [K][mr] */
    const float *bias = c->bias ? c->bias + oc : NULL;
    float *yrow = c->y + ((n * c->Co + oc) * c->Ho + oh) * c->Wo;
    const int64_t step = c->avx512 ? DC_NR_WIDE : DC_NR;
    for (int64_t ow0 = 0; ow0 < c->Wo; ow0 += step) {
      int64_t nvalid = c->Wo - ow0 < step ? c->Wo - ow0 : step;
#if DC_X86
      if (c->avx2) { /* 16-lane tiles where the CPU has AVX-512 */
        int lanes = c->avx512 ? 16 : 8;
        const tile_fn(*tiles)[3] = c->avx512 ? g_tiles512 : g_tiles;
        tiles[mr - 1][(nvalid + lanes - 1) / lanes - 1](c, img, wp, bias, yrow + ow0, ow0, oh, nvalid);
        continue;
      }
#endif
      tile_portable(c, img, wp, bias, yrow + ow0, ow0, oh, nvalid, (int)mr);
    }
  }
}

/* ------------------------------------------------ weight gradient
 * dw[oc][ci][ki][kj] = sum over n, oh, ow of dy[n][oc][oh][ow] *
 * xpad[n][ci][oh*sh + ki*dh][ow*sw + kj*dw]. Work item (group, block of
 * 4 output channels, image): register tiles of 4 channels x DW_T taps of
 * one (ci, ki) kernel row, 8 output columns per vector lane, reduced over
 * the image's rows; the per-image partial sums are added over the images
 * in order afterwards. Fixed order everywhere: deterministic. */

#define DW_T 2 /* taps per weight-gradient register tile */

typedef struct {
  const float *planes, *dy;
  float *part; /* [N][Co][K] per-image sums */
  int64_t N, Ci, Co, G, Cig, Cog, Ho, Wo, Hp, Wq, kh, kw, sh, sw, dh, dw, nocb;
  const int64_t *tapoff;
  int avx2;
  _Atomic int oom; /* a thread's accumulator buffer could not be allocated */
} dw_ctx;

#if DC_X86
#define DW_ACC(m, t) d##m##t
#define DW_FOR(X) X(0, 0) X(0, 1) X(0, 2) X(1, 0) X(1, 1) X(1, 2) X(2, 0) X(2, 1) X(2, 2) X(3, 0) X(3, 1) X(3, 2)
#define DW_DECL(m, t) __m256 DW_ACC(m, t) = _mm256_setzero_ps();
#define DW_LOAD(m, t) \
  if (TMR > m && TT > t) DW_ACC(m, t) = _mm256_loadu_ps(acc + (m * DW_T + t) * 8);
#define DW_TAP(t)                                                                  \
  if (TT > t) {                                                                    \
    __m256 xv = tail ? _mm256_maskload_ps(xr + tap[t] + j, mask) : _mm256_loadu_ps(xr + tap[t] + j); \
    DW_ACC(0, t) = _mm256_fmadd_ps(y0, xv, DW_ACC(0, t));                          \
    if (TMR > 1) DW_ACC(1, t) = _mm256_fmadd_ps(y1, xv, DW_ACC(1, t));             \
    if (TMR > 2) DW_ACC(2, t) = _mm256_fmadd_ps(y2, xv, DW_ACC(2, t));             \
    if (TMR > 3) DW_ACC(3, t) = _mm256_fmadd_ps(y3, xv, DW_ACC(3, t));             \
  }
#define DW_SAVE(m, t) \
  if (TMR > m && TT > t) _mm256_storeu_ps(acc + (m * DW_T + t) * 8, DW_ACC(m, t));

/* MR channels (rows of dy at dyp, ystride apart) x T taps (offsets tap[])
 * of one kernel row over output rows [oh0, oh1); xrow0 = padded row of
 * output row 0 for that kernel row; the 8-lane partial sums accumulate in
 * acc [MR][DW_T][8]. */
#define DW_TILE(MR, T)                                                                                       \
  __attribute__((target("avx2,fma"))) static void dwtile_##MR##_##T(                                        \
      const dw_ctx *c, const float *dyp, const float *xrow0, const int64_t *tap, float *acc, int64_t oh0,    \
      int64_t oh1) {                                                                                         \
    enum { TMR = MR, TT = T };                                                                               \
    DW_FOR(DW_DECL)                                                                                          \
    DW_FOR(DW_LOAD)                                                                                          \
    const int64_t ystride = c->Ho * c->Wo, xstep = c->sh * c->sw * c->Wq, Wo = c->Wo;                        \
    const int64_t rem = Wo % 8;                                                                              \
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem),                                     \
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));                      \
    for (int64_t oh = oh0; oh < oh1; oh++) {                                                                 \
      const float *yr = dyp + oh * Wo, *xr = xrow0 + oh * xstep;                                             \
      for (int64_t j = 0; j < Wo; j += 8) {                                                                  \
        int tail = j + 8 > Wo;                                                                               \
        __m256 y0, y1 = _mm256_setzero_ps(), y2 = y1, y3 = y1;                                               \
        if (tail) {                                                                                          \
          y0 = _mm256_maskload_ps(yr + j, mask);                                                             \
          if (TMR > 1) y1 = _mm256_maskload_ps(yr + ystride + j, mask);                                      \
          if (TMR > 2) y2 = _mm256_maskload_ps(yr + 2 * ystride + j, mask);                                  \
          if (TMR > 3) y3 = _mm256_maskload_ps(yr + 3 * ystride + j, mask);                                  \
        } else {                                                                                             \
          y0 = _mm256_loadu_ps(yr + j);                                                                      \
          if (TMR > 1) y1 = _mm256_loadu_ps(yr + ystride + j);                                               \
          if (TMR > 2) y2 = _mm256_loadu_ps(yr + 2 * ystride + j);                                           \
          if (TMR > 3) y3 = _mm256_loadu_ps(yr + 3 * ystride + j);                                           \
        }                                                                                                    \
        DW_TAP(0) DW_TAP(1) DW_TAP(2)                                                                        \
      }                                                                                                      \
    }                                                                                                        \
    DW_FOR(DW_SAVE)                                                                                          \
  }
/* 4 x 2 (8 accumulators, 4 + 2 loads per 8 FMAs): a 4 x 3 tile needs 17
 * registers and gcc spills two accumulators through the stack */
DW_TILE(1, 1) DW_TILE(1, 2) DW_TILE(2, 1) DW_TILE(2, 2) DW_TILE(3, 1) DW_TILE(3, 2) DW_TILE(4, 1) DW_TILE(4, 2)
typedef void (*dwtile_fn)(const dw_ctx *, const float *, const float *, const int64_t *, float *, int64_t, int64_t);
static const dwtile_fn g_dwtiles[4][DW_T] = {
    {dwtile_1_1, dwtile_1_2}, {dwtile_2_1, dwtile_2_2}, {dwtile_3_1, dwtile_3_2}, {dwtile_4_1, dwtile_4_2}};
#endif

/* portable: the same lanes (column j adds into lane j % 8) in the same
 * order as the AVX2 tiles */
static void dwtile_portable(const dw_ctx *c, const float *dyp, const float *xrow0, const int64_t *tap, float *acc,
                            int64_t oh0, int64_t oh1, int mr, int nt) {
  const int64_t ystride = c->Ho * c->Wo, xstep = c->sh * c->sw * c->Wq, Wo = c->Wo;
  for (int64_t oh = oh0; oh < oh1; oh++) {
    const float *yr = dyp + oh * Wo, *xr = xrow0 + oh * xstep;
    for (int64_t j = 0; j < Wo; j++)
      for (int t = 0; t < nt; t++) {
        float xv = xr[tap[t] + j];
        for (int m = 0; m < mr; m++) {
          float *a = acc + (m * DW_T + t) * 8 + (j & 7);
          *a = fmaf(yr[m * ystride + j], xv, *a);
        }
      }
  }
}

#define DW_ROWS 8 /* output rows per block: the block's dy rows stay in L1 across all taps */

static void dw_items(void *cv, int64_t u0, int64_t u1) {
  const dw_ctx *c = cv;
  int64_t K = c->Cig * c->kh * c->kw;
  /* per (ci, ki) kernel row, per group of DW_T taps: a [4][DW_T][8] block */
  const int64_t nbk = (c->kw + DW_T - 1) / DW_T, bsz = 4 * DW_T * 8, nacc = c->Cig * c->kh * nbk * bsz;
  float *accs = tpurt__scratch(3, sizeof(float) * (size_t)nacc + 64);
  if (!accs) {
    atomic_store(&((dw_ctx *)cv)->oom, 1);
    return;
  }
  for (int64_t u = u0; u < u1; u++) { /* u = (g * nocb + ocb) * N + n */
    int64_t n = u % c->N, t = u / c->N, ocb = t % c->nocb, g = t / c->nocb;
    int64_t oc0 = g * c->Cog + ocb * 4, mr = c->Cog - ocb * 4 < 4 ? c->Cog - ocb * 4 : 4;
    const float *dyp = c->dy + (n * c->Co + oc0) * c->Ho * c->Wo;
    memset(accs, 0, sizeof(float) * (size_t)nacc);
    for (int64_t oh0 = 0; oh0 < c->Ho; oh0 += DW_ROWS) {
      int64_t oh1 = c->Ho - oh0 < DW_ROWS ? c->Ho : oh0 + DW_ROWS;
      for (int64_t ci = 0; ci < c->Cig; ci++)
        for (int64_t ki = 0; ki < c->kh; ki++) {
          const float *xrow0 = c->planes + ((n * c->Ci + g * c->Cig + ci) * c->Hp + ki * c->dh) * c->sw * c->Wq;
          for (int64_t kj = 0; kj < c->kw; kj += DW_T) {
            int nt = (int)(c->kw - kj < DW_T ? c->kw - kj : DW_T);
            float *acc = accs + ((ci * c->kh + ki) * nbk + kj / DW_T) * bsz;
#if DC_X86
            if (c->avx2) {
              g_dwtiles[mr - 1][nt - 1](c, dyp, xrow0, c->tapoff + kj, acc, oh0, oh1);
              continue;
            }
#endif
            dwtile_portable(c, dyp, xrow0, c->tapoff + kj, acc, oh0, oh1, (int)mr, nt);
          }
        }
    }
    /* lanes -> sums, a fixed pairwise order */
    float *out = c->part + (n * c->Co + oc0) * K;
    for (int64_t ci = 0; ci < c->Cig; ci++)
      for (int64_t ki = 0; ki < c->kh; ki++)
        for (int64_t kj = 0; kj < c->kw; kj++) {
          int64_t k = (ci * c->kh + ki) * c->kw + kj;
          const float *blk = accs + ((ci * c->kh + ki) * nbk + kj / DW_T) * bsz;
          for (int64_t m = 0; m < mr; m++) {
            const float *a = blk + (m * DW_T + kj % DW_T) * 8;
            out[m * K + k] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
          }
        }
  }
}

typedef struct {
  const float *part;
  float *dw;
  int64_t N, n_el;
} dwsum_ctx;

static void dw_sum(void *cv, int64_t i0, int64_t i1) {
  const dwsum_ctx *c = cv;
  for (int64_t i = i0; i < i1; i++) {
    float s = 0.0f;
    for (int64_t n = 0; n < c->N; n++) s += c->part[n * c->n_el + i];
    c->dw[i] = s;
  }
}

/* ---------------------------------------------------------------- entry */

int tpurt__conv_direct_applies(int64_t Cig, int64_t kd, int64_t D, int64_t Do) {
  /* Few input channels per group: the reduction is short, so a thin GEMM
   * over a huge column matrix loses to register-tiled direct loops. */
  return Cig <= 4 && kd == 1 && D == 1 && Do == 1;
}


/* Phase planes of x and the tap offsets; shared by forward and weight
 * gradient. Returns 0 when scratch memory could not be had. */
typedef struct {
  float *planes;
  int64_t Hp, Wq, tap_local[32], *tapoff;
} dc_geom;

static int dc_setup(dc_geom *gm, const float *x, int64_t N, int64_t Ci, int64_t H, int64_t W, int64_t Ho,
                    int64_t Wo, int64_t kh, int64_t kw, const int64_t stride[2], const int64_t pad[2],
                    const int64_t dil[2]) {
  int64_t sh = stride[0], sw = stride[1], dh = dil[0], dw = dil[1];
  gm->Hp = (Ho - 1) * sh + (kh - 1) * dh + 1; /* padded rows any window reaches */
  int64_t maxoff = ((kw - 1) * dw) / sw;
  int64_t Wq = ((Wo + DC_NR_WIDE - 1) / DC_NR_WIDE) * DC_NR_WIDE + maxoff; /* last tile's loads stay inside */
  gm->Wq = Wq = (Wq + 7) & ~(int64_t)7;
  gm->planes = tpurt__scratch(2, sizeof(float) * (size_t)(N * Ci * gm->Hp * sw * Wq));
  gm->tapoff = kw <= 32 ? gm->tap_local : malloc(sizeof(int64_t) * (size_t)kw);
  if (!gm->planes || !gm->tapoff) {
    if (gm->tapoff != gm->tap_local) free(gm->tapoff);
    return 0;
  }
  for (int64_t kj = 0; kj < kw; kj++) gm->tapoff[kj] = ((kj * dw) % sw) * Wq + (kj * dw) / sw;
  prep_ctx pc = {x, gm->planes, Ci, H, W, gm->Hp, Wq, pad[0], pad[1], sw};
  tpurt_parallel_for(N * Ci * gm->Hp, 1 + 8192 / (sw * Wq), prep_rows, &pc);
  return 1;
}

static void dc_release(dc_geom *gm) {
  if (gm->tapoff != gm->tap_local) free(gm->tapoff);
}

/* y [N, Co, Ho, Wo] (contiguous) = conv(x [N, Ci, H, W] contiguous,
 * w [Co, Cig, kh, kw] contiguous) + bias (f32 [Co] or NULL); 2-D geometry
 * (stride, padding, dilation as {h, w}). Returns 0 when scratch memory
 * could not be had (the caller then takes the general path). */
int tpurt__conv_direct_f32(const float *x, const float *w, const float *bias, float *y, int64_t N, int64_t Ci,
                           int64_t H, int64_t W, int64_t Co, int64_t Ho, int64_t Wo, int64_t kh, int64_t kw,
                           int64_t G, const int64_t stride[2], const int64_t pad[2], const int64_t dil[2],
                           int portable) {
  int64_t Cig = Ci / G, Cog = Co / G, K = Cig * kh * kw;
  float *wp = tpurt__scratch(5, sizeof(float) * (size_t)(Co * K) + 64);
  dc_geom gm;
  if (!wp || !dc_setup(&gm, x, N, Ci, H, W, Ho, Wo, kh, kw, stride, pad, dil)) return 0;
  /* weights: per group and block of DC_MR output channels, [K][mr] */
  for (int64_t g = 0; g < G; g++)
    for (int64_t oc0 = 0; oc0 < Cog; oc0 += DC_MR) {
      int64_t mr = Cog - oc0 < DC_MR ? Cog - oc0 : DC_MR;
      float *dst = wp + (g * Cog + oc0) * K;
      const float *src = w + (g * Cog + oc0) * K;
      for (int64_t k = 0; k < K; k++)
        for (int64_t m = 0; m < mr; m++) dst[k * mr + m] = src[m * K + k];
    }
  int avx2 = !portable && tpurt__cpu_has_avx2_fma();
  dc_ctx c = {gm.planes, wp, bias, y, N, Ci, Co, G, Cig, Cog, Ho, Wo, gm.Hp, gm.Wq, kh, kw, stride[0], stride[1],
              dil[0], dil[1], (Cog + DC_MR - 1) / DC_MR, gm.tapoff, avx2, avx2 && tpurt__cpu_has_avx512()};
  /* ~ MR * Wo * K FMAs per item: chunks of >= ~256k */
  int64_t per = DC_MR * Wo * K;
  tpurt_parallel_for(N * G * c.nocb * Ho, 1 + (1 << 18) / (per ? per : 1), dc_rows, &c);
  dc_release(&gm);
  return 1;
}

/* dw [Co, Cig, kh, kw] (contiguous, overwritten) from dy [N, Co, Ho, Wo]
 * and x [N, Ci, H, W] (contiguous); same geometry arguments. Returns 0
 * when scratch memory could not be had. */
int tpurt__conv_direct_dw_f32(const float *x, const float *dy, float *dwt, int64_t N, int64_t Ci, int64_t H,
                              int64_t W, int64_t Co, int64_t Ho, int64_t Wo, int64_t kh, int64_t kw, int64_t G,
                              const int64_t stride[2], const int64_t pad[2], const int64_t dil[2], int portable) {
  int64_t Cig = Ci / G, Cog = Co / G, K = Cig * kh * kw;
  float *part = tpurt__scratch(5, sizeof(float) * (size_t)(N * Co * K) + 64);
  dc_geom gm;
  if (!part || !dc_setup(&gm, x, N, Ci, H, W, Ho, Wo, kh, kw, stride, pad, dil)) return 0;
  dw_ctx c = {gm.planes, dy, part, N, Ci, Co, G, Cig, Cog, Ho, Wo, gm.Hp, gm.Wq, kh, kw, stride[0], stride[1],
              dil[0], dil[1], (Cog + 3) / 4, gm.tapoff, !portable && tpurt__cpu_has_avx2_fma(), 0};
  tpurt_parallel_for(G * c.nocb * N, 1, dw_items, &c);
  if (atomic_load(&c.oom)) { /* the caller takes the im2col path */
    dc_release(&gm);
    return 0;
  }
  dwsum_ctx sc = {part, dwt, N, Co * K};
  tpurt_parallel_for(Co * K, 4096, dw_sum, &sc);
  dc_release(&gm);
  return 1;
}
