/*
 * ktimes.c — wall time of every command a stream worker runs, summed by
 * the command's name (TORCH_TPU_KERNEL_TIMES=1, read once; off, a worker
 * pays one relaxed load per command). At exit the table goes to stderr,
 * largest total first; a DeferAndFuse unit's name "op (recorded at
 * file:line)" is counted under "op", so strict and deferred runs of one
 * program list the same rows (fused units under their group's name);
 * TORCH_TPU_KERNEL_TIMES=sites keeps one row per recording site.
 *
 * It answers "which kernels does this step spend its time in" with the
 * device's own clock: in strict mode the host's profiler sees only the
 * launch, and launch-blocking mode adds a host round trip to every op.
 * Names are the stream's (string literals or interned): the table keys on
 * the pointer and merges equal texts when it prints.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define KT_SLOTS 4096 /* distinct name pointers kept; later ones count as "(other)" */

typedef struct {
  const char *name;
  int64_t ns;
  int64_t calls;
} kt_row;

static kt_row g_rows[KT_SLOTS];
static int64_t g_other_ns, g_other_calls;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_on = -1; /* 0 off, 1 by op, 2 by op and recording site */

static size_t base_len(const char *s) {
  const char *p = atomic_load_explicit(&g_on, memory_order_relaxed) == 2 ? NULL : strstr(s, " (recorded at");
  return p ? (size_t)(p - s) : strlen(s);
}

static int by_total(const void *a, const void *b) {
  const kt_row *x = a, *y = b;
  return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

static void print_table(void) {
  pthread_mutex_lock(&g_mu);
  static kt_row merged[KT_SLOTS + 1];
  int n = 0;
  int64_t total = g_other_ns;
  for (int i = 0; i < KT_SLOTS; i++) {
    if (!g_rows[i].name) continue;
    const char *s = g_rows[i].name;
    size_t len = base_len(s);
    int j = 0;
    while (j < n && !(base_len(merged[j].name) == len && !strncmp(merged[j].name, s, len))) j++;
    if (j == n) merged[n++] = (kt_row){s, 0, 0};
    merged[j].ns += g_rows[i].ns;
    merged[j].calls += g_rows[i].calls;
    total += g_rows[i].ns;
  }
  if (g_other_calls) merged[n++] = (kt_row){"(other)", g_other_ns, g_other_calls};
  pthread_mutex_unlock(&g_mu);
  qsort(merged, (size_t)n, sizeof merged[0], by_total);
  fprintf(stderr, "torch_tpu kernel times (TORCH_TPU_KERNEL_TIMES): %.3f ms in %d names\n", total / 1e6, n);
  fprintf(stderr, "%12s %8s %10s %6s  %s\n", "total ms", "calls", "us/call", "share", "kernel");
  for (int j = 0; j < n; j++)
    fprintf(stderr, "%12.3f %8lld %10.1f %5.1f%%  %.*s\n", merged[j].ns / 1e6, (long long)merged[j].calls,
            merged[j].ns / 1e3 / (double)merged[j].calls, total ? 100.0 * merged[j].ns / (double)total : 0.0,
            (int)base_len(merged[j].name), merged[j].name);
}

int tpurt__ktimes_on(void) {
  int v = atomic_load_explicit(&g_on, memory_order_relaxed);
  if (v >= 0) return v;
  pthread_mutex_lock(&g_mu);
  v = atomic_load_explicit(&g_on, memory_order_relaxed);
  if (v < 0) {
    const char *e = getenv("TORCH_TPU_KERNEL_TIMES");
    v = !e || !*e || !strcmp(e, "0") ? 0 : !strcmp(e, "sites") ? 2 : 1;
    if (v) atexit(print_table);
    atomic_store_explicit(&g_on, v, memory_order_relaxed);
  }
  pthread_mutex_unlock(&g_mu);
  return v;
}

void tpurt__ktimes_add(const char *name, int64_t ns) {
  if (!name) name = "kernel";
  size_t h = ((uintptr_t)name >> 3) * 0x9E3779B97F4A7C15ull >> 52; /* 12 bits: KT_SLOTS */
  pthread_mutex_lock(&g_mu);
  for (int probe = 0; probe < 64; probe++) {
    kt_row *r = &g_rows[(h + (size_t)probe) % KT_SLOTS];
    if (r->name == name || !r->name) {
      r->name = name;
      r->ns += ns;
      r->calls++;
      pthread_mutex_unlock(&g_mu);
      return;
    }
  }
  g_other_ns += ns;
  g_other_calls++;
  pthread_mutex_unlock(&g_mu);
}
