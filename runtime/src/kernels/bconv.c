/*
 * bconv.c — bf16 2-D convolutions (forward, input gradient, weight
 * gradient) on the bf16 matrix hardware — the AMX tile unit, or (opt-in)
 * the AVX512-BF16 dot products (bgemm.c runs the same packed layout with its
 * row kernel) — through the hooked product of bgemm.c:
 * the column matrix is gathered from the images while the B panel (or the
 * A rows) are packed, and the tiles' f32 results are stored straight into
 * the output view with the bias added and one rounding to bf16. Products
 * of bf16 values are exact in f32 and every sum accumulates in f32 (the
 * precision contract); before this file a bf16 convolution converted its
 * operands to f32 and ran the f32 implicit GEMM (sgemm.c).
 *
 * Column space. The images are first copied once into zero-padded bf16
 * planes split by stride phase (space to depth): padded element (u, v) of
 * a channel goes to phase (u % sh, v % sw) at (u / sh, v / sw) of a Hq x Wq
 * plane. Tap (r, s) of output (oh, ow) then reads phase (r dh % sh, s dw %
 * sw) at (oh + r dh / sh, ow + s dw / sw): with columns numbered l = oh *
 * Wq + ow, element (k, l) of the column matrix is xp[koff[k] + l] — one
 * offset per k (channel, tap), unit step along l whatever the stride and
 * dilation. 16 columns are 16 consecutive bf16 values: a B sliver pair row
 * is two 32-byte loads and one permute (interleave16). Columns with ow >=
 * Wo (at most Wq - Wo per row) and the tail that rounds an image to 16
 * columns are computed and dropped by the store.
 *
 * Passes (per group):
 *   forward        y[m, l] = w[m, k] col[k, l]                 A = w, B gathered
 *   input gradient per phase (ah, aw) of dx: a unit-stride convolution of
 *                  dy with the taps that reach the phase, their offsets
 *                  folded into koff; stored to dx[.., i sh + ah, j sw + aw]
 *   weight grad.   dw^T[k, m] = col[k, (n, l)] dy'[(n, l), m]   A = col rows
 *                  (runs of one image), B = dy laid out in the column space
 *                  (zero at dropped columns) as pairs of positions
 * The weight gradient multiplies the dropped columns' image values by
 * zeros: an Inf or NaN there would leak into dw, so images with a
 * non-finite value run the f32 path for that pass (same results as CPU).
 *
 * Which kernel: the tile unit where it serves bf16 products; the dot
 * products for large passes (dot_worth), every pass with
 * TORCH_TPU_CONV_BF16=1;
 * TORCH_TPU_CONV_BF16=0 (or its former name TORCH_TPU_CONV_AMX=0, and
 * whatever turns the bf16 products off: TORCH_TPU_ISA below avx512 or a CPU
 * without AVX512-BF16, TORCH_TPU_BGEMM=0) keeps the f32 path.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_simd.h"
#include "gemm_internal.h"

static _Atomic uint64_t g_passes;

/* TORCH_TPU_CONV_BF16: 1 the bf16 kernel for every pass it serves, 0 (or
 * TORCH_TPU_CONV_AMX=0) never, unset: the tile unit always, the dot
 * products for large passes (dot_worth). */
static int conv_bf16_env(void) {
  const char *e = getenv("TORCH_TPU_CONV_BF16"), *old = getenv("TORCH_TPU_CONV_AMX");
  if ((e && !strcmp(e, "0")) || (old && !strcmp(old, "0"))) return 0;
  return e && !strcmp(e, "1") ? 1 : -1;
}

int tpurt__bconv_applies(void) {
  int e = conv_bf16_env();
  return e == 0 ? 0 : tpurt__bgemm_amx() || tpurt__bgemm_applies();
}

/* Does a pass run on the dot products (AVX512-BF16 without the tile
 * unit)? On Zen 5 (2 threads, N = 16 / 64, 3 x 3, C -> C, TORCH_TPU_CONV_BF16
 * 0 vs 1, time dot / f32 path): at 604M multiply-adds a pass 0.57-0.71
 * (C 64 at 32^2, 128 at 16^2), 0.69-0.90 (256 at 8^2), but 0.94-1.04 at
 * 4^2, where a padded row of 6 and the rounding to 16 columns compute two
 * columns for each kept one; at 151M 0.83-1.30 for the forward pass and
 * the input gradient, 0.74-0.86 for weight gradients with >= 8^2
 * positions but 0.92 at 8^2 (8 kept columns in 10). So: passes from 2^28
 * multiply-adds whose column space keeps >= 3/4 of the columns it
 * computes, and weight gradients from 2^26 that keep >= 7/8; the others run
 * the f32 implicit GEMM. */
static int dot_worth(int64_t macs, int64_t kept, int64_t computed, int wgrad) {
  if (tpurt__bgemm_amx() || conv_bf16_env() == 1) return 1;
  return (macs >= (int64_t)1 << 28 && 4 * kept >= 3 * computed) ||
         (wgrad && macs >= (int64_t)1 << 26 && 8 * kept >= 7 * computed);
}

const char *tpurt_bf16_conv_path(void) {
  if (!tpurt__bconv_applies()) return "f32 implicit GEMM";
  if (tpurt__bgemm_amx()) return "amx-bf16 tiles";
  return conv_bf16_env() == 1 ? "avx512-bf16 dot products"
                              : "avx512-bf16 dot products for large passes, f32 implicit GEMM below";
}
uint64_t tpurt_bf16_conv_tile_passes(void) { return atomic_load(&g_passes); }
static _Atomic uint64_t g_ip_passes;
uint64_t tpurt_bf16_conv_implicit_passes(void) { return atomic_load(&g_ip_passes); }

static inline void *hv(tpurt_devptr p) { return p ? tpurt__host_view(p) : NULL; }

/* ------------------------------------------------ padded phase planes */

#if defined(__x86_64__)
/* o[0..n) = row[0], row[2], .. (the even elements of 2 n) */
__attribute__((target("avx512f,avx512bw"))) static void evens16(uint16_t *o, const uint16_t *row, int64_t n) {
  const __m512i idx = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24,
                                       22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  int64_t q = 0;
  for (; q + 32 < n; q += 32) { /* reads 2 q + 63 <= 2 n - 3: inside the row */
    __m512i a = _mm512_loadu_si512(row + 2 * q), b = _mm512_loadu_si512(row + 2 * q + 32);
    _mm512_storeu_si512(o + q, _mm512_permutex2var_epi16(a, idx, b));
  }
  if (q < n) { /* the last <= 32: elements 2 q .. 2 n - 2 read under masks (a 32-wide image's 16 were scalar) */
    int64_t m = 2 * (n - q) - 1;
    __mmask32 ka = (__mmask32)(m >= 32 ? 0xffffffffu : (1u << m) - 1u);
    __mmask32 kb = (__mmask32)(m > 32 ? (1u << (m - 32)) - 1u : 0u);
    __m512i a = _mm512_maskz_loadu_epi16(ka, row + 2 * q), b = _mm512_maskz_loadu_epi16(kb, row + 2 * q + 32);
    __mmask32 ks = (__mmask32)(n - q >= 32 ? 0xffffffffu : (1u << (n - q)) - 1u);
    _mm512_mask_storeu_epi16(o + q, ks, _mm512_permutex2var_epi16(a, idx, b));
  }
}

/* any non-finite bf16 value (exponent all ones) among v[0..n) */
__attribute__((target("avx512f,avx512bw"))) static int nonfinite16(const uint16_t *v, int64_t n) {
  const __m512i e = _mm512_set1_epi16(0x7f80);
  __mmask32 any = 0;
  for (int64_t i = 0; i < n; i += 32) {
    __mmask32 k = (__mmask32)(n - i >= 32 ? 0xffffffffu : (1u << (n - i)) - 1u);
    any |= _mm512_mask_cmpeq_epi16_mask(k, _mm512_and_si512(_mm512_maskz_loadu_epi16(k, v + i), e), e);
  }
  return any != 0;
}
#endif

/* o[0..n) = row[0], row[sw sw_], row[2 sw sw_], ..: a plane row's columns
 * sw apart (sw_: the view's column stride) */
static void copy_row_step(uint16_t *o, const uint16_t *row, int64_t n, int64_t sw, int64_t sw_) {
  if (sw == 1 && sw_ == 1) {
    memcpy(o, row, (size_t)n * 2);
    return;
  }
#if defined(__x86_64__)
  if (sw == 2 && sw_ == 1 && tpurt__cpu_avx512()) {
    evens16(o, row, n); /* reads row[0 .. 2 n - 2], as the loop below */
    return;
  }
#endif
  for (int64_t q = 0; q < n; q++) o[q] = row[q * sw * sw_];
}

/* any non-finite bf16 value among v[0..n) */
static int any_nonfinite(const uint16_t *v, int64_t n) {
#if defined(__x86_64__)
  if (tpurt__cpu_avx512()) return nonfinite16(v, n);
#endif
  int bad = 0;
  for (int64_t q = 0; q < n; q++) bad |= (v[q] & 0x7f80) == 0x7f80;
  return bad;
}

/* A 4-D bf16 view [N, C, H, W] (strides in elements) copied into planes
 * xp[((n C + c) sh + a) sw + b][i][j] = x[n, c, i sh + a - pt, j sw + b - pl]
 * (zero outside the image), each Hq x Wq. */
typedef struct {
  const uint16_t *x;
  int64_t sn, sc, sh_, sw_; /* strides of the view */
  int64_t C, H, W;
  uint16_t *xp;
  int64_t sh, sw, pt, pl, hq, wq;
  uint64_t used;         /* phases (a sw + b) some tap reads (bit 63: 63 and up) */
  int check;             /* note non-finite values */
  _Atomic int nonfinite; /* ... found */
} pad_job;

static void pad_planes(void *p, int64_t b, int64_t e) {
  pad_job *j = p;
  int64_t pq = j->hq * j->wq;
  int bad = 0;
  for (int64_t u = b; u < e; u++) {
    int64_t n = u / j->C, c = u % j->C;
    const uint16_t *src = j->x + n * j->sn + c * j->sc;
    uint16_t *planes = j->xp + u * j->sh * j->sw * pq;
    memset(planes, 0, (size_t)(j->sh * j->sw * pq) * 2);
    for (int64_t a = 0; a < j->sh; a++) {
      /* rows i with 0 <= i sh + a - pt < H */
      int64_t i_lo = j->pt - a > 0 ? (j->pt - a + j->sh - 1) / j->sh : 0;
      int64_t i_hi = j->H - 1 + j->pt - a >= 0 ? (j->H - 1 + j->pt - a) / j->sh + 1 : 0;
      if (i_hi > j->hq) i_hi = j->hq;
      for (int64_t bb = 0; bb < j->sw; bb++) {
        int64_t ph = a * j->sw + bb;
        if (!(j->used >> (ph < 63 ? ph : 63) & 1)) continue; /* left zero */
        uint16_t *pl = planes + ph * pq;
        /* columns q with 0 <= q sw + bb - pl < W */
        int64_t lo = j->pl - bb > 0 ? (j->pl - bb + j->sw - 1) / j->sw : 0;
        int64_t hi = j->W - 1 + j->pl - bb >= 0 ? (j->W - 1 + j->pl - bb) / j->sw + 1 : 0;
        if (hi > j->wq) hi = j->wq;
        if (lo >= hi) continue;
        int64_t iw0 = lo * j->sw + bb - j->pl;
        for (int64_t i = i_lo; i < i_hi; i++) {
          uint16_t *o = pl + i * j->wq;
          const uint16_t *row = src + (i * j->sh + a - j->pt) * j->sh_;
          copy_row_step(o + lo, row + iw0 * j->sw_, hi - lo, j->sw, j->sw_);
          if (j->check) bad |= any_nonfinite(o + lo, hi - lo);
        }
      }
    }
  }
  if (bad) atomic_store(&j->nonfinite, 1);
}

/* Geometry of the planes of one pass: images [N, C, H, W] of a view,
 * outputs Ho x Wo, taps reaching padded (u, v) = (oh sh + r dh, ow sw + s dw).
 * Filled by plan(); xp allocated and written by pad(). */
typedef struct {
  int64_t N, C, sh, sw, pt, pl, hq, wq, pq, chan, img, lp;
  uint64_t used; /* phases a tap reads (pad_job.used) */
  size_t bytes; /* of the planes, with the slack the dropped columns read */
  uint16_t *xp;
} planes;

/* hp x wp: the padded extent the pass reads (at least the image). */
static void plan(planes *g, int64_t N, int64_t C, int64_t H, int64_t W, int64_t sh, int64_t sw, int64_t pt,
                 int64_t pl, int64_t hp, int64_t wp, int64_t Ho) {
  if (hp < pt + H) hp = pt + H;
  if (wp < pl + W) wp = pl + W;
  g->N = N, g->C = C, g->sh = sh, g->sw = sw, g->pt = pt, g->pl = pl;
  g->hq = (hp + sh - 1) / sh;
  g->wq = (wp + sw - 1) / sw;
  g->pq = g->hq * g->wq;
  g->chan = sh * sw * g->pq;
  g->img = C * g->chan;
  g->lp = (Ho * g->wq + 15) / 16 * 16;
  g->used = ~(uint64_t)0;
  /* the last image's dropped columns read up to the largest offset + lp + 32 */
  g->bytes = (size_t)(N * g->img + g->img + g->lp + 64) * 2;
}

/* The planes of the images x read by a convolution (forward, weight
 * gradient) with outputs Ho x Wo and kh x kw taps. */
static void plan_images(planes *g, const tpurt_view *x, int64_t Ho, int64_t Wo, int64_t kh, int64_t kw,
                        const tpurt_conv3d_params *p) {
  int64_t sh = p->stride[1], sw = p->stride[2];
  plan(g, x->sizes[0], x->sizes[1], x->sizes[3], x->sizes[4], sh, sw, p->padding[1], p->padding[2],
       (Ho - 1) * sh + (kh - 1) * p->dilation[1] + 1, (Wo - 1) * sw + (kw - 1) * p->dilation[2] + 1, Ho);
  g->used = 0; /* a 1 x 1 kernel at stride 2 reads one phase of four */
  for (int64_t r = 0; r < kh; r++)
    for (int64_t s = 0; s < kw; s++) {
      int64_t ph = (r * p->dilation[1] % sh) * sw + s * p->dilation[2] % sw;
      g->used |= (uint64_t)1 << (ph < 63 ? ph : 63);
    }
}

