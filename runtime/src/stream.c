/*
 * stream.c — streams (one worker thread and a FIFO command ring each),
 * kernel launch, synchronisation, asynchronous error capture, the current
 * stream of each thread, and events (record / query / wait / timing).
 *
 * A command is one ring item, or one of a batch's: a thread running a
 * replayed graph (graph/replay.c) hands its launches over a run at a time
 * (tpurt__batch_begin), and the worker runs a batch's commands one by one
 * as if each had its own item — its own number, time, trace event and
 * error — so only the ring traffic and the wake-ups are shared.
 *
 * Streams are process-lifetime objects (like CUDA's): they are never freed
 * and their detached workers simply sleep at process exit.
 */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

#define RING_SLOTS 1024u

static pthread_mutex_t g_create_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(tpurt_stream *) g_streams[TPURT_MAX_DEVICES][TPURT_STREAMS_PER_DEVICE];
static tpurt_stream *g_all[TPURT_MAX_DEVICES * TPURT_STREAMS_PER_DEVICE];
static _Atomic int g_nall;
static _Atomic uint32_t g_pool_rr[TPURT_MAX_DEVICES];
static _Thread_local tpurt_stream *t_current[TPURT_MAX_DEVICES];

/* ---------------------------------------------------------- worker */

typedef struct {
  tpurt_stream *s;
  uint64_t seq;
} seq_ctx;

static int pred_has_work(void *p) {
  seq_ctx *c = p;
  return atomic_load_explicit(&c->s->pub, memory_order_acquire) >= c->seq;
}

static void record_error(tpurt_stream *s, uint64_t seq, const char *name, tpurt_status st, const char *msg) {
  pthread_mutex_lock(&s->err_mu);
  if (s->err == TPURT_OK) {
    s->err = st;
    s->err_seq = seq;
    snprintf(s->errmsg, sizeof s->errmsg, "%s: %s", name ? name : "kernel",
             (msg && *msg) ? msg : tpurt_status_name(st));
  }
  pthread_mutex_unlock(&s->err_mu);
}

static tpurt_status k_event_record(void *a, char *err, size_t errlen);
static tpurt_status k_event_wait(void *a, char *err, size_t errlen);
#define EVENT_CMD_BYTES 16 /* sizeof(event_cmd), checked below */

/* A batch's commands (see tpurt__batch_begin): kernel, name and where its
 * arguments start in args (16-byte aligned). */
typedef struct batch_cmd {
  tpurt_kernel_fn fn;
  const char *name;
  size_t off;
} batch_cmd;

typedef struct batch {
  int n, cap;
  batch_cmd *cmd;
  unsigned char *args;
  size_t used, acap;
} batch;

static void batch_free(batch *b) {
  free(b->cmd);
  free(b->args);
  free(b);
}

/* The ring item of a batch: the worker runs its commands itself and never
 * calls this. */
static tpurt_status k_batch(void *a, char *err, size_t errlen) {
  (void)a;
  snprintf(err, errlen, "a batch of commands was run as one command");
  return TPURT_ERR_INTERNAL;
}

/* An event record runs once head has passed it (below). */
static tpurt_status k_nothing(void *a, char *err, size_t errlen) {
  (void)a, (void)err, (void)errlen;
  return TPURT_OK;
}

/* Runs command number seq: its time to the kernel times and the trace, its
 * failure to the stream's error. */
static void run_command(tpurt_stream *s, uint64_t seq, const char *name, tpurt_kernel_fn fn, void *args, char *err,
                        size_t errlen) {
  err[0] = 0;
  int64_t t0 = tpurt__ktimes_on() || TPURT__TRACE_ON() ? tpurt__now_ns() : 0;
  tpurt_status st = fn(args, err, errlen);
  if (t0) {
    int64_t t1 = tpurt__now_ns();
    if (tpurt__ktimes_on()) tpurt__ktimes_add(name, t1 - t0);
    if (TPURT__TRACE_ON()) tpurt__trace_emit(TPURT_TRACE_KERNEL, t0, t1 - t0, name, NULL, s->dev, (int)s->id, seq, 0, st, 0);
  }
  if (st != TPURT_OK) {
    err[errlen - 1] = 0;
    record_error(s, seq, name, st, err);
  }
}

