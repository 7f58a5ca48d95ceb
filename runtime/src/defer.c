/*
 * defer.c — the DeferAndFuse execution mode: promises, recording, fusion,
 * the plan cache and planned execution (see "execution modes" in tpurt.h).
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
 * that could not take the value from a register). Translation of a promise
 * address goes through the promise table (one branch in tpurt__host_view).
 *
 * Planning (cached). Consecutive elementwise nodes with the same compute
 * type and the same number of elements are merged into one program (over
 * the common refinement of their shapes: each op's views arrive coalesced
 * in their own way) while no memory hazard forbids it; an elementwise node
 * that cannot join the open group but is independent of it (reads nothing
 * it writes, writes nothing it touches) runs first as its own unit, so a
 * mask computed between two ops does not split them. Inside a group, a
 * value written by an earlier node and read back with the same view (over
 * the group's shape) is taken from its register (with the rounding its
 * store would have applied); reading or writing a range that overlaps a
 * written or read range through a different view closes the group. Stores to promises that
 * die inside the graph and are read by nobody else are dropped, dead
 * instructions removed, registers allocated by linear scan. Memory is
 * allocated before the first kernel that touches a promise and freed after
 * the last, through the stream-ordered caching allocator. The plan depends
 * only on the graph's structure — ops, shapes, strides, dtypes, the aliasing
 * pattern of buffers, which promises live on — so it is cached under a hash
 * of that structure; launch scalars and addresses are bound per execution.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

_Atomic int tpurt__defer_on;
_Thread_local int tpurt__defer_bypass;
static _Atomic int g_pending_graphs; /* streams with a non-empty pending graph */
static _Thread_local int t_hint = -1;
static _Thread_local struct tpurt__host_read *t_read; /* the cut's host read (tpurt__defer_flush_for_read) */
static _Atomic(tpurt_site_fn) g_site_fn;
static _Atomic int g_max_ops = 8192;
static _Atomic int g_seg_ops = 0;

/* ------------------------------------------------------------- stats */

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
}

