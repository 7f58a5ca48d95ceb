/*
 * replay.c — a recorded graph kept as a template and run again on other
 * inputs without recording it (see graph.h for the stages; the public side
 * is tpurt_replay.h).
 *
 * A compiled graph (torch.compile) records the same ops on every call: only
 * the addresses differ — its inputs' memory and the promises its
 * allocations get. Capture copies a stream's pending graph (one call's
 * recording, before its cut) into one block: every node's payload (program,
 * views, scalars, kernel arguments, memory notes) with each device address
 * in it rewritten relative to what it points into — a promise of the graph
 * (by local index) or one of the call's input ranges (by index) — and a
 * list of the places to patch. A replay copies the block, patches fresh
 * promises and the new inputs' addresses in, and runs the graph with the
 * plan the first replay found: no recording, no plan key, no Python between
 * the ops. Addresses that point into neither stay as they are (memory the
 * compiled module keeps alive). Its launches go to the stream as a batch
 * (tpurt__batch_begin): a few ring items and worker wake-ups a call
 * instead of one per launch.
 *
 * Which 8-byte words of a kernel's argument bytes are addresses is read
 * from their values (as execute.c's redirected_args does for recomputed
 * values). That is a guess, so a template is trusted only once a second,
 * normally recorded call (other input addresses) equals the template
 * relocated onto that call node for node and byte for byte
 * (tpurt_replay_matches): a word the guess got wrong, a launch scalar that
 * changes between calls, a different op sequence — any difference keeps the
 * template unverified, and the caller records as before.
 *
 * Random draws: a call that draws from the device's default generator
 * (dropout: an elementwise program's TPURT_EW_UNIFORM, whose seed and
 * offset halves are launch scalars; the random kernels and attention's
 * dropout: a seed word followed by an offset word in their arguments)
 * reserves its blocks when it records. The caller names the generator's
 * seed and offsets before and after the call (tpurt_replay_rng); the draws'
 * seeds equal to that seed and offsets in that range are kept relative to
 * the call's first block, and a replay reserves the call's blocks from the
 * generator and patches the draws with them and with the generator's seed —
 * the numbers a recorded call draws (verified like the addresses: the
 * second call's draws, relocated onto its own range, must match; a word
 * taken for a draw that is none changes the recording, and the graph is not
 * replayed).
 *
 * Refused at capture: host->device copies (their data is staged per call),
 * frees of memory from outside the graph, reads of another graph's pending
 * values, overlapping input ranges, and values other than the outputs
 * still held when the call ends.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "graph.h"
#include "tpurt_replay.h"

/* R_RNG / R_SEED: a draw's offset / seed as two doubles (an elementwise
 * program's launch scalars); R_RNG64 / R_SEED64: as 8-byte words (kernel
 * arguments) */
enum { R_PROMISE = 0, R_INPUT = 1, R_RNG = 2, R_SEED = 3, R_RNG64 = 4, R_SEED64 = 5 };

typedef struct rpatch {
  uint64_t off; /* byte offset of an 8-byte address in the block (R_RNG, R_SEED: of two doubles, low half first) */
  uint32_t idx; /* promise local index or input index */
  uint8_t kind;
} rpatch;

/* A template node: the recorded node with its payload as offsets into the
 * block (SIZE_MAX: none). */
typedef struct tnode {
  dnode d;
  size_t o_inst, o_views, o_scal, o_args, o_acc, o_freed;
} tnode;

struct tpurt_replay {
  int dev;
  int n, nops;
  tnode *nodes;
  unsigned char *block;
  size_t block_size;
  rpatch *patch;
  int npatch;
  int np;
  uint64_t *psize;
  uint8_t *plive;
  int nin;
  uint64_t *in_lo, *in_hi; /* the capture's input ranges */
  uint8_t *in_freed;       /* inputs the graph frees (their last user dropped them inside the call) */
  int nout;
  int *out_local;
  const plan *P; /* the plan the first replay ran */
  uint64_t rng_blocks; /* Philox blocks a call reserves from the generator */
  int verified;
};

static tpurt_status why(char *w, size_t wl, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static tpurt_status why(char *w, size_t wl, const char *fmt, ...) {
  if (w && wl) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w, wl, fmt, ap);
    va_end(ap);
  }
  return TPURT_OK;
}