static void *worker_main(void *arg) {
  tpurt_stream *s = arg;
  char name[16];
  snprintf(name, sizeof name, "tpu%d-s%lld", s->dev, (long long)s->id);
  pthread_setname_np(pthread_self(), name);
  char err[512];
  uint64_t h = 0, taken = 0; /* commands completed, ring slots taken */
  for (;;) {
    seq_ctx c = {s, h + 1};
    tpurt__wait(&s->work_w, pred_has_work, &c, TPURT_SPIN_NS);
    tpurt__slot *sl = &s->ring[taken++ % s->cap];
    if (sl->fn == k_batch) {
      /* taken out of the slot before head moves: the slot is then reusable */
      batch *b = sl->heap_args;
      sl->heap_args = NULL;
      for (int i = 0; i < b->n; i++) {
        run_command(s, h + 1, b->cmd[i].name, b->cmd[i].fn, b->args + b->cmd[i].off, err, sizeof err);
        h++;
        atomic_store_explicit(&s->head, h, memory_order_release);
        tpurt__notify_reached(&s->done_w, h, &s->wake_at);
      }
      batch_free(b);
      continue;
    }
    void *args = sl->heap_args ? sl->heap_args : (void *)sl->args;
    /* An event completes only once its stream has passed it: whoever sees
     * the event done also sees the stream's earlier work done (query). The
     * record's arguments are copied out first: once head moves, the slot
     * may be reused by a producer. */
    int is_record = sl->fn == k_event_record;
    unsigned char record_args[EVENT_CMD_BYTES];
    if (is_record) memcpy(record_args, args, sizeof record_args);
    run_command(s, h + 1, sl->name, is_record ? k_nothing : sl->fn, args, err, sizeof err);
    if (sl->heap_args) {
      free(sl->heap_args);
      sl->heap_args = NULL;
    }
    h++;
    atomic_store_explicit(&s->head, h, memory_order_release);
    if (is_record) k_event_record(record_args, err, sizeof err);
    tpurt__notify_reached(&s->done_w, h, &s->wake_at);
  }
  return NULL;
}

static tpurt_stream *create_stream(int dev, int64_t id, int priority) {
  size_t bytes = (sizeof(tpurt_stream) + 63) & ~(size_t)63;
  tpurt_stream *s = aligned_alloc(64, bytes); /* the struct has 64-byte aligned members */
  if (!s) return NULL;
  memset(s, 0, bytes);
  s->dev = dev;
  s->id = id;
  s->priority = priority;
  s->cap = RING_SLOTS;
  atomic_store(&s->wake_at, UINT64_MAX);
  s->ring = calloc(s->cap, sizeof *s->ring);
  if (!s->ring) {
    free(s);
    return NULL;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->err_mu, NULL);
  pthread_mutex_init(&s->dmu, NULL);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&at, 1 << 20);
  int rc = pthread_create(&s->thread, &at, worker_main, s);
  pthread_attr_destroy(&at);
  if (rc != 0) {
    free(s->ring);
    free(s);
    return NULL;
  }
  return s;
}