static _Atomic int g_nplans;
void tpurt_defer_reset_stats(void) {
  pthread_mutex_lock(&g_stat_mu);
  memset(&g_stats, 0, sizeof g_stats);
  g_nlog = 0;
  pthread_mutex_unlock(&g_stat_mu);
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
static tpurt_status promise_free_real(tpurt__promise *q) {
  tpurt_devptr r = atomic_load(&q->real);
  if (!r || q->real_freed) return TPURT_OK;
  q->real_freed = 1;
  tpurt__defer_bypass++;
  tpurt_status st = tpurt_free(r);
  tpurt__defer_bypass--;
  return st;
}

/* ------------------------------------------------------------- graphs */

enum { N_EW = 1, N_OPAQUE, N_H2D, N_FREE };

typedef struct acc {
  tpurt_devptr p;
  int64_t lo, hi; /* bytes [p + lo, p + hi) */
  int ro;         /* the kernel only reads this range */
} acc;

typedef struct dnode {
  uint64_t sig; /* structural signature for loop detection */
  uint8_t kind;
  uint8_t nout, nin, nscal;
  int ninst;
  tpurt_dtype compute;
  const char *name, *site;
  /* N_EW */
  tpurt_ew_inst *inst;
  uint8_t out_reg[TPURT_EW_MAX_IO];
  tpurt_view *views; /* nout outputs then nin inputs */
  double *scal;
  /* N_OPAQUE / N_H2D */
  tpurt_kernel_fn fn;
  void *args;
  size_t args_size;
  acc *acc;
  int nacc;
  /* N_FREE */
  tpurt_devptr freed;
} dnode;

typedef struct bump {
  struct bchunk *head;
} bump;
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

typedef struct dgraph {
  dnode *nodes;
  int n, cap;
  int nops; /* nodes that are not free markers */
  uint32_t *promises; /* allocated while recording, in order */
  int np, capp;
  bump mem;
} dgraph;

static dgraph *graph_of(tpurt_stream *s) {
  if (!s->dgraph) {
    s->dgraph = calloc(1, sizeof(dgraph));
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

void tpurt__defer_note_reads(int on) { t_note_ro = on; }

void tpurt__defer_note(tpurt_devptr p, int64_t lo, int64_t hi) {
  if (!tpurt__deferring()) return;
  if (t_nnotes == t_capnotes && t_capnotes < MAX_NOTES) {
    int nc = t_capnotes ? 2 * t_capnotes : 256;
    acc *grown = realloc(t_notes, sizeof *grown * (size_t)nc);
    if (grown) {
      t_notes = grown;
      t_capnotes = nc;
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
    if (q && q->owner && q->owner != s) {
      tpurt_status st = tpurt__defer_flush_stream(q->owner, TPURT_FLUSH_STREAM);
      if (st) return st;
    }
  }
  return TPURT_OK;
}

static uint64_t mix(uint64_t h, uint64_t x);

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
static tpurt_status after_record(tpurt_stream *s, int n, int since_cut, int seg_ok) {
  int loop = s->defer_loop_len;
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
  int seg_ok = s->defer_seg_ok;
  pthread_mutex_unlock(&s->dmu);
  count_recorded();
  return after_record(s, n, since_cut, seg_ok);
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
  if (!st) st = flush_foreign(s, extra, nextra);
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
  if (atomic_load_explicit(&g_pending_graphs, memory_order_acquire) == 0 && !tpurt__is_promise(p)) return 0;
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
  q->owner = s;
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

tpurt_status tpurt__promise_free(tpurt_devptr p) {
  uint32_t id = tpurt__promise_id(p);
  tpurt__promise *q = tpurt__promise_get(id);
  if (!q || !q->used || (p & TPURT_PROMISE_OFFMASK))
    return tpurt__err(TPURT_ERR_INVALID_ARGUMENT,
                      "tpurt_free: 0x%016" PRIx64 " was not returned by tpurt_malloc or was already freed", p);
  tpurt_stream *home = q->owner ? q->owner : q->home;
  if (tpurt__defer_record_free(home, p)) {
    q->live = 0;
    return TPURT_OK;
  }
  /* nothing pending can use it: free now */
  tpurt_status st = promise_free_real(q);
  promise_release_id(id);
  return st;
}

/* --------------------------------------------------------------- hashing */

static uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}
static inline uint64_t mixd(uint64_t h, double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return mix(h, u);
}

/* ------------------------------------------------------------- planning */

/* Units of execution: a fused group, an opaque node, a free marker, a chain
 * of foreach launches run as one pass. */
enum { U_GROUP = 1, U_NODE, U_FREE, U_CHAIN };
/* Steps of a plan. */
enum { S_ALLOC = 1, S_RELEASE, S_UNIT, S_RALLOC, S_RRELEASE }; /* R: memory of a recomputed copy */

/* A value recomputed for its late readers: promise l is released after its
 * early readers; unit `unit` (an elementwise group) writes a copy into
 * memory of its own, and every later unit reads the copy. */
typedef struct remat {
  int l, unit, group;
  int first, last;             /* units touching the copy */
  int early_last, late_last;   /* planning: last early touch, last touch */
  int unit0;                   /* planning: the first late reader (unit may move before it) */
  int dep[2];                  /* planning: recomputed values this one's recompute reads, or -1 */
} remat;

typedef struct vref {
  int node, idx; /* idx into the node's views (outputs first) */
} vref;

typedef struct fgroup {
  tpurt_ew_program prog;
  int ndim; /* iteration shape: every member's views are split to it */
  int64_t sizes[TPURT_MAX_DIMS];
  int nin, nout;
  vref in[TPURT_EW_MAX_IO], out[TPURT_EW_MAX_IO];
  int *nodes; /* member ew nodes, in order (their scalars are concatenated) */
  int nn;
  const char *name;
  int pro_node, pro_out; /* a reduction's prologue: its node + 1 (0: none), and the output it reads */
  const char *pro_name;
  int in_red; /* a reduction's epilogue: runs inside the reduction's kernel */
} fgroup;

typedef struct unit {
  int kind, idx; /* group index / node index / chain index */
} unit;

/* Consecutive foreach launches run as one pass (kernels/optim.c): members,
 * the memory ranges the pass touches (the members' notes as (node, note)
 * pairs, without the values it keeps in registers). */
typedef struct fchain {
  int *nodes, nn;
  int *acc, nacc;
  tpurt__fe_chain *fc;
  const char *name;
} fchain;

typedef struct pstep {
  int kind, a;
} pstep;

typedef struct plan {
  uint64_t key, key2;
  int nnodes, nprom;
  fgroup *groups;
  int ngroups;
  unit *units;
  int nunits;
  pstep *steps;
  int nsteps;
  uint8_t *materialize; /* per local promise */
  struct remat *remat;  /* recomputed values (see plan_remat) */
  int nremat;
  int *remat_of; /* per local promise: its remat slot or -1 */
  fchain *chains;
  int nchains;
  const char **epi; /* per unit: a GEMM unit's name with the group after it as its epilogue, or NULL */
  uint8_t *pro_skip; /* per node: a reduction run inside its prologue group's kernel */
  int *red_epi;       /* per node: a reduction's epilogue group's unit + 1 (0: none) */
  const char **red_name; /* per node: the name of a reduction's kernel with its epilogue */
  int kernels, fused_kernels, ops_fused, ops_eliminated, stores_eliminated;
  struct plan *next;
} plan;

#define PLAN_BUCKETS 1024
static plan *g_plans[PLAN_BUCKETS];
static pthread_mutex_t g_plan_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *intern(const char *s) {
  /* plans live for the process: a small table of names */
  static struct istr {
    char *s;
    struct istr *next;
  } *tab[256];
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  uint64_t h = 1469598103934665603ull;
  for (const char *c = s; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  pthread_mutex_lock(&mu);
  struct istr *e = tab[h % 256];
  for (; e; e = e->next)
    if (!strcmp(e->s, s)) break;
  if (!e) {
    e = malloc(sizeof *e);
    if (e) {
      e->s = strdup(s);
      if (!e->s) {
        free(e);
        e = NULL;
      } else {
        e->next = tab[h % 256];
        tab[h % 256] = e;
      }
    }
  }
  pthread_mutex_unlock(&mu);
  return e ? e->s : "fused";
}

/* A kernel's name from its member nodes: "fused(a,b,...)" (the member's
 * own name for one), interned; members that no longer fit are left out. */
static const char *fused_name(const dgraph *G, const int *nodes, int n) {
  char name[160];
  const int cap = (int)sizeof name;
  int len = snprintf(name, sizeof name, "%s", n > 1 ? "fused(" : "");
  for (int m = 0; m < n && len < cap - 8; m++)
    len += snprintf(name + len, (size_t)(cap - len), "%s%s", m ? "," : "", G->nodes[nodes[m]].name);
  if (len > cap - 2) len = cap - 2; /* snprintf counts what did not fit; keep room for ")" */
  if (n > 1) snprintf(name + len, (size_t)(cap - len), ")");
  return intern(name);
}

static int view_eq(const tpurt_view *a, const tpurt_view *b) {
  if (a->ptr != b->ptr || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
  for (int k = 0; k < a->ndim; k++)
    if (a->sizes[k] != b->sizes[k] || a->strides[k] != b->strides[k]) return 0;
  return 1;
}

/* Shapes of equal numel, walked row-major, are the same elements in the
 * same order; a group runs over the common refinement of its members'
 * shapes (e.g. [8192] and [32, 256] -> [32, 256]), since each op's views
 * arrive coalesced in their own way. The refinement splits at every suffix
 * product of either shape; it exists when those divide each other. */
static int refine_shape(int na, const int64_t *a, int nb, const int64_t *b, int *nc, int64_t *c) {
  int64_t bp[2 * TPURT_MAX_DIMS + 2];
  int n = 0;
  int64_t pa = 1, pb = 1;
  for (int k = 0; k < na; k++) pa *= a[k];
  for (int k = 0; k < nb; k++) pb *= b[k];
  if (pa != pb || pa == 0) return 0;
  /* suffix products of both, merged in decreasing order (each list is non-increasing) */
  int i = 0, j = 0;
  int64_t sa = pa, sb = pb;
  while (i <= na || j <= nb) {
    int64_t x = i <= na ? sa : -1, y = j <= nb ? sb : -1, v = x > y ? x : y;
    if (n == 0 || bp[n - 1] != v) {
      if (n > 0 && bp[n - 1] % v) return 0;
      bp[n++] = v;
    }
    if (x == v && i <= na) sa = i < na ? sa / a[i] : -1, i++;
    if (y == v && j <= nb) sb = j < nb ? sb / b[j] : -1, j++;
  }
  /* bp runs from the numel down to 1 */
  if (n - 1 > TPURT_MAX_DIMS) return 0;
  *nc = n - 1;
  for (int k = 0; k + 1 < n; k++) c[k] = bp[k] / bp[k + 1];
  return 1;
}

/* v re-expressed over shape c (a refinement of v's shape): each of v's
 * dims splits into consecutive dims of c with row-major strides. */
static int split_view(const tpurt_view *v, int nc, const int64_t *c, tpurt_view *out) {
  *out = *v;
  out->ndim = nc;
  int j = 0;
  for (int k = 0; k < v->ndim; k++) {
    int64_t n = v->sizes[k];
    if (n == 1) continue;
    int j0 = j;
    int64_t p = 1;
    while (j < nc && p < n) p *= c[j++];
    if (p != n) return 0;
    int64_t st = v->strides[k];
    for (int q = j - 1; q >= j0; q--) {
      out->sizes[q] = c[q];
      out->strides[q] = st;
      st *= c[q];
    }
  }
  return j == nc;
}

/* a and b name the same elements in the same order over shape c */
static int view_eq_over(const tpurt_view *a, const tpurt_view *b, int nc, const int64_t *c) {
  if (a->ptr != b->ptr || a->dtype != b->dtype) return 0;
  if (view_eq(a, b)) return 1;
  tpurt_view x, y;
  if (!split_view(a, nc, c, &x) || !split_view(b, nc, c, &y)) return 0;
  for (int k = 0; k < nc; k++)
    if (x.strides[k] != y.strides[k]) return 0;
  return 1;
}

static void view_range(const tpurt_view *v, uint64_t *lo, uint64_t *hi) {
  int64_t l, h;
  tpurt__view_extent(v, &l, &h);
  *lo = v->ptr + (uint64_t)l;
  *hi = v->ptr + (uint64_t)h;
}

static int ranges_overlap(const tpurt_view *a, const tpurt_view *b) {
  uint64_t al, ah, bl, bh;
  view_range(a, &al, &ah);
  view_range(b, &bl, &bh);
  return al < bh && bl < ah;
}

/* Local index of a promise of this graph (-1 if p is not one). */
static int local_of(tpurt_devptr p) {
  if (!tpurt__is_promise(p)) return -1;
  tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(p));
  return q ? q->local : -1;
}

/* --- group building --- */

typedef struct vinst {
  uint16_t op;
  int dst, src[3];
  double p[4];
} vinst;

#define G_MAX_VI (2 * TPURT_EW_MAX_INST)
typedef struct gstate {
  tpurt_dtype compute;
  int ndim; /* the group's iteration shape (refines every member's shape) */
  int64_t sizes[TPURT_MAX_DIMS];
  vinst vi[G_MAX_VI];
  int nvi, nvreg;
  struct {
    const tpurt_view *v;
    int vreg;
    vref ref;
  } w[TPURT_EW_MAX_IO], in[TPURT_EW_MAX_IO];
  int nw, nin;
  int nscal;
  int nodes[G_MAX_VI];
  int nn;
} gstate;

static int needs_cast(tpurt_dtype stored, tpurt_dtype compute) { return stored != compute; }

static int emit(gstate *g, uint16_t op, int s0, int s1, int s2, const double *p) {
  if (g->nvi >= G_MAX_VI) return -1;
  vinst *v = &g->vi[g->nvi++];
  v->op = op;
  v->dst = g->nvreg++;
  v->src[0] = s0;
  v->src[1] = s1;
  v->src[2] = s2;
  if (p)
    memcpy(v->p, p, sizeof v->p);
  else
    memset(v->p, 0, sizeof v->p);
  return v->dst;
}

static int op_nsrc(uint16_t op) { return tpurt__ew_nsrc(op); }

/* Linear-scan register allocation of g's instructions with the given
 * live-out vregs. Writes the program (instructions and out_reg). Returns 0
 * or -1 if it needs more than TPURT_EW_MAX_REGS registers or instructions. */
static int assemble(const gstate *g, const int *outs, int nout, tpurt_ew_program *prog, int *keep_inst) {
  int nv = g->nvreg;
  int *last = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
  int *live = calloc((size_t)(nv ? nv : 1), sizeof(int));
  int *phys = malloc(sizeof(int) * (size_t)(nv ? nv : 1));
  int rc = -1;
  if (!last || !live || !phys) goto out;
  for (int v = 0; v < nv; v++) {
    last[v] = -1;
    phys[v] = -1;
  }
  for (int k = 0; k < nout; k++) live[outs[k]] = 1;
  /* dead code elimination, backwards */
  for (int i = g->nvi - 1; i >= 0; i--) {
    const vinst *I = &g->vi[i];
    keep_inst[i] = live[I->dst];
    if (!keep_inst[i]) continue;
    for (int s = 0; s < op_nsrc(I->op); s++) live[I->src[s]] = 1;
  }
  int n = 0;
  for (int i = 0; i < g->nvi; i++) {
    if (!keep_inst[i]) continue;
    n++;
    for (int s = 0; s < op_nsrc(g->vi[i].op); s++) last[g->vi[i].src[s]] = i;
  }
  if (n > TPURT_EW_MAX_INST) goto out;
  for (int k = 0; k < nout; k++) last[outs[k]] = G_MAX_VI + 1;
  uint32_t used = 0;
  int pi = 0;
  for (int i = 0; i < g->nvi; i++) {
    if (!keep_inst[i]) continue;
    const vinst *I = &g->vi[i];
    int r = -1;
    for (int q = 0; q < TPURT_EW_MAX_REGS; q++)
      if (!(used & (1u << q))) {
        r = q;
        break;
      }
    if (r < 0) goto out;
    tpurt_ew_inst *P = &prog->inst[pi++];
    P->op = I->op;
    P->dst = (uint8_t)r;
    for (int s = 0; s < 3; s++) P->src[s] = (uint8_t)(s < op_nsrc(I->op) ? phys[I->src[s]] : 0);
    memcpy(P->p, I->p, sizeof P->p);
    /* free sources whose last use is here, then hold dst */
    for (int s = 0; s < op_nsrc(I->op); s++)
      if (last[I->src[s]] == i) used &= ~(1u << phys[I->src[s]]);
    phys[I->dst] = r;
    if (last[I->dst] >= 0) used |= 1u << r; /* read later or stored */
  }
  prog->ninst = pi;
  prog->nout = nout;
  prog->compute = g->compute;
  for (int k = 0; k < nout; k++) prog->out_reg[k] = (uint8_t)phys[outs[k]];
  rc = 0;
out:
  free(last);
  free(live);
  free(phys);
  return rc;
}

/* Tries to append ew node ni to g. Returns 1 on success (g updated), 0 if
 * the node cannot join the group. */
static int group_add(gstate *g, const dgraph *G, int ni) {
  const dnode *d = &G->nodes[ni];
  const tpurt_view *o0 = &d->views[0];
  int nc = o0->ndim;
  int64_t c[TPURT_MAX_DIMS];
  if (g->nn > 0) {
    if (d->compute != g->compute || g->nn >= G_MAX_VI) return 0;
    if (!refine_shape(g->ndim, g->sizes, o0->ndim, o0->sizes, &nc, c)) return 0;
  } else { /* size-1 dims carry nothing: the shape without them */
    nc = 0;
    for (int k = 0; k < o0->ndim; k++)
      if (o0->sizes[k] != 1) c[nc++] = o0->sizes[k];
  }
  gstate *t = malloc(sizeof *t);
  if (!t) return 0;
  *t = *g;
  if (t->nn == 0) t->compute = d->compute;
  t->ndim = nc;
  memcpy(t->sizes, c, sizeof(int64_t) * (size_t)nc);
  int map[TPURT_EW_MAX_REGS];
  int ok = 1;
  for (int i = 0; i < d->ninst && ok; i++) {
    const tpurt_ew_inst *I = &d->inst[i];
    int r = -1;
    if (I->op == TPURT_EW_LOAD) {
      int j = (int)I->p[0];
      const tpurt_view *v = &d->views[d->nout + j];
      int fw = -1;
      for (int k = 0; k < t->nw; k++)
        if (view_eq_over(t->w[k].v, v, t->ndim, t->sizes)) fw = k;
      if (fw >= 0) {
        r = t->w[fw].vreg;
        if (needs_cast(v->dtype, t->compute)) {
          double p[4] = {(double)v->dtype, 0, 0, 0};
          r = emit(t, TPURT_EW_CAST, r, 0, 0, p);
        }
      } else {
        for (int k = 0; k < t->nw && ok; k++)
          if (ranges_overlap(t->w[k].v, v)) ok = 0;
        if (!ok) break;
        int fi = -1;
        for (int k = 0; k < t->nin; k++)
          if (view_eq_over(t->in[k].v, v, t->ndim, t->sizes)) fi = k;
        if (fi >= 0) {
          r = t->in[fi].vreg;
        } else {
          if (t->nin >= TPURT_EW_MAX_IO) {
            ok = 0;
            break;
          }
          double p[4] = {(double)t->nin, 0, 0, 0};
          r = emit(t, TPURT_EW_LOAD, 0, 0, 0, p);
          t->in[t->nin].v = v;
          t->in[t->nin].vreg = r;
          t->in[t->nin].ref.node = ni;
          t->in[t->nin].ref.idx = d->nout + j;
          t->nin++;
        }
      }
    } else if (I->op == TPURT_EW_SCALAR || I->op == TPURT_EW_UNIFORM) { /* scalar indices move with the group */
      double p[4] = {I->p[0] + t->nscal, I->p[1], I->p[2], I->p[3]};
      r = emit(t, I->op, 0, 0, 0, p);
    } else {
      int ns = op_nsrc(I->op);
      int s[3] = {0, 0, 0};
      for (int q = 0; q < ns; q++) s[q] = map[I->src[q]];
      r = emit(t, I->op, s[0], s[1], s[2], I->p);
    }
    if (r < 0) ok = 0;
    map[I->dst] = r;
  }
  for (int k = 0; k < d->nout && ok; k++) {
    const tpurt_view *o = &d->views[k];
    for (int q = 0; q < t->nin && ok; q++)
      if (!view_eq_over(t->in[q].v, o, t->ndim, t->sizes) && ranges_overlap(t->in[q].v, o)) ok = 0;
    int fw = -1;
    for (int q = 0; q < t->nw && ok; q++) {
      if (view_eq_over(t->w[q].v, o, t->ndim, t->sizes))
        fw = q;
      else if (ranges_overlap(t->w[q].v, o))
        ok = 0;
    }
    if (!ok) break;
    int vr = map[d->out_reg[k]];
    if (fw >= 0) {
      t->w[fw].vreg = vr;
      t->w[fw].ref.node = ni;
      t->w[fw].ref.idx = k;
    } else {
      if (t->nw >= TPURT_EW_MAX_IO) {
        ok = 0;
        break;
      }
      t->w[t->nw].v = o;
      t->w[t->nw].vreg = vr;
      t->w[t->nw].ref.node = ni;
      t->w[t->nw].ref.idx = k;
      t->nw++;
    }
  }
  if (ok) {
    /* the pessimistic program (every write stored) must fit */
    int outs[TPURT_EW_MAX_IO];
    for (int k = 0; k < t->nw; k++) outs[k] = t->w[k].vreg;
    tpurt_ew_program *prog = malloc(sizeof *prog);
    int *keep = malloc(sizeof(int) * G_MAX_VI);
    ok = prog && keep && assemble(t, outs, t->nw, prog, keep) == 0;
    free(prog);
    free(keep);
  }
  if (ok) {
    t->nscal += d->nscal;
    t->nodes[t->nn++] = ni;
    *g = *t;
  }
  free(t);
  return ok;
}

/* Can ew node ni run before the open group g (it reads nothing g writes,
 * writes nothing g reads or writes)? Then a node that cannot join g (other
 * shape, e.g. a mask computed between two ops on the scores) runs first as
 * its own unit and g stays open for the nodes after it. */
static int independent_of(const gstate *g, const dgraph *G, int ni) {
  const dnode *d = &G->nodes[ni];
  for (int v = 0; v < d->nout + d->nin; v++) {
    const tpurt_view *x = &d->views[v];
    for (int k = 0; k < g->nw; k++)
      if (ranges_overlap(g->w[k].v, x)) return 0;
    for (int k = 0; k < g->nin && v < d->nout; k++)
      if (ranges_overlap(g->in[k].v, x)) return 0;
  }
  return 1;
}

/* Per local promise facts gathered while planning. */
typedef struct pfacts {
  uint8_t live;    /* still held by the user at the end */
  uint8_t memread; /* read from memory by some unit (or written by an opaque kernel) */
  int first, last; /* units that touch it in memory */
} pfacts;

static int may_fail(const dnode *d) {
  if (d->compute != TPURT_I64) return 0;
  for (int i = 0; i < d->ninst; i++) {
    uint16_t op = d->inst[i].op;
    if (op == TPURT_EW_DIV || op == TPURT_EW_DIV_TRUNC || op == TPURT_EW_DIV_FLOOR || op == TPURT_EW_REMAINDER ||
        op == TPURT_EW_FMOD)
      return 1;
  }
  return 0;
}

/* Unit u touches p: a promise, or from its remat unit on, the promise's
 * recomputed copy (after plan_remat). */
static void touch(const plan *P, pfacts *f, tpurt_devptr p, int u) {
  int l = local_of(p);
  if (l < 0) return;
  int r = P->remat_of[l];
  int *first = &f[l].first, *last = &f[l].last;
  if (r >= 0 && u >= P->remat[r].unit) first = &P->remat[r].first, last = &P->remat[r].last;
  if (*first < 0) *first = u;
  *last = u;
}

static void group_reset(gstate *g) { g->nn = g->nvi = g->nvreg = g->nw = g->nin = g->nscal = 0; }

static void push_unit(plan *P, int kind, int idx) {
  P->units[P->nunits].kind = kind;
  P->units[P->nunits].idx = idx;
  P->nunits++;
}

/* Appends group g to the groups' states *gl and as the plan's next unit.
 * Returns 0 when out of host memory. */
static int push_group(plan *P, gstate **gl, int *ngl, int *capgl, const gstate *g) {
  if (*ngl == *capgl) {
    int cap = *capgl ? *capgl * 2 : 16;
    gstate *ng = realloc(*gl, sizeof(gstate) * (size_t)cap);
    if (!ng) return 0;
    *gl = ng;
    *capgl = cap;
  }
  (*gl)[*ngl] = *g;
  push_unit(P, U_GROUP, (*ngl)++);
  return 1;
}

static void free_plan_contents(plan *P) {
  for (int gi = 0; gi < P->ngroups; gi++) free(P->groups[gi].nodes);
  free(P->groups);
  free(P->units);
  free(P->steps);
  free(P->materialize);
  free(P->remat);
  free(P->remat_of);
  for (int c = 0; c < P->nchains; c++) {
    free(P->chains[c].nodes);
    free(P->chains[c].acc);
    free(P->chains[c].fc);
  }
  free(P->chains);
  free(P->epi);
  free(P->pro_skip);
  free(P->red_epi);
  free(P->red_name);
}

/* The memory notes of an opaque unit (a node or a chain). */
static int opaque_nacc(const plan *P, const dgraph *G, const unit *U) {
  return U->kind == U_NODE ? G->nodes[U->idx].nacc : P->chains[U->idx].nacc;
}
static const acc *opaque_acc(const plan *P, const dgraph *G, const unit *U, int i) {
  if (U->kind == U_NODE) return &G->nodes[U->idx].acc[i];
  const fchain *C = &P->chains[U->idx];
  return &G->nodes[C->acc[2 * i]].acc[C->acc[2 * i + 1]];
}

/* Assembles g's program for live-out vregs outs into F (program, inputs
 * that survived dead-code elimination, renumbered; nin, nout). */
static int assemble_group(const gstate *g, const int *outs, int nout, fgroup *F) {
  int keep[G_MAX_VI];
  if (assemble(g, outs, nout, &F->prog, keep) != 0) return -1;
  int slot[TPURT_EW_MAX_IO], nin = 0;
  for (int k = 0; k < g->nin; k++) slot[k] = -1;
  for (int i = 0, pi = 0; i < g->nvi; i++) {
    if (!keep[i]) continue;
    if (g->vi[i].op == TPURT_EW_LOAD) {
      int k = (int)g->vi[i].p[0];
      if (slot[k] < 0) {
        slot[k] = nin;
        F->in[nin++] = g->in[k].ref;
      }
      F->prog.inst[pi].p[0] = slot[k];
    }
    pi++;
  }
  F->nin = nin;
  F->nout = nout;
  return 0;
}

/* ------------------------------------------------- rematerialization
 *
 * Peak memory of a training step is the activations the forward pass
 * stores for the backward pass. One that an elementwise group computed
 * (a GELU output read by the next GEMM and again by the weight-gradient
 * GEMM, a dropout output or mask) is recomputed instead of kept when the
 * group's instructions can run again just before its late readers: every
 * value they load is still in memory there and unchanged since. Loads are
 * cut at the group's own stores (bias + GELU written in place: the GELU is
 * recomputed from the stored sum; a dropout output from its mask, kept or
 * recomputed first, without drawing its random numbers again). The copy
 * gets memory of its own at
 * execution; the late readers' addresses are redirected to it. A value
 * may be recomputed from another recomputed value's copy (SwiGLU: the
 * product silu(a) * b from the copy of silu(a)); that copy's recompute
 * then moves up to run first, and it is kept while a kept one reads it. */

#define REMAT_GAP 16                          /* units between an early and a late touch */
#define REMAT_MIN_BYTES ((uint64_t)1 << 16)   /* smaller values are not worth a kernel */
#define REMAT_MAX_INST 32

/* Can unit u change bytes [lo, hi)? Groups write their stores, opaque
 * kernels every range they did not declare read-only; a free of memory
 * from outside the graph lets later allocations reuse it. */
static int unit_writes(const plan *P, const dgraph *G, int u, uint64_t lo, uint64_t hi) {
  const unit *U = &P->units[u];
  if (U->kind == U_GROUP) {
    const fgroup *F = &P->groups[U->idx];
    for (int k = 0; k < F->nout; k++) {
      uint64_t a, b;
      view_range(&G->nodes[F->out[k].node].views[F->out[k].idx], &a, &b);
      if (a < hi && lo < b) return 1;
    }
    return 0;
  }
  if (U->kind == U_FREE) return local_of(G->nodes[U->idx].freed) < 0 && !tpurt__is_promise(lo);
  for (int k = 0, n = opaque_nacc(P, G, U); k < n; k++) {
    const acc *A = opaque_acc(P, G, U, k);
    uint64_t a = A->p + (uint64_t)A->lo, b = A->p + (uint64_t)A->hi;
    if (!A->ro && a < hi && lo < b) return 1;
  }
  return 0;
}


/* Every promise's touches in unit order (one entry per unit): promise l's
 * are [start[l], start[l + 1]) of u (unit) and wr (the unit may write it). */
typedef struct touches {
  int *start, *u, *fill;
  uint8_t *wr;
} touches;

static void add_touch(touches *t, int pass, tpurt_devptr p, int u, int wr) {
  int l = local_of(p);
  if (l < 0) return;
  if (pass == 0) { /* count units; fill: last unit counted */
    if (t->fill[l] != u) {
      t->fill[l] = u;
      t->start[l + 1]++;
    }
    return;
  }
  int k = t->fill[l]; /* next entry of l */
  if (k > t->start[l] && t->u[k - 1] == u) {
    t->wr[k - 1] |= (uint8_t)wr;
    return;
  }
  t->u[k] = u;
  t->wr[k] = (uint8_t)wr;
  t->fill[l] = k + 1;
}

static void free_touches(touches *t) {
  free(t->start);
  free(t->u);
  free(t->fill);
  free(t->wr);
}

static int build_touches(const plan *P, const dgraph *G, touches *t) {
  int np = G->np;
  memset(t, 0, sizeof *t);
  t->start = calloc((size_t)np + 1, sizeof(int));
  t->fill = malloc(sizeof(int) * (size_t)(np ? np : 1));
  if (!t->start || !t->fill) return -1;
  for (int l = 0; l < np; l++) t->fill[l] = -1;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) {
      for (int l = 0; l < np; l++) t->start[l + 1] += t->start[l];
      t->u = malloc(sizeof(int) * (size_t)(t->start[np] + 1));
      t->wr = malloc((size_t)t->start[np] + 1);
      if (!t->u || !t->wr) return -1;
      for (int l = 0; l < np; l++) t->fill[l] = t->start[l];
    }
    for (int u = 0; u < P->nunits; u++) {
      const unit *U = &P->units[u];
      if (U->kind == U_GROUP) {
        const fgroup *F = &P->groups[U->idx];
        for (int k = 0; k < F->nout; k++) add_touch(t, pass, G->nodes[F->out[k].node].views[F->out[k].idx].ptr, u, 1);
        for (int k = 0; k < F->nin; k++) add_touch(t, pass, G->nodes[F->in[k].node].views[F->in[k].idx].ptr, u, 0);
      } else if (U->kind == U_NODE || U->kind == U_CHAIN) {
        for (int k = 0, n = opaque_nacc(P, G, U); k < n; k++) {
          const acc *A = opaque_acc(P, G, U, k);
          add_touch(t, pass, A->p, u, !A->ro);
        }
      }
    }
  }
  return 0;
}

/* Does v hold at unit ru what it held when unit up ran (after up's own
 * stores if `stored`, before them otherwise), still in memory? */
static int stable_until(const plan *P, const dgraph *G, const touches *t, const tpurt_view *v, int up,
                        int ru, int stored) {
  int l = local_of(v->ptr), from = stored ? up + 1 : up;
  if (l >= 0) { /* a promise: its own touches say where it may be written */
    if (!P->materialize[l] || P->remat_of[l] >= 0) return 0;
    tpurt__promise *q = tpurt__promise_get(G->promises[l]);
    int e = t->start[l + 1];
    if (!q->live && (e == t->start[l] || t->u[e - 1] < ru)) return 0; /* released before ru: no life is extended */
    for (int k = t->start[l]; k < e; k++)
      if (t->wr[k] && t->u[k] >= from && t->u[k] < ru) return 0;
    return 1;
  }
  uint64_t lo, hi;
  view_range(v, &lo, &hi);
  for (int u = from; u < ru; u++)
    if (unit_writes(P, G, u, lo, hi)) return 0;
  return 1;
}

/* Is vreg r of g always 0 or 1 (a comparison, a logical op, a class
 * test)? Such a value comes back unchanged from a store of any dtype. */
static int zero_one_valued(const gstate *g, int r) {
  if (g->compute == TPURT_C64 || g->compute == TPURT_C128) return 0;
  for (int i = 0; i < g->nvi; i++) {
    if (g->vi[i].dst != r) continue;
    switch (g->vi[i].op) {
    case TPURT_EW_EQ: case TPURT_EW_NE: case TPURT_EW_LT: case TPURT_EW_LE: case TPURT_EW_GT: case TPURT_EW_GE:
    case TPURT_EW_LOGICAL_AND: case TPURT_EW_LOGICAL_OR: case TPURT_EW_LOGICAL_XOR: case TPURT_EW_LOGICAL_NOT:
    case TPURT_EW_ISNAN: case TPURT_EW_ISINF: case TPURT_EW_ISFINITE: case TPURT_EW_ISPOSINF:
    case TPURT_EW_ISNEGINF: case TPURT_EW_SIGNBIT:
      return 1;
    default:
      return 0;
    }
  }
  return 0;
}

/* Tries to recompute promise l (see above); on success appends the
 * recompute group to P->groups (which has room) and slot `*nr` to rm
 * (unit = the index of the first late reader; plan_remat inserts the
 * recompute units). */
static int try_remat(plan *P, const dgraph *G, const gstate *gl, const touches *t, uint8_t *pinned, int l, remat *rm,
                     int *nr, int pass) {
  tpurt__promise *q = tpurt__promise_get(G->promises[l]);
  if (!P->materialize[l] || q->live || q->size < REMAT_MIN_BYTES || pinned[l]) return 0;
  const int *tu = t->u + t->start[l];
  const uint8_t *tw = t->wr + t->start[l];
  int n = t->start[l + 1] - t->start[l];
  if (n < 2 || !tw[0] || P->units[tu[0]].kind != U_GROUP) return 0;
  for (int i = 1; i < n; i++)
    if (tw[i]) return 0;
  int split = -1, gap = 0;
  for (int i = 0; i + 1 < n; i++)
    if (tu[i + 1] - tu[i] > gap) gap = tu[i + 1] - tu[i], split = i + 1;
  if (gap < REMAT_GAP) return 0;
  int up = tu[0], ru = tu[split];
  const fgroup *Fp = &P->groups[P->units[up].idx];
  const gstate *g = &gl[P->units[up].idx];
  /* the producer stores all of l, densely */
  int wk = -1;
  for (int k = 0; k < g->nw; k++)
    if (local_of(g->w[k].v->ptr) == l) wk = k;
  if (wk < 0) return 0;
  const tpurt_view *wv = g->w[wk].v;
  if ((tpurt_dtype_size(wv->dtype) == 1) != (pass == 0)) return 0;
  uint64_t lo, hi;
  view_range(wv, &lo, &hi);
  if ((lo & TPURT_PROMISE_OFFMASK) != 0 || hi - lo != q->size ||
      (uint64_t)tpurt__view_numel(wv) * tpurt_dtype_size(wv->dtype) != q->size)
    return 0;
  /* the slice: stored values of the group that are still in memory at ru
   * become loads of where they were stored — those of the compute type, and
   * 0/1 values of any type (a dropout mask: the output is recomputed from
   * the kept mask, not by drawing its random numbers again) */
  gstate *h = malloc(sizeof *h);
  if (!h) return 0;
  *h = *g;
  for (int k = 0; k < g->nw; k++) {
    if (k == wk || h->nin >= TPURT_EW_MAX_IO) continue;
    if (g->w[k].v->dtype != g->compute && !zero_one_valued(g, g->w[k].vreg)) continue;
    int lk = local_of(g->w[k].v->ptr); /* recomputed itself (the mask): loaded from its copy, see below */
    if (!(lk >= 0 && lk != l && P->remat_of[lk] >= 0) && !stable_until(P, G, t, g->w[k].v, up, ru, 1)) continue;
    for (int i = 0; i < h->nvi; i++)
      if (h->vi[i].dst == g->w[k].vreg) {
        memset(&h->vi[i], 0, sizeof h->vi[i]);
        h->vi[i].op = TPURT_EW_LOAD;
        h->vi[i].dst = g->w[k].vreg;
        h->vi[i].p[0] = h->nin;
        h->in[h->nin].v = g->w[k].v;
        h->in[h->nin].vreg = g->w[k].vreg;
        h->in[h->nin].ref = g->w[k].ref;
        h->nin++;
      }
  }
  fgroup *F = &P->groups[P->ngroups];
  memset(F, 0, sizeof *F);
  int out = g->w[wk].vreg, ok = assemble_group(h, &out, 1, F) == 0 && F->prog.ninst <= REMAT_MAX_INST;
  int dep[2] = {-1, -1}, ndep = 0;
  for (int k = 0; k < F->nin && ok; k++) {
    const tpurt_view *v = &G->nodes[F->in[k].node].views[F->in[k].idx];
    int cut = 0; /* a load of one of the producer's stores (checked when cut), or of one of its inputs? */
    for (int j = 0; j < g->nw; j++)
      if (g->w[j].ref.node == F->in[k].node && g->w[j].ref.idx == F->in[k].idx) cut = 1;
    int li = local_of(v->ptr);
    if (li >= 0 && li != l && P->remat_of[li] >= 0) {
      /* an input that is recomputed itself (a SiLU output read by the
       * SwiGLU product; the dropout mask the producer stored next to l):
       * read from its copy, whose recompute then runs no later than this
       * one (its one writer ran before up, or is up, and its own inputs
       * stay stable up to its first late reader, after ru) */
      ok = ndep < 2;
      if (ok) dep[ndep++] = P->remat_of[li];
      continue;
    }
    ok = li != l && (cut || stable_until(P, G, t, v, up, ru, 0));
  }
  free(h);
  if (!ok) return 0;
  F->ndim = Fp->ndim;
  memcpy(F->sizes, Fp->sizes, sizeof F->sizes);
  F->out[0] = g->w[wk].ref;
  F->nodes = malloc(sizeof(int) * (size_t)Fp->nn);
  if (!F->nodes) return 0;
  memcpy(F->nodes, Fp->nodes, sizeof(int) * (size_t)Fp->nn);
  F->nn = Fp->nn;
  char name[120];
  snprintf(name, sizeof name, "recompute(%s)", Fp->name);
  F->name = intern(name);
  for (int k = 0; k < F->nin; k++) {
    int li = local_of(G->nodes[F->in[k].node].views[F->in[k].idx].ptr);
    if (li >= 0) pinned[li] = 1;
  }
  pinned[l] = 1;
  P->remat_of[l] = *nr;
  rm[*nr] = (remat){l, ru, P->ngroups, -1, -1, tu[split - 1], tu[n - 1], ru, {dep[0], dep[1]}};
  P->ngroups++;
  (*nr)++;
  return 1;
}

/* Does enabled slot s's recompute read slot r's copy? */
static int reads_copy(const remat *rm, const uint8_t *on, int s, int r) {
  return on[s] && (rm[s].dep[0] == r || rm[s].dep[1] == r);
}

/* Each enabled slot's recompute unit: its first late reader, or earlier
 * when an enabled later slot reads its copy (that one's unit, settled
 * first: dependents have higher slot numbers). */
static void settle_units(remat *rm, int nr, const uint8_t *on) {
  for (int r = nr - 1; r >= 0; r--) {
    rm[r].unit = rm[r].unit0;
    for (int s = r + 1; s < nr; s++)
      if (reads_copy(rm, on, s, r) && rm[s].unit < rm[r].unit) rm[r].unit = rm[s].unit;
  }
}

/* Is slot r read by an enabled later slot? */
static int needed_by_later(const remat *rm, int nr, const uint8_t *on, int r) {
  for (int s = r + 1; s < nr; s++)
    if (reads_copy(rm, on, s, r)) return 1;
  return 0;
}

/* Peak bytes of the graph's promises when the slots with on[r] are
 * recomputed (unit indices before the recompute units are inserted): a
 * promise lives from its first to its last touch (to the end if live), a
 * recomputed one until its last early touch and its copy from its first
 * late reader to its last touch. d: scratch of nunits + 2. */
static int64_t sim_peak(const plan *P, const dgraph *G, const touches *t, remat *rm, int nr, const uint8_t *on,
                        int64_t *d) {
  int nu = P->nunits;
  memset(d, 0, sizeof(int64_t) * (size_t)(nu + 2));
  settle_units(rm, nr, on);
  for (int l = 0; l < G->np; l++) {
    int b = t->start[l], e = t->start[l + 1];
    if (!P->materialize[l] || b == e) continue;
    tpurt__promise *q = tpurt__promise_get(G->promises[l]);
    int r = P->remat_of[l], end = q->live ? nu : t->u[e - 1];
    if (r >= 0 && on[r]) end = rm[r].early_last;
    d[t->u[b]] += (int64_t)q->size;
    d[end + 1] -= (int64_t)q->size;
  }
  for (int r = 0; r < nr; r++) {
    if (!on[r]) continue;
    int64_t sz = (int64_t)tpurt__promise_get(G->promises[rm[r].l])->size;
    d[rm[r].unit] += sz;
    d[rm[r].late_last + 1] -= sz;
  }
  int64_t cur = 0, peak = 0;
  for (int u = 0; u <= nu; u++) {
    cur += d[u];
    if (cur > peak) peak = cur;
  }
  return peak;
}

/* Drops the recomputations the peak does not need (a value whose life
 * does not span the peak costs a kernel and saves nothing): later ones
 * first, each dropped when the peak without it is no higher. */
static int prune_remats(plan *P, const dgraph *G, const touches *t, remat *rm, int *nr) {
  uint8_t *on = malloc((size_t)*nr);
  int64_t *d = malloc(sizeof(int64_t) * (size_t)(P->nunits + 2));
  int *slot = malloc(sizeof(int) * (size_t)*nr); /* new slot number of each kept one */
  if (!on || !d || !slot) {
    free(on);
    free(d);
    free(slot);
    return -1;
  }
  memset(on, 1, (size_t)*nr);
  int64_t best = sim_peak(P, G, t, rm, *nr, on, d);
  for (int r = *nr - 1; r >= 0; r--) {
    if (needed_by_later(rm, *nr, on, r)) continue;
    on[r] = 0;
    int64_t pk = sim_peak(P, G, t, rm, *nr, on, d);
    if (pk <= best)
      best = pk;
    else
      on[r] = 1;
  }
  settle_units(rm, *nr, on);
  int k = 0;
  for (int r = 0; r < *nr; r++) {
    slot[r] = on[r] ? k : -1;
    P->remat_of[rm[r].l] = slot[r];
    if (on[r]) {
      rm[k] = rm[r];
      for (int i = 0; i < 2; i++)
        if (rm[k].dep[i] >= 0) rm[k].dep[i] = slot[rm[k].dep[i]]; /* enabled: needed_by_later kept it */
      k++;
    }
  }
  free(slot);
  *nr = k;
  free(on);
  free(d);
  return 0;
}

/* TORCH_TPU_DEFER_REMAT=0 turns recomputation off (A/B measurements,
 * tests); part of the plan key. */
static int remat_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_REMAT");
  return !(e && *e == '0');
}

/* Chooses the values to recompute and inserts their recompute units (each
 * just before its first late reader). Returns 0, or -1 out of memory. */
static int plan_remat(plan *P, const dgraph *G, const gstate *gl) {
  int np = G->np;
  P->remat_of = malloc(sizeof(int) * (size_t)(np ? np : 1));
  if (!P->remat_of) return -1;
  for (int l = 0; l < np; l++) P->remat_of[l] = -1;
  if (np == 0 || !remat_enabled()) return 0;
  touches t;
  int tok = build_touches(P, G, &t) == 0;
  uint8_t *pinned = calloc((size_t)np, 1);
  remat *rm = malloc(sizeof(remat) * (size_t)np);
  fgroup *ng = realloc(P->groups, sizeof(fgroup) * (size_t)(P->ngroups + np));
  unit *nu = NULL;
  int rc = -1, nr = 0;
  if (ng) P->groups = ng;
  if (!tok || !pinned || !rm || !ng) goto out;
  /* one-byte values (masks) first: a dropout output is then recomputed
   * from the mask's copy instead of keeping the mask or drawing twice */
  for (int pass = 0; pass < 2; pass++)
    for (int l = 0; l < np; l++) try_remat(P, G, gl, &t, pinned, l, rm, &nr, pass);
  if (nr > 0 && prune_remats(P, G, &t, rm, &nr) != 0) goto out;
  rc = 0;
  if (nr == 0) goto out;
  nu = malloc(sizeof(unit) * (size_t)(P->nunits + nr));
  if (!nu) {
    rc = -1;
    goto out;
  }
  int n = 0;
  for (int r = 0; r < nr; r++) rm[r].first = rm[r].unit; /* old index, until renumbered */
  for (int u = 0; u < P->nunits; u++) {
    for (int r = 0; r < nr; r++)
      if (rm[r].first == u) {
        nu[n] = (unit){U_GROUP, rm[r].group};
        rm[r].unit = n++;
      }
    nu[n++] = P->units[u];
  }
  for (int r = 0; r < nr; r++) rm[r].first = -1;
  free(P->units);
  P->units = nu;
  P->nunits = n;
  P->kernels += nr;
  P->remat = rm;
  P->nremat = nr;
  rm = NULL;
out:
  free_touches(&t);
  free(pinned);
  free(rm);
  return rc;
}

static int chains_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_CHAINS");
  return !(e && *e == '0');
}

/* The argument blobs of a chain's members, in order. */
static void chain_args(const dgraph *G, const fchain *C, const void **args) {
  for (int m = 0; m < C->nn; m++) args[m] = G->nodes[C->nodes[m]].args;
}

static int is_fe_unit(const plan *P, const dgraph *G, int u) {
  const unit *U = &P->units[u];
  return U->kind == U_NODE && tpurt__fe_chainable(G->nodes[U->idx].fn);
}

/* Runs of consecutive foreach launches (free markers between them move
 * after the run) become chains, as long as each next launch can join; then
 * the promises a chain writes before reading, that die in the graph and
 * that nothing else touches stay in registers: no store, no memory. */
static int plan_chains(plan *P, const dgraph *G, const pfacts *pf, const gstate *gl) {
  if (!chains_enabled()) return 0;
  int np = G->np, nu = 0, cap = 0;
  for (int u = 0; u < P->nunits;) {
    if (!is_fe_unit(P, G, u)) {
      P->units[nu++] = P->units[u++];
      continue;
    }
    const void *args[TPURT__FE_CHAIN_MAX];
    int mem[TPURT__FE_CHAIN_MAX], nm = 1, last = u;
    args[0] = G->nodes[P->units[u].idx].args;
    mem[0] = P->units[u].idx;
    tpurt__fe_chain *fc = NULL;
    for (int v = u + 1; v < P->nunits && nm < TPURT__FE_CHAIN_MAX; v++) {
      if (P->units[v].kind == U_FREE) continue;
      if (!is_fe_unit(P, G, v)) break;
      args[nm] = G->nodes[P->units[v].idx].args;
      tpurt__fe_chain *c2 = tpurt__fe_chain_new(args, nm + 1);
      if (!c2) break;
      free(fc);
      fc = c2;
      mem[nm++] = P->units[v].idx;
      last = v;
    }
    if (!fc) {
      P->units[nu++] = P->units[u++];
      continue;
    }
    if (P->nchains == cap) {
      cap = cap ? 2 * cap : 8;
      fchain *nc = realloc(P->chains, sizeof *nc * (size_t)cap);
      if (!nc) {
        free(fc);
        return -1;
      }
      P->chains = nc;
    }
    fchain *C = &P->chains[P->nchains];
    memset(C, 0, sizeof *C);
    C->fc = fc;
    C->nn = nm;
    C->nodes = malloc(sizeof(int) * (size_t)nm);
    if (!C->nodes) {
      free(fc);
      return -1;
    }
    memcpy(C->nodes, mem, sizeof(int) * (size_t)nm);
    C->name = fused_name(G, mem, nm);
    P->units[nu++] = (unit){U_CHAIN, P->nchains++};
    for (int v = u + 1; v < last; v++)
      if (P->units[v].kind == U_FREE) P->units[nu++] = P->units[v];
    P->fused_kernels++;
    P->ops_fused += nm;
    u = last + 1;
  }
  P->nunits = nu;
  if (!P->nchains) return 0;
  /* bad[l]: promise l must stay in memory; owner[l]: the chain touching it */
  uint8_t *bad = calloc((size_t)np + 1, 1);
  int *owner = malloc(sizeof(int) * ((size_t)np + 1));
  if (!bad || !owner) {
    free(bad);
    free(owner);
    return -1;
  }
  for (int l = 0; l < np; l++) {
    owner[l] = -1;
    bad[l] = pf[l].live;
  }
  for (int u = 0; u < P->nunits; u++) {
    const unit *U = &P->units[u];
    if (U->kind == U_GROUP) {
      const gstate *g = &gl[U->idx];
      for (int k = 0; k < g->nin; k++) {
        int l = local_of(g->in[k].v->ptr);
        if (l >= 0) bad[l] = 1;
      }
      for (int k = 0; k < g->nw; k++) {
        int l = local_of(g->w[k].v->ptr);
        if (l >= 0) bad[l] = 1;
      }
    } else if (U->kind == U_NODE) {
      const dnode *d = &G->nodes[U->idx];
      for (int k = 0; k < d->nacc; k++) {
        int l = local_of(d->acc[k].p);
        if (l >= 0) bad[l] = 1;
      }
    }
  }
  for (int c = 0; c < P->nchains; c++) {
    fchain *C = &P->chains[c];
    const void *args[TPURT__FE_CHAIN_MAX];
    chain_args(G, C, args);
    for (int m = 0; m < C->nn; m++) {
      int l = local_of(tpurt__fe_scalar_ptr(args[m]));
      if (l >= 0) bad[l] = 1;
    }
    for (int i = 0, n = tpurt__fe_chain_nslots(C->fc); i < n; i++) {
      int read_first;
      int l = local_of(tpurt__fe_chain_slot(C->fc, args, i, &read_first));
      if (l < 0) continue;
      if ((owner[l] >= 0 && owner[l] != c) || read_first) bad[l] = 1;
      owner[l] = c;
    }
  }
  int rc = 0;
  for (int c = 0; c < P->nchains && !rc; c++) {
    fchain *C = &P->chains[c];
    const void *args[TPURT__FE_CHAIN_MAX];
    chain_args(G, C, args);
    int na = 0;
    for (int m = 0; m < C->nn; m++) na += G->nodes[C->nodes[m]].nacc;
    for (int i = 0, n = tpurt__fe_chain_nslots(C->fc); i < n; i++) {
      int l = local_of(tpurt__fe_chain_slot(C->fc, args, i, NULL));
      if (l >= 0 && !bad[l]) {
        tpurt__fe_chain_drop_store(C->fc, i);
        P->stores_eliminated++;
      }
    }
    C->acc = malloc(sizeof(int) * 2 * (size_t)(na ? na : 1));
    if (!C->acc) {
      rc = -1;
      break;
    }
    for (int m = 0; m < C->nn; m++) {
      const dnode *d = &G->nodes[C->nodes[m]];
      for (int k = 0; k < d->nacc; k++) {
        int l = local_of(d->acc[k].p);
        if (l >= 0 && !bad[l]) continue; /* kept in registers */
        C->acc[2 * C->nacc] = C->nodes[m];
        C->acc[2 * C->nacc + 1] = k;
        C->nacc++;
      }
    }
  }
  free(bad);
  free(owner);
  return rc;
}

/* ------------------------------------------- reduction prologues
 *
 * A reduction whose input the unit just before it, an elementwise group,
 * computes (x.pow(2).mean(-1) of an RMSNorm, the row sums of its backward,
 * a softmax's or loss's sum of products) runs with that group as its
 * prologue: the reduction's walk asks the group for each contiguous run of
 * its input as it reaches it (kernels/reduce.c, k_reduce_fused), into a
 * buffer of the thread's own, and the input never takes memory — neither
 * a store of it nor a load back. Same bits: the reduction folds the same
 * values in the same order, the group computes each element as it would
 * alone. Conditions: the reduction reads exactly elements [0, n) of a
 * promise, each once, in contiguous runs, on as many chunks as threads
 * (tpurt__reduce_pro_target); the group computes over n elements and
 * writes that promise whole, densely, in that order, once; nothing else
 * touches the promise and it dies in the graph; the reduction's outputs
 * touch none of the group's operands (the group's other stores are made
 * while outputs are written). Between the two units only free markers lie
 * (allocations there move before the pair).
 * On by default; TORCH_TPU_DEFER_PROLOGUE=0 turns it off. */
static int prologues_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_PROLOGUE");
  return !(e && *e == '0');
}

