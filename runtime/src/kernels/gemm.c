/*
 * gemm.c — batched matrix products (tpurt_gemm): f32 on the runtime's own
 * packed kernel (sgemm.c) or OpenBLAS tiles, chosen by shape (use_own);
 * f64 on OpenBLAS; integers on a blocked C loop.
 *
 * The library was chosen by measurement (BENCHMARKS.md, "GEMM library
 * choice"). A plain or transposed f32/f64 matrix is handed to the library as
 * it is (transpose flag + leading dimension); any other view (general
 * strides, negative strides, f16/bf16 data, reduced-precision modes) is
 * packed into a contiguous f32 buffer first. f16/bf16 operands accumulate in
 * f32 and the result is rounded once. Integer products use a blocked C loop
 * with 64-bit accumulation (wrapping like the narrow type's own arithmetic).
 *
 * Precision of f32 products (a TPU MXU multiplies bf16):
 *   HIGHEST  plain f32 GEMM
 *   HIGH     3-pass: x = hi + lo (both bf16); hi*hi + hi*lo + lo*hi as ONE
 *            GEMM over K tripled: [a_hi a_hi a_lo] @ [b_hi; b_lo; b_hi]
 *   DEFAULT  1-pass: operands rounded to bf16, f32 GEMM
 * bf16*bf16 products are exact in f32, so the only rounding left is the
 * f32 accumulation, like the MXU. Products of bf16 values (bf16 data, or
 * f32 at DEFAULT / HIGH) run on the bf16 dot-product kernel of bgemm.c
 * where the CPU has one (AVX512-BF16), else on the f32 kernel as above.
 *
 * OpenBLAS runs its own worker threads: their count is set once, at first
 * use, to the runtime's pool size (the usable cores). The runtime's pool is
 * idle while a stream worker sits in the GEMM, so the two never add up.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include <cblas.h>

#include "fused.h"
#include "gemm_internal.h"

/* ------------------------------------------------------------- library */

static pthread_once_t g_lib_once = PTHREAD_ONCE_INIT;
static char g_lib_name[160];
static int g_lib_threads = 1;
static int g_lib_narrow; /* the library's f32 kernels are narrower than the own kernel's (lib_init) */

/* Library threads: f32 products run single-threaded calls on the pool's
 * tiles (below); f64 products below SERIAL_MNK multiply-adds run on the
 * calling worker alone, larger ones use all of the library's threads
 * (LAPACK calls do too). The wheel exports no per-thread setting, so the
 * library-wide count is switched (cached, so only a change of regime
 * calls into the library; a race between streams can only cost speed,
 * never correctness). */
#define SERIAL_MNK ((double)(1 << 24) + 1) /* up to 256^3 */
static _Atomic int g_cur_threads = -1;
static void set_threads_for(int64_t M, int64_t N, int64_t K) {
  int want = (double)M * (double)N * (double)K < SERIAL_MNK ? 1 : g_lib_threads;
  if (atomic_load_explicit(&g_cur_threads, memory_order_relaxed) != want) {
    atomic_store_explicit(&g_cur_threads, want, memory_order_relaxed);
    scipy_openblas_set_num_threads(want);
  }
}

static void lib_init(void) {
  int n = tpurt_num_threads();
  if (n < 1) n = 1;
  scipy_openblas_set_num_threads(n);
  g_lib_threads = n;
  atomic_store(&g_cur_threads, n);
  const char *ver = OPENBLAS_VERSION;
  while (*ver == ' ') ver++;
  char v[64];
  snprintf(v, sizeof v, "%s", ver);
  size_t l = strlen(v);
  while (l && v[l - 1] == ' ') v[--l] = 0;
  const char *core = scipy_openblas_get_corename();
  /* The library picks its kernels by CPU model: a CPU it does not know
   * (Zen 5 with OpenBLAS 0.3.34: "Haswell") gets its AVX2 kernels even
   * where the CPU has AVX-512, and the own kernel's 8 x 32 tiles are
   * twice as wide (use_own). Its AVX-512 targets are these three. */
  static const char *const wide[] = {"skylakex", "cooperlake", "sapphirerapids"};
  int lib_wide = 0;
  for (size_t i = 0; core && i < sizeof wide / sizeof *wide; i++) lib_wide |= !strcasecmp(core, wide[i]);
  g_lib_narrow = tpurt__cpu_has_avx512() && !lib_wide;
  snprintf(g_lib_name, sizeof g_lib_name, "tpurt sgemm (%s) + %s (%s, %d threads)", tpurt__sgemm_kernel_name(),
           v, core ? core : "?", n);
}

void tpurt__gemm_lib_init(void) { pthread_once(&g_lib_once, lib_init); }

const char *tpurt_gemm_library(void) {
  if (tpurt__ensure_init() != TPURT_OK) return "OpenBLAS (runtime not initialized)";
  tpurt__gemm_lib_init();
  return g_lib_name;
}

/* -------------------------------------------------------- scratch memory */

/* Per-thread grow-only buffers: no allocation on the hot path once warm.
 * Buffers above SCRATCH_KEEP bytes are released after the kernel. */
#define SCRATCH_SLOTS 11
#define SCRATCH_KEEP (256u << 20)
static _Thread_local struct {
  void *p;
  size_t n;
} g_scratch[SCRATCH_SLOTS];

void *tpurt__scratch(int slot, size_t bytes) {
  if (bytes == 0) bytes = 64;
  if (g_scratch[slot].n < bytes) {
    free(g_scratch[slot].p);
    size_t n = (bytes + 4095) & ~(size_t)4095;
    g_scratch[slot].p = aligned_alloc(64, n);
    g_scratch[slot].n = g_scratch[slot].p ? n : 0;
  }
  return g_scratch[slot].p;
}

void tpurt__scratch_trim(void) {
  for (int i = 0; i < SCRATCH_SLOTS; i++)
    if (g_scratch[i].n > SCRATCH_KEEP) {
      free(g_scratch[i].p);
      g_scratch[i].p = NULL;
      g_scratch[i].n = 0;
    }
}

/* ------------------------------------------------------------- helpers */

static inline float round_bf16(float x) { return tpurt__bf16_to_f32(tpurt__f32_to_bf16(x)); }

/* Row r of a strided matrix converted to f32 (n elements). */
static void load_row_f32(float *restrict dst, const char *p, tpurt_dtype dt, int64_t cs, int64_t n) {
  switch (dt) {
    case TPURT_F32: {
      const float *s = (const float *)p;
      if (cs == 1)
        memcpy(dst, s, (size_t)n * 4);
      else
        for (int64_t j = 0; j < n; j++) dst[j] = s[j * cs];
      break;
    }
    case TPURT_BF16: {
      const uint16_t *restrict s = (const uint16_t *)p;
      if (cs == 1) /* contiguous: a vector loop */
        for (int64_t j = 0; j < n; j++) dst[j] = tpurt__bf16_to_f32(s[j]);
      else
        for (int64_t j = 0; j < n; j++) dst[j] = tpurt__bf16_to_f32(s[j * cs]);
      break;
    }
    case TPURT_F16: {
      const uint16_t *restrict s = (const uint16_t *)p;
      if (cs == 1)
        for (int64_t j = 0; j < n; j++) dst[j] = tpurt__f16_to_f32(s[j]);
      else
        for (int64_t j = 0; j < n; j++) dst[j] = tpurt__f16_to_f32(s[j * cs]);
      break;
    }
    default: break;
  }
}