void tpurt_replay_destroy(tpurt_replay *r) {
  if (!r) return;
  free(r->nodes);
  free(r->block);
  free(r->patch);
  free(r->psize);
  free(r->plive);
  free(r->in_lo);
  free(r->in_hi);
  free(r->in_freed);
  free(r->out_local);
  free(r);
}

/* --------------------------------------------------------------- capture */

typedef struct cap {
  tpurt_replay *r;
  size_t cap_patch;
  const uint64_t *lo, *hi; /* input ranges */
  const int *order;        /* inputs by address */
  int nin;
  const char *bad; /* why the graph cannot be a template */
  int at;          /* the node it is about, or -1 */
} cap;

/* The input whose range holds address a, or -1. */
static int input_of(const cap *c, uint64_t a) {
  int l = 0, h = c->nin - 1;
  while (l <= h) {
    int m = (l + h) / 2, k = c->order[m];
    if (a < c->lo[k])
      h = m - 1;
    else if (a >= c->hi[k])
      l = m + 1;
    else
      return k;
  }
  return -1;
}

/* Notes patch p; 0 when out of host memory (c->bad says so). */
static int add_patch(cap *c, rpatch p) {
  tpurt_replay *r = c->r;
  if ((size_t)r->npatch == c->cap_patch) {
    size_t nc = c->cap_patch ? 2 * c->cap_patch : 256;
    rpatch *np = realloc(r->patch, nc * sizeof *np);
    if (!np) {
      c->bad = "out of host memory";
      return 0;
    }
    r->patch = np;
    c->cap_patch = nc;
  }
  r->patch[r->npatch++] = p;
  return 1;
}

/* Rewrites the address at block offset off relative to what it points into
 * and notes the patch; other words stay. */
static void relocatable(cap *c, size_t off) {
  tpurt_replay *r = c->r;
  uint64_t w;
  memcpy(&w, r->block + off, 8);
  rpatch p = {.off = off};
  int k = input_of(c, w);
  if (k >= 0) { /* (an input may be a promise an earlier graph computed) */
    p.kind = R_INPUT;
    p.idx = (uint32_t)k;
    w -= c->lo[k];
  } else if (tpurt__is_promise(w)) {
    int l = local_of(w);
    if (l < 0) {
      c->bad = "it reads a value another pending graph computes";
      return;
    }
    p.kind = R_PROMISE;
    p.idx = (uint32_t)l;
    w &= TPURT_PROMISE_OFFMASK;
  } else {
    return; /* not an input's: kept (or not an address at all) */
  }
  if (add_patch(c, p)) memcpy(r->block + off, &w, 8);
}

/* The two doubles at block offset off as one 64-bit value (low half first), and back. */
static uint64_t halves_get(const unsigned char *b, size_t off) {
  double d[2];
  memcpy(d, b + off, sizeof d);
  return (uint64_t)d[0] | (uint64_t)d[1] << 32;
}
static void halves_set(unsigned char *b, size_t off, uint64_t v) {
  const double d[2] = {(double)(uint32_t)v, (double)(uint32_t)(v >> 32)};
  memcpy(b + off, d, sizeof d);
}

/* The draws of an elementwise node (template node t) from the generator
 * rng describes: their seeds and offsets become patches, the offsets kept
 * relative to the call's first block. */
static void rng_patches(cap *c, const tnode *t, const tpurt_replay_rng *rng) {
  const dnode *d = &t->d;
  for (int k = 0; k < d->ninst; k++) {
    const tpurt_ew_inst *I = (const tpurt_ew_inst *)(const void *)(c->r->block + t->o_inst) + k;
    int si = (int)I->p[0], seen = 0;
    if (I->op != TPURT_EW_UNIFORM || si < 0 || si + 4 > d->nscal) continue;
    for (int j = 0; j < k; j++) /* scalars two draws share are patched once */
      seen |= I[j - k].op == TPURT_EW_UNIFORM && (int)I[j - k].p[0] == si;
    if (seen) continue;
    size_t o = t->o_scal + (size_t)si * sizeof(double);
    uint64_t seed = halves_get(c->r->block, o), off = halves_get(c->r->block, o + 2 * sizeof(double));
    if (seed != rng->seed || off < rng->from || off >= rng->to) continue; /* another generator's: kept */
    if (!add_patch(c, (rpatch){.off = o, .kind = R_SEED}) ||
        !add_patch(c, (rpatch){.off = o + 2 * sizeof(double), .kind = R_RNG}))
      return;
    halves_set(c->r->block, o + 2 * sizeof(double), off - rng->from);
  }
}

