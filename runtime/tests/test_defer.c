/* test_defer.c — DeferAndFuse: results identical to strict mode, fusion of
 * elementwise chains, intermediates that never take memory, plan cache
 * reuse with changing launch scalars, in-place and aliasing hazards, frees
 * of memory that recorded kernels still use, flush reasons, errors. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ew_progs.h"

static tpurt_stream *S;


static tpurt_scalar fsc(double v) {
  tpurt_scalar s;
  memset(&s, 0, sizeof s);
  s.kind = TPURT_SCALAR_FLOAT;
  s.re = v;
  return s;
}

#define N 10000

/* y = relu((a + b) * s) - a, with c and d intermediates freed before the
 * cut. Returns y (device). */
static tpurt_devptr g_mid[3];
static tpurt_devptr chain(tpurt_devptr a, tpurt_devptr b, float s, int free_mid) {
  tpurt_devptr c, d, e, y;
  CHECK_OK(tpurt_malloc(0, N * 4, S, &c));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &d));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &e));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &y));
  tpurt_view va = view1(a, N, 1), vb = view1(b, N, 1), vc = view1(c, N, 1), vd = view1(d, N, 1),
             ve = view1(e, N, 1), vy = view1(y, N, 1);
  tpurt_ew_program add = bin(TPURT_EW_ADD, 0), mul = bin(TPURT_EW_MUL, 1), sub = bin(TPURT_EW_SUB, 0),
                   relu = un(TPURT_EW_RELU);
  tpurt_view in2[2];
  in2[0] = va;
  in2[1] = vb;
  CHECK_OK(tpurt_elementwise(S, &add, &vc, in2, 2, NULL, 0));
  double sc = s;
  CHECK_OK(tpurt_elementwise(S, &mul, &vd, &vc, 1, &sc, 1));
  CHECK_OK(tpurt_elementwise(S, &relu, &ve, &vd, 1, NULL, 0));
  in2[0] = ve;
  in2[1] = va;
  CHECK_OK(tpurt_elementwise(S, &sub, &vy, in2, 2, NULL, 0));
  if (free_mid) {
    CHECK_OK(tpurt_free(c));
    CHECK_OK(tpurt_free(d));
    CHECK_OK(tpurt_free(e));
  } else {
    g_mid[0] = c;
    g_mid[1] = d;
    g_mid[2] = e;
  }
  return y;
}

static void fill_inputs(float *ha, float *hb) {
  for (int i = 0; i < N; i++) {
    ha[i] = (float)((i % 17) - 8) * 0.25f;
    hb[i] = (float)((i % 5) - 2) * 0.5f;
  }
}

static void check_chain(const float *hy, const float *ha, const float *hb, float s) {
  int bad = 0;
  for (int i = 0; i < N; i++) {
    float c = ha[i] + hb[i];
    float d = c * s;
    float e = d > 0 ? d : 0;
    float want = e - ha[i];
    if (hy[i] != want) bad++;
  }
  CHECK_EQ(bad, 0);
}