/* nb matrices of rows x cols (source batch stride bs, strides rs / cs in
 * elements) packed as f32 at dst, one after the other (batch stride dbs
 * floats), each row-major with leading dimension ld. */
typedef struct {
  float *dst;
  const char *src;
  tpurt_dtype dt;
  int64_t rs, cs, cols, ld; /* strides in elements, dst leading dimension */
  int mode;                 /* 0 plain, 1 round to bf16, 2 HIGH split of A, 3 HIGH split of B */
  int64_t rows, bs, dbs;
} pack_ctx;

static void pack_rows(void *c, int64_t b, int64_t e) {
  pack_ctx *x = c;
  size_t es = tpurt_dtype_size(x->dt);
  for (int64_t i = b; i < e; i++) {
    int64_t bi = i / x->rows, r = i % x->rows;
    float *base = x->dst + bi * x->dbs, *d = base + r * x->ld;
    load_row_f32(d, x->src + (ptrdiff_t)(bi * x->bs + r * x->rs) * (ptrdiff_t)es, x->dt, x->cs, x->cols);
    int64_t n = x->cols;
    if (x->mode == 1) {
      for (int64_t j = 0; j < n; j++) d[j] = round_bf16(d[j]);
    } else if (x->mode == 2) { /* A row: [hi | hi | lo] */
      for (int64_t j = 0; j < n; j++) {
        float h = round_bf16(d[j]);
        d[n + j] = h;
        d[2 * n + j] = round_bf16(d[j] - h);
        d[j] = h;
      }
    } else if (x->mode == 3) { /* B rows: hi at r, lo at K+r, hi at 2K+r */
      float *lo = base + (x->rows + r) * x->ld, *h2 = base + (2 * x->rows + r) * x->ld;
      for (int64_t j = 0; j < n; j++) {
        float h = round_bf16(d[j]);
        lo[j] = round_bf16(d[j] - h);
        h2[j] = h;
        d[j] = h;
      }
    }
  }
}

/* Floats one packed matrix of rows x cols takes in mode (the HIGH splits
 * triple the columns of A or the rows of B). */
static int64_t packed_floats(int64_t rows, int64_t cols, int mode) { return rows * cols * (mode >= 2 ? 3 : 1); }

static void pack_batches(float *dst, const void *src, tpurt_dtype dt, int64_t nb, int64_t bs, int64_t rows,
                         int64_t cols, int64_t rs, int64_t cs, int mode) {
  pack_ctx x = {dst, src, dt, rs, cs, cols, mode == 2 ? 3 * cols : cols, mode, rows, bs,
                packed_floats(rows, cols, mode)};
  if (nb * rows * cols >= (1 << 16))
    tpurt_parallel_for(nb * rows, (1 << 15) / (cols ? cols : 1) + 1, pack_rows, &x);
  else
    pack_rows(&x, 0, nb * rows);
}

/* Packs rows x cols of a strided matrix into dst (row-major, ld = cols) as
 * f32, applying the precision mode. */
void tpurt__pack_f32(float *dst, const void *src, tpurt_dtype dt, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                     int mode) {
  pack_batches(dst, src, dt, 1, 0, rows, cols, rs, cs, mode);
}

/* Can (rows x cols, strides rs/cs) be handed to BLAS? Sets trans/ld. */
static int blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int *trans, int64_t *ld) {
  if (rows <= 1) rs = cols > 1 ? cols : 1;
  if (cols <= 1) cs = 1;
  if (cs == 1 && rs >= (cols > 1 ? cols : 1) && rs <= INT32_MAX) {
    *trans = 0;
    *ld = rs;
    return 1;
  }
  if (rows > 1 && cols > 1 && rs == 1 && cs >= rows && cs <= INT32_MAX) {
    *trans = 1;
    *ld = cs;
    return 1;
  }
  return 0;
}

static inline enum CBLAS_TRANSPOSE tr(int t) { return t ? CblasTrans : CblasNoTrans; }

/* ------------------------------------------------------ tiled sgemm
 *
 * f32 products the own kernel does not take (see use_own) run as tiles on
 * the runtime's pool, each tile one
 * single-threaded library call. The library's own threads split every
 * product statically and wait for the slowest thread, which on a shared
 * machine (or next to the pool's threads) costs up to 10x; tiles on the
 * pool are claimed dynamically, so an unscheduled thread only delays the
 * tile it holds. Batched products are tiled over batch x rows x columns
 * in one parallel region (small per-batch products no longer run on one
 * core). Tile boundaries depend only on the shape, never on scheduling. */

typedef struct {
  int ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  const float *A, *B;
  float *C;
  int64_t lda, ldb, ldc;
  int64_t sa, sb, sc; /* batch strides (elements) */
  int64_t mt, nt;     /* tile size */
  int64_t tm, tn;     /* tiles per batch along M, N */
  const tpurt__gemm_epi *epi;
} sgemm_job;

/* Below this many multiply-adds a product runs as one call (tiles would
 * cost more in handoffs than they save). */
#define TILE_MIN_MACS ((int64_t)1 << 20)
#define TILE_GRID 8

