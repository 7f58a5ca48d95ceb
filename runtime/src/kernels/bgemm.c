/*
 * bgemm.c — f32-accumulating GEMM on bf16 values with the CPU's bf16 dot
 * product (AVX512-BF16 vdpbf16ps: per f32 lane, two bf16 products added in
 * one instruction — twice the multiply-adds of an f32 FMA).
 *
 * It takes the products whose operands are bf16 values: bf16 tensors, f32
 * tensors at DEFAULT precision (each operand rounded to bf16: one pass)
 * and at HIGH precision (x = hi + lo, both bf16; hi*hi + hi*lo + lo*hi as
 * one product over K tripled, the split of gemm.c's f32 path). A product
 * of two bf16 values is exact in f32 and every lane accumulates in f32, as
 * a TPU's MXU does. Before this kernel these products converted both
 * operands to f32 matrices and ran the f32 GEMM (half the multiply-adds
 * per instruction) with a serial conversion of the result.
 *
 * Structure of sgemm.c (GotoBLAS): B panels of KC x NC packed into 16-wide
 * slivers of k pairs (b[p * 16 + j] holds B[2p, j] and B[2p + 1, j]), A
 * blocks of MC x KC into 8-row slivers of k pairs (a[p * 8 + i]), an 8 x 32
 * micro-tile in 16 zmm accumulators (per k pair: 2 loads, 8 broadcasts, 16
 * dot products) and an 8 x 16 one for a single sliver. Threads split rows
 * and columns of C, never K; each element's sum runs over the K chunks in
 * order (boundaries from K alone) and a micro-tile is full or partial by
 * shape alone, so the bits do not depend on the thread count.
 *
 * Numerics of the instruction: each lane adds the odd pair member's
 * product, then the even one's, rounding to nearest even; subnormal
 * inputs and results are flushed to zero.
 *
 * TORCH_TPU_BGEMM=0 turns it off (the f32 path runs these products:
 * tests, measurements).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gemm_internal.h"
#include "bf16_simd.h"

#define BMR 8
#define BNR 16
#define BKC 512  /* k's of a panel (even) */
#define BMC 128  /* rows of an A block (multiple of BMR) */
#define BNC 1024 /* columns of a B panel (multiple of 2 * BNR) */
#define AMX_KS 32 /* k's of a tile step: AMX chunks of K are multiples of it */
#define AMX_KMAX 2048 /* most k's of a chunk on the tile unit */
#define AMX_PANEL (1 << 20) /* bytes of a B panel on the tile unit: in the L2 with an A block */
static int64_t amx_kc(void) {
  const char *e = getenv("TORCH_TPU_AMX_KC");
  int64_t v = e ? atoll(e) : AMX_KMAX;
  return v < 32 || v > AMX_KMAX ? AMX_KMAX : v / 32 * 32;
}

/* ------------------------------------------------------------ mode */

int tpurt__bgemm_applies(void) {
  if (!tpurt__cpu_avx512_bf16() && !tpurt__cpu_amx_bf16()) return 0;
  const char *e = getenv("TORCH_TPU_BGEMM");
  return !(e && !strcmp(e, "0"));
}

/* AMX tiles serve the products where the level in force allows them
 * (TORCH_TPU_ISA=avx512 keeps the vdpbf16ps kernel on an AMX host). */
static int use_amx(void) { return tpurt__cpu_amx_bf16(); }

int tpurt__bgemm_amx(void) { return tpurt__bgemm_applies() && use_amx(); }

const char *tpurt_bf16_gemm_path(void) {
  if (!tpurt__bgemm_applies()) return "f32 GEMM";
  return use_amx() ? "amx-bf16 tiles" : "avx512-bf16 dot products";
}

/* ------------------------------------------------------------ operands */

typedef struct {
  tpurt__bmat a, b;
  int64_t M, N, K; /* K of the operands */
  int64_t K2;      /* k's of the product: K, or 3 K when split */
  int split;
  float alpha, beta;
  float *c; /* f32, row-major */
  int64_t ldc;
  const tpurt__bhooks *hk; /* the operands' packing and the result's store, or NULL (tile unit only) */
} bprod;

static inline float mat_get(const tpurt__bmat *m, int64_t r, int64_t c) {
  int64_t o = r * m->rs + c * m->cs;
  return m->dt == TPURT_BF16 ? tpurt__bf16_to_f32(((const uint16_t *)m->p)[o]) : ((const float *)m->p)[o];
}

/* Element k of A's row i / B's column j as bf16: rounded (exact for bf16
 * data), or, split, the hi or lo part by the k's third: A [hi | hi | lo],
 * B [hi; lo; hi]. 0 past the matrix. */
static inline uint16_t a_elem(const bprod *x, int64_t i, int64_t k) {
  if (i >= x->M || k >= x->K2) return 0;
  int64_t seg = x->split ? k / x->K : 0;
  float v = mat_get(&x->a, i, k - seg * x->K);
  uint16_t h = tpurt__f32_to_bf16(v);
  return seg == 2 ? tpurt__f32_to_bf16(v - tpurt__bf16_to_f32(h)) : h;
}
static inline uint16_t b_elem(const bprod *x, int64_t k, int64_t j) {
  if (j >= x->N || k >= x->K2) return 0;
  int64_t seg = x->split ? k / x->K : 0;
  float v = mat_get(&x->b, k - seg * x->K, j);
  uint16_t h = tpurt__f32_to_bf16(v);
  return seg == 1 ? tpurt__f32_to_bf16(v - tpurt__bf16_to_f32(h)) : h;
}

static inline uint32_t pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

static inline uint32_t load_u32(const uint16_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}


/* o[0..n) = bf16 of s[0..n) (unit stride): the value rounded, or (lo) the
 * rounding error of that, rounded — a_elem's / b_elem's parts, same bits. */
#if defined(__x86_64__) || defined(__i386__)
/* bf16_run's whole 16-element blocks; returns how many elements it did */
__attribute__((target("avx512f"))) static int64_t bf16_run_avx512(uint16_t *restrict o, const float *restrict s,
                                                                  int64_t n, int lo) {
  int64_t q = 0;
  for (; q + 16 <= n; q += 16) {
    __m512 v = _mm512_loadu_ps(s + q);
    __m512i h = rne_bf16(v);
    if (lo) h = rne_bf16(_mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))));
    _mm256_storeu_si256((__m256i *)(o + q), _mm512_cvtepi32_epi16(h));
  }
  return q;
}
#endif

static void bf16_run(uint16_t *restrict o, const float *restrict s, int64_t n, int lo) {
  int64_t q = 0;
#if defined(__x86_64__) || defined(__i386__)
  if (tpurt__cpu_avx512()) q = bf16_run_avx512(o, s, n, lo);
#endif
  for (; q < n; q++) {
    uint16_t h = tpurt__f32_to_bf16(s[q]);
    o[q] = lo ? tpurt__f32_to_bf16(s[q] - tpurt__bf16_to_f32(h)) : h;
  }
}

/* k's k0..k0+n-1 of a unit-stride f32 line (a row of A / a column of B
 * with k contiguous; element k at v[k - seg * K]) as bf16: split products
 * run the K segments [hi | hi | lo] (A, lo_seg 2) or [hi; lo; hi] (B,
 * lo_seg 1); past K2 zero. */
static void bf16_line(uint16_t *restrict o, const float *v, const bprod *x, int64_t k0, int64_t n, int lo_seg) {
  int64_t q = 0;
  while (q < n && k0 + q < x->K2) {
    int64_t k = k0 + q, seg = x->split ? k / x->K : 0, end = (seg + 1) * x->K - k0;
    if (end > n) end = n;
    bf16_run(o + q, v + (k - seg * x->K), end - q, seg == lo_seg);
    q = end;
  }
  for (; q < n; q++) o[q] = 0;
}

