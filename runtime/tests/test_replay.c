/* test_replay.c — capture and replay of a recorded graph (tpurt_replay.h):
 * a recording becomes a template, a second recording on other buffers
 * verifies it, a replay on a third pair of buffers gives the bits strict
 * mode gives and fresh output memory; what cannot be a template is refused
 * with a reason; a recording that differs does not verify; overlapping
 * inputs are refused at replay; memory comes back. A replay's launches
 * (handed to the stream's worker in batches) still run one by one in
 * order, each timed and traced under its own name and number, an error in
 * one is raised at the next synchronization naming it, and an event
 * recorded after a replay orders another stream's work after all of it. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>

#include "check.h"
#include "ew_progs.h"
#include "tpurt_replay.h"

static tpurt_stream *S;

#define N 5000

/* One call: y = a * b + s (the product freed unless keep_mid); returns y. */
static tpurt_devptr call(tpurt_devptr a, tpurt_devptr b, double s, int keep_mid, tpurt_devptr *mid) {
  tpurt_devptr c, y;
  CHECK_OK(tpurt_malloc(0, N * 4, S, &c));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &y));
  tpurt_view va = view1(a, N, 1), vb = view1(b, N, 1), vc = view1(c, N, 1), vy = view1(y, N, 1);
  tpurt_view in2[2] = {va, vb};
  tpurt_ew_program mul = bin(TPURT_EW_MUL, 0), add = bin(TPURT_EW_ADD, 1);
  double sc = s;
  CHECK_OK(tpurt_elementwise(S, &mul, &vc, in2, 2, NULL, 0));
  CHECK_OK(tpurt_elementwise(S, &add, &vy, &vc, 1, &sc, 1));
  if (keep_mid)
    *mid = c;
  else
    CHECK_OK(tpurt_free(c));
  return y;
}

static tpurt_devptr dev_of(const float *h) {
  tpurt_devptr p;
  CHECK_OK(tpurt_malloc(0, N * 4, S, &p));
  CHECK_OK(tpurt_memcpy_h2d(S, p, h, N * 4, 0));
  return p;
}

static void read_back(tpurt_devptr p, float *h) {
  CHECK_OK(tpurt_memcpy_d2h(S, h, p, N * 4, 0));
  CHECK_OK(tpurt_stream_synchronize(S));
}

static float ha[3][N], hb[3][N];