/* Does any unit other than u and v touch promise l? */
static int touched_elsewhere(const plan *P, const dgraph *G, const gstate *gl, int u, int v, int l) {
  for (int w = 0; w < P->nunits; w++) {
    if (w == u || w == v) continue;
    const unit *U = &P->units[w];
    if (U->kind == U_GROUP) {
      const gstate *g = &gl[U->idx];
      for (int k = 0; k < g->nin; k++)
        if (local_of(g->in[k].v->ptr) == l) return 1;
      for (int k = 0; k < g->nw; k++)
        if (local_of(g->w[k].v->ptr) == l) return 1;
    } else if (U->kind == U_NODE || U->kind == U_CHAIN) {
      for (int k = 0, n = opaque_nacc(P, G, U); k < n; k++)
        if (local_of(opaque_acc(P, G, U, k)->p) == l) return 1;
    }
  }
  return 0;
}

/* Group unit u and the reduction after it: the promise the pair keeps out
 * of memory, and the group's write of it (-1: not a pair). */
static int pro_pair(const plan *P, const dgraph *G, const gstate *gl, const pfacts *pf, int u, int *vout, int *wk) {
  const unit *U = &P->units[u];
  if (U->kind != U_GROUP) return -1;
  int v = u + 1;
  while (v < P->nunits && P->units[v].kind == U_FREE) v++;
  if (v >= P->nunits || P->units[v].kind != U_NODE) return -1;
  const dnode *d = &G->nodes[P->units[v].idx];
  tpurt_devptr in;
  int64_t n;
  tpurt_dtype dt;
  if (d->fn != tpurt__reduce_fn() || !tpurt__reduce_pro_target(d->args, &in, &n, &dt)) return -1;
  int l = local_of(in);
  if (l < 0 || (in & TPURT_PROMISE_OFFMASK) != 0 || pf[l].live) return -1;
  const gstate *g = &gl[U->idx];
  int64_t gn = 1;
  for (int k = 0; k < g->ndim; k++) gn *= g->sizes[k];
  if (gn != n) return -1;
  for (int m = 0; m < g->nn; m++) /* its outputs are kept in memory, to raise the error as strict mode does */
    if (may_fail(&G->nodes[g->nodes[m]])) return -1;
  int w = -1;
  for (int k = 0; k < g->nw; k++)
    if (local_of(g->w[k].v->ptr) == l) {
      if (w >= 0) return -1;
      w = k;
    }
  if (w < 0) return -1;
  for (int k = 0; k < g->nin; k++)
    if (local_of(g->in[k].v->ptr) == l) return -1;
  tpurt_view flat = {.ptr = in, .dtype = dt, .ndim = 1};
  flat.sizes[0] = n;
  flat.strides[0] = 1;
  if (g->w[w].v->dtype != dt || !view_eq_over(g->w[w].v, &flat, g->ndim, g->sizes)) return -1;
  /* the reduction's other ranges (its outputs) against the group's operands */
  for (int a = 0; a < d->nacc; a++) {
    if (local_of(d->acc[a].p) == l) {
      if (!d->acc[a].ro) return -1;
      continue;
    }
    uint64_t lo = d->acc[a].p + (uint64_t)d->acc[a].lo, hi = d->acc[a].p + (uint64_t)d->acc[a].hi;
    for (int k = 0; k < g->nin + g->nw; k++) {
      const tpurt_view *gv = k < g->nin ? g->in[k].v : g->w[k - g->nin].v;
      uint64_t glo, ghi;
      view_range(gv, &glo, &ghi);
      if (glo < hi && lo < ghi) return -1;
    }
  }
  if (touched_elsewhere(P, G, gl, u, v, l)) return -1;
  *vout = v;
  *wk = w;
  return l;
}