static void sgemm_tiles(void *p, int64_t t0, int64_t t1) {
  const sgemm_job *j = p;
  int64_t per = j->tm * j->tn;
  for (int64_t t = t0; t < t1; t++) {
    int64_t bi = t / per, r = t % per, i0 = r / j->tn * j->mt, j0 = r % j->tn * j->nt;
    int64_t m = j->M - i0 < j->mt ? j->M - i0 : j->mt, n = j->N - j0 < j->nt ? j->N - j0 : j->nt;
    const float *a = j->A + bi * j->sa + (j->ta ? i0 : i0 * j->lda);
    const float *b = j->B + bi * j->sb + (j->tb ? j0 * j->ldb : j0);
    float *c = j->C + bi * j->sc + i0 * j->ldc + j0;
    scipy_cblas_sgemm(CblasRowMajor, tr(j->ta), tr(j->tb), (int)m, (int)n, (int)j->K, j->alpha, a, (int)j->lda, b,
                      (int)j->ldb, j->beta, c, (int)j->ldc);
    if (j->epi) j->epi->fn(j->epi->ctx, bi, i0, i0 + m, j0, j0 + n);
  }
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Own packed kernel (sgemm.c) or OpenBLAS tiles, by shape (per product;
 * TORCH_TPU_SGEMM=own|blas overrides). Rule: own kernel for single
 * products with M >= 64, N >= 32 and M*N*K >= 64^3, OpenBLAS otherwise. Measured single-threaded
 * (CPU time, loaded machine; GFLOP/s own vs OpenBLAS): 1024^3 84 vs 90,
 * 4096x768x256 90 vs 86, 128x4096x256 66 vs 64, 64^3 66 vs 66, but thin
 * or tiny products lose: 48^3 57 vs 68, 32x4096x256 46 vs 56, 512x12x512
 * 29 vs 37, 4x1024x1024 14 vs 24, 1024x4x1024 12 vs 24 (a 6x16 micro-tile
 * is mostly padding, and OpenBLAS has GEMV-like paths). On 2 threads the
 * own kernel wins on the large shapes (one shared packed B panel instead
 * of one per tile; see runtime/bench/bench_sgemm.c). */
static int use_own(int64_t nb, int64_t M, int64_t N, int64_t K) {
  /* Batched products (convolution images, attention heads) stayed on the
   * tiles with the 6-row tiles (below): they run the whole batch x tiles in
   * one region, while the own kernel runs few-product batches one product
   * after the other. Quiet
   * machine, 2 threads, bench_sgemm median of 11 (own vs tiles GFLOP/s):
   * 64x12544x147 x4 97 vs 107, 64x3136x576 x4 76 vs 95, 256x196x2304 x4
   * 92 vs 102; single products 4096x1024x256 156 vs 139, 4096x768x256 152
   * vs 125, 4096x256x256 115 vs 85, 1024^3 121 vs 106. */
  /* The same rule on AVX-512 CPUs, where the own kernel ran 6 x 32 tiles (8 x 32 since)
   * and the library its 16-wide SkylakeX kernels: Xeon, 2 threads,
   * bench_sgemm median of 5 (own vs tiles GFLOP/s): 256^3 202 vs 142, 512^3
   * 242 vs 218, 1024^3 283 vs 278, 4096x1024x256 326 vs 285, 4096x768x256
   * 244 vs 223, 4096x256x256 263 vs 227, 4096x256x1024 257 vs 271 (with
   * 6 x 16 tiles only, the own kernel had lost everywhere: 137 vs 205 at
   * 512^3). */
  /* With the 8 x 32 tiles (AVX-512) the own kernel also wins batched
   * products from 2^20 multiply-adds each (attention's q @ k^T and p @ v at
   * 128+ tokens): 2 threads, bench_sgemm median of 9 (own vs tiles GFLOP/s)
   * 128x128x64 x32 256 vs 220, 128x64x128 x32 265 vs 192, 256x256x64 x16
   * 229 vs 188, 256x64x256 x16 196 vs 173, 512x512x64 x8 257 vs 203,
   * 1024x1024x64 x4 218 vs 185, 192x192x128 x16 215 vs 154; smaller ones stay
   * on the tiles: 64x64x64 x64 183 vs 219, 128x64x64 x32 209 vs 240,
   * 128x128x32 x32 223 vs 251, 64x64x128 x64 227 vs 268. */
  /* Against the library's AVX2 kernels on an AVX-512 CPU (g_lib_narrow)
   * the own kernel wins every batched product and every single one but
   * the matrix-vector-like: Zen 5, OpenBLAS "Haswell", 2 threads,
   * bench_sgemm median of 9 (own vs tiles GFLOP/s): batched 64x64x32 x64
   * 258 vs 118, 64x32x64 x64 282 vs 137, 64x64x64 x64 190 vs 103,
   * 32x32x32 x256 187 vs 89, 16x64x64 x64 278 vs 105, 64x16x64 x64 180 vs
   * 103; single 48^3 61 vs 53, 32x4096x256 164 vs 142, 512x12x512 115 vs
   * 86, 16x96x128 156 vs 67, 1024x16x128 182 vs 135, 128^3 234 vs 148, but
   * 4x1024x1024 67 vs 71 and 1024x4x1024 46 vs 61. */
  tpurt__gemm_lib_init();
  if (g_lib_narrow) return nb > 1 || (M >= 8 && N >= 8);
  double macs = (double)M * (double)N * (double)K;
  if (nb > 1) return tpurt__cpu_has_avx512() && M >= 64 && N >= 32 && macs >= (double)(1 << 20);
  return M >= 64 && N >= 32 && macs >= (double)(1 << 18);
}

/* One-row products (M = 1: a decode step's projections, batch 1): the
 * library's matrix-vector kernel over slices of the columns, one slice a
 * pool task. The tiles' matrix-product calls packed the whole weight
 * matrix on every call to multiply it by one row: 46 % of the stream
 * worker's time in a compiled Llama decode step went to that copy. */
typedef struct {
  int tb;
  int64_t N, K, nt;
  float alpha, beta;
  const float *x, *B;
  int64_t incx, ldb;
  float *y;
} gemv_job;

static void gemv_slices(void *p, int64_t t0, int64_t t1) {
  const gemv_job *j = p;
  for (int64_t t = t0; t < t1; t++) {
    int64_t n0 = t * j->nt, n = j->N - n0 < j->nt ? j->N - n0 : j->nt;
    if (j->beta == 0.0f) memset(j->y + n0, 0, sizeof(float) * (size_t)n); /* C's old values unread, NaN too */
    if (j->tb) /* op(B) = B^T, B [N, K]: y = B x over rows n0 .. */
      scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)j->K, j->alpha, j->B + n0 * j->ldb, (int)j->ldb,
                        j->x, (int)j->incx, j->beta, j->y + n0, 1);
    else /* B [K, N]: y = B^T x over columns n0 .. */
      scipy_cblas_sgemv(CblasRowMajor, CblasTrans, (int)j->K, (int)n, j->alpha, j->B + n0, (int)j->ldb, j->x,
                        (int)j->incx, j->beta, j->y + n0, 1);
  }
}

static void sgemv_row(int ta, int tb, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                      int64_t ldb, float beta, float *C) {
  gemv_job j = {tb, N, K, N, alpha, beta, A, B, ta ? lda : 1, ldb, C};
  int64_t nth = tpurt_num_threads(), tasks = 1;
  /* the slices are a function of the shape and the pool size, not of
   * whether the caller is itself a pool task (which runs them inline): a
   * product run inside a concurrent pair keeps its bits */
  if (nth > 1 && N * K >= (int64_t)1 << 16) {
    tasks = 4 * nth; /* slices of >= 16 columns (a cache line of y each) */
    if (tasks > N / 16) tasks = N / 16 > 1 ? N / 16 : 1;
    j.nt = ceil_div(ceil_div(N, tasks), 16) * 16;
    tasks = ceil_div(N, j.nt);
  }
  set_threads_for(1, 1, 1);
  if (tasks > 1)
    tpurt_parallel_for(tasks, 1, gemv_slices, &j);
  else
    gemv_slices(&j, 0, 1);
}

/* nb products C_i = alpha op(A_i) op(B_i) + beta C_i (K > 0, row-major,
 * batch strides in elements; sc != 0 unless nb == 1), with an epilogue
 * on each final block of C when epi is not NULL. */
