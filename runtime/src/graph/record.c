/*
 * record.c — the graph engine's first stage: recording DeferAndFuse graphs,
 * promises, cuts and the stats (see graph.h for the stages, "execution
 * modes" in tpurt.h for the mode).
 *
 * Recording. In DEFER mode every launch on a stream is appended to the
 * stream's pending graph instead of its queue: elementwise programs as
 * structured nodes (program, views, launch scalars), other kernels as opaque
 * nodes (kernel function, argument bytes, and the device ranges the launch
 * validated — every kernel checks its views through tpurt__check_dev_range,
 * which notes them here), host->device copies with their data staged, and
 * frees of memory that pending nodes may still use as markers.
 *
 * Promises. Memory allocated while recording is a promise: an address
 * 0xD... | id << 36 | offset with no memory behind it. A graph gives memory
 * to a promise only if the promise is still alive when the graph ends, or a
 * kernel must read it from memory (an opaque kernel, or a fused program
 * that could not take the value from a register): memplan.c decides.
 * Translation of a promise address goes through the promise table (one
 * branch in tpurt__host_view).
 *
 * Cuts. A graph runs when it is cut (tpurt__defer_flush_stream): by the
 * program (a sync, a host read, an event, a mode change, ...: the flush
 * reasons of tpurt.h, with the source line the site callback names) or by
 * the engine itself (the size cap, loop detection, pipelining segments).
 * The cut hands the graph to execute.c, then settles its promises (live
 * ones now belong to the stream's memory, dead ones go) and counts what
 * the plan did in the stats and the flush log.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "codegen.h"
#include "graph.h"

_Atomic int tpurt__defer_on;
_Thread_local int tpurt__defer_bypass;
static _Atomic int g_pending_graphs; /* streams with a non-empty pending graph */
/* Graphs being run: taken from their stream (no longer pending) while their
 * launches are still being enqueued. A cut, a read or a free that finds no
 * pending graph must still wait for such a run on its stream: its own
 * launch (a read of the graph's output, a free of memory the graph reads)
 * has to come after the graph's in the stream, and the runner holds dmu
 * until they are all enqueued. Counted before the graph stops being pending
 * (seq_cst), so whoever sees it not pending sees it running. */
static _Atomic int g_running_graphs;

void tpurt__defer_run_begin(tpurt_stream *s) {
  atomic_fetch_add(&s->defer_running, 1);
  atomic_fetch_add(&g_running_graphs, 1);
}
void tpurt__defer_run_end(tpurt_stream *s) {
  atomic_fetch_sub(&g_running_graphs, 1);
  atomic_fetch_sub(&s->defer_running, 1);
}
/* Nothing pending or running anywhere: no cut has work, no free must wait. */
static int defer_idle(void) {
  return atomic_load(&g_pending_graphs) == 0 && atomic_load(&g_running_graphs) == 0;
}
static _Thread_local int t_hint = -1;
static _Thread_local struct tpurt__host_read *t_read; /* the cut's host read (tpurt__defer_flush_for_read) */
static _Atomic(tpurt_site_fn) g_site_fn;
static _Atomic int g_max_ops = 8192;
static _Atomic int g_seg_ops = 0;

/* ----------------------------------------------------------------- stats */

static pthread_mutex_t g_stat_mu = PTHREAD_MUTEX_INITIALIZER;
static tpurt_defer_stats g_stats;
#define FLUSH_LOG 64
static tpurt_flush_record g_log[FLUSH_LOG];
static uint64_t g_nlog;

static const char *k_reason_names[TPURT_FLUSH_NUM_REASONS] = {
    "explicit", "synchronize", "event", "stream", "to_host", "item", "print",
    "save",     "size_cap",    "loop",  "mode",   "collective", "segment"};

const char *tpurt_flush_reason_name(tpurt_flush_reason r) {
  return (unsigned)r < TPURT_FLUSH_NUM_REASONS ? k_reason_names[r] : "unknown";
}

void tpurt_defer_get_stats(tpurt_defer_stats *out) {
  if (!out) return;
  pthread_mutex_lock(&g_stat_mu);
  *out = g_stats;
  pthread_mutex_unlock(&g_stat_mu);
  tpurt__cg_stats cg; /* generated kernels (codegen.c) */
  tpurt__codegen_stats(&cg);
  out->codegen_kernels = cg.kernels;
  out->codegen_failures = cg.failures;
  out->codegen_not_generated = cg.not_generated;
  out->codegen_launches_compiled = cg.launches_compiled;
  out->codegen_launches_interpreted = cg.launches_interpreted;
  out->codegen_compile_seconds = cg.compile_seconds;
}

void tpurt_defer_reset_stats(void) {
  pthread_mutex_lock(&g_stat_mu);
  memset(&g_stats, 0, sizeof g_stats);
  g_nlog = 0;
  pthread_mutex_unlock(&g_stat_mu);
  tpurt__codegen_reset_stats();
}

int tpurt_defer_get_flush(int i, tpurt_flush_record *out) {
  int ok = 0;
  pthread_mutex_lock(&g_stat_mu);
  if (i >= 0 && (uint64_t)i < g_nlog && i < FLUSH_LOG) {
    if (out) *out = g_log[(g_nlog - 1 - (uint64_t)i) % FLUSH_LOG];
    ok = 1;
  }
  pthread_mutex_unlock(&g_stat_mu);
  return ok;
}

