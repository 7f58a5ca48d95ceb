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
 * FMAs). On AVX-512 CPUs A slivers are 8 rows tall (MR 8): two full B
 * slivers run together as an 8 x 32 tile in 16 zmm accumulators (per k: 2
 * loads, 8 broadcasts, 16 FMAs) and a single one as an 8 x 16 tile in 8.
 * Eight rows divide the row counts of real products (channels, features,
 * tokens: multiples of 8) where six leave a partial sliver that computes a
 * full tile for a few rows: a 32-channel convolution ran 5 full slivers and
 * a third of one. Every C element gets the same FMAs in the same order in
 * each tile shape: the same bits. The kernels are compiled for AVX2/FMA or
 * AVX-512 with target attributes and chosen at run time; any other x86-64
 * (or TORCH_TPU_SGEMM=scalar) runs a portable C micro-kernel with the same
 * structure. Packing reads any layout (plain
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
 * Sizes measured with runtime/bench/bench_sgemm.c (see BLOCK_* below). On
 * the AVX-512 Xeon (L1d 48 KiB, L2 2 MiB) the 8 x 32 tiles keep a pair of
 * slivers (32 KiB) in L1; KC 192 / 384 and MC 128 / 192 measured within
 * +-5 % of these sizes (paired in-process samples, 2 threads).
 *
 * Batched products: small products (or many of them) run one whole
 * product per pool task with thread-local buffers; large ones run one
 * after the other, each split over the pool as above.
 *
 * One A block (M <= MC): every B sliver meets A once, so no panel is
 * shared: the pool's tasks are column ranges, each packs A once and its B
 * slivers into a stack buffer right where it uses them (16 KiB in L1
 * instead of a 1 MiB panel through L3). Same products in the same order.
 *
 * Implicit convolution (tpurt__sgemm_conv, for conv.c): op(B) is the
 * column matrix of a 2-D convolution (or its transpose), gathered from the
 * images by the B packing itself, and the image dimension of A or C is
 * spread over the images' own memory; nothing else changes. Where a
 * sliver's rows are runs of one image row (column stride 1, output rows
 * of whole slivers) the micro-kernel reads them in place instead
 * (read_in_place).
 */
#include <immintrin.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_internal.h"

#define MR_MAX 8 /* rows of an A sliver: 6 (AVX2, portable) or 8 (AVX-512), prod.mr */
#define NR 16

/* Block sizes (elements). KC: depth of a panel; MC: rows of an A block
 * (rounded down to a multiple of MR per product); NC: columns of a B panel (multiple of NR).
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
/* Plain products on the AVX-512 kernels (8-row slivers) take A blocks of
 * 128 rows: Zen 5 (L2 1 MiB), own kernel, 2 threads, 15 paired samples
 * against MC 96 (GFLOP/s ratio, median [quartiles]): 256^3 1.059 [1.045,
 * 1.066], 4096x1024x256 1.060 [0.997, 1.097], 512^3 1.010, 1024^3 1.010,
 * 1024x128x512 1.021, 1024x384x128 1.013, 1024x512x128 0.999, 128x512x1024
 * 0.992, 4096x256x256 0.995 (a 256-row product is two blocks, not 96 + 96
 * + 64). The blocks never change K's chunks: the same bits. */
#define MC_WIDE 128

/* ------------------------------------------------------------ mode */

/* The kernels at the level in force (cpu.c: detected at run time, capped by
 * TORCH_TPU_ISA). */
int tpurt__cpu_has_avx2_fma(void) { return tpurt__cpu_avx2_fma(); }
int tpurt__cpu_has_avx512(void) { return tpurt__cpu_avx512(); }

const char *tpurt__sgemm_kernel_name(void) {
  if (!tpurt__cpu_has_avx2_fma()) return "6x16 portable";
  return tpurt__cpu_has_avx512() ? "8x32 + 8x16 AVX-512" : "6x16 AVX2/FMA";
}

/* TORCH_TPU_SGEMM: "auto" (default: by shape, see tpurt__sgemm_use_own),
 * "own" (always this kernel), "scalar" (this kernel with the portable
 * micro-kernel), "blas" (always the OpenBLAS tiles), "nobuf" (this kernel
 * as when its packing buffers cannot be allocated: tests), "narrow" (this
 * kernel with the AVX2 6 x 16 tiles on an AVX-512 CPU: tests, measurements),
 * "packed" (auto, but a convolution's column matrix is always packed,
 * never read in place from the images: tests, measurements). Read at
 * every product (benchmarks and tests switch it between calls). */
int tpurt__sgemm_mode(void) {
  const char *e = getenv("TORCH_TPU_SGEMM");
  if (!e || !*e) return 0;
  if (!strcmp(e, "own")) return 1;
  if (!strcmp(e, "blas")) return 2;
  if (!strcmp(e, "scalar")) return 3;
  if (!strcmp(e, "nobuf")) return 4;
  if (!strcmp(e, "narrow")) return 5;
  if (!strcmp(e, "packed")) return 6;
  return 0;
}

static blocks read_blocks(int wide) {
  blocks b = g_blocks;
  if (wide) b.mc = MC_WIDE;
  const char *e = getenv("TORCH_TPU_SGEMM_BLOCKS");
  long kc = 0, mc = 0, nc = 0;
  if (e && *e && sscanf(e, "%ld,%ld,%ld", &kc, &mc, &nc) == 3 && kc >= 8 && kc <= KC_MAX && mc >= MR_MAX &&
      nc >= NR) {
    b.kc = kc;
    b.mc = mc;
    b.nc = nc / NR * NR;
  }
  return b;
}

/* ------------------------------------------------------ micro-kernels */

/* c[MR x NR] (leading dimension ldc) = alpha * a.b + beta * c, where a is
 * a packed MR-tall sliver (a[p*MR + i]) and b a packed NR-wide sliver
 * (b[p*NR + j]) of depth k. beta == 0 does not read c. */
/* b: the tile's B rows, bs floats apart (NR when packed) */
typedef void (*ukr_fn)(int64_t k, const float *a, const float *b, int64_t bs, float *c, int64_t ldc, float alpha,
                       float beta);
/* The same with row p of the sliver at b + off[p] (a convolution's images
 * read in place, tpurt__sgemm_conv). */
typedef void (*ukr_off_fn)(int64_t k, const float *a, const float *b, const int32_t *off, float *c, int64_t ldc,
                           float alpha, float beta);
/* ... and with row i of the A sliver at rows[i][pos[p]], B a packed sliver
 * (rows NR apart): the kernels with A read in place (wgrad_in_place). */
typedef void (*ukr_rows_fn)(int64_t k, const float *const *rows, const int32_t *pos, const float *b, float *c,
                            int64_t ldc, float alpha, float beta);

#if defined(__x86_64__) || defined(__i386__)
/* Row lists of a micro-tile: F(V, P, i) for each row i. */
#define ROWS6(F, V, P) F(V, P, 0) F(V, P, 1) F(V, P, 2) F(V, P, 3) F(V, P, 4) F(V, P, 5)
#define ROWS8(F, V, P) ROWS6(F, V, P) F(V, P, 6) F(V, P, 7)

/* The body of an R x 2W micro-tile (R = 6 or 8 rows, row list ROWS) on
 * W-lane registers V (intrinsics prefix P), in 2R accumulators: per k 2
 * loads of B (the tile's left half from b0, its right half from b1, each
 * advancing bs a row), R broadcasts of A, 2R FMAs; then alpha * acc (+
 * beta * C) into the left half's columns at c and the right half's at ch
 * (rows ldc apart for both). */
#define UKR_ZERO(V, P, i) V c##i##0 = P##_setzero_ps(), c##i##1 = P##_setzero_ps();
#define UKR_PREFETCH(V, P, i)                                                                    \
  _mm_prefetch((const char *)(c + (i) * ldc), _MM_HINT_T0);                                      \
  _mm_prefetch((const char *)(ch + (i) * ldc + W - 1), _MM_HINT_T0);
#define UKR_ROW(V, P, i)                                                                         \
  {                                                                                              \
    V ai = P##_set1_ps(a[(i)]);                                                                  \
    c##i##0 = P##_fmadd_ps(ai, x0, c##i##0);                                                     \
    c##i##1 = P##_fmadd_ps(ai, x1, c##i##1);                                                     \
  }
#define UKR_STORE(V, P, i)                                                                       \
  {                                                                                              \
    float *r = c + (i) * ldc, *rh = ch + (i) * ldc;                                              \
    if (beta == 0.0f) {                                                                          \
      P##_storeu_ps(r, P##_mul_ps(va, c##i##0));                                                 \
      P##_storeu_ps(rh, P##_mul_ps(va, c##i##1));                                                \
    } else {                                                                                     \
      P##_storeu_ps(r, P##_fmadd_ps(va, c##i##0, P##_mul_ps(vb, P##_loadu_ps(r))));              \
      P##_storeu_ps(rh, P##_fmadd_ps(va, c##i##1, P##_mul_ps(vb, P##_loadu_ps(rh))));            \
    }                                                                                            \
  }
/* A of row i at depth p read in place: r[i][pos[p]] (a convolution's
 * images, wgrad_in_place) instead of the packed a[i] */
#define UKR_ROW_AT(V, P, i)                                                                      \
  {                                                                                              \
    V ai = P##_set1_ps(r[(i)][o]);                                                               \
    c##i##0 = P##_fmadd_ps(ai, x0, c##i##0);                                                     \
    c##i##1 = P##_fmadd_ps(ai, x1, c##i##1);                                                     \
  }
