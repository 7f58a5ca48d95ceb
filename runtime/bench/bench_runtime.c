/* bench_runtime.c — micro-benchmarks of the runtime: launch+synchronize
 * round trip of an empty kernel, launch throughput, blocking small copies,
 * copy bandwidth and strided-cast throughput. Not a test; run by hand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpurt.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static tpurt_status k_nop(void *a, char *e, size_t n) { return TPURT_OK; }

int main(void) {
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
