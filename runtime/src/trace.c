/*
 * trace.c — the runtime's event ring for the profiler (tpurt_trace_* in
 * tpurt.h): kernels as the stream workers ran them, launches with the host
 * op that enqueued them, the ops a fused launch contains, DeferAndFuse cuts
 * and plan builds, kernel compiles and kernel-cache hits, host<->device
 * copies and memory counter samples.
 *
 * Cost when off: every hook in the other modules is behind
 * TPURT__TRACE_ON(), one relaxed load of a flag that stays 0, so the branch
 * is predicted and nothing else runs. On: a writer takes a slot with one
 * atomic add on the ring's counter and fills it; no lock. Each slot's
 * stamp (its ticket + 1, stored last with release) lets the reader skip a
 * slot a late writer is still filling or one a wrapped ring reused. When
 * the ring is full the oldest events are overwritten and counted as
 * dropped: a long run keeps its latest window.
 *
 * The ring belongs to one tracing session: tpurt_trace_start allocates a
 * fresh one (the previous is freed: start is called by one profiler at a
 * time, with no writer in flight because tracing was off).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

typedef struct {
  _Atomic uint64_t stamp; /* ticket + 1 once the slot is written */
  tpurt_trace_event ev;
} trace_slot;

_Atomic int tpurt__trace_on;
_Thread_local uint64_t tpurt__trace_corr;
_Thread_local uint64_t tpurt__trace_ctx;
static trace_slot *g_ring;
static size_t g_cap; /* power of two */
static _Atomic uint64_t g_next;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

#define MAX_MEMBERS 256
static _Thread_local uint64_t t_members[MAX_MEMBERS];
static _Thread_local int t_nmembers;
static _Thread_local int32_t t_tid;

static int32_t thread_id(void) {
  if (!t_tid) t_tid = (int32_t)syscall(SYS_gettid);
  return t_tid;
}

tpurt_status tpurt_trace_start(size_t capacity) {
  if (!capacity) capacity = (size_t)1 << 18;
  if (capacity > ((size_t)1 << 26))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_trace_start: capacity %zu exceeds %zu events", capacity,
                      (size_t)1 << 26);
  size_t cap = 1;
  while (cap < capacity) cap <<= 1;
  trace_slot *ring = calloc(cap, sizeof *ring);
  if (!ring)
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "tpurt_trace_start: out of host memory for %zu trace events", cap);
  pthread_mutex_lock(&g_mu);
  atomic_store(&tpurt__trace_on, 0);
  free(g_ring);
  g_ring = ring;
  g_cap = cap;
  atomic_store(&g_next, 0);
  atomic_store_explicit(&tpurt__trace_on, 1, memory_order_release);
  pthread_mutex_unlock(&g_mu);
  return TPURT_OK;
}

void tpurt_trace_stop(void) { atomic_store(&tpurt__trace_on, 0); }

int tpurt_trace_enabled(void) { return atomic_load_explicit(&tpurt__trace_on, memory_order_relaxed); }

void tpurt_trace_set_corr(uint64_t id) { tpurt__trace_corr = id; }

int64_t tpurt_trace_now_ns(void) { return tpurt__now_ns(); }

void tpurt__trace_emit(int kind, int64_t ts, int64_t dur, const char *name, const char *site, int dev, int stream,
                       uint64_t seq, uint64_t corr, int64_t a, int64_t b) {
  trace_slot *ring = g_ring;
  if (!ring) return;
  uint64_t t = atomic_fetch_add_explicit(&g_next, 1, memory_order_relaxed);
  trace_slot *sl = &ring[t & (g_cap - 1)];
  atomic_store_explicit(&sl->stamp, 0, memory_order_relaxed);
  sl->ev = (tpurt_trace_event){ts, dur, name, site, seq, corr, a, b, kind, dev, stream, thread_id()};
  atomic_store_explicit(&sl->stamp, t + 1, memory_order_release);
}

void tpurt__trace_members(const uint64_t *corr, int n) {
  if (n > MAX_MEMBERS) n = MAX_MEMBERS;
  if (n > 0) memcpy(t_members, corr, (size_t)n * sizeof *corr);
  t_nmembers = n < 0 ? 0 : n;
}

void tpurt__trace_launch(const tpurt_stream *s, const char *name, uint64_t seq, int64_t ts) {
  int64_t now = ts ? ts : tpurt__now_ns();
  int n = t_nmembers;
  t_nmembers = 0;
  uint64_t ctx = tpurt__trace_ctx ? tpurt__trace_ctx : tpurt__trace_corr;
  tpurt__trace_emit(TPURT_TRACE_LAUNCH, now, 0, name, NULL, s->dev, (int)s->id, seq, n ? 0 : tpurt__trace_corr, n,
                    (int64_t)ctx);
  for (int i = 0; i < n; i++)
    tpurt__trace_emit(TPURT_TRACE_MEMBER, now, 0, name, NULL, s->dev, (int)s->id, seq, t_members[i], i, n);
}

size_t tpurt_trace_count(void) {
  uint64_t n = atomic_load(&g_next);
  return n < g_cap ? (size_t)n : g_cap;
}

size_t tpurt_trace_read(tpurt_trace_event *out, size_t max, uint64_t *dropped) {
  pthread_mutex_lock(&g_mu);
  uint64_t end = atomic_load_explicit(&g_next, memory_order_acquire);
  uint64_t begin = end > g_cap ? end - g_cap : 0;
  size_t k = 0;
  uint64_t lost = begin;
  for (uint64_t t = begin; g_ring && t < end && k < max; t++) {
    trace_slot *sl = &g_ring[t & (g_cap - 1)];
    if (atomic_load_explicit(&sl->stamp, memory_order_acquire) != t + 1) {
      lost++; /* still being written, or reused by a later event */
      continue;
    }
    out[k++] = sl->ev;
  }
  pthread_mutex_unlock(&g_mu);
  if (dropped) *dropped = lost;
  return k;
}
