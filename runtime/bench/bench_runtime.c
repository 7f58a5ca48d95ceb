/* bench_runtime.c — micro-benchmarks of the runtime: launch+synchronize
 * round trip of an empty kernel, launch throughput, blocking small copies,
 * copy bandwidth and strided-cast throughput. Not a test; run by hand.
 * `tpurt_bench --philox`: Philox uniforms, one scalar call per block vs the
 * bulk generators (one thread, median of 5). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/internal.h"
#include "tpurt.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static tpurt_status k_nop(void *a, char *e, size_t n) { return TPURT_OK; }

/* ---- --philox */
#define PH_N (16 << 20) /* uniforms per run */

/* the per-block loop the kernels used before the bulk generator */
static void uniform_scalar(uint64_t key, float *d, int64_t n) {
  const uint32_t k[2] = {(uint32_t)key, (uint32_t)(key >> 32)};
  for (int64_t i = 0; i < n; i += 4) {
    uint32_t c[4] = {(uint32_t)(i / 4), (uint32_t)((uint64_t)(i / 4) >> 32), 0, 0}, w[4];
    tpurt_philox4x32_10(c, k, w);
    for (int q = 0; q < 4 && i + q < n; q++) d[i + q] = (float)(w[q] >> 8) * (1.0f / 16777216.0f);
  }
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* CPU time of this thread: on a shared machine, time spent preempted does
 * not count */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* median ns per word of 5 runs of mode m: 0 scalar, 1 bulk uniforms, 2 bulk words */
static double philox_run(int m, float *d) {
  double t[5];
  for (int r = 0; r < 5; r++) {
    double t0 = cpu_now();
    if (m == 0)
      uniform_scalar(1234, d, PH_N);
    else if (m == 1)
      tpurt__philox_uniform(1234, 0, 0, PH_N, d);
    else
      tpurt__philox_blocks(1234, 0, PH_N / 4, (uint32_t *)d);
    t[r] = (cpu_now() - t0) / PH_N * 1e9;
  }
  qsort(t, 5, sizeof *t, cmp_d);
  return t[2];
}

static int bench_philox(void) {
  float *d = malloc((size_t)PH_N * sizeof *d), *e = malloc((size_t)PH_N * sizeof *e);
  if (!d || !e) return 1;
  uniform_scalar(1234, e, PH_N);
  tpurt__philox_force_portable(0);
  const char *fast = tpurt__philox_path();
  double sc = philox_run(0, d);
  double bu = philox_run(1, d);
  int same = memcmp(d, e, (size_t)PH_N * sizeof *d) == 0;
  double bw = philox_run(2, d);
  tpurt__philox_force_portable(1);
  double pu = philox_run(1, d);
  same &= memcmp(d, e, (size_t)PH_N * sizeof *d) == 0;
  double pw = philox_run(2, d);
  tpurt__philox_force_portable(0);
  printf("philox uniforms, %d words, 1 thread, median of 5 (thread CPU ns/word):\n", PH_N);
  printf("  scalar per-block loop    %6.3f\n", sc);
  printf("  bulk uniforms (%-8s) %6.3f  (%.2fx)\n", fast, bu, sc / bu);
  printf("  bulk words    (%-8s) %6.3f\n", fast, bw);
  printf("  bulk uniforms (portable) %6.3f  (%.2fx)\n", pu, sc / pu);
  printf("  bulk words    (portable) %6.3f\n", pw);
  printf("  bulk == scalar: %s\n", same ? "yes" : "NO");
  free(d);
  free(e);
  return same ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--philox") == 0) return bench_philox();
  tpurt_stream *s;
  if (tpurt_stream_default(0, &s)) return 1;
  int iters = 20000;
  for (int i = 0; i < 1000; i++) {
    tpurt_launch(s, "nop", k_nop, NULL, 0);
    tpurt_stream_synchronize(s);
  }
  double t0 = now();
  for (int i = 0; i < iters; i++) {
    tpurt_launch(s, "nop", k_nop, NULL, 0);
    tpurt_stream_synchronize(s);
  }
  double t1 = now();
  printf("launch+sync round trip: %.2f us\n", (t1 - t0) / iters * 1e6);
  t0 = now();
  for (int i = 0; i < 200000; i++) tpurt_launch(s, "nop", k_nop, &i, sizeof i);
  tpurt_stream_synchronize(s);
  t1 = now();
  printf("launch throughput: %.0f ns/launch\n", (t1 - t0) / 200000 * 1e9);
  tpurt_devptr d;
  size_t big = 256 << 20;
  tpurt_malloc(0, big, s, &d);
  float x = 1.0f;
  t0 = now();
  for (int i = 0; i < iters; i++) tpurt_memcpy_h2d(s, d, &x, 4, 0);
  t1 = now();
  printf("blocking 4-byte h2d: %.2f us\n", (t1 - t0) / iters * 1e6);
  char *h = malloc(big);
  memset(h, 1, big);
  tpurt_memcpy_h2d(s, d, h, big, 0);
  t0 = now();
  for (int i = 0; i < 5; i++) tpurt_memcpy_h2d(s, d, h, big, 0);
  t1 = now();
  printf("h2d 256 MiB: %.2f GB/s\n", 5 * big / (t1 - t0) / 1e9);
  tpurt_devptr d2;
  tpurt_malloc(0, big, s, &d2);
  tpurt_view dv = {0}, sv = {0};
  int64_t n = 4096;
  dv.ptr = d2; dv.dtype = TPURT_F32; dv.ndim = 2; dv.sizes[0] = n; dv.sizes[1] = n; dv.strides[0] = n; dv.strides[1] = 1;
  sv = dv; sv.ptr = d; sv.strides[0] = 1; sv.strides[1] = n;
  t0 = now();
  for (int i = 0; i < 5; i++) tpurt_copy_strided(s, &dv, &sv);
  tpurt_stream_synchronize(s);
  t1 = now();
  printf("f32 4096x4096 transpose: %.2f GB/s (read+write)\n", 5 * 2.0 * n * n * 4 / (t1 - t0) / 1e9);
  dv.dtype = TPURT_BF16; dv.strides[0] = n; sv.strides[0] = n; sv.strides[1] = 1;
  t0 = now();
  for (int i = 0; i < 5; i++) tpurt_copy_strided(s, &dv, &sv);
  tpurt_stream_synchronize(s);
  t1 = now();
  printf("f32->bf16 16M elements: %.2f Gelem/s\n", 5.0 * n * n / (t1 - t0) / 1e9);
  return 0;
}