static void sgemm_batched_k(int ta, int tb, int64_t nb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                          int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta, float *C,
                          int64_t ldc, int64_t sc, const tpurt__gemm_epi *epi) {
  int mode = tpurt__sgemm_mode();
  if (mode == 6) mode = 0; /* "packed": the automatic choice (it concerns convolutions only) */
  if (mode == 0 && nb == 1 && M == 1 && !epi && K <= INT32_MAX && N <= INT32_MAX) {
    sgemv_row(ta, tb, N, K, alpha, A, lda, B, ldb, beta, C);
    return;
  }
  if (mode == 1 || mode == 3 || mode == 4 || mode == 5 || (mode == 0 && use_own(nb, M, N, K))) {
    tpurt__sgemm_own(ta, tb, nb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc,
                     (mode == 3 ? 1 : 0) | (mode == 4 ? 2 : 0), epi);
    return;
  }
  sgemm_job j = {ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, sa, sb, sc, M, N, 1, 1, epi};
  double macs = (double)M * (double)N * (double)K;
  /* tiles: a function of the shape alone. The library's results depend on
   * the tile (OpenBLAS 0.3.34's AVX2 kernels: a 40 x 1100 x 120 product in
   * column tiles of any width has other bits in each tile's last columns
   * than in one call), so a grid that followed the pool size gave other
   * bits at 1 and 3 threads; the own kernel's do not depend on its blocks.
   * The products left on the tiles are thin, small or batched (use_own):
   * TILE_GRID tiles (4 per thread on 2 cores, claimed dynamically) serve
   * them on any pool size, and a batch of as many products runs one each. */
  if (macs * (double)nb >= (double)(2 * TILE_MIN_MACS)) {
    /* aim at TILE_GRID tiles over the whole batch, none below the minimum */
    int64_t want = TILE_GRID;
    int64_t per = nb >= want ? 1 : ceil_div(want, nb);
    int64_t cap = (int64_t)(macs / (double)TILE_MIN_MACS);
    if (per > cap) per = cap > 1 ? cap : 1;
    /* rows first (the B panel is shared), in multiples of 16, >= 32 rows */
    int64_t tm = per < M / 32 ? per : (M / 32 > 1 ? M / 32 : 1);
    j.mt = ceil_div(ceil_div(M, tm), 16) * 16;
    j.tm = ceil_div(M, j.mt);
    int64_t tn = ceil_div(per, j.tm);
    if (tn > N / 32) tn = N / 32 > 1 ? N / 32 : 1;
    j.nt = ceil_div(ceil_div(N, tn), 16) * 16;
    j.tn = ceil_div(N, j.nt);
  }
  int64_t ntiles = nb * j.tm * j.tn;
  set_threads_for(1, 1, 1); /* every tile is one single-threaded library call */
  if (ntiles > 1)
    tpurt_parallel_for(ntiles, 1, sgemm_tiles, &j);
  else
    sgemm_tiles(&j, 0, 1);
}

void tpurt__sgemm_batched(int ta, int tb, int64_t nb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                          int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta, float *C,
                          int64_t ldc, int64_t sc) {
  if (nb <= 0 || M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t bi = 0; bi < nb; bi++) tpurt__sgemm(ta, tb, M, N, 0, alpha, A, lda, B, ldb, beta, C + bi * sc, ldc,
                                                     TPURT_PRECISION_HIGHEST);
    return;
  }
  sgemm_batched_k(ta, tb, nb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, NULL);
}

/* Row-major C[M,N] = alpha op(A) op(B) + beta C on f32 data, with the
 * precision applied by packing when not HIGHEST. Uses scratch slots 6, 7. */
void tpurt__sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, tpurt_precision prec) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  if (prec != TPURT_PRECISION_HIGHEST) {
    int high = prec == TPURT_PRECISION_HIGH;
    if (tpurt__bgemm_applies()) {
      tpurt__bmat ma = {A, TPURT_F32, ta ? 1 : lda, ta ? lda : 1}, mb = {B, TPURT_F32, tb ? 1 : ldb, tb ? ldb : 1};
      tpurt__bmat mc = {C, TPURT_F32, ldc, 1};
      if (tpurt__bgemm(1, M, N, K, alpha, &ma, 0, &mb, 0, high, beta, &mc, 0)) return;
    }
    float *pa = tpurt__scratch(6, (size_t)M * K * (high ? 3 : 1) * 4);
    float *pb = tpurt__scratch(7, (size_t)K * N * (high ? 3 : 1) * 4);
    tpurt__pack_f32(pa, A, TPURT_F32, M, K, ta ? 1 : lda, ta ? lda : 1, high ? 2 : 1);
    tpurt__pack_f32(pb, B, TPURT_F32, K, N, tb ? 1 : ldb, tb ? ldb : 1, high ? 3 : 1);
    int64_t k2 = high ? 3 * K : K;
    sgemm_batched_k(0, 0, 1, M, N, k2, alpha, pa, k2, 0, pb, N, 0, beta, C, ldc, 0, NULL);
    return;
  }
  sgemm_batched_k(ta, tb, 1, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, NULL);
}

void tpurt__dgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, double alpha, const double *A, int64_t lda,
                  const double *B, int64_t ldb, double beta, double *C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0 ? 0.0 : beta * C[i * ldc + j];
    return;
  }
  set_threads_for(M, N, 2 * K); /* f64: twice the work per multiply-add */
  scipy_cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C,
                    (int)ldc);
}

/* ------------------------------------------------------------- kernel */

typedef struct {
  tpurt_view c, a, b;
  double alpha, beta;
  tpurt_precision prec;
} gemm_args;

typedef struct {
  char *p;
  int64_t rs, cs;
} mat;

static mat batch_mat(const tpurt_view *v, int64_t bi) {
  mat m;
  size_t es = tpurt_dtype_size(v->dtype);
  /* empty operands (K = 0) may have a null address: never translate it */
  m.p = v->ptr ? (char *)tpurt__host_view(v->ptr) + (ptrdiff_t)(bi * v->strides[0]) * (ptrdiff_t)es : NULL;
  m.rs = v->strides[1];
  m.cs = v->strides[2];
  return m;
}

/* rows x n of C (strides rs, cs in elements) = t + beta * C (t f32,
 * leading dimension ldt; beta == 0 does not read C). */
#define STORE_ROWS(T, TO, FROM)                                                               \
  for (int64_t i = 0; i < rows; i++) {                                                        \
    const float *restrict s = t + i * ldt;                                                    \
    T *restrict d = (T *)c + i * rs;                                                          \
    if (cs == 1 && beta == 0.0f)                                                              \
      for (int64_t j = 0; j < n; j++) d[j] = TO(s[j]);                                        \
    else if (cs == 1)                                                                         \
      for (int64_t j = 0; j < n; j++) d[j] = TO(s[j] + beta * FROM(d[j]));                    \
    else                                                                                      \
      for (int64_t j = 0; j < n; j++)                                                         \
        d[j * cs] = TO(beta == 0.0f ? s[j] : s[j] + beta * FROM(d[j * cs]));                  \
  }
#define SAME_F32(v) (v)
static void store_rows(const float *t, int64_t ldt, void *c, tpurt_dtype dt, int64_t rs, int64_t cs, int64_t rows,
                       int64_t n, float beta) {
  switch (dt) {
    case TPURT_F32: STORE_ROWS(float, SAME_F32, SAME_F32) break;
    case TPURT_BF16: STORE_ROWS(uint16_t, tpurt__f32_to_bf16, tpurt__bf16_to_f32) break;
    case TPURT_F16: STORE_ROWS(uint16_t, tpurt__f32_to_f16, tpurt__f16_to_f32) break;
    default: break;
  }
}
#undef SAME_F32
#undef STORE_ROWS

/* A block of the f32 results of gemm_converted stored into C, by the
 * thread that computed it (tpurt__gemm_epi). */
typedef struct {
  const tpurt_view *cv;
  const float *t; /* results of batches b0.., [nb, M, N] */
  int64_t b0, M, N;
  float beta;
} store_job;