/* B row p of the two halves at B0, B1, the rows' FMAs ROWF (after PRE),
 * then NEXT. */
#define UKR_BODY_AT(V, P, W, ROWS, ROWF, PRE, B0, B1, NEXT)                                      \
  ROWS(UKR_ZERO, V, P)                                                                           \
  ROWS(UKR_PREFETCH, V, P)                                                                       \
  _Pragma("GCC unroll 4") for (int64_t p = 0; p < k; p++) {                                      \
    PRE;                                                                                         \
    V x0 = P##_loadu_ps(B0), x1 = P##_loadu_ps(B1);                                              \
    ROWS(ROWF, V, P)                                                                             \
    NEXT;                                                                                        \
  }                                                                                              \
  V va = P##_set1_ps(alpha), vb = P##_set1_ps(beta);                                             \
  ROWS(UKR_STORE, V, P)
/* rows bs apart (packed slivers: bs = NR) */
#define UKR_BODY(V, P, W, ROWS, R) UKR_BODY_AT(V, P, W, ROWS, UKR_ROW, (void)0, b0, b1, (a += (R), b0 += bs, b1 += bs))
/* row p at offset off[p] from b0 / b1 (a convolution's images read in
 * place, tpurt__sgemm_conv): the same FMAs on the same values as on the
 * packed sliver, so the same bits */
#define UKR_BODY_OFF(V, P, W, ROWS, R) UKR_BODY_AT(V, P, W, ROWS, UKR_ROW, (void)0, b0 + off[p], b1 + off[p], a += (R))
/* A read in place (UKR_ROW_AT), B packed: the same FMAs on the same values
 * as on the packed A sliver */
#define UKR_BODY_ROWS(V, P, W, ROWS) UKR_BODY_AT(V, P, W, ROWS, UKR_ROW_AT, int32_t o = pos[p], b0, b1, (b0 += bs, b1 += bs))

/* 6 x 16: the sliver's two 8-lane halves. */
__attribute__((target("avx2,fma"))) static void ukr_avx2(int64_t k, const float *restrict a, const float *restrict b,
                                                         int64_t bs, float *restrict c, int64_t ldc, float alpha,
                                                         float beta) {
  const float *b0 = b, *b1 = b + 8;
  float *ch = c + 8;
  enum { W = 8 };
  UKR_BODY(__m256, _mm256, W, ROWS6, 6);
}

/* ukr_avx2 with A read in place. */
__attribute__((target("avx2,fma"))) static void ukr_rows_avx2(int64_t k, const float *const *restrict r,
                                                              const int32_t *restrict pos, const float *restrict b,
                                                              float *restrict c, int64_t ldc, float alpha, float beta) {
  const float *b0 = b, *b1 = b + 8;
  float *ch = c + 8;
  const int64_t bs = NR;
  enum { W = 8 };
  UKR_BODY_ROWS(__m256, _mm256, W, ROWS6);
}

/* ukr_avx2 on a sliver read in place: its halves at b, b + 8. */
__attribute__((target("avx2,fma"))) static void ukr_off_avx2(int64_t k, const float *restrict a, const float *b,
                                                             const int32_t *restrict off, float *restrict c,
                                                             int64_t ldc, float alpha, float beta) {
  const float *b0 = b, *b1 = b + 8;
  float *ch = c + 8;
  enum { W = 8 };
  UKR_BODY_OFF(__m256, _mm256, W, ROWS6, 6);
}

/* Two 16-wide slivers b0, b1 of the packed panel as one 8 x 32 tile
 * (AVX-512), their C columns at c and ch (ch = c + 16 for neighbouring
 * columns; elsewhere when C is spread over images). Every element gets the
 * same FMAs in the same order as in ukr_avx2, and the same final alpha /
 * beta step: the result is bitwise the one of ukr_avx2 calls. */
__attribute__((target("avx512f"))) static void ukr2_avx512(int64_t k, const float *restrict a,
                                                           const float *restrict b0, const float *restrict b1,
                                                           int64_t bs, float *restrict c, float *restrict ch,
                                                           int64_t ldc, float alpha, float beta) {
  enum { W = 16 };
  UKR_BODY(__m512, _mm512, W, ROWS8, 8);
}

/* ukr2_avx512 with A read in place (two packed B slivers b0, b1). */
__attribute__((target("avx512f"))) static void ukr2_rows_avx512(int64_t k, const float *const *restrict r,
                                                                const int32_t *restrict pos, const float *b0,
                                                                const float *b1, float *restrict c,
                                                                float *restrict ch, int64_t ldc, float alpha,
                                                                float beta) {
  const int64_t bs = NR;
  enum { W = 16 };
  UKR_BODY_ROWS(__m512, _mm512, W, ROWS8);
}

/* ukr2_avx512 on two slivers read in place (rows at b0 + off[p], b1 + off[p]). */
__attribute__((target("avx512f"))) static void ukr2_off_avx512(int64_t k, const float *restrict a, const float *b0,
                                                               const float *b1, const int32_t *restrict off,
                                                               float *restrict c, float *restrict ch, int64_t ldc,
                                                               float alpha, float beta) {
  enum { W = 16 };
  UKR_BODY_OFF(__m512, _mm512, W, ROWS8, 8);
}

/* One 16-wide sliver as an 8 x 16 tile in 8 zmm accumulators (AVX-512):
 * per element the FMAs and the final step of ukr_avx2, so the same bits. */
#define UKR1_ZERO(V, P, i) V c##i = P##_setzero_ps();
#define UKR1_PREFETCH(V, P, i) _mm_prefetch((const char *)(c + (i) * ldc), _MM_HINT_T0);
#define UKR1_ROW(V, P, i) c##i = P##_fmadd_ps(P##_set1_ps(a[(i)]), x, c##i);
#define UKR1_STORE(V, P, i)                                                                      \
  {                                                                                              \
    float *r = c + (i) * ldc;                                                                    \
    P##_storeu_ps(r, beta == 0.0f ? P##_mul_ps(va, c##i) : P##_fmadd_ps(va, c##i, P##_mul_ps(vb, P##_loadu_ps(r)))); \
  }
#define UKR1_ROW_AT(V, P, i) c##i = P##_fmadd_ps(P##_set1_ps(r[(i)][o]), x, c##i);
#define UKR1_BODY_AT(ROWF, PRE, B, NEXT)                                                         \
  ROWS8(UKR1_ZERO, __m512, _mm512)                                                               \
  ROWS8(UKR1_PREFETCH, __m512, _mm512)                                                           \
  _Pragma("GCC unroll 4") for (int64_t p = 0; p < k; p++) {                                      \
    PRE;                                                                                         \
    __m512 x = _mm512_loadu_ps(B);                                                               \
    ROWS8(ROWF, __m512, _mm512)                                                                  \
    NEXT;                                                                                        \
  }                                                                                              \
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);                                  \
  ROWS8(UKR1_STORE, __m512, _mm512)
__attribute__((target("avx512f"))) static void ukr1_avx512(int64_t k, const float *restrict a,
                                                           const float *restrict b, int64_t bs, float *restrict c,
                                                           int64_t ldc, float alpha, float beta) {
  UKR1_BODY_AT(UKR1_ROW, (void)0, b, (a += 8, b += bs));
}
/* ukr1_avx512 on a sliver read in place (row p at b + off[p]). */
__attribute__((target("avx512f"))) static void ukr1_off_avx512(int64_t k, const float *restrict a, const float *b,
                                                               const int32_t *restrict off, float *restrict c,
                                                               int64_t ldc, float alpha, float beta) {
  UKR1_BODY_AT(UKR1_ROW, (void)0, b + off[p], a += 8);
}
/* ukr1_avx512 with A read in place (a packed B sliver). */
__attribute__((target("avx512f"))) static void ukr1_rows_avx512(int64_t k, const float *const *restrict r,
                                                                const int32_t *restrict pos, const float *restrict b,
                                                                float *restrict c, int64_t ldc, float alpha,
                                                                float beta) {
  UKR1_BODY_AT(UKR1_ROW_AT, int32_t o = pos[p], b, b += NR);
}
#undef ROWS6
#undef ROWS8
#undef UKR_ZERO
#undef UKR_PREFETCH
#undef UKR_ROW
#undef UKR_STORE
#undef UKR_BODY
#undef UKR_BODY_AT
#undef UKR_BODY_OFF
#undef UKR1_BODY_AT
#undef UKR_ROW_AT
#undef UKR_BODY_ROWS
#undef UKR1_ROW_AT
#undef UKR1_ZERO
#undef UKR1_PREFETCH
#undef UKR1_ROW
#undef UKR1_STORE
#endif