static int pad(planes *g, const tpurt_view *v, int check, int slot) {
  /* images that are their own planes (unit stride, no padding, H W a
   * multiple of 16, dense NCHW): read in place; no column is dropped then,
   * and every read stays inside the images */
  int64_t H = v->sizes[3], W = v->sizes[4];
  if (g->sh == 1 && g->sw == 1 && g->pt == 0 && g->pl == 0 && g->hq == H && g->wq == W && g->lp == H * W &&
      v->strides[4] == 1 && (H == 1 || v->strides[3] == W) && (g->C == 1 || v->strides[1] == H * W) &&
      (g->N == 1 || v->strides[0] == g->img)) {
    g->xp = hv(v->ptr);
    return 0;
  }
  g->xp = tpurt__scratch(slot, g->bytes);
  if (!g->xp) return -1;
  pad_job j = {(const uint16_t *)hv(v->ptr), v->strides[0], v->strides[1], v->strides[3], v->strides[4],
               g->C, v->sizes[3], v->sizes[4], g->xp, g->sh, g->sw, g->pt, g->pl, g->hq, g->wq, g->used, check, 0};
  tpurt_parallel_for(g->N * g->C, 1 + 4096 / (g->chan + 1), pad_planes, &j);
  size_t used = (size_t)(g->N * g->img) * 2;
  memset((char *)g->xp + used, 0, g->bytes - used);
  return atomic_load(&j.nonfinite);
}

/* Offset of tap (r, s) of channel c in an image of the planes. */
static inline int64_t tap_off(const planes *g, int64_t c, int64_t u, int64_t v) {
  return c * g->chan + ((u % g->sh) * g->sw + v % g->sw) * g->pq + (u / g->sh) * g->wq + v / g->sw;
}

/* koff[(c, r, s)] of channels c0 .. c0 + C - 1 of images read by a
 * forward-type pass (tap (r, s) at padded (r dh, s dw) from the output's). */
static void image_koff(const planes *g, int64_t c0, int64_t C, int64_t kh, int64_t kw, const tpurt_conv3d_params *p,
                       int64_t *koff) {
  for (int64_t c = 0; c < C; c++)
    for (int64_t r = 0; r < kh; r++)
      for (int64_t s = 0; s < kw; s++)
        koff[(c * kh + r) * kw + s] = tap_off(g, c0 + c, r * p->dilation[1], s * p->dilation[2]);
}

#if defined(__x86_64__)
/* r[0..15] (16 u32 each) transposed in place: r[q][i] <- r[i][q]. */
__attribute__((target("avx512f"))) static inline void tr16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  /* u[4 g + j] lane k: rows 4g..4g+3 at column 4k + j */
  for (int j = 0; j < 4; j++) {
    __m512i v = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), w = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
    __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88), w2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
    r[j] = _mm512_shuffle_i32x4(v, v2, 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(v, v2, 0xdd);
    r[4 + j] = _mm512_shuffle_i32x4(w, w2, 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(w, w2, 0xdd);
  }
}
#endif

/* ------------------------------------------------ hooks */

typedef struct {
  tpurt__bhooks h; /* first: the hooks get this pointer back */
  const planes *g;
  const int64_t *koff; /* K offsets into an image of the planes */
  int64_t K, ncols;    /* k's; columns N lp */
  int64_t ho, wo;      /* valid rows / columns of an image's column space */
  /* forward / input gradient: row m, column (n, oh, ow) of C -> y */
  uint16_t *y;
  int64_t o_n, o_m, o_h, o_w;
  const float *bias; /* per row, or NULL */
  /* weight gradient: B pairs dyt[p * ldt + m], C[k, m] -> y[m * o_m + woff[k]] */
  const uint32_t *dyt;
  int64_t ldt;
  const int64_t *woff;
  int wdense; /* woff[k] = k */
} cjob;

static const uint16_t k_zero[64];

/* B = column matrix: columns j0.. (one image's: lp is a multiple of 16). */
static void col_pack_b(const tpurt__bhooks *h, uint32_t *d, int64_t j0, int64_t k0, int64_t kc) {
  const cjob *j = (const cjob *)h;
  const uint16_t *base = j->g->xp + j0 / j->g->lp * j->g->img + j0 % j->g->lp;
  for (int64_t p = 0; p < kc / 2; p++) {
    int64_t k = k0 + 2 * p;
    const uint16_t *r0 = k < j->K ? base + j->koff[k] : k_zero, *r1 = k + 1 < j->K ? base + j->koff[k + 1] : k_zero;
#if defined(__x86_64__)
    interleave16(d + p * 16, r0, r1);
#else
    for (int q = 0; q < 16; q++) d[p * 16 + q] = (uint32_t)r0[q] | (uint32_t)r1[q] << 16;
#endif
  }
}

#if defined(__x86_64__)
/* o[i] = bf16(s[i] + b) for the lanes of mask k (the others neither read nor written) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void store_bf16_tail(uint16_t *o, const float *s,
                                                                                      __m512 vb, __mmask16 k) {
  __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, s), vb);
  _mm256_mask_storeu_epi16(o, k, _mm512_cvtepi32_epi16(rne_bf16(v)));
}

#endif

/* Row m of C, columns [j0, j0 + n) -> the valid positions of y (bias, one rounding). */
#if defined(__x86_64__)
/* o[0..cnt) = bf16(s[q] + b), unit stride (col_out's rows) */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void out_run_avx512(uint16_t *o, const float *s, float b,
                                                                               int64_t cnt) {
  __m512 vb = _mm512_set1_ps(b);
  int64_t q = 0;
  for (; q + 16 <= cnt; q += 16) store_bf16x16(o + q, _mm512_add_ps(_mm512_loadu_ps(s + q), vb), 0.0f);
  if (q < cnt) store_bf16_tail(o + q, s + q, vb, (__mmask16)((1u << (cnt - q)) - 1));
}
#endif

static void col_out(const tpurt__bhooks *h, const float *t, int64_t ldt, int64_t i0, int64_t m, int64_t j0,
                    int64_t n) {
  const cjob *j = (const cjob *)h;
  int64_t lp = j->g->lp, wq = j->g->wq, end = j0 + n;
  for (int64_t i = 0; i < m; i++) {
    int64_t row = i0 + i;
    float b = j->bias ? j->bias[row] : 0.0f;
    const float *tr = t + i * ldt - j0;
    int64_t im = j0 / lp, l = j0 % lp, oh = l / wq, ow = l % wq;
    for (int64_t c = j0; c < end;) {
      int64_t run = wq - ow;
      if (run > lp - l) run = lp - l;
      if (run > end - c) run = end - c;
      if (oh < j->ho && ow < j->wo) {
        int64_t cnt = j->wo - ow < run ? j->wo - ow : run, q = 0;
        uint16_t *o = j->y + im * j->o_n + row * j->o_m + oh * j->o_h + ow * j->o_w;
        const float *s = tr + c;
#if defined(__x86_64__)
        if (j->o_w == 1 && tpurt__cpu_avx512()) {
          out_run_avx512(o, s, b, cnt);
          q = cnt;
        }
#endif
        for (; q < cnt; q++) o[q * j->o_w] = tpurt__f32_to_bf16(s[q] + b);
      }
      c += run, l += run, ow += run;
      if (l == lp)
        im++, l = 0, oh = 0, ow = 0;
      else if (ow == wq)
        oh++, ow = 0;
    }
  }
}

/* A = column matrix rows (weight gradient): rows k = i0.., positions k0.. */
static void wg_pack_a(const tpurt__bhooks *h, uint16_t *d, int64_t ld, int64_t i0, int64_t k0, int64_t kc) {
  const cjob *j = (const cjob *)h;
  int64_t lp = j->g->lp;
  for (int r = 0; r < 32; r++) {
    uint16_t *o = d + r * ld;
    int64_t k = i0 + r;
    if (k >= j->K) {
      memset(o, 0, (size_t)kc * 2);
      continue;
    }
    for (int64_t q = k0; q < k0 + kc;) {
      if (q >= j->ncols) {
        memset(o + (q - k0), 0, (size_t)(k0 + kc - q) * 2);
        break;
      }
      int64_t l = q % lp, run = lp - l < k0 + kc - q ? lp - l : k0 + kc - q;
      memcpy(o + (q - k0), j->g->xp + q / lp * j->g->img + j->koff[k] + l, (size_t)run * 2);
      q += run;
    }
  }
}

/* B = dy in the column space, pairs of positions: rows of dyt. */
static void wg_pack_b(const tpurt__bhooks *h, uint32_t *d, int64_t j0, int64_t k0, int64_t kc) {
  const cjob *j = (const cjob *)h;
  for (int64_t p = 0; p < kc / 2; p++) {
    int64_t pp = k0 / 2 + p;
    if (2 * pp < j->ncols)
      memcpy(d + p * 16, j->dyt + pp * j->ldt + j0, 64);
    else
      memset(d + p * 16, 0, 64);
  }
}

/* C[k, m] -> dw (rounded once); 16 x 16 blocks transposed when dw's k's
 * are contiguous (woff[k] = k) */
#if defined(__x86_64__)
/* wg_out's whole 16-row blocks (dense weight layout); returns how many rows */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static int64_t wg_out_avx512(const cjob *j, const float *t,
                                                                                  int64_t ldt, int64_t i0, int64_t m,
                                                                                  int64_t j0, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    int64_t q = 0;
    for (; q + 16 <= n; q += 16) {
      __m512i r[16];
      for (int u = 0; u < 16; u++) r[u] = _mm512_loadu_si512(t + (i + u) * ldt + q);
      tr16x16(r);
      for (int u = 0; u < 16; u++)
        store_bf16x16(j->y + (j0 + q + u) * j->o_m + i0 + i, _mm512_castsi512_ps(r[u]), 0.0f);
    }
    for (; q < n; q++)
      for (int u = 0; u < 16; u++)
        j->y[(j0 + q) * j->o_m + j->woff[i0 + i + u]] = tpurt__f32_to_bf16(t[(i + u) * ldt + q]);
  }
  return i;
}
#endif

static void wg_out(const tpurt__bhooks *h, const float *t, int64_t ldt, int64_t i0, int64_t m, int64_t j0,
                   int64_t n) {
  const cjob *j = (const cjob *)h;
  int64_t i = 0;
#if defined(__x86_64__)
  if (j->wdense && tpurt__cpu_avx512()) i = wg_out_avx512(j, t, ldt, i0, m, j0, n);
#endif
  for (; i < m; i++)
    for (int64_t q = 0; q < n; q++)
      j->y[(j0 + q) * j->o_m + j->woff[i0 + i]] = tpurt__f32_to_bf16(t[i * ldt + q]);
}

/* dy of one group laid out as the column space's pairs of positions:
 * dyt[(n lp + l) / 2][m] (l = oh wq + ow; zero at dropped columns and
 * rows m >= M up to ldt). Images [b, e). */
typedef struct {
  const uint16_t *dy;
  int64_t dn, dc, dh, dw; /* strides */
  int64_t M, ho, wo;
  const planes *g;
  uint32_t *dyt;
  int64_t ldt;
} dyt_job;



/* Per image, 16 rows and DYT_BLOCK positions at a time: dy' laid out in a
 * stack block (zero at dropped columns), then 16 x 16 pairs transposed
 * into dyt. */
#define DYT_BLOCK 512
#if defined(__x86_64__)
/* 16 x 16 pairs of the block t from pair p0 on transposed into dst (row
 * stride ld), at most `left` rows of pairs */
__attribute__((target("avx512f"))) static void pairs16_avx512(uint16_t (*t)[DYT_BLOCK], int64_t l0, int64_t p0,
                                                              int64_t left, uint32_t *dst, int64_t ld) {
  __m512i r[16];
  for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(&t[i][2 * p0 - l0]);
  tr16x16(r);
  for (int q = 0; q < 16 && q < left; q++) _mm512_storeu_si512(dst + (p0 + q) * ld, r[q]);
}
#endif
static void dyt_images(void *p, int64_t b, int64_t e) {
  const dyt_job *j = p;
  int64_t lp = j->g->lp, wq = j->g->wq, np = lp / 2;
  _Alignas(64) uint16_t t[16][DYT_BLOCK];
  for (int64_t n = b; n < e; n++) {
    uint32_t *dst = j->dyt + n * np * j->ldt;
    for (int64_t m0 = 0; m0 < j->ldt; m0 += 16)
      for (int64_t l0 = 0; l0 < lp; l0 += DYT_BLOCK) {
        int64_t l1 = l0 + DYT_BLOCK < lp ? l0 + DYT_BLOCK : lp;
        memset(t, 0, sizeof t);
        for (int64_t m = m0; m < m0 + 16 && m < j->M; m++) {
          const uint16_t *src = j->dy + n * j->dn + m * j->dc;
          for (int64_t oh = l0 / wq; oh < j->ho && oh * wq < l1; oh++) {
            int64_t a = oh * wq > l0 ? oh * wq : l0, z = oh * wq + j->wo < l1 ? oh * wq + j->wo : l1;
            const uint16_t *row = src + oh * j->dh - oh * wq * j->dw;
            uint16_t *o = t[m - m0] - l0;
            if (j->dw == 1)
              memcpy(o + a, row + a, (size_t)(z > a ? z - a : 0) * 2);
            else
              for (int64_t l = a; l < z; l++) o[l] = row[l * j->dw];
          }
        }
        for (int64_t p0 = l0 / 2; p0 < l1 / 2; p0 += 16) {
#if defined(__x86_64__)
          if (tpurt__cpu_avx512()) {
            pairs16_avx512(t, l0, p0, l1 / 2 - p0, dst + m0, j->ldt);
            continue;
          }
#endif
          for (int64_t q = p0; q < p0 + 16 && q < l1 / 2; q++)
            for (int i = 0; i < 16; i++)
              dst[q * j->ldt + m0 + i] = (uint32_t)t[i][2 * q - l0] | (uint32_t)t[i][2 * q + 1 - l0] << 16;
        }
      }
  }
}

/* ------------------------------------------------ helpers */

/* bias of any float dtype as f32 (n values) into slot */
static float *bias_f32(const tpurt_view *bv, int64_t n, int slot) {
  float *b = tpurt__scratch(slot, sizeof(float) * (size_t)n);
  if (!b) return NULL;
  const char *bb = hv(bv->ptr);
  size_t es = tpurt_dtype_size(bv->dtype);
  for (int64_t c = 0; c < n; c++) {
    const char *q = bb + (ptrdiff_t)(c * bv->strides[0]) * (ptrdiff_t)es;
    b[c] = bv->dtype == TPURT_F64   ? (float)*(const double *)q
           : bv->dtype == TPURT_F32 ? *(const float *)q
           : bv->dtype == TPURT_BF16 ? tpurt__bf16_to_f32(*(const uint16_t *)q)
                                     : tpurt__f16_to_f32(*(const uint16_t *)q);
  }
  return b;
}

