/*
 * pool.c — persistent thread pool used by kernels. nthreads-1 helper
 * threads each own a work slot; tpurt_parallel_for splits [0, n) into at
 * most nthreads chunks, hands one to each helper and runs the first itself.
 * Nested calls, calls while another caller owns the pool and small ranges
 * run inline on the calling thread.
 */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

typedef struct helper {
  _Alignas(64) _Atomic uint64_t go;   /* generation handed to this helper */
  _Atomic uint64_t done;              /* generation it finished */
  tpurt__waiter w;
  tpurt_parallel_fn fn;
  void *ctx;
  int64_t begin, end;
  int index;
} helper;

static int g_nthreads = 1;
static helper *g_helpers;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_flag g_busy = ATOMIC_FLAG_INIT;
static uint64_t g_gen; /* only touched by the owner of g_busy */
static tpurt__waiter g_done_w;
static _Thread_local int t_in_pool;

void tpurt__pool_configure(int nthreads) { g_nthreads = nthreads > 0 ? nthreads : 1; }

typedef struct {
  helper *h;
  uint64_t gen;
} gen_ctx;
static int pred_go(void *p) {
  gen_ctx *c = p;
  return atomic_load_explicit(&c->h->go, memory_order_acquire) > c->gen;
}
static int pred_done(void *p) {
  gen_ctx *c = p;
  return atomic_load_explicit(&c->h->done, memory_order_acquire) >= c->gen;
}

static void *helper_main(void *arg) {
  helper *h = arg;
  char name[16];
  snprintf(name, sizeof name, "tpu-pool%d", h->index);
  pthread_setname_np(pthread_self(), name);
  t_in_pool = 1;
  uint64_t seen = 0;
  for (;;) {
    gen_ctx c = {h, seen};
    tpurt__wait(&h->w, pred_go, &c, TPURT_SPIN_NS);
    seen = atomic_load_explicit(&h->go, memory_order_acquire);
    h->fn(h->ctx, h->begin, h->end);
    atomic_store_explicit(&h->done, seen, memory_order_release);
    tpurt__notify(&g_done_w);
  }
  return NULL;
}

static void pool_start(void) {
  int n = g_nthreads - 1;
  if (n <= 0) return;
  size_t bytes = ((size_t)n * sizeof(helper) + 63) & ~(size_t)63;
  helper *hs = aligned_alloc(64, bytes);
  if (hs) memset(hs, 0, bytes);
  if (!hs) {
    g_nthreads = 1;
    return;
  }
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  int started = 0;
  for (int i = 0; i < n; i++) {
    hs[i].index = i + 1;
    pthread_t t;
    if (pthread_create(&t, &at, helper_main, &hs[i]) != 0) break;
    started++;
  }
  pthread_attr_destroy(&at);
  g_nthreads = started + 1;
  g_helpers = hs;
}

int tpurt_num_threads(void) {
  if (tpurt__ensure_init() != TPURT_OK) return 1;
  return tpurt__cfg.num_threads;
}

void tpurt_parallel_for(int64_t n, int64_t grain, tpurt_parallel_fn fn, void *ctx) {
  if (n <= 0 || !fn) return;
  if (grain < 1) grain = 1;
  if (n <= grain || t_in_pool || tpurt__ensure_init() != TPURT_OK) {
    fn(ctx, 0, n);
    return;
  }
  pthread_once(&g_once, pool_start);
  int nt = g_nthreads;
  int64_t chunks = (n + grain - 1) / grain;
  if (chunks > nt) chunks = nt;
  if (chunks <= 1 || atomic_flag_test_and_set_explicit(&g_busy, memory_order_acquire)) {
    fn(ctx, 0, n);
    return;
  }
  uint64_t gen = ++g_gen;
  for (int64_t c = 1; c < chunks; c++) {
    helper *h = &g_helpers[c - 1];
    h->fn = fn;
    h->ctx = ctx;
    h->begin = n / chunks * c + (c < n % chunks ? c : n % chunks);
    h->end = n / chunks * (c + 1) + (c + 1 < n % chunks ? c + 1 : n % chunks);
    atomic_store_explicit(&h->go, gen, memory_order_release);
    tpurt__notify(&h->w);
  }
  t_in_pool = 1;
  fn(ctx, 0, n / chunks + (0 < n % chunks ? 1 : 0));
  t_in_pool = 0;
  for (int64_t c = 1; c < chunks; c++) {
    gen_ctx g = {&g_helpers[c - 1], gen};
    tpurt__wait(&g_done_w, pred_done, &g, TPURT_SPIN_NS);
  }
  atomic_flag_clear_explicit(&g_busy, memory_order_release);
}