static tpurt_status get_stream(int dev, int64_t id, int priority, tpurt_stream **out) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  if (id < 0 || id >= TPURT_STREAMS_PER_DEVICE)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "invalid stream id %lld (expected 0..%d)", (long long)id,
                      TPURT_STREAM_POOL_SIZE);
  tpurt_stream *s = atomic_load_explicit(&g_streams[dev][id], memory_order_acquire);
  if (!s) {
    pthread_mutex_lock(&g_create_mu);
    s = atomic_load(&g_streams[dev][id]);
    if (!s) {
      s = create_stream(dev, id, priority);
      if (s) {
        int n = atomic_load(&g_nall);
        g_all[n] = s;
        atomic_store(&g_nall, n + 1);
        atomic_store_explicit(&g_streams[dev][id], s, memory_order_release);
      }
    }
    pthread_mutex_unlock(&g_create_mu);
    if (!s) return tpurt__err(TPURT_ERR_INTERNAL, "could not create stream %lld of TPU %d", (long long)id, dev);
  }
  if (out) *out = s;
  return TPURT_OK;
}

int tpurt__all_streams(tpurt_stream ***out) {
  *out = g_all;
  return atomic_load(&g_nall);
}

tpurt_stream *tpurt__default_stream(int dev) {
  tpurt_stream *s = NULL;
  if (get_stream(dev, 0, 0, &s) != TPURT_OK) return NULL;
  return s;
}

tpurt_status tpurt_stream_default(int dev, tpurt_stream **out) {
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_stream_default: out is NULL");
  return get_stream(dev, 0, 0, out);
}

tpurt_status tpurt_stream_from_pool(int dev, int priority, tpurt_stream **out) {
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_stream_from_pool: out is NULL");
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  uint32_t k = atomic_fetch_add(&g_pool_rr[dev], 1) % TPURT_STREAM_POOL_SIZE;
  return get_stream(dev, 1 + (int64_t)k, priority, out);
}

tpurt_status tpurt_stream_get(int dev, int64_t id, tpurt_stream **out) {
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_stream_get: out is NULL");
  return get_stream(dev, id, 0, out);
}

int tpurt_stream_device(const tpurt_stream *s) { return s ? s->dev : -1; }
int64_t tpurt_stream_id(const tpurt_stream *s) { return s ? s->id : -1; }
int tpurt_stream_priority(const tpurt_stream *s) { return s ? s->priority : 0; }

tpurt_stream *tpurt_stream_current(int dev) {
  if (tpurt__check_device(dev) != TPURT_OK) return NULL;
  tpurt_stream *s = t_current[dev];
  if (!s) s = tpurt__default_stream(dev);
  return s;
}

tpurt_status tpurt_stream_set_current(tpurt_stream *s) {
  TPURT__INIT_OR_RETURN();
  if (!s) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_stream_set_current: stream is NULL");
  tpurt_status st = tpurt__check_device(s->dev);
  if (st) return st;
  if (atomic_load(&g_streams[s->dev][s->id]) != s)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_stream_set_current: not a stream of this runtime");
  t_current[s->dev] = s;
  return TPURT_OK;
}

tpurt_status tpurt__resolve_stream(tpurt_stream **s, int dev) {
  TPURT__INIT_OR_RETURN();
  if (*s) return TPURT_OK;
  if (dev < 0) dev = tpurt_get_device();
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  *s = tpurt_stream_current(dev);
  if (!*s) return tpurt__err(TPURT_ERR_INTERNAL, "could not create the default stream of TPU %d", dev);
  return TPURT_OK;
}

/* -------------------------------------------------------- enqueue / sync */

/* The thread's open batch: its stream (whose producer mutex it holds), the
 * commands not yet handed to the worker, and how many to collect before
 * the next hand-over. */
static _Thread_local struct {
  tpurt_stream *s;
  batch *b;
  int limit;
} t_batch;

/* Hand-overs of a batch come at 1, 2, 4, ... commands (then every
 * BATCH_MAX): the worker starts on a graph's first kernel while the host
 * prepares the next ones, and a graph of n launches costs ~log2(n) ring
 * items and wake-ups instead of n. */
#define BATCH_MAX 64

/* Room for one more ring item (s->mu held). Full: sleep (no spinning: the
 * producer would take a core from the kernels it waits for) until half the
 * ring has drained, so that a host far ahead of the device wakes once per
 * cap / 2 commands, not once per kernel. Counted in commands, which are
 * at least as many as the items holding them. */