static int64_t *koff_buf(int64_t n, int slot) { return tpurt__scratch(slot, sizeof(int64_t) * (size_t)(n > 0 ? n : 1)); }

/* ------------------------------------------------ patch rows
 *
 * Small images (8 x 8, 4 x 4: the late stages of a ResNet) waste the
 * column space above — a padded row of Wo + 2 and the rounding of an
 * image to 16 columns compute up to two columns per kept one — and their
 * products are small per image. There a pass runs as plain bf16 products
 * (bgemm.c) on a patch matrix instead: the images copied once into
 * zero-padded channels-last planes xn[n][hp][wp][c], then, per chunk of
 * output positions, each position's patch as one row of K = kh kw C values
 * in (r, s, c) order — kh kw runs of C contiguous values — times the
 * weights laid out as [(r, s, c)][co] (the forward pass; the input
 * gradient, at stride 1, is the forward pass of dy padded by (k - 1) dil -
 * pad with the weights flipped and transposed). Zen 5, 2 threads, 3 x 3,
 * C -> C, time without / with (TORCH_TPU_CONV_PATCH=0): N 16, C 128 at 8^2
 * forward 1.57, input gradient 1.66; C 256 at 4^2 1.02, 1.39; N 64, C 256
 * at 8^2 1.22, 1.28; C 512 at 4^2 1.45, 1.74. Weight gradients stay on the
 * column space (patch rows times dy^T measured 0.58-0.86 at N 16, 1.01-1.17
 * at N 64). Products of bf16
 * values exact in f32, sums in f32, one rounding (with the bias) at the
 * store: the precision contract; only the order of the sums differs from
 * the column-space passes. Groups of 1 and >= 32 input channels (a run of
 * >= 64 bytes) only (patch_worth). */

/* src [N, C, H, W] (a bf16 view's strides) into xn[n][hp][wp][c]: source
 * row i, column j at (i + pt, j + pl), zero elsewhere. */
typedef struct {
  const uint16_t *x;
  int64_t sn, sc, sh_, sw_, C, H, W, pt, pl, hp, wp;
  uint16_t *xn;
} nhwc_job;

static void nhwc_images(void *p, int64_t b, int64_t e) {
  const nhwc_job *j = p;
  for (int64_t n = b; n < e; n++) {
    uint16_t *o = j->xn + n * j->hp * j->wp * j->C;
    memset(o, 0, (size_t)(j->hp * j->wp * j->C) * 2);
    const uint16_t *src = j->x + n * j->sn;
    for (int64_t i = 0; i < j->H; i++) {
      int64_t ii = i + j->pt;
      if (ii < 0 || ii >= j->hp) continue;
      if (j->sw_ == 1 && j->pl >= 0 && j->pl + j->W <= j->wp) {
        /* unit-stride rows: blocks of 16 channels x 64 pixels through a
         * tile in the L1, read along the rows and written in 32-byte runs
         * (a pixel's channels gathered one by one from C planes took longer
         * than the product of a 64 -> 1 convolution) */
        uint16_t *drow = o + (ii * j->wp + j->pl) * j->C;
        const uint16_t *srow = src + i * j->sh_;
        for (int64_t c0 = 0; c0 < j->C; c0 += 16) {
          int64_t cb = j->C - c0 < 16 ? j->C - c0 : 16;
          for (int64_t q0 = 0; q0 < j->W; q0 += 64) {
            int64_t qb = j->W - q0 < 64 ? j->W - q0 : 64;
            uint16_t t[64][16];
            for (int64_t c = 0; c < cb; c++) {
              const uint16_t *sp = srow + (c0 + c) * j->sc + q0;
              for (int64_t q = 0; q < qb; q++) t[q][c] = sp[q];
            }
            if (cb == 16) /* a constant size: inlined stores, no call a pixel */
              for (int64_t q = 0; q < qb; q++) memcpy(drow + (q0 + q) * j->C + c0, t[q], 32);
            else
              for (int64_t q = 0; q < qb; q++) memcpy(drow + (q0 + q) * j->C + c0, t[q], (size_t)cb * 2);
          }
        }
        continue;
      }
      for (int64_t q = 0; q < j->W; q++) {
        int64_t jj = q + j->pl;
        if (jj < 0 || jj >= j->wp) continue;
        uint16_t *d = o + (ii * j->wp + jj) * j->C;
        const uint16_t *s0 = src + i * j->sh_ + q * j->sw_;
        for (int64_t c = 0; c < j->C; c++) d[c] = s0[c * j->sc];
      }
    }
  }
}

/* Geometry of a patch pass: outputs Ho x Wo of N images, taps kh x kw at
 * (oh sh + r dh, ow sw + s dw) of the padded planes. */
typedef struct {
  const uint16_t *xn;
  int64_t C, hp, wp, Ho, Wo, kh, kw, sh, sw, dh, dw, K;
  int64_t pt, ih; /* the image's rows in the planes: [pt, pt + ih) (patch_nhwc) */
  int64_t pl, iw; /* ... and its columns: [pl, pl + iw) */
} pgeom;

typedef struct {
  const pgeom *g;
  int64_t r0; /* first position of the chunk */
  uint16_t *pm;
} prow_job;

static void patch_rows(void *p, int64_t b, int64_t e) {
  const prow_job *j = p;
  const pgeom *g = j->g;
  int64_t P = g->Ho * g->Wo;
  size_t run = (size_t)g->C * 2;
  for (int64_t i = b; i < e; i++) {
    int64_t pos = j->r0 + i, n = pos / P, l = pos % P, oh = l / g->Wo, ow = l % g->Wo;
    uint16_t *d = j->pm + i * g->K;
    for (int64_t r = 0; r < g->kh; r++) {
      const uint16_t *row = g->xn + ((n * g->hp + oh * g->sh + r * g->dh) * g->wp + ow * g->sw) * g->C;
      for (int64_t s = 0; s < g->kw; s++, d += g->C) memcpy(d, row + s * g->dw * g->C, run);
    }
  }
}

/* C chunk [rows][Co] (f32) -> y[n, co, oh, ow] = bf16(C + bias[co]). */
typedef struct {
  const pgeom *g;
  int64_t r0, Co;
  const float *c;
  const float *bias;
  uint16_t *y;
  int64_t o_n, o_c, o_h, o_w;
} pout_job;

static void patch_out(void *p, int64_t b, int64_t e) {
  const pout_job *j = p;
  int64_t P = j->g->Ho * j->g->Wo;
  for (int64_t i = b; i < e; i++) {
    int64_t pos = j->r0 + i, n = pos / P, l = pos % P, oh = l / j->g->Wo, ow = l % j->g->Wo;
    uint16_t *o = j->y + n * j->o_n + oh * j->o_h + ow * j->o_w;
    const float *c = j->c + i * j->Co;
    for (int64_t co = 0; co < j->Co; co++) o[co * j->o_c] = tpurt__f32_to_bf16(c[co] + (j->bias ? j->bias[co] : 0.0f));
  }
}

/* Positions per chunk: the patch rows and their f32 results in ~4 MiB. */
static int64_t patch_chunk(int64_t K, int64_t Co, int64_t total) {
  int64_t rows = ((int64_t)4 << 20) / (2 * K + 4 * Co + 1);
  rows = rows < 64 ? 64 : rows / 16 * 16;
  return rows < total ? rows : total;
}

static int patch_nhwc(pgeom *g, const tpurt_view *v, int64_t pt, int64_t pl, int64_t hp, int64_t wp) {
  int64_t N = v->sizes[0];
  g->C = v->sizes[1];
  g->hp = hp;
  g->wp = wp;
  g->pt = pt;
  g->ih = v->sizes[3];
  g->pl = pl;
  g->iw = v->sizes[4];
  uint16_t *xn = tpurt__scratch(0, (size_t)(N * hp * wp * g->C) * 2);
  if (!xn) return -1;
  nhwc_job j = {(const uint16_t *)hv(v->ptr), v->strides[0], v->strides[1], v->strides[3], v->strides[4],
                g->C, v->sizes[3], v->sizes[4], pt, pl, hp, wp, xn};
  tpurt_parallel_for(N, 1, nhwc_images, &j);
  g->xn = xn;
  return 0;
}

/* y[n, co, .] = sum over (r, s, c) of the patch rows times wt[(r, s, c)][co]
 * (+ bias), chunk by chunk. 1 done, 0 no memory (nothing written). */
static int patch_forward(const pgeom *g, int64_t N, const uint16_t *wt, int64_t Co, const float *bias,
                         const tpurt_view *y) {
  int64_t total = N * g->Ho * g->Wo, rows = patch_chunk(g->K, Co, total);
  uint16_t *pm = tpurt__scratch(1, (size_t)(rows * g->K) * 2);
  float *c = tpurt__scratch(3, (size_t)(rows * Co) * 4);
  if (!pm || !c) return 0;
  tpurt__bmat B = {wt, TPURT_BF16, Co, 1}, Cm = {c, TPURT_F32, Co, 1};
  for (int64_t r0 = 0; r0 < total; r0 += rows) {
    int64_t m = total - r0 < rows ? total - r0 : rows;
    prow_job pj = {g, r0, pm};
    tpurt_parallel_for(m, 16, patch_rows, &pj);
    tpurt__bmat A = {pm, TPURT_BF16, g->K, 1};
    if (!tpurt__bgemm(1, m, Co, g->K, 1.0f, &A, 0, &B, 0, 0, 0.0f, &Cm, 0)) return 0;
    pout_job oj = {g, r0, Co, c, bias, (uint16_t *)hv(y->ptr), y->strides[0], y->strides[1], y->strides[3],
                   y->strides[4]};
    tpurt_parallel_for(m, 16, patch_out, &oj);
  }
  return 1;
}

/* wt[(t, a)][b] = w[b, a, tap t] (A x B per tap: the forward pass, a =
 * input channel, b = output channel) or, with flip, wt[(kk - 1 - t, b)][a]
 * = w[b, a, tap t] (the input gradient: a = output channel of dx, b = of
 * w). A task takes 16 consecutive destination columns (b, or a with flip)
 * and writes them as runs of 16 while it reads its 16 rows of w front to
 * back (one 32 x 32 block per tap at a time read each row 9 times over and
 * ran on one thread: a 256 x 256 x 3 x 3 layout took as long as a third of
 * its 4 x 4-image product). */
typedef struct {
  uint16_t *wt;
  const uint16_t *wv;
  int64_t A, B, kh, kw, s0, s1, s3, s4;
  int flip;
} pw_job;

#if defined(__x86_64__)
/* 16 rows of 16-bit values (row stride rs) by ncol columns, transposed by
 * 16 x 32 blocks in registers (tr16x16 on pairs of columns) into runs of
 * 16: the run of column c = a kk + t goes to base + (t A + a) B (forward)
 * or, with flip (one row of w per a: c = t), to base + (kk - 1 - t) B A.
 * A 512 x 512 x 3 x 3 forward layout 2.0-2.3x, 256 x 128 2.6x, against
 * reading 16 rows 9 KiB apart an element at a time (one thread). */
__attribute__((target("avx512f,avx512bw"))) static void rows16_to_runs(const uint16_t *src, int64_t rs,
                                                                       int64_t ncol, uint16_t *base, int64_t kk,
                                                                       int64_t A, int64_t B, int flip) {
  int64_t a = 0, t = 0;
  for (int64_t c0 = 0; c0 < ncol; c0 += 32) {
    int64_t n = ncol - c0 < 32 ? ncol - c0 : 32;
    __mmask32 k = (__mmask32)(n == 32 ? 0xffffffffu : (1u << n) - 1u);
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_epi16(k, src + i * rs + c0);
    tr16x16(r); /* r[q / 2]: columns c0 + q (low halves) and c0 + q + 1 (high) of the 16 rows */
    for (int64_t q = 0; q < n; q++) {
      __m512i v = q & 1 ? _mm512_srli_epi32(r[q >> 1], 16) : r[q >> 1];
      uint16_t *d = flip ? base + (kk - 1 - t) * B * A : base + (t * A + a) * B;
      _mm256_storeu_si256((__m256i *)d, _mm512_cvtepi32_epi16(v));
      if (++t == kk) t = 0, a++;
    }
  }
}
#endif

static void patch_weight_cols(void *p, int64_t ub, int64_t ue) {
  const pw_job *j = p;
  int64_t kk = j->kh * j->kw, A = j->A, B = j->B;
  /* taps and (forward) input channels contiguous in w, as a dense weight */
  int dense = j->s4 == 1 && j->s3 == j->kw && (j->flip || j->s1 == kk);
  for (int64_t u = ub; u < ue; u++) {
    int64_t c0 = 16 * u, c1 = c0 + 16 < (j->flip ? A : B) ? c0 + 16 : (j->flip ? A : B);
#if defined(__x86_64__)
    if (dense && c1 - c0 == 16 && tpurt__cpu_avx512()) {
      if (!j->flip)
        rows16_to_runs(j->wv + c0 * j->s0, j->s0, A * kk, j->wt + c0, kk, A, B, 0);
      else
        for (int64_t b = 0; b < B; b++)
          rows16_to_runs(j->wv + b * j->s0 + c0 * j->s1, j->s1, kk, j->wt + b * A + c0, kk, A, B, 1);
      continue;
    }
#endif
    if (!j->flip) {
      for (int64_t a = 0; a < A; a++)
        for (int64_t t = 0; t < kk; t++) {
          const uint16_t *src = j->wv + a * j->s1 + t / j->kw * j->s3 + t % j->kw * j->s4;
          uint16_t *d = j->wt + (t * A + a) * B;
          for (int64_t b = c0; b < c1; b++) d[b] = src[b * j->s0];
        }
    } else {
      for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < kk; t++) {
          const uint16_t *src = j->wv + b * j->s0 + t / j->kw * j->s3 + t % j->kw * j->s4;
          uint16_t *d = j->wt + ((kk - 1 - t) * B + b) * A;
          for (int64_t a = c0; a < c1; a++) d[a] = src[a * j->s1];
        }
    }
  }
}

static void patch_weights(uint16_t *wt, const tpurt_view *w, int64_t A, int64_t B, int64_t kh, int64_t kw, int flip) {
  pw_job j = {wt, hv(w->ptr), A, B, kh, kw, w->strides[0], w->strides[1], w->strides[3], w->strides[4], flip};
  int64_t units = ((flip ? A : B) + 15) / 16;
  tpurt_parallel_for(units, (int64_t)(1 << 14) / (A * B * kh * kw / units + 1) + 1, patch_weight_cols, &j);
}