static void test_fusion_and_cache(void) {
  static float ha[N], hb[N], hy[N];
  fill_inputs(ha, hb);
  tpurt_devptr a, b;
  CHECK_OK(tpurt_malloc(0, N * 4, S, &a));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &b));
  CHECK_OK(tpurt_memcpy_h2d(S, a, ha, N * 4, 0));
  CHECK_OK(tpurt_memcpy_h2d(S, b, hb, N * 4, 0));
  CHECK_OK(tpurt_stream_synchronize(S));

  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  CHECK_EQ(tpurt_get_exec_mode(), TPURT_MODE_DEFER);
  tpurt_defer_reset_stats();
  tpurt_memory_stats m0;
  CHECK_OK(tpurt_memory_reset_peak(0));
  CHECK_OK(tpurt_memory_get_stats(0, &m0));
  for (int step = 0; step < 4; step++) {
    float s = 0.5f + (float)step; /* a launch scalar that changes every step */
    tpurt_devptr y = chain(a, b, s, 1);
    memset(hy, 0, sizeof hy);
    CHECK_OK(tpurt_memcpy_d2h(S, hy, y, N * 4, 0));
    check_chain(hy, ha, hb, s);
    CHECK_OK(tpurt_free(y));
  }
  tpurt_defer_stats st;
  tpurt_defer_get_stats(&st);
  CHECK_EQ(st.flushes[TPURT_FLUSH_TO_HOST], 4);
  CHECK_EQ(st.graphs_built, 1); /* one plan, */
  CHECK_EQ(st.cache_hits, 3);   /* reused with new scalars and buffers */
  CHECK_EQ(st.ops_recorded, 16);
  CHECK_EQ(st.fused_kernels, 4); /* the four ops ran as one kernel per step */
  CHECK_EQ(st.ops_fused, 16);
  CHECK_EQ(st.kernels_launched, 4);
  CHECK(st.stores_eliminated >= 12);
  CHECK(st.bytes_never_materialized >= 4ull * 3 * N * 4);
  tpurt_memory_stats m1;
  CHECK_OK(tpurt_memory_get_stats(0, &m1));
  /* intermediates never took memory: the peak grew by y only (rounded) */
  CHECK(m1.allocated_bytes[0].peak - m0.allocated_bytes[0].current <= 2 * N * 4);
  tpurt_flush_record r;
  CHECK(tpurt_defer_get_flush(0, &r));
  CHECK_EQ(r.reason, TPURT_FLUSH_TO_HOST);
  CHECK_EQ(r.ops, 4);
  CHECK_EQ(r.kernels, 1);
  CHECK_EQ(r.cache_hit, 1);

  /* the same chain with intermediates kept alive: their stores happen */
  tpurt_defer_reset_stats();
  tpurt_devptr y = chain(a, b, 2.0f, 0);
  CHECK_OK(tpurt_memcpy_d2h(S, hy, y, N * 4, 0));
  check_chain(hy, ha, hb, 2.0f);
  tpurt_defer_get_stats(&st);
  CHECK_EQ(st.stores_eliminated, 0);
  CHECK_EQ(st.graphs_built, 1); /* liveness differs: another plan */

  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  for (int i = 0; i < 3; i++) CHECK_OK(tpurt_free(g_mid[i]));
  CHECK_OK(tpurt_free(y));
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_free(b));
}

/* In-place chains and reads through a different view of a written buffer. */
static void test_hazards(void) {
  static float hx[N], hw[N];
  for (int i = 0; i < N; i++) hx[i] = (float)i;
  tpurt_devptr x, w;
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &x));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &w));
  CHECK_OK(tpurt_memcpy_h2d(S, x, hx, N * 4, 0)); /* staged */
  for (int i = 0; i < N; i++) hx[i] = -1.f;     /* the host buffer may change at once */
  tpurt_view vx = view1(x, N, 1), vw = view1(w, N, 1);
  tpurt_ew_program mul = bin(TPURT_EW_MUL, 1), add = bin(TPURT_EW_ADD, 0);
  double two = 2.0;
  /* x *= 2 (in place), then w = x + reversed(x): reversed view overlaps the
   * written x through another view -> must read memory after the store */
  CHECK_OK(tpurt_elementwise(S, &mul, &vx, &vx, 1, &two, 1));
  tpurt_view rev = view1(x + (uint64_t)(N - 1) * 4, N, -1);
  tpurt_view in2[2] = {vx, rev};
  CHECK_OK(tpurt_elementwise(S, &add, &vw, in2, 2, NULL, 0));
  /* x *= 2 again in place */
  CHECK_OK(tpurt_elementwise(S, &mul, &vx, &vx, 1, &two, 1));
  CHECK_OK(tpurt_memcpy_d2h(S, hw, w, N * 4, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, hx, x, N * 4, 0));
  int bad = 0;
  for (int i = 0; i < N; i++) {
    if (hw[i] != 2.f * i + 2.f * (N - 1 - i)) bad++;
    if (hx[i] != 4.f * i) bad++;
  }
  CHECK_EQ(bad, 0);
  CHECK_OK(tpurt_free(x));
  CHECK_OK(tpurt_free(w));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
}

/* Memory freed while recorded kernels still read it is released only after
 * they ran; events and synchronize cut the graph. */