static void wait_for_room(tpurt_stream *s) {
  uint64_t t = atomic_load_explicit(&s->pub, memory_order_relaxed);
  if (t - atomic_load_explicit(&s->head, memory_order_acquire) >= s->cap)
    tpurt__wait_until(&s->done_w, &s->head, t - s->cap / 2, &s->wake_at, 0);
}

/* Hands the open batch's commands to the worker as one ring item (s->mu
 * held by this thread). */
static void batch_publish(tpurt_stream *s) {
  batch *b = t_batch.b;
  t_batch.b = NULL;
  if (!b) return;
  if (!b->n) { /* its first command could not be added */
    batch_free(b);
    return;
  }
  wait_for_room(s);
  uint64_t p = atomic_load_explicit(&s->pub, memory_order_relaxed);
  tpurt__slot *sl = &s->ring[s->slots++ % s->cap];
  sl->fn = k_batch;
  sl->name = "batch";
  sl->seq = p + 1;
  sl->heap_args = b;
  atomic_store_explicit(&s->pub, p + (uint64_t)b->n, memory_order_release);
  tpurt__notify(&s->work_w);
}

/* One command as its own ring item (s->mu held; heap: its arguments when
 * they do not fit inline). */
static void put_command(tpurt_stream *s, const char *name, tpurt_kernel_fn fn, const void *args, size_t args_size,
                        void *heap, uint64_t *seq) {
  wait_for_room(s);
  uint64_t t = atomic_load_explicit(&s->tail, memory_order_relaxed);
  tpurt__slot *sl = &s->ring[s->slots++ % s->cap];
  sl->fn = fn;
  sl->name = name;
  sl->seq = t + 1;
  sl->heap_args = heap;
  if (!heap && args_size) memcpy(sl->args, args, args_size);
  atomic_store_explicit(&s->tail, t + 1, memory_order_release);
  atomic_store_explicit(&s->pub, t + 1, memory_order_release);
  tpurt__notify(&s->work_w);
  *seq = t + 1;
}

/* Adds a command to the open batch (its number is taken now). */
static tpurt_status batch_add(tpurt_stream *s, const char *name, tpurt_kernel_fn fn, const void *args,
                              size_t args_size, uint64_t *seq) {
  batch *b = t_batch.b;
  if (!b && !(b = t_batch.b = calloc(1, sizeof *b)))
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", name ? name : "launch");
  size_t off = (b->used + 15) & ~(size_t)15;
  if (b->n == b->cap || !b->args || off + args_size > b->acap) {
    int nc = b->n == b->cap ? (b->cap ? 2 * b->cap : 16) : b->cap;
    size_t na = !b->args || off + args_size > b->acap ? 2 * (off + args_size) + 1024 : b->acap;
    batch_cmd *c = nc != b->cap ? realloc(b->cmd, (size_t)nc * sizeof *c) : b->cmd;
    if (c) b->cmd = c, b->cap = nc;
    unsigned char *a = c && (!b->args || na != b->acap) ? realloc(b->args, na) : b->args;
    if (a) b->args = a, b->acap = na;
    if (!c || !a)
      return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: could not copy %zu bytes of launch arguments",
                        name ? name : "launch", args_size);
  }
  if (args_size) memcpy(b->args + off, args, args_size);
  b->used = off + args_size;
  b->cmd[b->n++] = (batch_cmd){fn, name, off};
  uint64_t q = atomic_load_explicit(&s->tail, memory_order_relaxed) + 1;
  atomic_store_explicit(&s->tail, q, memory_order_release);
  *seq = q;
  if (b->n >= t_batch.limit) {
    batch_publish(s);
    if (t_batch.limit < BATCH_MAX) t_batch.limit *= 2;
  }
  return TPURT_OK;
}