void tpurt_defer_set_site_fn(tpurt_site_fn fn) { atomic_store(&g_site_fn, fn); }
void tpurt_defer_set_max_ops(int n) { atomic_store(&g_max_ops, n < 16 ? 16 : n); }
void tpurt_defer_set_segment_ops(int n) { atomic_store(&g_seg_ops, n <= 0 ? 0 : n < 8 ? 8 : n); }
int tpurt_defer_get_segment_ops(void) { return atomic_load(&g_seg_ops); }
void tpurt_flush_hint(tpurt_flush_reason reason) {
  t_hint = (unsigned)reason < TPURT_FLUSH_NUM_REASONS ? (int)reason : -1;
}

/* ------------------------------------------------------------ promises */

#define P_CHUNK 4096
#define P_NCHUNKS 4096 /* 16M ids (24 bits) */
static _Atomic(tpurt__promise *) g_pchunks[P_NCHUNKS];
static pthread_mutex_t g_pmu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t g_pnext = 1; /* id 0 is never used */
static uint32_t *g_pfree;
static size_t g_npfree, g_cappfree;

tpurt__promise *tpurt__promise_get(uint32_t id) {
  tpurt__promise *c = atomic_load_explicit(&g_pchunks[id / P_CHUNK], memory_order_acquire);
  return c ? &c[id % P_CHUNK] : NULL;
}

/* Released ids wait until every stream of their chip has passed the work
 * queued so far: kernels still queued translate the promise address through
 * the table on the worker, so the entry stays intact until then. */
typedef struct pend_id {
  uint32_t id;
  int n;
  tpurt__fence f[TPURT_STREAMS_PER_DEVICE];
} pend_id;
static pend_id *g_pend;
static size_t g_npend, g_cappend, g_pend_head;

static void recycle_reached(void) { /* caller holds g_pmu */
  while (g_pend_head < g_npend) {
    pend_id *e = &g_pend[g_pend_head];
    int done = 1;
    for (int i = 0; i < e->n && done; i++) done = tpurt__stream_reached(e->f[i].s, e->f[i].seq);
    if (!done) break;
    memset(tpurt__promise_get(e->id), 0, sizeof(tpurt__promise));
    if (g_npfree == g_cappfree) {
      size_t nc = g_cappfree ? g_cappfree * 2 : 1024;
      uint32_t *nf = realloc(g_pfree, nc * sizeof *nf);
      if (!nf) break;
      g_pfree = nf;
      g_cappfree = nc;
    }
    g_pfree[g_npfree++] = e->id;
    g_pend_head++;
  }
  if (g_pend_head == g_npend) g_pend_head = g_npend = 0;
}

static uint32_t promise_new_id(void) {
  uint32_t id = 0;
  pthread_mutex_lock(&g_pmu);
  if (!g_npfree && g_npend) recycle_reached();
  if (g_npfree) {
    id = g_pfree[--g_npfree];
  } else if (g_pnext < (uint32_t)P_CHUNK * P_NCHUNKS) {
    id = g_pnext;
    if (!atomic_load(&g_pchunks[id / P_CHUNK])) {
      tpurt__promise *c = calloc(P_CHUNK, sizeof *c);
      if (!c) {
        pthread_mutex_unlock(&g_pmu);
        return 0;
      }
      atomic_store_explicit(&g_pchunks[id / P_CHUNK], c, memory_order_release);
    }
    g_pnext++;
  }
  pthread_mutex_unlock(&g_pmu);
  return id;
}

static void promise_release_id(uint32_t id) {
  tpurt__promise *q = tpurt__promise_get(id);
  pend_id e;
  e.id = id;
  e.n = 0;
  tpurt_stream **all;
  int n = tpurt__all_streams(&all);
  for (int i = 0; i < n && e.n < TPURT_STREAMS_PER_DEVICE; i++)
    if (all[i]->dev == q->dev) {
      e.f[e.n].s = all[i];
      e.f[e.n].seq = tpurt__stream_enqueued(all[i]);
      e.n++;
    }
  pthread_mutex_lock(&g_pmu);
  q->used = 0; /* no new use; the translation stays for queued kernels */
  if (g_npend == g_cappend) {
    if (g_pend_head > 0) { /* compact */
      memmove(g_pend, g_pend + g_pend_head, (g_npend - g_pend_head) * sizeof *g_pend);
      g_npend -= g_pend_head;
      g_pend_head = 0;
    }
    if (g_npend == g_cappend) {
      size_t nc = g_cappend ? g_cappend * 2 : 1024;
      pend_id *np = realloc(g_pend, nc * sizeof *np);
      if (!np) { /* leak the id rather than reuse it early */
        pthread_mutex_unlock(&g_pmu);
        return;
      }
      g_pend = np;
      g_cappend = nc;
    }
  }
  g_pend[g_npend++] = e;
  pthread_mutex_unlock(&g_pmu);
}

/* Frees the memory behind a promise once (stream-ordered: later kernels on
 * the stream may reuse it, queued ones still read it). */
tpurt_status tpurt__promise_free_real(tpurt__promise *q) {
  tpurt_devptr r = atomic_load(&q->real);
  if (!r || q->real_freed) return TPURT_OK;
  q->real_freed = 1;
  tpurt__defer_bypass++;
  tpurt_status st = tpurt_free(r);
  tpurt__defer_bypass--;
  return st;
}

/* ------------------------------------------------------- pending graphs */

/* A graph's recorded memory (arguments, views, staged data): bump
 * allocated, freed at once on the worker after the graph's kernels. */
typedef struct bchunk {
  struct bchunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
} bchunk;