/* ------------------------------------------------ implicit patch rows
 *
 * The patch rows above copy kh kw runs of C values per output position;
 * with few channels (C 32 or 64 at 16 x 16 and 32 x 32: runs of 64-128
 * bytes) the copying took longer than the product, so such passes stayed
 * on the f32 path. Here the product reads the runs where they are: a
 * micro-tile of 8 positions x 32 output channels keeps its 16 f32
 * accumulators in registers over every tap, and for tap t the 8 rows are
 * the positions' pixels in the padded channels-last planes shifted by the
 * tap's offset — C / 2 pairs of channels each, broadcast as in bgemm.c's
 * row kernel — against the weights packed once per pass as 16-column
 * slivers of channel pairs, tap by tap. Channels in pairs: C even. The
 * same products and f32 sums as the patch rows with K in the same (tap,
 * channel) order, one rounding at the store. */

#define IP_MAX_TAPS 64
typedef struct {
  const pgeom *g;
  const uint32_t *bp; /* sliver s at bp + s * kk * kp * 16: [tap][pair][16 columns] */
  int64_t kp, kk, cout, nsl, total, pb, ncb;
  int skip;    /* taps whose row is padding for a whole tile are skipped (ip_forward's geometry) */
  int reorder; /* positions ordered (oh, n, ow): a tile holds one output row of several images;
                * 2: (oh, ow, n), a tile holds one position of 8 images */
  int64_t toff[IP_MAX_TAPS]; /* tap offsets in elements of the planes */
  const float *bias;
  uint16_t *y;
  int64_t o_n, o_c, o_h, o_w;
} ipjob;

#if defined(__x86_64__) || defined(__i386__)
#define IP_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
/* The 8 x 32 micro-tile of the in-place kernels: 16 f32 accumulators
 * (D8_DECL), and D8_LOOP adding KP pairs of the 8 rows R[0..7] (a pair:
 * one 32-bit load, broadcast) times two 16-column slivers at X0P, X1P (as
 * bgemm.c's row kernel: per pair 2 loads, 8 broadcasts, 16 dot products). */
#define D8_DECL                                                                                                   \
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00, \
         c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
#define D8_ROW(R, i)                                                               \
  {                                                                                \
    uint32_t v_;                                                                   \
    memcpy(&v_, (R)[i] + 2 * q, 4);                                                \
    __m512bh a_ = (__m512bh)_mm512_set1_epi32((int)v_);                            \
    c##i##0 = _mm512_dpbf16_ps(c##i##0, a_, x0);                                   \
    c##i##1 = _mm512_dpbf16_ps(c##i##1, a_, x1);                                   \
  }
#define D8_LOOP(R, X0P, X1P, KP)                                                   \
  _Pragma("GCC unroll 2") for (int64_t q = 0; q < (KP); q++) {                     \
    __m512bh x0 = (__m512bh)_mm512_loadu_si512((X0P) + q * 16);                    \
    __m512bh x1 = (__m512bh)_mm512_loadu_si512((X1P) + q * 16);                    \
    D8_ROW(R, 0) D8_ROW(R, 1) D8_ROW(R, 2) D8_ROW(R, 3) D8_ROW(R, 4) D8_ROW(R, 5) D8_ROW(R, 6) D8_ROW(R, 7) \
  }
/* t[8 x 32] (+)= the accumulators (ADD: t's values added) */
#define D8_STORE(t, ADD)                                                                                        \
  {                                                                                                             \
    __m512 *acc_[16] = {&c00, &c01, &c10, &c11, &c20, &c21, &c30, &c31, &c40, &c41, &c50, &c51, &c60, &c61, &c70, &c71}; \
    for (int i_ = 0; i_ < 16; i_++)                                                                             \
      _mm512_storeu_ps((t) + 16 * i_, (ADD) ? _mm512_add_ps(_mm512_loadu_ps((t) + 16 * i_), *acc_[i_]) : *acc_[i_]); \
  }

/* The left half alone (one sliver): 8 accumulators, the same products
 * and sums per element */
#define H8_ROW(R, i)                                                               \
  {                                                                                \
    uint32_t v_;                                                                   \
    memcpy(&v_, (R)[i] + 2 * q, 4);                                                \
    h##i = _mm512_dpbf16_ps(h##i, (__m512bh)_mm512_set1_epi32((int)v_), x0);       \
  }

/* t[8 x 32] = the 8 rows (positions) times slivers b0, b1 (b1 NULL: the
 * right half is neither computed nor written — a pass of <= 16 output
 * channels computed 32, a 1-channel output 32 times its work) over the nt
 * taps tl[] (tl NULL: taps 0 .. nt - 1) */
IP_TARGET static void ip_tile(const uint16_t *const *rows, const int64_t *toff, const int *tl, int64_t nt,
                              int64_t kp, const uint32_t *b0, const uint32_t *b1, float *t) {
  if (!b1) {
    __m512 h0 = _mm512_setzero_ps(), h1 = h0, h2 = h0, h3 = h0, h4 = h0, h5 = h0, h6 = h0, h7 = h0;
    for (int64_t ti = 0; ti < nt; ti++) {
      int64_t tap = tl ? tl[ti] : ti;
      const uint16_t *rr[8];
      for (int i = 0; i < 8; i++) rr[i] = rows[i] + toff[tap];
      const uint32_t *x0p = b0 + tap * kp * 16;
      _Pragma("GCC unroll 2") for (int64_t q = 0; q < kp; q++) {
        __m512bh x0 = (__m512bh)_mm512_loadu_si512(x0p + q * 16);
        H8_ROW(rr, 0) H8_ROW(rr, 1) H8_ROW(rr, 2) H8_ROW(rr, 3) H8_ROW(rr, 4) H8_ROW(rr, 5) H8_ROW(rr, 6) H8_ROW(rr, 7)
      }
    }
    __m512 *acc[8] = {&h0, &h1, &h2, &h3, &h4, &h5, &h6, &h7};
    for (int i = 0; i < 8; i++) _mm512_storeu_ps(t + 32 * i, *acc[i]);
    return;
  }
  D8_DECL
  for (int64_t ti = 0; ti < nt; ti++) {
    int64_t tap = tl ? tl[ti] : ti;
    const uint16_t *rr[8];
    for (int i = 0; i < 8; i++) rr[i] = rows[i] + toff[tap];
    const uint32_t *x0p = b0 + tap * kp * 16, *x1p = b1 + tap * kp * 16;
    D8_LOOP(rr, x0p, x1p, kp)
  }
  D8_STORE(t, 0)
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* The tile's first m <= 8 positions, at offsets pos[i] of y: per output
 * channel c < nc, y[c oc + pos[i]] = bf16(t[i 32 + c] + bias[c]); where
 * (o_w 1) the 8 positions are two runs of 4 neighbours in output rows
 * (pos[4] = pos[0] + 4 where all 8 are neighbours of one row, else one row
 * of two 4-wide images, the (oh, n, ow) order), one 16-byte store a channel
 * or two 8-byte ones, else a store a value (8 images at one position, the
 * (oh, ow, n) order: the sums were rounded one at a time). Each
 * position's 32 sums (+ the bias row) are rounded as one row and the 8 x 32
 * bf16 block transposed in registers (8 x 8 blocks of 16-bit values within
 * each 128-bit lane). Before: a gather of each channel's 8 sums from t, 32 a
 * tile, which AMD cores run an element at a time (a tenth of a 64-channel
 * pass). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void ip_store8(const float *t, uint16_t *y,
                                                                       const int64_t *pos, int m, int runs, int64_t oc,
                                                                       int64_t nc, const float *bias) {
  __mmask16 kb0 = (__mmask16)(nc >= 16 ? 0xffff : (1u << nc) - 1u);
  __mmask16 kb1 = (__mmask16)(nc >= 32 ? 0xffff : nc > 16 ? (1u << (nc - 16)) - 1u : 0u);
  __m512 bl = bias ? _mm512_maskz_loadu_ps(kb0, bias) : _mm512_setzero_ps();
  __m512 bh = bias ? _mm512_maskz_loadu_ps(kb1, bias + 16) : _mm512_setzero_ps();
  __m512i r[8], u[8], v[8];
  for (int i = 0; i < 8; i++) {
    __m512 lo = _mm512_loadu_ps(t + 32 * i), hi = _mm512_loadu_ps(t + 32 * i + 16);
    if (bias) lo = _mm512_add_ps(lo, bl), hi = _mm512_add_ps(hi, bh);
    r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(rne_bf16(lo))),
                              _mm512_cvtepi32_epi16(rne_bf16(hi)), 1);
  }
  /* rows 2a, 2a + 1 interleaved by 16 bits, then 32, then 64: v[k] lane L = channel 8 L + k's 8 positions */
  for (int a = 0; a < 4; a++) {
    u[2 * a] = _mm512_unpacklo_epi16(r[2 * a], r[2 * a + 1]);
    u[2 * a + 1] = _mm512_unpackhi_epi16(r[2 * a], r[2 * a + 1]);
  }
  for (int a = 0; a < 2; a++) {
    r[4 * a] = _mm512_unpacklo_epi32(u[4 * a], u[4 * a + 2]);
    r[4 * a + 1] = _mm512_unpackhi_epi32(u[4 * a], u[4 * a + 2]);
    r[4 * a + 2] = _mm512_unpacklo_epi32(u[4 * a + 1], u[4 * a + 3]);
    r[4 * a + 3] = _mm512_unpackhi_epi32(u[4 * a + 1], u[4 * a + 3]);
  }
  for (int a = 0; a < 4; a++) {
    v[2 * a] = _mm512_unpacklo_epi64(r[a], r[a + 4]);
    v[2 * a + 1] = _mm512_unpackhi_epi64(r[a], r[a + 4]);
  }
  _Alignas(64) uint16_t blk[8][32];
  for (int k = 0; k < 8; k++) _mm512_store_si512(blk[k], v[k]);
  for (int64_t c = 0; c < nc; c++) {
    const uint16_t *b = blk[c % 8] + 8 * (c / 8);
    uint16_t *o = y + c * oc;
    if (!runs) {
      for (int i = 0; i < m; i++) o[pos[i]] = b[i];
      continue;
    }
    __m128i h = _mm_load_si128((const __m128i *)b);
    if (pos[4] == pos[0] + 4) { /* one run of 8: one 16-byte store */
      _mm_storeu_si128((__m128i *)(o + pos[0]), h);
      continue;
    }
    _mm_storel_epi64((__m128i *)(o + pos[0]), h);
    _mm_storel_epi64((__m128i *)(o + pos[4]), _mm_unpackhi_epi64(h, h));
  }
}
#endif

/* Task: positions [u / ncb * pb, +pb) x output channels of 32-block u % ncb */
static void ip_tasks(void *p, int64_t b, int64_t e) {
#if defined(__x86_64__) || defined(__i386__)
  const ipjob *j = p;
  const pgeom *g = j->g;
  int64_t P = g->Ho * g->Wo, NI = j->total / P, NW = NI * g->Wo; /* NW: a row of every image (reorder) */
  _Alignas(64) float t[8 * 32];
  for (int64_t u = b; u < e; u++) {
    int64_t p0 = u / j->ncb * j->pb, cb = u % j->ncb, p1 = p0 + j->pb < j->total ? p0 + j->pb : j->total;
    int64_t s0 = 2 * cb, c0 = 32 * cb, nc = j->cout - c0 < 32 ? j->cout - c0 : 32;
    const uint32_t *b0 = j->bp + s0 * j->kk * j->kp * 16, *b1 = s0 + 1 < j->nsl ? b0 + j->kk * j->kp * 16 : NULL;
    for (int64_t r = p0; r < p1; r += 8) {
      const uint16_t *rows[8];
      int64_t pos[8], oh0 = -1, ow0 = -1, n, oh, ow;
      int same = 1, tl[IP_MAX_TAPS];
      /* position r's (n, oh, ow), then one step a row (past p1: the last
       * again); divisions for each of the 8 took a sixth of a 64-channel
       * pass */
      if (j->reorder == 2) {
        oh = r / NW, ow = r / NI % g->Wo, n = r % NI;
      } else if (j->reorder) {
        oh = r / NW, n = r % NW / g->Wo, ow = r % g->Wo;
      } else {
        int64_t l = r % P;
        n = r / P, oh = l / g->Wo, ow = l % g->Wo;
      }
      for (int i = 0; i < 8; i++) {
        if (i > 0 && r + i < p1 && j->reorder == 2) {
          if (++n == NI && (n = 0, ++ow == g->Wo)) ow = 0, oh++;
        } else if (i > 0 && r + i < p1 && ++ow == g->Wo) {
          ow = 0;
          if (!j->reorder && ++oh == g->Ho) oh = 0, n++;
          if (j->reorder && ++n == NI) n = 0, oh++;
        }
        same &= i == 0 || (oh == oh0 && (j->reorder != 2 || ow == ow0));
        oh0 = oh, ow0 = ow;
        pos[i] = n * j->o_n + oh * j->o_h + ow * j->o_w;
        rows[i] = g->xn + ((n * g->hp + oh * g->sh) * g->wp + ow * g->sw) * g->C;
      }
      /* one output row: the taps whose input row is padding add zeros to every position (4 x 4
       * images with padding 1: 3 of 9 taps on two rows of four) */
      int64_t nt = 0;
      if (j->skip && same)
        for (int64_t tp = 0; tp < j->kk; tp++) {
          int64_t row = oh0 * g->sh + tp / g->kw * g->dh, col = ow0 * g->sw + tp % g->kw * g->dw;
          if (row >= g->pt && row < g->pt + g->ih && (j->reorder != 2 || (col >= g->pl && col < g->pl + g->iw)))
            tl[nt++] = (int)tp;
        }
      if (j->skip && same && nt < j->kk)
        ip_tile(rows, j->toff, tl, nt, j->kp, b0, b1, t);
      else
        ip_tile(rows, j->toff, NULL, j->kk, j->kp, b0, b1, t);
      int m = p1 - r < 8 ? (int)(p1 - r) : 8;
      ip_store8(t, j->y + c0 * j->o_c, pos, m, m == 8 && j->o_w == 1 && pos[3] - pos[0] == 3 && pos[7] - pos[4] == 3,
                j->o_c, nc, j->bias ? j->bias + c0 : NULL);
    }
  }
#else
  (void)p, (void)b, (void)e;
#endif
}

/* The weights wt [(tap, c)][cout] (patch_weights' layout, K = kk x C rows)
 * as slivers of 16 columns: d[((s kk + t) kp + q) 16 + j] = the pair of rows
 * (t, 2q), (t, 2q + 1) at column 16 s + j (0 past cout). */
typedef struct {
  const uint16_t *wt;
  uint32_t *d;
  int64_t kk, kp, cout;
} ippack;

