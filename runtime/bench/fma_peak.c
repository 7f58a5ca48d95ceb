/*
 * fma_peak.c — the machine's f32 FMA peak: a register-resident FMA loop
 * on `threads` threads, 16-wide (AVX-512) where the CPU has it, else
 * 8-wide (AVX2). Built as a small shared library so that
 * bench/gemm.py can sample it in-process between GEMM samples (the clock of
 * a shared host moves with its neighbours' load, so a peak measured minutes
 * earlier is not the peak the GEMM ran against), and linked into
 * tpurt_bench_gemm_libs.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "fma_peak.h"

typedef struct {
  int64_t iters;
  float out;
} peak_arg;

/* The loop on one register type: 12 independent accumulators hide the FMA
 * latency on two FMA pipes. Each starts from a different value: identical
 * chains would be merged into one by the compiler, and the loop would then
 * run one FMA per iteration while we count twelve (the peak was overstated
 * that way once). */
#define PEAK_LOOP(NAME, TARGET, V, P)                                                          \
  __attribute__((target(TARGET))) static void *NAME(void *p) {                                  \
    peak_arg *a = p;                                                                           \
    V x0 = P##_set1_ps(1.00f), x1 = P##_set1_ps(1.01f), x2 = P##_set1_ps(1.02f);                \
    V x3 = P##_set1_ps(1.03f), x4 = P##_set1_ps(1.04f), x5 = P##_set1_ps(1.05f);                \
    V x6 = P##_set1_ps(1.06f), x7 = P##_set1_ps(1.07f), x8 = P##_set1_ps(1.08f);                \
    V x9 = P##_set1_ps(1.09f), x10 = P##_set1_ps(1.10f), x11 = P##_set1_ps(1.11f);              \
    const V m = P##_set1_ps(0.999999f), c = P##_set1_ps(1e-7f);                                 \
    for (int64_t i = 0; i < a->iters; i++) {                                                   \
      x0 = P##_fmadd_ps(x0, m, c); x1 = P##_fmadd_ps(x1, m, c); x2 = P##_fmadd_ps(x2, m, c);    \
      x3 = P##_fmadd_ps(x3, m, c); x4 = P##_fmadd_ps(x4, m, c); x5 = P##_fmadd_ps(x5, m, c);    \
      x6 = P##_fmadd_ps(x6, m, c); x7 = P##_fmadd_ps(x7, m, c); x8 = P##_fmadd_ps(x8, m, c);    \
      x9 = P##_fmadd_ps(x9, m, c); x10 = P##_fmadd_ps(x10, m, c); x11 = P##_fmadd_ps(x11, m, c); \
    }                                                                                          \
    V s = P##_add_ps(P##_add_ps(P##_add_ps(x0, x1), P##_add_ps(x2, x3)),                        \
                     P##_add_ps(P##_add_ps(x4, x5), P##_add_ps(x6, x7)));                       \
    s = P##_add_ps(s, P##_add_ps(P##_add_ps(x8, x9), P##_add_ps(x10, x11)));                    \
    float buf[sizeof(V) / sizeof(float)];                                                      \
    P##_storeu_ps(buf, s);                                                                     \
    a->out = buf[0];                                                                           \
    return NULL;                                                                               \
  }
PEAK_LOOP(peak_thread, "avx2,fma", __m256, _mm256)
PEAK_LOOP(peak_thread512, "avx512f", __m512, _mm512)