/* 6 x 16, portable. */
static void ukr_scalar(int64_t k, const float *restrict a, const float *restrict b, int64_t bs, float *restrict c,
                       int64_t ldc, float alpha, float beta) {
  enum { R = 6 };
  float acc[R][NR];
  memset(acc, 0, sizeof acc);
  for (int64_t p = 0; p < k; p++) {
    const float *ap = a + p * R, *bp = b + p * bs;
    for (int i = 0; i < R; i++)
      for (int j = 0; j < NR; j++) acc[i][j] += ap[i] * bp[j];
  }
  for (int i = 0; i < R; i++)
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
  int wide;  /* AVX-512: full pairs of B slivers run as one 8 x 32 micro-tile */
  int mr;    /* rows of an A sliver: 8 with the AVX-512 kernels, else 6 */
  int nobuf; /* act as if the packing buffers could not be allocated (tests) */
  /* Implicit convolution (tpurt__sgemm_conv): op(B) is gathered from the
   * images of `cv` (bconv 1: the column matrix, rows (c, r, s), columns
   * (image, oh, ow); 2: its transpose), and a dimension that runs over
   * images is spread: A's columns (a_L > 0) or C's columns (c_L > 0)
   * index (image, o), element at image * a_img / c_img + o. */
  const tpurt_conv_cols *cv;
  int bconv, g32; /* g32: every image offset fits in 32 bits (AVX2 gathers) */
  int64_t a_L, a_img, c_L, c_img;
  /* bconv 1 read in place (read_in_place): element (k, column) of the
   * column matrix at xp + column base + xoff[k], where the column base of
   * image n, output row oh, column ow is n * xp_img + oh * sh * xp_w + ow
   * (the images zero-padded when the convolution pads); slivers are read
   * straight from there, nothing is packed */
  const float *xp;
  const int32_t *xoff;
  int64_t xp_img, xp_w;
  const tpurt__gemm_epi *epi; /* plain products: run on each block of C once final (macro) */
  int64_t bi;                 /* the product's index in its batch, for epi */
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

/* Full A sliver of w = 6 or 8 rows from row pointers (plain A): d[p*w +
 * i] = r[i][p]. With 6 rows, rows 6, 7 of the transpose repeat row 5
 * (their lanes are never kept: each 8-wide store is overwritten by the next
 * one's first 6 lanes, and the buffer has slack for the last). */
__attribute__((target("avx2,fma"))) static void pack_a_rows_avx2(float *restrict d, const float *const rw[],
                                                                 int w, int64_t kc) {
  const float *r[8];
  for (int i = 0; i < 8; i++) r[i] = rw[i < w ? i : w - 1];
  int64_t p = 0;
  for (; p + 8 <= kc; p += 8) {
    __m256 c[8];
    tr8(r, p, c);
    for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (p + q) * w, c[q]);
  }
  for (; p < kc; p++)
    for (int i = 0; i < w; i++) d[p * w + i] = r[i][p];
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

/* w = 6 or 8 contiguous floats (transposed A): fixed-size moves, no
 * library call. */
static inline void copy_a(float *restrict d, const float *restrict s, int w) {
  if (w == 8) {
    memcpy(d, s, 8 * sizeof(float));
  } else {
    float t[6];
    memcpy(t, s, sizeof t);
    memcpy(d, t, sizeof t);
  }
}

/* One w-wide sliver (w = prod.mr for A, NR for B) of depth kc into d
 * (d[p*w + i]), lanes from n on zero. `rows`: lane i is row i of the stored
 * matrix (src + i*ld, read along p), else lane i is column i (src + p*ld +
 * i). */
static inline void pack_sliver(float *restrict d, int w, const float *src, int64_t ld, int rows, int64_t n,
                               int64_t kc, int avx) {
  if (rows) {
    const float *r[NR]; /* NR >= MR_MAX */
    for (int i = 0; i < w; i++) r[i] = src + (i < n ? i : 0) * ld;
    if (n == w) {
#if defined(__x86_64__) || defined(__i386__)
      if (avx) {
        if (w != NR)
          pack_a_rows_avx2(d, r, w, kc);
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
      if (w != NR)
        copy_a(d + p * w, src + p * ld, w);
      else
        memcpy(d + p * NR, src + p * ld, NR * sizeof(float));
    }
  } else {
    for (int64_t p = 0; p < kc; p++)
      for (int i = 0; i < w; i++) d[p * w + i] = i < n ? src[p * ld + i] : 0.0f;
  }
}

/* Element offset of index q of a dimension spread over images of L
 * elements, img apart (prod's a_L / c_L). */
static inline int64_t spread(int64_t q, int64_t L, int64_t img) { return q / L * img + q % L; }
/* C's columns [j, j + n) lie in one image (always when C is not spread). */
static inline int c_one_image(const prod *x, int64_t j, int64_t n) { return !x->c_L || j % x->c_L + n <= x->c_L; }
/* Column j of C's first row. */
static inline float *c_column(const prod *x, int64_t j) { return x->C + (x->c_L ? spread(j, x->c_L, x->c_img) : j); }

/* op(A)[i0:i0+mc, p0:p0+kc] -> dst, mr-tall slivers, rows past mc zero.
 * A spread over images (a_L > 0, plain A) is packed one image's run of
 * columns at a time (in increasing order: pack_a_rows_avx2's spill into
 * the next run is overwritten by it). */
static void pack_a(float *restrict dst, const prod *x, int64_t i0, int64_t mc, int64_t p0, int64_t kc) {
  const int mr = x->mr;
  for (int64_t s = 0; s < mc; s += mr) {
    int64_t m = mc - s < mr ? mc - s : mr, i = i0 + s;
    if (x->a_L) {
      for (int64_t q = p0; q < p0 + kc;) {
        int64_t o = q % x->a_L, len = x->a_L - o < p0 + kc - q ? x->a_L - o : p0 + kc - q;
        pack_sliver(dst + s * kc + (q - p0) * mr, mr, x->A + spread(q, x->a_L, x->a_img) + i * x->lda, x->lda, 1,
                    m, len, x->avx);
        q += len;
      }
      continue;
    }
    const float *src = x->ta ? x->A + p0 * x->lda + i : x->A + i * x->lda + p0;
    pack_sliver(dst + s * kc, mr, src, x->lda, !x->ta, m, kc, x->avx);
  }
}

/* ------------------------------------------- implicit convolution: B */

/* Lane sentinel: a row (or tap) offset that puts every lane past the
 * operand's width out of range, whatever tap or position is added. */
#define OUT_LANE (-(1 << 30))

#if defined(__x86_64__) || defined(__i386__)
/* d[0..15] = lane valid ? x[index] : 0 (lanes 0-7 in the *0 vectors, 8-15
 * in *1), valid when 0 <= h < H and 0 <= w < W; invalid lanes are not read. */
__attribute__((target("avx2,fma"))) static inline void gather16(float *d, const float *x, __m256i h0, __m256i h1,
                                                                __m256i w0, __m256i w1, __m256i i0, __m256i i1,
                                                                __m256i vH, __m256i vW) {
  const __m256i m1 = _mm256_set1_epi32(-1);
  __m256i k0 = _mm256_and_si256(_mm256_and_si256(_mm256_cmpgt_epi32(h0, m1), _mm256_cmpgt_epi32(vH, h0)),
                                _mm256_and_si256(_mm256_cmpgt_epi32(w0, m1), _mm256_cmpgt_epi32(vW, w0)));
  __m256i k1 = _mm256_and_si256(_mm256_and_si256(_mm256_cmpgt_epi32(h1, m1), _mm256_cmpgt_epi32(vH, h1)),
                                _mm256_and_si256(_mm256_cmpgt_epi32(w1, m1), _mm256_cmpgt_epi32(vW, w1)));
  _mm256_storeu_ps(d, _mm256_mask_i32gather_ps(_mm256_setzero_ps(), x, i0, _mm256_castsi256_ps(k0), 4));
  _mm256_storeu_ps(d + 8, _mm256_mask_i32gather_ps(_mm256_setzero_ps(), x, i1, _mm256_castsi256_ps(k1), 4));
}

/* d[p*NR + q] = lane q valid ? x[off[q] + roff_p] : 0, valid when
 * 0 <= hb[q] + rh_p < H and 0 <= wb[q] + sd_p < W; rows advance over the
 * taps (c, r, s) of the column matrix (hb, wb, off per column). */
__attribute__((target("avx2,fma"))) static void gather_cols_avx2(float *restrict d, const tpurt_conv_cols *g,
                                                                 const int32_t *hb, const int32_t *wb,
                                                                 const int32_t *off, int64_t k0, int64_t kc) {
  int64_t kk = g->kh * g->kw, ci = k0 / kk, r = k0 % kk / g->kw, s = k0 % g->kw;
  __m256i h0 = _mm256_loadu_si256((const __m256i *)hb), h1 = _mm256_loadu_si256((const __m256i *)(hb + 8));
  __m256i w0 = _mm256_loadu_si256((const __m256i *)wb), w1 = _mm256_loadu_si256((const __m256i *)(wb + 8));
  __m256i o0 = _mm256_loadu_si256((const __m256i *)off), o1 = _mm256_loadu_si256((const __m256i *)(off + 8));
  __m256i vH = _mm256_set1_epi32((int)g->H), vW = _mm256_set1_epi32((int)g->W);
  for (int64_t p = 0; p < kc; p++) {
    __m256i rh = _mm256_set1_epi32((int)(r * g->dh)), sd = _mm256_set1_epi32((int)(s * g->dw));
    __m256i ro = _mm256_set1_epi32((int)(ci * g->H * g->W + r * g->dh * g->W + s * g->dw));
    __m256i a0 = _mm256_add_epi32(h0, rh), a1 = _mm256_add_epi32(h1, rh);
    __m256i b0 = _mm256_add_epi32(w0, sd), b1 = _mm256_add_epi32(w1, sd);
    gather16(d + p * NR, g->x, a0, a1, b0, b1, _mm256_add_epi32(o0, ro), _mm256_add_epi32(o1, ro), vH, vW);
    if (++s == g->kw) {
      s = 0;
      if (++r == g->kh) r = 0, ci++;
    }
  }
}

/* Transposed column matrix: d[p*NR + q] = lane q valid ? x[base_p +
 * koff[q]] : 0, valid when 0 <= hb_p + rh[q] < H and 0 <= wb_p + sd[q] <
 * W; rows advance over the positions (image, oh, ow). */
__attribute__((target("avx2,fma"))) static void gather_cols_t_avx2(float *restrict d, const tpurt_conv_cols *g,
                                                                   const int32_t *rh, const int32_t *sd,
                                                                   const int32_t *koff, int64_t q0, int64_t kc) {
  int64_t L = g->Ho * g->Wo, im = q0 / L, oh = q0 % L / g->Wo, ow = q0 % g->Wo;
  __m256i r0 = _mm256_loadu_si256((const __m256i *)rh), r1 = _mm256_loadu_si256((const __m256i *)(rh + 8));
  __m256i s0 = _mm256_loadu_si256((const __m256i *)sd), s1 = _mm256_loadu_si256((const __m256i *)(sd + 8));
  __m256i o0 = _mm256_loadu_si256((const __m256i *)koff), o1 = _mm256_loadu_si256((const __m256i *)(koff + 8));
  __m256i vH = _mm256_set1_epi32((int)g->H), vW = _mm256_set1_epi32((int)g->W);
  for (int64_t p = 0; p < kc; p++) {
    int64_t hb = oh * g->sh - g->ph, wb = ow * g->sw - g->pw;
    __m256i vh = _mm256_set1_epi32((int)hb), vw = _mm256_set1_epi32((int)wb);
    __m256i base = _mm256_set1_epi32((int)(im * g->img + hb * g->W + wb));
    __m256i a0 = _mm256_add_epi32(r0, vh), a1 = _mm256_add_epi32(r1, vh);
    __m256i b0 = _mm256_add_epi32(s0, vw), b1 = _mm256_add_epi32(s1, vw);
    gather16(d + p * NR, g->x, a0, a1, b0, b1, _mm256_add_epi32(o0, base), _mm256_add_epi32(o1, base), vH, vW);
    if (++ow == g->Wo) {
      ow = 0;
      if (++oh == g->Ho) oh = 0, im++;
    }
  }
}
#endif

#if defined(__x86_64__) || defined(__i386__)
/* Elements 0, 2, .., 14 of the 16 in a (0-7) and b (8-15): a stride-2 run. */
__attribute__((target("avx2,fma"))) static inline __m256 evens(__m256 a, __m256 b) {
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
}

/* 8 input elements from column w on (src points at column w), masked to
 * [0, W) (masked lanes are not read); stride 2 keeps the even ones of 16. */
__attribute__((target("avx2,fma"))) static inline __m256 load8_in(const float *src, int64_t w, int64_t W) {
  if (w >= 0 && w + 8 <= W) return _mm256_loadu_ps(src);
  __m256i c = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)w));
  __m256i m = _mm256_and_si256(_mm256_cmpgt_epi32(c, _mm256_set1_epi32(-1)),
                               _mm256_cmpgt_epi32(_mm256_set1_epi32((int)W), c));
  return _mm256_maskload_ps(src, m);
}

