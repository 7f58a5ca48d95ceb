/* test_multidev.c — two chips (TPU_NUM_DEVICES=2): separate address spaces,
 * per-device streams and stats, cross-chip device-to-device copies. */
#include <sched.h>
#include <stdatomic.h>

#include "check.h"

static _Atomic int g_gate;
static tpurt_status k_gate(void *a, char *e, size_t n) {
  while (!atomic_load(&g_gate)) sched_yield();
  return TPURT_OK;
}

int main(void) {
  CHECK_EQ(tpurt_device_count(), 2);
  tpurt_stream *s0, *s1;
  CHECK_OK(tpurt_stream_default(0, &s0));
  CHECK_OK(tpurt_stream_default(1, &s1));
  CHECK(s0 != s1);
  CHECK_EQ(tpurt_stream_device(s1), 1);
  size_t n = 6 << 20;
  unsigned char *h = malloc(n), *o = malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 13 + 1);
  tpurt_devptr a, b;
  CHECK_OK(tpurt_malloc(0, n, s0, &a));
  CHECK_OK(tpurt_malloc(1, n, s1, &b));
  CHECK_EQ(tpurt_devptr_device(a), 0);
  CHECK_EQ(tpurt_devptr_device(b), 1);
  tpurt_memory_stats st;
  CHECK_OK(tpurt_memory_get_stats(1, &st));
  CHECK_EQ(st.allocation[0].current, 1);
  /* wrong device for the stream */
  CHECK_ST(tpurt_memcpy_h2d(s1, a, h, 16, 0), TPURT_ERR_INVALID_ARGUMENT);
  tpurt_devptr bad;
  CHECK_ST(tpurt_malloc(0, 16, s1, &bad), TPURT_ERR_INVALID_ARGUMENT);
  /* the source chip's current stream is still writing when the copy is queued */
  atomic_store(&g_gate, 0);
  CHECK_OK(tpurt_launch(s0, "gate", k_gate, NULL, 0));
  CHECK_OK(tpurt_memcpy_h2d(s0, a, h, n, 1));
  CHECK_OK(tpurt_memcpy_d2d(s1, b, a, n)); /* chip 0 -> chip 1 on s1 */
  CHECK_EQ(tpurt_stream_query(s1), 0);
  atomic_store(&g_gate, 1);
  CHECK_OK(tpurt_memcpy_d2h(s1, o, b, n, 0));
  CHECK(memcmp(h, o, n) == 0);
  /* and back, with NULL stream = current stream of the destination chip */
  CHECK_OK(tpurt_set_device(1));
  tpurt_devptr c;
  CHECK_OK(tpurt_malloc(0, n, NULL, &c));
  CHECK_OK(tpurt_memcpy_d2d(NULL, c, b, n));
  memset(o, 0, n);
  CHECK_OK(tpurt_memcpy_d2h(NULL, o, c, n, 0));
  CHECK(memcmp(h, o, n) == 0);
  CHECK_OK(tpurt_device_synchronize(0));
  CHECK_OK(tpurt_device_synchronize(1));
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_free(b));
  CHECK_OK(tpurt_free(c));
  CHECK_OK(tpurt_empty_cache(0));
  CHECK_OK(tpurt_empty_cache(1));
  size_t fr, tot;
  CHECK_OK(tpurt_memory_get_info(1, &fr, &tot));
  CHECK_EQ(fr, tot);
  free(h);
  free(o);
  TEST_MAIN_END();
}
