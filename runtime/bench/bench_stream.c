/* bench_stream.c — STREAM-style triad a[i] = b[i] + s * c[i] over float32
 * arrays in host memory, split over the runtime's thread pool (every host
 * core, as STREAM's OpenMP build uses). The bandwidth it prints is the
 * reference of the elementwise benchmark (`python -m bench elementwise`).
 *
 * usage: tpurt_bench_stream [elements] [repeats]
 * prints one line per repeat: "triad_gbps <GB/s>", counting 3 arrays of
 * traffic per element as STREAM does. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpurt.h"

typedef struct {
  float *a;
  const float *b, *c;
  float s;
} triad_ctx;

static void triad(void *p, int64_t begin, int64_t end) {
  triad_ctx *t = p;
  float *restrict a = t->a;
  const float *restrict b = t->b, *restrict c = t->c;
  const float s = t->s;
  for (int64_t i = begin; i < end; i++) a[i] = b[i] + s * c[i];
}

static void init(void *p, int64_t begin, int64_t end) {
  triad_ctx *t = p;
  for (int64_t i = begin; i < end; i++) {
    t->a[i] = 0.f;
    ((float *)t->b)[i] = 1.f;
    ((float *)t->c)[i] = 2.f;
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int64_t n = argc > 1 ? atoll(argv[1]) : (int64_t)1 << 24;
  int reps = argc > 2 ? atoi(argv[2]) : 10;
  if (n <= 0 || reps <= 0) {
    fprintf(stderr, "usage: %s [elements > 0] [repeats > 0]\n", argv[0]);
    return 2;
  }
  float *a = aligned_alloc(64, ((size_t)n * 4 + 63) / 64 * 64);
  float *b = aligned_alloc(64, ((size_t)n * 4 + 63) / 64 * 64);
  float *c = aligned_alloc(64, ((size_t)n * 4 + 63) / 64 * 64);
  if (!a || !b || !c) {
    fprintf(stderr, "out of memory for %lld elements\n", (long long)n);
    return 1;
  }
  triad_ctx t = {a, b, c, 3.f};
  /* first touch from the pool's threads, as STREAM initializes in parallel */
  tpurt_parallel_for(n, 1 << 16, init, &t);
  tpurt_parallel_for(n, 1 << 16, triad, &t); /* warm-up */
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    tpurt_parallel_for(n, 1 << 16, triad, &t);
    double dt = now() - t0;
    printf("triad_gbps %.3f\n", 3.0 * 4.0 * (double)n / dt / 1e9);
  }
  if (a[n - 1] != 1.f + 3.f * 2.f) {
    fprintf(stderr, "triad result wrong: %f\n", a[n - 1]);
    return 1;
  }
  free(a);
  free(b);
  free(c);
  return 0;
}