int tpurt__batch_begin(tpurt_stream *s) {
  if (t_batch.s || atomic_load_explicit(&tpurt__blocking, memory_order_relaxed)) return 0;
  pthread_mutex_lock(&s->mu);
  t_batch.s = s;
  t_batch.b = NULL;
  t_batch.limit = 1;
  return 1;
}

void tpurt__batch_end(tpurt_stream *s) {
  batch_publish(s);
  t_batch.s = NULL;
  pthread_mutex_unlock(&s->mu);
}

tpurt_status tpurt__enqueue(tpurt_stream *s, const char *name, tpurt_kernel_fn fn, const void *args,
                            size_t args_size, uint64_t *seq) {
  uint64_t q = 0;
  /* the LAUNCH event's time is taken before the command is handed over:
   * the worker may start it before this thread writes the event */
  int64_t tl = TPURT__TRACE_ON() ? tpurt__now_ns() : 0;
  /* an event's command is an item of its own: the worker completes the
   * commands before a record, then the record */
  if (t_batch.s == s && fn != k_event_record && fn != k_event_wait) {
    tpurt_status st = batch_add(s, name, fn, args, args_size, &q);
    if (st) return st;
  } else {
    void *heap = NULL;
    if (args_size > TPURT_MAX_ARGS_INLINE) {
      heap = malloc(args_size);
      if (!heap) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: could not copy %zu bytes of launch arguments",
                                   name ? name : "launch", args_size);
      memcpy(heap, args, args_size);
    }
    if (t_batch.s == s) {
      batch_publish(s);
      put_command(s, name, fn, args, args_size, heap, &q);
    } else {
      pthread_mutex_lock(&s->mu);
      put_command(s, name, fn, args, args_size, heap, &q);
      pthread_mutex_unlock(&s->mu);
    }
  }
  if (TPURT__TRACE_ON()) tpurt__trace_launch(s, name, q, tl);
  if (seq) *seq = q;
  return TPURT_OK;
}

/* Waiters name the command they wait for: the worker wakes them when it
 * completes that one, not after every command (a host waiting at a step's
 * loss.item() for ~300 kernels was woken ~300 times a step, each time
 * taking a core from the kernels: ~130-190 preemptions of the compute
 * threads per Llama step). A thread waiting for a command of its own open
 * batch hands the batch over first. */
void tpurt__stream_wait_seq(tpurt_stream *s, uint64_t seq) {
  if (t_batch.s == s && seq > atomic_load_explicit(&s->pub, memory_order_relaxed)) batch_publish(s);
  tpurt__wait_until(&s->done_w, &s->head, seq, &s->wake_at, TPURT_SPIN_NS);
}

tpurt_status tpurt__stream_take_error(tpurt_stream *s) { return tpurt__stream_take_error_upto(s, UINT64_MAX); }

tpurt_status tpurt__stream_take_error_upto(tpurt_stream *s, uint64_t seq) {
  tpurt_status st = TPURT_OK;
  pthread_mutex_lock(&s->err_mu);
  if (s->err != TPURT_OK && s->err_seq <= seq) {
    st = s->err;
    tpurt__err_str(st, s->errmsg);
    s->err = TPURT_OK;
    s->errmsg[0] = 0;
  }
  pthread_mutex_unlock(&s->err_mu);
  return st;
}

tpurt_status tpurt_launch(tpurt_stream *s, const char *name, tpurt_kernel_fn fn, const void *args,
                          size_t args_size) {
  tpurt_status st = tpurt__resolve_stream(&s, -1);
  if (st) return st;
  if (!fn) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_launch: kernel function is NULL");
  if (args_size && !args) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_launch: args is NULL");
  if (tpurt__deferring()) return tpurt__defer_record_launch(s, name, fn, args, args_size);
  uint64_t seq;
  st = tpurt__enqueue(s, name, fn, args, args_size, &seq);
  if (st) return st;
  if (atomic_load_explicit(&tpurt__blocking, memory_order_relaxed)) {
    tpurt__stream_wait_seq(s, seq);
    return tpurt__stream_take_error(s);
  }
  return TPURT_OK;
}

