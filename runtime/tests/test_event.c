/* test_event.c — events: query/synchronize, elapsed time, errors, waits
 * across streams (ordering) and on the same stream, destroy while pending. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <time.h>

#include "check.h"

static _Atomic int g_gate;
static _Atomic int g_step;
static double wall_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
static tpurt_status k_gate(void *a, char *e, size_t n) {
  while (!atomic_load(&g_gate)) sched_yield();
  return TPURT_OK;
}
static tpurt_status k_sleep_ms(void *a, char *e, size_t n) {
  int ms;
  memcpy(&ms, a, sizeof ms);
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, NULL);
  return TPURT_OK;
}
/* records its position: expects g_step == want, then increments */
static tpurt_status k_step(void *a, char *e, size_t n) {
  int want;
  memcpy(&want, a, sizeof want);
  int got = atomic_fetch_add(&g_step, 1);
  if (got != want) {
    snprintf(e, n, "step %d ran at position %d", want, got);
    return TPURT_ERR_KERNEL;
  }
  return TPURT_OK;
}
static tpurt_status k_fail(void *a, char *e, size_t n) {
  snprintf(e, n, "boom");
  return TPURT_ERR_KERNEL;
}

int main(void) {
  tpurt_stream *s, *s2;
  CHECK_OK(tpurt_stream_default(0, &s));
  CHECK_OK(tpurt_stream_get(0, 1, &s2));
  tpurt_event *e, *t0, *t1;
  CHECK_OK(tpurt_event_create(TPURT_EVENT_DEFAULT, &e));
  CHECK_EQ(tpurt_event_query(e), 1); /* never recorded */
  CHECK_EQ(tpurt_event_device(e), -1);
  CHECK_OK(tpurt_event_synchronize(e));

  atomic_store(&g_gate, 0);
  CHECK_OK(tpurt_launch(s, "gate", k_gate, NULL, 0));
  CHECK_OK(tpurt_event_record(e, s));
  CHECK_EQ(tpurt_event_device(e), 0);
  CHECK_EQ(tpurt_event_query(e), 0);
  atomic_store(&g_gate, 1);
  CHECK_OK(tpurt_event_synchronize(e));
  CHECK_EQ(tpurt_event_query(e), 1);

  /* timing */
  CHECK_OK(tpurt_event_create(TPURT_EVENT_TIMING, &t0));
  CHECK_OK(tpurt_event_create(TPURT_EVENT_TIMING, &t1));
  float ms = -1;
  CHECK_ST(tpurt_event_elapsed_ms(t0, t1, &ms), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_STR(tpurt_last_error(), "Both events must be recorded before calculating elapsed time.");
  CHECK_ST(tpurt_event_elapsed_ms(e, t1, &ms), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_STR(tpurt_last_error(), "Both events must be created with argument 'enable_timing=True'.");
  /* the elapsed time covers the work between the records and never exceeds
   * the host's wall clock around them (no upper bound in absolute time: a
   * loaded host may stretch any interval) */
  int twenty = 20;
  double w0 = wall_ms();
  CHECK_OK(tpurt_event_record(t0, s));
  CHECK_OK(tpurt_launch(s, "sleep", k_sleep_ms, &twenty, sizeof twenty));
  CHECK_OK(tpurt_event_record(t1, s));
  CHECK_OK(tpurt_event_synchronize(t1));
  double w1 = wall_ms();
  CHECK_OK(tpurt_event_elapsed_ms(t0, t1, &ms));
  CHECK(ms >= 19.5f && ms <= w1 - w0 + 0.5);
  /* host-side sleep between records */
  w0 = wall_ms();
  CHECK_OK(tpurt_event_record(t0, s));
  CHECK_OK(tpurt_stream_synchronize(s));
  struct timespec ts = {0, 20 * 1000000L};
  nanosleep(&ts, NULL);
  CHECK_OK(tpurt_event_record(t1, s));
  CHECK_OK(tpurt_event_synchronize(t1));
  w1 = wall_ms();
  CHECK_OK(tpurt_event_elapsed_ms(t0, t1, &ms));
  CHECK(ms >= 19.5f && ms <= w1 - w0 + 0.5);

  /* cross-stream wait: s2's work runs after s's recorded work */
  atomic_store(&g_step, 0);
  atomic_store(&g_gate, 0);
  int zero = 0, one = 1;
  CHECK_OK(tpurt_launch(s, "gate", k_gate, NULL, 0));
  CHECK_OK(tpurt_launch(s, "step0", k_step, &zero, sizeof zero));
  CHECK_OK(tpurt_event_record(e, s));
  CHECK_OK(tpurt_stream_wait_event(s2, e));
  CHECK_OK(tpurt_launch(s2, "step1", k_step, &one, sizeof one));
  ts.tv_nsec = 5 * 1000000L;
  nanosleep(&ts, NULL);
  CHECK_EQ(tpurt_stream_query(s2), 0); /* blocked behind the event */
  atomic_store(&g_gate, 1);
  CHECK_OK(tpurt_stream_synchronize(s2));
  CHECK_OK(tpurt_stream_synchronize(s));
  CHECK_EQ(atomic_load(&g_step), 2);
  /* waiting on an event of the same stream is satisfied by FIFO order */
  atomic_store(&g_gate, 0);
  CHECK_OK(tpurt_launch(s, "gate", k_gate, NULL, 0));
  CHECK_OK(tpurt_event_record(e, s));
  CHECK_OK(tpurt_stream_wait_event(s, e));
  atomic_store(&g_gate, 1);
  CHECK_OK(tpurt_stream_synchronize(s));
  /* wait on a completed / never-recorded event is a no-op */
  tpurt_event *fresh;
  CHECK_OK(tpurt_event_create(0, &fresh));
  CHECK_OK(tpurt_stream_wait_event(s2, fresh));
  CHECK_OK(tpurt_stream_wait_event(s2, e));
  CHECK_OK(tpurt_stream_synchronize(s2));

  /* event synchronize returns the recorded stream's error */
  CHECK_OK(tpurt_launch(s2, "aten::bad", k_fail, NULL, 0));
  CHECK_OK(tpurt_event_record(fresh, s2));
  CHECK_ST(tpurt_event_synchronize(fresh), TPURT_ERR_KERNEL);
  CHECK_STR(tpurt_last_error(), "aten::bad: boom");
  CHECK_OK(tpurt_stream_synchronize(s2));

  /* an event seen complete implies its stream has passed it: the stream's
   * query agrees at once (no window where the event is done but not the stream) */
  for (int i = 0; i < 2000; ++i) {
    CHECK_OK(tpurt_event_record(fresh, s2));
    CHECK_OK(tpurt_event_synchronize(fresh));
    if (!tpurt_stream_query(s2)) {
      CHECK(0 && "stream not complete after its last event completed");
      break;
    }
  }

  /* destroy with pending records and waits */
  atomic_store(&g_gate, 0);
  tpurt_event *tmp;
  CHECK_OK(tpurt_event_create(TPURT_EVENT_TIMING, &tmp));
  CHECK_OK(tpurt_launch(s, "gate", k_gate, NULL, 0));
  CHECK_OK(tpurt_event_record(tmp, s));
  CHECK_OK(tpurt_stream_wait_event(s2, tmp));
  tpurt_event_destroy(tmp);
  atomic_store(&g_gate, 1);
  CHECK_OK(tpurt_device_synchronize(0));

  /* a synchronizing thread sleeps until the command it waits for, not
   * woken after every command: 100 kernels of 1 ms, then a synchronize
   * (the old wake-per-command made ~100 switches here) */
  int one_ms = 1;
  for (int i = 0; i < 100; i++) CHECK_OK(tpurt_launch(s, "sleep", k_sleep_ms, &one_ms, sizeof one_ms));
  struct rusage r0, r1;
  getrusage(RUSAGE_THREAD, &r0);
  CHECK_OK(tpurt_stream_synchronize(s));
  getrusage(RUSAGE_THREAD, &r1);
  CHECK(r1.ru_nvcsw - r0.ru_nvcsw < 20);
  /* the same for a producer that finds the ring full: it sleeps until
   * half of it has drained */
  int zero_ms = 0;
  atomic_store(&g_gate, 0);
  CHECK_OK(tpurt_launch(s, "gate", k_gate, NULL, 0));
  for (int i = 0; i < 1023; i++) CHECK_OK(tpurt_launch(s, "sleep", k_sleep_ms, &zero_ms, sizeof zero_ms));
  atomic_store(&g_gate, 1);
  getrusage(RUSAGE_THREAD, &r0);
  for (int i = 0; i < 600; i++) CHECK_OK(tpurt_launch(s, "sleep", k_sleep_ms, &zero_ms, sizeof zero_ms));
  getrusage(RUSAGE_THREAD, &r1);
  CHECK(r1.ru_nvcsw - r0.ru_nvcsw < 50);
  CHECK_OK(tpurt_stream_synchronize(s));

  tpurt_event_destroy(e);
  tpurt_event_destroy(t0);
  tpurt_event_destroy(t1);
  tpurt_event_destroy(fresh);
  tpurt_event_destroy(NULL);
  TEST_MAIN_END();
}