#if defined(__x86_64__) || defined(__i386__)
/* A transposed (its rows side by side at each k: a.rs == 1), rows i0..i0+7
 * all inside: pairs p < full of k's from k0, each from two 8-element runs
 * (k and k + 1) interleaved — d[p * 8 + i] = A[i0+i][k] | A[i0+i][k+1] << 16,
 * the bits a_elem gives (bf16 copied, f32 rounded to nearest even). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void pack_a_cols(uint32_t *restrict d, const bprod *x,
                                                                          int64_t i0, int64_t k0, int64_t full) {
  int64_t cs = x->a.cs;
  if (x->a.dt == TPURT_BF16) {
    const uint16_t *c = (const uint16_t *)x->a.p + i0 + k0 * cs;
    for (int64_t p = 0; p < full; p++, c += 2 * cs) {
      __m128i r0 = _mm_loadu_si128((const __m128i *)c), r1 = _mm_loadu_si128((const __m128i *)(c + cs));
      _mm_storeu_si128((__m128i *)(d + p * BMR), _mm_unpacklo_epi16(r0, r1));
      _mm_storeu_si128((__m128i *)(d + p * BMR + 4), _mm_unpackhi_epi16(r0, r1));
    }
  } else {
    const float *c = (const float *)x->a.p + i0 + k0 * cs;
    for (int64_t p = 0; p < full; p++, c += 2 * cs) {
      __m512 v = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(c))),
                                                     _mm256_castps_pd(_mm256_loadu_ps(c + cs)), 1));
      __m512i h = rne_bf16(v);
      __m256i lo = _mm512_castsi512_si256(h), hi = _mm512_extracti64x4_epi64(h, 1);
      _mm256_storeu_si256((__m256i *)(d + p * BMR), _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)));
    }
  }
}
#endif

/* Rows i0..i0+7 of A, k's k0..k0+kc-1 (kc even) -> d[p * 8 + i]. */
static void pack_a(uint32_t *restrict d, const bprod *x, int64_t i0, int64_t k0, int64_t kc) {
  int64_t kp = kc / 2;
#if defined(__x86_64__) || defined(__i386__)
  if (x->a.rs == 1 && x->a.cs != 1 && !x->split && i0 + BMR <= x->M && tpurt__cpu_avx512()) {
    /* A transposed (a weight gradient's grad_out^T): whole 8-row runs per k */
    int64_t full = k0 + kc <= x->K ? kp : (x->K - k0) / 2;
    pack_a_cols(d, x, i0, k0, full);
    for (int64_t p = full; p < kp; p++)
      for (int i = 0; i < BMR; i++)
        d[p * BMR + i] = pair(a_elem(x, i0 + i, k0 + 2 * p), a_elem(x, i0 + i, k0 + 2 * p + 1));
    return;
  }
#endif
  int plain = x->a.dt == TPURT_BF16 && !x->split && x->a.cs == 1;
  for (int i = 0; i < BMR; i++) {
    int64_t r = i0 + i;
    if (plain && r < x->M) {
      const uint16_t *row = (const uint16_t *)x->a.p + r * x->a.rs + k0;
      int64_t full = k0 + kc <= x->K ? kp : (x->K - k0) / 2;
      for (int64_t p = 0; p < full; p++) d[p * BMR + i] = load_u32(row + 2 * p);
      for (int64_t p = full; p < kp; p++) d[p * BMR + i] = pair(a_elem(x, r, k0 + 2 * p), a_elem(x, r, k0 + 2 * p + 1));
    } else {
      for (int64_t p = 0; p < kp; p++) d[p * BMR + i] = pair(a_elem(x, r, k0 + 2 * p), a_elem(x, r, k0 + 2 * p + 1));
    }
  }
}


/* Columns j0..j0+15 of B, k's k0..k0+kc-1 (kc even) -> d[p * 16 + j]. */
static void pack_b(uint32_t *restrict d, const bprod *x, int64_t j0, int64_t k0, int64_t kc) {
  int64_t kp = kc / 2;
  int bf = x->b.dt == TPURT_BF16 && !x->split;
  int64_t full = k0 + kc <= x->K ? kp : (x->K - k0) / 2; /* pairs inside the matrix */
  if (bf && x->b.cs == 1 && j0 + BNR <= x->N) {          /* rows of B contiguous */
    for (int64_t p = 0; p < full; p++) {
      const uint16_t *r0 = (const uint16_t *)x->b.p + (k0 + 2 * p) * x->b.rs + j0;
#if defined(__x86_64__) || defined(__i386__)
      interleave16(d + p * BNR, r0, r0 + x->b.rs);
#else
      for (int j = 0; j < BNR; j++) d[p * BNR + j] = pair(r0[j], r0[x->b.rs + j]);
#endif
    }
  } else if (bf && x->b.rs == 1) { /* columns of B contiguous: pairs in place */
    for (int j = 0; j < BNR; j++) {
      if (j0 + j >= x->N) {
        for (int64_t p = 0; p < full; p++) d[p * BNR + j] = 0;
        continue;
      }
      const uint16_t *col = (const uint16_t *)x->b.p + (j0 + j) * x->b.cs + k0;
      for (int64_t p = 0; p < full; p++) d[p * BNR + j] = load_u32(col + 2 * p);
    }
  } else if (x->b.dt == TPURT_F32 && x->b.cs == 1 && j0 + BNR <= x->N && tpurt__cpu_avx512()) {
    /* f32 rows of B: 16 columns of two rows rounded, then interleaved */
    _Alignas(64) uint16_t r2[2][BNR];
    for (int64_t p = 0; p < kp; p++) {
      for (int h = 0; h < 2; h++) {
        int64_t k = k0 + 2 * p + h, seg = x->split ? k / x->K : 0;
        if (k < x->K2)
          bf16_run(r2[h], (const float *)x->b.p + (k - seg * x->K) * x->b.rs + j0, BNR, seg == 1);
        else
          memset(r2[h], 0, sizeof r2[h]);
      }
#if defined(__x86_64__) || defined(__i386__)
      interleave16(d + p * BNR, r2[0], r2[1]);
#endif
    }
    full = kp;
  } else if (x->b.dt == TPURT_F32 && x->b.rs == 1) { /* f32, k contiguous (a transposed weight) */
    uint16_t col[AMX_KMAX];
    for (int j = 0; j < BNR; j++) {
      if (j0 + j >= x->N) {
        for (int64_t p = 0; p < kp; p++) d[p * BNR + j] = 0;
        continue;
      }
      bf16_line(col, (const float *)x->b.p + (j0 + j) * x->b.cs, x, k0, kc, 1);
      for (int64_t p = 0; p < kp; p++) d[p * BNR + j] = load_u32(col + 2 * p);
    }
    full = kp;
  } else {
    full = 0;
  }
  for (int64_t p = full; p < kp; p++)
    for (int j = 0; j < BNR; j++)
      d[p * BNR + j] = pair(b_elem(x, k0 + 2 * p, j0 + j), b_elem(x, k0 + 2 * p + 1, j0 + j));
}

/* ------------------------------------------------------ micro-kernels */

#if defined(__x86_64__) || defined(__i386__)
/* Rows of a micro-tile: F(i, AP) for each row i, AP(i) the row's pair of
 * A at depth p: packed (AP_PACKED) or read in place from bf16 rows
 * (AP_ROWS: r[i] + 2 p, the chunk's k's inside the matrix). Both kernels
 * run the same dot products on the same values: the same bits. */