static void *bump_alloc(bump *b, size_t n) {
  n = (n + 15) & ~(size_t)15;
  bchunk *c = b->head;
  if (!c || c->used + n > c->cap) {
    size_t cap = n > (1u << 16) ? n : (1u << 16);
    c = malloc(sizeof *c + cap);
    if (!c) return NULL;
    c->next = b->head;
    c->used = 0;
    c->cap = cap;
    b->head = c;
  }
  void *p = c->data + c->used;
  c->used += n;
  return p;
}
void *tpurt__bump_alloc(bump *b, size_t n) { return bump_alloc(b, n); }
int tpurt__defer_pending_graphs(void) { return atomic_load_explicit(&g_pending_graphs, memory_order_acquire); }

static void bump_free(bump *b) {
  while (b->head) {
    bchunk *n = b->head->next;
    free(b->head);
    b->head = n;
  }
}

static tpurt_status k_free_bump(void *a, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  bump_free((bump *)a);
  return TPURT_OK;
}

static _Atomic uint64_t g_graph_ids;

static dgraph *graph_of(tpurt_stream *s) {
  if (!s->dgraph) {
    dgraph *g = calloc(1, sizeof(dgraph));
    if (g) g->id = atomic_fetch_add(&g_graph_ids, 1) + 1;
    __atomic_store_n(&s->dgraph, g, __ATOMIC_SEQ_CST);
  }
  return s->dgraph;
}
static int graph_empty(const dgraph *g) { return !g || (g->n == 0 && g->np == 0); }

/* Caller holds s->dmu. Marks the stream pending when it gets its first item. */
static void mark_pending(tpurt_stream *s, dgraph *g, int was_empty) {
  (void)s;
  if (was_empty && !graph_empty(g)) atomic_fetch_add(&g_pending_graphs, 1);
}

static dnode *push_node(dgraph *g) {
  if (g->n == g->cap) {
    int nc = g->cap ? g->cap * 2 : 256;
    dnode *nn = realloc(g->nodes, (size_t)nc * sizeof *nn);
    if (!nn) return NULL;
    g->nodes = nn;
    g->cap = nc;
  }
  dnode *d = &g->nodes[g->n++];
  memset(d, 0, sizeof *d);
  return d;
}

/* ------------------------------------------------- access notes (TLS) */

/* A launch notes a range per view it validates: a foreach launch over n
 * tuples of k lists notes n * k. The buffer grows (per recording thread,
 * kept for its next launches) up to MAX_NOTES; past that the launch runs
 * unrecorded after what is pending. */
#define MAX_NOTES (1 << 20)
#define STACK_NOTES 64
static _Thread_local acc *t_notes;
static _Thread_local int t_nnotes, t_capnotes, t_notes_overflow, t_note_ro;

/* The buffer goes with its thread (a thread that recorded, then ended:
 * a user's worker thread, a DataLoader's): a key whose destructor frees it. */
static pthread_key_t g_notes_key;
static pthread_once_t g_notes_once = PTHREAD_ONCE_INIT;
static void notes_free(void *p) { /* runs on the ending thread: a launch after it starts afresh */
  free(p);
  t_notes = NULL;
  t_nnotes = t_capnotes = 0;
}
static void notes_key_init(void) { pthread_key_create(&g_notes_key, notes_free); }

void tpurt__defer_note_reads(int on) { t_note_ro = on; }

void tpurt__defer_note(tpurt_devptr p, int64_t lo, int64_t hi) {
  if (!tpurt__deferring()) return;
  if (t_nnotes == t_capnotes && t_capnotes < MAX_NOTES) {
    int nc = t_capnotes ? 2 * t_capnotes : 256;
    acc *grown = realloc(t_notes, sizeof *grown * (size_t)nc);
    if (grown) {
      t_notes = grown;
      t_capnotes = nc;
      pthread_once(&g_notes_once, notes_key_init);
      pthread_setspecific(g_notes_key, grown);
    }
  }
  if (t_nnotes < t_capnotes) {
    t_notes[t_nnotes].p = p;
    t_notes[t_nnotes].lo = lo;
    t_notes[t_nnotes].hi = hi;
    t_notes[t_nnotes].ro = t_note_ro;
    t_nnotes++;
  } else {
    t_notes_overflow = 1;
  }
}

/* ------------------------------------------------------------- recording */

static const char *site_now(void) {
  tpurt_site_fn fn = atomic_load_explicit(&g_site_fn, memory_order_relaxed);
  return fn ? fn(NULL) : NULL;
}

/* A node on stream s may read a promise that another stream is still
 * recording: run that stream's graph first. */
static tpurt_status flush_foreign(tpurt_stream *s, const tpurt_devptr *ptrs, int n) {
  for (int i = 0; i < n; i++) {
    if (!tpurt__is_promise(ptrs[i])) continue;
    tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(ptrs[i]));
    /* read without the owner's lock: a hint (a stale owner only costs a cut
     * that finds nothing; a graph being run is waited for by the cut) */
    tpurt_stream *owner = q ? __atomic_load_n(&q->owner, __ATOMIC_ACQUIRE) : NULL;
    if (owner && owner != s) {
      tpurt_status st = tpurt__defer_flush_stream(owner, TPURT_FLUSH_STREAM);
      if (st) return st;
    }
  }
  return TPURT_OK;
}