static void ip_pack(void *p, int64_t b, int64_t e) {
  const ippack *x = p;
  int64_t C = 2 * x->kp;
  for (int64_t s = b; s < e; s++)
    for (int64_t t = 0; t < x->kk; t++)
      for (int64_t q = 0; q < x->kp; q++) {
        const uint16_t *r0 = x->wt + (t * C + 2 * q) * x->cout + 16 * s, *r1 = r0 + x->cout;
        uint32_t *d = x->d + ((s * x->kk + t) * x->kp + q) * 16;
#if defined(__x86_64__) || defined(__i386__)
        if (16 * s + 16 <= x->cout) {
          interleave16(d, r0, r1);
          continue;
        }
#endif
        for (int64_t jj = 0; jj < 16; jj++)
          d[jj] = 16 * s + jj < x->cout ? (uint32_t)r0[jj] | (uint32_t)r1[jj] << 16 : 0;
      }
}

/* Can a pass run as implicit patch rows: the dot products, channels in
 * pairs, at most IP_MAX_TAPS taps. */
static int ip_applies(int64_t C, int64_t kk) {
  return tpurt__cpu_avx512_bf16() && C % 2 == 0 && kk <= IP_MAX_TAPS;
}

/* y = the product of implicit patch rows (xn and the positions' geometry
 * in g: output (oh, ow) of image n reads pixel (oh sh, ow sw) of the
 * planes, shifted by toff[t] for tap t) and the weights wt [(t, c)][cout]
 * (C rows a tap; patch_weights' layout), stored at y + n o_n + co o_c + oh
 * o_h + ow o_w with the bias; 1 done, 0 no memory. */
/* One output channel (UNet's image out of 64 channels): a dot product per
 * position over its taps' channel runs and the weights [tap][c] — the tile
 * computed 16 columns for the one kept (64 -> 1 at 32^2, N 64: 4.6 ms, CPU
 * 2.2). */
typedef struct {
  const pgeom *g;
  const uint16_t *w; /* [tap][C] */
  const int64_t *toff;
  int64_t kk, P;
  float bias;
  uint16_t *y;
  int64_t o_n, o_h, o_w;
} dotjob;

#if defined(__x86_64__) || defined(__i386__)
IP_TARGET static float ip_dot(const uint16_t *row, const int64_t *toff, int64_t kk, int64_t C, const uint16_t *w) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  for (int64_t t = 0; t < kk; t++) {
    const uint16_t *x = row + toff[t], *v = w + t * C;
    int64_t c = 0;
    for (; c + 32 <= C; c += 32)
      a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(x + c), (__m512bh)_mm512_loadu_si512(v + c));
    if (c < C) {
      __mmask32 m = (__mmask32)((1ull << (C - c)) - 1);
      a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_maskz_loadu_epi16(m, x + c), (__m512bh)_mm512_maskz_loadu_epi16(m, v + c));
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}
#endif

static void ip_dot_tasks(void *p, int64_t b, int64_t e) {
#if defined(__x86_64__) || defined(__i386__)
  const dotjob *j = p;
  const pgeom *g = j->g;
  for (int64_t q = b; q < e; q++) {
    int64_t n = q / j->P, l = q % j->P, oh = l / g->Wo, ow = l % g->Wo;
    const uint16_t *row = g->xn + ((n * g->hp + oh * g->sh) * g->wp + ow * g->sw) * g->C;
    j->y[n * j->o_n + oh * j->o_h + ow * j->o_w] = tpurt__f32_to_bf16(ip_dot(row, j->toff, j->kk, g->C, j->w) + j->bias);
  }
#else
  (void)p, (void)b, (void)e;
#endif
}

static int ip_run(const pgeom *g, int64_t N, const uint16_t *wt, int64_t ntaps, const int64_t *toff, int64_t cout,
                  const float *bias, uint16_t *y, int64_t o_n, int64_t o_c, int64_t o_h, int64_t o_w, int skip) {
  if (cout == 1) { /* wt [(tap, c)][1]: the dot products' weights as they are */
    dotjob d = {g, wt, toff, ntaps, g->Ho * g->Wo, bias ? bias[0] : 0.0f, y, o_n, o_h, o_w};
    tpurt_parallel_for(N * d.P, 256, ip_dot_tasks, &d);
    atomic_fetch_add(&g_ip_passes, 1);
    return 1;
  }
  int64_t kp = g->C / 2, nsl = (cout + 15) / 16;
  uint32_t *bp = tpurt__scratch(1, (size_t)(nsl * ntaps * kp * 16) * 4);
  if (!bp) return 0;
  ippack pk = {wt, bp, ntaps, kp, cout};
  tpurt_parallel_for(nsl, 1, ip_pack, &pk);
  ipjob j;
  memset(&j, 0, sizeof j);
  j.g = g, j.bp = bp, j.kp = kp, j.kk = ntaps, j.cout = cout, j.nsl = nsl, j.total = N * g->Ho * g->Wo;
  j.ncb = (cout + 31) / 32;
  /* skip padding rows of taps (toff from ip_tap_offsets); narrow images at
   * unit stride in (oh, n, ow) order so that a tile is one output row
   * (where a tile's work, C x taps >= 1024, dwarfs finding its taps and
   * scattering its stores; paired, N 64: 512 at 4^2 1.10 / 1.16 forward / input
   * gradient, 128 at 4^2 1.08, 256 at 8^2 1.05-1.06; 256 -> 512 at stride
   * 2, one skipped row in four, 0.97 reordered: not reordered) */
  j.skip = skip && g->C * ntaps >= 1024;
  j.reorder = j.skip && g->sh == 1 && g->Wo < 8 && 8 % g->Wo == 0 && N * g->Wo % 8 == 0;
  /* images of <= 16 positions, 8 at a time: a tile is one position of 8
   * images, so the taps in the padding columns are skipped too (4 x 4 with
   * padding 1: 44 of an image's 144 (position, tap) pairs read padding;
   * tiles of one output row skipped 24 of them);
   * paired, N 64: 512 at 4^2 1.10 forward / input gradient, 256 -> 128 1.07,
   * N 16 512 1.06, 128 at 4^2 1.01; 8^2 measured 0.99 (7 % of the work
   * saved, the 8 stores of a channel scattered over 8 images) */
  if (j.skip && g->Ho * g->Wo <= 16 && N % 8 == 0) j.reorder = 2;
  /* position blocks of 64, fewer where that leaves < 8 tasks a thread */
  int64_t nth = tpurt_num_threads();
  j.pb = 64;
  while (j.pb > 8 && (j.total + j.pb - 1) / j.pb * j.ncb < 8 * nth) j.pb /= 2;
  memcpy(j.toff, toff, sizeof(int64_t) * (size_t)ntaps);
  j.bias = bias;
  j.y = y;
  j.o_n = o_n, j.o_c = o_c, j.o_h = o_h, j.o_w = o_w;
  int64_t tasks = (j.total + j.pb - 1) / j.pb * j.ncb;
  tpurt_parallel_for(tasks, 1, ip_tasks, &j);
  atomic_fetch_add(&g_ip_passes, 1);
  return 1;
}

/* toff[t] = the offset (elements) of tap t = (r, s) of the kernel in the
 * planes of g: (r dh, s dw) pixels */
static void ip_tap_offsets(const pgeom *g, int64_t *toff) {
  for (int64_t t = 0; t < g->kh * g->kw; t++) toff[t] = ((t / g->kw) * g->dh * g->wp + (t % g->kw) * g->dw) * g->C;
}

/* out = the pass on implicit patch rows, taps (r, s) of the kernel at
 * (r dh, s dw) of the planes. */
static int ip_forward(const pgeom *g, int64_t N, const uint16_t *wt, int64_t cout, const float *bias,
                      const tpurt_view *y) {
  int64_t kk = g->kh * g->kw, toff[IP_MAX_TAPS];
  ip_tap_offsets(g, toff);
  return ip_run(g, N, wt, kk, toff, cout, bias, (uint16_t *)hv(y->ptr), y->strides[0], y->strides[1], y->strides[3],
                y->strides[4], 1);
}

/* One pass on patch rows: src padded (pt, pl; hp x wp planes), the weights
 * laid out by patch_weights (A x B per tap, flipped for an input gradient),
 * out = the product (+ bias of `cout` channels). 1 done, 0 no memory. */
static int patch_pass(const tpurt_view *out, const tpurt_view *src, const tpurt_view *w, const tpurt_view *bias,
                      pgeom *pg, int64_t pt, int64_t pl, int64_t hp, int64_t wp, int64_t A, int64_t B, int flip,
                      int implicit) {
  int64_t cout = flip ? A : B;
  uint16_t *wt = tpurt__scratch(2, (size_t)(A * B * pg->kh * pg->kw) * 2);
  float *b = bias ? bias_f32(bias, cout, 5) : NULL;
  if (!wt || (bias && !b) || patch_nhwc(pg, src, pt, pl, hp, wp) != 0) return 0;
  patch_weights(wt, w, A, B, pg->kh, pg->kw, flip);
  if (implicit) {
    if (!ip_forward(pg, src->sizes[0], wt, cout, b, out)) return 0;
  } else if (!patch_forward(pg, src->sizes[0], wt, cout, b, out)) {
    return 0;
  }
  atomic_fetch_add(&g_passes, 1);
  return 1;
}

/* Should a forward pass or an input gradient run on patch rows? The dot
 * products (no tile unit; the tile unit's column space is what it was
 * built for), one group, >= 32 input channels. Returns 0 (no), 1 (rows
 * copied: small images — the column space keeps < 3/4 of its columns, see
 * dot_worth, or an image has <= 64 positions — unless 2 below) or 2 (rows read in place,
 * ip_forward: unit strides, channels in pairs, larger images — a pass the
 * column space would leave to the f32 path, or >= 64 channels at <= 256
 * positions). Paired in one process, Zen 5, 3 x 3, forward / input
 * gradient against the former choice: C 64 at 16^2 (f32 path) 1.41 /
 * 1.43, C 32 at 16^2 1.08 / 1.16, N 4, C 64 at 32^2 1.23, C 96 and 128 at
 * 16^2 (dot products) 1.06-1.10, N 64, C 64 at 16^2 (dot products) 1.14 /
 * 1.15, 64 -> 128 at 16^2 1.29; not taken where it measured slower: C 32
 * and 64 at 32^2 and 64^2 on the column space (0.58-0.85), stride 2
 * (0.89-0.94), <= 64 positions against copied rows (0.95-0.98) with < 128
 * channels in; with >= 128 channels in at <= 64 positions and a kernel
 * larger than 1 x 1, rows in place at any stride (ResNet-18's 256 at 8^2
 * and 512 at 4^2, N 64: 1.11-1.14; 256 -> 512 at stride 2: 1.05; N 16,
 * 128 at 8^2: 1.05; 1 x 1 kernels in place measured 0.45). Since the
 * fused column tasks and the in-place tiles' later changes, larger images
 * measure faster in place too (2026-12-06, Zen 5, N 64, 3 x 3, forward /
 * input gradient against the column space): 64 at 32^2 1.11 / 1.16, 128 at
 * 32^2 1.09 / 1.09, 192 -> 64 1.07 / 1.10, 64 at 64^2 1.17 / 1.19, 32 at
 * 32^2 1.27 / 1.23, stride 2 (forward) 128 at 32^2 1.22, 64 1.31; N 16:
 * 0.99-1.16 — so every kernel larger than 1 x 1 with rows in place.
 * TORCH_TPU_CONV_PATCH=0 / 1 / implicit: never / copied rows wherever they
 * can run / rows in place wherever they can run, else copied (tests,
 * measurements). */
enum { PATCH_RULE, PATCH_NEVER, PATCH_COPIED, PATCH_IMPLICIT };
/* TORCH_TPU_CONV_PATCH: unset (the shape rules), 0, 1 or implicit */
static int patch_env(void) {
  const char *e = getenv("TORCH_TPU_CONV_PATCH");
  if (!e || !*e) return PATCH_RULE;
  if (*e == '0') return PATCH_NEVER;
  if (*e == '1') return PATCH_COPIED;
  return strcmp(e, "implicit") ? PATCH_RULE : PATCH_IMPLICIT;
}

static int patch_worth(int64_t G, int64_t cin, int64_t kk, int unit, int64_t kept, int64_t computed, int64_t macs) {
  if (tpurt__bgemm_amx() || G != 1 || cin < 32) return 0;
  int ip = ip_applies(cin, kk), env = patch_env();
  if (env == PATCH_NEVER) return 0;
  if (env == PATCH_COPIED) return 1;
  if (env == PATCH_IMPLICIT) return ip ? 2 : 1;
  if (ip && kk > 1 && cin >= 128 && kept <= 64) return 2;
  if (4 * kept < 3 * computed || kept <= 64) return 1;
  if (ip && kk > 1) return 2;
  if (ip && unit && (!dot_worth(macs, kept, computed, 0) || (cin >= 64 && kept <= 256))) return 2;
  return 0;
}

/* Should an input gradient at strides > 1 run on implicit patch rows
 * (ip_phases)? The dot products, one group, >= 32 channels of dy in
 * pairs: also where the column space would run it (`dot`; paired, Zen 5,
 * N 64: 128 -> 256 at 16^2 1.34, 64 -> 128 at 32^2 1.14, 256 -> 512 at 8^2
 * 1.00; N 16: 0.97-1.05); TORCH_TPU_CONV_PATCH=0 and =1 (copied rows only)
 * never, =implicit wherever it can run. */
static int ip_strided_worth(int64_t G, int64_t cdy, int64_t kk) {
  if (tpurt__bgemm_amx() || G != 1 || cdy < 32 || !ip_applies(cdy, kk)) return 0;
  int env = patch_env();
  return env == PATCH_IMPLICIT || env == PATCH_RULE;
}

/* ------------------------------------------------ 1 x 1 products */

/* A 1 x 1 convolution at unit stride without padding is a product per
 * image: out_n [Cout x HW] = A [Cout x Cin] in_n [Cin x HW], the images' planes
 * as B's rows (their rows and columns merged into one stride) — the batched
 * bf16 GEMM instead of the column space or patch rows (paired, Zen 5, N 64,
 * forward / input gradient: 256 -> 128 at 16^2 2.2 / 1.8x, 64 -> 128 2.5 /
 * 2.6x, 192 -> 64 at 32^2 1.5 / 2.0x, 256 -> 128 at 8^2 1.9x; N 16, 32 -> 64
 * at 16^2 3.5x; planes of < 64 positions not: 4 x 4, 0.94x). The dot
 * products only (the tile unit's column space was not measured against
 * it). With a bias, out is first filled with it and the
 * product added once: bf16(acc + bias), one rounding, as the fused stores.
 * 1 done, 0 not applicable or no memory (the caller's f32 path rewrites
 * all of out). */
typedef struct {
  uint16_t *o;
  const uint16_t *b;
  int64_t bs, o_n, o_c, C, L;
} bfill_job;

