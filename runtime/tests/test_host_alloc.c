/* test_host_alloc.c — pinned host allocator: alignment, buckets, interior
 * pointers, cached reuse, deferred reuse behind queued work, stats. */
#include <sched.h>
#include <stdatomic.h>

#include "check.h"

static _Atomic int g_gate;
static tpurt_status k_gate(void *a, char *e, size_t n) {
  while (!atomic_load(&g_gate)) sched_yield();
  return TPURT_OK;
}

int main(void) {
  void *p = (void *)1, *q, *r;
  CHECK_OK(tpurt_host_alloc(0, &p));
  CHECK(p == NULL);
  CHECK_OK(tpurt_host_free(NULL));
  CHECK_OK(tpurt_host_alloc(5000, &p));
  CHECK(((uintptr_t)p & 4095) == 0);
  memset(p, 0xab, 5000);
  CHECK(tpurt_host_is_pinned(p));
  CHECK(tpurt_host_is_pinned((char *)p + 4999));
  CHECK(tpurt_host_is_pinned((char *)p + 1234));
  CHECK(!tpurt_host_is_pinned((char *)p + 5000));
  int local;
  CHECK(!tpurt_host_is_pinned(&local));
  CHECK(!tpurt_host_is_pinned(NULL));
  tpurt_host_stats st;
  tpurt_host_get_stats(&st);
  CHECK_EQ(st.allocation.current, 1);
  CHECK_EQ(st.allocated_bytes.current, 8192);
  CHECK_EQ(st.reserved_bytes.current, 8192);
  CHECK_ST(tpurt_host_free((char *)p + 8), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_host_free(&local), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_host_free(p));
  CHECK(!tpurt_host_is_pinned(p));
  CHECK_ST(tpurt_host_free(p), TPURT_ERR_INVALID_ARGUMENT);
  /* cached reuse, same bucket */
  CHECK_OK(tpurt_host_alloc(6000, &q));
  CHECK(q == p);
  tpurt_host_get_stats(&st);
  CHECK_EQ(st.reserved_bytes.current, 8192);
  CHECK_EQ(st.allocation.allocated, 2);
  CHECK_EQ(st.allocation.freed, 1);

  /* deferred: freed while a stream has queued work -> not reused until done */
  tpurt_stream *s;
  CHECK_OK(tpurt_stream_default(0, &s));
  atomic_store(&g_gate, 0);
  CHECK_OK(tpurt_launch(s, "gate", k_gate, NULL, 0));
  CHECK_OK(tpurt_host_free(q));
  CHECK_OK(tpurt_host_alloc(6000, &r));
  CHECK(r != q);
  atomic_store(&g_gate, 1);
  CHECK_OK(tpurt_stream_synchronize(s));
  void *t;
  CHECK_OK(tpurt_host_alloc(6000, &t));
  CHECK(t == q);
  tpurt_host_get_stats(&st);
  CHECK_EQ(st.allocation.current, 2);
  CHECK_EQ(st.reserved_bytes.current, 16384);
  CHECK_OK(tpurt_host_free(r));
  CHECK_OK(tpurt_host_free(t));
  /* a big one */
  void *big;
  CHECK_OK(tpurt_host_alloc(3 << 20, &big));
  CHECK(tpurt_host_is_pinned((char *)big + (3 << 20) - 1));
  tpurt_host_get_stats(&st);
  CHECK_EQ(st.allocated_bytes.current, 4 << 20);
  CHECK_OK(tpurt_host_free(big));
  CHECK_OK(tpurt_host_empty_cache());
  tpurt_host_get_stats(&st);
  CHECK_EQ(st.reserved_bytes.current, 0);
  CHECK_EQ(st.allocation.current, 0);
  CHECK_EQ(st.reserved_bytes.peak, (4 << 20) + 16384);
  TEST_MAIN_END();
}