/* The draws in an opaque node's arguments (template node t): a word equal
 * to the generator's seed followed by one in its offset range. */
static void rng_patches_args(cap *c, const tnode *t, const tpurt_replay_rng *rng) {
  unsigned char *a = c->r->block + t->o_args;
  for (size_t o = 0; o + 16 <= t->d.args_size; o += 8) {
    uint64_t seed, off;
    memcpy(&seed, a + o, 8);
    memcpy(&off, a + o + 8, 8);
    if (seed != rng->seed || off < rng->from || off >= rng->to) continue;
    if (!add_patch(c, (rpatch){.off = t->o_args + o, .kind = R_SEED64}) ||
        !add_patch(c, (rpatch){.off = t->o_args + o + 8, .kind = R_RNG64}))
      return;
    off -= rng->from;
    memcpy(a + o + 8, &off, 8);
    o += 8;
  }
}

static size_t payload_size(const dnode *d) {
  size_t a = 0;
  if (d->kind == N_EW) {
    a += ((size_t)d->ninst * sizeof(tpurt_ew_inst) + 15) & ~(size_t)15;
    a += ((size_t)(d->nout + d->nin) * sizeof(tpurt_view) + 15) & ~(size_t)15;
    a += ((size_t)d->nscal * sizeof(double) + 15) & ~(size_t)15;
  } else if (d->kind == N_OPAQUE) {
    a += (d->args_size + 15) & ~(size_t)15;
    a += ((size_t)d->nacc * sizeof(acc) + 15) & ~(size_t)15;
  } else if (d->kind == N_FREE) {
    a += 16;
  }
  return a;
}

static size_t put(tpurt_replay *r, size_t *at, const void *src, size_t n) {
  if (!n) return SIZE_MAX;
  size_t o = *at;
  memcpy(r->block + o, src, n);
  *at += (n + 15) & ~(size_t)15;
  return o;
}

static int cmp_by_lo(const void *a, const void *b, void *ctx) {
  const uint64_t *lo = ctx;
  uint64_t x = lo[*(const int *)a], y = lo[*(const int *)b];
  return x < y ? -1 : x > y;
}

/* Input indices sorted by address into order; 0 if two ranges overlap. */
static int sort_inputs(const uint64_t *lo, const uint64_t *hi, int n, int *order) {
  for (int k = 0; k < n; k++) order[k] = k;
  qsort_r(order, (size_t)n, sizeof *order, cmp_by_lo, (void *)lo);
  for (int m = 1; m < n; m++)
    if (lo[order[m]] < hi[order[m - 1]]) return 0;
  return 1;
}