tpurt_status tpurt_stream_synchronize(tpurt_stream *s) {
  tpurt_status st = tpurt__resolve_stream(&s, -1);
  if (st) return st;
  if (!s) return TPURT_ERR_INTERNAL; /* unreachable; placates gcc's -Wstringop-overflow */
  return tpurt__stream_sync(s, TPURT_FLUSH_SYNC);
}

tpurt_status tpurt__stream_sync(tpurt_stream *s, tpurt_flush_reason reason) {
  tpurt_status st = tpurt__defer_flush_device(s->dev, reason);
  if (st) return st;
  tpurt__stream_wait_seq(s, tpurt__stream_enqueued(s));
  return tpurt__stream_take_error(s);
}

int tpurt_stream_query(tpurt_stream *s) {
  if (tpurt__resolve_stream(&s, -1) != TPURT_OK) return 1;
  tpurt__defer_flush_device(s->dev, TPURT_FLUSH_SYNC); /* an error surfaces at the next synchronize */
  return tpurt__stream_reached(s, tpurt__stream_enqueued(s));
}

void tpurt__device_wait(int dev) {
  for (int i = 0; i < TPURT_STREAMS_PER_DEVICE; i++) {
    tpurt_stream *s = atomic_load_explicit(&g_streams[dev][i], memory_order_acquire);
    if (s) tpurt__stream_wait_seq(s, tpurt__stream_enqueued(s));
  }
}

tpurt_status tpurt_device_synchronize(int dev) {
  tpurt_status st = tpurt__check_device(dev);
  if (st) return st;
  st = tpurt__defer_flush_device(dev, TPURT_FLUSH_SYNC);
  if (st) return st;
  tpurt__device_wait(dev);
  tpurt_status first = TPURT_OK;
  char msg[TPURT_ERRMSG_LEN] = "";
  for (int i = 0; i < TPURT_STREAMS_PER_DEVICE; i++) {
    tpurt_stream *s = atomic_load_explicit(&g_streams[dev][i], memory_order_acquire);
    if (!s) continue;
    tpurt_status e = tpurt__stream_take_error(s);
    if (e != TPURT_OK && first == TPURT_OK) {
      first = e;
      snprintf(msg, sizeof msg, "%s", tpurt_last_error());
    }
  }
  if (first != TPURT_OK) tpurt__err_str(first, msg);
  return first;
}

/* ----------------------------------------------------------------- events */

tpurt_status tpurt_event_create(int flags, tpurt_event **out) {
  TPURT__INIT_OR_RETURN();
  if (!out) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_event_create: out is NULL");
  tpurt_event *e = calloc(1, sizeof *e);
  if (!e) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "tpurt_event_create: out of host memory");
  e->flags = flags;
  atomic_init(&e->refs, 1);
  atomic_init(&e->dev, -1);
  *out = e;
  return TPURT_OK;
}

static void event_unref(tpurt_event *e) {
  if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1) free(e);
}

void tpurt_event_destroy(tpurt_event *e) {
  if (e) event_unref(e);
}

typedef struct {
  tpurt_event *e;
  uint64_t counter;
} event_cmd;
_Static_assert(sizeof(event_cmd) == EVENT_CMD_BYTES, "EVENT_CMD_BYTES must match event_cmd");

static tpurt_status k_event_record(void *a, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  event_cmd *c = a;
  tpurt_event *e = c->e;
  if (e->flags & TPURT_EVENT_TIMING) atomic_store(&e->time_ns, tpurt__now_ns());
  uint64_t d = atomic_load(&e->done);
  while (d < c->counter && !atomic_compare_exchange_weak(&e->done, &d, c->counter)) {
  }
  tpurt__notify(&e->w);
  event_unref(e);
  return TPURT_OK;
}

