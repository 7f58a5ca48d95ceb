/*
 * bench_sgemm.c — the runtime's f32 GEMM paths side by side.
 *
 *   tpurt_bench_sgemm [--peak GFLOPS] [--repeats R] [--quick] [--small] [--batched] [--cpu]
 *                     [--shape M,N,K[,nb]]...
 *
 * For each shape, interleaved in every repeat (the machine is shared and
 * noisy): tpurt_gemm with the own packed kernel (TORCH_TPU_SGEMM=own),
 * with the OpenBLAS tile path (=blas), with the automatic choice (auto)
 * and one direct OpenBLAS call with 2 library threads. Prints the median
 * GFLOP/s of each and the % of --peak (the FMA peak measured by
 * `tpurt_bench_gemm_libs --peak-only --threads 2`). Block sizes of the own
 * kernel are set with TORCH_TPU_SGEMM_BLOCKS=KC,MC,NC.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "tpurt.h"

/* --cpu: time by the process's CPU time instead of the wall clock (on a
 * loaded machine, with TPU_NUM_THREADS=1, this measures the kernel's
 * efficiency while it runs rather than its share of the cores). */
static int g_cpu;
static double now(void) {
  struct timespec ts;
  clock_gettime(g_cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#define NMETH 4
static const char *meth_name[NMETH] = {"own", "tiles", "auto", "openblas2"};

typedef struct {
  int64_t M, N, K, nb;
} shape;

static tpurt_stream *S;

static void ck(tpurt_status st) {
  if (st != TPURT_OK) {
    fprintf(stderr, "error: %s\n", tpurt_last_error());
    exit(1);
  }
}

static void bench_shape(shape s, int repeats, double peak) {
  size_t na = (size_t)(s.nb * s.M * s.K), nbb = (size_t)(s.nb * s.K * s.N), nc = (size_t)(s.nb * s.M * s.N);
  float *ha = malloc(na * 4), *hb = malloc(nbb * 4), *hc = malloc(nc * 4);
  for (size_t i = 0; i < na; i++) ha[i] = (float)((i * 7) % 13) * 0.1f - 0.6f;
  for (size_t i = 0; i < nbb; i++) hb[i] = (float)((i * 5) % 11) * 0.1f - 0.5f;
  tpurt_devptr da, db, dc;
  ck(tpurt_malloc(0, na * 4, S, &da));
  ck(tpurt_malloc(0, nbb * 4, S, &db));
  ck(tpurt_malloc(0, nc * 4, S, &dc));
  ck(tpurt_memcpy_h2d(S, da, ha, na * 4, 0));
  ck(tpurt_memcpy_h2d(S, db, hb, nbb * 4, 0));
  tpurt_view a = {0}, b = {0}, c = {0};
  a.ptr = da, b.ptr = db, c.ptr = dc;
  a.dtype = b.dtype = c.dtype = TPURT_F32;
  a.ndim = b.ndim = c.ndim = 3;
  a.sizes[0] = b.sizes[0] = c.sizes[0] = s.nb;
  a.sizes[1] = s.M, a.sizes[2] = s.K, a.strides[0] = s.M * s.K, a.strides[1] = s.K, a.strides[2] = 1;
  b.sizes[1] = s.K, b.sizes[2] = s.N, b.strides[0] = s.K * s.N, b.strides[1] = s.N, b.strides[2] = 1;
  c.sizes[1] = s.M, c.sizes[2] = s.N, c.strides[0] = s.M * s.N, c.strides[1] = s.N, c.strides[2] = 1;
  double flops = 2.0 * s.M * s.N * s.K * s.nb;
  int inner = (int)(5e9 / flops) + 1; /* ~50 ms per sample at ~100 GFLOP/s */
  if (inner > 2000) inner = 2000;
  double *gf = calloc((size_t)NMETH * repeats, sizeof(double));
  for (int r = -1; r < repeats; r++) {
    for (int mi = 0; mi < NMETH; mi++) {
      int m = (mi + (r < 0 ? 0 : r)) % NMETH; /* rotate the order: no method always runs first */
      if (m == 3 && s.nb > 1) continue;
      setenv("TORCH_TPU_SGEMM", m == 0 ? "own" : m == 1 ? "blas" : "auto", 1);
      /* untimed warm-up (~20 ms): the method after OpenBLAS's 300 ms pause
       * otherwise starts on idle cores and pays their ramp-up */
      if (m != 3) {
        double w0 = now();
        do ck(tpurt_gemm(S, &c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST));
        while (tpurt_stream_synchronize(S) == TPURT_OK && now() - w0 < 0.02);
      }
      double t0 = now();
      for (int i = 0; i < inner; i++) {
        if (m == 3) {
          /* the runtime keeps OpenBLAS at 1 thread for its tiles */
          scipy_openblas_set_num_threads(2);
          scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)s.M, (int)s.N, (int)s.K, 1.0f, ha,
                            (int)s.K, hb, (int)s.N, 0.0f, hc, (int)s.N);
          scipy_openblas_set_num_threads(1);
        } else {
          ck(tpurt_gemm(S, &c, &a, &b, 1.0, 0.0, TPURT_PRECISION_HIGHEST));
        }
      }
      if (m != 3) ck(tpurt_stream_synchronize(S));
      double dt = (now() - t0) / inner;
      /* OpenBLAS's idle threads spin for a while after a call: let them
       * park before the next method is timed */
      if (m == 3) usleep(300000);
      if (r >= 0) gf[m * repeats + r] = flops / dt / 1e9;
    }
  }
  unsetenv("TORCH_TPU_SGEMM");
  printf("%5lld x %5lld x %5lld", (long long)s.M, (long long)s.N, (long long)s.K);
  if (s.nb > 1) printf(" x%4lld", (long long)s.nb);
  else printf("      ");
  for (int m = 0; m < NMETH; m++) {
    if (m == 3 && s.nb > 1) {
      printf("  %9s %14s", meth_name[m], "-");
      continue;
    }
    qsort(gf + m * repeats, (size_t)repeats, sizeof(double), cmpd);
    double med = gf[m * repeats + repeats / 2];
    printf("  %9s %6.1f (%3.0f%%)", meth_name[m], med, 100 * med / peak);
  }
  printf("\n");
  fflush(stdout);
  free(gf);
  tpurt_free(da), tpurt_free(db), tpurt_free(dc);
  free(ha), free(hb), free(hc);
}