tpurt_status tpurt_replay_capture(int dev, const tpurt_devptr *in, const uint64_t *in_bytes, int nin,
                                  const tpurt_devptr *out, int nout, const tpurt_replay_rng *rng, tpurt_replay **res,
                                  char *w, size_t wl) {
  *res = NULL;
  if (w && wl) w[0] = 0;
  tpurt_stream *s = tpurt_stream_current(dev);
  if (!s) return tpurt__err(TPURT_ERR_INVALID_ARGUMENT, "tpurt_replay_capture: no device %d", dev);
  tpurt_replay *r = calloc(1, sizeof *r);
  int *order = malloc(sizeof(int) * (size_t)(nin ? nin : 1));
  uint64_t *lo = malloc(8 * (size_t)(nin ? nin : 1)), *hi = malloc(8 * (size_t)(nin ? nin : 1));
  if (!r || !order || !lo || !hi) {
    free(r), free(order), free(lo), free(hi);
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "tpurt_replay_capture: out of host memory");
  }
  r->in_lo = lo;
  r->in_hi = hi;
  r->in_freed = calloc((size_t)(nin ? nin : 1), 1);
  r->nin = nin;
  r->dev = dev;
  for (int k = 0; k < nin; k++) {
    lo[k] = in[k];
    hi[k] = in[k] + (in_bytes[k] ? in_bytes[k] : 1);
  }
  cap c = {.r = r, .lo = lo, .hi = hi, .order = order, .nin = nin, .at = -1};
  if (!sort_inputs(lo, hi, nin, order)) c.bad = "two of its inputs share memory";
  pthread_mutex_lock(&s->dmu);
  dgraph *G = s->dgraph;
  if (!c.bad && (!G || G->n == 0)) c.bad = "it recorded nothing";
  if (!c.bad && tpurt__defer_pending_graphs() != 1) c.bad = "another stream has a pending graph";
  if (!c.bad) {
    for (int l = 0; l < G->np; l++) tpurt__promise_get(G->promises[l])->local = l;
    size_t total = 0;
    for (int i = 0; i < G->n && !c.bad; i++) {
      const dnode *d = &G->nodes[i];
      if (d->kind == N_H2D) c.bad = "it copies host data to the device";
      else if (d->kind == N_FREE && local_of(d->freed) < 0) {
        int k = input_of(&c, d->freed);
        if (k < 0 || d->freed != lo[k])
          c.bad = "it frees memory from outside the graph";
        else if (r->in_freed)
          r->in_freed[k] = 1; /* an input's last user let go of it inside the call */
      }
      total += payload_size(d);
    }
    r->nodes = calloc((size_t)(G->n > 0 ? G->n : 1), sizeof *r->nodes);
    r->block = malloc(total ? total : 16);
    r->psize = malloc(8 * (size_t)(G->np ? G->np : 1));
    r->plive = malloc((size_t)(G->np ? G->np : 1));
    r->out_local = malloc(sizeof(int) * (size_t)(nout ? nout : 1));
    if (!c.bad && (!r->in_freed || !r->nodes || !r->block || !r->psize || !r->plive || !r->out_local)) c.bad = "out of host memory";
    r->block_size = total;
    size_t at = 0;
    for (int i = 0; i < G->n && !c.bad; i++) {
      const dnode *d = &G->nodes[i];
      tnode *t = &r->nodes[i];
      c.at = i;
      t->d = *d;
      t->o_inst = t->o_views = t->o_scal = t->o_args = t->o_acc = t->o_freed = SIZE_MAX;
      if (d->kind == N_EW) {
        t->o_inst = put(r, &at, d->inst, (size_t)d->ninst * sizeof(tpurt_ew_inst));
        t->o_views = put(r, &at, d->views, (size_t)(d->nout + d->nin) * sizeof(tpurt_view));
        t->o_scal = put(r, &at, d->scal, (size_t)d->nscal * sizeof(double));
        for (int v = 0; v < d->nout + d->nin; v++) relocatable(&c, t->o_views + v * sizeof(tpurt_view));
        if (rng && rng->to > rng->from) rng_patches(&c, t, rng);
      } else if (d->kind == N_OPAQUE) {
        t->o_args = put(r, &at, d->args, d->args_size);
        t->o_acc = put(r, &at, d->acc, (size_t)d->nacc * sizeof(acc));
        for (size_t o = 0; o + 8 <= d->args_size; o += 8) relocatable(&c, t->o_args + o);
        for (int a = 0; a < d->nacc; a++) relocatable(&c, t->o_acc + a * sizeof(acc));
        if (rng && rng->to > rng->from) rng_patches_args(&c, t, rng);
      } else if (d->kind == N_FREE) {
        t->o_freed = put(r, &at, &d->freed, 8);
        relocatable(&c, t->o_freed);
      }
    }
    if (!c.bad) c.at = -1;
    r->n = G->n;
    r->nops = G->nops;
    r->np = G->np;
    r->rng_blocks = rng && rng->to > rng->from ? rng->to - rng->from : 0;
    for (int l = 0; l < G->np && !c.bad; l++) {
      const tpurt__promise *q = tpurt__promise_get(G->promises[l]);
      r->psize[l] = q->size;
      r->plive[l] = q->live;
    }
    int held = 0;
    for (int l = 0; l < G->np && !c.bad; l++) held += r->plive[l];
    for (int k = 0; k < nout && !c.bad; k++) {
      int l = tpurt__is_promise(out[k]) && !(out[k] & TPURT_PROMISE_OFFMASK) ? local_of(out[k]) : -1;
      if (l < 0 || !r->plive[l]) c.bad = "an output is not a value the graph computes";
      r->out_local[k] = l;
    }
    /* every value still held is an output */
    for (int k = 0; k < nout && !c.bad; k++) {
      int dup = 0;
      for (int j = 0; j < k; j++) dup |= r->out_local[j] == r->out_local[k];
      held -= !dup;
    }
    if (!c.bad && held) c.bad = "a value other than its outputs is still held";
    r->nout = nout;
  }
  if (c.bad && c.at >= 0)
    why(w, wl, "%s (op %d, %s)", c.bad, c.at, G->nodes[c.at].name ? G->nodes[c.at].name : "?");
  else if (c.bad)
    why(w, wl, "%s", c.bad);
  pthread_mutex_unlock(&s->dmu);
  free(order);
  if (c.bad) {
    tpurt_replay_destroy(r);
    return TPURT_OK;
  }
  *res = r;
  return TPURT_OK;
}

