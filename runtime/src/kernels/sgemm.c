/*
 * sgemm.c — the runtime's own packed f32 GEMM (GotoBLAS/BLIS structure).
 *
 *   for jc in N step NC:                       B panel: KC x NC, shared
 *     for pc in K step KC:                     one pool region per panel:
 *       every chunk first helps pack op(B)[pc:pc+KC, jc:jc+NC] into
 *       NR-wide column slivers (claimed two at a time), waits for the
 *       panel, then runs its (row range, sliver range) task:
 *         for ic in rows step MC:             A block: MC x KC, per thread
 *           pack op(A)[ic:ic+MC, pc:pc+KC] into MR-tall row slivers
 *           for jr in slivers: for ir in A slivers: MR x NR micro-kernel
 *
 * The micro-kernel keeps an MR x NR = 6 x 16 tile of C in 12 ymm
 * accumulators (AVX2 + FMA; per k: 2 loads of B, 6 broadcasts of A, 12
 * FMAs). It is compiled for AVX2/FMA with a target attribute and chosen at
 * run time; any other x86-64 (or TORCH_TPU_SGEMM=scalar) runs a portable C
 * micro-kernel with the same structure. Packing reads any layout (plain
 * or transposed, any leading dimension), and pads edge slivers with
 * zeros; partial micro-tiles are computed into a temporary tile and only
 * their valid part is written back.
 *
 * Determinism: threads split only rows and columns of C, never K. Each C
 * element's sum runs over the KC chunks in order (chunk boundaries depend
 * on K alone), and a micro-tile is full or partial by shape alone, so the
 * result is bitwise the same whatever the thread count or scheduling.
 *
 * alpha and beta: the first K chunk writes alpha*acc + beta*C (beta == 0
 * never reads C, which may hold NaN garbage), later chunks add alpha*acc.
 *
 * Blocking for Zen3 (L1d 32 KiB, L2 512 KiB per core, L3 32 MiB shared):
 * a B sliver (KC x NR x 4 = 16 KiB at KC 256) stays in L1 while the A
 * block (MC x KC x 4) streams from L2; the B panel (KC x NC) lives in L3.
 * Sizes measured with runtime/bench/bench_sgemm.c (see BLOCK_* below).
 *
 * Batched products: small products (or many of them) run one whole
 * product per pool task with thread-local buffers; large ones run one
 * after the other, each split over the pool as above.
 */
#include <immintrin.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_internal.h"

#define MR 6
#define NR 16

/* Block sizes (elements). KC: depth of a panel; MC: rows of an A block
 * (multiple of MR); NC: columns of a B panel (multiple of NR).
 * Overridable for measurements with TORCH_TPU_SGEMM_BLOCKS="KC,MC,NC"
 * (read at every product). Measured single-threaded on the (shared,
 * loaded: +-10 %) 2-core Zen3, GFLOP/s by CPU time, best of 9:
 *   KC,MC (NC 4096)   1024^3   4096x256x1024   256^3
 *   256,96            82..85   74..86          83..85
 *   256,144           76..84   75..85          76..87
 *   256,192           76..85   71..80          76..81
 *   384,120           73..83   77..83          78..82
 *   192,144           78..81   77..80          79..84
 * (no size stands out: KC 256 keeps a B sliver at 16 KiB in L1, MC 96 an
 * A block at 96 KiB in L2). NC (KC 256, MC 96), own vs OpenBLAS:
 *   NC     128x4096x256  1024^3     2048^3     4096x768x256  32x4096x256
 *   4096   56 vs 76      73 vs 80   75 vs 82   87 vs 87      34 vs 55
 *   1024   66 vs 64      84 vs 91   80 vs 85   90 vs 86      39 vs 51
 *   512    60 vs 72                                          43 vs 62
 * NC 1024: a 1 MiB panel, shared by both cores from L3, re-read for every
 * A block of MC rows. The micro-kernel alone (operands in L1) runs at
 * 94 GFLOP/s on one core. */
typedef struct {
  int64_t kc, mc, nc;
} blocks;
#define KC_MAX 512 /* bounds the stack slivers of the no-buffer path */
static const blocks g_blocks = {256, 96, 1024};