static void store_block(void *p, int64_t bi, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const store_job *j = p;
  mat c = batch_mat(j->cv, j->b0 + bi);
  size_t es = tpurt_dtype_size(j->cv->dtype);
  store_rows(j->t + (bi * j->M + r0) * j->N + c0, j->N, c.p + (ptrdiff_t)(r0 * c.rs + c0 * c.cs) * (ptrdiff_t)es,
             j->cv->dtype, c.rs, c.cs, r1 - r0, c1 - c0, j->beta);
}

/* Batches per round of gemm_converted: its buffers (packed operands, f32
 * results) stay under this size, or hold one batch. */
#define CONVERTED_ROUND_BYTES ((size_t)64 << 20)

/* The products the f32 kernels run on converted operands: bf16 / f16 data
 * where no bf16 GEMM serves them, f32 at DEFAULT / HIGH precision (modes
 * as tpurt__pack_f32), views the library cannot take, results that are
 * not a plain f32 matrix. The operands of a round of batches are packed as
 * f32 in one parallel pass each (an operand shared by every batch once);
 * the round's products run in one tiled region, and each final block of
 * the f32 results is stored into C (bf16, f16, any strides) by the thread
 * that computed it, while it is in that core's cache. 0, or -1 when out of
 * host memory (C untouched). */
static int gemm_converted(const gemm_args *g, int mode_a, int mode_b) {
  const tpurt_view *cv = &g->c, *av = &g->a, *bv = &g->b;
  int64_t B = cv->sizes[0], M = cv->sizes[1], N = cv->sizes[2], K = av->sizes[2];
  float alpha = (float)g->alpha, beta = (float)g->beta;
  mat c0 = batch_mat(cv, 0);
  int tc = 1;
  int64_t ldc = 0;
  /* results straight into C: a plain f32 matrix in every batch */
  int direct = K > 0 && cv->dtype == TPURT_F32 && blas_layout(M, N, c0.rs, c0.cs, &tc, &ldc) && !tc &&
               (B == 1 || cv->strides[0] != 0);
  int shared_a = B == 1 || av->strides[0] == 0, shared_b = B == 1 || bv->strides[0] == 0;
  int64_t k2 = mode_a == 2 ? 3 * K : K, fa = packed_floats(M, K, mode_a), fb = packed_floats(K, N, mode_b);
  size_t per = 4 * (size_t)((shared_a ? 0 : fa) + (shared_b ? 0 : fb) + (direct ? 0 : M * N));
  int64_t round = per ? (int64_t)(CONVERTED_ROUND_BYTES / per) : B;
  if (round < 1) round = 1;
  if (round > B) round = B;
  float *pa = K ? tpurt__scratch(0, 4 * (size_t)(shared_a ? 1 : round) * (size_t)fa) : NULL;
  float *pb = K ? tpurt__scratch(1, 4 * (size_t)(shared_b ? 1 : round) * (size_t)fb) : NULL;
  float *t = direct ? NULL : tpurt__scratch(2, 4 * (size_t)round * (size_t)(M * N));
  if ((K && (!pa || !pb)) || (!direct && !t)) return -1;
  /* a column-major operand (a transposed view) packed in its own row order
   * and handed over transposed: packing it as it is read gathered every
   * row from its columns (bf16 q @ k^T at 2048 columns 2.0x slower) */
  int ta = mode_a < 2 && M > 1 && K > 1 && av->strides[1] == 1 && av->strides[2] != 1;
  int tb = mode_b < 2 && K > 1 && N > 1 && bv->strides[1] == 1 && bv->strides[2] != 1;
  int64_t lda = ta ? M : k2, ldb = tb ? K : N;
#define PACK_A(dst, b0, nr)                                                                                   \
  pack_batches(dst, batch_mat(av, b0).p, av->dtype, nr, av->strides[0], ta ? K : M, ta ? M : K,            \
               av->strides[ta ? 2 : 1], av->strides[ta ? 1 : 2], mode_a)
#define PACK_B(dst, b0, nr)                                                                                   \
  pack_batches(dst, batch_mat(bv, b0).p, bv->dtype, nr, bv->strides[0], tb ? N : K, tb ? K : N,            \
               bv->strides[tb ? 2 : 1], bv->strides[tb ? 1 : 2], mode_b)
  if (K && shared_a) PACK_A(pa, 0, 1);
  if (K && shared_b) PACK_B(pb, 0, 1);
  for (int64_t b0 = 0; b0 < B; b0 += round) {
    int64_t nr = B - b0 < round ? B - b0 : round;
    if (!K) { /* C = beta C */
      memset(t, 0, 4 * (size_t)(nr * M * N));
      store_job sj = {cv, t, b0, M, N, beta};
      for (int64_t bi = 0; bi < nr; bi++) store_block(&sj, bi, 0, M, 0, N);
      continue;
    }
    if (!shared_a) PACK_A(pa, b0, nr);
    if (!shared_b) PACK_B(pb, b0, nr);
    int64_t sa = shared_a ? 0 : fa, sb = shared_b ? 0 : fb;
    if (direct) {
      sgemm_batched_k(ta, tb, nr, M, N, k2, alpha, pa, lda, sa, pb, ldb, sb, beta, (float *)batch_mat(cv, b0).p, ldc,
                      cv->strides[0], NULL);
    } else {
      store_job sj = {cv, t, b0, M, N, beta};
      tpurt__gemm_epi st = {store_block, &sj};
      sgemm_batched_k(ta, tb, nr, M, N, k2, alpha, pa, lda, sa, pb, ldb, sb, 0.0f, t, N, M * N, &st);
    }
  }
#undef PACK_A
#undef PACK_B
  return 0;
}

/* Can an epilogue run on the blocks of this product (tpurt__gemm_epi)? An
 * f32 product at HIGHEST precision (the own kernel or the library tiles,
 * which hand out final blocks) into a dense row-major C [B, M, N], so that
 * element (b, i, j) is element (b * M + i) * N + j of the launch run as
 * the epilogue. */
static int epi_ok(const gemm_args *g) {
  const tpurt_view *c = &g->c;
  int64_t M = c->sizes[1], N = c->sizes[2];
  return g->a.dtype == TPURT_F32 && g->b.dtype == TPURT_F32 && c->dtype == TPURT_F32 && g->a.sizes[2] > 0 &&
         g->prec == TPURT_PRECISION_HIGHEST && (c->sizes[0] == 1 || c->strides[0] == M * N) &&
         (M == 1 || c->strides[1] == N) && (N == 1 || c->strides[2] == 1);
}

/* Returns 1 when epi (or NULL) ran on every block of C: the plain f32
 * product into a dense row-major C (epi_ok); 0 when epi was not run; -1
 * when out of host memory (C untouched, epi not run). */
