/* test_pool.c — thread pool: every index exactly once, chunks of at least
 * grain and at most 4 per thread, boundaries independent of scheduling,
 * nesting and concurrent callers. */
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"

#define N 100003
typedef struct {
  _Atomic int hits[N];
  _Atomic int calls;
  _Atomic int64_t min_chunk;
  _Atomic uint64_t bounds_hash; /* sum of a hash of every (begin, end) */
  int64_t grain;
} ctx_t;

static void body(void *c, int64_t b, int64_t e) {
  ctx_t *x = c;
  atomic_fetch_add(&x->calls, 1);
  int64_t m = atomic_load(&x->min_chunk);
  while ((m == 0 || e - b < m) && !atomic_compare_exchange_weak(&x->min_chunk, &m, e - b)) {
  }
  atomic_fetch_add(&x->bounds_hash, ((uint64_t)b * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)e * 0xC2B2AE3D27D4EB4Full));
  for (int64_t i = b; i < e; i++) atomic_fetch_add(&x->hits[i], 1);
}

static int all_once(ctx_t *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (atomic_load(&x->hits[i]) != 1) return 0;
  return 1;
}

static void nested_body(void *c, int64_t b, int64_t e) {
  ctx_t *x = c;
  for (int64_t i = b; i < e; i++) {
    /* nested call must run inline and still cover its range */
    tpurt_parallel_for(1, 1, body, x);
  }
}

static ctx_t g_ctx[4];
static void *runner(void *arg) {
  ctx_t *x = arg;
  for (int r = 0; r < 20; r++) {
    memset(x, 0, sizeof *x);
    tpurt_parallel_for(N, 1000, body, x);
    if (!all_once(x, N)) return (void *)1;
  }
  return NULL;
}

int main(void) {
  CHECK(tpurt_num_threads() >= 1);
  static ctx_t x;
  int64_t sizes[] = {1, 2, 7, 1000, 1001, 65536, N};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    for (int64_t grain = 1; grain <= 4096; grain *= 8) {
      memset(&x, 0, sizeof x);
      tpurt_parallel_for(sizes[k], grain, body, &x);
      CHECK(all_once(&x, sizes[k]));
      int calls = atomic_load(&x.calls);
      uint64_t h = atomic_load(&x.bounds_hash);
      CHECK(calls <= 4 * tpurt_num_threads());
      CHECK(calls == 1 || atomic_load(&x.min_chunk) >= grain);
      /* the same chunks again, whichever threads take them */
      for (int rep = 0; rep < 3; rep++) {
        memset(&x, 0, sizeof x);
        tpurt_parallel_for(sizes[k], grain, body, &x);
        CHECK(all_once(&x, sizes[k]));
        CHECK_EQ(atomic_load(&x.calls), calls);
        CHECK(atomic_load(&x.bounds_hash) == h);
      }
    }
  }
  memset(&x, 0, sizeof x);
  tpurt_parallel_for(0, 1, body, &x);
  CHECK_EQ(atomic_load(&x.calls), 0);
  /* nesting: index 0 hit once per outer element */
  memset(&x, 0, sizeof x);
  tpurt_parallel_for(64, 1, nested_body, &x);
  CHECK_EQ(atomic_load(&x.hits[0]), 64);
  /* concurrent callers */
  pthread_t th[4];
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, runner, &g_ctx[i]);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(th[i], &r);
    CHECK(r == NULL);
  }
  TEST_MAIN_END();
}
