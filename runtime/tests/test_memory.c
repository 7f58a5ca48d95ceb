/* test_memory.c — caching allocator: reuse, split/merge, exact statistics,
 * peaks, OOM message and recovery, empty_cache, per-stream caches and
 * record_stream. Runs with TORCH_TPU_HBM_LIMIT=1G. */
#include <stdatomic.h>
#include <sched.h>

#include "check.h"

#define MiB (1ll << 20)
#define A TPURT_POOL_ALL
#define S TPURT_POOL_SMALL
#define L TPURT_POOL_LARGE

static _Atomic int g_gate;
static tpurt_status k_gate(void *a, char *e, size_t n) {
  while (!atomic_load(&g_gate)) sched_yield();
  return TPURT_OK;
}

static tpurt_memory_stats st(void) {
  tpurt_memory_stats s;
  memset(&s, 0xff, sizeof s);
  CHECK_OK(tpurt_memory_get_stats(0, &s));
  return s;
}

int main(void) {
  tpurt_memory_stats s;
  tpurt_devptr z = 123;
  CHECK_OK(tpurt_malloc(0, 0, NULL, &z));
  CHECK_EQ(z, 0);
  CHECK_OK(tpurt_free(0));
  CHECK_ST(tpurt_malloc(1, 10, NULL, &z), TPURT_ERR_INVALID_DEVICE);

  /* --- one small allocation */
  tpurt_devptr a, b, c, big;
  CHECK_OK(tpurt_malloc(0, 1000, NULL, &a));
  s = st();
  CHECK_EQ(s.allocation[A].current, 1);
  CHECK_EQ(s.allocation[S].current, 1);
  CHECK_EQ(s.allocation[L].current, 0);
  CHECK_EQ(s.allocated_bytes[A].current, 1024);
  CHECK_EQ(s.requested_bytes[A].current, 1000);
  CHECK_EQ(s.reserved_bytes[A].current, 2 * MiB);
  CHECK_EQ(s.reserved_bytes[S].current, 2 * MiB);
  CHECK_EQ(s.segment[A].current, 1);
  CHECK_EQ(s.active[A].current, 1);
  CHECK_EQ(s.active_bytes[A].current, 1024);
  CHECK_EQ(s.inactive_split[A].current, 1);
  CHECK_EQ(s.inactive_split_bytes[A].current, 2 * MiB - 1024);
  CHECK_EQ(s.num_device_alloc, 1);

  /* --- a large allocation: 11 MiB -> 12 MiB segment, remainder 1 MiB not split */
  CHECK_OK(tpurt_malloc(0, 11 * MiB, NULL, &big));
  s = st();
  CHECK_EQ(s.allocated_bytes[L].current, 12 * MiB);
  CHECK_EQ(s.requested_bytes[L].current, 11 * MiB);
  CHECK_EQ(s.reserved_bytes[A].current, 14 * MiB);
  CHECK_EQ(s.segment[L].current, 1);
  CHECK_EQ(s.inactive_split[L].current, 0);

  /* --- free + reuse */
  CHECK_OK(tpurt_free(a));
  s = st();
  CHECK_EQ(s.allocation[A].current, 1);
  CHECK_EQ(s.allocation[A].freed, 1);
  CHECK_EQ(s.allocated_bytes[A].current, 12 * MiB);
  CHECK_EQ(s.allocated_bytes[A].peak, 12 * MiB + 1024);
  CHECK_EQ(s.inactive_split[A].current, 0);
  CHECK_EQ(s.inactive_split_bytes[A].current, 0);
  CHECK_EQ(s.reserved_bytes[A].current, 14 * MiB);
  CHECK_EQ(s.requested_bytes[A].current, 11 * MiB);
  tpurt_devptr a2;
  CHECK_OK(tpurt_malloc(0, 700, NULL, &a2));
  CHECK_EQ(a2, a);
  CHECK_OK(tpurt_free(a2));

  /* --- split / merge */
  CHECK_OK(tpurt_malloc(0, 1000, NULL, &a));
  CHECK_OK(tpurt_malloc(0, 1000, NULL, &b));
  CHECK_OK(tpurt_malloc(0, 1000, NULL, &c));
  CHECK_EQ(b, a + 1024);
  CHECK_EQ(c, a + 2048);
  CHECK_OK(tpurt_free(b));
  s = st();
  CHECK_EQ(s.inactive_split[A].current, 2);
  CHECK_EQ(s.inactive_split_bytes[A].current, 2 * MiB - 2048);
  CHECK_OK(tpurt_free(a));
  s = st();
  CHECK_EQ(s.inactive_split[A].current, 2);
  CHECK_EQ(s.inactive_split_bytes[A].current, 2 * MiB - 1024);
  tpurt_devptr d;
  CHECK_OK(tpurt_malloc(0, 2048, NULL, &d));
  CHECK_EQ(d, a); /* best fit: the merged 2 KiB hole */
  CHECK_ST(tpurt_free(d + 512), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_free(d));
  CHECK_OK(tpurt_free(c));
  CHECK_ST(tpurt_free(c), TPURT_ERR_INVALID_ARGUMENT);
  s = st();
  CHECK_EQ(s.inactive_split[A].current, 0);
  CHECK_EQ(s.active[A].current, 1);

  /* --- reset peak / accumulated */
  CHECK_OK(tpurt_memory_reset_peak(0));
  s = st();
  CHECK_EQ(s.allocated_bytes[A].peak, 12 * MiB);
  CHECK_EQ(s.reserved_bytes[A].peak, 14 * MiB);
  CHECK_OK(tpurt_memory_reset_accumulated(0));
  s = st();
  CHECK_EQ(s.allocation[A].allocated, 0);
  CHECK_EQ(s.allocation[A].freed, 0);
  CHECK_EQ(s.num_device_alloc, 0);
  CHECK_EQ(s.allocation[A].current, 1);

  /* --- mid-size requests (1..10 MiB) share 20 MiB segments, split exactly */
  tpurt_devptr m1, m2;
  CHECK_OK(tpurt_malloc(0, 3 * MiB, NULL, &m1));
  CHECK_OK(tpurt_malloc(0, 5 * MiB, NULL, &m2));
  s = st();
  CHECK_EQ(s.allocated_bytes[L].current, 12 * MiB + 8 * MiB);
  CHECK_EQ(s.reserved_bytes[L].current, 12 * MiB + 20 * MiB);
  CHECK_EQ(m2, m1 + 3 * MiB);
  CHECK_EQ(s.inactive_split_bytes[L].current, 12 * MiB);
  CHECK_OK(tpurt_free(m1));
  CHECK_OK(tpurt_free(m2));

  /* --- empty cache */
  CHECK_OK(tpurt_free(big));
  CHECK_OK(tpurt_empty_cache(0));
  s = st();
  CHECK_EQ(s.reserved_bytes[A].current, 0);
  CHECK_EQ(s.segment[A].current, 0);
  CHECK_EQ(s.num_device_free, 3);
  CHECK_EQ(s.active_bytes[A].current, 0);
  CHECK_EQ(s.requested_bytes[A].current, 0);
  size_t fr, tot;
  CHECK_OK(tpurt_memory_get_info(0, &fr, &tot));
  CHECK_EQ(fr, tot);
  CHECK_EQ(tot, 1024 * MiB);

  /* --- OOM message and recovery */
  tpurt_devptr live_l, live_s, cached;
  CHECK_OK(tpurt_malloc(0, 12 * MiB, NULL, &live_l));
  CHECK_OK(tpurt_malloc(0, 1024, NULL, &live_s));
  CHECK_OK(tpurt_malloc(0, 100 * MiB, NULL, &cached));
  CHECK_OK(tpurt_free(cached)); /* cached segment: released by the retry */
  CHECK_OK(tpurt_memory_get_info(0, &fr, &tot));
  CHECK_EQ(fr, (1024 - 114) * MiB);
  tpurt_devptr huge = 77;
  CHECK_ST(tpurt_malloc(0, 2048 * MiB, NULL, &huge), TPURT_ERR_OUT_OF_MEMORY);
  CHECK_EQ(huge, 0);
  CHECK_STR(tpurt_last_error(),
            "Tried to allocate 2.00 GiB. TPU 0 has a total capacity of 1024.00 MiB of which 1010.00 MiB is free. "
            "Of the allocated memory 12.00 MiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but "
            "unallocated.");
  s = st();
  CHECK_EQ(s.num_ooms, 1);
  CHECK_EQ(s.num_alloc_retries, 1);
  CHECK(s.num_sync_all_streams >= 1);
  CHECK_EQ(s.reserved_bytes[A].current, 14 * MiB);
  CHECK_ST(tpurt_malloc(0, (size_t)-1, NULL, &huge), TPURT_ERR_OUT_OF_MEMORY);
  CHECK(strstr(tpurt_last_error(), "Tried to allocate") != NULL);
  /* fill the device, then use it again */
  tpurt_devptr chunks[64];
  int n = 0;
  while (n < 64 && tpurt_malloc(0, 100 * MiB, NULL, &chunks[n]) == TPURT_OK) n++;
  CHECK_EQ(n, 10);
  for (int i = 0; i < n; i++) CHECK_OK(tpurt_free(chunks[i]));
  CHECK_OK(tpurt_malloc(0, 900 * MiB, NULL, &huge)); /* needs the cached segments released */
  CHECK_OK(tpurt_free(huge));
  CHECK_OK(tpurt_free(live_l));
  CHECK_OK(tpurt_free(live_s));
  CHECK_OK(tpurt_empty_cache(0));

  /* --- per-stream caches */
  tpurt_stream *s0, *s1;
  CHECK_OK(tpurt_stream_default(0, &s0));
  CHECK_OK(tpurt_stream_from_pool(0, 0, &s1));
  CHECK_OK(tpurt_malloc(0, 4096, s0, &a));
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_malloc(0, 4096, s1, &b));
  CHECK(b != a);
  s = st();
  CHECK_EQ(s.segment[A].current, 2);
  CHECK_OK(tpurt_free(b));

  /* --- record_stream delays reuse until the recorded stream's work is done */
  CHECK_OK(tpurt_malloc(0, 4096, s0, &a));
  CHECK_OK(tpurt_malloc(0, 4096, s0, &c)); /* keeps a's block from merging */
  atomic_store(&g_gate, 0);
  CHECK_OK(tpurt_launch(s1, "gate", k_gate, NULL, 0));
  CHECK_OK(tpurt_record_stream(a, s1));
  CHECK_OK(tpurt_record_stream(a, s1));
  CHECK_OK(tpurt_free(a));
  s = st();
  CHECK_EQ(s.active[A].current, 2); /* pending block still active */
  CHECK_EQ(s.allocation[A].current, 1);
  CHECK_OK(tpurt_malloc(0, 4096, s0, &b));
  CHECK(b != a);
  CHECK_OK(tpurt_free(b));
  atomic_store(&g_gate, 1);
  CHECK_OK(tpurt_stream_synchronize(s1));
  CHECK_OK(tpurt_malloc(0, 4096, s0, &b));
  CHECK_EQ(b, a);
  CHECK_OK(tpurt_free(b));
  CHECK_OK(tpurt_free(c));
  CHECK_ST(tpurt_record_stream(c, s1), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_empty_cache(0));
  s = st();
  CHECK_EQ(s.reserved_bytes[A].current, 0);
  CHECK_EQ(s.active[A].current, 0);
  CHECK_EQ(s.allocation[A].current, 0);
  CHECK_EQ(s.inactive_split[A].current, 0);

  /* --- many allocations of mixed sizes, then everything returns */
  tpurt_devptr many[500];
  for (int i = 0; i < 500; i++) CHECK_OK(tpurt_malloc(0, (size_t)(i * 7919 % 3000000) + 1, NULL, &many[i]));
  for (int i = 0; i < 500; i += 2) CHECK_OK(tpurt_free(many[i]));
  for (int i = 1; i < 500; i += 2) CHECK_OK(tpurt_free(many[i]));
  s = st();
  CHECK_EQ(s.allocated_bytes[A].current, 0);
  CHECK_EQ(s.inactive_split[A].current, 0);
  CHECK_EQ(s.inactive_split_bytes[A].current, 0);
  CHECK_OK(tpurt_empty_cache(0));
  s = st();
  CHECK_EQ(s.reserved_bytes[A].current, 0);
  TEST_MAIN_END();
}