/* Marks the pairs: pro[gi] = (reduction node + 1, the group's write k of
 * the reduction's input) for group gi; the reductions' nodes in
 * P->pro_skip. Returns 0, or -1 out of memory. */
static int plan_prologues(plan *P, const dgraph *G, const gstate *gl, const pfacts *pf, int (*pro)[2]) {
  if (!prologues_enabled()) return 0;
  for (int u = 0; u < P->nunits; u++) {
    int v, wk;
    if (pro_pair(P, G, gl, pf, u, &v, &wk) < 0) continue;
    if (!P->pro_skip && !(P->pro_skip = calloc((size_t)(G->n ? G->n : 1), 1))) return -1;
    int node = P->units[v].idx;
    P->pro_skip[node] = 1;
    int gi = P->units[u].idx;
    pro[gi][0] = node + 1;
    pro[gi][1] = wk;
    u = v;
  }
  return 0;
}

/* A pair of units run as one kernel at the first one's step i, the second
 * at step j: the allocations between them move before step i (in order). */
static void allocs_before(plan *P, int i, int j) {
  int at = i;
  pstep unit_step = P->steps[i];
  for (int k = i + 1; k < j; k++) {
    pstep t = P->steps[k];
    if (t.kind != S_ALLOC && t.kind != S_RALLOC) continue;
    memmove(&P->steps[at + 1], &P->steps[at], sizeof(pstep) * (size_t)(k - at));
    P->steps[at++] = t;
  }
  P->steps[at] = unit_step;
}