static void test_frees_and_cuts(void) {
  static float h[N];
  for (int i = 0; i < N; i++) h[i] = 1.f + (float)i;
  tpurt_devptr a, y;
  CHECK_OK(tpurt_malloc(0, N * 4, S, &a)); /* real memory (strict) */
  CHECK_OK(tpurt_memcpy_h2d(S, a, h, N * 4, 0));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  tpurt_defer_reset_stats();
  CHECK_OK(tpurt_malloc(0, N * 4, S, &y));
  tpurt_view va = view1(a, N, 1), vy = view1(y, N, 1);
  tpurt_ew_program sq = un(TPURT_EW_SQUARE);
  CHECK_OK(tpurt_elementwise(S, &sq, &vy, &va, 1, NULL, 0));
  CHECK_OK(tpurt_free(a)); /* recorded as a marker */
  /* a new allocation must not get a's memory before the square ran */
  tpurt_devptr z;
  CHECK_OK(tpurt_malloc(0, N * 4, S, &z));
  tpurt_view vz = view1(z, N, 1);
  CHECK_OK(tpurt_fill(S, &vz, fsc(0.0)));
  tpurt_event *e;
  CHECK_OK(tpurt_event_create(0, &e));
  CHECK_OK(tpurt_event_record(e, S)); /* cut: event */
  CHECK_OK(tpurt_event_synchronize(e));
  tpurt_event_destroy(e);
  static float hy[N];
  CHECK_OK(tpurt_memcpy_d2h(S, hy, y, N * 4, 0));
  int bad = 0;
  for (int i = 0; i < N; i++) bad += hy[i] != h[i] * h[i];
  CHECK_EQ(bad, 0);
  tpurt_defer_stats st;
  tpurt_defer_get_stats(&st);
  CHECK_EQ(st.flushes[TPURT_FLUSH_EVENT], 1);
  /* explicit flush with nothing pending is a no-op; a sync cut */
  CHECK_OK(tpurt_fill(S, &vz, fsc(3.0)));
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_defer_get_stats(&st);
  CHECK_EQ(st.flushes[TPURT_FLUSH_SYNC], 1);
  CHECK_OK(tpurt_flush(0, TPURT_FLUSH_EXPLICIT));
  tpurt_defer_get_stats(&st);
  CHECK_EQ(st.flushes[TPURT_FLUSH_EXPLICIT], 0);
  tpurt_flush_record r;
  CHECK(tpurt_defer_get_flush(0, &r));
  CHECK_EQ(r.reason, TPURT_FLUSH_SYNC);
  /* size cap */
  tpurt_defer_set_max_ops(16);
  for (int i = 0; i < 40; i++) CHECK_OK(tpurt_fill(S, &vz, fsc((double)i)));
  tpurt_defer_get_stats(&st);
  CHECK_EQ(st.flushes[TPURT_FLUSH_SIZE_CAP], 1); /* then the ops repeat with period 1: */
  CHECK_EQ(st.flushes[TPURT_FLUSH_LOOP], 1);
  tpurt_defer_set_max_ops(8192);
  CHECK_OK(tpurt_memcpy_d2h(S, hy, z, 4, 0));
  CHECK_EQ(hy[0], 39.f);
  /* bad launches fail when recorded, as in strict mode */
  tpurt_view half = view1(z, N / 2, 1);
  CHECK_ST(tpurt_elementwise(S, &sq, &vy, &half, 1, NULL, 0), TPURT_ERR_INVALID_ARGUMENT);
  CHECK_OK(tpurt_free(y));
  CHECK_OK(tpurt_free(z));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  /* promises that lived on are ordinary memory afterwards */
  tpurt_memory_stats ms;
  CHECK_OK(tpurt_memory_get_stats(0, &ms));
  CHECK_EQ(ms.allocated_bytes[0].current, 0);
}

/* A loop with no cut of its own: after the first size-cap cut the period of
 * the recorded ops is found, later graphs are whole periods and reuse one
 * plan. */