/* ------------------------------------------------------------ mode */

static _Atomic int g_have_avx2 = -1;
static int have_avx2(void) {
  int v = atomic_load_explicit(&g_have_avx2, memory_order_relaxed);
  if (v < 0) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    v = 0;
#endif
    atomic_store_explicit(&g_have_avx2, v, memory_order_relaxed);
  }
  return v;
}

const char *tpurt__sgemm_kernel_name(void) { return have_avx2() ? "6x16 AVX2/FMA" : "6x16 portable"; }

/* TORCH_TPU_SGEMM: "auto" (default: by shape, see tpurt__sgemm_use_own),
 * "own" (always this kernel), "scalar" (this kernel with the portable
 * micro-kernel), "blas" (always the OpenBLAS tiles), "nobuf" (this kernel
 * as when its packing buffers cannot be allocated: tests). Read at every
 * product (benchmarks and tests switch it between calls). */
int tpurt__sgemm_mode(void) {
  const char *e = getenv("TORCH_TPU_SGEMM");
  if (!e || !*e) return 0;
  if (!strcmp(e, "own")) return 1;
  if (!strcmp(e, "blas")) return 2;
  if (!strcmp(e, "scalar")) return 3;
  if (!strcmp(e, "nobuf")) return 4;
  return 0;
}

static blocks read_blocks(void) {
  blocks b = g_blocks;
  const char *e = getenv("TORCH_TPU_SGEMM_BLOCKS");
  long kc = 0, mc = 0, nc = 0;
  if (e && *e && sscanf(e, "%ld,%ld,%ld", &kc, &mc, &nc) == 3 && kc >= 8 && kc <= KC_MAX && mc >= MR && nc >= NR) {
    b.kc = kc;
    b.mc = mc / MR * MR;
    b.nc = nc / NR * NR;
  }
  return b;
}

/* ------------------------------------------------------ micro-kernels */

/* c[MR x NR] (leading dimension ldc) = alpha * a.b + beta * c, where a is
 * a packed MR-tall sliver (a[p*MR + i]) and b a packed NR-wide sliver
 * (b[p*NR + j]) of depth k. beta == 0 does not read c. */
typedef void (*ukr_fn)(int64_t k, const float *a, const float *b, float *c, int64_t ldc, float alpha, float beta);

#if defined(__x86_64__) || defined(__i386__)
#define ROW(i)                                                             \
  do {                                                                     \
    __m256 ai = _mm256_broadcast_ss(a + (i));                              \
    c##i##0 = _mm256_fmadd_ps(ai, b0, c##i##0);                            \
    c##i##1 = _mm256_fmadd_ps(ai, b1, c##i##1);                            \
  } while (0)
