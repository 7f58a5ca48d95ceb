/*
 * fma_peak.c — the machine's f32 FMA peak: a register-resident AVX2 FMA
 * loop on `threads` threads. Built as a small shared library so that
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

__attribute__((target("avx2,fma"))) static void *peak_thread(void *p) {
  peak_arg *a = p;
  /* 12 independent accumulators hide the FMA latency on two FMA pipes. Each
   * starts from a different value: identical chains would be merged into one
   * by the compiler, and the loop would then run one FMA per iteration while
   * we count twelve (the peak was overstated that way once). */
  __m256 x0 = _mm256_set1_ps(1.00f), x1 = _mm256_set1_ps(1.01f), x2 = _mm256_set1_ps(1.02f);
  __m256 x3 = _mm256_set1_ps(1.03f), x4 = _mm256_set1_ps(1.04f), x5 = _mm256_set1_ps(1.05f);
  __m256 x6 = _mm256_set1_ps(1.06f), x7 = _mm256_set1_ps(1.07f), x8 = _mm256_set1_ps(1.08f);
  __m256 x9 = _mm256_set1_ps(1.09f), x10 = _mm256_set1_ps(1.10f), x11 = _mm256_set1_ps(1.11f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < a->iters; i++) {
    x0 = _mm256_fmadd_ps(x0, m, c); x1 = _mm256_fmadd_ps(x1, m, c); x2 = _mm256_fmadd_ps(x2, m, c);
    x3 = _mm256_fmadd_ps(x3, m, c); x4 = _mm256_fmadd_ps(x4, m, c); x5 = _mm256_fmadd_ps(x5, m, c);
    x6 = _mm256_fmadd_ps(x6, m, c); x7 = _mm256_fmadd_ps(x7, m, c); x8 = _mm256_fmadd_ps(x8, m, c);
    x9 = _mm256_fmadd_ps(x9, m, c); x10 = _mm256_fmadd_ps(x10, m, c); x11 = _mm256_fmadd_ps(x11, m, c);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                           _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
  float buf[8];
  _mm256_storeu_ps(buf, s);
  a->out = buf[0];
  return NULL;
}

double tpurt_bench_fma_flops(int64_t iters) { return (double)iters * 12 * 8 * 2; }

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
    if (pthread_create(&th[t], NULL, peak_thread, &args[t]) != 0) break;
    started++;
  }
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return started ? started * tpurt_bench_fma_flops(iters) / dt / 1e9 : 0.0;
}