typedef struct {
  tpurt_event *e;
  uint64_t target;
} ev_ctx;
static int pred_event(void *p) {
  ev_ctx *c = p;
  return atomic_load_explicit(&c->e->done, memory_order_acquire) >= c->target;
}

static tpurt_status k_event_wait(void *a, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  event_cmd *c = a;
  ev_ctx x = {c->e, c->counter};
  tpurt__wait(&c->e->w, pred_event, &x, TPURT_SPIN_NS);
  event_unref(c->e);
  return TPURT_OK;
}

tpurt_status tpurt_event_record(tpurt_event *e, tpurt_stream *s) {
  if (!e) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_event_record: event is NULL");
  tpurt_status st = tpurt__resolve_stream(&s, -1);
  if (st) return st;
  if ((st = tpurt__defer_flush_device(s->dev, TPURT_FLUSH_EVENT))) return st;
  atomic_fetch_add(&e->refs, 1);
  event_cmd c = {e, atomic_fetch_add(&e->recorded, 1) + 1};
  atomic_store(&e->stream, s);
  atomic_store(&e->dev, s->dev);
  st = tpurt__enqueue(s, "event_record", k_event_record, &c, sizeof c, NULL);
  if (st) event_unref(e);
  return st;
}

int tpurt_event_query(tpurt_event *e) {
  if (!e) return 1;
  return atomic_load(&e->done) >= atomic_load(&e->recorded);
}

tpurt_status tpurt_event_synchronize(tpurt_event *e) {
  if (!e) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_event_synchronize: event is NULL");
  ev_ctx x = {e, atomic_load(&e->recorded)};
  if (x.target == 0) return TPURT_OK;
  tpurt__wait(&e->w, pred_event, &x, (e->flags & TPURT_EVENT_BLOCKING_SYNC) ? 0 : TPURT_SPIN_NS);
  tpurt_stream *s = atomic_load(&e->stream);
  return s ? tpurt__stream_take_error(s) : TPURT_OK;
}

tpurt_status tpurt_stream_wait_event(tpurt_stream *s, tpurt_event *e) {
  if (!e) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_stream_wait_event: event is NULL");
  tpurt_status st = tpurt__resolve_stream(&s, -1);
  if (st) return st;
  if ((st = tpurt__defer_flush_device(s->dev, TPURT_FLUSH_EVENT))) return st;
  uint64_t target = atomic_load(&e->recorded);
  if (target == 0 || atomic_load(&e->done) >= target) return TPURT_OK;
  /* Same stream: FIFO order already places later work after the record. */
  if (atomic_load(&e->stream) == s) return TPURT_OK;
  atomic_fetch_add(&e->refs, 1);
  event_cmd c = {e, target};
  st = tpurt__enqueue(s, "stream_wait_event", k_event_wait, &c, sizeof c, NULL);
  if (st) event_unref(e);
  return st;
}

tpurt_status tpurt_event_elapsed_ms(tpurt_event *start, tpurt_event *end, float *ms) {
  if (!start || !end || !ms)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_event_elapsed_ms: NULL argument");
  if (!(start->flags & TPURT_EVENT_TIMING) || !(end->flags & TPURT_EVENT_TIMING))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "Both events must be created with argument 'enable_timing=True'.");
  if (atomic_load(&start->recorded) == 0 || atomic_load(&end->recorded) == 0)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "Both events must be recorded before calculating elapsed time.");
  if (!tpurt_event_query(start) || !tpurt_event_query(end))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "Both events must be completed before calculating elapsed time.");
  int64_t d = atomic_load(&end->time_ns) - atomic_load(&start->time_ns);
  *ms = (float)((double)d / 1e6);
  return TPURT_OK;
}

int tpurt_event_device(const tpurt_event *e) { return e ? atomic_load(&((tpurt_event *)e)->dev) : -1; }