/* ------------------------------------------------------------ relocation */

/* The template's block with promise local l at paddr[l], input k at in[k]
 * and the draws from the call's first block `first` of a generator seeded
 * with seed, into dst (block_size bytes). */
static void relocate(const tpurt_replay *r, unsigned char *dst, const tpurt_devptr *paddr, const tpurt_devptr *in,
                     uint64_t seed, uint64_t first) {
  memcpy(dst, r->block, r->block_size);
  for (int i = 0; i < r->npatch; i++) {
    const rpatch *p = &r->patch[i];
    if (p->kind == R_SEED) {
      halves_set(dst, p->off, seed);
      continue;
    }
    if (p->kind == R_RNG) {
      halves_set(dst, p->off, first + halves_get(dst, p->off));
      continue;
    }
    if (p->kind == R_SEED64) {
      memcpy(dst + p->off, &seed, 8);
      continue;
    }
    uint64_t w;
    memcpy(&w, dst + p->off, 8);
    w += p->kind == R_RNG64 ? first : p->kind == R_PROMISE ? paddr[p->idx] : in[p->idx];
    memcpy(dst + p->off, &w, 8);
  }
}

/* Node i of the template over block b. */
static void node_over(const tpurt_replay *r, int i, unsigned char *b, dnode *d) {
  const tnode *t = &r->nodes[i];
  *d = t->d;
  d->inst = t->o_inst == SIZE_MAX ? NULL : (tpurt_ew_inst *)(void *)(b + t->o_inst);
  d->views = t->o_views == SIZE_MAX ? NULL : (tpurt_view *)(void *)(b + t->o_views);
  d->scal = t->o_scal == SIZE_MAX ? NULL : (double *)(void *)(b + t->o_scal);
  d->args = t->o_args == SIZE_MAX ? NULL : b + t->o_args;
  d->acc = t->o_acc == SIZE_MAX ? NULL : (acc *)(void *)(b + t->o_acc);
  if (t->o_freed != SIZE_MAX) memcpy(&d->freed, b + t->o_freed, 8);
}

/* ---------------------------------------------------------- verification */

static int inst_eq(const tpurt_ew_inst *a, const tpurt_ew_inst *b, int n) {
  for (int i = 0; i < n; i++) {
    if (a[i].op != b[i].op || a[i].dst != b[i].dst || memcmp(a[i].src, b[i].src, 3)) return 0;
    if (memcmp(a[i].p, b[i].p, sizeof a[i].p)) return 0;
  }
  return 1;
}

static int views_eq(const tpurt_view *a, const tpurt_view *b, int n) {
  for (int v = 0; v < n; v++) {
    if (a[v].ptr != b[v].ptr || a[v].dtype != b[v].dtype || a[v].ndim != b[v].ndim) return 0;
    for (int k = 0; k < a[v].ndim; k++)
      if (a[v].sizes[k] != b[v].sizes[k] || a[v].strides[k] != b[v].strides[k]) return 0;
  }
  return 1;
}

static int acc_eq(const acc *a, const acc *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i].p != b[i].p || a[i].lo != b[i].lo || a[i].hi != b[i].hi || a[i].ro != b[i].ro) return 0;
  return 1;
}