static void bias_fill(void *p, int64_t b, int64_t e) {
  const bfill_job *j = p;
  for (int64_t r = b; r < e; r++) {
    uint16_t v = j->b[(r % j->C) * j->bs], *o = j->o + r / j->C * j->o_n + r % j->C * j->o_c;
    for (int64_t l = 0; l < j->L; l++) o[l] = v;
  }
}

static int merged(const tpurt_view *v) { return v->sizes[3] == 1 || v->strides[3] == v->sizes[4] * v->strides[4]; }

/* 1 x 1 kernels at strides > 1 without padding read x[:, :, ::sh, ::sw]:
 * copied dense, xs[(n C + c) Ho Wo + oh Wo + ow] (planes [b, e)), they run
 * as unit-stride passes — the forward pass as batched products (below), the
 * weight gradient on the column space of a unit stride. Before, the phase
 * planes of the stride (and their zeroing, all four phases for the one a
 * 1 x 1 kernel reads) were most of such a pass. */
typedef struct {
  const uint16_t *x;
  int64_t sn, sc, sh_, sw_, C, Ho, Wo, sh, sw;
  uint16_t *xs;
} sub_job;

static void subsample_planes(void *p, int64_t b, int64_t e) {
  const sub_job *j = p;
  for (int64_t u = b; u < e; u++) {
    const uint16_t *src = j->x + u / j->C * j->sn + u % j->C * j->sc;
    uint16_t *o = j->xs + u * j->Ho * j->Wo;
    for (int64_t i = 0; i < j->Ho; i++, o += j->Wo) copy_row_step(o, src + i * j->sh * j->sh_, j->Wo, j->sw, j->sw_);
  }
}

/* x [N, C, H, W] subsampled to Ho x Wo planes at strides (sh, sw) in scratch
 * `slot`, followed by `slack` zero bytes; NULL without memory */
static uint16_t *subsample(const tpurt_view *x, int64_t Ho, int64_t Wo, int64_t sh, int64_t sw, size_t slack,
                           int slot) {
  int64_t N = x->sizes[0], C = x->sizes[1];
  size_t bytes = (size_t)(N * C * Ho * Wo) * 2;
  uint16_t *xs = tpurt__scratch(slot, bytes + slack);
  if (!xs) return NULL;
  sub_job j = {hv(x->ptr), x->strides[0], x->strides[1], x->strides[3], x->strides[4], C, Ho, Wo, sh, sw, xs};
  tpurt_parallel_for(N * C, 1 + 8192 / (Ho * Wo + 1), subsample_planes, &j);
  memset((char *)xs + bytes, 0, slack);
  return xs;
}

/* a 1 x 1 kernel at a stride > 1 without padding, one group, on the dot
 * products (no tile unit) */
static int strided_one(const tpurt_view *w, const tpurt_conv3d_params *p) {
  return w->sizes[3] == 1 && w->sizes[4] == 1 && p->groups == 1 && (p->stride[1] > 1 || p->stride[2] > 1) &&
         p->padding[1] == 0 && p->padding[2] == 0 && patch_env() == PATCH_RULE && tpurt__cpu_avx512() &&
         !tpurt__bgemm_amx();
}

static int one_by_one(const tpurt_view *out, const tpurt_view *in, const tpurt_view *w, int transpose,
                      const tpurt_view *bias, const tpurt_conv3d_params *p) {
  int strided = !transpose && strided_one(w, p);
  if (tpurt__bgemm_amx() || w->sizes[3] != 1 || w->sizes[4] != 1 || p->groups != 1 ||
      (!strided && (p->stride[1] != 1 || p->stride[2] != 1 || !merged(in))) || p->padding[1] != 0 ||
      p->padding[2] != 0 || !merged(out) || (bias && bias->dtype != TPURT_BF16) || patch_env() != PATCH_RULE)
    return 0;
  int64_t N = in->sizes[0], Cin = in->sizes[1], Cout = out->sizes[1], L = out->sizes[3] * out->sizes[4];
  if (L < 64) return 0; /* 4 x 4 planes: 16-column products, 0.94 */
  const uint16_t *xs = strided ? subsample(in, out->sizes[3], out->sizes[4], p->stride[1], p->stride[2], 0, 0) : NULL;
  if (strided && !xs) return 0;
  uint16_t *o = hv(out->ptr);
  if (bias) {
    bfill_job bj = {o, hv(bias->ptr), bias->strides[0], out->strides[0], out->strides[1], Cout, L};
    if (out->strides[4] != 1) return 0;
    tpurt_parallel_for(N * Cout, 1 + 16384 / (L + 1), bias_fill, &bj);
  }
  /* A = w [Cout, Cin] (forward) or w^T (input gradient: w is [Cin_of_dy, Cout]) */
  tpurt__bmat A = {hv(w->ptr), TPURT_BF16, transpose ? w->strides[1] : w->strides[0],
                   transpose ? w->strides[0] : w->strides[1]};
  tpurt__bmat B = {strided ? (void *)xs : hv(in->ptr), TPURT_BF16, strided ? L : in->strides[1],
                   strided ? 1 : in->strides[4]};
  tpurt__bmat C = {o, TPURT_BF16, out->strides[1], out->strides[4]};
  if (!tpurt__bgemm(N, Cout, L, Cin, 1.0f, &A, 0, &B, strided ? Cin * L : in->strides[0], 0, bias ? 1.0f : 0.0f, &C,
                    out->strides[0]))
    return 0;
  atomic_fetch_add(&g_passes, 1);
  return 1;
}

/* ------------------------------------------------ forward */

/* y = conv(x, w) (+ bias): 5-D views with D = 1, all bf16. 1 done; 0 not
 * done (no memory): the caller runs the f32 path, which writes all of y. */
int tpurt__bconv_forward(const tpurt_view *y, const tpurt_view *x, const tpurt_view *w, const tpurt_view *bias,
                         const tpurt_conv3d_params *p) {
  int64_t N = x->sizes[0], Ci = x->sizes[1];
  int64_t Co = y->sizes[1], Ho = y->sizes[3], Wo = y->sizes[4], kh = w->sizes[3], kw = w->sizes[4];
  int64_t G = p->groups, Cig = Ci / G, Cog = Co / G, kk = kh * kw, Kd = Cig * kk;
  if (one_by_one(y, x, w, 0, bias, p)) return 1;
  planes g;
  plan_images(&g, x, Ho, Wo, kh, kw, p);
  int64_t sh = p->stride[1], sw = p->stride[2];
  int route = patch_worth(G, Ci, kk, sh == 1 && sw == 1, Ho * Wo, g.lp, N * Co * Ho * Wo * Kd);
  if (route) {
    int64_t dh = p->dilation[1], dw = p->dilation[2];
    pgeom pg = {NULL, 0, 0, 0, Ho, Wo, kh, kw, sh, sw, dh, dw, Kd, 0, 0, 0, 0};
    return patch_pass(y, x, w, bias, &pg, p->padding[1], p->padding[2], (Ho - 1) * sh + (kh - 1) * dh + 1,
                      (Wo - 1) * sw + (kw - 1) * dw + 1, Ci, Co, 0, route == 2);
  }
  if (!dot_worth(N * Co * Ho * Wo * Kd, Ho * Wo, g.lp, 0)) return 0;
  int64_t *koff = koff_buf(Kd, 1);
  float *b = bias ? bias_f32(bias, Co, 4) : NULL;
  /* weights [Co, Kd] contiguous: the view itself, or a copy */
  const uint16_t *wv = hv(w->ptr);
  int dense = 1;
  for (int d = 4, st = 1; d >= 0; st *= (int)w->sizes[d], d--)
    if (w->sizes[d] != 1 && w->strides[d] != st) dense = 0;
  uint16_t *wc = dense ? (uint16_t *)wv : tpurt__scratch(2, (size_t)(Co * Kd) * 2);
  if (!koff || (bias && !b) || !wc || pad(&g, x, 0, 0) < 0) return 0;
  for (int64_t o = 0; o < Co && !dense; o++)
    for (int64_t c = 0; c < Cig; c++)
      for (int64_t r = 0; r < kh; r++)
        for (int64_t s = 0; s < kw; s++)
          wc[(o * Cig + c) * kk + r * kw + s] = wv[o * w->strides[0] + c * w->strides[1] + r * w->strides[3] + s * w->strides[4]];
  for (int64_t gi = 0; gi < G; gi++) {
    image_koff(&g, gi * Cig, Cig, kh, kw, p, koff);
    cjob j = {{NULL, col_pack_b, col_out}, &g, koff, Kd, N * g.lp, Ho, Wo,
              (uint16_t *)hv(y->ptr) + gi * Cog * y->strides[1], y->strides[0], y->strides[1], y->strides[3],
              y->strides[4], b ? b + gi * Cog : NULL, NULL, 0, NULL, 0};
    tpurt__bmat A = {wc + gi * Cog * Kd, TPURT_BF16, Kd, 1};
    if (!tpurt__bgemm_hooked(Cog, N * g.lp, Kd, &A, &j.h)) return 0; /* the f32 path rewrites the whole output */
    atomic_fetch_add(&g_passes, 1);
  }
  return 1;
}

/* ------------------------------------------------ input gradient */

/* Taps of one dimension reaching dx phase a (positions a, a + s, ..): tap
 * r with (a + pad - r dil) a multiple of s, at dy offset d = (a + pad - r
 * dil) / s from the phase's row i. Returns their count. */
static int64_t phase_taps(int64_t a, int64_t s, int64_t pad, int64_t dil, int64_t k, int64_t *tap, int64_t *off) {
  int64_t n = 0;
  for (int64_t r = 0; r < k; r++) {
    int64_t d = a + pad - r * dil;
    if (((d % s) + s) % s) continue;
    tap[n] = r;
    off[n++] = d >= 0 ? d / s : -((-d) / s);
  }
  return n;
}

#define BC_MAX_K 64 /* taps per kernel dimension (else the f32 path) */

/* dx phase (ah, aw) that no tap reaches: zero (plus the bias) */
static void untouched_phase(const tpurt_view *dx, int64_t ah, int64_t aw, int64_t hq, int64_t wq, int64_t sh,
                            int64_t sw, const float *b) {
  uint16_t *dxp = hv(dx->ptr);
  for (int64_t n = 0; n < dx->sizes[0]; n++)
    for (int64_t c = 0; c < dx->sizes[1]; c++)
      for (int64_t i = 0; i < hq; i++)
        for (int64_t q = 0; q < wq; q++)
          dxp[n * dx->strides[0] + c * dx->strides[1] + (i * sh + ah) * dx->strides[3] + (q * sw + aw) * dx->strides[4]] =
              tpurt__f32_to_bf16(b ? b[c] : 0.0f);
}

/* Input gradient at strides > 1 on implicit patch rows, phase by phase:
 * dx positions (i sh + ah, j sw + aw) are a unit-stride product of dy
 * (channels-last planes padded by dmin rows and emin columns) with the
 * phase's taps (kernel rows th, dy row offsets oh; columns tw, ow) and
 * wt[(t, co)][ci] = w[co, ci, th[u], tw[v]]. Before, these passes ran the
 * f32 path (an im2col product and col2im: ResNet's stride-2 input
 * gradients at ~300 GFLOP/s); paired in one process, Zen 5, 3 x 3 stride
 * 2, N 16: 32 -> 64 at 32^2 1.26x, 64 -> 128 at 16^2 1.38x, 128 -> 256 at
 * 8^2 1.67x (N 64, 64 -> 128 at 32^2 stays on the column space: 1.01x). */
typedef struct {
  uint16_t *wt;
  const uint16_t *wv;
  int64_t Ci, Co, nh, nw, s0, s1, s3, s4;
  const int64_t *th, *tw;
} phw_job;

static void phase_weight_rows(void *p, int64_t b, int64_t e) {
  const phw_job *j = p;
  for (int64_t co = b; co < e; co++)
    for (int64_t u = 0; u < j->nh; u++)
      for (int64_t v = 0; v < j->nw; v++) {
        const uint16_t *src = j->wv + co * j->s0 + j->th[u] * j->s3 + j->tw[v] * j->s4;
        uint16_t *d = j->wt + ((u * j->nw + v) * j->Co + co) * j->Ci;
        for (int64_t ci = 0; ci < j->Ci; ci++) d[ci] = src[ci * j->s1];
      }
}

static int ip_phases(const tpurt_view *dx, const tpurt_view *dy, const tpurt_view *w, const tpurt_view *bias,
                     const tpurt_conv3d_params *p, int64_t dmin, int64_t dmax, int64_t emin, int64_t emax) {
  int64_t N = dx->sizes[0], Ci = dx->sizes[1], H = dx->sizes[3], W = dx->sizes[4];
  int64_t Co = dy->sizes[1], Ho = dy->sizes[3], Wo = dy->sizes[4], kh = w->sizes[3], kw = w->sizes[4];
  int64_t sh = p->stride[1], sw = p->stride[2], ph = p->padding[1], pw = p->padding[2], dh = p->dilation[1],
          dw = p->dilation[2];
  int64_t hp = dmin + (dmax > Ho ? dmax : Ho), wp = emin + (emax > Wo ? emax : Wo);
  pgeom pg = {NULL, 0, 0, 0, 0, 0, kh, kw, 1, 1, dh, dw, 0, 0, 0, 0, 0};
  uint16_t *wt = tpurt__scratch(2, (size_t)(Ci * Co * kh * kw) * 2);
  float *b = bias ? bias_f32(bias, Ci, 5) : NULL;
  if (!wt || (bias && !b) || patch_nhwc(&pg, dy, dmin, emin, hp, wp) != 0) return 0;
  uint16_t *dxp = hv(dx->ptr);
  int64_t th[BC_MAX_K], oh_[BC_MAX_K], tw[BC_MAX_K], ow_[BC_MAX_K], toff[IP_MAX_TAPS];
  for (int64_t ah = 0; ah < sh && ah < H; ah++)
    for (int64_t aw = 0; aw < sw && aw < W; aw++) {
      int64_t nh = phase_taps(ah, sh, ph, dh, kh, th, oh_), nw = phase_taps(aw, sw, pw, dw, kw, tw, ow_);
      int64_t hq = (H - ah + sh - 1) / sh, wq = (W - aw + sw - 1) / sw;
      uint16_t *base = dxp + ah * dx->strides[3] + aw * dx->strides[4];
      if (!nh || !nw) {
        untouched_phase(dx, ah, aw, hq, wq, sh, sw, b);
        continue;
      }
      phw_job pj = {wt, hv(w->ptr), Ci, Co, nh, nw, w->strides[0], w->strides[1], w->strides[3], w->strides[4], th, tw};
      tpurt_parallel_for(Co, 8, phase_weight_rows, &pj);
      for (int64_t u = 0; u < nh; u++)
        for (int64_t v = 0; v < nw; v++) toff[u * nw + v] = ((oh_[u] + dmin) * wp + (ow_[v] + emin)) * Co;
      pg.Ho = hq, pg.Wo = wq;
      if (!ip_run(&pg, N, wt, nh * nw, toff, Ci, b, base, dx->strides[0], dx->strides[1], sh * dx->strides[3],
                  sw * dx->strides[4], 0))
        return 0;
      atomic_fetch_add(&g_passes, 1);
    }
  return 1;
}