static int gemm_float(const gemm_args *g, const tpurt__gemm_epi *epi) {
  const tpurt_view *cv = &g->c, *av = &g->a, *bv = &g->b;
  int64_t B = cv->sizes[0], M = cv->sizes[1], N = cv->sizes[2], K = av->sizes[2];
  float alpha = (float)g->alpha, beta = (float)g->beta;
  tpurt_precision prec = av->dtype == TPURT_F32 ? g->prec : TPURT_PRECISION_HIGHEST;
  int mode_a = prec == TPURT_PRECISION_HIGHEST ? 0 : prec == TPURT_PRECISION_HIGH ? 2 : 1;
  int mode_b = mode_a == 2 ? 3 : mode_a;
  /* bf16 values (bf16 data, or f32 rounded at DEFAULT / split at HIGH):
   * the bf16 dot-product kernel where the CPU has one */
  int bvals_a = av->dtype == TPURT_BF16 || (av->dtype == TPURT_F32 && mode_a != 0);
  int bvals_b = bv->dtype == TPURT_BF16 || (bv->dtype == TPURT_F32 && mode_b != 0);
  if (K > 0 && bvals_a && bvals_b && cv->dtype != TPURT_F64 && (B == 1 || cv->strides[0] != 0) &&
      tpurt__bgemm_applies()) {
    mat a = batch_mat(av, 0), b = batch_mat(bv, 0), c = batch_mat(cv, 0);
    tpurt__bmat ma = {a.p, av->dtype, a.rs, a.cs}, mb = {b.p, bv->dtype, b.rs, b.cs}, mc = {c.p, cv->dtype, c.rs, c.cs};
    if (tpurt__bgemm(B, M, N, K, alpha, &ma, av->strides[0], &mb, bv->strides[0], mode_a == 2, beta, &mc,
                     cv->strides[0]))
      return !epi;
  }
  if (K > 0 && mode_a == 0 && av->dtype == TPURT_F32 && bv->dtype == TPURT_F32 && cv->dtype == TPURT_F32 &&
      (B == 1 || cv->strides[0] != 0)) {
    /* every batch has the same layout: one tiled region over all of them */
    mat a = batch_mat(av, 0), b = batch_mat(bv, 0), c = batch_mat(cv, 0);
    int ta, tb, tc;
    int64_t lda, ldb, ldc;
    if (blas_layout(M, K, a.rs, a.cs, &ta, &lda) && blas_layout(K, N, b.rs, b.cs, &tb, &ldb) &&
        blas_layout(M, N, c.rs, c.cs, &tc, &ldc)) {
      int with_epi = epi && !tc && epi_ok(g);
      if (!tc)
        sgemm_batched_k(ta, tb, B, M, N, K, alpha, (const float *)a.p, lda, av->strides[0], (const float *)b.p, ldb,
                      bv->strides[0], beta, (float *)c.p, ldc, cv->strides[0], with_epi ? epi : NULL);
      else /* C^T = op(B)^T op(A)^T */
        sgemm_batched_k(!tb, !ta, B, N, M, K, alpha, (const float *)b.p, ldb, bv->strides[0], (const float *)a.p, lda,
                      av->strides[0], beta, (float *)c.p, ldc, cv->strides[0], NULL);
      return with_epi || !epi;
    }
  }
  if (gemm_converted(g, mode_a, mode_b)) return -1;
  return !epi;
}

static void pack_f64(double *dst, mat m, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) dst[i * cols + j] = ((const double *)m.p)[i * m.rs + j * m.cs];
}

static void gemm_double(const gemm_args *g) {
  const tpurt_view *cv = &g->c, *av = &g->a, *bv = &g->b;
  int64_t B = cv->sizes[0], M = cv->sizes[1], N = cv->sizes[2], K = av->sizes[2];
  for (int64_t bi = 0; bi < B; bi++) {
    mat a = batch_mat(av, bi), b = batch_mat(bv, bi), c = batch_mat(cv, bi);
    int ta = 0, tb = 0, tc = 0;
    int64_t lda = 1, ldb = 1, ldc = 1;
    const double *pa = NULL, *pb = NULL;
    if (K > 0) {
      if (blas_layout(M, K, a.rs, a.cs, &ta, &lda)) {
        pa = (const double *)a.p;
      } else {
        double *t = tpurt__scratch(0, (size_t)M * K * 8);
        pack_f64(t, a, M, K);
        pa = t;
        ta = 0;
        lda = K;
      }
      if (blas_layout(K, N, b.rs, b.cs, &tb, &ldb)) {
        pb = (const double *)b.p;
      } else {
        double *t = tpurt__scratch(1, (size_t)K * N * 8);
        pack_f64(t, b, K, N);
        pb = t;
        tb = 0;
        ldb = N;
      }
    }
    if (blas_layout(M, N, c.rs, c.cs, &tc, &ldc)) {
      if (!tc)
        tpurt__dgemm(ta, tb, M, N, K, g->alpha, pa, lda, pb, ldb, g->beta, (double *)c.p, ldc);
      else
        tpurt__dgemm(!tb, !ta, N, M, K, g->alpha, pb, ldb, pa, lda, g->beta, (double *)c.p, ldc);
    } else {
      double *t = tpurt__scratch(2, (size_t)M * N * 8);
      tpurt__dgemm(ta, tb, M, N, K, 1.0, pa, lda, pb, ldb, 0.0, t, N);
      for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
          double *d = (double *)c.p + i * c.rs + j * c.cs;
          double v = g->alpha * t[i * N + j];
          *d = g->beta == 0.0 ? v : v + g->beta * *d;
        }
    }
  }
}

/* ------------------------------------------------------ integer GEMM */

static inline int64_t load_int(tpurt_dtype dt, const char *p) {
  switch (dt) {
    case TPURT_U8: return *(const uint8_t *)p;
    case TPURT_I8: return *(const int8_t *)p;
    case TPURT_I16: return *(const int16_t *)p;
    case TPURT_U16: return *(const uint16_t *)p;
    case TPURT_I32: return *(const int32_t *)p;
    case TPURT_U32: return *(const uint32_t *)p;
    case TPURT_I64: return *(const int64_t *)p;
    case TPURT_U64: return (int64_t) * (const uint64_t *)p;
    default: return 0;
  }
}
static inline void store_int(tpurt_dtype dt, char *p, int64_t v) {
  switch (dt) {
    case TPURT_U8: *(uint8_t *)p = (uint8_t)v; break;
    case TPURT_I8: *(int8_t *)p = (int8_t)v; break;
    case TPURT_I16: *(int16_t *)p = (int16_t)v; break;
    case TPURT_U16: *(uint16_t *)p = (uint16_t)v; break;
    case TPURT_I32: *(int32_t *)p = (int32_t)v; break;
    case TPURT_U32: *(uint32_t *)p = (uint32_t)v; break;
    case TPURT_I64: *(int64_t *)p = v; break;
    case TPURT_U64: *(uint64_t *)p = (uint64_t)v; break;
    default: break;
  }
}

static void pack_int(int64_t *dst, mat m, tpurt_dtype dt, int64_t rows, int64_t cols) {
  size_t es = tpurt_dtype_size(dt);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++)
      dst[i * cols + j] = load_int(dt, m.p + (ptrdiff_t)((i * m.rs + j * m.cs) * (int64_t)es));
}

typedef struct {
  const int64_t *a, *b;
  mat c;
  tpurt_dtype dt;
  int64_t N, K;
  uint64_t alpha, beta;
} igemm_ctx;