/* Steps between each prologue group and its reduction: allocations move
 * before the group (the pair runs as one kernel at the group's step). */
static int order_prologues(plan *P) {
  if (!P->pro_skip) return 0;
  for (int i = 0; i < P->nsteps; i++) {
    if (P->steps[i].kind != S_UNIT) continue;
    const unit *U = &P->units[P->steps[i].a];
    if (U->kind != U_GROUP || !P->groups[U->idx].pro_node) continue;
    int node = P->groups[U->idx].pro_node - 1, j = i + 1;
    for (; j < P->nsteps; j++) {
      const pstep *S = &P->steps[j];
      if (S->kind != S_UNIT) continue;
      const unit *V = &P->units[S->a];
      if (V->kind == U_NODE && V->idx == node) break;
      if (V->kind != U_FREE) return -1; /* planner invariant (pro_pair): only free markers between */
    }
    if (j == P->nsteps) return -1;
    allocs_before(P, i, j);
    i = j;
  }
  return 0;
}

/* Group F against a kernel's output `flat` (dense, in F's element order):
 * -1 when an operand touches flat's bytes other than as flat itself in that
 * order, an output overlaps a range of no_out or any operand one of
 * no_any; else 1 if F reads flat, 0 if not. */
static int in_order(const dgraph *G, const fgroup *F, const tpurt_view *flat, const uint64_t (*no_out)[2], int nout,
                    const uint64_t (*no_any)[2], int nany) {
  uint64_t flo, fhi;
  view_range(flat, &flo, &fhi);
  int reads = 0;
  for (int k = 0; k < F->nin + F->nout; k++) {
    const vref *r = k < F->nin ? &F->in[k] : &F->out[k - F->nin];
    const tpurt_view *v = &G->nodes[r->node].views[r->idx];
    uint64_t lo, hi;
    view_range(v, &lo, &hi);
    if (view_eq_over(v, flat, F->ndim, F->sizes)) { /* flat itself, element by element (in place too) */
      reads |= k < F->nin;
      continue;
    }
    if (lo < fhi && flo < hi) return -1;
    for (int m = 0; m < nout && k >= F->nin; m++)
      if (lo < no_out[m][1] && no_out[m][0] < hi) return -1;
    for (int m = 0; m < nany; m++)
      if (lo < no_any[m][1] && no_any[m][0] < hi) return -1;
  }
  return reads;
}

/* ------------------------------------------- reduction epilogues
 *
 * The group right after a reduction that reads the reduction's output in
 * its element order (rsqrt(mean + eps) of an RMSNorm, the division of a
 * softmax's sum, a loss's scaling) runs inside the reduction's kernel:
 * each chunk of the reduction's walk runs it over the outputs it has just
 * written (or, where the walk splits outputs otherwise, whole after the
 * walk: kernels/reduce.c, k_reduce_fused) — one kernel fewer, same bits
 * (the group computes every element as it would alone, from the same
 * stored outputs). Conditions: the reduction writes exactly elements
 * [0, n) of one output; the group computes over n elements; its operands
 * that touch that output are the output itself in that order; it writes
 * nothing the reduction (or its prologue group) reads or writes; it is not
 * a recomputation; only free markers lie between the two (allocations
 * there move before the kernel). On by default;
 * TORCH_TPU_DEFER_REDUCE_EPILOGUE=0 turns it off. */
static int red_epilogues_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_REDUCE_EPILOGUE");
  return !(e && *e == '0');
}

/* The group of a reduction node's prologue, or NULL. */
static const fgroup *prologue_of(const plan *P, int node) {
  for (int gi = 0; gi < P->ngroups; gi++)
    if (P->groups[gi].pro_node == node + 1) return &P->groups[gi];
  return NULL;
}

/* Unit u a reduction and the next unit but free markers, w, a group that
 * can run as its epilogue? */
static int red_epi_pair(const plan *P, const dgraph *G, int u, int *wout) {
  const unit *U = &P->units[u];
  if (U->kind != U_NODE) return 0;
  const dnode *d = &G->nodes[U->idx];
  tpurt_devptr out;
  int64_t n;
  tpurt_dtype dt;
  if (d->fn != tpurt__reduce_fn() || !tpurt__reduce_epi_target(d->args, &out, &n, &dt)) return 0;
  int w = u + 1;
  while (w < P->nunits && P->units[w].kind == U_FREE) w++;
  if (w >= P->nunits || P->units[w].kind != U_GROUP) return 0;
  const fgroup *F = &P->groups[P->units[w].idx];
  if (F->nout == 0 || F->pro_node || F->in_red) return 0;
  for (int r = 0; r < P->nremat; r++)
    if (P->remat[r].unit == w) return 0;
  int64_t gn = 1;
  for (int k = 0; k < F->ndim; k++) gn *= F->sizes[k];
  if (gn != n) return 0;
  tpurt_view flat = {.ptr = out, .dtype = dt, .ndim = 1};
  flat.sizes[0] = n;
  flat.strides[0] = 1;
  /* outputs: nothing the reduction reads or writes; no operand over its
   * prologue's operands (running alongside) */
  uint64_t no_out[64][2], no_any[2 * TPURT_EW_MAX_IO][2];
  int nout = 0, nany = 0;
  if (d->nacc > 64) return 0;
  for (int a = 0; a < d->nacc; a++) {
    no_out[nout][0] = d->acc[a].p + (uint64_t)d->acc[a].lo;
    no_out[nout++][1] = d->acc[a].p + (uint64_t)d->acc[a].hi;
  }
  const fgroup *pro = P->pro_skip && P->pro_skip[U->idx] ? prologue_of(P, U->idx) : NULL;
  for (int j = 0; pro && j < pro->nin + pro->nout; j++) {
    const vref *q = j < pro->nin ? &pro->in[j] : &pro->out[j - pro->nin];
    view_range(&G->nodes[q->node].views[q->idx], &no_any[nany][0], &no_any[nany][1]);
    nany++;
  }
  int reads_out = in_order(G, F, &flat, no_out, nout, no_any, nany);
  if (reads_out <= 0) return 0;
  *wout = w;
  return 1;
}

/* The step index of unit u. */
static int step_of(const plan *P, int u) {
  for (int i = 0; i < P->nsteps; i++)
    if (P->steps[i].kind == S_UNIT && P->steps[i].a == u) return i;
  return -1;
}

/* Marks the pairs and moves the allocations between the reduction's kernel
 * (its own step, or its prologue group's) and the epilogue's step before
 * the kernel. Returns 0, or -1 out of memory or on a broken invariant. */
static int plan_red_epilogues(plan *P, const dgraph *G) {
  if (!red_epilogues_enabled()) return 0;
  for (int u = 0; u < P->nunits; u++) {
    int w;
    if (!red_epi_pair(P, G, u, &w)) continue;
    int node = P->units[u].idx;
    if ((!P->red_epi && !(P->red_epi = calloc((size_t)(G->n ? G->n : 1), sizeof *P->red_epi))) ||
        (!P->red_name && !(P->red_name = calloc((size_t)(G->n ? G->n : 1), sizeof *P->red_name))))
      return -1;
    fgroup *F = &P->groups[P->units[w].idx];
    F->in_red = 1;
    P->red_epi[node] = w + 1;
    const fgroup *pro = P->pro_skip && P->pro_skip[node] ? prologue_of(P, node) : NULL;
    const dnode *d = &G->nodes[node];
    char nm[480];
    snprintf(nm, sizeof nm, "%s+%s", pro ? pro->pro_name : d->name ? d->name : "reduce", F->name);
    P->red_name[node] = intern(nm);
    P->kernels--;
    P->fused_kernels += pro ? 0 : 1;
    P->ops_fused += (pro ? 0 : 1) + F->nn;
    /* the kernel's step: the reduction's, or its prologue group's */
    int ku = u;
    if (pro)
      for (int v = 0; v < P->nunits; v++)
        if (P->units[v].kind == U_GROUP && &P->groups[P->units[v].idx] == pro) ku = v;
    int i = step_of(P, ku), j = step_of(P, w);
    if (i < 0 || j < i) return -1;
    for (int k = i + 1; k < j; k++) /* planner invariant: only free markers (and the reduction) between */
      if (P->steps[k].kind == S_UNIT && P->steps[k].a != u && P->units[P->steps[k].a].kind != U_FREE) return -1;
    allocs_before(P, i, j);
    u = w;
  }
  return 0;
}