static void test_loop_detection(void) {
  static float h[N];
  tpurt_devptr x;
  CHECK_OK(tpurt_malloc(0, N * 4, S, &x));
  tpurt_view vx = view1(x, N, 1);
  CHECK_OK(tpurt_fill(S, &vx, fsc(0.0)));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  tpurt_defer_reset_stats();
  tpurt_defer_set_max_ops(33);
  tpurt_ew_program mul = bin(TPURT_EW_MUL, 1), add = bin(TPURT_EW_ADD, 1);
  double half = 0.5, one = 1.0;
  float want = 0.f;
  for (int i = 0; i < 300; i++) {
    CHECK_OK(tpurt_elementwise(S, &mul, &vx, &vx, 1, &half, 1));
    CHECK_OK(tpurt_elementwise(S, &add, &vx, &vx, 1, &one, 1));
    want = want * 0.5f + 1.f;
  }
  CHECK_OK(tpurt_memcpy_d2h(S, h, x, N * 4, 0));
  CHECK_EQ(h[N - 1] == want, 1);
  tpurt_defer_stats st;
  tpurt_defer_get_stats(&st);
  CHECK_EQ(st.flushes[TPURT_FLUSH_SIZE_CAP], 1);
  CHECK(st.flushes[TPURT_FLUSH_LOOP] >= 15);
  CHECK(st.cache_hits >= st.flushes[TPURT_FLUSH_LOOP] - 1);
  CHECK(st.graphs_built <= 4);
  tpurt_defer_set_max_ops(8192);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  CHECK_OK(tpurt_free(x));
}

/* A kernel that waits until the test opens it (or 20 s pass: an error). */
static _Atomic int g_gate_open, g_gate_done, g_gate_entered;
static tpurt_status k_gate(void *args, char *err, size_t errlen) {
  (void)args;
  atomic_store(&g_gate_entered, 1);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!atomic_load(&g_gate_open)) {
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 20) {
      snprintf(err, errlen, "gate: never opened");
      atomic_store(&g_gate_done, 1);
      return TPURT_ERR_INTERNAL;
    }
    usleep(100);
  }
  atomic_store(&g_gate_done, 1);
  return TPURT_OK;
}
static void *open_gate_later(void *arg) {
  (void)arg;
  usleep(50000);
  atomic_store(&g_gate_open, 1);
  return NULL;
}

/* A device->host copy that cuts a graph runs right after the last kernel
 * that writes what it reads: the host gets the value while the rest of
 * the graph (here a kernel that waits for the host) still runs, and a
 * later write to part of the bytes (another view) still comes first. */
static void test_early_host_read(void) {
  static float h[N];
  tpurt_devptr a, b;
  tpurt_ew_program cp = un(TPURT_EW_NEG);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &a));
  CHECK_OK(tpurt_malloc(0, N * 4, S, &b));
  tpurt_view va = view1(a, N, 1), vb = view1(b, N, 1);
  CHECK_OK(tpurt_fill(S, &vb, fsc(-7.0)));
  CHECK_OK(tpurt_elementwise(S, &cp, &va, &vb, 1, NULL, 0)); /* a = 7 */
  atomic_store(&g_gate_open, 0);
  atomic_store(&g_gate_done, 0);
  CHECK_OK(tpurt_launch(S, "gate", k_gate, NULL, 0)); /* writes nothing it names */
  CHECK_OK(tpurt_fill(S, &vb, fsc(2.0)));
  CHECK_OK(tpurt_memcpy_d2h(S, h, a, N * 4, 0));
  CHECK_EQ(atomic_load(&g_gate_done), 0); /* the copy did not wait for the gate */
  int bad = 0;
  for (int i = 0; i < N; i++) bad += h[i] != 7.f;
  CHECK_EQ(bad, 0);
  atomic_store(&g_gate_open, 1);
  CHECK_OK(tpurt_memcpy_d2h(S, h, b, N * 4, 0));
  CHECK_EQ(h[0], 2.f);
  /* a = 1, gate, second half of a = 5 (another view): the copy of a waits
   * for the gate, which a thread opens later, and sees the 5s */
  atomic_store(&g_gate_open, 0);
  atomic_store(&g_gate_done, 0);
  CHECK_OK(tpurt_fill(S, &va, fsc(1.0)));
  CHECK_OK(tpurt_launch(S, "gate", k_gate, NULL, 0));
  tpurt_view hi = view1(a + (uint64_t)(N / 2) * 4, N / 2, 1);
  CHECK_OK(tpurt_fill(S, &hi, fsc(5.0)));
  pthread_t th;
  CHECK_EQ(pthread_create(&th, NULL, open_gate_later, NULL), 0);
  CHECK_OK(tpurt_memcpy_d2h(S, h, a, N * 4, 0));
  CHECK_EQ(atomic_load(&g_gate_done), 1);
  bad = 0;
  for (int i = 0; i < N; i++) bad += h[i] != (i < N / 2 ? 1.f : 5.f);
  CHECK_EQ(bad, 0);
  pthread_join(th, NULL);
  CHECK_OK(tpurt_free(a));
  CHECK_OK(tpurt_free(b));
  CHECK_OK(tpurt_stream_synchronize(S));
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
}