#define BROWS(F, AP) F(0, AP) F(1, AP) F(2, AP) F(3, AP) F(4, AP) F(5, AP) F(6, AP) F(7, AP)
#define AP_PACKED(i) a[p * BMR + (i)]
#define AP_ROWS(i) load_u32(r[(i)] + 2 * p)
#define BBCAST(AP, i) ((__m512bh)_mm512_set1_epi32((int)AP(i)))
#define BZERO2(i, AP) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps();
#define BROW2(i, AP)                                                               \
  {                                                                                \
    __m512bh ai = BBCAST(AP, i);                                                   \
    c##i##0 = _mm512_dpbf16_ps(c##i##0, ai, x0);                                   \
    c##i##1 = _mm512_dpbf16_ps(c##i##1, ai, x1);                                   \
  }
#define BSTORE2(i, AP)                                                             \
  {                                                                                \
    float *o = c + (i) * ldc, *oh = ch + (i) * ldc;                                \
    if (beta == 0.0f) {                                                            \
      _mm512_storeu_ps(o, _mm512_mul_ps(va, c##i##0));                             \
      _mm512_storeu_ps(oh, _mm512_mul_ps(va, c##i##1));                            \
    } else {                                                                       \
      _mm512_storeu_ps(o, _mm512_fmadd_ps(va, c##i##0, _mm512_mul_ps(vb, _mm512_loadu_ps(o))));   \
      _mm512_storeu_ps(oh, _mm512_fmadd_ps(va, c##i##1, _mm512_mul_ps(vb, _mm512_loadu_ps(oh)))); \
    }                                                                              \
  }
/* c[8 x 32] = alpha * A.(b0 | b1) + beta * c over kp k pairs (the right
 * half's columns at ch); beta == 0 does not read c. */
#define BKR2_BODY(AP)                                                              \
  BROWS(BZERO2, AP)                                                                \
  _Pragma("GCC unroll 2") for (int64_t p = 0; p < kp; p++) {                       \
    __m512bh x0 = (__m512bh)_mm512_loadu_si512(b0 + p * BNR);                      \
    __m512bh x1 = (__m512bh)_mm512_loadu_si512(b1 + p * BNR);                      \
    BROWS(BROW2, AP)                                                               \
  }                                                                                \
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);                    \
  BROWS(BSTORE2, AP)
#define BZERO1(i, AP) __m512 c##i = _mm512_setzero_ps();
#define BROW1(i, AP) c##i = _mm512_dpbf16_ps(c##i, BBCAST(AP, i), x);
#define BSTORE1(i, AP)                                                             \
  {                                                                                \
    float *o = c + (i) * ldc;                                                      \
    _mm512_storeu_ps(o, beta == 0.0f ? _mm512_mul_ps(va, c##i)                     \
                                     : _mm512_fmadd_ps(va, c##i, _mm512_mul_ps(vb, _mm512_loadu_ps(o)))); \
  }
/* The same for one sliver: c[8 x 16], the same bits per element. */
#define BKR1_BODY(AP)                                                              \
  BROWS(BZERO1, AP)                                                                \
  _Pragma("GCC unroll 2") for (int64_t p = 0; p < kp; p++) {                       \
    __m512bh x = (__m512bh)_mm512_loadu_si512(b + p * BNR);                        \
    BROWS(BROW1, AP)                                                               \
  }                                                                                \
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);                    \
  BROWS(BSTORE1, AP)

#define BKR_TARGET __attribute__((target("avx512f,avx512bf16")))
BKR_TARGET static void bkr2(int64_t kp, const uint32_t *restrict a, const uint32_t *restrict b0,
                            const uint32_t *restrict b1, float *restrict c, float *restrict ch, int64_t ldc,
                            float alpha, float beta) {
  BKR2_BODY(AP_PACKED)
}
BKR_TARGET static void bkr2_rows(int64_t kp, const uint16_t *const *restrict r, const uint32_t *restrict b0,
                                 const uint32_t *restrict b1, float *restrict c, float *restrict ch, int64_t ldc,
                                 float alpha, float beta) {
  BKR2_BODY(AP_ROWS)
}
BKR_TARGET static void bkr1(int64_t kp, const uint32_t *restrict a, const uint32_t *restrict b, float *restrict c,
                            int64_t ldc, float alpha, float beta) {
  BKR1_BODY(AP_PACKED)
}
BKR_TARGET static void bkr1_rows(int64_t kp, const uint16_t *const *restrict r, const uint32_t *restrict b,
                                 float *restrict c, int64_t ldc, float alpha, float beta) {
  BKR1_BODY(AP_ROWS)
}
#undef BROWS
#undef AP_PACKED
#undef AP_ROWS
#undef BBCAST
#undef BZERO2
#undef BROW2
#undef BSTORE2
#undef BKR2_BODY
#undef BZERO1
#undef BROW1
#undef BSTORE1
#undef BKR1_BODY
#undef BKR_TARGET
#endif

/* ------------------------------------------------------------ buffers */

/* Grow-only buffer of the calling thread: every buffer of a call is cut
 * from it before anything is written, so a product either runs or returns
 * 0 untouched (host memory exhausted: the caller runs the f32 path). */
static _Thread_local struct {
  void *p;
  size_t n;
} t_buf;

static void *buf(size_t bytes) {
  if (t_buf.n < bytes) {
    free(t_buf.p);
    size_t n = (bytes + 4095) & ~(size_t)4095;
    if (n >= (2u << 20)) { /* 2 MiB pages: the tiles' loads of packed panels miss the TLB less */
      n = (n + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
      t_buf.p = aligned_alloc(2u << 20, n);
      if (t_buf.p) madvise(t_buf.p, n, MADV_HUGEPAGE);
    } else {
      t_buf.p = aligned_alloc(64, n);
    }
    t_buf.n = t_buf.p ? n : 0;
  }
  return t_buf.p;
}

/* The calling thread's buffer for kernels that run no bf16 product while
 * they hold it (bconv.c's weight-gradient tasks on pool threads). */
void *tpurt__bgemm_thread_buf(size_t bytes) { return buf(bytes); }

/* ------------------------------------------------------ macro-kernel */

typedef struct {
  const bprod *x;
  uint32_t *bp; /* the panel: sliver s at bp + s * kp * BNR */
  int64_t j0, nc, k0, kc, nsl, mb, np;
  float beta;
  uint16_t *ap; /* tile unit: the chunk's rows of A, packed (row i at ap + i * lda) */
  int64_t lda;
  const tpurt__bmat *out; /* tile unit: where the last chunk's blocks go (out = oalpha C + obeta out), or NULL */
  float oalpha, obeta;
} bpanel;

static void pack_panel(void *p, int64_t b, int64_t e);
/* slivers 2b .. 2e of the panel (tasks of sliver pairs) */
static void pack_pairs(void *p, int64_t b, int64_t e) {
  const bpanel *j = p;
  pack_panel(p, 2 * b, 2 * e < j->nsl ? 2 * e : j->nsl);
}

static void pack_panel(void *p, int64_t b, int64_t e) {
  const bpanel *j = p;
  const bprod *x = j->x;
  int64_t kp = j->kc / 2, full = j->k0 + j->kc <= x->K ? kp : (x->K - j->k0) / 2;
  for (int64_t s = b; s < e; s++) {
    uint32_t *d = j->bp + s * kp * BNR;
    int64_t c0 = j->j0 + s * BNR;
    if (x->hk && x->hk->pack_b) {
      x->hk->pack_b(x->hk, d, c0, j->k0, j->kc);
      continue;
    }
#if defined(__x86_64__) || defined(__i386__)
    /* bf16 rows of B: two slivers a pass read whole cache lines of B's
     * rows (one sliver reads half of each, a row 2^n bytes down each time) */
    if (s + 1 < e && x->b.dt == TPURT_BF16 && !x->split && x->b.cs == 1 && c0 + 2 * BNR <= x->N && full == kp &&
        tpurt__cpu_avx512()) {
      for (int64_t q = 0; q < kp; q++) {
        const uint16_t *r0 = (const uint16_t *)x->b.p + (j->k0 + 2 * q) * x->b.rs + c0;
        interleave16(d + q * BNR, r0, r0 + x->b.rs);
        interleave16(d + (kp + q) * BNR, r0 + BNR, r0 + x->b.rs + BNR);
      }
      s++;
      continue;
    }
#endif
    pack_b(d, x, c0, j->k0, j->kc);
  }
}

/* The tile at rows r0.. (m valid), columns c0.. (n valid, <= 32): full
 * tiles straight into C, partial ones through a temporary with the full
 * tiles' final step (the same rounding, so the same bits per element). */
static void tile(const bpanel *j, const uint32_t *as, const uint16_t *const *rows, const uint32_t *b0, int64_t r0,
                 int64_t m, int64_t c0, int64_t n) {
  const bprod *x = j->x;
  int64_t kp = j->kc / 2;
  float *c = x->c + r0 * x->ldc + c0;
#if defined(__x86_64__) || defined(__i386__)
#define BTILE(C, CH, LDC, ALPHA, BETA, TWO)                                                \
  do {                                                                                     \
    if (TWO && rows)                                                                       \
      bkr2_rows(kp, rows, b0, b0 + kp * BNR, C, CH, LDC, ALPHA, BETA);                     \
    else if (TWO)                                                                          \
      bkr2(kp, as, b0, b0 + kp * BNR, C, CH, LDC, ALPHA, BETA);                            \
    else if (rows)                                                                         \
      bkr1_rows(kp, rows, b0, C, LDC, ALPHA, BETA);                                        \
    else                                                                                   \
      bkr1(kp, as, b0, C, LDC, ALPHA, BETA);                                               \
  } while (0)
  if (m == BMR && (n == 2 * BNR || n == BNR)) {
    BTILE(c, c + BNR, x->ldc, x->alpha, j->beta, n == 2 * BNR);
    return;
  }
  _Alignas(64) float t[BMR * 2 * BNR];
  BTILE(t, t + BNR, 2 * BNR, 1.0f, 0.0f, n > BNR);
#undef BTILE
  for (int64_t i = 0; i < m; i++)
    for (int64_t q = 0; q < n; q++) {
      float v = t[i * 2 * BNR + q], *e = c + i * x->ldc + q;
      *e = j->beta == 0.0f ? x->alpha * v : __builtin_fmaf(x->alpha, v, j->beta * *e);
    }
#endif
}

/* Task t: row block t / np, column part t % np. Each A sliver is packed
 * on the stack (8 KiB at KC 512) and used for the part's slivers, which
 * stay in L2 — or, for bf16 rows whose chunk of k's lies inside the
 * matrix, read in place (the rows past M repeat the last row; their
 * results are never stored). */
static void panel_tasks(void *p, int64_t b, int64_t e) {
  const bpanel *j = p;
  const bprod *x = j->x;
  int64_t kp = j->kc / 2;
  _Alignas(64) uint32_t as[BMR * (BKC / 2)];
  for (int64_t t = b; t < e; t++) {
    int64_t ib = t / j->np, part = t % j->np;
    int64_t i0 = ib * BMC, mc = x->M - i0 < BMC ? x->M - i0 : BMC;
    int64_t npair = (j->nsl + 1) / 2, s0 = 2 * (npair * part / j->np), s1 = 2 * (npair * (part + 1) / j->np);
    if (s1 > j->nsl) s1 = j->nsl;
    int in_place = x->a.dt == TPURT_BF16 && !x->split && x->a.cs == 1 && j->k0 + j->kc <= x->K;
    for (int64_t r = 0; r < mc; r += BMR) {
      const uint16_t *rows[BMR];
      if (in_place)
        for (int i = 0; i < BMR; i++)
          rows[i] = (const uint16_t *)x->a.p + (i0 + r + i < x->M ? i0 + r + i : x->M - 1) * x->a.rs + j->k0;
      else
        pack_a(as, x, i0 + r, j->k0, j->kc);
      for (int64_t s = s0; s < s1; s += 2) {
        int64_t c0 = s * BNR, n = j->nc - c0 < 2 * BNR ? j->nc - c0 : 2 * BNR;
        tile(j, as, in_place ? rows : NULL, j->bp + s * kp * BNR, i0 + r, mc - r < BMR ? mc - r : BMR, j->j0 + c0,
             n);
      }
    }
  }
}

/* The K chunks of a product of k2 k's: chunk depth (even; boundaries
 * depend on k2 alone). */
static int64_t chunk_k(int64_t k2, int amx) {
  int64_t kmax = amx ? amx_kc() : BKC, nk = (k2 + kmax - 1) / kmax, al = amx ? AMX_KS : 8;
  return ((k2 + nk - 1) / nk + al - 1) / al * al;
}

/* uint32s of the B panel of a product of n columns and k2 k's. */
/* Columns of a B panel: BNC, or on the tile unit as many as fit
 * AMX_PANEL at chunks of kc k's (a multiple of 2 * BNR). */
static int64_t panel_cols(int64_t kc, int amx) {
  if (!amx) return BNC;
  int64_t nc = AMX_PANEL / (2 * kc) / (2 * BNR) * (2 * BNR);
  return nc < 2 * BNR ? 2 * BNR : nc > BNC ? BNC : nc;
}

static size_t panel_words(int64_t n, int64_t k2, int amx) {
  int64_t pc = panel_cols(chunk_k(k2, amx), amx), nc = n < pc ? n : pc;
  return (size_t)((nc + BNR - 1) / BNR) * (size_t)(chunk_k(k2, amx) / 2) * BNR;
}


/* Row i of c (any dtype and strides), columns j0 .. j0+n-1 = alpha t +
 * beta c (one fused rounding, then the dtype's; beta 0 does not read c). */
#if defined(__x86_64__) || defined(__i386__)
/* out_row's whole 16-column blocks of a unit-stride bf16 row; returns how many */
__attribute__((target("avx512f"))) static int64_t out_row_avx512(uint16_t *d, const float *t, int64_t n, float alpha,
                                                                 float beta) {
  __m512 va = _mm512_set1_ps(alpha);
  int64_t q = 0;
  for (; q + 16 <= n; q += 16) store_bf16x16(d + q, _mm512_mul_ps(va, _mm512_loadu_ps(t + q)), beta);
  return q;
}
#endif

static void out_row(const tpurt__bmat *c, int64_t i, int64_t j0, const float *t, int64_t n, float alpha, float beta) {
  int64_t q = 0;
#if defined(__x86_64__) || defined(__i386__)
  if (c->dt == TPURT_BF16 && c->cs == 1 && tpurt__cpu_avx512())
    q = out_row_avx512((uint16_t *)c->p + i * c->rs + j0, t, n, alpha, beta);
#endif
  for (; q < n; q++) {
    float v = alpha * t[q];
    int64_t o = i * c->rs + (j0 + q) * c->cs;
    if (c->dt == TPURT_F32) {
      float *d = (float *)c->p + o;
      *d = beta == 0.0f ? v : __builtin_fmaf(beta, *d, v);
    } else if (c->dt == TPURT_BF16) {
      uint16_t *d = (uint16_t *)c->p + o;
      *d = tpurt__f32_to_bf16(beta == 0.0f ? v : __builtin_fmaf(beta, tpurt__bf16_to_f32(*d), v));
    } else {
      uint16_t *d = (uint16_t *)c->p + o;
      *d = tpurt__f32_to_f16(beta == 0.0f ? v : __builtin_fmaf(beta, tpurt__f16_to_f32(*d), v));
    }
  }
}

/* Rows i0 .. i0+m-1, columns j0 .. j0+n-1 of c from t (row stride ldt). */
static void out_rows(const tpurt__bmat *c, const float *t, int64_t ldt, int64_t i0, int64_t m, int64_t j0, int64_t n,
                     float alpha, float beta) {
  for (int64_t i = 0; i < m; i++) out_row(c, i0 + i, j0, t + i * ldt, n, alpha, beta);
}

/* c = alpha t + beta c over whole rows of a product's f32 result t */
typedef struct {
  const float *t;
  const tpurt__bmat *c;
  int64_t N;
  float alpha, beta; /* alpha 1: t has it applied */
} epi_job;

static void epi_rows(void *p, int64_t b, int64_t e) {
  const epi_job *j = p;
  out_rows(j->c, j->t + b * j->N, j->N, b, e - b, 0, j->N, j->alpha, j->beta);
}

/* ------------------------------------------------------ AMX tiles */
/*
 * On CPUs with AMX-BF16 (tpurt__cpu_amx_bf16) a product runs on the tile
 * unit: TDPBF16PS multiplies a 16 x 32 bf16 tile of A by a 32 x 16 tile
 * of B (k pairs interleaved: the B panel's slivers as packed above, 64
 * bytes a pair row) into a 16 x 16 f32 tile of C — 8192 multiply-adds an
 * instruction. A block of C is 32 x 32: four C tiles (tmm0-3), two A tiles
 * (tmm4-5: rows 0-15 and 16-31 of a 32-row block of A packed row-major in
 * bf16, zero past M and K), two B tiles (tmm6-7: two slivers), each K step
 * of 32 two A and two B loads for four products. Chunks of K are multiples
 * of 32 (zero padded); C accumulates in memory between chunks (the tiles
 * are f32: storing and reloading them loses nothing), so every element is
 * one f32 accumulation over K in order and the bits depend on neither the
 * thread count nor the chunking. alpha = 1 and beta = 0 only: other
 * products run into an f32 temporary and an epilogue applies them.
 *
 * Numerics of the instruction: per element and k pair, the two bf16
 * products are added to the f32 accumulator with nearest-even rounding;
 * subnormal inputs and results are flushed to zero (as vdpbf16ps).
 */
#define AMX_MR 32
#define AMX_MB 64 /* rows of a task on the tile unit (BMC on the others): 512^3 ran 8 tasks of 128 rows, one thread idle 14 % of the product */
#define AMX_KSUB 256 /* k's of the inner step of a task: its A block (16 KiB) stays in the L1 */
#define AMX_STRIP_LD (BNC + 2 * BNR + 16) /* room of a task's C strip a row: a part's widest block, its last pair whole, and a cache line */

/* Rows i0..i0+31 of A, k's k0..k0+kc-1 (kc a multiple of 32) -> d[r * ld + q] bf16; zero past M / K2. */
static void pack_a_rows(uint16_t *restrict d, int64_t ld, const bprod *x, int64_t i0, int64_t k0, int64_t kc) {
  if (x->hk && x->hk->pack_a) {
    x->hk->pack_a(x->hk, d, ld, i0, k0, kc);
    return;
  }
  for (int r = 0; r < AMX_MR; r++) {
    uint16_t *o = d + r * ld;
    int64_t i = i0 + r;
    if (i >= x->M) {
      memset(o, 0, (size_t)kc * 2);
      continue;
    }
    if (x->a.cs == 1 && x->a.dt == TPURT_F32) {
      bf16_line(o, (const float *)x->a.p + i * x->a.rs, x, k0, kc, 2);
      continue;
    }
    int64_t q = 0, in = x->K2 - k0 < kc ? x->K2 - k0 : kc;
    if (x->a.cs == 1 && x->a.dt == TPURT_BF16 && !x->split) {
      memcpy(o, (const uint16_t *)x->a.p + i * x->a.rs + k0, (size_t)in * 2);
      q = in;
    } else if (x->a.rs == 1 && x->a.dt == TPURT_BF16 && !x->split) { /* A transposed: the bits, k strided */
      const uint16_t *col = (const uint16_t *)x->a.p + i + k0 * x->a.cs;
      for (; q < in; q++) o[q] = col[q * x->a.cs];
    }
    for (; q < in; q++) o[q] = a_elem(x, i, k0 + q);
    for (; q < kc; q++) o[q] = 0;
  }
}

#if defined(__x86_64__)
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_cfg;

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f")))
/* Palette 1, tiles 0-7 of 16 rows x 64 bytes. A constant object: gcc 12
 * does not see ldtilecfg read its operand and dropped the stores that
 * filled a local configuration (the tiles then had no shape: SIGILL at the
 * first tilezero) once the function was not inlined into its caller. */
static const amx_cfg k_amx_cfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
AMX_TARGET static void amx_config(void) { _tile_loadconfig(&k_amx_cfg); }
AMX_TARGET static void amx_release(void) { _tile_release(); }

/* c[32 x 32] (+)= A block (a: 32 rows of lda bytes, ks steps of 32 k's)
 * times slivers b0 | b1 (ks steps of 16 pair rows of 64 bytes); load_c:
 * accumulate onto c. ldc in bytes. */
AMX_TARGET static void amx_block(int64_t ks, const uint16_t *a, int64_t lda, const uint32_t *b0, const uint32_t *b1,
                                 float *c, int64_t ldc, int load_c) {
  float *c1 = (float *)((char *)c + 16 * ldc);
  if (load_c) {
    _tile_loadd(0, c, ldc);
    _tile_loadd(1, c + 16, ldc);
    _tile_loadd(2, c1, ldc);
    _tile_loadd(3, c1 + 16, ldc);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const char *a1 = (const char *)a + 16 * lda;
  for (int64_t s = 0; s < ks; s++) {
    _tile_loadd(4, a + s * 32, lda);
    _tile_loadd(6, b0 + s * 256, 64);
    _tile_loadd(5, a1 + s * 64, lda);
    _tile_loadd(7, b1 + s * 256, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldc);
  _tile_stored(1, c + 16, ldc);
  _tile_stored(2, c1, ldc);
  _tile_stored(3, c1 + 16, ldc);
}
#undef AMX_TARGET
#endif

/* A task's strip (rows row..row+m-1, the part's w columns from sliver s0)
 * to where it goes: the hook's store or the output view after the last
 * chunk of K, else C (c: the block's first element in C). */
static void strip_store(const bpanel *j, const float *strip, int64_t ldcs, int64_t row, int64_t m, int64_t s0,
                        int64_t w, float *c) {
  const bprod *x = j->x;
  if (x->hk && x->hk->out && j->k0 + j->kc >= x->K2)
    x->hk->out(x->hk, strip, ldcs, row, m, j->j0 + s0 * BNR, w);
  else if (j->out && j->k0 + j->kc >= x->K2)
    out_rows(j->out, strip, ldcs, row, m, j->j0 + s0 * BNR, w, j->oalpha, j->obeta);
  else
    for (int64_t i = 0; i < m; i++) memcpy(c + i * x->ldc, strip + i * ldcs, (size_t)w * 4);
}

/* What computes a task's 32-row block (rows row..row+m-1 of C, sliver
 * pairs s0..s1 of the panel) into its strip, loaded with C when load_c:
 * the tile unit's or the dot products'. */
typedef void (*strip_block_fn)(const bpanel *j, float *strip, int64_t ldcs, int64_t row, int64_t m, int64_t s0,
                               int64_t s1, int load_c);

/* Tasks [b, e) of a panel laid out for the tile unit (A rows packed by
 * pack_a_groups, B slivers by pack_panel): task t is row block t / np
 * (AMX_MB rows) and column part t % np (as panel_tasks); each 32-row block
 * of it runs in the thread's C strip (rows one cache line more than the
 * block apart: tiles of a C whose rows are 2^n bytes apart evict each
 * other in the L1); C is read (load_c) and written once a chunk. A block
 * of fewer than 32 rows runs whole in the strip too: its rows past m (A's
 * zero rows) are never copied out. */
#if defined(__x86_64__) || defined(__i386__)
static void rows_strip_block(const bpanel *j, float *strip, int64_t ldcs, int64_t row, int64_t m, int64_t s0,
                             int64_t s1, int load_c);
#endif
static void strip_tasks(const bpanel *j, int64_t b, int64_t e, strip_block_fn block) {
  const bprod *x = j->x;
  int load_c = j->k0 > 0 || j->beta != 0.0f;
  _Alignas(64) float strip[AMX_MR * AMX_STRIP_LD]; /* 137 KiB: the stacks of pool and stream threads hold it */
#if defined(__x86_64__) || defined(__i386__)
  /* The dot products on a product of several chunks of K accumulate in C
   * itself (the same arithmetic as in the strip): copying C's block into
   * the strip and back every chunk took a tenth of a convolution's weight
   * gradient. Where their 8-row groups and sliver pairs stay inside C:
   * M a multiple of 8, N of 32. */
  int direct = block == rows_strip_block && x->K2 > chunk_k(x->K2, 1) && x->M % BMR == 0 && x->N % (2 * BNR) == 0;
#else
  int direct = 0;
#endif
  for (int64_t task = b; task < e; task++) {
    int64_t ib = task / j->np, part = task % j->np;
    int64_t i0 = ib * AMX_MB, mc = x->M - i0 < AMX_MB ? x->M - i0 : AMX_MB;
    int64_t npair = (j->nsl + 1) / 2, s0 = 2 * (npair * part / j->np), s1 = 2 * (npair * (part + 1) / j->np);
    if (s1 > j->nsl) s1 = j->nsl;
    int64_t w = s1 > s0 ? (s1 < j->nsl ? s1 * BNR : j->nc) - s0 * BNR : 0; /* the part's columns */
    for (int64_t r = 0; r < mc; r += AMX_MR) {
      int64_t m = mc - r < AMX_MR ? mc - r : AMX_MR;
      float *c = x->c + (i0 + r) * x->ldc + j->j0 + s0 * BNR;
      if (direct) {
        block(j, c, x->ldc, i0 + r, m, s0, s1, load_c);
        if (j->k0 + j->kc >= x->K2 && ((x->hk && x->hk->out) || j->out)) strip_store(j, c, x->ldc, i0 + r, m, s0, w, c);
        continue;
      }
      int64_t ldcs = (w + 2 * BNR - 1) / (2 * BNR) * (2 * BNR) + 16; /* whole pairs, and a cache line */
      if (load_c)
        for (int64_t i = 0; i < m; i++) memcpy(strip + i * ldcs, c + i * x->ldc, (size_t)w * 4);
      block(j, strip, ldcs, i0 + r, m, s0, s1, load_c);
      strip_store(j, strip, ldcs, i0 + r, m, s0, w, c);
    }
  }
}

#if defined(__x86_64__)
/* A block on the tile unit: k's in steps of AMX_KSUB over the part (the
 * A block of a step, 16 KiB, stays in the L1 while the part's slivers go
 * by). */
static void amx_strip_block(const bpanel *j, float *strip, int64_t ldcs, int64_t row, int64_t m, int64_t s0,
                            int64_t s1, int load_c) {
  (void)m;
  int64_t kc = j->kc, kp = kc / 2, lda = j->lda * 2;
  for (int64_t q0 = 0; q0 < kc; q0 += AMX_KSUB) {
    int64_t qs = (kc - q0 < AMX_KSUB ? kc - q0 : AMX_KSUB) / AMX_KS;
    int lc = load_c || q0 > 0;
    const uint16_t *ab = j->ap + row * j->lda + q0;
    for (int64_t s = s0; s < s1; s += 2) {
      const uint32_t *b0 = j->bp + s * kp * BNR + q0 / 2 * BNR, *b1 = s + 1 < j->nsl ? b0 + kp * BNR : b0;
      amx_block(qs, ab, lda, b0, b1, strip + (s - s0) * BNR, ldcs * 4, lc);
    }
  }
}
#endif

/* Tasks on the tile unit (strip_tasks). */
static void amx_tasks(void *p, int64_t b, int64_t e) {
#if defined(__x86_64__)
  amx_config();
  strip_tasks(p, b, e, amx_strip_block);
  amx_release();
#else
  (void)p, (void)b, (void)e;
#endif
}

#if defined(__x86_64__) || defined(__i386__)
/* A block with the bf16 dot-product kernel instead: each 8-row group reads
 * its rows of packed A in place (bkr2_rows) over the whole chunk of K; a
 * sliver pair (128 bytes a k pair) stays in the L1 while the row groups go
 * by, their rows (32 bytes a k pair) come from the L2. */
static void rows_strip_block(const bpanel *j, float *strip, int64_t ldcs, int64_t row, int64_t m, int64_t s0,
                             int64_t s1, int load_c) {
  int64_t kp = j->kc / 2;
  for (int64_t sl = s0; sl < s1; sl += 2) {
    const uint32_t *b0 = j->bp + sl * kp * BNR;
    for (int64_t g = 0; g < m; g += BMR) {
      const uint16_t *rows8[BMR];
      for (int i = 0; i < BMR; i++) rows8[i] = j->ap + (row + g + i) * j->lda;
      float *cs = strip + g * ldcs + (sl - s0) * BNR;
      if (sl + 1 < j->nsl)
        bkr2_rows(kp, rows8, b0, b0 + kp * BNR, cs, cs + BNR, ldcs, 1.0f, load_c ? 1.0f : 0.0f);
      else /* a last odd sliver alone (a weight gradient of <= 16 channels computed 32 columns) */
        bkr1_rows(kp, rows8, b0, cs, ldcs, 1.0f, load_c ? 1.0f : 0.0f);
    }
  }
}
#endif

/* Tasks of the tile unit's layout run with the dot products: a hooked
 * product (a convolution's gathered operands) on a CPU with AVX512-BF16
 * but no usable tile unit. */
static void rows_tasks(void *p, int64_t b, int64_t e) {
#if defined(__x86_64__) || defined(__i386__)
  strip_tasks(p, b, e, rows_strip_block);
#else
  (void)p, (void)b, (void)e;
#endif
}

/* One product (C f32 row-major) with its B panel at bp; parallel over the
 * pool when `par`. */
static void run_bprod(const bprod *x, uint32_t *bp, int par) {
  int64_t nth = par ? tpurt_num_threads() : 1, KC = chunk_k(x->K2, 0);
  for (int64_t j0 = 0; j0 < x->N; j0 += BNC) {
    int64_t nc = x->N - j0 < BNC ? x->N - j0 : BNC, nsl = (nc + BNR - 1) / BNR;
    for (int64_t k0 = 0; k0 < x->K2; k0 += KC) {
      int64_t kc = x->K2 - k0 < KC ? x->K2 - k0 : KC;
      kc += kc & 1;
      bpanel j = {x, bp, j0, nc, k0, kc, nsl, (x->M + BMC - 1) / BMC, 1, k0 == 0 ? x->beta : 1.0f, NULL, 0, NULL, 0, 0};
      /* column parts: >= 4 tasks per thread where the panel is wide
       * enough, and at most 8 sliver pairs each (256 KiB of the panel at
       * KC 512: in L2 while the part's rows go by) */
      int64_t npair = (nsl + 1) / 2, want = (4 * nth + j.mb - 1) / j.mb;
      if (nth > 1 && j.mb < 4 * nth) j.np = want < npair ? want : npair;
      if (j.np < (npair + 7) / 8) j.np = (npair + 7) / 8;
      if (nth > 1 && x->M * nc * kc >= (1 << 18)) {
        tpurt_parallel_for((nsl + 1) / 2, 1, pack_pairs, &j);
        tpurt_parallel_for(j.mb * j.np, 1, panel_tasks, &j);
      } else {
        pack_panel(&j, 0, nsl);
        panel_tasks(&j, 0, j.mb * j.np);
      }
    }
  }
}

/* Rows of A of a chunk packed for the tile unit: 32-row groups [b, e). */
static void pack_a_groups(void *p, int64_t b, int64_t e) {
  const bpanel *j = p;
  for (int64_t g = b; g < e; g++) pack_a_rows(j->ap + g * AMX_MR * j->lda, j->lda, j->x, g * AMX_MR, j->k0, j->kc);
}

/* Row stride (elements) of A packed for the tile unit at chunks of kc:
 * one cache line more than the chunk, so that the 16 rows of a tile fall
 * in different sets of the L1 (2^n-byte rows share one and evict each
 * other — why A is packed even where bf16 rows could load in place). */
static int64_t amx_lda(int64_t kc) { return kc + 32; }

/* bytes of A packed for the tile unit (one chunk of all rows) */
static size_t amx_a_bytes(int64_t M, int64_t k2) {
  return (size_t)((M + AMX_MR - 1) / AMX_MR * AMX_MR) * (size_t)amx_lda(chunk_k(k2, 1)) * 2;
}

/* Fused tasks of a hooked product on the dot products with few rows (at
 * most 2 AMX_MB blocks: a convolution's output channels): a task packs the
 * slivers of its own FUSE_SL-sliver column block into a slot of the panel
 * memory and runs every row block over them at once — one pass over the
 * pool a chunk of K instead of two a panel (packing, then the blocks).
 * A forward pass of 64 channels at 32^2 ran a panel of 288 columns in
 * ~35 us between two barriers, and the threads waited at them for 8 % of
 * its time. The same kernel calls on the same chunks of K: the same bits. */
#define FUSE_SL 2
typedef struct {
  bpanel j;              /* the chunk: j0 0, every column, np 1 */
  int64_t slot_words;    /* uint32s of a slot: FUSE_SL slivers of the chunk */
  _Atomic uint64_t busy; /* slots in use */
} fjob;

static void strip_tasks(const bpanel *j, int64_t b, int64_t e, strip_block_fn block);

static void fused_tasks(void *p, int64_t b, int64_t e) {
#if defined(__x86_64__) || defined(__i386__)
  fjob *f = p;
  uint64_t m = atomic_load(&f->busy);
  int slot;
  do
    slot = __builtin_ctzll(~m);
  while (!atomic_compare_exchange_weak(&f->busy, &m, m | 1ull << slot));
  bpanel j = f->j;
  j.bp = f->j.bp + slot * f->slot_words;
  for (int64_t u = b; u < e; u++) {
    int64_t s0 = u * FUSE_SL, s1 = s0 + FUSE_SL < f->j.nsl ? s0 + FUSE_SL : f->j.nsl;
    j.j0 = s0 * BNR;
    j.nsl = s1 - s0;
    j.nc = f->j.nc - j.j0 < j.nsl * BNR ? f->j.nc - j.j0 : j.nsl * BNR;
    pack_panel(&j, 0, j.nsl);
    strip_tasks(&j, 0, j.mb, rows_strip_block);
  }
  atomic_fetch_and(&f->busy, ~(1ull << slot));
#else
  (void)p, (void)b, (void)e;
#endif
}

/* Does a product run fused tasks (above)? */
static int fuse_worth(const bprod *x, int64_t nth, void (*tasks)(void *, int64_t, int64_t));

/* One product on the tile unit: per chunk of K, A packed once (all rows),
 * then per panel of B (AMX_PANEL bytes) the panel packed and the tasks
 * (or fused tasks over every column, fuse_worth). */
static void run_amx_with(const bprod *x, uint32_t *bp, uint16_t *ap, int par, const tpurt__bmat *out, float oalpha,
                         float obeta, void (*tasks)(void *, int64_t, int64_t)) {
  int64_t nth = par ? tpurt_num_threads() : 1, KC = chunk_k(x->K2, 1), pc = panel_cols(KC, 1);
  int64_t mb = (x->M + AMX_MB - 1) / AMX_MB, ng = (x->M + AMX_MR - 1) / AMX_MR;
  for (int64_t k0 = 0; k0 < x->K2; k0 += KC) {
    int64_t kc = x->K2 - k0 < KC ? x->K2 - k0 : KC;
    kc = (kc + AMX_KS - 1) / AMX_KS * AMX_KS;
    int wide = nth > 1 && x->M * x->N * kc >= (1 << 18);
    bpanel ja = {x, bp, 0, 0, k0, kc, 0, mb, 1, 0.0f, ap, amx_lda(kc), out, oalpha, obeta};
    if (wide)
      tpurt_parallel_for(ng, 1, pack_a_groups, &ja);
    else
      pack_a_groups(&ja, 0, ng);
    if (fuse_worth(x, nth, tasks)) {
      fjob f = {ja, FUSE_SL * (kc / 2) * BNR, 0};
      f.j.nc = x->N, f.j.nsl = (x->N + BNR - 1) / BNR, f.j.beta = k0 == 0 ? x->beta : 1.0f;
      tpurt_parallel_for((f.j.nsl + FUSE_SL - 1) / FUSE_SL, 1, fused_tasks, &f);
      continue;
    }
    for (int64_t j0 = 0; j0 < x->N; j0 += pc) {
      int64_t nc = x->N - j0 < pc ? x->N - j0 : pc, nsl = (nc + BNR - 1) / BNR;
      bpanel j = ja;
      j.j0 = j0, j.nc = nc, j.nsl = nsl, j.beta = k0 == 0 ? x->beta : 1.0f;
      /* column parts: >= 4 tasks per thread where the panel is wide enough */
      int64_t npair = (nsl + 1) / 2, want = (4 * nth + mb - 1) / mb;
      if (nth > 1 && mb < 4 * nth) j.np = want < npair ? want : npair;
      if (wide && x->M * nc * kc >= (1 << 18)) {
        tpurt_parallel_for((nsl + 1) / 2, 1, pack_pairs, &j);
        tpurt_parallel_for(mb * j.np, 1, tasks, &j);
      } else {
        pack_panel(&j, 0, nsl);
        tasks(&j, 0, mb * j.np);
      }
    }
  }
}

/* Paired against the panels (Zen 5, 2 threads, 3 x 3 bf16 convolutions,
 * N 64): forward passes and input gradients of 64 -> 64 at 32^2
 * 1.07-1.35, 192 -> 64 1.40, 128 -> 128 1.54-1.62, to 256 channels
 * 1.18-1.25, to 512 1.06, but to 1024 0.87-1.00; weight gradients (A: the
 * gathered image rows, pack_a, in K chunks of 2048 positions) 0.75-0.98:
 * every task streams all of A's rows for its few columns, the panels
 * stream them once. So: hooked products with a plain A (the weights) on
 * the dot products, at most 512 rows, and at least a column block a
 * thread. TORCH_TPU_BGEMM_FUSED=0: the panels always. */
static int fuse_worth(const bprod *x, int64_t nth, void (*tasks)(void *, int64_t, int64_t)) {
  int64_t blocks = (x->N + FUSE_SL * BNR - 1) / (FUSE_SL * BNR);
  const char *e = getenv("TORCH_TPU_BGEMM_FUSED"); /* 0: the panels always (tests, measurements) */
  return tasks == rows_tasks && x->hk && !x->hk->pack_a && x->M <= 8 * AMX_MB && nth > 1 && nth <= 64 &&
         blocks >= nth && !(e && !strcmp(e, "0"));
}

static void run_amx(const bprod *x, uint32_t *bp, uint16_t *ap, int par, const tpurt__bmat *out, float oalpha,
                    float obeta) {
  run_amx_with(x, bp, ap, par, out, oalpha, obeta, amx_tasks);
}

typedef struct {
  int64_t M, N, K;
  float alpha, beta;
  tpurt__bmat a, b, c;
  int64_t sa, sb, sc;
  int split, par, direct; /* direct: C is plain f32 (no f32 result first) */
  int amx;                /* on the tile unit (alpha 1 and beta 0 or 1 when direct) */
  char *mem;              /* per slot: the B panel, then the f32 result */
  size_t slot_bytes, panel_bytes, apack_bytes;
  _Atomic uint64_t busy; /* slots in use (batch tasks) */
} bbatch;

/* The product x with the slot's buffers: B panel, then (tile unit) packed A. */
static void run_product(const bbatch *bb, const bprod *x, char *mem, const tpurt__bmat *out) {
  if (bb->amx)
    run_amx(x, (uint32_t *)mem, (uint16_t *)(mem + bb->panel_bytes), bb->par, out, bb->alpha, bb->beta);
  else
    run_bprod(x, (uint32_t *)mem, bb->par);
}

static void one_product(bbatch *bb, int64_t bi, int slot) {
  size_t ea = tpurt_dtype_size(bb->a.dt), eb = tpurt_dtype_size(bb->b.dt), ec = tpurt_dtype_size(bb->c.dt);
  bprod x = {bb->a, bb->b, bb->M, bb->N, bb->K, bb->split ? 3 * bb->K : bb->K, bb->split, bb->alpha, bb->beta, NULL, 0,
             NULL};
  x.a.p = (const char *)bb->a.p + (ptrdiff_t)(bi * bb->sa) * (ptrdiff_t)ea;
  x.b.p = (const char *)bb->b.p + (ptrdiff_t)(bi * bb->sb) * (ptrdiff_t)eb;
  tpurt__bmat c = bb->c;
  c.p = (const char *)bb->c.p + (ptrdiff_t)(bi * bb->sc) * (ptrdiff_t)ec;
  char *mem = bb->mem + (size_t)slot * bb->slot_bytes;
  if (bb->direct) {
    x.c = (float *)c.p;
    x.ldc = c.rs;
    run_product(bb, &x, mem, NULL);
    return;
  }
  /* another dtype or layout: an f32 result first (alpha applied, but on
   * the tile unit), then C */
  float *t = (float *)(mem + bb->panel_bytes + bb->apack_bytes);
  x.c = t;
  x.ldc = bb->N;
  x.beta = 0.0f;
  if (bb->amx) { /* the tile unit writes C from its last chunk's blocks */
    x.alpha = 1.0f;
    run_product(bb, &x, mem, &c);
    return;
  }
  run_product(bb, &x, mem, NULL);
  epi_job ej = {t, &c, bb->N, 1.0f, bb->beta};
  if (bb->par && bb->M * bb->N >= (1 << 15))
    tpurt_parallel_for(bb->M, (1 << 14) / bb->N + 1, epi_rows, &ej);
  else
    epi_rows(&ej, 0, bb->M);
}

/* Products [b, e), each on this thread with a free slot's buffers (at most
 * one task per pool thread runs at a time, and there are as many slots). */
static void batch_tasks(void *p, int64_t b, int64_t e) {
  bbatch *bb = p;
  int slot = 0;
  for (;;) {
    uint64_t m = atomic_load(&bb->busy);
    while (m >> slot & 1) slot++;
    if (atomic_compare_exchange_weak(&bb->busy, &m, m | (uint64_t)1 << slot)) break;
    slot = 0;
  }
  for (int64_t i = b; i < e; i++) one_product(bb, i, slot);
  atomic_fetch_and(&bb->busy, ~((uint64_t)1 << slot));
}

int tpurt__bgemm(int64_t nb, int64_t M, int64_t N, int64_t K, float alpha, const tpurt__bmat *A, int64_t sa,
                 const tpurt__bmat *B, int64_t sb, int split, float beta, const tpurt__bmat *C, int64_t sc) {
  if (nb <= 0 || M <= 0 || N <= 0 || K <= 0) return 0;
  bbatch bb = {M, N, K, alpha, beta, *A, *B, *C, sa, sb, sc, split, 0, 0, 0, NULL, 0, 0, 0, 0};
  bb.amx = use_amx();
  bb.direct = C->dt == TPURT_F32 && C->cs == 1 && C->rs >= N && (!bb.amx || (alpha == 1.0f && (beta == 0.0f || beta == 1.0f)));
  int64_t nth = tpurt_num_threads(), k2 = split ? 3 * K : K;
  int par = nth > 1 && !tpurt__pool_nested();
  double macs = (double)M * (double)N * (double)k2;
  int batch = nb > 1 && par && nth <= 64 && (nb >= 4 * nth || (macs < (double)(1 << 22) && nb >= nth));
  bb.panel_bytes = (panel_words(N, k2, bb.amx) * 4 + 63) & ~(size_t)63;
  bb.apack_bytes = bb.amx ? (amx_a_bytes(M, k2) + 63) & ~(size_t)63 : 0;
  bb.slot_bytes = bb.panel_bytes + bb.apack_bytes + (bb.direct ? 0 : (size_t)(M * N) * 4);
  bb.mem = buf(bb.slot_bytes * (size_t)(batch ? nth : 1));
  if (!bb.mem) return 0;
  if (batch) { /* many products, or small ones: one per task, each on one thread */
    tpurt_parallel_for(nb, (int64_t)((double)(1 << 18) / macs) + 1, batch_tasks, &bb);
    return 1;
  }
  bb.par = par;
  for (int64_t i = 0; i < nb; i++) one_product(&bb, i, 0);
  return 1;
}

int tpurt__bgemm_hooked(int64_t M, int64_t N, int64_t K, const tpurt__bmat *A, const tpurt__bhooks *hk) {
  if (M <= 0 || N <= 0 || K <= 0 || !tpurt__bgemm_applies() || !hk->pack_b || !hk->out || (!hk->pack_a && !A))
    return 0;
  int amx = use_amx(); /* else the dot-product kernel on the same layout (rows_tasks) */
  static const uint16_t zero = 0;
  tpurt__bmat a = A ? *A : (tpurt__bmat){&zero, TPURT_BF16, 0, 1};
  tpurt__bmat b = {&zero, TPURT_BF16, 0, 1}; /* read only through hk->pack_b */
  int64_t KC = chunk_k(K, 1);
  size_t panel = panel_words(N, K, 1) * 4, slots = (size_t)tpurt_num_threads() * FUSE_SL * (size_t)(KC / 2) * BNR * 4;
  if (!amx && slots > panel) panel = slots; /* fused tasks' slots (fuse_worth) */
  panel = (panel + 63) & ~(size_t)63;
  size_t apack = (amx_a_bytes(M, K) + 63) & ~(size_t)63;
  size_t cbytes = K > KC ? (size_t)(M * N) * 4 : 0; /* C between K chunks (one chunk: the strip only) */
  char *mem = buf(panel + apack + cbytes);
  if (!mem) return 0;
  bprod x = {a, b, M, N, K, K, 0, 1.0f, 0.0f, (float *)(mem + panel + apack), N, hk};
  int par = tpurt_num_threads() > 1 && !tpurt__pool_nested();
  run_amx_with(&x, (uint32_t *)mem, (uint16_t *)(mem + panel), par, NULL, 1.0f, 0.0f, amx ? amx_tasks : rows_tasks);
  return 1;
}