#define IBLK 256
static void igemm_rows(void *cx, int64_t r0, int64_t r1) {
  igemm_ctx *x = cx;
  int64_t N = x->N, K = x->K;
  size_t es = tpurt_dtype_size(x->dt);
  uint64_t acc[IBLK];
  for (int64_t i = r0; i < r1; i++) {
    for (int64_t j0 = 0; j0 < N; j0 += IBLK) {
      int64_t nj = N - j0 < IBLK ? N - j0 : IBLK;
      memset(acc, 0, sizeof acc);
      for (int64_t k = 0; k < K; k++) {
        uint64_t av = (uint64_t)x->a[i * K + k];
        const int64_t *br = x->b + k * N + j0;
        for (int64_t j = 0; j < nj; j++) acc[j] += av * (uint64_t)br[j]; /* wraps like the narrow type */
      }
      for (int64_t j = 0; j < nj; j++) {
        char *d = x->c.p + (ptrdiff_t)((i * x->c.rs + (j0 + j) * x->c.cs) * (int64_t)es);
        uint64_t v = x->alpha * acc[j];
        if (x->beta) v += x->beta * (uint64_t)load_int(x->dt, d);
        store_int(x->dt, d, (int64_t)v);
      }
    }
  }
}

static void gemm_int(const gemm_args *g) {
  const tpurt_view *cv = &g->c, *av = &g->a, *bv = &g->b;
  int64_t B = cv->sizes[0], M = cv->sizes[1], N = cv->sizes[2], K = av->sizes[2];
  for (int64_t bi = 0; bi < B; bi++) {
    mat a = batch_mat(av, bi), b = batch_mat(bv, bi), c = batch_mat(cv, bi);
    int64_t *pa = tpurt__scratch(0, (size_t)M * K * 8 + 8), *pb = tpurt__scratch(1, (size_t)K * N * 8 + 8);
    pack_int(pa, a, av->dtype, M, K);
    pack_int(pb, b, bv->dtype, K, N);
    igemm_ctx x = {pa, pb, c, cv->dtype, N, K, (uint64_t)(int64_t)g->alpha, (uint64_t)(int64_t)g->beta};
    tpurt_parallel_for(M, (1 << 16) / (N * (K + 1) + 1) + 1, igemm_rows, &x);
  }
}

static tpurt_status k_gemm(void *p, char *err, size_t errlen) {
  gemm_args *g = p;
  tpurt__gemm_lib_init();
  switch (g->a.dtype) {
    case TPURT_F32:
    case TPURT_F16:
    case TPURT_BF16:
      if (gemm_float(g, NULL) < 0) {
        tpurt__scratch_trim();
        snprintf(err, errlen, "matmul: out of host memory for the operands converted to float32");
        return TPURT_ERR_OUT_OF_MEMORY;
      }
      break;
    case TPURT_F64: gemm_double(g); break;
    default: gemm_int(g); break;
  }
  tpurt__scratch_trim();
  return TPURT_OK;
}

/* A product and an elementwise launch that reads its output, as one
 * kernel (DeferAndFuse, graph/execute.c): arguments gemm_args, then the launch's
 * (tpurt__ew_args). The launch runs on each block of C as soon as the
 * block is final, while it is in this core's cache, instead of in a pass
 * of its own over C; where the product takes another path (epi_ok, rows
 * the launch cannot run by ranges) it runs whole after the product. */
typedef struct {
  tpurt__ew_epi *ew;
  int64_t M, N;
} epi_rows;

static void run_epi_rows(void *p, int64_t bi, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const epi_rows *e = p;
  if (c0 == 0 && c1 == e->N) { /* whole rows: one range */
    tpurt__ew_epi_range(e->ew, (bi * e->M + r0) * e->N, (bi * e->M + r1) * e->N);
    return;
  }
  for (int64_t r = r0; r < r1; r++) {
    int64_t base = (bi * e->M + r) * e->N;
    tpurt__ew_epi_range(e->ew, base + c0, base + c1);
  }
}

static tpurt_status k_gemm_epi(void *p, char *err, size_t errlen) {
  gemm_args *g = p;
  void *ew_args = (char *)p + sizeof(gemm_args);
  tpurt__gemm_lib_init();
  int done = 0;
  tpurt_status st = TPURT_OK;
  epi_rows er = {epi_ok(g) ? tpurt__ew_epi_begin(ew_args) : NULL, g->c.sizes[1], g->c.sizes[2]};
  if (er.ew) {
    tpurt__gemm_epi epi = {run_epi_rows, &er};
    done = gemm_float(g, &epi);
    st = tpurt__ew_epi_end(er.ew, err, errlen);
    if (done < 0) {
      tpurt__scratch_trim();
      snprintf(err, errlen, "matmul: out of host memory for the operands converted to float32");
      return TPURT_ERR_OUT_OF_MEMORY;
    }
  } else {
    st = k_gemm(g, err, errlen);
    if (st) return st;
  }
  tpurt__scratch_trim();
  if (!st && !done) st = tpurt__ew_kernel(ew_args, err, errlen);
  return st;
}

tpurt_kernel_fn tpurt__gemm_fn(void) { return k_gemm; }

int tpurt__gemm_epi_target(const void *args, tpurt_view *c, tpurt_view ab[2]) {
  const gemm_args *g = args;
  if (!epi_ok(g)) return 0;
  *c = g->c;
  ab[0] = g->a;
  ab[1] = g->b;
  return 1;
}

uint64_t tpurt__gemm_signature(const void *args) {
  const gemm_args *g = args;
  const tpurt_view *v[3] = {&g->c, &g->a, &g->b};
  uint64_t h = 0x67656d6dull ^ (uint64_t)g->prec;
  for (int i = 0; i < 3; i++) {
    h = (h ^ (uint64_t)v[i]->dtype) * 0x100000001b3ull;
    for (int k = 0; k < v[i]->ndim; k++) {
      h = (h ^ (uint64_t)v[i]->sizes[k]) * 0x100000001b3ull;
      h = (h ^ (uint64_t)v[i]->strides[k]) * 0x100000001b3ull;
    }
  }
  return h;
}

tpurt_status tpurt__gemm_epi_enqueue(tpurt_stream *s, const char *name, const void *args, size_t gemm_size,
                                     const void *ew_args, size_t ew_size) {
  if (gemm_size != sizeof(gemm_args))
    return tpurt__err(TPURT_ERR_INTERNAL, "%s: not the arguments of a gemm", name);
  _Alignas(16) unsigned char stackbuf[4096];
  size_t n = sizeof(gemm_args) + ew_size;
  unsigned char *buf = n <= sizeof stackbuf ? stackbuf : malloc(n);
  if (!buf) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
  memcpy(buf, args, sizeof(gemm_args));
  memcpy(buf + sizeof(gemm_args), ew_args, ew_size);
  tpurt_status st = tpurt__enqueue(s, name, k_gemm_epi, buf, n, NULL);
  if (buf != stackbuf) free(buf);
  return st;
}

/* Two products that do not touch each other's outputs, as one kernel
 * (DeferAndFuse, graph/plan.c "concurrent products"): each runs on one
 * pool thread, whole, instead of both running one after the other split
 * over the threads. The pool runs a nested region inline, so each product
 * takes the single-thread path of the same kernels; their results do not
 * depend on the thread count (the same bits). With one thread, or with the
 * pool owned by another caller, they run one after the other. */