static void test_capture_verify_replay(void) {
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < N; i++) {
      ha[k][i] = (float)(i % 97) * 0.25f - 3.0f + (float)k;
      hb[k][i] = (float)(i % 13) * 0.5f - 1.0f - (float)k;
    }
  tpurt_devptr a[3], b[3];
  for (int k = 0; k < 3; k++) a[k] = dev_of(ha[k]), b[k] = dev_of(hb[k]);
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_memory_stats m0, m1;
  CHECK_OK(tpurt_memory_get_stats(0, &m0));
  uint64_t bytes[2] = {N * 4, N * 4};
  char why[256];

  /* call 1: the template */
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  tpurt_devptr y1 = call(a[0], b[0], 0.5, 0, NULL);
  tpurt_devptr in1[2] = {a[0], b[0]};
  tpurt_replay *r = NULL;
  CHECK_OK(tpurt_replay_capture(0, in1, bytes, 2, &y1, 1, NULL, &r, why, sizeof why));
  CHECK(r != NULL);
  CHECK(!tpurt_replay_verified(r));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT)); /* the cut */

  /* an unverified template does not run */
  tpurt_devptr out = 0;
  int refused = 0;
  tpurt_devptr in3[2] = {a[2], b[2]};
  CHECK_OK(tpurt_replay_run(r, in3, 2, &out, NULL, &refused));
  CHECK_EQ(refused, 1);

  /* call 2 on other buffers verifies it */
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  tpurt_devptr y2 = call(a[1], b[1], 0.5, 0, NULL);
  tpurt_devptr in2[2] = {a[1], b[1]};
  CHECK_EQ(tpurt_replay_matches(r, in2, 2, &y2, 1, NULL, why, sizeof why), 1);
  CHECK(tpurt_replay_verified(r));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));

  /* replay on the third pair: strict mode's bits, fresh memory */
  tpurt_defer_stats st0, st1;
  tpurt_defer_get_stats(&st0);
  CHECK_OK(tpurt_replay_run(r, in3, 2, &out, NULL, &refused));
  CHECK_EQ(refused, 0);
  CHECK(out != 0 && out != y1 && out != y2);
  tpurt_defer_get_stats(&st1);
  CHECK_EQ(st1.ops_recorded, st0.ops_recorded); /* nothing recorded */
  CHECK_EQ(st1.cache_hits, st0.cache_hits + 1);  /* the template's plan ran */
  static float got[N], want[N];
  read_back(out, got);
  tpurt_devptr ys = call(a[2], b[2], 0.5, 0, NULL); /* strict */
  read_back(ys, want);
  CHECK_EQ(memcmp(got, want, sizeof got), 0);
  CHECK_EQ(got[7], ha[2][7] * hb[2][7] + 0.5f);

  /* a second replay on the first pair, while the first output lives */
  tpurt_devptr out2 = 0;
  CHECK_OK(tpurt_replay_run(r, in1, 2, &out2, NULL, &refused));
  CHECK_EQ(refused, 0);
  CHECK(out2 != out);
  read_back(out2, got);
  read_back(y1, want);
  CHECK_EQ(memcmp(got, want, sizeof got), 0);

  /* overlapping inputs: refused, nothing runs */
  tpurt_devptr ov[2] = {a[2], a[2] + 64};
  tpurt_devptr none = 0;
  CHECK_OK(tpurt_replay_run(r, ov, 2, &none, NULL, &refused));
  CHECK_EQ(refused, 1);
  CHECK_EQ(none, 0);

  tpurt_devptr done[5] = {out, out2, ys, y1, y2};
  for (int k = 0; k < 5; k++) CHECK_OK(tpurt_free(done[k]));
  CHECK_OK(tpurt_stream_synchronize(S));
  CHECK_OK(tpurt_memory_get_stats(0, &m1));
  CHECK_EQ(m1.allocated_bytes[0].current, m0.allocated_bytes[0].current);
  tpurt_replay_destroy(r);
  for (int k = 0; k < 3; k++) {
    CHECK_OK(tpurt_free(a[k]));
    CHECK_OK(tpurt_free(b[k]));
  }
}

static void test_refusals(void) {
  float h[N];
  for (int i = 0; i < N; i++) h[i] = (float)i;
  tpurt_devptr a = dev_of(h), b = dev_of(h), c = dev_of(h);
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_devptr in[2] = {a, b};
  uint64_t bytes[2] = {N * 4, N * 4};
  char why[256];
  tpurt_replay *r = NULL;

  /* a value other than the outputs still held */
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  tpurt_devptr mid = 0, y = call(a, b, 1.0, 1, &mid);
  CHECK_OK(tpurt_replay_capture(0, in, bytes, 2, &y, 1, NULL, &r, why, sizeof why));
  CHECK(r == NULL);
  CHECK(strstr(why, "still held") != NULL);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  CHECK_OK(tpurt_free(mid));
  CHECK_OK(tpurt_free(y));

  /* host data copied in */
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  CHECK_OK(tpurt_memcpy_h2d(S, c, h, N * 4, 0));
  y = call(a, b, 1.0, 0, NULL);
  CHECK_OK(tpurt_replay_capture(0, in, bytes, 2, &y, 1, NULL, &r, why, sizeof why));
  CHECK(r == NULL);
  CHECK(strstr(why, "host data") != NULL);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  CHECK_OK(tpurt_free(y));

  /* an output that is an input */
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  y = call(a, b, 1.0, 0, NULL);
  CHECK_OK(tpurt_replay_capture(0, in, bytes, 2, &a, 1, NULL, &r, why, sizeof why));
  CHECK(r == NULL);
  CHECK(strstr(why, "not a value the graph computes") != NULL);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  CHECK_OK(tpurt_free(y));

  /* inputs sharing memory */
  tpurt_devptr sh[2] = {a, a + 16};
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  y = call(a, b, 1.0, 0, NULL);
  CHECK_OK(tpurt_replay_capture(0, sh, bytes, 2, &y, 1, NULL, &r, why, sizeof why));
  CHECK(r == NULL);
  CHECK(strstr(why, "share memory") != NULL);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  CHECK_OK(tpurt_free(y));

  /* a recording with another launch scalar does not verify */
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  y = call(a, b, 1.0, 0, NULL);
  CHECK_OK(tpurt_replay_capture(0, in, bytes, 2, &y, 1, NULL, &r, why, sizeof why));
  CHECK(r != NULL);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  CHECK_OK(tpurt_free(y));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  y = call(a, b, 2.0, 0, NULL);
  CHECK_EQ(tpurt_replay_matches(r, in, 2, &y, 1, NULL, why, sizeof why), 0);
  CHECK(strstr(why, "scalars") != NULL);
  CHECK(!tpurt_replay_verified(r));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  CHECK_OK(tpurt_free(y));
  tpurt_replay_destroy(r);
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_free(b));
  CHECK_OK(tpurt_free(c));
}

