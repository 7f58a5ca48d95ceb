/*
 * bench_gemm_libs.c — chooses the GEMM library by measurement.
 *
 * Loads candidate libraries at run time (dlopen, so neither is needed to
 * build this file) and times their row-major sgemm on square sizes and on
 * the shapes of a small transformer, then measures the machine's f32 FMA
 * peak with a register-resident FMA loop on every thread.
 *
 *   bench_gemm_libs [--threads N] [--openblas PATH] [--onednn PATH] [--peak-only]
 *
 * Prints one line per (shape, library): "gemm M N K lib GFLOP/s", and
 * "peak GFLOP/s" (f32, all threads). bench/gemm.py drives it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fma_peak.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------- FMA peak */
static double fma_peak(int nthreads) {
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    double gf = tpurt_bench_fma_gflops(nthreads, 100000000 / 4);
    if (gf > best) best = gf;
  }
  return best;
}

/* -------------------------------------------------------- libraries */
typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                               const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*set_threads_fn)(int);
typedef int (*dnnl_sgemm_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                             int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

static cblas_sgemm_fn ob_sgemm;
static dnnl_sgemm_fn dn_sgemm;

static void run(int lib, int m, int n, int k, const float *a, const float *b, float *c) {
  if (lib == 0)
    ob_sgemm(101 /*row major*/, 111, 111, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  else
    dn_sgemm('N', 'N', m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
}

static double time_gemm(int lib, int m, int n, int k) {
  float *a = aligned_alloc(64, ((size_t)m * k * 4 + 63) / 64 * 64);
  float *b = aligned_alloc(64, ((size_t)k * n * 4 + 63) / 64 * 64);
  float *c = aligned_alloc(64, ((size_t)m * n * 4 + 63) / 64 * 64);
  for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)((i * 7) % 13) * 0.1f;
  for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)((i * 5) % 11) * 0.1f;
  double flops = 2.0 * m * n * k;
  run(lib, m, n, k, a, b, c); /* warm up */
  int reps = (int)(2e9 / flops) + 1;
  if (reps > 200) reps = 200;
  double best = 1e30;
  for (int r = 0; r < 5; r++) {
    double t0 = now();
    for (int i = 0; i < reps; i++) run(lib, m, n, k, a, b, c);
    double dt = (now() - t0) / reps;
    if (dt < best) best = dt;
  }
  free(a);
  free(b);
  free(c);
  return flops / best / 1e9;
}

int main(int argc, char **argv) {
  int threads = 2, peak_only = 0;
  const char *ob_path = NULL, *dn_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--openblas") && i + 1 < argc) ob_path = argv[++i];
    else if (!strcmp(argv[i], "--onednn") && i + 1 < argc) dn_path = argv[++i];
    else if (!strcmp(argv[i], "--peak-only")) peak_only = 1;
  }
  printf("peak %.1f\n", fma_peak(threads));
  printf("peak1 %.1f\n", fma_peak(1));
  fflush(stdout);
  if (peak_only) return 0;
  if (ob_path) {
    void *h = dlopen(ob_path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    ob_sgemm = (cblas_sgemm_fn)dlsym(h, "scipy_cblas_sgemm");
    if (!ob_sgemm) ob_sgemm = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    set_threads_fn st = (set_threads_fn)dlsym(h, "scipy_openblas_set_num_threads");
    if (!st) st = (set_threads_fn)dlsym(h, "openblas_set_num_threads");
    if (st) st(threads);
  }
  if (dn_path) {
    /* oneDNN's TBB runtime takes its thread count from the affinity mask. */
    void *h = dlopen(dn_path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    dn_sgemm = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm");
  }
  static const int shapes[][3] = {
      {256, 256, 256}, {512, 512, 512}, {1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096},
      /* small transformer: tokens 4096, d_model 256, d_ff 1024 */
      {4096, 1024, 256}, {4096, 256, 1024}, {4096, 768, 256}, {4096, 256, 256}, {256, 1024, 4096},
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    if (ob_sgemm) printf("gemm %d %d %d openblas %.1f\n", m, n, k, time_gemm(0, m, n, k));
    if (dn_sgemm) printf("gemm %d %d %d onednn %.1f\n", m, n, k, time_gemm(1, m, n, k));
    fflush(stdout);
  }
  return 0;
}