/* ------------------------------------------------- GEMM epilogues
 *
 * A GEMM whose output the very next unit, an elementwise group, reads in
 * the same element order (a bias add, an activation, a residual add, a
 * dropout, the activation's backward) runs that group as its epilogue: the
 * group's program runs on each block of C as soon as the block's last K
 * chunk is written, while the block is in the core's cache, instead of in
 * a pass of its own over C (kernels/gemm.c, tpurt__gemm_epi_enqueue). The
 * results are the same bits: the group computes every element as it would
 * alone, from the same stored C. Conditions, so that running the group
 * block by block, during the product, cannot be told apart from running it
 * after: the product can hand out final blocks (f32 at HIGHEST precision,
 * C dense row-major: tpurt__gemm_epi_target); the group computes in f32
 * over exactly C's elements; every group operand that touches C's bytes
 * is C itself in C's order (a block's reads and in-place writes stay in
 * the block); no group output touches the product's operands A and B
 * (still being read); the group is not a recomputation (its memory
 * appears at its own unit). The steps between the two units only give
 * memory (allocations move before the pair, where the group's outputs
 * cannot take memory the product still reads) or take it back (after the
 * pair's kernel is queued, which is stream-ordered).
 * Off by default: TORCH_TPU_DEFER_EPILOGUE=1 turns it on. Measured on the
 * bench's training steps (paired, in-process: python -m bench.ab_env
 * TORCH_TPU_DEFER_EPILOGUE 0 1), time without / with it: minGPT 0.994,
 * Llama 0.998, ResNet 0.995 (15 samples of 3 steps); earlier 21-sample
 * runs 0.94 / 0.98 (minGPT), 0.92 / 1.01 (Llama), 0.99 (minGPT at batch
 * 64): no faster. Their products' outputs stay in L2/L3 and their
 * epilogues (GELU, dropout's random numbers) are bound by compute, not by
 * the pass over C that fusion saves; run inside the product, they share
 * the core's cache with its packed operands. */
static int epilogues_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_EPILOGUE");
  return e && *e == '1';
}

static int epi_pair(const plan *P, const dgraph *G, int u) {
  const unit *U = &P->units[u], *V = &P->units[u + 1];
  if (U->kind != U_NODE || V->kind != U_GROUP) return 0;
  const dnode *d = &G->nodes[U->idx];
  tpurt_view c, ab[2];
  if (d->fn != tpurt__gemm_fn() || !tpurt__gemm_epi_target(d->args, &c, ab)) return 0;
  const fgroup *F = &P->groups[V->idx];
  if (F->nout == 0 || F->prog.compute != TPURT_F32 || F->pro_node || F->in_red) return 0;
  for (int r = 0; r < P->nremat; r++)
    if (P->remat[r].unit == u + 1) return 0;
  int64_t n = 1;
  for (int k = 0; k < F->ndim; k++) n *= F->sizes[k];
  if (n != c.sizes[0] * c.sizes[1] * c.sizes[2]) return 0;
  tpurt_view flat = c;
  flat.ndim = 1;
  flat.sizes[0] = n;
  flat.strides[0] = 1;
  uint64_t no_out[2][2]; /* outputs: not over A or B (still being read) */
  for (int m = 0; m < 2; m++) view_range(&ab[m], &no_out[m][0], &no_out[m][1]);
  return in_order(G, F, &flat, no_out, 2, NULL, 0) > 0;
}

/* Marks the pairs and moves the allocations between each pair's units
 * before the pair. Returns 0, or -1 out of memory. */
static int plan_epilogues(plan *P, const dgraph *G) {
  if (!epilogues_enabled()) return 0;
  for (int u = 0; u + 1 < P->nunits; u++) {
    if (!epi_pair(P, G, u)) continue;
    if (!P->epi && !(P->epi = calloc((size_t)P->nunits, sizeof *P->epi))) return -1;
    const fgroup *F = &P->groups[P->units[u + 1].idx];
    char nm[320];
    snprintf(nm, sizeof nm, "gemm+%s", F->name);
    P->epi[u] = intern(nm);
    P->kernels--;
    P->fused_kernels += F->nn > 1 ? 0 : 1;
    P->ops_fused += 1 + (F->nn > 1 ? 0 : F->nn);
    u++; /* the group is taken: it cannot start a pair */
  }
  if (!P->epi) return 0;
  for (int i = 0; i < P->nsteps; i++) {
    if (P->steps[i].kind != S_UNIT || !P->epi[P->steps[i].a]) continue;
    int j = i + 1; /* steps (i, j) lie between the pair's units */
    while (j < P->nsteps && P->steps[j].kind != S_UNIT) j++;
    allocs_before(P, i, j);
    i = j;
  }
  return 0;
}

static plan *build_plan(dgraph *G) {
  plan *P = calloc(1, sizeof *P);
  gstate *gs = malloc(sizeof *gs);
  pfacts *pf = calloc((size_t)(G->np ? G->np : 1), sizeof *pf);
  gstate *gl = NULL; /* groups' states */
  int ngl = 0, capgl = 0;
  int (*pro)[2] = NULL; /* per group: its reduction's node + 1, its write of the input (plan_prologues) */
  if (!P || !gs || !pf) goto fail;
  P->nnodes = G->n;
  P->nprom = G->np;
  P->units = malloc(sizeof(unit) * (size_t)(G->n + 1));
  int *deferred_frees = malloc(sizeof(int) * (size_t)(G->n + 1));
  if (!P->units || !deferred_frees) {
    free(deferred_frees);
    goto fail;
  }
  int ndf = 0;
  for (int l = 0; l < G->np; l++) {
    tpurt__promise *q = tpurt__promise_get(G->promises[l]);
    pf[l].live = q->live;
    pf[l].first = pf[l].last = -1;
  }
  /* 1. grouping */
  group_reset(gs);
#define CLOSE_GROUP()                                                        \
  do {                                                                       \
    if (gs->nn > 0) {                                                        \
      if (!push_group(P, &gl, &ngl, &capgl, gs)) goto fail;                  \
      group_reset(gs);                                                       \
    }                                                                        \
    for (int _f = 0; _f < ndf; _f++) push_unit(P, U_FREE, deferred_frees[_f]); \
    ndf = 0;                                                                 \
  } while (0)
  for (int i = 0; i < G->n; i++) {
    const dnode *d = &G->nodes[i];
    if (d->kind == N_FREE) {
      if (gs->nn > 0)
        deferred_frees[ndf++] = i;
      else
        push_unit(P, U_FREE, i);
      continue;
    }
    if (d->kind == N_EW) {
      if (group_add(gs, G, i)) continue;
      if (gs->nn > 0 && !may_fail(d) && independent_of(gs, G, i)) {
        /* hoist: the node becomes a unit of its own before the open group */
        gstate *h = malloc(sizeof *h);
        if (!h) goto fail;
        group_reset(h);
        int ok = group_add(h, G, i) && push_group(P, &gl, &ngl, &capgl, h);
        free(h);
        if (!ok) goto fail;
        continue;
      }
      CLOSE_GROUP();
      if (group_add(gs, G, i)) continue;
      goto fail; /* a single recorded program always fits */
    }
    CLOSE_GROUP();
    push_unit(P, U_NODE, i);
  }
  CLOSE_GROUP();
#undef CLOSE_GROUP
  free(deferred_frees);
  if (plan_chains(P, G, pf, gl) != 0) goto fail;
  pro = calloc((size_t)(ngl ? ngl : 1), sizeof *pro);
  if (!pro || plan_prologues(P, G, gl, pf, pro) != 0) goto fail;
  /* 2. which promises must live in memory */
  for (int u = 0; u < P->nunits; u++) {
    unit *U = &P->units[u];
    if (U->kind == U_GROUP) {
      gstate *g = &gl[U->idx];
      for (int k = 0; k < g->nin; k++) {
        int l = local_of(g->in[k].v->ptr);
        if (l >= 0) pf[l].memread = 1;
      }
      /* an op that can fail (integer division by zero) runs even when its
       * result is not needed, so that the error is raised as in strict mode */
      for (int m = 0; m < g->nn; m++) {
        const dnode *d = &G->nodes[g->nodes[m]];
        if (!may_fail(d)) continue;
        for (int k = 0; k < d->nout; k++) {
          int l = local_of(d->views[k].ptr);
          if (l >= 0) pf[l].memread = 1;
        }
      }
    } else if (U->kind == U_NODE || U->kind == U_CHAIN) {
      int skip = U->kind == U_NODE && P->pro_skip && P->pro_skip[U->idx]; /* its input comes from its prologue */
      for (int k = 0, n = opaque_nacc(P, G, U); k < n; k++) {
        const acc *a = opaque_acc(P, G, U, k);
        int l = local_of(a->p);
        if (l >= 0 && !(skip && a->ro)) pf[l].memread = 1;
      }
    }
  }
  P->materialize = calloc((size_t)(G->np ? G->np : 1), 1);
  if (!P->materialize) goto fail;
  for (int l = 0; l < G->np; l++) P->materialize[l] = pf[l].live || pf[l].memread;
  /* 3. assemble groups with the stores that are needed */
  P->groups = calloc((size_t)(ngl ? ngl : 1), sizeof(fgroup));
  if (!P->groups) goto fail;
  P->ngroups = ngl;
  for (int gi = 0; gi < ngl; gi++) {
    gstate *g = &gl[gi];
    fgroup *F = &P->groups[gi];
    int outs[TPURT_EW_MAX_IO], nout = 0;
    for (int k = 0; k < g->nw; k++) {
      int l = local_of(g->w[k].v->ptr);
      int to_reduction = pro[gi][0] && k == pro[gi][1];
      if (l >= 0 && !P->materialize[l] && !to_reduction) {
        P->stores_eliminated++;
        continue;
      }
      if (to_reduction) {
        P->stores_eliminated++;
        F->pro_node = pro[gi][0];
        F->pro_out = nout;
      }
      F->out[nout] = g->w[k].ref;
      outs[nout++] = g->w[k].vreg;
    }
    F->ndim = g->ndim;
    memcpy(F->sizes, g->sizes, sizeof(int64_t) * (size_t)g->ndim);
    F->nodes = malloc(sizeof(int) * (size_t)g->nn);
    if (!F->nodes) goto fail;
    memcpy(F->nodes, g->nodes, sizeof(int) * (size_t)g->nn);
    F->nn = g->nn;
    if (nout == 0) { /* nothing it computes is needed */
      F->nout = 0;
      P->ops_eliminated += g->nn;
      continue;
    }
    if (assemble_group(g, outs, nout, F) != 0) goto fail;
    /* members whose instructions all died still count as fused away */
    F->name = fused_name(G, g->nodes, g->nn);
    P->kernels++;
    if (g->nn > 1 || F->pro_node) {
      P->fused_kernels++;
      P->ops_fused += g->nn;
    }
    if (F->pro_node) {
      const dnode *r = &G->nodes[F->pro_node - 1];
      char nm[320];
      snprintf(nm, sizeof nm, "%s+%s", F->name, r->name ? r->name : "reduce");
      F->pro_name = intern(nm);
      P->ops_fused++;
    }
  }
  /* 4. values recomputed for late readers, memory touches per unit, then the steps */
  if (plan_remat(P, G, gl) != 0) goto fail;
  for (int u = 0; u < P->nunits; u++) {
    unit *U = &P->units[u];
    if (U->kind == U_GROUP) {
      fgroup *F = &P->groups[U->idx];
      if (F->nout == 0) continue;
      for (int k = 0; k < F->nin; k++) touch(P, pf, G->nodes[F->in[k].node].views[F->in[k].idx].ptr, u);
      for (int k = 0; k < F->nout; k++) touch(P, pf, G->nodes[F->out[k].node].views[F->out[k].idx].ptr, u);
    } else if (U->kind == U_NODE || U->kind == U_CHAIN) {
      if (!(U->kind == U_NODE && P->pro_skip && P->pro_skip[U->idx])) P->kernels++;
      for (int k = 0, n = opaque_nacc(P, G, U); k < n; k++) touch(P, pf, opaque_acc(P, G, U, k)->p, u);
    }
  }
  P->steps = malloc(sizeof(pstep) * (size_t)(P->nunits + 2 * G->np + 2 * P->nremat + 1));
  if (!P->steps) goto fail;
  for (int u = 0; u < P->nunits; u++) {
    for (int l = 0; l < G->np; l++)
      if (P->materialize[l] && pf[l].first == u) P->steps[P->nsteps++] = (pstep){S_ALLOC, l};
    for (int r = 0; r < P->nremat; r++)
      if (P->remat[r].first == u) P->steps[P->nsteps++] = (pstep){S_RALLOC, r};
    P->steps[P->nsteps++] = (pstep){S_UNIT, u};
    for (int l = 0; l < G->np; l++)
      if (P->materialize[l] && !pf[l].live && pf[l].last == u) P->steps[P->nsteps++] = (pstep){S_RELEASE, l};
    for (int r = 0; r < P->nremat; r++)
      if (P->remat[r].last == u) P->steps[P->nsteps++] = (pstep){S_RRELEASE, r};
  }
  for (int l = 0; l < G->np; l++)
    if (P->materialize[l] && pf[l].first < 0) P->steps[P->nsteps++] = (pstep){S_ALLOC, l};
  if (order_prologues(P) != 0 || plan_red_epilogues(P, G) != 0 || plan_epilogues(P, G) != 0) goto fail;
  free(gs);
  free(gl);
  free(pf);
  free(pro);
  return P;
fail:
  if (P) {
    free_plan_contents(P);
    free(P);
  }
  free(gs);
  free(gl);
  free(pf);
  free(pro);
  return NULL;
}

/* Structural key of a graph. Promises of the graph are named by their
 * local index; other memory by the cluster of overlapping ranges it falls
 * in (numbered by first appearance) and its offset in the cluster. */
typedef struct xr {
  uint64_t lo, hi;
  int order, cluster;
} xr;