static int float_dtype(tpurt_dtype t) { return t == TPURT_F32 || t == TPURT_BF16 || t == TPURT_F16; }

/* Only GEMMs: a ResNet step's convolution gradients (input and weight,
 * the same multiply-adds) ran 7 % slower paired, whole on one thread each,
 * than one after the other on both (TORCH_TPU_KERNEL_TIMES, Zen 5). */
int64_t tpurt__product_macs(tpurt_kernel_fn fn, const void *args, size_t size) {
  if (fn != k_gemm || size != sizeof(gemm_args)) return 0;
  const gemm_args *g = args;
  /* the own float kernels (f64 and integers: OpenBLAS's threads, other loops) */
  if (!float_dtype(g->c.dtype) || !float_dtype(g->a.dtype) || !float_dtype(g->b.dtype)) return 0;
  int64_t macs = g->c.sizes[0] * g->c.sizes[1] * g->c.sizes[2] * g->a.sizes[2];
  return macs > 0 ? macs : 0;
}

#define PAIR_ERR 256
typedef struct {
  tpurt_kernel_fn fn[2];
  size_t off[2];
  tpurt_status st[2];
  char err[2][PAIR_ERR];
} pair_hdr;

static void pair_part(void *p, int64_t b, int64_t e) {
  pair_hdr *h = p;
  for (int64_t i = b; i < e; i++) h->st[i] = h->fn[i]((char *)p + h->off[i], h->err[i], PAIR_ERR);
}

static tpurt_status k_pair(void *p, char *err, size_t errlen) {
  pair_hdr *h = p;
  tpurt_parallel_for(2, 1, pair_part, p);
  for (int i = 0; i < 2; i++)
    if (h->st[i]) {
      snprintf(err, errlen, "%s", h->err[i]);
      return h->st[i];
    }
  return TPURT_OK;
}

tpurt_status tpurt__pair_enqueue(tpurt_stream *s, const char *name, tpurt_kernel_fn fa, const void *a, size_t na,
                                 tpurt_kernel_fn fb, const void *b, size_t nb) {
  size_t oa = (sizeof(pair_hdr) + 15) / 16 * 16, ob = oa + (na + 15) / 16 * 16, n = ob + nb;
  _Alignas(16) unsigned char stackbuf[4096];
  unsigned char *buf = n <= sizeof stackbuf ? stackbuf : aligned_alloc(16, (n + 15) / 16 * 16);
  if (!buf) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
  pair_hdr h = {{fa, fb}, {oa, ob}, {TPURT_OK, TPURT_OK}, {"", ""}};
  memcpy(buf, &h, sizeof h);
  memcpy(buf + oa, a, na);
  memcpy(buf + ob, b, nb);
  tpurt_status st = tpurt__enqueue(s, name, k_pair, buf, n, NULL);
  if (buf != stackbuf) free(buf);
  return st;
}

/* ------------------------------------------------------------- launch */

/* "op (what)", the name a failing check's message gives. */
static const char *view_name(char *buf, size_t n, const char *op, const char *what) {
  snprintf(buf, n, "%s (%s)", op, what);
  return buf;
}

tpurt_status tpurt__check_kernel_view(const tpurt_view *v, int ndim, const char *op, const char *what) {
  /* Each check runs under the op's name and, only when it fails, again
   * under "op (what)" for its message (a failing launch records nothing,
   * so a range its check noted twice for DeferAndFuse is never used).
   * Formatting the name for every view cost three snprintf calls a
   * product, ~3 % of the host's time issuing small matmuls (perf). */
  char buf[96];
  if (tpurt__check_view(v, op) != TPURT_OK) return tpurt__check_view(v, view_name(buf, sizeof buf, op, what));
  if (v->ndim != ndim)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s must have %d dimensions, got %d", op, what, ndim, v->ndim);
  if (tpurt__view_numel(v) == 0) return TPURT_OK;
  int dev = tpurt_devptr_device(v->ptr);
  if (dev < 0) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "%s: %s is not a device address", op, what);
  if (tpurt__check_view_range(dev, v, op) != TPURT_OK)
    return tpurt__check_view_range(dev, v, view_name(buf, sizeof buf, op, what));
  return TPURT_OK;
}

tpurt_status tpurt__check_kernel_input(const tpurt_view *v, int ndim, const char *op, const char *what) {
  tpurt__defer_note_reads(1);
  tpurt_status st = tpurt__check_kernel_view(v, ndim, op, what);
  tpurt__defer_note_reads(0);
  return st;
}

tpurt_status tpurt_gemm(tpurt_stream *s, const tpurt_view *c, const tpurt_view *a, const tpurt_view *b, double alpha,
                        double beta, tpurt_precision precision) {
  TPURT__INIT_OR_RETURN();
  tpurt_status st;
  if ((st = tpurt__check_kernel_view(c, 3, "gemm", "output")) || (st = tpurt__check_kernel_input(a, 3, "gemm", "a")) ||
      (st = tpurt__check_kernel_input(b, 3, "gemm", "b")))
    return st;
  int64_t B = c->sizes[0], M = c->sizes[1], N = c->sizes[2], K = a->sizes[2];
  if (a->sizes[0] != B || b->sizes[0] != B || a->sizes[1] != M || b->sizes[1] != K || b->sizes[2] != N)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "gemm: shapes cannot be multiplied (a [%" PRId64 ", %" PRId64 ", %" PRId64 "], b [%" PRId64
                      ", %" PRId64 ", %" PRId64 "], out [%" PRId64 ", %" PRId64 ", %" PRId64 "])",
                      a->sizes[0], a->sizes[1], a->sizes[2], b->sizes[0], b->sizes[1], b->sizes[2], B, M, N);
  if (a->dtype != b->dtype)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "gemm: operands must have the same dtype, got %s and %s",
                      tpurt_dtype_name(a->dtype), tpurt_dtype_name(b->dtype));
  tpurt_dtype dt = a->dtype;
  int is_half = dt == TPURT_F16 || dt == TPURT_BF16;
  if (dt == TPURT_BOOL || dt == TPURT_C64 || dt == TPURT_C128)
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "gemm: not implemented for dtype %s", tpurt_dtype_name(dt));
  if (!(c->dtype == dt || (is_half && c->dtype == TPURT_F32)))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "gemm: output dtype %s does not match operand dtype %s",
                      tpurt_dtype_name(c->dtype), tpurt_dtype_name(dt));
  if ((unsigned)precision > TPURT_PRECISION_HIGHEST)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "gemm: invalid precision %d", (int)precision);
  if (M > INT32_MAX || N > INT32_MAX || 3 * K > INT32_MAX)
    return tpurt__err(TPURT_ERR_NOT_SUPPORTED, "gemm: dimension too large for the GEMM library");
  if ((st = tpurt__resolve_stream(&s, tpurt_devptr_device(c->ptr)))) return st;
  if (B == 0 || M == 0 || N == 0) return TPURT_OK;
  gemm_args g;
  memset(&g, 0, sizeof g);
  g.c = *c;
  g.a = *a;
  g.b = *b;
  g.alpha = alpha;
  g.beta = beta;
  g.prec = precision;
  return tpurt_launch(s, "gemm", k_gemm, &g, sizeof g);
}
