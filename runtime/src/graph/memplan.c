/*
 * memplan.c — the graph engine's memory plan (see graph.h for the stages):
 * which promises take memory, when, and which stored values are recomputed
 * instead of kept.
 *
 * Materialization. A promise gets memory only if it is still alive when the
 * graph ends or some unit must read it from memory (an opaque kernel, or a
 * fused program that could not take the value from a register); stores to
 * the others are dropped from their groups (plan.c assembles the groups
 * with the stores this leaves).
 *
 * Liveness. Memory is allocated before the first unit that touches a
 * promise in memory and freed after the last (the steps of the plan),
 * through the stream-ordered caching allocator (the memory one promise
 * releases can serve a later one). Pairs run as one kernel (plan.c) move
 * the allocations between their units before the pair.
 *
 * Recomputation: see the section below.
 */
#include <stdio.h>
#include <stdlib.h>

#include "graph.h"

/* Unit u touches p: a promise, or from its remat unit on, the promise's
 * recomputed copy (after tpurt__memplan_remat). */
static void touch(const plan *P, pfacts *f, tpurt_devptr p, int u) {
  int l = local_of(p);
  if (l < 0) return;
  int r = P->remat_of[l];
  int *first = &f[l].first, *last = &f[l].last;
  if (r >= 0 && u >= P->remat[r].unit) first = &P->remat[r].first, last = &P->remat[r].last;
  if (*first < 0) *first = u;
  *last = u;
}

/* Which promises take memory (P->materialize): those still live at the
 * end, and those a unit reads from memory (a group's loads, an opaque
 * kernel's ranges but a reduction's input computed by its prologue, the
 * outputs of an op that can fail). Called after grouping, chains and
 * prologue pairing; the others are never stored. */
int tpurt__memplan_materialize(plan *P, const dgraph *G, const gstate *gl, pfacts *pf) {
  for (int u = 0; u < P->nunits; u++) {
    unit *U = &P->units[u];
    if (U->kind == U_GROUP) {
      const gstate *g = &gl[U->idx];
      for (int k = 0; k < g->nin; k++) {
        int l = local_of(g->in[k].v->ptr);
        if (l >= 0) pf[l].memread = 1;
      }
      /* an op that can fail (integer division by zero) runs even when its
       * result is not needed, so that the error is raised as in strict mode */
      for (int m = 0; m < g->nn; m++) {
        const dnode *d = &G->nodes[g->nodes[m]];
        if (!tpurt__may_fail(d)) continue;
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
  if (!P->materialize) return -1;
  for (int l = 0; l < G->np; l++) P->materialize[l] = pf[l].live || pf[l].memread;
  return 0;
}

/* The steps: each unit, with the allocations of the promises (and
 * recomputed copies) it touches first before it and the releases of those
 * it touches last after it; a live promise is never released, and one no
 * unit touches in memory is given memory at the end. Called after
 * tpurt__memplan_remat (touches of a recomputed promise from its recompute
 * on are its copy's). */
int tpurt__memplan_steps(plan *P, const dgraph *G, pfacts *pf) {
  for (int u = 0; u < P->nunits; u++) {
    const unit *U = &P->units[u];
    if (U->kind == U_GROUP) {
      const fgroup *F = &P->groups[U->idx];
      if (F->nout == 0) continue;
      for (int k = 0; k < F->nin; k++) touch(P, pf, G->nodes[F->in[k].node].views[F->in[k].idx].ptr, u);
      for (int k = 0; k < F->nout; k++) touch(P, pf, G->nodes[F->out[k].node].views[F->out[k].idx].ptr, u);
    } else if (U->kind == U_NODE || U->kind == U_CHAIN) {
      for (int k = 0, n = opaque_nacc(P, G, U); k < n; k++) touch(P, pf, opaque_acc(P, G, U, k)->p, u);
    }
  }
  P->steps = malloc(sizeof(pstep) * (size_t)(P->nunits + 2 * G->np + 2 * P->nremat + 1));
  if (!P->steps) return -1;
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
  return 0;
}

/* A pair of units run as one kernel at the first one's step i, the second
 * at step j: the allocations between them — and the units marked in
 * `units` (per unit, or NULL: none) — move before step i (in order). */
void tpurt__memplan_allocs_before(plan *P, int i, int j, const uint8_t *units) {
  int at = i;
  pstep unit_step = P->steps[i];
  for (int k = i + 1; k < j; k++) {
    pstep t = P->steps[k];
    if (t.kind != S_ALLOC && t.kind != S_RALLOC && !(t.kind == S_UNIT && units && units[t.a])) continue;
    memmove(&P->steps[at + 1], &P->steps[at], sizeof(pstep) * (size_t)(k - at));
    P->steps[at++] = t;
  }
  P->steps[at] = unit_step;
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
int tpurt__unit_writes(const plan *P, const dgraph *G, int u, uint64_t lo, uint64_t hi) {
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
    uint64_t a, b;
    acc_range(A, &a, &b);
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
    if (tpurt__unit_writes(P, G, u, lo, hi)) return 0;
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
 * (unit = the index of the first late reader; tpurt__memplan_remat inserts the
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
  int out = g->w[wk].vreg, ok = tpurt__assemble_group(h, &out, 1, F) == 0 && F->prog.ninst <= REMAT_MAX_INST;
  int dep[2] = {-1, -1}, ndep = 0;
  for (int k = 0; k < F->nin && ok; k++) {
    tpurt_view pb;
    const tpurt_view *v = tpurt__member_view(P, G, F->in[k], &pb);
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
  F->name = tpurt__intern(name);
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
int tpurt__remat_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_REMAT");
  return !(e && *e == '0');
}

/* Chooses the values to recompute and inserts their recompute units (each
 * just before its first late reader). Returns 0, or -1 out of memory. */
int tpurt__memplan_remat(plan *P, const dgraph *G, const gstate *gl) {
  int np = G->np;
  P->remat_of = malloc(sizeof(int) * (size_t)(np ? np : 1));
  if (!P->remat_of) return -1;
  for (int l = 0; l < np; l++) P->remat_of[l] = -1;
  if (np == 0 || !tpurt__remat_enabled()) return 0;
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