static int xr_cmp(const void *a, const void *b) {
  const xr *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

static void graph_key(dgraph *G, uint64_t *k1, uint64_t *k2) {
  /* external ranges in order of appearance */
  int nx = 0, capx = 64;
  xr *X = malloc(sizeof *X * (size_t)capx);
#define ADD_X(LO, HI)                                         \
  do {                                                        \
    if (X && nx == capx) {                                    \
      capx *= 2;                                              \
      xr *nxr = realloc(X, sizeof *X * (size_t)capx);         \
      if (!nxr) {                                             \
        free(X);                                              \
        X = NULL;                                             \
      } else                                                  \
        X = nxr;                                              \
    }                                                         \
    if (X) {                                                  \
      X[nx].lo = (LO);                                        \
      X[nx].hi = (HI);                                        \
      X[nx].order = nx;                                       \
      nx++;                                                   \
    }                                                         \
  } while (0)
  for (int i = 0; i < G->n; i++) {
    dnode *d = &G->nodes[i];
    if (d->kind == N_EW) {
      for (int v = 0; v < d->nout + d->nin; v++)
        if (local_of(d->views[v].ptr) < 0) {
          uint64_t lo, hi;
          view_range(&d->views[v], &lo, &hi);
          ADD_X(lo, hi);
        }
    } else if (d->kind == N_FREE) {
      if (local_of(d->freed) < 0) ADD_X(d->freed, d->freed + 1);
    } else {
      for (int a = 0; a < d->nacc; a++)
        if (local_of(d->acc[a].p) < 0) ADD_X(d->acc[a].p + (uint64_t)d->acc[a].lo, d->acc[a].p + (uint64_t)d->acc[a].hi);
    }
  }
#undef ADD_X
  int *canon = NULL;
  uint64_t *cstart = NULL;
  int *byorder = NULL;
  if (X && nx) {
    qsort(X, (size_t)nx, sizeof *X, xr_cmp);
    int c = -1;
    uint64_t end = 0;
    cstart = malloc(sizeof *cstart * (size_t)nx);
    for (int i = 0; i < nx; i++) {
      if (c < 0 || X[i].lo >= end) {
        c++;
        if (cstart) cstart[c] = X[i].lo;
        end = X[i].hi;
      } else if (X[i].hi > end) {
        end = X[i].hi;
      }
      X[i].cluster = c;
    }
    canon = malloc(sizeof(int) * (size_t)(c + 1));
    byorder = malloc(sizeof(int) * (size_t)nx);
    if (canon && byorder) {
      for (int i = 0; i <= c; i++) canon[i] = -1;
      for (int i = 0; i < nx; i++) byorder[X[i].order] = i;
      int next = 0;
      for (int o = 0; o < nx; o++) {
        int cl = X[byorder[o]].cluster;
        if (canon[cl] < 0) canon[cl] = next++;
      }
    }
  }
  uint64_t h = 0x7470755f64656665ull, h2 = 0x1234567;
  int xo = 0; /* external range counter, in order of appearance */
#define HX(LOW)                                                                        \
  do {                                                                                 \
    if (X && canon && byorder && cstart && xo < nx) {                                  \
      xr *r = &X[byorder[xo]];                                                         \
      h = mix(h, 0xE0 + (uint64_t)canon[r->cluster]);                                  \
      h = mix(h, (LOW) - cstart[r->cluster]);                                          \
    } else {                                                                           \
      h = mix(h, (LOW)); /* could not build clusters: raw address (still correct) */  \
    }                                                                                  \
    xo++;                                                                              \
  } while (0)
#define HP(PTR, LOW)                                                        \
  do {                                                                      \
    int _l = local_of(PTR);                                                 \
    if (_l >= 0) {                                                          \
      h = mix(h, 0xA0 + (uint64_t)_l);                                      \
      h = mix(h, (PTR) & TPURT_PROMISE_OFFMASK);                            \
    } else {                                                                \
      HX(LOW);                                                              \
    }                                                                       \
  } while (0)
  for (int i = 0; i < G->n; i++) {
    dnode *d = &G->nodes[i];
    h = mix(h, d->kind);
    if (d->kind == N_EW) {
      h = mix(h, (uint64_t)d->compute);
      h = mix(h, (uint64_t)d->ninst | ((uint64_t)d->nout << 16) | ((uint64_t)d->nin << 24) |
                     ((uint64_t)d->nscal << 32));
      for (int k = 0; k < d->ninst; k++) {
        const tpurt_ew_inst *I = &d->inst[k];
        h = mix(h, (uint64_t)I->op | ((uint64_t)I->dst << 16) | ((uint64_t)I->src[0] << 24) |
                       ((uint64_t)I->src[1] << 32) | ((uint64_t)I->src[2] << 40));
        for (int q = 0; q < 4; q++) h = mixd(h, I->p[q]);
      }
      for (int k = 0; k < d->nout; k++) h = mix(h, d->out_reg[k]);
      for (int v = 0; v < d->nout + d->nin; v++) {
        const tpurt_view *w = &d->views[v];
        uint64_t lo, hi;
        view_range(w, &lo, &hi);
        HP(w->ptr, lo);
        if (local_of(w->ptr) < 0) h = mix(h, w->ptr - lo);
        h = mix(h, (uint64_t)w->dtype | ((uint64_t)w->ndim << 8));
        for (int k = 0; k < w->ndim; k++) {
          h = mix(h, (uint64_t)w->sizes[k]);
          h = mix(h, (uint64_t)w->strides[k]);
        }
      }
    } else if (d->kind == N_FREE) {
      HP(d->freed, d->freed);
    } else {
      h = mix(h, (uint64_t)(uintptr_t)d->fn);
      h = mix(h, d->args_size);
      h = mix(h, (uint64_t)d->nacc);
      if (tpurt__fe_chainable(d->fn)) h = mix(h, tpurt__fe_signature(d->args));
      if (d->fn == tpurt__gemm_fn()) h = mix(h, tpurt__gemm_signature(d->args));
      for (int a = 0; a < d->nacc; a++) {
        HP(d->acc[a].p, d->acc[a].p + (uint64_t)d->acc[a].lo);
        h = mix(h, (uint64_t)d->acc[a].lo);
        h = mix(h, (uint64_t)d->acc[a].hi);
        h = mix(h, (uint64_t)d->acc[a].ro);
      }
    }
    h2 = mix(h2, h);
  }
#undef HP
#undef HX
  for (int l = 0; l < G->np; l++) {
    tpurt__promise *q = tpurt__promise_get(G->promises[l]);
    h = mix(h, q->size);
    h = mix(h, q->live);
  }
  h = mix(h, (uint64_t)G->n);
  h = mix(h, (uint64_t)G->np);
  h = mix(h, (uint64_t)remat_enabled());
  h = mix(h, (uint64_t)chains_enabled());
  h = mix(h, (uint64_t)epilogues_enabled());
  h = mix(h, (uint64_t)prologues_enabled());
  h = mix(h, (uint64_t)red_epilogues_enabled());
  free(X);
  free(canon);
  free(cstart);
  free(byorder);
  *k1 = h;
  *k2 = mix(h2, h);
}

/* --------------------------------------------------------------- execution */

typedef struct exec_ctx {
  tpurt_stream *s;
  dgraph *G;
  plan *P;
  tpurt_devptr *rreal; /* memory of each recomputed copy (0: none) */
  tpurt__host_read *read; /* a host read to place inside the graph, or NULL */
} exec_ctx;

/* The step after which a host read of [src, src + n) can run: the last
 * step whose unit may change those bytes (unit_writes), and not before the
 * memory of the promise it reads is given (-1: before every step). A
 * promise recomputed for late readers (remat) is read at the end. */
static int read_position(const plan *P, const dgraph *G, tpurt_devptr src, size_t n) {
  int l = local_of(src);
  if (l >= 0 && P->nremat && P->remat_of[l] >= 0) return P->nsteps - 1;
  uint64_t lo = src, hi = src + n;
  int at = -1;
  for (int i = P->nsteps - 1; i >= 0 && at < 0; i--) {
    const pstep *S = &P->steps[i];
    if (S->kind == S_UNIT ? unit_writes(P, G, S->a, lo, hi) : (S->kind == S_ALLOC && S->a == l)) at = i;
  }
  return at;
}

static tpurt_status place_read(exec_ctx *x) {
  tpurt__host_read *r = x->read;
  tpurt_status st = tpurt__enqueue(x->s, r->name, r->fn, r->args, r->args_size, &r->seq);
  if (!st) r->placed = 1;
  return st;
}

/* p as unit u reads or writes it: an address in a recomputed promise is
 * redirected to the copy from the copy's remat unit on. */
static tpurt_devptr redirect(const exec_ctx *x, int u, tpurt_devptr p) {
  if (!x->P->nremat) return p;
  int l = local_of(p);
  int r = l >= 0 ? x->P->remat_of[l] : -1;
  if (r < 0 || u < x->P->remat[r].unit) return p;
  return x->rreal[r] + (p & TPURT_PROMISE_OFFMASK);
}

/* A kernel's name with the source line its op was recorded at. */
static const char *site_name(const char *name, const char *site) {
  if (!site) return name;
  char nm[400];
  snprintf(nm, sizeof nm, "%s (recorded at %s)", name, site);
  return intern(nm);
}

/* A copy of d's arguments (in buf when they fit in cap bytes, else
 * malloc'd) with the promise addresses in them as unit u sees them
 * (recomputed values redirected to their copies). */
static void *redirected_args(const exec_ctx *x, int u, const dnode *d, void *buf, size_t cap) {
  unsigned char *a = buf && d->args_size <= cap ? buf : malloc(d->args_size ? d->args_size : 1);
  if (!a) return NULL;
  memcpy(a, d->args, d->args_size);
  for (size_t off = 0; off + 8 <= d->args_size; off += 8) {
    tpurt_devptr w;
    memcpy(&w, a + off, 8);
    if (!tpurt__is_promise(w)) continue;
    w = redirect(x, u, w);
    memcpy(a + off, &w, 8);
  }
  return a;
}

/* Group F's views split to its shape and its scalars as unit u runs it. */
static tpurt_status group_operands(const exec_ctx *x, int u, const fgroup *F, tpurt_view *outs, tpurt_view *ins,
                                   double *scal, int *ns) {
  const dgraph *G = x->G;
  for (int k = 0; k < F->nout; k++)
    if (!split_view(&G->nodes[F->out[k].node].views[F->out[k].idx], F->ndim, F->sizes, &outs[k]))
      return tpurt__err(TPURT_ERR_INTERNAL, "deferred graph: %s: output view does not fit the group's shape", F->name);
  for (int k = 0; k < F->nin; k++)
    if (!split_view(&G->nodes[F->in[k].node].views[F->in[k].idx], F->ndim, F->sizes, &ins[k]))
      return tpurt__err(TPURT_ERR_INTERNAL, "deferred graph: %s: input view does not fit the group's shape", F->name);
  for (int k = 0; k < F->nout; k++) outs[k].ptr = redirect(x, u, outs[k].ptr);
  for (int k = 0; k < F->nin; k++) ins[k].ptr = redirect(x, u, ins[k].ptr);
  *ns = 0;
  for (int m = 0; m < F->nn; m++) {
    const dnode *d = &G->nodes[F->nodes[m]];
    if (*ns + d->nscal > 4 * TPURT_EW_MAX_INST)
      return tpurt__err(TPURT_ERR_INTERNAL, "deferred graph: too many scalars in %s", F->name);
    if (d->nscal) memcpy(scal + *ns, d->scal, sizeof(double) * d->nscal);
    *ns += d->nscal;
  }
  return TPURT_OK;
}

/* Is group F a copy recorded as a program (copy.c, copy_compute) alone? */
static int lone_copy(const dgraph *G, const fgroup *F) {
  const dnode *d = &G->nodes[F->nodes[0]];
  return F->nn == 1 && F->nin == 1 && F->nout == 1 && F->prog.ninst == 1 && F->prog.inst[0].op == TPURT_EW_LOAD &&
         d->name && strcmp(d->name, "copy") == 0;
}

/* Group F's launch as unit gu runs it, serialized (*ew, malloc'd, *ewn bytes). */
static tpurt_status group_args(const exec_ctx *x, int gu, const fgroup *F, void **ew, size_t *ewn) {
  tpurt_view outs[TPURT_EW_MAX_IO], ins[TPURT_EW_MAX_IO];
  double scal[4 * TPURT_EW_MAX_INST];
  int ns = 0;
  *ew = NULL;
  tpurt_status st = group_operands(x, gu, F, outs, ins, scal, &ns);
  return st ? st : tpurt__ew_args(&F->prog, outs, ins, F->nin, scal, ns, ew, ewn);
}

/* Node d's arguments as unit u sees them (*na: d's own, buf, or malloc'd;
 * free with free_node_args). */
static tpurt_status node_args(const exec_ctx *x, int u, const dnode *d, const char *name, void **na, void *buf,
                              size_t cap) {
  *na = d->args;
  if (x->P->nremat && !(*na = redirected_args(x, u, d, buf, cap)))
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
  return TPURT_OK;
}

static void free_node_args(const dnode *d, void *na, void *buf) {
  if (na && na != d->args && na != buf) free(na);
}

/* GEMM unit u with the group unit u + 1 as its epilogue, as one kernel. */
static tpurt_status run_gemm_epi(exec_ctx *x, int u) {
  const dnode *d = &x->G->nodes[x->P->units[u].idx];
  const fgroup *F = &x->P->groups[x->P->units[u + 1].idx];
  const char *name = site_name(x->P->epi[u], x->G->nodes[F->nodes[F->nn - 1]].site);
  _Alignas(16) unsigned char buf[1024];
  void *ew = NULL, *ga = NULL;
  size_t ewn = 0;
  tpurt_status st = group_args(x, u + 1, F, &ew, &ewn);
  if (!st) st = node_args(x, u, d, name, &ga, buf, sizeof buf);
  if (!st) st = tpurt__gemm_epi_enqueue(x->s, name, ga, d->args_size, ew, ewn);
  free_node_args(d, ga, buf);
  free(ew);
  return st;
}

/* Reduction node `node` as one kernel with its prologue group (unit pu, or
 * -1) and / or its epilogue group (P->red_epi), run at unit u's step. */
static tpurt_status run_reduce_fused(exec_ctx *x, int u, int node, int pu) {
  const dnode *d = &x->G->nodes[node];
  const fgroup *pro = pu >= 0 ? &x->P->groups[x->P->units[pu].idx] : NULL;
  int eu = x->P->red_epi && x->P->red_epi[node] ? x->P->red_epi[node] - 1 : -1;
  const fgroup *epi = eu >= 0 ? &x->P->groups[x->P->units[eu].idx] : NULL;
  const char *name = site_name(epi ? x->P->red_name[node] : pro->pro_name, d->site);
  _Alignas(16) unsigned char buf[1024];
  void *pa = NULL, *ea = NULL, *ra = NULL;
  size_t pn = 0, en = 0;
  tpurt_status st = pro ? group_args(x, pu, pro, &pa, &pn) : TPURT_OK;
  if (!st && epi) st = group_args(x, eu, epi, &ea, &en);
  if (!st) st = node_args(x, u, d, name, &ra, buf, sizeof buf);
  if (!st)
    st = tpurt__reduce_fused_enqueue(x->s, name, ra, d->args_size, pa, pn, pro ? pro->pro_out : -1, ea, en);
  free_node_args(d, ra, buf);
  free(pa);
  free(ea);
  return st;
}

/* Group unit u with the reduction it computes the input of (and that
 * reduction's epilogue, if any), as one kernel. */
static tpurt_status run_reduce_pro(exec_ctx *x, int u) {
  return run_reduce_fused(x, u, x->P->groups[x->P->units[u].idx].pro_node - 1, u);
}

static tpurt_status run_unit(exec_ctx *x, int u) {
  unit *U = &x->P->units[u];
  dgraph *G = x->G;
  if (U->kind == U_FREE) {
    const dnode *d = &G->nodes[U->idx];
    if (local_of(d->freed) >= 0) return TPURT_OK; /* the plan releases it after its last use */
    return tpurt_free(d->freed);
  }
  if (x->P->epi && x->P->epi[u]) return run_gemm_epi(x, u);
  if (x->P->epi && u > 0 && x->P->epi[u - 1]) return TPURT_OK; /* ran as the epilogue of unit u - 1 */
  if (U->kind == U_NODE) {
    if (x->P->pro_skip && x->P->pro_skip[U->idx]) return TPURT_OK; /* ran inside its prologue's kernel */
    if (x->P->red_epi && x->P->red_epi[U->idx]) return run_reduce_fused(x, u, U->idx, -1);
    dnode *d = &G->nodes[U->idx];
    const char *name = site_name(d->name ? d->name : "kernel", d->site);
    if (x->P->nremat && d->args_size) { /* promise addresses in the arguments may be redirected */
      _Alignas(16) unsigned char stackbuf[1024];
      void *a = redirected_args(x, u, d, stackbuf, sizeof stackbuf);
      if (!a) return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
      tpurt_status st = tpurt__enqueue(x->s, name, d->fn, a, d->args_size, NULL);
      if (a != stackbuf) free(a);
      return st;
    }
    return tpurt__enqueue(x->s, name, d->fn, d->args, d->args_size, NULL);
  }
  if (U->kind == U_CHAIN) {
    const fchain *C = &x->P->chains[U->idx];
    const void *args[TPURT__FE_CHAIN_MAX];
    void *own[TPURT__FE_CHAIN_MAX] = {0};
    size_t sizes[TPURT__FE_CHAIN_MAX];
    const char *name = site_name(C->name, G->nodes[C->nodes[C->nn - 1]].site);
    tpurt_status st = TPURT_OK;
    for (int m = 0; m < C->nn; m++) {
      const dnode *d = &G->nodes[C->nodes[m]];
      args[m] = d->args;
      sizes[m] = d->args_size;
      if (x->P->nremat) {
        args[m] = own[m] = redirected_args(x, u, d, NULL, 0);
        if (!own[m]) st = tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
      }
    }
    if (!st) st = tpurt__fe_chain_enqueue(x->s, name, C->fc, args, sizes);
    for (int m = 0; m < C->nn; m++) free(own[m]);
    return st;
  }
  fgroup *F = &x->P->groups[U->idx];
  if (F->nout == 0 || F->in_red) return TPURT_OK; /* (in_red: ran inside its reduction's kernel) */
  if (F->pro_node) return run_reduce_pro(x, u);
  tpurt_view outs[TPURT_EW_MAX_IO], ins[TPURT_EW_MAX_IO];
  double scal[4 * TPURT_EW_MAX_INST];
  int ns = 0;
  tpurt_status st = group_operands(x, u, F, outs, ins, scal, &ns);
  if (st) return st;
  const char *name = site_name(F->name, G->nodes[F->nodes[F->nn - 1]].site);
  if (lone_copy(G, F)) /* a copy that fused with nothing: the copy kernel moves it faster */
    return tpurt__copy_strided_named(x->s, &outs[0], &ins[0], name);
  return tpurt__elementwise_named(x->s, &F->prog, outs, ins, F->nin, scal, ns, name);
}

/* TORCH_TPU_DEFER_DEBUG=1: every plan built is printed to stderr. */
static void debug_plan(const dgraph *G, const plan *P) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("TORCH_TPU_DEFER_DEBUG");
    on = e && *e && *e != '0';
  }
  if (!on) return;
  fprintf(stderr, "[defer] plan %016" PRIx64 ": %d nodes, %d promises, %d units, %d kernels\n", P->key, G->n, G->np,
          P->nunits, P->kernels);
  for (int i = 0; i < G->n; i++) {
    const dnode *d = &G->nodes[i];
    fprintf(stderr, "[defer]   node %d kind %d %s", i, d->kind, d->name ? d->name : "?");
    if (d->kind == N_EW)
      for (int v = 0; v < d->nout + d->nin; v++) fprintf(stderr, " %s%016" PRIx64, v < d->nout ? "w:" : "r:", d->views[v].ptr);
    else if (d->kind == N_FREE)
      fprintf(stderr, " %016" PRIx64, d->freed);
    else
      for (int a = 0; a < d->nacc; a++) fprintf(stderr, " a:%016" PRIx64 "[%" PRId64 ",%" PRId64 ")", d->acc[a].p, d->acc[a].lo, d->acc[a].hi);
    fprintf(stderr, "\n");
  }
  for (int l = 0; l < G->np; l++)
    fprintf(stderr, "[defer]   promise %d id %u size %" PRIu64 " live %d materialize %d\n", l, G->promises[l],
            tpurt__promise_get(G->promises[l])->size, tpurt__promise_get(G->promises[l])->live, P->materialize[l]);
  for (int i = 0; i < P->nsteps; i++) {
    const pstep *S = &P->steps[i];
    if (S->kind == S_UNIT) {
      const unit *U = &P->units[S->a];
      if (U->kind == U_GROUP) {
        const fgroup *F = &P->groups[U->idx];
        fprintf(stderr, "[defer]   step group %s (%d in, %d out)%s%s%s over [", F->name, F->nin, F->nout,
                F->pro_node ? " as the prologue of " : "", F->pro_node ? F->pro_name : "",
                F->in_red ? " as a reduction's epilogue" : "");
        for (int k = 0; k < F->ndim; k++) fprintf(stderr, "%s%" PRId64, k ? ", " : "", F->sizes[k]);
        fprintf(stderr, "]:");
        for (int k = 0; k < F->prog.ninst; k++) fprintf(stderr, " %s", tpurt_ew_op_name(F->prog.inst[k].op));
        fprintf(stderr, "\n");
      } else if (U->kind == U_CHAIN) {
        const fchain *C = &P->chains[U->idx];
        fprintf(stderr, "[defer]   step chain %s (%d stores):", C->name, tpurt__fe_chain_stores(C->fc));
        for (int m = 0; m < C->nn; m++) fprintf(stderr, " %d", C->nodes[m]);
        fprintf(stderr, "\n");
      } else
        fprintf(stderr, "[defer]   step %s node %d%s%s\n", U->kind == U_NODE ? "kernel" : "free", U->idx,
                P->epi && P->epi[S->a] ? " with the next group as its epilogue: " : "",
                P->epi && P->epi[S->a] ? P->epi[S->a] : "");
    } else if (S->kind == S_RALLOC || S->kind == S_RRELEASE) {
      fprintf(stderr, "[defer]   step %s copy of promise %d\n", S->kind == S_RALLOC ? "alloc" : "release",
              P->remat[S->a].l);
    } else {
      fprintf(stderr, "[defer]   step %s promise %d\n", S->kind == S_ALLOC ? "alloc" : "release", S->a);
    }
  }
}