int tpurt__bconv_backward_input(const tpurt_view *dx, const tpurt_view *dy, const tpurt_view *w,
                                const tpurt_view *bias, const tpurt_conv3d_params *p) {
  int64_t N = dx->sizes[0], Ci = dx->sizes[1], H = dx->sizes[3], W = dx->sizes[4];
  int64_t Co = dy->sizes[1], Ho = dy->sizes[3], Wo = dy->sizes[4], kh = w->sizes[3], kw = w->sizes[4];
  int64_t sh = p->stride[1], sw = p->stride[2], ph = p->padding[1], pw = p->padding[2], dh = p->dilation[1],
          dw = p->dilation[2], G = p->groups;
  int64_t Cig = Ci / G, Cog = Co / G, kk = kh * kw;
  if (kh > BC_MAX_K || kw > BC_MAX_K || sh > BC_MAX_K || sw > BC_MAX_K) return 0;
  if (!bias && one_by_one(dx, dy, w, 1, NULL, p)) return 1;
  /* offsets of every phase: the padding of dy */
  int64_t th[BC_MAX_K], oh_[BC_MAX_K], tw[BC_MAX_K], ow_[BC_MAX_K];
  int64_t dmin = 0, dmax = 0, emin = 0, emax = 0;
  for (int64_t a = 0; a < sh && a < H; a++) {
    int64_t n = phase_taps(a, sh, ph, dh, kh, th, oh_), hq = (H - a + sh - 1) / sh;
    for (int64_t t = 0; t < n; t++) {
      if (-oh_[t] > dmin) dmin = -oh_[t];
      if (hq - 1 + oh_[t] + 1 > dmax) dmax = hq + oh_[t];
    }
  }
  for (int64_t a = 0; a < sw && a < W; a++) {
    int64_t n = phase_taps(a, sw, pw, dw, kw, tw, ow_), wq = (W - a + sw - 1) / sw;
    for (int64_t t = 0; t < n; t++) {
      if (-ow_[t] > emin) emin = -ow_[t];
      if (wq + ow_[t] > emax) emax = wq + ow_[t];
    }
  }
  int64_t hqmax = (H + sh - 1) / sh;
  planes g;
  plan(&g, N, Co, Ho, Wo, 1, 1, dmin, emin, dmin + dmax, emin + emax, hqmax);
  int64_t computed = 0; /* columns of an image over the phases */
  for (int64_t ah = 0; ah < sh && ah < H; ah++)
    for (int64_t aw = 0; aw < sw && aw < W; aw++)
      computed += ((H - ah + sh - 1) / sh * g.wq + 15) / 16 * 16;
  int64_t padt = (kh - 1) * dh - ph, padl = (kw - 1) * dw - pw;
  int route;
  if (sh == 1 && sw == 1 && padt >= 0 && padl >= 0 && Ho + 2 * padt - (kh - 1) * dh == H &&
      Wo + 2 * padl - (kw - 1) * dw == W &&
      (route = patch_worth(G, Co, kk, 1, H * W, computed, N * Co * Ho * Wo * Cig * kk))) {
    /* the forward pass of dy padded by (k - 1) dil - pad, weights flipped
     * and transposed: wt[(r', s', co)][ci] = w[co, ci, kh - 1 - r', kw - 1 - s'] */
    pgeom pg = {NULL, 0, 0, 0, H, W, kh, kw, 1, 1, dh, dw, Co * kk, 0, 0, 0, 0};
    return patch_pass(dx, dy, w, bias, &pg, padt, padl, H + (kh - 1) * dh, W + (kw - 1) * dw, Ci, Co, 1, route == 2);
  }
  int dot = dot_worth(N * Co * Ho * Wo * Cig * kk, H * W, computed, 0);
  if ((sh > 1 || sw > 1) && ip_strided_worth(G, Co, kk)) return ip_phases(dx, dy, w, bias, p, dmin, dmax, emin, emax);
  if (!dot) return 0;
  /* the phases' column spaces are at most hqmax rows: g.lp bounds each */
  int64_t *koff = koff_buf(Cog * kk, 1);
  float *b = bias ? bias_f32(bias, Ci, 4) : NULL;
  uint16_t *wt = tpurt__scratch(2, (size_t)(Cig * Cog * kk) * 2);
  if (!koff || (bias && !b) || !wt || pad(&g, dy, 0, 0) < 0) return 0;
  const uint16_t *wv = hv(w->ptr);
  uint16_t *dxp = hv(dx->ptr);
  for (int64_t ah = 0; ah < sh && ah < H; ah++)
    for (int64_t aw = 0; aw < sw && aw < W; aw++) {
      int64_t nh = phase_taps(ah, sh, ph, dh, kh, th, oh_), nw = phase_taps(aw, sw, pw, dw, kw, tw, ow_);
      int64_t hq = (H - ah + sh - 1) / sh, wq = (W - aw + sw - 1) / sw, nt = nh * nw;
      if (!nt) {
        untouched_phase(dx, ah, aw, hq, wq, sh, sw, b);
        continue;
      }
      planes gp = g;
      gp.lp = (hq * g.wq + 15) / 16 * 16;
      for (int64_t gi = 0; gi < G; gi++) {
        /* A[ci][co nt + t] = w[co][ci][tap t]; koff of (co, t) */
        for (int64_t ci = 0; ci < Cig; ci++)
          for (int64_t co = 0; co < Cog; co++)
            for (int64_t u = 0; u < nh; u++)
              for (int64_t v = 0; v < nw; v++)
                wt[(ci * Cog + co) * nt + u * nw + v] =
                    wv[(gi * Cog + co) * w->strides[0] + ci * w->strides[1] + th[u] * w->strides[3] + tw[v] * w->strides[4]];
        for (int64_t co = 0; co < Cog; co++)
          for (int64_t u = 0; u < nh; u++)
            for (int64_t v = 0; v < nw; v++)
              koff[co * nt + u * nw + v] = tap_off(&gp, gi * Cog + co, g.pt + oh_[u], g.pl + ow_[v]);
        cjob j = {{NULL, col_pack_b, col_out}, &gp, koff, Cog * nt, N * gp.lp, hq, wq,
                  dxp + gi * Cig * dx->strides[1] + ah * dx->strides[3] + aw * dx->strides[4], dx->strides[0],
                  dx->strides[1], sh * dx->strides[3], sw * dx->strides[4], b ? b + gi * Cig : NULL, NULL, 0, NULL, 0};
        tpurt__bmat A = {wt, TPURT_BF16, Cog * nt, 1};
        if (!tpurt__bgemm_hooked(Cig, N * gp.lp, Cog * nt, &A, &j.h)) return 0; /* the f32 path rewrites the whole output */
        atomic_fetch_add(&g_passes, 1);
      }
    }
  return 1;
}

/* ------------------------------------------------ weight gradient */

/* ------------------------------------------------ weight gradient on patch rows in place
 *
 * dw[co, c, tap] = sum over positions of dy[pos, co] x[pixel(pos) + tap, c]:
 * a product with K = positions, whose pairs (2q, 2q + 1) are two
 * neighbours of one image — in dy's [n, co, h, w] rows one 32-bit load (8
 * output channels broadcast, as in bgemm.c's row kernel) — and whose
 * columns (tap, 32 channels) are the two positions' channel runs in the
 * channels-last planes of x, interleaved into pairs (one permute per 16
 * channels) into a panel of up to IW_KC positions. A task takes 128
 * output and 32 input channels at every tap; its sums stay in the
 * thread's f32 buffer over the panels, then go to dw with one rounding.
 * Small images (<= 64 positions: the f32 path before, the column space
 * wastes columns there); images of an even number of positions, channels
 * in 32s, dy rows unit-stride. Paired in one process (tpurt_bench_ab, Zen
 * 5, 3 x 3, new / f32 path): N 16, 128 at 8^2 1.52x, 256 at 4^2 1.21x,
 * 64 -> 128 s2 at 16^2 1.51x, 128 -> 256 s2 at 8^2 1.24x; N 64, 128 at 8^2
 * 1.44x, 256 -> 128 at 4^2 1.71x. The
 * zero padding is multiplied by dy, as on the f32 path (an Inf in dy gives
 * NaN at the taps that meet it only in the padding, as CPU's float64 and
 * bf16 convolutions do; CPU's float32 one skips the padding). */
#define IW_KC 2048 /* positions of a panel (whole images) */
typedef struct {
  const pgeom *g;
  const uint16_t *dy;
  int64_t d_n, d_c, P, Co, N, ncb, ipc; /* ipc: images a panel */
  int64_t toff[IP_MAX_TAPS];
  uint16_t *dw;
  int64_t w_o, w_c, w_r, w_s;
  _Atomic int failed;
} iwjob;

#if defined(__x86_64__) || defined(__i386__)
/* t[8 x 32] (+)= dy rows co0.. (8; past Co the last) of images [n0, n1)
 * times the panel's slivers b0, b1 (pairs of positions, image after image) */
IP_TARGET static void iw_tile(const iwjob *j, int64_t co0, int64_t n0, int64_t n1, const uint32_t *b0,
                              const uint32_t *b1, float *t, int add) {
  D8_DECL
  int64_t kp = j->P / 2;
  const uint16_t *r[8], *rr[8];
  for (int i = 0; i < 8; i++) r[i] = j->dy + (co0 + i < j->Co ? co0 + i : j->Co - 1) * j->d_c;
  for (int64_t n = n0; n < n1; n++) {
    for (int i = 0; i < 8; i++) rr[i] = r[i] + n * j->d_n;
    const uint32_t *x0p = b0 + (n - n0) * kp * 16, *x1p = b1 + (n - n0) * kp * 16;
    D8_LOOP(rr, x0p, x1p, kp)
  }
  D8_STORE(t, add)
}
#endif

/* Tasks [b, e): output channels 128 (u / ncb).. x input channels 32 (u %
 * ncb).., every tap: a task writes whole runs of dw (co, its 32 channels,
 * every tap), which no other task touches (tasks by tap wrote 32 scattered
 * elements of every one of dw's lines, each line from every tap's task:
 * the two threads took the lines from each other) */
#define IW_CO 128
static void iw_tasks(void *p, int64_t b, int64_t e) {
#if defined(__x86_64__) || defined(__i386__)
  iwjob *j = p;
  const pgeom *g = j->g;
  int64_t kk = g->kh * g->kw, panel = (j->ipc < j->N ? j->ipc : j->N) * j->P;
  /* the thread's accumulators [tap][IW_CO co][32] and panel, kept between
   * calls (a malloc of this size each call was an mmap and page faults) */
  size_t abytes = ((size_t)(kk * IW_CO * 32) * 4 + 63) & ~(size_t)63;
  size_t pbytes = (size_t)(panel / 2 * 32) * 4;
  char *mem = tpurt__bgemm_thread_buf(abytes + pbytes + (size_t)panel * sizeof(int64_t));
  if (!mem) {
    j->failed = 1;
    return;
  }
  float *acc = (float *)mem;
  uint32_t *b0 = (uint32_t *)(mem + abytes), *b1 = b0 + panel / 2 * 16;
  int64_t *poff = (int64_t *)(mem + abytes + pbytes); /* a panel position's image element, tap 0 */
  for (int64_t u = b; u < e; u++) {
    int64_t co0 = IW_CO * (u / j->ncb), c0 = 32 * (u % j->ncb), nco = j->Co - co0 < IW_CO ? j->Co - co0 : IW_CO;
    for (int64_t n0 = 0; n0 < j->N; n0 += j->ipc) {
      int64_t n1 = n0 + j->ipc < j->N ? n0 + j->ipc : j->N, np = (n1 - n0) * j->P;
      /* the positions' offsets once for every tap (divisions per position
       * and tap cost as much as the products of a 64-channel pass) */
      for (int64_t n = n0, q = 0; n < n1; n++)
        for (int64_t oh = 0; oh < g->Ho; oh++)
          for (int64_t ow = 0; ow < g->Wo; ow++, q++)
            poff[q] = ((n * g->hp + oh * g->sh) * g->wp + ow * g->sw) * g->C + c0;
      for (int64_t t = 0; t < kk; t++) {
        /* the panel: position pairs of images n0..n1, 32 channels at tap t */
        const uint16_t *xt = g->xn + j->toff[t];
        for (int64_t q = 0; q < np / 2; q++) {
          const uint16_t *x0 = xt + poff[2 * q], *x1 = xt + poff[2 * q + 1];
          interleave16(b0 + q * 16, x0, x1);
          interleave16(b1 + q * 16, x0 + 16, x1 + 16);
        }
        for (int64_t r = 0; r < nco; r += 8) iw_tile(j, co0 + r, n0, n1, b0, b1, acc + (t * IW_CO + r) * 32, n0 > 0);
      }
    }
    int64_t woff[IP_MAX_TAPS];
    for (int64_t t = 0; t < kk; t++) woff[t] = t / g->kw * j->w_r + t % g->kw * j->w_s;
    for (int64_t co = 0; co < nco; co++)
      for (int64_t c = 0; c < 32; c++) {
        uint16_t *o = j->dw + (co0 + co) * j->w_o + (c0 + c) * j->w_c;
        const float *a = acc + co * 32 + c;
        for (int64_t t = 0; t < kk; t++) o[woff[t]] = tpurt__f32_to_bf16(a[t * IW_CO * 32]);
      }
  }
#else
  (void)p, (void)b, (void)e;
#endif
}

/* Should a weight gradient run on patch rows in place: the dot products,
 * one group, channels in 32s, an even number of positions an image and
 * small images (<= 64 positions: the f32 path before; <= 256 with a
 * kernel larger than 1 x 1: paired against the column space, N 64, 128 at
 * 16^2 1.17-1.21, 64 -> 128 1.30, 256 -> 128 1.04, 64 at 16^2 1.05; at
 * least a task a thread: 32 -> 32 and 32 -> 64, one task, 0.60-0.75; at
 * 32^2 0.48-0.99, 1 x 1 at 16^2 0.56; re-measured 2026-12-06 at 32^2 and
 * 64^2 after the panel's positions were computed once for every tap: N 64,
 * 64 at 32^2 1.43, 128 -> 64 1.30, 192 -> 64 1.14, 64 at 64^2 1.24; N 16
 * 1.16-1.23; stride 2 0.99-1.00 — so images of any size),
 * TORCH_TPU_CONV_PATCH=implicit wherever it can run, =0 / =1 never. */