/* Caller holds s->dmu: signature of the node just recorded. */
static int note_op(dgraph *g, dnode *d) {
  uint64_t h = mix(d->kind, (uint64_t)(uintptr_t)d->fn);
  if (d->kind == N_EW) {
    h = mix(h, (uint64_t)d->compute | ((uint64_t)d->ninst << 8) | ((uint64_t)d->inst[d->ninst - 1].op << 16));
    for (int k = 0; k < d->views[0].ndim; k++) h = mix(h, (uint64_t)d->views[0].sizes[k]);
  } else {
    h = mix(h, d->args_size);
    h = mix(h, (uint64_t)d->nacc);
  }
  d->sig = h;
  return ++g->nops;
}

/* Pipelining (opt-in). A graph runs only when it is cut, so a training
 * step that ends in a sync (loss.item()) is recorded whole before its
 * first kernel runs: the host's recording and the device's execution take
 * turns, where strict eager's launches overlap the kernels. With
 * g_seg_ops > 0 the ops after a program cut are cut every g_seg_ops ops:
 * each segment runs while the host records the next. The segments are
 * counted from the program cut, so an iteration that ends in a cut maps
 * to the same segments, all cached, every time; they are used only after
 * two equal intervals between program cuts (a loop that cuts every
 * iteration): a program whose cuts come at varying distances (sampling
 * token by token with growing shapes) would make every segment a new
 * graph (minGPT's `make run` with 64-op segments built 145 plans; with
 * this rule 13, without segments 7). Fusion stops at segment boundaries
 * and a value crossing one is materialized: a training step's saved
 * activations then all take memory (measured: peak 0.70x strict
 * becomes ~1.0x with 64-op segments, for ~5-10 % less step time), which
 * is why it is off by default. A program that records more than the size
 * cap without a cut gets no segments past it: the size cap and loop
 * detection cut it into repeating graphs, and with no sync the host runs
 * ahead of the device anyway. */
static tpurt_status after_record(tpurt_stream *s, int n, int since_cut, int seg_ok, int loop) {
  if (loop > 0 && n >= loop) return tpurt__defer_flush_device(s->dev, TPURT_FLUSH_LOOP);
  int cap = atomic_load_explicit(&g_max_ops, memory_order_relaxed);
  if (n >= cap) return tpurt__defer_flush_device(s->dev, TPURT_FLUSH_SIZE_CAP);
  int seg = atomic_load_explicit(&g_seg_ops, memory_order_relaxed);
  if (seg > 0 && seg_ok && loop == 0 && n >= seg && since_cut <= cap)
    return tpurt__defer_flush_stream(s, TPURT_FLUSH_SEGMENT);
  return TPURT_OK;
}

/* Smallest period P (at most n/3) with which the last 3P recorded ops
 * repeat; 0 if none. */
static int find_period(const dgraph *G) {
  int n = 0;
  uint64_t *sig = malloc(sizeof *sig * (size_t)(G->nops ? G->nops : 1));
  if (!sig) return 0;
  for (int i = 0; i < G->n; i++)
    if (G->nodes[i].kind != N_FREE) sig[n++] = G->nodes[i].sig;
  int found = 0;
  for (int P = 1; P <= n / 3 && !found; P++) {
    int ok = 1;
    for (int i = n - 2 * P; i < n && ok; i++) ok = sig[i] == sig[i - P];
    if (ok) found = P;
  }
  free(sig);
  return found;
}

void tpurt__defer_count_early(uint64_t steps, int resumed, int discarded) {
  pthread_mutex_lock(&g_stat_mu);
  g_stats.early_steps += steps;
  g_stats.early_graphs += (uint64_t)(resumed != 0);
  g_stats.early_discarded += (uint64_t)(discarded != 0);
  pthread_mutex_unlock(&g_stat_mu);
}

static void count_recorded(void) {
  pthread_mutex_lock(&g_stat_mu);
  g_stats.ops_recorded++;
  pthread_mutex_unlock(&g_stat_mu);
}

/* Takes s's graph lock and appends an empty node to its pending graph.
 * NULL (lock released) when out of host memory. */
static dnode *record_begin(tpurt_stream *s, dgraph **gp, int *was_empty) {
  pthread_mutex_lock(&s->dmu);
  dgraph *g = graph_of(s);
  dnode *d = NULL;
  if (g) {
    *was_empty = graph_empty(g);
    d = push_node(g);
  }
  if (!d) {
    pthread_mutex_unlock(&s->dmu);
    return NULL;
  }
  *gp = g;
  return d;
}

/* Drops the node record_begin appended and releases the lock. */
static void record_abort(tpurt_stream *s, dgraph *g) {
  g->n--;
  pthread_mutex_unlock(&s->dmu);
}

/* Completes the node: the graph is pending, the op is counted, the lock is
 * released, and the graph is cut at the loop length or the size cap. */
static tpurt_status record_end(tpurt_stream *s, dgraph *g, dnode *d, int was_empty) {
  mark_pending(s, g, was_empty);
  int n = note_op(g, d);
  int since_cut = s->defer_since_cut < INT_MAX ? ++s->defer_since_cut : INT_MAX;
  int seg_ok = s->defer_seg_ok, loop = s->defer_loop_len;
  if (s->dearly && !atomic_load_explicit(&g_seg_ops, memory_order_relaxed)) tpurt__early_recorded(s, g);
  pthread_mutex_unlock(&s->dmu);
  count_recorded();
  return after_record(s, n, since_cut, seg_ok, loop);
}