/* Why node x (recorded) differs from y (the template relocated), or NULL. */
static const char *node_diff(const dnode *x, const dnode *y) {
  if (x->kind != y->kind || x->sig != y->sig || x->nout != y->nout || x->nin != y->nin || x->nscal != y->nscal ||
      x->ninst != y->ninst || x->compute != y->compute || x->fn != y->fn || x->args_size != y->args_size ||
      x->nacc != y->nacc || memcmp(x->out_reg, y->out_reg, sizeof x->out_reg))
    return "another op";
  if (x->kind == N_EW) {
    if (!inst_eq(x->inst, y->inst, x->ninst)) return "another program";
    if (!views_eq(x->views, y->views, x->nout + x->nin)) return "other views";
    if (x->nscal && memcmp(x->scal, y->scal, sizeof(double) * x->nscal)) return "other scalars";
  } else if (x->kind == N_OPAQUE) {
    if (x->args_size && memcmp(x->args, y->args, x->args_size)) return "other kernel arguments";
    if (!acc_eq(x->acc, y->acc, x->nacc)) return "other memory ranges";
  } else if (x->kind == N_FREE) {
    if (x->freed != y->freed) return "another free";
  }
  return NULL;
}

/* The input addresses of a call; 0 if two ranges overlap. */
static int inputs_apart(const tpurt_replay *r, const tpurt_devptr *in, int *order, uint64_t *lo, uint64_t *hi) {
  for (int k = 0; k < r->nin; k++) {
    lo[k] = in[k];
    hi[k] = in[k] + (r->in_hi[k] - r->in_lo[k]);
  }
  return sort_inputs(lo, hi, r->nin, order);
}

int tpurt_replay_matches(tpurt_replay *r, const tpurt_devptr *in, int nin, const tpurt_devptr *out, int nout,
                         const tpurt_replay_rng *rng, char *w, size_t wl) {
  if (w && wl) w[0] = 0;
  if (nin != r->nin || nout != r->nout) return why(w, wl, "another number of inputs or outputs"), 0;
  uint64_t drawn = rng && rng->to > rng->from ? rng->to - rng->from : 0;
  if (drawn != r->rng_blocks) return why(w, wl, "another number of random draws"), 0;
  tpurt_stream *s = tpurt_stream_current(r->dev);
  const char *bad = NULL;
  int at = -1;
  int *order = malloc(sizeof(int) * (size_t)(nin ? nin : 1));
  uint64_t *lo = malloc(8 * (size_t)(nin ? nin : 1)), *hi = malloc(8 * (size_t)(nin ? nin : 1));
  tpurt_devptr *paddr = malloc(8 * (size_t)(r->np ? r->np : 1));
  unsigned char *b = malloc(r->block_size ? r->block_size : 16);
  if (!order || !lo || !hi || !paddr || !b) bad = "out of host memory";
  if (!bad && !inputs_apart(r, in, order, lo, hi)) bad = "two of its inputs share memory";
  pthread_mutex_lock(&s->dmu);
  dgraph *G = s->dgraph;
  if (!bad && (!G || G->n != r->n || G->np != r->np)) bad = "another number of ops or allocations";
  if (!bad && tpurt__defer_pending_graphs() != 1) bad = "another stream has a pending graph";
  for (int l = 0; !bad && l < r->np; l++) {
    const tpurt__promise *q = tpurt__promise_get(G->promises[l]);
    if (q->size != r->psize[l] || q->live != r->plive[l]) bad = "other allocation sizes or other values held";
    paddr[l] = TPURT_PROMISE_TAG | ((uint64_t)G->promises[l] << TPURT_PROMISE_IDSHIFT);
  }
  for (int k = 0; !bad && k < nout; k++)
    if (out[k] != paddr[r->out_local[k]]) bad = "other outputs";
  if (!bad) {
    relocate(r, b, paddr, in, rng ? rng->seed : 0, rng ? rng->from : 0);
    for (int i = 0; i < r->n && !bad; i++) {
      dnode y;
      node_over(r, i, b, &y);
      bad = node_diff(&G->nodes[i], &y);
      if (bad) at = i;
    }
  }
  pthread_mutex_unlock(&s->dmu);
  free(order), free(lo), free(hi), free(paddr), free(b);
  if (bad) {
    if (at >= 0)
      why(w, wl, "op %d (%s) differs: %s", at, r->nodes[at].d.name ? r->nodes[at].d.name : "?", bad);
    else
      why(w, wl, "%s", bad);
    return 0;
  }
  r->verified = 1;
  return 1;
}

int tpurt_replay_verified(const tpurt_replay *r) { return r->verified; }