static int iw_worth(int64_t G, int64_t C, int64_t Co, int64_t kk, int64_t P, const tpurt_view *dy) {
  if (tpurt__bgemm_amx() || !tpurt__cpu_avx512_bf16() || G != 1 || C % 32 || P % 2 || kk > IP_MAX_TAPS ||
      dy->strides[4] != 1 || dy->strides[3] != dy->sizes[4])
    return 0;
  int env = patch_env();
  int64_t tasks = (Co + IW_CO - 1) / IW_CO * (C / 32);
  return env == PATCH_IMPLICIT ||
         (env == PATCH_RULE && (P <= 64 || (kk > 1 && tasks >= tpurt_num_threads())));
}

static int iw_pass(const tpurt_view *dwv, const tpurt_view *dy, const tpurt_view *x, const tpurt_conv3d_params *p) {
  int64_t N = x->sizes[0], Co = dy->sizes[1], Ho = dy->sizes[3], Wo = dy->sizes[4], kh = dwv->sizes[3],
          kw = dwv->sizes[4], P = Ho * Wo;
  int64_t sh = p->stride[1], sw = p->stride[2], dh = p->dilation[1], dw = p->dilation[2];
  pgeom pg = {NULL, 0, 0, 0, Ho, Wo, kh, kw, sh, sw, dh, dw, 0, 0, 0, 0, 0};
  if (patch_nhwc(&pg, x, p->padding[1], p->padding[2], (Ho - 1) * sh + (kh - 1) * dh + 1,
                 (Wo - 1) * sw + (kw - 1) * dw + 1) != 0)
    return 0;
  iwjob j;
  memset(&j, 0, sizeof j);
  j.g = &pg, j.dy = hv(dy->ptr), j.d_n = dy->strides[0], j.d_c = dy->strides[1], j.P = P, j.Co = Co, j.N = N;
  j.ncb = pg.C / 32;
  j.ipc = IW_KC / P > 0 ? IW_KC / P : 1;
  ip_tap_offsets(&pg, j.toff);
  j.dw = hv(dwv->ptr), j.w_o = dwv->strides[0], j.w_c = dwv->strides[1], j.w_r = dwv->strides[3],
  j.w_s = dwv->strides[4];
  tpurt_parallel_for((Co + IW_CO - 1) / IW_CO * j.ncb, 1, iw_tasks, &j);
  if (j.failed) return 0; /* the f32 path rewrites the whole output */
  atomic_fetch_add(&g_passes, 1);
  atomic_fetch_add(&g_ip_passes, 1);
  return 1;
}

/* ------------------------------------------------ weight gradient, few channels */

/* Weight gradients with at most SW_MAX_CO output channels or one input
 * channel (an image model's output or input convolution), unit stride and
 * dilation, one group: dw[co, ci, r, s] = sum over images n and positions
 * (oh, ow) of dy[n, co, oh, ow] x[n, ci, oh + r - pt, ow + s - pl]. The
 * column-space product rounds the small side up to 16 columns (a
 * one-channel output computed 16 for each kept one) and such passes were
 * below dot_worth's sizes anyway: UNet's 64 -> 1 output convolution at
 * 32^2, batch 64, took 6.0 ms on the f32 path against 2.8 for CPU torch.
 * Here a task is one (co, ci) pair: per image the dy plane and the
 * zero-padded x plane in f32 (exact) in the thread's buffer, a vector
 * accumulator per tap summing the products along the rows in f32, the
 * lanes added once at the end and rounded once to bf16. The order of the
 * sums depends on the shapes only. Paired against the former routes (Zen
 * 5, 3 x 3): 64 -> 1 at 32^2 4.6x, 32 -> 1 6.6x, 64 -> 2 1.65x, 1 -> 64
 * 1.10x, 1 -> 32 1.26x; 64 -> 3 1.03x, 64 -> 4 0.90x and 3 -> 64 0.58x (the
 * column space's products serve those better: the x planes are converted
 * once a pair here), so not those. Not measured against the tile unit:
 * AMX hosts keep their route. */
#define SW_MAX_CO 2
#define SW_MAX_TAPS 49
typedef struct {
  const uint16_t *dy, *x;
  int64_t d_n, d_c, d_h, d_w, x_n, x_c, x_h, x_w;
  int64_t H, W, Ho, Wo, kh, kw, pt, pl, Hp, Wp, N, Ci;
  uint16_t *dw;
  int64_t w_o, w_c, w_r, w_s;
  _Atomic int failed;
} swjob;

#if defined(__x86_64__) || defined(__i386__)
#define SW_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
/* d[0..n) = the bf16 values s[0], s[st], .. in f32 */
SW_TARGET static void sw_row(float *d, const uint16_t *s, int64_t st, int64_t n) {
  if (st != 1) {
    for (int64_t i = 0; i < n; i++) d[i] = tpurt__bf16_to_f32(s[i * st]);
    return;
  }
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1u);
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, s + i));
    _mm512_mask_storeu_ps(d + i, k, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
  }
}

/* acc[r kw + s] += the products of the dy plane (Ho x Wo) with the padded
 * x plane (rows of Wp) at tap (r, s); inlined with constant kh, kw for 3 x 3
 * (the accumulators stay in registers) */
SW_TARGET static inline __attribute__((always_inline)) void sw_taps(const float *dyf, const float *xp, int64_t Ho,
                                                                     int64_t Wo, int64_t Wp, int64_t kh, int64_t kw,
                                                                     __m512 *acc) {
  for (int64_t oh = 0; oh < Ho; oh++)
    for (int64_t ow = 0; ow < Wo; ow += 16) {
      __mmask16 k = (__mmask16)(Wo - ow >= 16 ? 0xffff : (1u << (Wo - ow)) - 1u);
      __m512 d = _mm512_maskz_loadu_ps(k, dyf + oh * Wo + ow);
      for (int64_t r = 0; r < kh; r++) {
        const float *xr = xp + (oh + r) * Wp + ow;
        for (int64_t s = 0; s < kw; s++)
          acc[r * kw + s] = _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(k, xr + s), acc[r * kw + s]);
      }
    }
}
SW_TARGET static void sw_taps3(const float *dyf, const float *xp, int64_t Ho, int64_t Wo, int64_t Wp, __m512 *acc) {
  sw_taps(dyf, xp, Ho, Wo, Wp, 3, 3, acc);
}
SW_TARGET static void sw_taps_any(const float *dyf, const float *xp, int64_t Ho, int64_t Wo, int64_t Wp, int64_t kh,
                                  int64_t kw, __m512 *acc) {
  sw_taps(dyf, xp, Ho, Wo, Wp, kh, kw, acc);
}

SW_TARGET static void sw_tasks(void *p, int64_t b, int64_t e) {
  swjob *j = p;
  int64_t kk = j->kh * j->kw, dyn = j->Ho * j->Wo;
  float *dyf = tpurt__bgemm_thread_buf((size_t)(dyn + j->Hp * j->Wp + 32) * 4), *xp = dyf ? dyf + dyn + 16 : NULL;
  if (!dyf) {
    j->failed = 1;
    return;
  }
  for (int64_t u = b; u < e; u++) {
    int64_t co = u / j->Ci, ci = u % j->Ci;
    __m512 acc[SW_MAX_TAPS];
    for (int64_t t = 0; t < kk; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t n = 0; n < j->N; n++) {
      const uint16_t *dp = j->dy + n * j->d_n + co * j->d_c, *xs = j->x + n * j->x_n + ci * j->x_c;
      for (int64_t oh = 0; oh < j->Ho; oh++) sw_row(dyf + oh * j->Wo, dp + oh * j->d_h, j->d_w, j->Wo);
      int64_t c0 = j->pl > 0 ? j->pl : 0, c1 = j->pl + j->W < j->Wp ? j->pl + j->W : j->Wp;
      for (int64_t i = 0; i < j->Hp; i++) {
        float *row = xp + i * j->Wp;
        int64_t ih = i - j->pt;
        if (ih < 0 || ih >= j->H || c1 <= c0) {
          memset(row, 0, (size_t)j->Wp * 4);
          continue;
        }
        memset(row, 0, (size_t)c0 * 4);
        sw_row(row + c0, xs + ih * j->x_h + (c0 - j->pl) * j->x_w, j->x_w, c1 - c0);
        memset(row + c1, 0, (size_t)(j->Wp - c1) * 4);
      }
      if (j->kh == 3 && j->kw == 3)
        sw_taps3(dyf, xp, j->Ho, j->Wo, j->Wp, acc);
      else
        sw_taps_any(dyf, xp, j->Ho, j->Wo, j->Wp, j->kh, j->kw, acc);
    }
    for (int64_t t = 0; t < kk; t++)
      j->dw[co * j->w_o + ci * j->w_c + t / j->kw * j->w_r + t % j->kw * j->w_s] =
          tpurt__f32_to_bf16(_mm512_reduce_add_ps(acc[t]));
  }
}
#endif

static int sw_worth(int64_t G, int64_t Ci, int64_t Co, int64_t kk, const tpurt_conv3d_params *p) {
  return tpurt__cpu_avx512() && !tpurt__bgemm_amx() && G == 1 && (Co <= SW_MAX_CO || Ci == 1) &&
         kk <= SW_MAX_TAPS && p->stride[1] == 1 && p->stride[2] == 1 && p->dilation[1] == 1 && p->dilation[2] == 1 &&
         p->padding[1] >= 0 && p->padding[2] >= 0;
}

static int sw_pass(const tpurt_view *dwv, const tpurt_view *dy, const tpurt_view *x, const tpurt_conv3d_params *p) {
#if defined(__x86_64__) || defined(__i386__)
  swjob j;
  memset(&j, 0, sizeof j);
  j.dy = hv(dy->ptr), j.x = hv(x->ptr);
  j.d_n = dy->strides[0], j.d_c = dy->strides[1], j.d_h = dy->strides[3], j.d_w = dy->strides[4];
  j.x_n = x->strides[0], j.x_c = x->strides[1], j.x_h = x->strides[3], j.x_w = x->strides[4];
  j.N = x->sizes[0], j.Ci = x->sizes[1], j.H = x->sizes[3], j.W = x->sizes[4];
  j.Ho = dy->sizes[3], j.Wo = dy->sizes[4], j.kh = dwv->sizes[3], j.kw = dwv->sizes[4];
  j.pt = p->padding[1], j.pl = p->padding[2], j.Hp = j.Ho + j.kh - 1, j.Wp = j.Wo + j.kw - 1;
  j.dw = hv(dwv->ptr), j.w_o = dwv->strides[0], j.w_c = dwv->strides[1], j.w_r = dwv->strides[3],
  j.w_s = dwv->strides[4];
  tpurt_parallel_for(dy->sizes[1] * j.Ci, 1, sw_tasks, &j);
  if (j.failed) return 0; /* the f32 path rewrites the whole output */
  atomic_fetch_add(&g_passes, 1);
  return 1;
#else
  (void)dwv, (void)dy, (void)x, (void)p;
  return 0;
#endif
}

int tpurt__bconv_backward_weight(const tpurt_view *dwv, const tpurt_view *dy, const tpurt_view *x,
                                 const tpurt_conv3d_params *p) {
  int64_t N = x->sizes[0], Ci = x->sizes[1];
  int64_t Co = dy->sizes[1], Ho = dy->sizes[3], Wo = dy->sizes[4], kh = dwv->sizes[3], kw = dwv->sizes[4];
  int64_t G = p->groups, Cig = Ci / G, Cog = Co / G, kk = kh * kw, Kd = Cig * kk;
  if (sw_worth(G, Ci, Co, kk, p)) return sw_pass(dwv, dy, x, p);
  if (iw_worth(G, Ci, Co, kk, Ho * Wo, dy)) return iw_pass(dwv, dy, x, p);
  planes g;
  int sub = strided_one(dwv, p);
  if (sub) { /* x[:, :, ::sh, ::sw] dense: the column space of a unit stride */
    plan(&g, N, Ci, Ho, Wo, 1, 1, 0, 0, Ho, Wo, Ho);
  } else {
    plan_images(&g, x, Ho, Wo, kh, kw, p);
  }
  if (!dot_worth(N * Co * Ho * Wo * Kd, Ho * Wo, g.lp, 1)) return 0;
  int64_t ldt = (Cog + 15) / 16 * 16, np = N * g.lp;
  int64_t *koff = koff_buf(Kd, 1), *woff = koff_buf(Kd, 4);
  uint32_t *dyt = tpurt__scratch(3, (size_t)(np / 2 * ldt) * 4);
  if (!koff || !woff || !dyt) return 0;
  int bad;
  if (sub) { /* the images' bytes and the planes' slack (zero) after them */
    g.xp = subsample(x, Ho, Wo, p->stride[1], p->stride[2], g.bytes - (size_t)(N * g.img) * 2, 0);
    bad = !g.xp || (g.lp != Ho * Wo && any_nonfinite(g.xp, N * g.img));
  } else {
    bad = pad(&g, x, 1, 0);
  }
  if (bad) return 0; /* no memory, or a non-finite value the dropped columns would spread */
  for (int64_t c = 0; c < Cig; c++)
    for (int64_t r = 0; r < kh; r++)
      for (int64_t s = 0; s < kw; s++)
        woff[c * kk + r * kw + s] = c * dwv->strides[1] + r * dwv->strides[3] + s * dwv->strides[4];
  int wdense = 1;
  for (int64_t k = 0; k < Kd; k++) wdense &= woff[k] == k;
  for (int64_t gi = 0; gi < G; gi++) {
    image_koff(&g, gi * Cig, Cig, kh, kw, p, koff); /* subsampled: 1 x 1, tap (0, 0) of g's planes */
    dyt_job dj = {(const uint16_t *)hv(dy->ptr) + gi * Cog * dy->strides[1], dy->strides[0], dy->strides[1],
                  dy->strides[3], dy->strides[4], Cog, Ho, Wo, &g, dyt, ldt};
    tpurt_parallel_for(N, 1, dyt_images, &dj);
    cjob j = {{wg_pack_a, wg_pack_b, wg_out}, &g, koff, Kd, np, Ho, Wo,
              (uint16_t *)hv(dwv->ptr) + gi * Cog * dwv->strides[0], 0, dwv->strides[0], 0, 0, NULL, dyt, ldt, woff,
              wdense};
    if (!tpurt__bgemm_hooked(Kd, Cog, np, NULL, &j.h)) return 0; /* the f32 path rewrites the whole output */
    atomic_fetch_add(&g_passes, 1);
  }
  return 1;
}