tpurt_status tpurt__defer_record_launch(tpurt_stream *s, const char *name, tpurt_kernel_fn fn, const void *args,
                                        size_t args_size) {
  const char *what = name ? name : "launch";
  int nn = t_nnotes;
  /* the notes are copied out: a launch nested in what follows (a finalizer
   * run while the source line is captured) starts a list of its own */
  acc stack_notes[STACK_NOTES];
  acc *notes = nn <= STACK_NOTES ? stack_notes : malloc(sizeof *notes * (size_t)nn);
  int overflow = t_notes_overflow;
  t_nnotes = 0;
  t_notes_overflow = 0;
  if (!notes) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory while recording", what);
  if (nn) memcpy(notes, t_notes, (size_t)nn * sizeof *notes);
  /* promises named in the argument bytes (views copied into the arguments) */
  tpurt_devptr extra[64];
  int nextra = 0;
  for (size_t off = 0; off + 8 <= args_size && nextra < 64; off += 8) {
    tpurt_devptr w;
    memcpy(&w, (const unsigned char *)args + off, 8);
    if (tpurt__is_promise(w)) {
      tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(w));
      if (q && q->used) extra[nextra++] = w;
    }
  }
  tpurt_status st = TPURT_OK;
  for (int i = 0; i < nn && !st; i++) st = flush_foreign(s, &notes[i].p, 1);
  if (!st && nextra) st = flush_foreign(s, extra, nextra);
  if (st) goto out;
  if (overflow) { /* too many ranges to track: run what is pending, then this launch, in order */
    st = tpurt__defer_flush_stream(s, TPURT_FLUSH_SIZE_CAP);
    if (!st) {
      tpurt__defer_bypass++;
      st = tpurt_launch(s, name, fn, args, args_size);
      tpurt__defer_bypass--;
    }
    goto out;
  }
  const char *site = site_now();
  dgraph *g;
  int was_empty;
  dnode *d = record_begin(s, &g, &was_empty);
  if (!d) {
    st = tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory while recording", what);
    goto out;
  }
  void *a = args_size ? bump_alloc(&g->mem, args_size) : NULL;
  acc *ac = bump_alloc(&g->mem, sizeof(acc) * (size_t)(nn + nextra + 1));
  if ((args_size && !a) || !ac) {
    record_abort(s, g);
    st = tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory while recording", what);
    goto out;
  }
  if (args_size) memcpy(a, args, args_size);
  memcpy(ac, notes, (size_t)nn * sizeof *ac);
  for (int i = 0; i < nextra; i++) {
    tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(extra[i]));
    ac[nn + i].p = extra[i] & ~TPURT_PROMISE_OFFMASK;
    ac[nn + i].lo = 0;
    ac[nn + i].hi = (int64_t)q->size;
    /* a promise the launch also noted is read or written as those notes
     * say; one only named in the arguments may be written */
    ac[nn + i].ro = 0;
    for (int k = 0; k < nn; k++)
      if (tpurt__is_promise(notes[k].p) && tpurt__promise_id(notes[k].p) == tpurt__promise_id(extra[i]))
        ac[nn + i].ro = 1;
  }
  d->kind = N_OPAQUE;
  d->name = name;
  d->site = site;
  d->corr = tpurt__trace_corr;
  d->fn = fn;
  d->args = a;
  d->args_size = args_size;
  d->acc = ac;
  d->nacc = nn + nextra;
  st = record_end(s, g, d, was_empty);
out:
  if (notes != stack_notes) free(notes);
  return st;
}

tpurt_status tpurt__defer_record_ew(tpurt_stream *s, const tpurt_ew_program *prog, const tpurt_view *outs,
                                    const tpurt_view *ins, int nin, const double *scalars, int nscalars,
                                    const char *name) {
  t_nnotes = 0;
  t_notes_overflow = 0;
  int nout = prog->nout;
  tpurt_devptr fp[2 * TPURT_EW_MAX_IO];
  for (int i = 0; i < nout; i++) fp[i] = outs[i].ptr;
  for (int i = 0; i < nin; i++) fp[nout + i] = ins[i].ptr;
  tpurt_status st = flush_foreign(s, fp, nout + nin);
  if (st) return st;
  const char *site = site_now();
  dgraph *g;
  int was_empty;
  dnode *d = record_begin(s, &g, &was_empty);
  if (!d) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "elementwise: out of host memory while recording");
  tpurt_ew_inst *inst = bump_alloc(&g->mem, sizeof(tpurt_ew_inst) * (size_t)prog->ninst);
  tpurt_view *views = bump_alloc(&g->mem, sizeof(tpurt_view) * (size_t)(nout + nin));
  double *sc = nscalars ? bump_alloc(&g->mem, sizeof(double) * (size_t)nscalars) : NULL;
  if (!inst || !views || (nscalars && !sc)) {
    record_abort(s, g);
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "elementwise: out of host memory while recording");
  }
  memcpy(inst, prog->inst, sizeof(tpurt_ew_inst) * (size_t)prog->ninst);
  for (int i = 0; i < nout + nin; i++) {
    const tpurt_view *v = i < nout ? &outs[i] : &ins[i - nout];
    tpurt_view *w = &views[i];
    w->ptr = v->ptr;
    w->dtype = v->dtype;
    w->ndim = v->ndim;
    memcpy(w->sizes, v->sizes, sizeof(int64_t) * (size_t)v->ndim);
    memcpy(w->strides, v->strides, sizeof(int64_t) * (size_t)v->ndim);
  }
  if (nscalars) memcpy(sc, scalars, sizeof(double) * (size_t)nscalars);
  d->kind = N_EW;
  d->nout = (uint8_t)nout;
  d->nin = (uint8_t)nin;
  d->nscal = (uint8_t)nscalars;
  d->ninst = prog->ninst;
  d->compute = prog->compute;
  d->inst = inst;
  memcpy(d->out_reg, prog->out_reg, sizeof d->out_reg);
  d->views = views;
  d->scal = sc;
  d->site = site;
  d->corr = tpurt__trace_corr;
  d->name = name ? name : tpurt_ew_op_name((tpurt_ew_op)prog->inst[prog->ninst - 1].op);
  return record_end(s, g, d, was_empty);
}

