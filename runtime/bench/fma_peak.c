/*
 * fma_peak.c — the machine's f32 FMA peak: a register-resident FMA loop
 * on `threads` threads, 16-wide (AVX-512) where the CPU has it, else
 * 8-wide (AVX2). Built as a small shared library so that
 * bench/gemm.py can sample it in-process between GEMM samples (the clock of
 * a shared host moves with its neighbours' load, so a peak measured minutes
 * earlier is not the peak the GEMM ran against), and linked into
 * tpurt_bench_gemm_libs.
 */
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

double tpurt_bench_fma_gflops(int threads, int64_t iters) {
  enum { MAX_THREADS = 64 };
  if (threads < 1) threads = 1;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  pthread_t th[MAX_THREADS];
  peak_arg args[MAX_THREADS];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int started = 0;
  for (int t = 0; t < threads; t++) {
    args[t].iters = iters;
    if (pthread_create(&th[t], NULL, wide() ? peak_thread512 : peak_thread, &args[t]) != 0) break;
    started++;
  }
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return started ? started * tpurt_bench_fma_flops(iters) / dt / 1e9 : 0.0;
}