__attribute__((target("avx2,fma"))) static inline __m256 load8_s2_in(const float *src, int64_t w, int64_t W) {
  return evens(load8_in(src, w, W), load8_in(src + 8, w + 8, W));
}

/* Transposed column sliver over positions in runs of 8 along output rows
 * (Wo and the row range multiples of 8) at stride 1 or 2: for each run
 * and tap lane, the 8 input elements are one (masked) load; two 8 x 8
 * transposes turn the 16 lane vectors into 8 rows. */
__attribute__((target("avx2,fma"))) static void cols_t_runs_avx2(float *restrict d, const tpurt_conv_cols *g,
                                                                 const int64_t *rh, const int64_t *sd,
                                                                 const int64_t *koff, int64_t q0, int64_t kc) {
  int64_t L = g->Ho * g->Wo, im = q0 / L, oh = q0 % L / g->Wo, ow = q0 % g->Wo, W = g->W;
  int two = g->sw == 2;
  _Alignas(32) float v[NR][8];
  for (int64_t p = 0; p < kc; p += 8) {
    int64_t hb = oh * g->sh - g->ph, wb = ow * g->sw - g->pw;
    const float *base = g->x + im * g->img + hb * W + wb;
    for (int l = 0; l < NR; l++) {
      int64_t h = hb + rh[l], w = wb + sd[l];
      __m256 e = _mm256_setzero_ps();
      if ((uint64_t)h < (uint64_t)g->H) e = two ? load8_s2_in(base + koff[l], w, W) : load8_in(base + koff[l], w, W);
      _mm256_store_ps(v[l], e);
    }
    const float *r0[8] = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
    const float *r1[8] = {v[8], v[9], v[10], v[11], v[12], v[13], v[14], v[15]};
    __m256 c[8];
    tr8(r0, 0, c);
    for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (p + q) * NR, c[q]);
    tr8(r1, 0, c);
    for (int q = 0; q < 8; q++) _mm256_storeu_ps(d + (p + q) * NR + 8, c[q]);
    if ((ow += 8) == g->Wo) {
      ow = 0;
      if (++oh == g->Ho) oh = 0, im++;
    }
  }
}

/* Tap table of a sliver whose lanes fall in runs of `seg` (8 or 4)
 * lanes, each in one output row, at input stride 1 or 2: for tap t and
 * run i, the input offset of the run's first element (before the
 * channel) and the masks of the input elements it reads (seg elements at
 * stride 1, 2 * seg at stride 2: lanes in the padding or past the
 * matrix are masked, and masked lanes are not read). */
#define RUN_TAPS 49
typedef struct {
  int64_t off[RUN_TAPS][NR / 4];
  int32_t mask[RUN_TAPS][2 * NR];
} run_table;

/* Every row of the sliver, tap by tap (the tap's masks and offsets in
 * registers), then channel by channel (rows kk apart): one masked load
 * per run (two and an even-element shuffle at stride 2). Inlined with
 * constant seg and stride. */
__attribute__((target("avx2,fma"), always_inline)) static inline void copy_runs(float *restrict d, const float *x,
                                                                               const run_table *t, int64_t kk,
                                                                               int64_t HW, int seg, int two,
                                                                               int64_t k0, int64_t kc) {
  int64_t c_lo = k0 / kk, c_hi = (k0 + kc - 1) / kk;
  for (int64_t tap = 0; tap < kk; tap++) {
    int64_t ca = c_lo + (c_lo * kk + tap < k0), cb = c_hi - (c_hi * kk + tap >= k0 + kc);
    if (ca > cb) continue;
    const int64_t *off = t->off[tap];
    const int32_t *m = t->mask[tap];
    const float *xc = x + ca * HW;
    float *dd = d + (ca * kk + tap - k0) * NR;
    if (seg == 8 && !two) {
      __m256i m0 = _mm256_loadu_si256((const __m256i *)m), m1 = _mm256_loadu_si256((const __m256i *)(m + 8));
      for (int64_t ci = ca; ci <= cb; ci++, xc += HW, dd += kk * NR) {
        _mm256_storeu_ps(dd, _mm256_maskload_ps(xc + off[0], m0));
        _mm256_storeu_ps(dd + 8, _mm256_maskload_ps(xc + off[1], m1));
      }
    } else if (seg == 8) {
      __m256i m0 = _mm256_loadu_si256((const __m256i *)m), m1 = _mm256_loadu_si256((const __m256i *)(m + 8));
      __m256i m2 = _mm256_loadu_si256((const __m256i *)(m + 16)), m3 = _mm256_loadu_si256((const __m256i *)(m + 24));
      for (int64_t ci = ca; ci <= cb; ci++, xc += HW, dd += kk * NR) {
        __m256 a0 = _mm256_maskload_ps(xc + off[0], m0), b0 = _mm256_maskload_ps(xc + off[0] + 8, m1);
        __m256 a1 = _mm256_maskload_ps(xc + off[1], m2), b1 = _mm256_maskload_ps(xc + off[1] + 8, m3);
        _mm256_storeu_ps(dd, evens(a0, b0));
        _mm256_storeu_ps(dd + 8, evens(a1, b1));
      }
    } else if (!two) {
      __m128i q[4];
      for (int i = 0; i < 4; i++) q[i] = _mm_loadu_si128((const __m128i *)(m + 4 * i));
      for (int64_t ci = ca; ci <= cb; ci++, xc += HW, dd += kk * NR)
        for (int i = 0; i < 4; i++) _mm_storeu_ps(dd + 4 * i, _mm_maskload_ps(xc + off[i], q[i]));
    } else {
      __m256i q[4];
      for (int i = 0; i < 4; i++) q[i] = _mm256_loadu_si256((const __m256i *)(m + 8 * i));
      for (int64_t ci = ca; ci <= cb; ci++, xc += HW, dd += kk * NR)
        for (int i = 0; i < 4; i++) {
          __m256 a = _mm256_maskload_ps(xc + off[i], q[i]);
          _mm_storeu_ps(dd + 4 * i, _mm256_castps256_ps128(evens(a, a)));
        }
    }
  }
}

__attribute__((target("avx2,fma"))) static void copy_runs_avx2(float *restrict d, const float *x, const run_table *t,
                                                               int64_t kk, int64_t HW, int seg, int two, int64_t k0,
                                                               int64_t kc) {
  if (seg == 8 && !two)
    copy_runs(d, x, t, kk, HW, 8, 0, k0, kc);
  else if (seg == 8)
    copy_runs(d, x, t, kk, HW, 8, 1, k0, kc);
  else if (!two)
    copy_runs(d, x, t, kk, HW, 4, 0, k0, kc);
  else
    copy_runs(d, x, t, kk, HW, 4, 1, k0, kc);
}
#endif