/* rsqrt(mean(x * x, last dim) + eps) over [rows, cols]: the square runs as
 * the mean's prologue, the rsqrt as its epilogue — one kernel, strict
 * mode's bits, the squares never in memory; `mode` the execution mode. */
static void rms_scale(tpurt_exec_mode mode, int64_t rows, int64_t cols, const float *hx, float *hy,
                      tpurt_defer_stats *st) {
  CHECK_OK(tpurt_set_exec_mode(mode));
  tpurt_devptr x, sq, m, y;
  CHECK_OK(tpurt_malloc(0, (size_t)(rows * cols) * 4, S, &x));
  CHECK_OK(tpurt_memcpy_h2d(S, x, hx, (size_t)(rows * cols) * 4, 0));
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_defer_reset_stats();
  CHECK_OK(tpurt_malloc(0, (size_t)(rows * cols) * 4, S, &sq));
  CHECK_OK(tpurt_malloc(0, (size_t)rows * 4, S, &m));
  CHECK_OK(tpurt_malloc(0, (size_t)rows * 4, S, &y));
  tpurt_view vx = view1(x, rows * cols, 1), vsq = view1(sq, rows * cols, 1), vm = view1(m, rows, 1),
             vy = view1(y, rows, 1);
  tpurt_ew_program square = un(TPURT_EW_SQUARE), add = bin(TPURT_EW_ADD, 1), rs = un(TPURT_EW_RSQRT);
  CHECK_OK(tpurt_elementwise(S, &square, &vsq, &vx, 1, NULL, 0));
  tpurt_view in2 = vsq, out2 = vm; /* [rows, cols] -> [rows, 1] */
  in2.ndim = out2.ndim = 2;
  in2.sizes[0] = out2.sizes[0] = rows;
  in2.sizes[1] = cols;
  in2.strides[0] = cols;
  in2.strides[1] = 1;
  out2.sizes[1] = 1;
  out2.strides[0] = 1;
  out2.strides[1] = 1;
  CHECK_OK(tpurt_reduce(S, TPURT_RED_MEAN, &out2, NULL, &in2, 0.0));
  CHECK_OK(tpurt_free(sq));
  double eps = 1e-6;
  CHECK_OK(tpurt_elementwise(S, &add, &vm, &vm, 1, &eps, 1)); /* in place */
  CHECK_OK(tpurt_elementwise(S, &rs, &vy, &vm, 1, NULL, 0));
  CHECK_OK(tpurt_memcpy_d2h(S, hy, y, (size_t)rows * 4, 0));
  tpurt_defer_get_stats(st);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
  CHECK_OK(tpurt_free(m));
  CHECK_OK(tpurt_free(y));
  CHECK_OK(tpurt_free(x));
}