static int wide(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

const char *tpurt_bench_fma_isa(void) { return wide() ? "AVX-512" : "AVX2"; }

double tpurt_bench_fma_flops(int64_t iters) { return (double)iters * 12 * (wide() ? 16 : 8) * 2; }

/* Seconds for `threads` threads (at most 64) each running fn for `iters`
 * iterations, first start to last end; *started gets how many ran. */
static double run_threads(void *(*fn)(void *), int threads, int64_t iters, int *started) {
  enum { MAX_THREADS = 64 };
  if (threads < 1) threads = 1;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  pthread_t th[MAX_THREADS];
  peak_arg args[MAX_THREADS];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int n = 0;
  for (int t = 0; t < threads; t++) {
    args[t].iters = iters;
    if (pthread_create(&th[t], NULL, fn, &args[t]) != 0) break;
    n++;
  }
  for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *started = n;
  return (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

double tpurt_bench_fma_gflops(int threads, int64_t iters) {
  int started;
  double dt = run_threads(wide() ? peak_thread512 : peak_thread, threads, iters, &started);
  return started ? started * tpurt_bench_fma_flops(iters) / dt / 1e9 : 0.0;
}

/* ------------------------------------------------ bf16 matrix-unit peak */
/* The bf16 peak: AMX-BF16 (tile-resident TDPBF16PS on four independent C
 * tiles, operand tiles loaded once) where the CPU has AMX and the kernel
 * grants the tile state, else AVX512-BF16 (vdpbf16ps on 12 accumulators);
 * 0 without either. */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int bf16_kind(void) { /* 2 AMX, 1 AVX512-BF16, 0 none */
  static int kind = -1;
  if (kind >= 0) return kind;
  __builtin_cpu_init();
  kind = 0;
#if defined(__x86_64__)
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  int amx = (d >> 22) & 1 && (d >> 24) & 1;
  if (amx && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0) return kind = 2;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
  if (__builtin_cpu_supports("avx512f") && ((a >> 5) & 1)) kind = 1;
#endif
  return kind;
}

const char *tpurt_bench_bf16_isa(void) {
  int k = bf16_kind();
  return k == 2 ? "AMX-BF16" : k == 1 ? "AVX512-BF16" : "none";
}

double tpurt_bench_bf16_flops(int64_t iters) {
  int k = bf16_kind();
  return k == 2 ? (double)iters * 4 * 16 * 16 * 32 * 2 : k == 1 ? (double)iters * 12 * 32 * 2 : 0.0;
}

#if defined(__x86_64__)
__attribute__((target("amx-tile,amx-bf16"))) static void *amx_thread(void *p) {
  peak_arg *a = p;
  /* a constant object: gcc 12 drops stores to a local configuration that
   * only ldtilecfg reads (see runtime/src/kernels/bgemm.c) */
  static const struct {
    uint8_t palette, start, res[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
  _tile_loadconfig(&cfg);
  static const char zero[1024] __attribute__((aligned(64)));
  float out[256];
  _tile_loadd(4, zero, 64);
  _tile_loadd(5, zero, 64);
  _tile_loadd(6, zero, 64);
  _tile_loadd(7, zero, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < a->iters; i++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  a->out = out[0];
  return NULL;
}

__attribute__((target("avx512f,avx512bf16"))) static void *dpbf16_thread(void *p) {
  peak_arg *a = p;
  __m512 x[12];
  for (int r = 0; r < 12; r++) x[r] = _mm512_set1_ps(1.0f + 0.01f * (float)r);
  const __m512bh m = (__m512bh)_mm512_set1_epi32(0x3f803f80), n = (__m512bh)_mm512_set1_epi32(0x33d633d6);
  for (int64_t i = 0; i < a->iters; i++) {
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) x[r] = _mm512_dpbf16_ps(x[r], m, n);
  }
  __m512 s = x[0];
  for (int r = 1; r < 12; r++) s = _mm512_add_ps(s, x[r]);
  float buf[16];
  _mm512_storeu_ps(buf, s);
  a->out = buf[0];
  return NULL;
}
#endif

double tpurt_bench_bf16_gflops(int threads, int64_t iters) {
  int k = bf16_kind(), started = 0;
  if (!k) return 0.0;
  double dt = 1.0;
#if defined(__x86_64__)
  dt = run_threads(k == 2 ? amx_thread : dpbf16_thread, threads, iters, &started);
#endif
  return started ? started * tpurt_bench_bf16_flops(iters) / dt / 1e9 : 0.0;
}