/* One sliver of the column matrix: columns j..j+n-1 (positions (image,
 * oh, ow)), rows k0..k0+kc-1 (taps (c, r, s)). At stride 1 or 2, when
 * the sixteen positions are runs of 8 (or 4) in single output rows, every
 * tap reads each run as consecutive (or every other) input elements
 * (lanes in the padding zero); other slivers gather. */
static void pack_b_cols(float *restrict d, const prod *x, int64_t j, int64_t n, int64_t k0, int64_t kc) {
  const tpurt_conv_cols *g = x->cv;
  int64_t L = g->Ho * g->Wo, kk = g->kh * g->kw, HW = g->H * g->W;
#if defined(__x86_64__) || defined(__i386__)
  for (int seg = 8; x->avx && (g->sw == 1 || g->sw == 2) && kk <= RUN_TAPS && seg >= 4; seg -= 4) {
    int64_t shb[NR / 4], swb[NR / 4], soff[NR / 4];
    int ok = 1, nrun = NR / seg, two = g->sw == 2;
    for (int i = 0; i < nrun && ok; i++) {
      int64_t c0 = j + i * seg, o = c0 % L, ow = o % g->Wo;
      shb[i] = OUT_LANE, swb[i] = 0, soff[i] = 0;
      if (i * seg >= n) continue; /* past the matrix: zero */
      ok = i * seg + seg <= n && ow + seg <= g->Wo;
      shb[i] = o / g->Wo * g->sh - g->ph;
      swb[i] = ow * g->sw - g->pw;
      soff[i] = c0 / L * g->img + shb[i] * g->W + swb[i];
    }
    if (!ok) continue;
    run_table t;
    int e = seg << two; /* input elements a run reads */
    for (int64_t tap = 0; tap < kk; tap++) {
      int64_t rh = tap / g->kw * g->dh, sd = tap % g->kw * g->dw;
      for (int i = 0; i < nrun; i++) {
        int64_t h = shb[i] + rh, w = swb[i] + sd;
        int hin = (uint64_t)h < (uint64_t)g->H;
        t.off[tap][i] = soff[i] + rh * g->W + sd;
        for (int q = 0; q < e; q++)
          t.mask[tap][i * e + q] = hin && (uint64_t)(w + q) < (uint64_t)g->W ? -1 : 0;
      }
    }
    copy_runs_avx2(d, g->x, &t, kk, HW, seg, two, k0, kc);
    return;
  }
#endif
  int64_t hb[NR], wb[NR], im[NR];
  for (int q = 0; q < NR; q++) {
    int64_t col = j + (q < n ? q : 0), o = col % L;
    im[q] = col / L;
    hb[q] = q < n ? o / g->Wo * g->sh - g->ph : OUT_LANE;
    wb[q] = o % g->Wo * g->sw - g->pw;
  }
  int run = n == NR && g->sw == 1 && im[0] == im[NR - 1] && hb[0] == hb[NR - 1];
#if defined(__x86_64__) || defined(__i386__)
  if (!run && x->avx && x->g32) {
    int32_t h32[NR], w32[NR], o32[NR];
    for (int q = 0; q < NR; q++) {
      h32[q] = (int32_t)hb[q];
      w32[q] = (int32_t)wb[q];
      o32[q] = (int32_t)(im[q] * g->img + (q < n ? hb[q] * g->W : 0) + wb[q]);
    }
    gather_cols_avx2(d, g, h32, w32, o32, k0, kc);
    return;
  }
#endif
  int64_t ci = k0 / kk, r = k0 % kk / g->kw, s = k0 % g->kw;
  for (int64_t p = 0; p < kc; p++) {
    float *dd = d + p * NR;
    const float *plane = g->x + im[0] * g->img + ci * HW;
    if (run) {
      int64_t h = hb[0] + r * g->dh, w0 = wb[0] + s * g->dw;
      if ((uint64_t)h >= (uint64_t)g->H) {
        memset(dd, 0, NR * sizeof(float));
      } else if (w0 >= 0 && w0 + NR <= g->W) {
        memcpy(dd, plane + h * g->W + w0, NR * sizeof(float));
      } else {
        for (int q = 0; q < NR; q++)
          dd[q] = (uint64_t)(w0 + q) < (uint64_t)g->W ? plane[h * g->W + w0 + q] : 0.0f;
      }
    } else {
      for (int q = 0; q < NR; q++) {
        int64_t h = hb[q] + r * g->dh, w = wb[q] + s * g->dw;
        dd[q] = (uint64_t)h < (uint64_t)g->H && (uint64_t)w < (uint64_t)g->W
                    ? g->x[im[q] * g->img + ci * HW + h * g->W + w]
                    : 0.0f;
      }
    }
    if (++s == g->kw) {
      s = 0;
      if (++r == g->kh) r = 0, ci++;
    }
  }
}

/* One sliver of the transposed column matrix: columns j..j+n-1 (taps
 * (c, r, s)), rows q0..q0+kc-1 (positions (image, oh, ow)). Positions in
 * runs of 8 along output rows at stride 1 or 2 are loaded per tap and
 * transposed; other slivers gather. */
static void pack_b_cols_t(float *restrict d, const prod *x, int64_t j, int64_t n, int64_t q0, int64_t kc) {
  const tpurt_conv_cols *g = x->cv;
  int64_t L = g->Ho * g->Wo, kk = g->kh * g->kw, HW = g->H * g->W;
  int64_t rh[NR], sd[NR], koff[NR];
  for (int q = 0; q < NR; q++) {
    int64_t k = j + (q < n ? q : 0), ci = k / kk, r = k % kk / g->kw, s = k % g->kw;
    rh[q] = q < n ? r * g->dh : OUT_LANE;
    sd[q] = s * g->dw;
    koff[q] = ci * HW + r * g->dh * g->W + s * g->dw;
  }
#if defined(__x86_64__) || defined(__i386__)
  if (x->avx && (g->sw == 1 || g->sw == 2) && g->Wo % 8 == 0 && q0 % 8 == 0 && kc % 8 == 0) {
    cols_t_runs_avx2(d, g, rh, sd, koff, q0, kc);
    return;
  }
  if (x->avx && x->g32) {
    int32_t r32[NR], s32[NR], o32[NR];
    for (int q = 0; q < NR; q++) r32[q] = (int32_t)rh[q], s32[q] = (int32_t)sd[q], o32[q] = (int32_t)koff[q];
    gather_cols_t_avx2(d, g, r32, s32, o32, q0, kc);
    return;
  }
#endif
  int64_t im = q0 / L, oh = q0 % L / g->Wo, ow = q0 % g->Wo;
  for (int64_t p = 0; p < kc; p++) {
    int64_t hb = oh * g->sh - g->ph, wb = ow * g->sw - g->pw, base = im * g->img + hb * g->W + wb;
    for (int q = 0; q < NR; q++) {
      int64_t h = hb + rh[q], w = wb + sd[q];
      d[p * NR + q] = (uint64_t)h < (uint64_t)g->H && (uint64_t)w < (uint64_t)g->W ? g->x[base + koff[q]] : 0.0f;
    }
    if (++ow == g->Wo) {
      ow = 0;
      if (++oh == g->Ho) oh = 0, im++;
    }
  }
}

/* Slivers [t0, t1) of op(B)[p0:p0+kc, j0:j0+nc] -> dst (sliver t at
 * dst + (t - t0)*kc*NR), columns past nc zero. */
static void pack_b(float *restrict dst, const prod *x, int64_t j0, int64_t nc, int64_t p0, int64_t kc, int64_t t0,
                   int64_t t1) {
  for (int64_t t = t0; t < t1; t++) {
    int64_t s = t * NR, n = nc - s < NR ? nc - s : NR, j = j0 + s;
    float *d = dst + (t - t0) * kc * NR;
    if (x->bconv == 1) {
      pack_b_cols(d, x, j, n, p0, kc);
      continue;
    }
    if (x->bconv == 2) {
      pack_b_cols_t(d, x, j, n, p0, kc);
      continue;
    }
    const float *src = x->tb ? x->B + j * x->ldb + p0 : x->B + p0 * x->ldb + j;
    pack_sliver(d, NR, src, x->ldb, x->tb, n, kc, x->avx);
  }
}

/* ------------------------------------------------------------ buffers */

/* Grow-only thread-local buffers: the B panel of the thread that drives
 * a product (read by every pool thread), the A block of each thread. */
static _Thread_local struct {
  float *p;
  size_t n;
} t_buf[6]; /* 0 B panel, 1 A block, 2 padded images, 3 their row offsets, 4 position offsets, 5 dw^T */

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
  ukr_off_fn ukr_off; /* x->xp: the kernel of ukr on slivers read in place */
  const float *bp; /* packed panel */
  int64_t j0, nc, p0, kc, mc;
  float beta; /* beta of this K chunk */
  int64_t mu, ns, nsl; /* row slivers of M, column parts, slivers per panel */
  int cols;            /* tasks are column parts over all rows (B slivers packed where used) */
  int bdirect;         /* full B slivers are read in place (no panel) */
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

/* The first element of the sliver at column j of a column matrix read in
 * place (x->xp; its 16 columns lie in one output row). */
static inline const float *xp_sliver(const prod *x, int64_t j) {
  const tpurt_conv_cols *g = x->cv;
  int64_t L = g->Ho * g->Wo, o = j % L;
  return x->xp + j / L * x->xp_img + o / g->Wo * g->sh * x->xp_w + o % g->Wo;
}

