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
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------- FMA peak */
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

static double fma_peak(int nthreads) {
  const int64_t iters = 100000000 / 4;
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    pthread_t th[64];
    peak_arg args[64];
    double t0 = now();
    for (int t = 0; t < nthreads; t++) {
      args[t].iters = iters;
      pthread_create(&th[t], NULL, peak_thread, &args[t]);
    }
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
    double dt = now() - t0;
    double gf = (double)nthreads * iters * 12 * 8 * 2 / dt / 1e9;
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
