/* test_trace.c — the trace ring: nothing recorded while off; kernels with
 * their launches (same seq), names and device time; copies and memory
 * samples; the ring keeps the latest events when full and counts the rest;
 * a bad capacity is refused and the ring stays usable. */
#include "check.h"

static tpurt_status k_spin(void *a, char *e, size_t n) {
  volatile double x = 0;
  for (int i = 0; i < 20000; i++) x += i * 0.5;
  return TPURT_OK;
}

static size_t read_all(tpurt_trace_event **out, uint64_t *dropped) {
  size_t n = tpurt_trace_count();
  *out = calloc(n ? n : 1, sizeof **out);
  return tpurt_trace_read(*out, n, dropped);
}

int main(void) {
  tpurt_stream *s;
  CHECK_OK(tpurt_stream_default(0, &s));
  int one = 1;
  /* off: nothing */
  CHECK_OK(tpurt_trace_start(64));
  tpurt_trace_stop();
  CHECK_OK(tpurt_launch(s, "spin", k_spin, &one, sizeof one));
  CHECK_OK(tpurt_stream_synchronize(s));
  CHECK_EQ(tpurt_trace_count(), 0);
  CHECK(!tpurt_trace_enabled());

  /* on: three kernels, a copy each way, memory samples */
  CHECK_OK(tpurt_trace_start(4096));
  CHECK(tpurt_trace_enabled());
  int64_t t0 = tpurt_trace_now_ns();
  tpurt_trace_set_corr(42);
  for (int i = 0; i < 3; i++) CHECK_OK(tpurt_launch(s, "spin", k_spin, &one, sizeof one));
  tpurt_trace_set_corr(0);
  tpurt_devptr p;
  CHECK_OK(tpurt_malloc(0, 4096, s, &p));
  char host[4096] = {1};
  CHECK_OK(tpurt_memcpy_h2d(s, p, host, sizeof host, 0));
  CHECK_OK(tpurt_memcpy_d2h(s, host, p, sizeof host, 0));
  CHECK_OK(tpurt_free(p));
  CHECK_OK(tpurt_stream_synchronize(s));
  tpurt_trace_stop();
  tpurt_trace_event *ev;
  uint64_t dropped = 1;
  size_t n = read_all(&ev, &dropped);
  CHECK_EQ(dropped, 0);
  int kernels = 0, launches = 0, copies = 0, mem = 0, matched = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK(ev[i].ts_ns >= t0);
    if (ev[i].kind == TPURT_TRACE_KERNEL && !strcmp(ev[i].name, "spin")) {
      kernels++;
      CHECK(ev[i].dur_ns > 0);
      CHECK_EQ(ev[i].dev, 0);
      CHECK_EQ(ev[i].stream, 0);
      for (size_t j = 0; j < n; j++)
        if (ev[j].kind == TPURT_TRACE_LAUNCH && ev[j].seq == ev[i].seq && ev[j].corr == 42) {
          matched++;
          CHECK(ev[j].ts_ns <= ev[i].ts_ns);
        }
    }
    if (ev[i].kind == TPURT_TRACE_LAUNCH && !strcmp(ev[i].name, "spin")) launches++;
    if (ev[i].kind == TPURT_TRACE_COPY) {
      copies++;
      CHECK_EQ(ev[i].a, 4096);
      CHECK(ev[i].b == 0 || ev[i].b == 1);
    }
    if (ev[i].kind == TPURT_TRACE_MEMORY) {
      mem++;
      CHECK(ev[i].b >= ev[i].a);
    }
  }
  CHECK_EQ(kernels, 3);
  CHECK_EQ(launches, 3);
  CHECK_EQ(matched, 3);
  CHECK_EQ(copies, 2);
  CHECK(mem >= 2);
  free(ev);

  /* full ring: the latest events stay, the rest are counted */
  CHECK_OK(tpurt_trace_start(16));
  for (int i = 0; i < 40; i++) CHECK_OK(tpurt_launch(s, "spin", k_spin, &one, sizeof one));
  CHECK_OK(tpurt_stream_synchronize(s));
  tpurt_trace_stop();
  n = read_all(&ev, &dropped);
  CHECK_EQ(n + dropped, 80); /* 40 launches + 40 kernels */
  CHECK(n <= 16 && n >= 8);
  for (size_t i = 1; i < n; i++) CHECK(ev[i].ts_ns >= ev[0].ts_ns - 1000000000LL);
  free(ev);

  CHECK_ST(tpurt_trace_start((size_t)1 << 40), TPURT_ERR_INVALID_ARGUMENT);
  CHECK(!tpurt_trace_enabled());
  CHECK_OK(tpurt_trace_start(0));
  tpurt_trace_stop();
  TEST_MAIN_END();
}