/* One micro-tile on the sliver b: rows bs apart, or read in place
 * (x->xp: row p at b + xoff[p0 + p]). */
static inline void tile(const panel_job *j, int64_t kc, const float *a, const float *b, int64_t bs, float *c,
                        int64_t ldc, float alpha, float beta) {
  if (j->x->xp)
    j->ukr_off(kc, a, b, j->x->xoff + j->p0, c, ldc, alpha, beta);
  else
    j->ukr(kc, a, b, bs, c, ldc, alpha, beta);
}

/* Rows [r0, r1) (multiples of mr, r1 may pass M) times slivers [s0, s1)
 * of the packed panel. */
static void macro(const panel_job *j, int64_t r0, int64_t r1, int64_t s0, int64_t s1) {
  const prod *x = j->x;
  int64_t kc = j->kc, mc_max = j->mc;
  /* + slack for pack_a_rows_avx2's last store */
  float *ap = x->nobuf ? NULL : buf(1, (size_t)mc_max * kc + 8);
  const int64_t mr = x->mr;
  _Alignas(64) float tmp[MR_MAX * NR];
  /* Without buffers (host memory exhausted) each sliver is packed on the
   * stack where it is used: slower, the same products in the same order. */
  _Alignas(64) float a1[MR_MAX * KC_MAX + 8], b1[2 * KC_MAX * NR]; /* b1: up to two slivers */
  for (int64_t ic = r0; ic < r1; ic += mc_max) {
    int64_t mc = r1 - ic < mc_max ? r1 - ic : mc_max;
    if (ic + mc > x->M) mc = x->M - ic;
    if (mc <= 0) break;
    if (ap) pack_a(ap, x, ic, mc, j->p0, kc);
    for (int64_t t = s0; t < s1; t++) {
      int64_t s_from = 0, jt = j->j0 + t * NR;
      /* two full slivers side by side, each with its C columns in one
       * image, run their full row slivers as 8 x 32 tiles (AVX-512), a
       * partial one below */
      int pair = x->wide && ap && t + 1 < s1 && jt + 2 * NR <= j->j0 + j->nc &&
                 c_one_image(x, jt, NR) && c_one_image(x, jt + NR, NR);
      int64_t t_end = t + 1 + pair;
      /* sliver u at bt + (u - t) * step, its rows bs apart: packed (panel
       * or stack: step kc * NR, bs NR) or, for full slivers of a plain B
       * (bdirect), read in place (step NR, bs ldb) */
      const float *bt;
      int64_t step = kc * NR, bs = NR;
      const float *xt[2] = {NULL, NULL}; /* slivers t, t + 1 read in place (x->xp) */
      if (x->xp) {
        xt[0] = xp_sliver(x, jt);
        if (pair) xt[1] = xp_sliver(x, jt + NR);
        bt = NULL;
      } else if (j->bdirect && jt + (t_end - t) * NR <= j->j0 + j->nc) {
        bt = x->B + j->p0 * x->ldb + jt;
        step = NR;
        bs = x->ldb;
      } else if (j->bp) {
        bt = j->bp + t * kc * NR;
      } else {
        pack_b(b1, x, j->j0, j->nc, j->p0, kc, t, t_end);
        bt = b1;
      }
#if defined(__x86_64__) || defined(__i386__)
      if (pair) {
        float *cb = c_column(x, jt), *cbh = c_column(x, jt + NR);
        for (; s_from + mr <= mc; s_from += mr)
          if (x->xp)
            ukr2_off_avx512(kc, ap + s_from * kc, xt[0], xt[1], x->xoff + j->p0, cb + (ic + s_from) * x->ldc,
                            cbh + (ic + s_from) * x->ldc, x->ldc, x->alpha, j->beta);
          else
            ukr2_avx512(kc, ap + s_from * kc, bt, bt + step, bs, cb + (ic + s_from) * x->ldc,
                        cbh + (ic + s_from) * x->ldc, x->ldc, x->alpha, j->beta);
      }
#endif
      for (int64_t u = t; u < t_end; u++) {
        const float *bu = x->xp ? xt[u - t] : bt + (u - t) * step;
        int64_t jj = j->j0 + u * NR, n = j->j0 + j->nc - jj < NR ? j->j0 + j->nc - jj : NR;
        /* C spread over images: the tile's columns in one image are one
         * block of C; a tile across images is written column by column */
        int one_img = c_one_image(x, jj, n);
        float *cb = c_column(x, jj);
        for (int64_t s = s_from; s < mc; s += mr) {
          int64_t m = mc - s < mr ? mc - s : mr;
          float *c = cb + (ic + s) * x->ldc;
          const float *as = ap ? ap + s * kc : a1;
          if (!ap) pack_a(a1, x, ic + s, m, j->p0, kc);
          if (m == mr && n == NR && one_img) {
            tile(j, kc, as, bu, bs, c, x->ldc, x->alpha, j->beta);
          } else {
            tile(j, kc, as, bu, bs, tmp, NR, 1.0f, 0.0f);
            for (int64_t q = 0; q < n; q++) {
              float *cq = one_img ? c + q : x->C + spread(jj + q, x->c_L, x->c_img) + (ic + s) * x->ldc;
              /* the full tiles' final step, rounded the same way (one
               * product, or one fused alpha * acc + (beta * C)): an
               * element's bits do not depend on whether its tile is full,
               * so not on the tile shape */
              for (int64_t i = 0; i < m; i++) {
                float t = tmp[i * NR + q], *e = cq + i * x->ldc;
                *e = j->beta == 0.0f ? x->alpha * t : __builtin_fmaf(x->alpha, t, j->beta * *e);
              }
            }
          }
        }
      }
      t = t_end - 1;
    }
    /* the block's last K chunk: its C rows are final over these columns */
    if (x->epi && j->p0 + kc == x->K) {
      int64_t c1 = j->j0 + s1 * NR < j->j0 + j->nc ? j->j0 + s1 * NR : j->j0 + j->nc;
      x->epi->fn(x->epi->ctx, x->bi, ic, ic + mc, j->j0 + s0 * NR, c1);
    }
  }
}

static void panel_tasks(void *p, int64_t b, int64_t e) {
  panel_job *j = p;
  if (j->cols) {
    /* column parts [b, e) over every K chunk in order: each chunk's
     * products are added to C as in a region per chunk (the same bits),
     * without a pool handoff per chunk, and the parts' C columns stay in
     * this thread's cache from one chunk to the next */
    panel_job c = *j;
    for (int64_t p0 = 0; p0 < j->x->K; p0 += j->kc) {
      c.p0 = p0;
      c.kc = j->x->K - p0 < j->kc ? j->x->K - p0 : j->kc;
      c.beta = p0 == 0 ? j->x->beta : 1.0f;
      macro(&c, 0, j->mu * j->x->mr, j->nsl * b / j->ns, j->nsl * e / j->ns);
    }
    return;
  }
  pack_panel(j);
  /* task t: column part t / mu, row sliver t % mu; a chunk is cut where
   * the column part changes */
  while (b < e) {
    int64_t part = b / j->mu, r = b % j->mu;
    int64_t end = (part + 1) * j->mu < e ? (part + 1) * j->mu : e;
    int64_t s0 = j->nsl * part / j->ns, s1 = j->nsl * (part + 1) / j->ns;
    macro(j, r * j->x->mr, (end - part * j->mu) * j->x->mr, s0, s1);
    b = end;
  }
}

/* Minimum multiply-adds of one pool chunk. */
#define CHUNK_MACS ((int64_t)1 << 18)

