/* test_stream.c — streams: async launch, FIFO order, synchronize, query,
 * argument copies (inline and heap), error capture and reporting, stream
 * pool / ids / current stream, launch blocking (argv[1] == "blocking"). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "check.h"

static _Atomic int g_gate;
static _Atomic int g_counter;
static int g_order[2000];
static _Atomic int g_norder;

static tpurt_status k_gate(void *a, char *e, size_t n) {
  while (!atomic_load(&g_gate)) sched_yield();
  return TPURT_OK;
}
static tpurt_status k_append(void *a, char *e, size_t n) {
  int v;
  memcpy(&v, a, sizeof v);
  g_order[atomic_fetch_add(&g_norder, 1)] = v;
  return TPURT_OK;
}
typedef struct {
  int id;
  unsigned char payload[4000];
} big_args;
static tpurt_status k_big(void *a, char *e, size_t n) {
  big_args *b = a;
  for (int i = 0; i < 4000; i++)
    if (b->payload[i] != (unsigned char)(i * 7 + b->id)) {
      snprintf(e, n, "payload mismatch at %d", i);
      return TPURT_ERR_KERNEL;
    }
  atomic_fetch_add(&g_counter, 1);
  return TPURT_OK;
}
static tpurt_status k_fail(void *a, char *e, size_t n) {
  int v;
  memcpy(&v, a, sizeof v);
  snprintf(e, n, "index %d is out of bounds", v);
  return TPURT_ERR_INDEX;
}
static tpurt_status k_count(void *a, char *e, size_t n) {
  atomic_fetch_add(&g_counter, 1);
  return TPURT_OK;
}

static void *producer(void *arg) {
  tpurt_stream *s = arg;
  for (int i = 0; i < 3000; i++) tpurt_launch(s, "count", k_count, NULL, 0);
  return NULL;
}

static void blocking_mode(void) {
  CHECK_EQ(tpurt_launch_blocking(), 1);
  tpurt_stream *s;
  CHECK_OK(tpurt_stream_default(0, &s));
  int v = 5;
  CHECK_ST(tpurt_launch(s, "aten::index", k_fail, &v, sizeof v), TPURT_ERR_INDEX);
  CHECK_STR(tpurt_last_error(), "aten::index: index 5 is out of bounds");
  CHECK_OK(tpurt_stream_synchronize(s)); /* already consumed */
  atomic_store(&g_counter, 0);
  CHECK_OK(tpurt_launch(s, "count", k_count, NULL, 0));
  CHECK_EQ(atomic_load(&g_counter), 1); /* completed on return */
  tpurt_set_launch_blocking(0);
  CHECK_OK(tpurt_launch(s, "aten::index", k_fail, &v, sizeof v));
  CHECK_ST(tpurt_stream_synchronize(s), TPURT_ERR_INDEX);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "blocking")) {
    blocking_mode();
    TEST_MAIN_END();
  }
  tpurt_stream *s, *s2, *p1, *p2;
  CHECK_OK(tpurt_stream_default(0, &s));
  CHECK_EQ(tpurt_stream_id(s), 0);
  CHECK_EQ(tpurt_stream_device(s), 0);
  CHECK(tpurt_stream_current(0) == s);
  CHECK(tpurt_stream_current(3) == NULL);
  CHECK_OK(tpurt_stream_get(0, 0, &s2));
  CHECK(s2 == s);
  CHECK_ST(tpurt_stream_get(0, 9, &s2), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_ST(tpurt_stream_get(1, 0, &s2), TPURT_ERR_INVALID_DEVICE);
  /* pool round robin: ids 1..8 */
  int seen[9] = {0};
  for (int i = 0; i < 16; i++) {
    CHECK_OK(tpurt_stream_from_pool(0, 0, &p1));
    int64_t id = tpurt_stream_id(p1);
    CHECK(id >= 1 && id <= 8);
    if (id >= 1 && id <= 8) seen[id]++;
  }
  for (int i = 1; i <= 8; i++) CHECK_EQ(seen[i], 2);
  CHECK_OK(tpurt_stream_get(0, 3, &p1));
  CHECK_EQ(tpurt_stream_id(p1), 3);
  CHECK_OK(tpurt_stream_get(0, 4, &p2));
  /* current stream */
  CHECK_OK(tpurt_stream_set_current(p1));
  CHECK(tpurt_stream_current(0) == p1);
  CHECK_ST(tpurt_stream_set_current(NULL), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_stream_set_current(s));
  CHECK(tpurt_stream_current(0) == s);

  /* async: launch returns before completion */
  atomic_store(&g_gate, 0);
  atomic_store(&g_counter, 0);
  CHECK_OK(tpurt_launch(s, "gate", k_gate, NULL, 0));
  CHECK_OK(tpurt_launch(s, "count", k_count, NULL, 0));
  CHECK_EQ(tpurt_stream_query(s), 0);
  CHECK_EQ(atomic_load(&g_counter), 0);
  CHECK_EQ(tpurt_stream_query(p2), 1);
  atomic_store(&g_gate, 1);
  CHECK_OK(tpurt_stream_synchronize(s));
  CHECK_EQ(tpurt_stream_query(s), 1);
  CHECK_EQ(atomic_load(&g_counter), 1);

  /* FIFO order, more commands than ring slots */
  atomic_store(&g_norder, 0);
  for (int i = 0; i < 2000; i++) CHECK_OK(tpurt_launch(s, "append", k_append, &i, sizeof i));
  CHECK_OK(tpurt_stream_synchronize(s));
  CHECK_EQ(atomic_load(&g_norder), 2000);
  int in_order = 1;
  for (int i = 0; i < 2000; i++) in_order &= g_order[i] == i;
  CHECK(in_order);

  /* args bigger than the inline space are copied too */
  atomic_store(&g_counter, 0);
  static big_args ba;
  for (int k = 0; k < 3; k++) {
    ba.id = k;
    for (int i = 0; i < 4000; i++) ba.payload[i] = (unsigned char)(i * 7 + k);
    CHECK_OK(tpurt_launch(p1, "big", k_big, &ba, sizeof ba));
    memset(&ba, 0, sizeof ba); /* launch copied it */
  }
  CHECK_OK(tpurt_stream_synchronize(p1));
  CHECK_EQ(atomic_load(&g_counter), 3);

  /* errors: first one kept, reported at sync with the op name, then cleared */
  int v = 7, w = 8;
  atomic_store(&g_counter, 0);
  CHECK_OK(tpurt_launch(s, "aten::index", k_fail, &v, sizeof v));
  CHECK_OK(tpurt_launch(s, "aten::gather", k_fail, &w, sizeof w));
  CHECK_OK(tpurt_launch(s, "count", k_count, NULL, 0)); /* still runs */
  CHECK_ST(tpurt_stream_synchronize(s), TPURT_ERR_INDEX);
  CHECK_STR(tpurt_last_error(), "aten::index: index 7 is out of bounds");
  CHECK_EQ(atomic_load(&g_counter), 1);
  CHECK_OK(tpurt_stream_synchronize(s));
  CHECK_OK(tpurt_launch(s, "count", k_count, NULL, 0));
  CHECK_OK(tpurt_stream_synchronize(s));
  CHECK_EQ(atomic_load(&g_counter), 2);
  /* device synchronize reports an error of any stream of the device */
  CHECK_OK(tpurt_launch(p2, "aten::scatter", k_fail, &v, sizeof v));
  CHECK_ST(tpurt_device_synchronize(0), TPURT_ERR_INDEX);
  CHECK_STR(tpurt_last_error(), "aten::scatter: index 7 is out of bounds");
  CHECK_OK(tpurt_device_synchronize(0));
  CHECK_ST(tpurt_device_synchronize(2), TPURT_ERR_INVALID_DEVICE);
  /* NULL stream = current stream */
  CHECK_OK(tpurt_launch(NULL, "count", k_count, NULL, 0));
  CHECK_OK(tpurt_stream_synchronize(NULL));
  CHECK_EQ(atomic_load(&g_counter), 3);
  CHECK_ST(tpurt_launch(s, "x", NULL, NULL, 0), TPURT_ERR_INVALID_ARGUMENT);

  /* concurrent producers on one stream */
  atomic_store(&g_counter, 0);
  pthread_t th[3];
  for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, producer, s);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  CHECK_OK(tpurt_stream_synchronize(s));
  CHECK_EQ(atomic_load(&g_counter), 9000);
  TEST_MAIN_END();
}