typedef struct h2d_args {
  tpurt_devptr dst;
  void *data;
  size_t n;
} h2d_args;

static tpurt_status k_h2d_staged(void *a, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  h2d_args *h = a;
  memcpy(tpurt__host_view(h->dst), h->data, h->n);
  return TPURT_OK;
}

tpurt_status tpurt__defer_record_h2d(tpurt_stream *s, tpurt_devptr dst, const void *src, size_t n) {
  t_nnotes = 0;
  t_notes_overflow = 0;
  tpurt_status st = flush_foreign(s, &dst, 1);
  if (st) return st;
  const char *site = site_now();
  dgraph *g;
  int was_empty;
  dnode *d = record_begin(s, &g, &was_empty);
  if (!d) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "copy_h2d: out of host memory while recording");
  h2d_args *a = bump_alloc(&g->mem, sizeof *a);
  void *data = bump_alloc(&g->mem, n);
  acc *ac = bump_alloc(&g->mem, sizeof *ac);
  if (!a || !data || !ac) {
    record_abort(s, g);
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "copy_h2d: out of host memory while staging %zu bytes", n);
  }
  memcpy(data, src, n);
  a->dst = dst;
  a->data = data;
  a->n = n;
  ac->p = dst;
  ac->lo = 0;
  ac->hi = (int64_t)n;
  ac->ro = 0;
  d->kind = N_H2D;
  d->name = "copy_h2d";
  d->site = site;
  d->corr = tpurt__trace_corr;
  d->fn = k_h2d_staged;
  d->args = a;
  d->args_size = sizeof *a;
  d->acc = ac;
  d->nacc = 1;
  return record_end(s, g, d, was_empty);
}

/* A free of p while s has a pending graph: recorded as a marker, done when
 * the graph runs. Returns 1 if recorded, 0 if the caller frees now. */
int tpurt__defer_record_free(tpurt_stream *s, tpurt_devptr p) {
  if (tpurt__defer_bypass || !s) return 0;
  if (defer_idle() && !tpurt__is_promise(p)) return 0;
  pthread_mutex_lock(&s->dmu);
  dgraph *g = s->dgraph;
  if (graph_empty(g)) {
    pthread_mutex_unlock(&s->dmu);
    return 0;
  }
  dnode *d = push_node(g);
  if (!d) { /* cannot record: run the graph, then free */
    pthread_mutex_unlock(&s->dmu);
    tpurt__defer_flush_stream(s, TPURT_FLUSH_SIZE_CAP);
    return 0;
  }
  d->kind = N_FREE;
  d->name = "free";
  d->freed = p;
  /* a promise is dead from here: under the lock, so a run of this graph
   * (its plan key, its settling) sees it either way consistently */
  if (tpurt__is_promise(p)) tpurt__promise_get(tpurt__promise_id(p))->live = 0;
  if (s->dearly && !atomic_load_explicit(&g_seg_ops, memory_order_relaxed)) tpurt__early_recorded(s, g);
  pthread_mutex_unlock(&s->dmu);
  return 1;
}

tpurt_status tpurt__promise_new(int dev, size_t size, tpurt_stream *s, tpurt_devptr *out) {
  if ((uint64_t)size > TPURT_PROMISE_OFFMASK)
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "Tried to allocate %zu bytes: larger than one deferred buffer can be",
                      size);
  uint32_t id = promise_new_id();
  if (!id) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "out of deferred buffer ids (too many live tensors)");
  tpurt__promise *q = tpurt__promise_get(id);
  q->size = size;
  q->dev = dev;
  q->live = 1;
  __atomic_store_n(&q->owner, s, __ATOMIC_RELEASE);
  q->local = -1;
  atomic_store(&q->real, 0);
  q->used = 1;
  pthread_mutex_lock(&s->dmu);
  dgraph *g = graph_of(s);
  int ok = 0;
  if (g) {
    int was_empty = graph_empty(g);
    if (g->np == g->capp) {
      int nc = g->capp ? g->capp * 2 : 256;
      uint32_t *np = realloc(g->promises, (size_t)nc * sizeof *np);
      if (np) {
        g->promises = np;
        g->capp = nc;
      }
    }
    if (g->np < g->capp) {
      q->local = g->np; /* (early execution runs steps of the graph before its cut) */
      g->promises[g->np++] = id;
      ok = 1;
      mark_pending(s, g, was_empty);
    }
  }
  pthread_mutex_unlock(&s->dmu);
  if (!ok) {
    promise_release_id(id);
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "out of host memory while recording an allocation");
  }
  *out = TPURT_PROMISE_TAG | ((uint64_t)id << TPURT_PROMISE_IDSHIFT);
  return TPURT_OK;
}

tpurt_status tpurt__promise_new_detached(int dev, size_t size, int live, tpurt_stream *home, tpurt_devptr *out) {
  uint32_t id = promise_new_id();
  if (!id) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "out of deferred buffer ids (too many live tensors)");
  tpurt__promise *q = tpurt__promise_get(id);
  q->size = size;
  q->dev = dev;
  q->live = (uint8_t)(live != 0);
  q->lost = 0;
  q->owner = NULL;
  q->home = home;
  q->local = -1;
  atomic_store(&q->real, 0);
  q->used = 1;
  *out = TPURT_PROMISE_TAG | ((uint64_t)id << TPURT_PROMISE_IDSHIFT);
  return TPURT_OK;
}