/* ------------------------------------------- the launches of a replay */

#define NSTEPS 40 /* more than the first few batches hold (1, 2, 4, ...) */

/* What the step kernels saw, in the order the worker ran them. */
static struct {
  _Atomic int n;
  int log[4 * NSTEPS];
  int fail; /* the step that reports an error (-1: none) */
} C;

typedef struct {
  int id, pad;
  void *c; /* (a host address: kept as it is by the template) */
} step_args;

static char step_names[NSTEPS][16];

static tpurt_status k_step(void *a, char *e, size_t n) {
  const step_args *s = a;
  int k = atomic_fetch_add(&C.n, 1);
  if (k < 4 * NSTEPS) C.log[k] = s->id;
  if (C.fail == s->id) {
    snprintf(e, n, "index 9 is out of bounds for dimension 0 with size 4");
    return TPURT_ERR_INDEX;
  }
  return TPURT_OK;
}

static void step(int id) {
  step_args a;
  memset(&a, 0, sizeof a);
  a.id = id;
  a.c = &C;
  CHECK_OK(tpurt_launch(S, step_names[id], k_step, &a, sizeof a));
}

/* One call: half the steps, y = a * b + 0.5, the other half. */
static tpurt_devptr call_steps(tpurt_devptr a, tpurt_devptr b) {
  for (int k = 0; k < NSTEPS / 2; k++) step(k);
  tpurt_devptr y = call(a, b, 0.5, 0, NULL);
  for (int k = NSTEPS / 2; k < NSTEPS; k++) step(k);
  return y;
}

typedef struct {
  int *seen;
} seen_args;

static tpurt_status k_seen(void *a, char *e, size_t n) {
  (void)e, (void)n;
  *((seen_args *)a)->seen = atomic_load(&C.n);
  return TPURT_OK;
}

static void check_steps_in_order(void) {
  CHECK_EQ(atomic_load(&C.n), NSTEPS);
  for (int k = 0; k < NSTEPS; k++) CHECK_EQ(C.log[k], k);
}