static tpurt_status run_plan(exec_ctx *x) {
  plan *P = x->P;
  dgraph *G = x->G;
  tpurt_status st = TPURT_OK;
  int read_at = x->read ? read_position(P, G, x->read->src, x->read->n) : P->nsteps;
  if (read_at < 0) st = place_read(x);
  for (int i = 0; i < P->nsteps && !st; i++) {
    pstep *S = &P->steps[i];
    if (S->kind == S_UNIT) {
      st = run_unit(x, S->a);
    } else if (S->kind == S_ALLOC) {
      tpurt__promise *q = tpurt__promise_get(G->promises[S->a]);
      tpurt_devptr r = 0;
      st = tpurt_malloc(q->dev, q->size, x->s, &r);
      if (!st) atomic_store_explicit(&q->real, r, memory_order_release);
    } else if (S->kind == S_RELEASE) {
      st = promise_free_real(tpurt__promise_get(G->promises[S->a]));
    } else if (S->kind == S_RALLOC) {
      tpurt__promise *q = tpurt__promise_get(G->promises[P->remat[S->a].l]);
      st = tpurt_malloc(q->dev, q->size, x->s, &x->rreal[S->a]);
    } else if (S->kind == S_RRELEASE) {
      st = tpurt_free(x->rreal[S->a]);
      x->rreal[S->a] = 0;
    }
    if (!st && i == read_at) st = place_read(x);
  }
  /* copies a failed run did not release */
  for (int r = 0; r < P->nremat; r++)
    if (x->rreal[r]) tpurt_free(x->rreal[r]);
  return st;
}

/* Cuts the engine makes itself, not the program. */
static int engine_cut(tpurt_flush_reason r) {
  return r == TPURT_FLUSH_SIZE_CAP || r == TPURT_FLUSH_LOOP || r == TPURT_FLUSH_SEGMENT;
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
  if (atomic_load_explicit(&g_pending_graphs, memory_order_acquire) == 0) return TPURT_OK;
  if (!__atomic_load_n(&s->dgraph, __ATOMIC_ACQUIRE)) return TPURT_OK; /* nothing recorded on this stream (work recorded meanwhile comes after) */
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
  s->dgraph = NULL; /* new recordings start a new graph (after this one) */
  atomic_fetch_sub(&g_pending_graphs, 1);
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
  tpurt__defer_bypass++;
  for (int l = 0; l < G->np; l++) tpurt__promise_get(G->promises[l])->local = l;
  uint64_t k1, k2;
  graph_key(G, &k1, &k2);
  pthread_mutex_lock(&g_plan_mu);
  plan *P = g_plans[k1 % PLAN_BUCKETS];
  while (P && !(P->key == k1 && P->key2 == k2 && P->nnodes == G->n && P->nprom == G->np)) P = P->next;
  pthread_mutex_unlock(&g_plan_mu);
  int hit = P != NULL;
  tpurt_status st = TPURT_OK;
  if (!P) {
    P = build_plan(G);
    if (!P) {
      st = tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "deferred graph: out of host memory while planning %d ops", G->n);
    } else {
      P->key = k1;
      P->key2 = k2;
      pthread_mutex_lock(&g_plan_mu);
      P->next = g_plans[k1 % PLAN_BUCKETS];
      g_plans[k1 % PLAN_BUCKETS] = P;
      pthread_mutex_unlock(&g_plan_mu);
      atomic_fetch_add(&g_nplans, 1);
    }
  }
  uint64_t mat = 0, never = 0, rbytes = 0;
  if (P) {
    exec_ctx x = {s, G, P, P->nremat ? calloc((size_t)P->nremat, sizeof(tpurt_devptr)) : NULL,
                  t_read && t_read->s == s ? t_read : NULL};
    if (!hit) debug_plan(G, P);
    if (P->nremat && !x.rreal)
      st = tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "deferred graph: out of host memory");
    else
      st = run_plan(&x);
    free(x.rreal);
    for (int l = 0; l < G->np; l++) {
      tpurt__promise *q = tpurt__promise_get(G->promises[l]);
      if (P->materialize[l])
        mat += q->size;
      else
        never += q->size;
    }
    for (int r = 0; r < P->nremat; r++) rbytes += tpurt__promise_get(G->promises[P->remat[r].l])->size;
  }
  /* promises: live ones now belong to the stream's memory; dead ones go */
  for (int l = 0; l < G->np; l++) {
    uint32_t id = G->promises[l];
    tpurt__promise *q = tpurt__promise_get(id);
    q->local = -1;
    q->owner = NULL;
    q->home = s;
    if (!q->live) {
      promise_free_real(q);
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
      if (G->nodes[i].kind == N_FREE && local_of(G->nodes[i].freed) < 0) tpurt_free(G->nodes[i].freed);
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
  g_stats.bytes_materialized += mat;
  g_stats.bytes_recomputed += rbytes;
  g_stats.bytes_never_materialized += never;
  g_stats.cached_plans = (uint64_t)atomic_load(&g_nplans);
  tpurt_flush_record *r = &g_log[g_nlog % FLUSH_LOG];
  r->reason = reason;
  r->site = site ? site : "";
  r->ops = G->nops;
  r->kernels = P ? P->kernels : 0;
  r->cache_hit = hit;
  g_nlog++;
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
  pthread_mutex_unlock(&s->dmu);
  return st;
}

tpurt_status tpurt__defer_flush_device(int dev, tpurt_flush_reason reason) {
  int internal = engine_cut(reason);
  int hint = t_hint;
  if (!internal) t_hint = -1; /* consumed by this cut (see tpurt__defer_flush_stream) */
  if (atomic_load_explicit(&g_pending_graphs, memory_order_acquire) == 0) return TPURT_OK;
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