tpurt_status tpurt__promise_free(tpurt_devptr p) {
  uint32_t id = tpurt__promise_id(p);
  tpurt__promise *q = tpurt__promise_get(id);
  if (!q || !q->used || (p & TPURT_PROMISE_OFFMASK))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "tpurt_free: 0x%016" PRIx64 " was not returned by tpurt_malloc or was already freed", p);
  tpurt_stream *owner = __atomic_load_n(&q->owner, __ATOMIC_ACQUIRE); /* settled under its graph's lock */
  tpurt_stream *home = owner ? owner : __atomic_load_n(&q->home, __ATOMIC_ACQUIRE);
  if (tpurt__defer_record_free(home, p)) return TPURT_OK; /* (marks it dead) */
  /* nothing pending can use it: free now */
  tpurt_status st = tpurt__promise_free_real(q);
  promise_release_id(id);
  return st;
}

/* ------------------------------------------------------------------ cuts */

/* Cuts the engine makes itself, not the program. */
static int engine_cut(tpurt_flush_reason r) {
  return r == TPURT_FLUSH_SIZE_CAP || r == TPURT_FLUSH_LOOP || r == TPURT_FLUSH_SEGMENT;
}

/* Runs graph G, taken from stream s (caller holds s->dmu), with plan known
 * (NULL: the plan cache's); settles its promises, counts it in the stats
 * and the flush log, and frees G. *used (if not NULL) is the plan that ran. */
tpurt_status tpurt__graph_run_cut(tpurt_stream *s, dgraph *G, tpurt_flush_reason reason, const char *site,
                                  const plan *known, const plan **used) {
  tpurt__defer_bypass++;
  tpurt__graph_ran ran;
  int64_t tr0 = TPURT__TRACE_ON() ? tpurt__now_ns() : 0;
  tpurt_status st = tpurt__graph_execute(s, G, t_read && t_read->s == s ? t_read : NULL, known, &ran);
  const plan *P = ran.P;
  int hit = ran.hit;
  /* promises: live ones now belong to the stream's memory; dead ones go */
  for (int l = 0; l < G->np; l++) {
    uint32_t id = G->promises[l];
    tpurt__promise *q = tpurt__promise_get(id);
    q->local = -1;
    __atomic_store_n(&q->home, s, __ATOMIC_RELEASE);
    __atomic_store_n(&q->owner, NULL, __ATOMIC_RELEASE);
    if (!q->live) {
      tpurt__promise_free_real(q);
      promise_release_id(id);
    } else if (!atomic_load(&q->real)) {
      q->lost = 1; /* the graph failed before giving it memory */
    }
  }
  /* free markers of memory from outside the graph that a failed run skipped */
  if (st) {
    tpurt_status keep = st;
    char msg[TPURT_ERRMSG_LEN];
    snprintf(msg, sizeof msg, "%s", tpurt_last_error());
    for (int i = 0; i < G->n; i++)
      if (G->nodes[i].kind == N_FREE && G->nodes[i].freed && local_of(G->nodes[i].freed) < 0)
        tpurt_free(G->nodes[i].freed);
    tpurt__err(keep, "%s (in a deferred graph of %d ops cut by %s%s%s)", msg, G->n, tpurt_flush_reason_name(reason),
               site ? " at " : "", site ? site : "");
  }
  tpurt__defer_bypass--;
  pthread_mutex_lock(&g_stat_mu);
  g_stats.flushes[reason]++;
  if (hit)
    g_stats.cache_hits++;
  else if (P)
    g_stats.graphs_built++;
  if (P) {
    g_stats.kernels_launched += (uint64_t)P->kernels;
    g_stats.fused_kernels += (uint64_t)P->fused_kernels;
    g_stats.ops_fused += (uint64_t)P->ops_fused;
    g_stats.ops_eliminated += (uint64_t)P->ops_eliminated;
    g_stats.stores_eliminated += (uint64_t)P->stores_eliminated;
    g_stats.values_recomputed += (uint64_t)P->nremat;
  }
  g_stats.bytes_materialized += ran.bytes_materialized;
  g_stats.bytes_recomputed += ran.bytes_recomputed;
  g_stats.bytes_never_materialized += ran.bytes_never_materialized;
  g_stats.cached_plans = tpurt__plan_cache_size();
  tpurt_flush_record *r = &g_log[g_nlog % FLUSH_LOG];
  r->reason = reason;
  r->site = site ? site : "";
  r->ops = G->nops;
  r->kernels = P ? P->kernels : 0;
  r->cache_hit = hit;
  g_nlog++;
  if (tr0) tpurt__trace_emit(TPURT_TRACE_CUT, tr0, tpurt__now_ns() - tr0, tpurt_flush_reason_name(reason), r->site, s->dev, (int)s->id, (uint64_t)r->kernels, (uint64_t)hit, reason, G->nops);
  pthread_mutex_unlock(&g_stat_mu);
  /* the recorded memory (staged host->device data among it) is freed on
   * the worker, after the kernels that read it */
  if (G->mem.head) {
    bump b = G->mem;
    tpurt__defer_bypass++;
    if (tpurt__enqueue(s, "free_recorded_graph", k_free_bump, &b, sizeof b, NULL) != TPURT_OK) {
      tpurt__stream_wait_seq(s, tpurt__stream_enqueued(s));
      bump_free(&b);
    }
    tpurt__defer_bypass--;
  }
  free(G->nodes);
  free(G->promises);
  free(G);
  if (used) *used = P;
  return st;
}