/* One product; parallel over the pool when `par` (else on this thread). */
static void run_product(const prod *x, ukr_fn ukr, blocks bl, int par) {
  int64_t nth = par ? tpurt_num_threads() : 1;
  int64_t KC = bl.kc, NC = bl.nc, mr = x->mr;
  bl.mc = bl.mc < mr ? mr : bl.mc / mr * mr;
  /* K in chunks of even depth (rounded up to 8) instead of KC-deep chunks
   * and a remainder: a thin last chunk reads and writes all of C and packs
   * A and B again for few multiply-adds (K 288, a 32-channel 3x3
   * convolution, was 256 + 32; now 144 + 144). Paired in-process samples
   * (tpurt_bench_ab, own kernel, 2 threads), new / old: 32x16384x288 1.06
   * and 1.08, 64x4096x576 1.05, 128x1024x1152 1.04, K 352 / 384 1.00 +-
   * 0.02. The chunk boundaries still depend on K alone. */
  int64_t nk = (x->K + KC - 1) / KC;
  KC = ((x->K + nk - 1) / nk + 7) / 8 * 8;
  ukr_off_fn uoff = NULL;
#if defined(__x86_64__) || defined(__i386__)
  if (x->xp) uoff = x->wide ? ukr1_off_avx512 : ukr_off_avx2;
#endif
  /* One A block (M <= MC): every B sliver meets A once, so no panel is
   * shared; each task packs its own slivers where it uses them (a 16 KiB
   * sliver in L1 instead of a panel in L3) and runs the K chunks of its
   * columns one after the other. All of N and K in one pool region: a
   * weight gradient (K = 16384 positions) was 64 regions of ~25 us and a
   * 32-channel convolution 32, each ending in a wait for the slower
   * thread. */
  int cols = x->M <= bl.mc && x->N >= 2 * x->M * nth;
  if (cols) NC = (x->N + NR - 1) / NR * NR;
  for (int64_t j0 = 0; j0 < x->N; j0 += NC) {
    int64_t nc = x->N - j0 < NC ? x->N - j0 : NC;
    int64_t nsl = (nc + NR - 1) / NR;
    for (int64_t p0 = 0; p0 < x->K; p0 += KC) {
      int64_t kc = x->K - p0 < KC ? x->K - p0 : KC;
      /* Few rows (M <= 2 MC): each B element serves at most 2 MC rows, and
       * copying B into a panel cost up to a fifth of the product (weight
       * gradients: M = features, K = tokens); a plain B is read in place,
       * its full slivers row by row (the same values, so the same bits). */
      int bdirect = !x->bconv && !x->tb && !x->nobuf && x->M <= 2 * bl.mc;
      float *bp = x->nobuf || cols || bdirect || x->xp ? NULL : buf(0, (size_t)nsl * NR * kc);
      panel_job j = {x, ukr, uoff, bp, j0, nc, p0, kc, bl.mc, p0 == 0 ? x->beta : 1.0f, (x->M + mr - 1) / mr, 1, nsl, cols,
                     bdirect, 0, 0};
      if (cols) { /* all chunks from p0 = 0 (kc: the chunk depth) */
        /* column parts of >= CHUNK_MACS, at most 4 per thread, and wide
         * enough that packing A (M x kc) for each costs at most half of
         * packing its B slivers (the condition above: >= 1 part per thread) */
        int64_t sl_macs = j.mu * mr * x->K * NR, per = CHUNK_MACS / sl_macs + 1;
        if (per < (2 * x->M + NR - 1) / NR) per = (2 * x->M + NR - 1) / NR;
        int64_t ns = nsl / per > 1 ? nsl / per : 1;
        /* a multiple of the threads when there are more parts than threads
         * (5 parts on 2 threads left one idle for a fifth of the product) */
        j.ns = ns < 4 * nth ? (ns > nth ? ns / nth * nth : ns) : 4 * nth;
        if (nth > 1 && j.ns > 1)
          tpurt_parallel_for(j.ns, 1, panel_tasks, &j);
        else
          panel_tasks(&j, 0, j.ns);
        break;
      }
      /* few row slivers: split the panel's columns too */
      if (nth > 1 && j.mu < 4 * nth) {
        int64_t ns = (4 * nth + j.mu - 1) / j.mu;
        j.ns = ns < nsl ? ns : nsl;
      }
      int64_t task_macs = mr * kc * (nc / j.ns + 1);
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
    x.bi = i;
    x.A += i * bj->sa;
    x.B += i * bj->sb;
    x.C += i * bj->sc;
    run_product(&x, bj->ukr, bj->bl, 0);
  }
}

/* The micro-kernel for `flags` (1: portable) and the product settings it
 * implies: x->avx (AVX2 packing too), x->wide (AVX-512: 8 x 32 tiles of
 * sliver pairs, unless TORCH_TPU_SGEMM=narrow) and x->mr (A sliver rows:
 * 8 for the AVX-512 kernels, 6 for the others). */
static ukr_fn pick_ukr(int flags, prod *x) {
  x->avx = !(flags & 1) && tpurt__cpu_has_avx2_fma();
  x->wide = x->avx && tpurt__cpu_has_avx512() && tpurt__sgemm_mode() != 5;
  x->mr = x->wide ? 8 : 6;
#if defined(__x86_64__) || defined(__i386__)
  /* single slivers on zmm where the 8 x 32 tiles run (same bits) */
  if (x->avx) return x->wide ? ukr1_avx512 : ukr_avx2;
#endif
  return ukr_scalar;
}

/* Products below this many multiply-adds are not split over the pool
 * when a batch can be spread instead. */
#define SPLIT_MIN_MACS ((double)(1 << 22))

void tpurt__sgemm_own(int ta, int tb, int64_t nb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta, float *C,
                      int64_t ldc, int64_t sc, int flags, const tpurt__gemm_epi *epi) {
  if (nb <= 0 || M <= 0 || N <= 0 || K <= 0) return;
  batch_job bj = {{.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C,
                   .lda = lda, .ldb = ldb, .ldc = ldc, .nobuf = (flags & 2) != 0, .epi = epi},
                  NULL, g_blocks, sa, sb, sc};
  bj.ukr = pick_ukr(flags, &bj.x);
  bj.bl = read_blocks(bj.x.wide);
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
    x.bi = i;
    x.A += i * sa;
    x.B += i * sb;
    x.C += i * sc;
    run_product(&x, bj.ukr, bj.bl, par);
  }
}

/* ------------------------------------------- implicit convolution */

typedef struct {
  const tpurt_conv_cols *g;
  float *xp;
  int64_t hp, wp;
} pad_job;

/* Planes [b, e) (image, channel) of the zero-padded images. */
static void pad_planes(void *p, int64_t b, int64_t e) {
  const pad_job *pj = p;
  const tpurt_conv_cols *g = pj->g;
  for (int64_t q = b; q < e; q++) {
    const float *src = g->x + q / g->C * g->img + q % g->C * g->H * g->W;
    float *d = pj->xp + q * pj->hp * pj->wp;
    memset(d, 0, sizeof(float) * (size_t)(g->ph * pj->wp));
    for (int64_t h = 0; h < g->H; h++) {
      float *row = d + (g->ph + h) * pj->wp;
      memset(row, 0, sizeof(float) * (size_t)g->pw);
      memcpy(row + g->pw, src + h * g->W, sizeof(float) * (size_t)g->W);
      memset(row + g->pw + g->W, 0, sizeof(float) * (size_t)(pj->wp - g->pw - g->W));
    }
    memset(d + (g->ph + g->H) * pj->wp, 0, sizeof(float) * (size_t)((pj->hp - g->ph - g->H) * pj->wp));
  }
}

/* Padded images above this size are not made (the column matrix is packed). */
#define PAD_MAX_BYTES ((int64_t)64 << 20)

/* The images of a convolution as the micro-kernels read them in place:
 * zero-padded (a copy, only when the convolution pads) or the images
 * themselves; element (k, position) of the column matrix at xp + off[k] +
 * the position's base n * img + oh * sh * w + ow * sw, where off[k] is the
 * offset of channel and tap k. 0 when they cannot be made (too large for
 * 32-bit offsets or PAD_MAX_BYTES, host memory exhausted: the caller
 * packs). */
typedef struct {
  const float *xp;
  const int32_t *off;
  int64_t img, w;
} padded;

static int pad_images(const tpurt_conv_cols *g, int par, padded *o) {
  if (g->ph < 0 || g->pw < 0) return 0;
  /* rows and columns the convolution reads, from -ph / -pw: the padding
   * below and right is what they need (a phase of a strided input
   * gradient reads past the images' symmetric padding, tpurt_conv's
   * bwd_input_phases) */
  int64_t rh = (g->Ho - 1) * g->sh + (g->kh - 1) * g->dh + 1, rw = (g->Wo - 1) * g->sw + (g->kw - 1) * g->dw + 1;
  int64_t hp = g->H + 2 * g->ph > rh ? g->H + 2 * g->ph : rh, wp = g->W + 2 * g->pw > rw ? g->W + 2 * g->pw : rw;
  int pad = g->ph > 0 || g->pw > 0 || hp > g->H || wp > g->W;
  int64_t plane = pad ? hp * wp : g->H * g->W;
  int64_t img = pad ? g->C * plane : g->img, kk = g->kh * g->kw, Kd = g->C * kk, w = pad ? wp : g->W;
  if ((pad && g->N * img * (int64_t)sizeof(float) > PAD_MAX_BYTES) || g->N * img >= ((int64_t)1 << 31)) return 0;
  int32_t *off = (int32_t *)buf(3, (size_t)Kd);
  float *xp = pad ? buf(2, (size_t)(g->N * img)) : (float *)g->x;
  if (!off || !xp) return 0;
  for (int64_t k = 0; k < Kd; k++) off[k] = (int32_t)(k / kk * plane + k % kk / g->kw * g->dh * w + k % g->kw * g->dw);
  if (pad) {
    pad_job pj = {g, xp, hp, wp};
    if (par)
      tpurt_parallel_for(g->N * g->C, 1, pad_planes, &pj);
    else
      pad_planes(&pj, 0, g->N * g->C);
  }
  *o = (padded){xp, off, img, w};
  return 1;
}

/* The column matrix of a convolution at unit column stride whose output
 * rows hold whole 16-column slivers (Wo a multiple of 16) is read in place:
 * a sliver's row k is 16 consecutive elements of one image row, at a
 * fixed offset xoff[k] (channel, tap) from the sliver's first position,
 * once the images are zero-padded (pad_images). The packing it replaces
 * wrote every gathered element to a panel for the micro-kernel to read
 * back, and at 32 output channels each is used by only 32 rows: 30 % of a
 * 32-channel 3 x 3 forward convolution's time (perf), 1 % for the copy
 * that replaces it. The vector kernels only (the portable one packs), not
 * without buffers. */
static void read_in_place(prod *x, int par) {
  const tpurt_conv_cols *g = x->cv;
  padded pd;
  if (!x->avx || x->nobuf || tpurt__sgemm_mode() == 6 || g->sw != 1 || g->Wo % NR || !pad_images(g, par, &pd))
    return;
  x->xp = pd.xp;
  x->xoff = pd.off;
  x->xp_img = pd.img;
  x->xp_w = pd.w;
}

/* ---------------------------------- weight gradient, images in place */