#define STORE(i)                                                                                   \
  do {                                                                                             \
    float *r = c + (i) * ldc;                                                                      \
    if (beta == 0.0f) {                                                                            \
      _mm256_storeu_ps(r, _mm256_mul_ps(va, c##i##0));                                             \
      _mm256_storeu_ps(r + 8, _mm256_mul_ps(va, c##i##1));                                         \
    } else {                                                                                       \
      _mm256_storeu_ps(r, _mm256_fmadd_ps(va, c##i##0, _mm256_mul_ps(vb, _mm256_loadu_ps(r))));    \
      _mm256_storeu_ps(r + 8, _mm256_fmadd_ps(va, c##i##1, _mm256_mul_ps(vb, _mm256_loadu_ps(r + 8)))); \
    }                                                                                              \
  } while (0)

__attribute__((target("avx2,fma"))) static void ukr_avx2(int64_t k, const float *restrict a, const float *restrict b,
                                                         float *restrict c, int64_t ldc, float alpha, float beta) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
         c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
         c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c40 = _mm256_setzero_ps(),
         c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int i = 0; i < MR; i++) _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
  for (int i = 0; i < MR; i++) _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);
#pragma GCC unroll 4
  for (int64_t p = 0; p < k; p++) {
    __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
    ROW(0);
    ROW(1);
    ROW(2);
    ROW(3);
    ROW(4);
    ROW(5);
    a += MR;
    b += NR;
  }
  __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  STORE(0);
  STORE(1);
  STORE(2);
  STORE(3);
  STORE(4);
  STORE(5);
}
#undef ROW
#undef STORE
#endif

static void ukr_scalar(int64_t k, const float *restrict a, const float *restrict b, float *restrict c, int64_t ldc,
                       float alpha, float beta) {
  float acc[MR][NR];
  memset(acc, 0, sizeof acc);
  for (int64_t p = 0; p < k; p++) {
    const float *ap = a + p * MR, *bp = b + p * NR;
    for (int i = 0; i < MR; i++)
      for (int j = 0; j < NR; j++) acc[i][j] += ap[i] * bp[j];
  }
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) {
      float v = alpha * acc[i][j];
      c[i * ldc + j] = beta == 0.0f ? v : v + beta * c[i * ldc + j];
    }
}

/* ------------------------------------------------------------ packing */

/* One product's operands: op(A) is M x K, op(B) is K x N. */
typedef struct {
  int ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  const float *A, *B;
  float *C;
  int64_t lda, ldb, ldc;
  int avx;   /* AVX2 micro-kernel and packing (else the portable code) */
  int nobuf; /* act as if the packing buffers could not be allocated (tests) */
} prod;

#if defined(__x86_64__) || defined(__i386__)
/* Columns p..p+7 of 8 rows (r[i] + p .. + 7) transposed: c[q] holds
 * r[0][p+q] .. r[7][p+q]. */
__attribute__((target("avx2,fma"))) static inline void tr8(const float *const r[8], int64_t p, __m256 c[8]) {
  __m256 x0 = _mm256_loadu_ps(r[0] + p), x1 = _mm256_loadu_ps(r[1] + p), x2 = _mm256_loadu_ps(r[2] + p),
         x3 = _mm256_loadu_ps(r[3] + p), x4 = _mm256_loadu_ps(r[4] + p), x5 = _mm256_loadu_ps(r[5] + p),
         x6 = _mm256_loadu_ps(r[6] + p), x7 = _mm256_loadu_ps(r[7] + p);
  __m256 t0 = _mm256_unpacklo_ps(x0, x1), t1 = _mm256_unpackhi_ps(x0, x1), t2 = _mm256_unpacklo_ps(x2, x3),
         t3 = _mm256_unpackhi_ps(x2, x3), t4 = _mm256_unpacklo_ps(x4, x5), t5 = _mm256_unpackhi_ps(x4, x5),
         t6 = _mm256_unpacklo_ps(x6, x7), t7 = _mm256_unpackhi_ps(x6, x7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
         u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
         u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
         u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  c[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  c[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  c[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  c[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  c[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  c[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  c[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  c[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Full A sliver from MR row pointers (plain A): d[p*MR + i] = r[i][p].
 * Rows 6, 7 of the transpose repeat row 5 (their lanes are never kept:
 * each 8-wide store is overwritten by the next one's first 6 lanes, and
 * the buffer has slack for the last). */
__attribute__((target("avx2,fma"))) static void pack_a_rows_avx2(float *restrict d, const float *const r6[MR],
                                                                 int64_t kc) {
  const float *r[8] = {r6[0], r6[1], r6[2], r6[3], r6[4], r6[5], r6[5], r6[5]};
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    __m256 c[8];
    tr8(r, p, c);
    for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (p + q) * MR, c[q]);
  }
  for (; p < kc; p++)
    for (int i = 0; i < MR; i++) d[p * MR + i] = r[i][p];
}

/* Full B sliver from NR row pointers of B (transposed B): d[p*NR + j] = r[j][p]. */
__attribute__((target("avx2,fma"))) static void pack_b_rows_avx2(float *restrict d, const float *const r[NR],
                                                                 int64_t kc) {
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    __m256 c[8];
    tr8(r, p, c);
    for (int q = 0; q < 8; q++) _mm256_store_ps(d + (p + q) * NR, c[q]);
    tr8(r + 8, p, c);
    for (int q = 0; q < 8; q++) _mm256_store_ps(d + (p + q) * NR + 8, c[q]);
  }
  for (; p < kc; p++)
    for (int j = 0; j < NR; j++) d[p * NR + j] = r[j][p];
}
#endif

/* 6 contiguous floats (transposed A): 4 + 2 moves, no library call. */
static inline void copy6(float *restrict d, const float *restrict s) {
  float t[MR];
  memcpy(t, s, sizeof t);
  memcpy(d, t, sizeof t);
}

/* One w-wide sliver (w = MR for A, NR for B) of depth kc into d (d[p*w +
 * i]), lanes from n on zero. `rows`: lane i is row i of the stored matrix
 * (src + i*ld, read along p), else lane i is column i (src + p*ld + i).
 * Inlined with a constant w for each operand. */
static inline void pack_sliver(float *restrict d, int w, const float *src, int64_t ld, int rows, int64_t n,
                               int64_t kc, int avx) {
  if (rows) {
    const float *r[NR]; /* NR >= MR */
    for (int i = 0; i < w; i++) r[i] = src + (i < n ? i : 0) * ld;
    if (n == w) {
#if defined(__x86_64__) || defined(__i386__)
      if (avx) {
        if (w == MR)
          pack_a_rows_avx2(d, r, kc);
        else
          pack_b_rows_avx2(d, r, kc);
        return;
      }
#endif
      for (int64_t p = 0; p < kc; p++)
        for (int i = 0; i < w; i++) d[p * w + i] = r[i][p];
    } else {
      for (int64_t p = 0; p < kc; p++)
        for (int i = 0; i < w; i++) d[p * w + i] = i < n ? r[i][p] : 0.0f;
    }
  } else if (n == w) {
    for (int64_t p = 0; p < kc; p++) {
      if (w == MR)
        copy6(d + p * MR, src + p * ld);
      else
        memcpy(d + p * NR, src + p * ld, NR * sizeof(float));
    }
  } else {
    for (int64_t p = 0; p < kc; p++)
      for (int i = 0; i < w; i++) d[p * w + i] = i < n ? src[p * ld + i] : 0.0f;
  }
}

/* op(A)[i0:i0+mc, p0:p0+kc] -> dst, MR-tall slivers, rows past mc zero. */
static void pack_a(float *restrict dst, const prod *x, int64_t i0, int64_t mc, int64_t p0, int64_t kc) {
  for (int64_t s = 0; s < mc; s += MR) {
    int64_t m = mc - s < MR ? mc - s : MR, i = i0 + s;
    const float *src = x->ta ? x->A + p0 * x->lda + i : x->A + i * x->lda + p0;
    pack_sliver(dst + s * kc, MR, src, x->lda, !x->ta, m, kc, x->avx);
  }
}

/* Slivers [t0, t1) of op(B)[p0:p0+kc, j0:j0+nc] -> dst (sliver t at
 * dst + (t - t0)*kc*NR), columns past nc zero. */
static void pack_b(float *restrict dst, const prod *x, int64_t j0, int64_t nc, int64_t p0, int64_t kc, int64_t t0,
                   int64_t t1) {
  for (int64_t t = t0; t < t1; t++) {
    int64_t s = t * NR, n = nc - s < NR ? nc - s : NR, j = j0 + s;
    const float *src = x->tb ? x->B + j * x->ldb + p0 : x->B + p0 * x->ldb + j;
    pack_sliver(dst + (t - t0) * kc * NR, NR, src, x->ldb, x->tb, n, kc, x->avx);
  }
}

/* ------------------------------------------------------------ buffers */

/* Grow-only thread-local buffers: the B panel of the thread that drives
 * a product (read by every pool thread), the A block of each thread. */
static _Thread_local struct {
  float *p;
  size_t n;
} t_buf[2];

static float *buf(int slot, size_t floats) {
  if (t_buf[slot].n < floats) {
    free(t_buf[slot].p);
    size_t bytes = (floats * sizeof(float) + 4095) & ~(size_t)4095;
    t_buf[slot].p = aligned_alloc(64, bytes);
    t_buf[slot].n = t_buf[slot].p ? bytes / sizeof(float) : 0;
  }
  return t_buf[slot].p;
}

/* ------------------------------------------------------ macro-kernel */

typedef struct {
  const prod *x;
  ukr_fn ukr;
  const float *bp; /* packed panel */
  int64_t j0, nc, p0, kc, mc;
  float beta; /* beta of this K chunk */
  int64_t mu, ns, nsl; /* row slivers of M, column parts, slivers per panel */
  _Atomic int64_t pack_next, packed; /* B slivers claimed / finished */
} panel_job;

/* B packing inside the compute region (one pool handoff per panel, not
 * two): every chunk first claims unpacked slivers until none is left,
 * then waits until all claimed ones are finished. A claimed sliver is
 * always being packed by a running chunk, so the wait ends. */
static void pack_panel(panel_job *j) {
  if (!j->bp) return; /* no panel: macro packs each sliver where it is used */
  for (;;) {
    int64_t t = atomic_fetch_add_explicit(&j->pack_next, 2, memory_order_relaxed);
    if (t >= j->nsl) break;
    int64_t e = t + 2 < j->nsl ? t + 2 : j->nsl;
    pack_b((float *)j->bp + t * j->kc * NR, j->x, j->j0, j->nc, j->p0, j->kc, t, e);
    atomic_fetch_add_explicit(&j->packed, e - t, memory_order_release);
  }
  for (int spins = 0; atomic_load_explicit(&j->packed, memory_order_acquire) < j->nsl; spins++) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
    if (spins > 2000) sched_yield();
  }
}

/* Rows [r0, r1) (multiples of MR, r1 may pass M) times slivers [s0, s1)
 * of the packed panel. */
static void macro(const panel_job *j, int64_t r0, int64_t r1, int64_t s0, int64_t s1) {
  const prod *x = j->x;
  int64_t kc = j->kc, mc_max = j->mc;
  /* + slack for pack_a_rows_avx2's last store */
  float *ap = x->nobuf ? NULL : buf(1, (size_t)mc_max * kc + 8);
  _Alignas(64) float tmp[MR * NR];
  /* Without buffers (host memory exhausted) each sliver is packed on the
   * stack where it is used: slower, the same products in the same order. */
  _Alignas(64) float a1[MR * KC_MAX + 8], b1[KC_MAX * NR];
  for (int64_t ic = r0; ic < r1; ic += mc_max) {
    int64_t mc = r1 - ic < mc_max ? r1 - ic : mc_max;
    if (ic + mc > x->M) mc = x->M - ic;
    if (mc <= 0) break;
    if (ap) pack_a(ap, x, ic, mc, j->p0, kc);
    for (int64_t t = s0; t < s1; t++) {
      const float *bs = j->bp ? j->bp + t * kc * NR : b1;
      int64_t jj = j->j0 + t * NR, n = j->j0 + j->nc - jj < NR ? j->j0 + j->nc - jj : NR;
      if (!j->bp) pack_b(b1, x, j->j0, j->nc, j->p0, kc, t, t + 1);
      for (int64_t s = 0; s < mc; s += MR) {
        int64_t m = mc - s < MR ? mc - s : MR;
        float *c = x->C + (ic + s) * x->ldc + jj;
        const float *as = ap ? ap + s * kc : a1;
        if (!ap) pack_a(a1, x, ic + s, m, j->p0, kc);
        if (m == MR && n == NR) {
          j->ukr(kc, as, bs, c, x->ldc, x->alpha, j->beta);
        } else {
          j->ukr(kc, as, bs, tmp, NR, 1.0f, 0.0f);
          for (int64_t i = 0; i < m; i++)
            for (int64_t q = 0; q < n; q++) {
              float v = x->alpha * tmp[i * NR + q];
              c[i * x->ldc + q] = j->beta == 0.0f ? v : v + j->beta * c[i * x->ldc + q];
            }
        }
      }
    }
  }
}

static void panel_tasks(void *p, int64_t b, int64_t e) {
  panel_job *j = p;
  pack_panel(j);
  /* task t: column part t / mu, row sliver t % mu; a chunk is cut where
   * the column part changes */
  while (b < e) {
    int64_t part = b / j->mu, r = b % j->mu;
    int64_t end = (part + 1) * j->mu < e ? (part + 1) * j->mu : e;
    int64_t s0 = j->nsl * part / j->ns, s1 = j->nsl * (part + 1) / j->ns;
    macro(j, r * MR, (end - part * j->mu) * MR, s0, s1);
    b = end;
  }
}

/* Minimum multiply-adds of one pool chunk. */
#define CHUNK_MACS ((int64_t)1 << 18)

/* One product; parallel over the pool when `par` (else on this thread). */
static void run_product(const prod *x, ukr_fn ukr, blocks bl, int par) {
  int64_t nth = par ? tpurt_num_threads() : 1;
  int64_t KC = bl.kc, NC = bl.nc;
  for (int64_t j0 = 0; j0 < x->N; j0 += NC) {
    int64_t nc = x->N - j0 < NC ? x->N - j0 : NC;
    int64_t nsl = (nc + NR - 1) / NR;
    for (int64_t p0 = 0; p0 < x->K; p0 += KC) {
      int64_t kc = x->K - p0 < KC ? x->K - p0 : KC;
      float *bp = x->nobuf ? NULL : buf(0, (size_t)nsl * NR * kc);
      panel_job j = {x, ukr, bp, j0, nc, p0, kc, bl.mc, p0 == 0 ? x->beta : 1.0f, (x->M + MR - 1) / MR, 1, nsl, 0, 0};
      /* few row slivers: split the panel's columns too */
      if (nth > 1 && j.mu < 4 * nth) {
        int64_t ns = (4 * nth + j.mu - 1) / j.mu;
        j.ns = ns < nsl ? ns : nsl;
      }
      int64_t task_macs = MR * kc * (nc / j.ns + 1);
      int64_t grain = CHUNK_MACS / task_macs + 1;
      int64_t ntask = j.mu * j.ns;
      if (nth > 1 && ntask > grain)
        tpurt_parallel_for(ntask, grain, panel_tasks, &j);
      else
        panel_tasks(&j, 0, ntask);
    }
  }
}

/* --------------------------------------------------------- batching */

typedef struct {
  prod x;
  ukr_fn ukr;
  blocks bl;
  int64_t sa, sb, sc;
} batch_job;

static void batch_tasks(void *p, int64_t b, int64_t e) {
  const batch_job *bj = p;
  for (int64_t i = b; i < e; i++) {
    prod x = bj->x;
    x.A += i * bj->sa;
    x.B += i * bj->sb;
    x.C += i * bj->sc;
    run_product(&x, bj->ukr, bj->bl, 0);
  }
}

/* Products below this many multiply-adds are not split over the pool
 * when a batch can be spread instead. */
#define SPLIT_MIN_MACS ((double)(1 << 22))

void tpurt__sgemm_own(int ta, int tb, int64_t nb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta, float *C,
                      int64_t ldc, int64_t sc, int flags) {
  if (nb <= 0 || M <= 0 || N <= 0 || K <= 0) return;
  ukr_fn ukr = ukr_scalar;
  int avx = !(flags & 1) && have_avx2();
#if defined(__x86_64__) || defined(__i386__)
  if (avx) ukr = ukr_avx2;
#endif
  batch_job bj = {{ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, avx, (flags & 2) != 0}, ukr, read_blocks(),
                  sa, sb, sc};
  int64_t nth = tpurt_num_threads();
  double macs = (double)M * (double)N * (double)K;
  if (nb > 1 && nth > 1 && !tpurt__pool_nested() && (nb >= 4 * nth || (macs < SPLIT_MIN_MACS && nb >= nth))) {
    int64_t grain = (int64_t)((double)CHUNK_MACS / macs) + 1;
    tpurt_parallel_for(nb, grain, batch_tasks, &bj);
    return;
  }
  int par = nth > 1 && !tpurt__pool_nested();
  for (int64_t i = 0; i < nb; i++) {
    prod x = bj.x;
    x.A += i * sa;
    x.B += i * sb;
    x.C += i * sc;
    run_product(&x, ukr, bj.bl, par);
  }
}