/* Runs s's pending graph. */
tpurt_status tpurt__defer_flush_stream(tpurt_stream *s, tpurt_flush_reason reason) {
  if (!s) return TPURT_OK;
  /* A hint belongs to the program cut it was set for, which consumes it
   * whether or not it finds work; cuts the engine makes itself (size cap,
   * loop, segment) neither take nor clear it. */
  int internal = engine_cut(reason);
  if (!internal && t_hint >= 0) {
    reason = (tpurt_flush_reason)t_hint;
    t_hint = -1;
  }
  if (defer_idle()) return TPURT_OK;
  /* nothing recorded on this stream and no graph of it being run by another
   * thread (work recorded meanwhile comes after) */
  if (!__atomic_load_n(&s->dgraph, __ATOMIC_SEQ_CST) && !atomic_load(&s->defer_running)) return TPURT_OK;
  /* the source line is asked for before taking the graph lock: the callback
   * may wait for Python's GIL, held by a thread that waits to record */
  tpurt_site_fn sf = atomic_load(&g_site_fn);
  const char *site = sf && reason != TPURT_FLUSH_SEGMENT ? sf(&reason) : NULL;
  pthread_mutex_lock(&s->dmu);
  dgraph *G = s->dgraph;
  if (graph_empty(G)) {
    pthread_mutex_unlock(&s->dmu);
    return TPURT_OK;
  }
  tpurt__defer_run_begin(s); /* before it stops being pending (see g_running_graphs) */
  atomic_fetch_sub(&g_pending_graphs, 1);
  __atomic_store_n(&s->dgraph, NULL, __ATOMIC_SEQ_CST); /* new recordings start a new graph (after this one) */
  /* loop detection: a graph cut by the size cap whose ops repeat with period
   * P makes later graphs k*P ops long, so every one has the same structure */
  if (reason == TPURT_FLUSH_SIZE_CAP) {
    int P = find_period(G);
    int cap = atomic_load(&g_max_ops);
    s->defer_loop_len = P > 0 ? P * (cap / P) : 0;
  } else if (!internal) {
    s->defer_loop_len = 0; /* the program cuts its graphs itself */
    int interval = s->defer_since_cut;
    s->defer_seg_ok = interval > 0 && interval == s->defer_prev_interval;
    s->defer_prev_interval = interval;
    s->defer_since_cut = 0;
  }
  tpurt_status st = tpurt__graph_run_cut(s, G, reason, site, NULL, NULL);
  tpurt__defer_run_end(s);
  pthread_mutex_unlock(&s->dmu);
  return st;
}

tpurt_status tpurt__defer_flush_device(int dev, tpurt_flush_reason reason) {
  int internal = engine_cut(reason);
  int hint = t_hint;
  if (!internal) t_hint = -1; /* consumed by this cut (see tpurt__defer_flush_stream) */
  if (defer_idle()) return TPURT_OK;
  tpurt_stream **all;
  int n = tpurt__all_streams(&all);
  tpurt_status first = TPURT_OK;
  for (int i = 0; i < n; i++) {
    if (dev >= 0 && all[i]->dev != dev) continue;
    if (!internal) t_hint = hint;
    tpurt_status st = tpurt__defer_flush_stream(all[i], reason);
    if (st && !first) first = st;
  }
  if (!internal) t_hint = -1;
  return first;
}

tpurt_status tpurt__defer_flush_for_read(tpurt_flush_reason reason, tpurt__host_read *r) {
  /* the read's own range checks noted its source: it is no recorded launch,
   * and the notes would otherwise go to the next one (which then seemed to
   * write the value read: the loss of the step before) */
  t_nnotes = 0;
  t_notes_overflow = 0;
  r->placed = 0;
  t_read = r;
  tpurt_status st = tpurt__defer_flush_device(r->s->dev, reason);
  t_read = NULL;
  return st;
}

tpurt_status tpurt_flush(int dev, tpurt_flush_reason reason) {
  TPURT__INIT_OR_RETURN();
  if ((unsigned)reason >= TPURT_FLUSH_NUM_REASONS)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_flush: invalid reason %d", (int)reason);
  if (dev >= 0) {
    tpurt_status st = tpurt__check_device(dev);
    if (st) return st;
  }
  return tpurt__defer_flush_device(dev, reason);
}

tpurt_status tpurt_set_exec_mode(tpurt_exec_mode mode) {
  if ((unsigned)mode > TPURT_MODE_DEFER)
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "invalid execution mode %d", (int)mode);
  TPURT__INIT_OR_RETURN();
  tpurt_status st = TPURT_OK;
  if (mode != TPURT_MODE_DEFER && atomic_load(&tpurt__defer_on)) {
    atomic_store(&tpurt__defer_on, 0);
    st = tpurt__defer_flush_device(-1, TPURT_FLUSH_MODE);
  }
  tpurt_set_launch_blocking(mode == TPURT_MODE_BLOCKING);
  if (mode == TPURT_MODE_DEFER) atomic_store(&tpurt__defer_on, 1);
  return st;
}

tpurt_exec_mode tpurt_get_exec_mode(void) {
  if (atomic_load(&tpurt__defer_on)) return TPURT_MODE_DEFER;
  return tpurt_launch_blocking() ? TPURT_MODE_BLOCKING : TPURT_MODE_STRICT;
}