/* Bytes of dy^T packed for a weight gradient read in place (else: packed path). */
#define WG_MAX_BYTES ((int64_t)64 << 20)
#define WG_MAX_M 128

typedef struct {
  const prod *x;
  padded pd;
  const int32_t *pos; /* base offset of every position (pad_images) */
  float *bp;          /* dy^T packed: chunk q at q * kc0 * mp, its sliver s kc * NR further per sliver */
  float *t;           /* dw^T, [rows of the row slivers] x mp */
  float *w;           /* dw, rows ldw apart */
  int64_t ldw;
  const float *dy;
  int64_t m, mp, kd, np, kc0, nsl, L, y_img;
} wg_job;

/* Units [b, e) (chunk q, sliver s) of dy^T: B[position, channel] =
 * dy[n * y_img + channel * L + l], packed one image's run at a time. */
static void wg_pack(void *p, int64_t b, int64_t e) {
  const wg_job *j = p;
  for (int64_t u = b; u < e; u++) {
    int64_t q = u / j->nsl, sl = u % j->nsl, p0 = q * j->kc0, kc = j->np - p0 < j->kc0 ? j->np - p0 : j->kc0;
    int64_t c0 = sl * NR, n = j->m - c0 < NR ? j->m - c0 : NR;
    float *d = j->bp + p0 * j->mp + sl * kc * NR;
    for (int64_t q0 = p0; q0 < p0 + kc;) {
      int64_t l = q0 % j->L, len = j->L - l < p0 + kc - q0 ? j->L - l : p0 + kc - q0;
      pack_sliver(d + (q0 - p0) * NR, NR, j->dy + q0 / j->L * j->y_img + c0 * j->L + l, j->L, 1, n, len,
                  j->x->avx);
      q0 += len;
    }
  }
}

/* Row slivers [b, e) of dw^T over every chunk in order (the K chunks of
 * the packed path: the same sums in the same order, so the same bits);
 * after the last chunk each sliver's rows are written to dw while they
 * are in this thread's cache. */
static void wg_rows(void *p, int64_t b, int64_t e) {
  const wg_job *j = p;
  const int64_t mr = j->x->mr;
  for (int64_t p0 = 0; p0 < j->np; p0 += j->kc0) {
    int64_t kc = j->np - p0 < j->kc0 ? j->np - p0 : j->kc0;
    float beta = p0 == 0 ? 0.0f : 1.0f;
    const float *bq = j->bp + p0 * j->mp;
    for (int64_t rs = b; rs < e; rs++) {
      /* rows past kd repeat the last one (their results are never read) */
      const float *r[MR_MAX];
      for (int64_t i = 0; i < mr; i++) r[i] = j->pd.xp + j->pd.off[rs * mr + i < j->kd ? rs * mr + i : j->kd - 1];
      float *c = j->t + rs * mr * j->mp;
      for (int64_t sl = 0; sl < j->nsl; sl++) {
        const float *bs = bq + sl * kc * NR;
#if defined(__x86_64__) || defined(__i386__)
        if (j->x->wide && sl + 1 < j->nsl) {
          ukr2_rows_avx512(kc, r, j->pos + p0, bs, bs + kc * NR, c + sl * NR, c + sl * NR + NR, j->mp, 1.0f, beta);
          sl++;
        } else if (j->x->wide) {
          ukr1_rows_avx512(kc, r, j->pos + p0, bs, c + sl * NR, j->mp, 1.0f, beta);
        } else {
          ukr_rows_avx2(kc, r, j->pos + p0, bs, c + sl * NR, j->mp, 1.0f, beta);
        }
#endif
      }
      if (p0 + kc < j->np) continue;
      int64_t k0 = rs * mr, nk = j->kd - k0 < mr ? j->kd - k0 : mr;
      for (int64_t co = 0; co < j->m; co++)
        for (int64_t i = 0; i < nk; i++) j->w[co * j->ldw + k0 + i] = c[i * j->mp + co];
    }
  }
}

/* dw (M x Kd, rows ldw apart) = dy (spread over images) @ col^T as dw^T =
 * col @ dy^T: the column matrix on the A side is read in place from the
 * images by the micro-kernels' broadcasts (any stride, dilation and
 * padding), and only dy^T (M columns, K = positions) is packed. The packed
 * path packs col^T, Kd = C * kh * kw columns of it, every element used by
 * only M rows: 45 % of a 32-channel 3 x 3 weight gradient's time (perf).
 * Paired in-process samples (tpurt_bench_ab conv, 2 threads, Zen 5), in
 * place / packed: 32 channels at 32 x 32 1.75, 64 at 16 x 16 1.48, 64 at
 * 56 x 56 1.51, 32 -> 64 stride 2 1.39, 1 x 1 stride 2 1.37, 128 at 8 x 8
 * 1.13, but 256 at 4 x 4 1.01, 128 -> 256 stride 2 0.95, 512 at 7 x 7 0.91
 * (packing is amortized over many rows there): up to WG_MAX_M output
 * channels. Vector kernels, beta 0, buffers available; 0 when it does not
 * apply. */
static int wgrad_in_place(const prod *x, int64_t M, float *w, int64_t ldw, const float *dy, int64_t y_img, int par) {
  const tpurt_conv_cols *g = x->cv;
  int64_t L = g->Ho * g->Wo, np = g->N * L, kd = g->C * g->kh * g->kw, mp = (M + NR - 1) / NR * NR;
  int64_t nrs = (kd + x->mr - 1) / x->mr;
  if (!x->avx || x->nobuf || x->beta != 0.0f || M > WG_MAX_M || tpurt__sgemm_mode() == 6 ||
      np * mp * (int64_t)sizeof(float) > WG_MAX_BYTES)
    return 0;
  blocks bl = read_blocks(0);
  int64_t nk = (np + bl.kc - 1) / bl.kc, kc0 = ((np + nk - 1) / nk + 7) / 8 * 8; /* run_product's K chunks */
  wg_job j = {.x = x, .w = w, .ldw = ldw, .dy = dy, .m = M, .mp = mp, .kd = kd, .np = np, .kc0 = kc0, .nsl = mp / NR, .L = L,
              .y_img = y_img};
  if (!pad_images(g, par, &j.pd)) return 0;
  int32_t *pos = (int32_t *)buf(4, (size_t)np);
  j.bp = buf(0, (size_t)(np * mp));
  j.t = buf(5, (size_t)(nrs * x->mr * mp));
  if (!pos || !j.bp || !j.t) return 0;
  for (int64_t q = 0; q < np; q++) {
    int64_t o = q % L;
    pos[q] = (int32_t)(q / L * j.pd.img + o / g->Wo * g->sh * j.pd.w + o % g->Wo * g->sw);
  }
  j.pos = pos;
  int64_t units = nk * j.nsl;
  if (par) {
    tpurt_parallel_for(units, 1, wg_pack, &j);
    tpurt_parallel_for(nrs, 1, wg_rows, &j);
  } else {
    wg_pack(&j, 0, units);
    wg_rows(&j, 0, nrs);
  }
  return 1;
}

void tpurt__sgemm_conv(int kind, const tpurt_conv_cols *g, int64_t M, float *w, int64_t ldw, float *y,
                       int64_t y_img, float beta, int flags) {
  int64_t L = g->Ho * g->Wo, P = g->N * L, Kd = g->C * g->kh * g->kw;
  if (M <= 0 || P <= 0 || Kd <= 0) {
    if (kind == 1) /* no positions: an empty sum, dw = beta * dw */
      tpurt__sgemm(0, 0, M, Kd, 0, 1.0f, NULL, 1, NULL, 1, beta, w, ldw, TPURT_PRECISION_HIGHEST);
    return;
  }
  /* 32-bit gather offsets: every element of the images, every padded
   * offset and every lane sentinel stays inside +-2^30 */
  int64_t span = g->N * g->img + g->C * g->H * g->W, reach = (g->ph + g->pw + 1) * (g->W + 1);
  int g32 = span < ((int64_t)1 << 30) && reach < ((int64_t)1 << 28) && g->kh * g->dh < ((int64_t)1 << 28) &&
            g->kw * g->dw < ((int64_t)1 << 28) && g->Ho * g->sh < ((int64_t)1 << 28) &&
            g->Wo * g->sw < ((int64_t)1 << 28);
  prod x = {.M = M, .alpha = 1.0f, .beta = beta, .nobuf = (flags & 2) != 0, .cv = g, .g32 = g32};
  ukr_fn ukr = pick_ukr(flags, &x);
  if (kind == 0) { /* y (spread over images) = w @ col */
    x.N = P, x.K = Kd, x.A = w, x.lda = ldw, x.bconv = 1;
    x.C = y, x.ldc = L, x.c_L = L, x.c_img = y_img;
  } else { /* dw = dy (spread over images) @ col^T */
    x.N = Kd, x.K = P, x.A = y, x.lda = L, x.a_L = L, x.a_img = y_img, x.bconv = 2;
    x.C = w, x.ldc = ldw;
  }
  /* up to 192 output channels in one A block (<= 192 KiB at KC 256, in
   * L2): every gathered B sliver is used once, where it is packed */
  blocks bl = read_blocks(0);
  if (M > bl.mc && M <= 192) bl.mc = (M + x.mr - 1) / x.mr * x.mr;
  int par = tpurt_num_threads() > 1 && !tpurt__pool_nested();
  if (kind == 0) read_in_place(&x, par);
  if (kind == 1 && wgrad_in_place(&x, M, w, ldw, y, y_img, par)) return;
  run_product(&x, ukr, bl, par);
}