int main(int argc, char **argv) {
  double peak = 175;
  int repeats = 5, quick = 0, small = 0, batched = 0;
  shape one[32];
  int none = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--peak") && i + 1 < argc) peak = atof(argv[++i]);
    else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--cpu")) g_cpu = 1;
    else if (!strcmp(argv[i], "--small")) small = 1;
    else if (!strcmp(argv[i], "--batched")) batched = 1;
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc && none < 32) {
      long long m, n, k, b = 1;
      int got = sscanf(argv[++i], "%lld,%lld,%lld,%lld", &m, &n, &k, &b);
      if (got >= 3) one[none++] = (shape){m, n, k, got == 4 ? b : 1};
    }
  }
  ck(tpurt_init());
  ck(tpurt_stream_default(0, &S));
  printf("threads %d, library %s, peak %.1f GFLOP/s; median of %d: GFLOP/s (%% of peak)\n", tpurt_num_threads(),
         tpurt_gemm_library(), peak, repeats);
  static const shape main_shapes[] = {{256, 256, 256, 1},    {512, 512, 512, 1},    {1024, 1024, 1024, 1},
                                      {2048, 2048, 2048, 1}, {4096, 4096, 4096, 1}, {4096, 1024, 256, 1},
                                      {4096, 256, 1024, 1},  {4096, 768, 256, 1},   {4096, 256, 256, 1}};
  static const shape small_shapes[] = {{8, 8, 8, 1},     {16, 16, 16, 1},  {32, 32, 32, 1},   {48, 48, 48, 1},
                                       {64, 64, 64, 1},  {96, 96, 96, 1},  {128, 128, 128, 1}, {192, 192, 192, 1},
                                       {1, 1024, 1024, 1}, {1024, 1, 1024, 1}, {32, 4096, 256, 1}, {4096, 32, 256, 1}};
  static const shape batched_shapes[] = {{64, 64, 64, 64}, {128, 128, 64, 32}, {256, 256, 64, 8},
                                         {16, 16, 16, 256}, {512, 512, 512, 4}, {64, 3136, 576, 2}};
  if (none) {
    for (int i = 0; i < none; i++) bench_shape(one[i], repeats, peak);
    return 0;
  }
  int n = (int)(sizeof main_shapes / sizeof *main_shapes);
  for (int i = 0; i < n; i++) {
    if (quick && main_shapes[i].M * main_shapes[i].N * main_shapes[i].K > (int64_t)1 << 31) continue;
    bench_shape(main_shapes[i], repeats, peak);
  }
  if (small)
    for (size_t i = 0; i < sizeof small_shapes / sizeof *small_shapes; i++) bench_shape(small_shapes[i], repeats, peak);
  if (batched)
    for (size_t i = 0; i < sizeof batched_shapes / sizeof *batched_shapes; i++)
      bench_shape(batched_shapes[i], repeats, peak);
  return 0;
}