int tpurt_replay_input_freed(const tpurt_replay *r, int k) { return k >= 0 && k < r->nin && r->in_freed[k]; }

/* ---------------------------------------------------------------- replay */

/* Gives back promises made for a replay that does not run. */
static void drop_promises(const tpurt_devptr *paddr, int n) {
  for (int l = 0; l < n; l++) tpurt__promise_free(paddr[l]);
}

tpurt_status tpurt_replay_run(tpurt_replay *r, const tpurt_devptr *in, int nin, tpurt_devptr *out,
                              tpurt_generator *gen, int *refused) {
  *refused = 1;
  if (!r->verified || nin != r->nin || (r->rng_blocks && !gen)) return TPURT_OK;
  tpurt_stream *s = tpurt_stream_current(r->dev);
  int order_s[64];
  uint64_t lo_s[64], hi_s[64];
  int big = nin > 64;
  int *order = big ? malloc(sizeof(int) * (size_t)nin) : order_s;
  uint64_t *lo = big ? malloc(8 * (size_t)nin) : lo_s, *hi = big ? malloc(8 * (size_t)nin) : hi_s;
  int apart = order && lo && hi && inputs_apart(r, in, order, lo, hi);
  if (big) free(order), free(lo), free(hi);
  if (!apart) return TPURT_OK; /* aliasing other than the template's: recorded instead */
  tpurt_devptr *paddr = malloc(8 * (size_t)(r->np ? r->np : 1));
  dgraph *G = calloc(1, sizeof *G);
  unsigned char *b = NULL;
  if (G) {
    G->nodes = malloc(sizeof(dnode) * (size_t)r->n);
    G->promises = malloc(sizeof(uint32_t) * (size_t)(r->np ? r->np : 1));
    b = tpurt__bump_alloc(&G->mem, r->block_size ? r->block_size : 16);
  }
  if (!G || !paddr || !G->nodes || !G->promises || !b) {
    free(paddr);
    if (G) {
      free(G->nodes);
      free(G->promises);
      free(G->mem.head); /* the block: one chunk */
      free(G);
    }
    return tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "replaying a compiled graph: out of host memory");
  }
  tpurt_status st = TPURT_OK;
  int np = 0;
  while (np < r->np && !(st = tpurt__promise_new_detached(r->dev, r->psize[np], r->plive[np], s, &paddr[np]))) {
    G->promises[np] = tpurt__promise_id(paddr[np]);
    np++;
  }
  pthread_mutex_lock(&s->dmu);
  /* work pending on the stream (recorded by another thread meanwhile) must
   * run first: the caller records instead */
  const dgraph *pg = s->dgraph;
  int pending = pg && (pg->n || pg->np);
  if (st || pending) {
    pthread_mutex_unlock(&s->dmu);
    drop_promises(paddr, np);
    free(paddr);
    free(G->nodes);
    free(G->promises);
    free(G->mem.head);
    free(G);
    return st; /* (refused; an error only when out of promise ids) */
  }
  *refused = 0;
  G->np = G->capp = r->np;
  G->n = G->cap = r->n;
  G->nops = r->nops;
  /* the call's draws: reserved now, as a recorded call reserves them */
  uint64_t first = r->rng_blocks ? tpurt_generator_reserve(gen, r->rng_blocks) : 0;
  relocate(r, b, paddr, in, gen ? gen->seed : 0, first);
  for (int i = 0; i < r->n; i++) node_over(r, i, b, &G->nodes[i]);
  const plan *used = NULL;
  /* the graph's launches reach the worker as a few batches (stream.c) */
  int batched = tpurt__batch_begin(s);
  tpurt__defer_run_begin(s);
  st = tpurt__graph_run_cut(s, G, TPURT_FLUSH_MODE, r->nodes[r->n - 1].d.site, r->P, &used);
  tpurt__defer_run_end(s);
  if (batched) tpurt__batch_end(s);
  if (!st && !r->P) r->P = used;
  pthread_mutex_unlock(&s->dmu);
  if (st) { /* nobody takes the outputs */
    for (int l = 0; l < r->np; l++)
      if (r->plive[l]) tpurt__promise_free(paddr[l]);
    free(paddr);
    return st;
  }
  for (int k = 0; k < r->nout; k++) out[k] = paddr[r->out_local[k]];
  free(paddr);
  return st;
}