static void test_replay_launches(void) {
  for (int k = 0; k < NSTEPS; k++) snprintf(step_names[k], sizeof step_names[k], "step%d", k);
  C.fail = -1;
  static float h[N];
  for (int i = 0; i < N; i++) h[i] = (float)(i % 7);
  tpurt_devptr a[3], b[3];
  for (int k = 0; k < 3; k++) a[k] = dev_of(h), b[k] = dev_of(h);
  uint64_t bytes[2] = {N * 4, N * 4};
  char why[256];
  tpurt_replay *r = NULL;
  tpurt_devptr y[2];
  for (int k = 0; k < 2; k++) { /* the template, then its verification */
    CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
    y[k] = call_steps(a[k], b[k]);
    tpurt_devptr in[2] = {a[k], b[k]};
    if (k == 0)
      CHECK_OK(tpurt_replay_capture(0, in, bytes, 2, &y[0], 1, NULL, &r, why, sizeof why));
    else
      CHECK_EQ(tpurt_replay_matches(r, in, 2, &y[1], 1, NULL, why, sizeof why), 1);
    CHECK(r != NULL);
    CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  }
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_devptr in3[2] = {a[2], b[2]};
  int refused = 1;
  tpurt_devptr out = 0;

  /* in order, each traced under its own name and number */
  atomic_store(&C.n, 0);
  CHECK_OK(tpurt_trace_start(1 << 14));
  CHECK_OK(tpurt_replay_run(r, in3, 2, &out, NULL, &refused));
  CHECK_EQ(refused, 0);
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_trace_stop();
  check_steps_in_order();
  static tpurt_trace_event ev[1 << 14];
  uint64_t dropped = 0;
  size_t nev = tpurt_trace_read(ev, 1 << 14, &dropped);
  CHECK_EQ(dropped, 0);
  uint64_t kseq[NSTEPS] = {0}, lseq[NSTEPS] = {0};
  for (size_t i = 0; i < nev; i++)
    for (int k = 0; k < NSTEPS; k++)
      if (ev[i].name && !strcmp(ev[i].name, step_names[k])) {
        uint64_t *at = ev[i].kind == TPURT_TRACE_KERNEL ? &kseq[k] : ev[i].kind == TPURT_TRACE_LAUNCH ? &lseq[k] : NULL;
        if (!at) continue;
        CHECK_EQ(*at, 0); /* once */
        *at = ev[i].seq;
      }
  for (int k = 0; k < NSTEPS; k++) {
    CHECK(kseq[k] != 0);
    CHECK_EQ(kseq[k], lseq[k]); /* the launch and its run: one command number */
    if (k) CHECK(kseq[k] > kseq[k - 1]);
  }
  CHECK_OK(tpurt_free(out));

  /* an event recorded after a replay: another stream's work waits for all of it */
  tpurt_stream *s2 = NULL;
  CHECK_OK(tpurt_stream_from_pool(0, 0, &s2));
  tpurt_event *e = NULL;
  CHECK_OK(tpurt_event_create(0, &e));
  int seen = -1;
  seen_args sa = {&seen};
  atomic_store(&C.n, 0);
  CHECK_OK(tpurt_replay_run(r, in3, 2, &out, NULL, &refused));
  CHECK_EQ(refused, 0);
  CHECK_OK(tpurt_event_record(e, S));
  CHECK_OK(tpurt_stream_wait_event(s2, e));
  CHECK_OK(tpurt_launch(s2, "seen", k_seen, &sa, sizeof sa));
  CHECK_OK(tpurt_stream_synchronize(s2));
  CHECK_EQ(seen, NSTEPS);
  CHECK_OK(tpurt_stream_synchronize(S));
  check_steps_in_order();
  tpurt_event_destroy(e);
  CHECK_OK(tpurt_free(out));

  /* an error: raised at the next synchronization, naming the launch; the
   * launches after it still run, as they do outside a replay */
  atomic_store(&C.n, 0);
  C.fail = 29;
  CHECK_OK(tpurt_replay_run(r, in3, 2, &out, NULL, &refused));
  CHECK_EQ(refused, 0);
  CHECK_ST(tpurt_stream_synchronize(S), TPURT_ERR_INDEX);
  CHECK(strstr(tpurt_last_error(), "step29: index 9 is out of bounds") != NULL);
  check_steps_in_order();
  CHECK_OK(tpurt_stream_synchronize(S)); /* reported once */
  C.fail = -1;
  CHECK_OK(tpurt_free(out));

  /* under launch blocking (no batches) the same */
  tpurt_set_launch_blocking(1);
  atomic_store(&C.n, 0);
  CHECK_OK(tpurt_replay_run(r, in3, 2, &out, NULL, &refused));
  CHECK_EQ(refused, 0);
  CHECK_OK(tpurt_stream_synchronize(S));
  check_steps_in_order();
  tpurt_set_launch_blocking(0);
  CHECK_OK(tpurt_free(out));

  tpurt_replay_destroy(r);
  for (int k = 0; k < 2; k++) CHECK_OK(tpurt_free(y[k]));
  for (int k = 0; k < 3; k++) {
    CHECK_OK(tpurt_free(a[k]));
    CHECK_OK(tpurt_free(b[k]));
  }
}

int main(void) {
  CHECK_OK(tpurt_init());
  S = tpurt_stream_current(0);
  CHECK(S != NULL);
  test_capture_verify_replay();
  test_refusals();
  test_replay_launches();
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_memory_stats ms;
  CHECK_OK(tpurt_memory_get_stats(0, &ms));
  CHECK_EQ(ms.allocated_bytes[0].current, 0);
  TEST_MAIN_END();
}