static void test_reduction_fusion(void) {
  /* rows shorter than the walk's buffer (several per range) and longer */
  static const int64_t shapes[][2] = {{600, 100}, {40, 3000}};
  for (int k = 0; k < 2; k++) {
    int64_t rows = shapes[k][0], cols = shapes[k][1];
    float *hx = malloc(sizeof(float) * (size_t)(rows * cols)), *h0 = malloc(sizeof(float) * (size_t)rows),
          *h1 = malloc(sizeof(float) * (size_t)rows);
    CHECK(hx && h0 && h1);
    for (int64_t i = 0; i < rows * cols; i++) hx[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f;
    tpurt_defer_stats st;
    rms_scale(TPURT_MODE_STRICT, rows, cols, hx, h0, &st);
    rms_scale(TPURT_MODE_DEFER, rows, cols, hx, h1, &st);
    CHECK_EQ(memcmp(h0, h1, sizeof(float) * (size_t)rows), 0);
    CHECK_EQ(st.kernels_launched, 1); /* square, mean, add, rsqrt */
    CHECK(st.bytes_never_materialized >= (uint64_t)(rows * cols) * 4);
    free(hx);
    free(h0);
    free(h1);
  }
}

/* Another thread's synchronize and read while one thread runs the stream's
 * graph. Two threads record into one stream; the main thread cuts it. Its
 * run takes the graph off the stream and enqueues its launches: a gate,
 * 1500 launches of 100 us (more than the ring holds, so the run waits for
 * room while the gate is closed), a mark and a fill of y. The other thread
 * synchronizes and reads y meanwhile: it finds no pending graph on the
 * stream and must still wait for that run to enqueue the rest (before, it
 * waited only for the launches enqueued so far: the mark had not run, and
 * its read of y came before the fill, from a promise without memory yet). */
static tpurt_devptr g_y;
static float g_yh[N];
static _Atomic int g_marked, g_marked_at_sync;
static tpurt_status k_100us(void *args, char *err, size_t errlen) {
  (void)args, (void)err, (void)errlen;
  usleep(100);
  return TPURT_OK;
}
static tpurt_status k_mark(void *args, char *err, size_t errlen) {
  (void)args, (void)err, (void)errlen;
  atomic_store(&g_marked, 1);
  return TPURT_OK;
}
static void *sync_and_read_during_the_run(void *arg) {
  (void)arg;
  while (!atomic_load(&g_gate_entered)) usleep(100);
  usleep(20000); /* the run now waits for room in the ring */
  pthread_t opener;
  CHECK_EQ(pthread_create(&opener, NULL, open_gate_later, NULL), 0);
  CHECK_OK(tpurt_stream_synchronize(S));
  atomic_store(&g_marked_at_sync, atomic_load(&g_marked));
  CHECK_OK(tpurt_memcpy_d2h(S, g_yh, g_y, N * 4, 0));
  pthread_join(opener, NULL);
  return NULL;
}
static void test_sync_while_another_thread_runs_the_graph(void) {
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_DEFER));
  tpurt_defer_set_max_ops(4096);
  CHECK_OK(tpurt_malloc(0, N * 4, S, &g_y));
  tpurt_view vy = view1(g_y, N, 1);
  atomic_store(&g_gate_open, 0);
  atomic_store(&g_gate_done, 0);
  atomic_store(&g_gate_entered, 0);
  atomic_store(&g_marked, 0);
  CHECK_OK(tpurt_launch(S, "gate", k_gate, NULL, 0));
  for (int i = 0; i < 1500; i++) CHECK_OK(tpurt_launch(S, "100us", k_100us, NULL, 0));
  CHECK_OK(tpurt_launch(S, "mark", k_mark, NULL, 0));
  CHECK_OK(tpurt_fill(S, &vy, fsc(3.0)));
  pthread_t other;
  CHECK_EQ(pthread_create(&other, NULL, sync_and_read_during_the_run, NULL), 0);
  CHECK_OK(tpurt_flush(0, TPURT_FLUSH_EXPLICIT));
  pthread_join(other, NULL);
  CHECK_EQ(atomic_load(&g_gate_done), 1);
  CHECK_EQ(atomic_load(&g_marked_at_sync), 1);
  int bad = 0;
  for (int i = 0; i < N; i++) bad += g_yh[i] != 3.f;
  CHECK_EQ(bad, 0);
  CHECK_OK(tpurt_free(g_y));
  CHECK_OK(tpurt_stream_synchronize(S));
  tpurt_defer_set_max_ops(8192);
  CHECK_OK(tpurt_set_exec_mode(TPURT_MODE_STRICT));
}

int main(void) {
  CHECK_OK(tpurt_init());
  CHECK_OK(tpurt_stream_default(0, &S));
  tpurt_memory_stats ms;
  test_fusion_and_cache();
  CHECK_OK(tpurt_memory_get_stats(0, &ms));
  CHECK_EQ(ms.allocated_bytes[0].current, 0);
  test_hazards();
  CHECK_OK(tpurt_memory_get_stats(0, &ms));
  CHECK_EQ(ms.allocated_bytes[0].current, 0);
  test_frees_and_cuts();
  test_loop_detection();
  test_early_host_read();
  test_sync_while_another_thread_runs_the_graph();
  test_reduction_fusion();
  CHECK_OK(tpurt_memory_get_stats(0, &ms));
  CHECK_EQ(ms.allocated_bytes[0].current, 0);
  CHECK_ST(tpurt_set_exec_mode((tpurt_exec_mode)7), TPURT_ERR_INVALID_ARGUMENT);
  TEST_MAIN_END();
}
