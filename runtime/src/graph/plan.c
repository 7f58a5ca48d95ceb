/*
 * plan.c — the graph engine's planning and fusion (see graph.h for the
 * stages): a recorded graph becomes a plan of units, each one kernel or a
 * part of one, and tpurt__plan_build drives the other planning stage
 * (memplan.c) at its places.
 *
 * Groups. Consecutive elementwise nodes with the same compute type and the
 * same number of elements are merged into one program (over the common
 * refinement of their shapes: each op's views arrive coalesced in their own
 * way) while no memory hazard forbids it; an elementwise node that cannot
 * join the open group but is independent of it (reads nothing it writes,
 * writes nothing it touches) runs first as its own unit, so a mask computed
 * between two ops does not split them. Inside a group, a value written by
 * an earlier node and read back with the same view (over the group's shape)
 * is taken from its register (with the rounding its store would have
 * applied); reading or writing a range that may share bytes with a
 * written or read range through a different view closes the group (views
 * whose strides keep them on different bytes, like the two halves of an
 * interleaved stack, do not). A node that reads a value of the group in
 * another order of the same elements joins it with its dims reordered
 * (permuted members, below). A group's program keeps
 * the stores the memory plan needs, dead instructions are removed and
 * registers allocated by linear scan.
 *
 * Pairs and chains. Runs of foreach launches become one pass (chains); a
 * reduction runs the group that computes its input as its prologue and
 * the group that reads its outputs as its epilogue; a GEMM runs the group
 * that reads its output as its epilogue (each in its section below). The
 * kernels they run in are reached through kernels/fused.h only: the
 * planner asks a family whether a launch can host a group and the
 * executor enqueues the pair.
 *
 * A plan is built once per graph structure and cached (execute.c): it
 * depends on nothing but the structure and the settings mixed into the key
 * by tpurt__plan_mix_settings.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "codegen.h"
#include "graph.h"

/* ----------------------------------------------------------------- names */

const char *tpurt__intern(const char *s) {
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

/* Copies that fused with each other and nothing else (attention's three
 * head transposes: every output a load of an input of its own dtype, no
 * output overlapping an input) run as one copy-kernel launch each: the
 * copy kernel moves them faster than the interpreter moves them together
 * (3.5x in a minGPT step), bit for bit as strict mode does. So does a copy
 * that fused with nothing (recorded as a program by copy.c, any dtypes
 * and overlap: the copy kernel is what strict mode ran). Sets F->copies
 * and F->copy_src. */
static int copies_only(const dgraph *G, fgroup *F) {
  if (F->pro_node) return 0;
  const dnode *d = &G->nodes[F->nodes[0]];
  if (F->nn == 1 && F->nin == 1 && F->nout == 1 && F->prog.ninst == 1 && F->prog.inst[0].op == TPURT_EW_LOAD &&
      d->name && strcmp(d->name, "copy") == 0) {
    F->copy_src[0] = 0;
    F->copies = 1;
    return 1;
  }
  if (F->nout < 2) return 0;
  for (int i = 0; i < F->prog.ninst; i++)
    if (F->prog.inst[i].op != TPURT_EW_LOAD) return 0;
  for (int k = 0; k < F->nout; k++) {
    int src = -1;
    for (int i = 0; i < F->prog.ninst; i++)
      if (F->prog.inst[i].dst == F->prog.out_reg[k]) src = (int)F->prog.inst[i].p[0];
    const tpurt_view *o = &G->nodes[F->out[k].node].views[F->out[k].idx];
    if (src < 0 || src >= F->nin || o->dtype != G->nodes[F->in[src].node].views[F->in[src].idx].dtype) return 0;
    uint64_t olo, ohi;
    view_range(o, &olo, &ohi);
    for (int j = 0; j < F->nin; j++) {
      uint64_t ilo, ihi;
      view_range(&G->nodes[F->in[j].node].views[F->in[j].idx], &ilo, &ihi);
      if (olo < ihi && ilo < ohi) return 0;
    }
    F->copy_src[k] = (uint8_t)src;
  }
  F->copies = 1;
  return 1;
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
  return tpurt__intern(name);
}

/* ----------------------------------------------------------------- views */

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
int tpurt__split_view(const tpurt_view *v, int nc, const int64_t *c, tpurt_view *out) {
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
  if (!tpurt__split_view(a, nc, c, &x) || !tpurt__split_view(b, nc, c, &y)) return 0;
  for (int k = 0; k < nc; k++)
    if (x.strides[k] != y.strides[k]) return 0;
  return 1;
}

static int ranges_overlap(const tpurt_view *a, const tpurt_view *b) {
  uint64_t al, ah, bl, bh;
  view_range(a, &al, &ah);
  view_range(b, &bl, &bh);
  return al < bh && bl < ah;
}

/* May a and b share a byte? Their ranges overlap and their strides do not
 * keep them apart (tpurt__residues_apart: the two halves of RoPE's
 * interleaved stack are apart). */
static int views_may_share(const tpurt_view *a, const tpurt_view *b) {
  if (!ranges_overlap(a, b)) return 0;
  uint64_t ea = tpurt_dtype_size(a->dtype), eb = tpurt_dtype_size(b->dtype);
  uint64_t g = tpurt__stride_gcd(tpurt__stride_gcd(0, a->ndim, a->sizes, a->strides, ea), b->ndim, b->sizes, b->strides, eb);
  return !tpurt__residues_apart(a->ptr, ea, b->ptr, eb, g);
}

/* ---------------------------------------------------------- group building */

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

/* Tries to append ew node ni to g, its views as `views` (the recorded ones
 * or a permutation of their dims, which g's entries then point at). Returns
 * 1 on success (g updated), 0 if the node cannot join the group. */
static int group_add(gstate *g, const dgraph *G, int ni, const tpurt_view *views) {
  const dnode *d = &G->nodes[ni];
  const tpurt_view *o0 = &views[0];
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
      const tpurt_view *v = &views[d->nout + j];
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
          if (views_may_share(t->w[k].v, v)) ok = 0;
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
    const tpurt_view *o = &views[k];
    for (int q = 0; q < t->nin && ok; q++)
      if (!view_eq_over(t->in[q].v, o, t->ndim, t->sizes) && views_may_share(t->in[q].v, o)) ok = 0;
    int fw = -1;
    for (int q = 0; q < t->nw && ok; q++) {
      if (view_eq_over(t->w[q].v, o, t->ndim, t->sizes))
        fw = q;
      else if (views_may_share(t->w[q].v, o))
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

/* Products before the open group. A product recorded while a group is
 * open that reads nothing the group writes and touches nothing it reads
 * runs before the group instead of closing it, so the elementwise ops
 * after the product still join the group: Llama's SwiGLU records the gate
 * projection, its SiLU, the up projection and the product silu(gate) * up
 * — with the up projection first, the SiLU and the product are one
 * kernel, and the two projections, now adjacent, can run as a pair. The
 * group's members recorded later may read the product's output (the group
 * runs after it). A product that reads what the group writes waits
 * instead until the group closes (it was recorded after every member so
 * far), and elementwise ops recorded after it that touch nothing it writes
 * and write nothing it reads still join the group: SwiGLU's backward
 * computes the gradients of the up projection's output and of the SiLU's
 * output in one group, then records the up projection's backward products,
 * then the SiLU's backward — which now joins that group. Products only
 * (GEMMs, convolutions): their memory is all their effect. On by default;
 * TORCH_TPU_DEFER_HOIST_PRODUCTS=0 turns both off. */
static int hoist_products_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_HOIST_PRODUCTS");
  return !(e && *e == '0');
}

static int is_product(const dgraph *G, int ni) {
  const dnode *d = &G->nodes[ni];
  return d->kind == N_OPAQUE && tpurt__product_macs(d->fn, d->args, d->args_size) > 0;
}

/* Does elementwise node ni touch memory that opaque node q writes, or write
 * memory that q reads? */
static int ew_conflicts_node(const dgraph *G, int ni, int q) {
  const dnode *d = &G->nodes[ni], *o = &G->nodes[q];
  for (int v = 0; v < d->nout + d->nin; v++) {
    uint64_t a, b;
    view_range(&d->views[v], &a, &b);
    for (int k = 0; k < o->nacc; k++) {
      if (o->acc[k].ro && v >= d->nout) continue;
      uint64_t lo, hi;
      acc_range(&o->acc[k], &lo, &hi);
      if (a < hi && lo < b) return 1;
    }
  }
  return 0;
}

/* Does opaque node ni read nothing g writes and write nothing g touches? */
static int product_independent_of(const gstate *g, const dgraph *G, int ni) {
  const dnode *d = &G->nodes[ni];
  for (int k = 0; k < d->nacc; k++) {
    uint64_t lo, hi, a, b;
    acc_range(&d->acc[k], &lo, &hi);
    for (int j = 0; j < g->nw; j++) {
      view_range(g->w[j].v, &a, &b);
      if (a < hi && lo < b) return 0;
    }
    for (int j = 0; j < g->nin && !d->acc[k].ro; j++) {
      view_range(g->in[j].v, &a, &b);
      if (a < hi && lo < b) return 0;
    }
  }
  return 1;
}

/* Permuted members. A node that reads a value the open group writes, in
 * another order of the same elements — the copy of a transposed view, a
 * stack of RoPE's halves, the gradient of a transpose — cannot join the
 * group as recorded: the group's shape walks the elements in the writer's
 * order. An elementwise node computes every element alike, so it may run
 * its dims in any order: with its dims ordered by that input's strides
 * (largest first, i.e. the order in which a dense writer stores them), it
 * reads the value from the group's register and writes its own outputs
 * through their strides in that order. Not for a node that draws random
 * numbers (its draws follow its row-major order) or one whose views
 * differ in shape, and only into a group that runs generated code
 * (graph/codegen.c's gate): the interpreter walks the short rows such a
 * group has slowly, where the copy kernel transposes in tiles — an add
 * with its transpose's copy ran 1.6x the two kernels' time interpreted,
 * as fast as them generated. On by default; TORCH_TPU_DEFER_PERMUTE=0
 * turns it off. */
static int permute_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_PERMUTE");
  return !(e && *e == '0');
}

/* The dims of v kept in the order p gives (see nperm). */
static void perm_view(const nperm *p, const tpurt_view *v, tpurt_view *out) {
  *out = *v;
  out->ndim = p->nd;
  for (int k = 0; k < p->nd; k++) {
    out->sizes[k] = v->sizes[p->d[k]];
    out->strides[k] = v->strides[p->d[k]];
  }
}

const tpurt_view *tpurt__member_view(const plan *P, const dgraph *G, vref r, tpurt_view *buf) {
  const tpurt_view *v = &G->nodes[r.node].views[r.idx];
  if (!P->perm || !P->perm[r.node].nd) return v;
  perm_view(&P->perm[r.node], v, buf);
  return buf;
}

/* Tries ew node ni in g with its dims reordered (see above); on success
 * *pm holds the order and *pv (malloc'd, the node's views reordered) what
 * g's entries point at. */
static int group_add_permuted(gstate *g, const dgraph *G, int ni, nperm *pm, tpurt_view **pv) {
  const dnode *d = &G->nodes[ni];
  int nv = d->nout + d->nin;
  if (g->nn == 0 || d->compute != g->compute || nv < 2) return 0;
  int gate = tpurt__codegen_min_ops(), ncompute = 0;
  for (int i = 0; i < d->ninst; i++) {
    if (d->inst[i].op == TPURT_EW_UNIFORM) return 0;
    ncompute += !tpurt__cg_is_source(d->inst[i].op);
  }
  for (int i = 0; i < g->nvi; i++) ncompute += !tpurt__cg_is_source(g->vi[i].op);
  if (gate <= 0 || ncompute < gate) return 0;
  const tpurt_view *v0 = &d->views[0];
  for (int k = 1; k < nv; k++) {
    if (d->views[k].ndim != v0->ndim) return 0;
    for (int q = 0; q < v0->ndim; q++)
      if (d->views[k].sizes[q] != v0->sizes[q]) return 0;
  }
  /* the first input that reads what the group writes */
  const tpurt_view *r = NULL;
  for (int j = 0; j < d->nin && !r; j++)
    for (int k = 0; k < g->nw && !r; k++)
      if (g->w[k].v->ptr == d->views[d->nout + j].ptr && ranges_overlap(g->w[k].v, &d->views[d->nout + j]))
        r = &d->views[d->nout + j];
  if (!r) return 0;
  nperm p = {0, {0}};
  for (int q = 0; q < r->ndim; q++) {
    if (r->sizes[q] == 1) continue;
    if (r->strides[q] <= 0) return 0; /* a broadcast or reversed read: no one order */
    p.d[p.nd++] = (uint8_t)q;
  }
  for (int a = 1; a < p.nd; a++) /* insertion sort, largest stride first */
    for (int b = a; b > 0 && r->strides[p.d[b]] > r->strides[p.d[b - 1]]; b--) {
      uint8_t t = p.d[b];
      p.d[b] = p.d[b - 1];
      p.d[b - 1] = t;
    }
  int moved = 0;
  for (int k = 0; k < p.nd; k++) moved |= k > 0 && p.d[k] < p.d[k - 1];
  if (!moved) return 0; /* the recorded order, which did not fit */
  tpurt_view *views = malloc(sizeof(tpurt_view) * (size_t)nv);
  if (!views) return 0;
  for (int k = 0; k < nv; k++) perm_view(&p, &d->views[k], &views[k]);
  if (!group_add(g, G, ni, views)) {
    free(views);
    return 0;
  }
  *pm = p;
  *pv = views;
  return 1;
}

int tpurt__may_fail(const dnode *d) {
  if (d->compute != TPURT_I64) return 0;
  for (int i = 0; i < d->ninst; i++) {
    uint16_t op = d->inst[i].op;
    if (op == TPURT_EW_DIV || op == TPURT_EW_DIV_TRUNC || op == TPURT_EW_DIV_FLOOR || op == TPURT_EW_REMAINDER ||
        op == TPURT_EW_FMOD)
      return 1;
  }
  return 0;
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
  free(P->pair);
  free(P->perm);
}

/* Assembles g's program for live-out vregs outs into F (program, inputs
 * that survived dead-code elimination, renumbered; nin, nout). */
int tpurt__assemble_group(const gstate *g, const int *outs, int nout, fgroup *F) {
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

/* Can foreach units u and v run in one pass (the same tuples)? */
static int fe_compatible(const plan *P, const dgraph *G, int u, int v) {
  const void *args[2] = {G->nodes[P->units[u].idx].args, G->nodes[P->units[v].idx].args};
  tpurt__fe_chain *c = tpurt__fe_chain_new(args, 2);
  free(c);
  return c != NULL;
}

/* Byte ranges of some units, sorted and merged (w: some unit writes in it). */
typedef struct bspan {
  uint64_t lo, hi;
  int w;
} bspan;

static int bspan_cmp(const void *a, const void *b) {
  uint64_t x = ((const bspan *)a)->lo, y = ((const bspan *)b)->lo;
  return x < y ? -1 : x > y;
}

/* Does any node unit in [a0, a1) touch a byte that a node unit in [b0, b1)
 * touches, one of them writing it? 1 also when out of host memory. */
static int units_conflict(const plan *P, const dgraph *G, int a0, int a1, int b0, int b1) {
  size_t n = 0;
  for (int u = b0; u < b1; u++)
    if (P->units[u].kind == U_NODE) n += (size_t)G->nodes[P->units[u].idx].nacc;
  bspan *s = malloc(sizeof *s * (n ? n : 1));
  if (!s) return 1;
  n = 0;
  for (int u = b0; u < b1; u++) {
    if (P->units[u].kind != U_NODE) continue;
    const dnode *d = &G->nodes[P->units[u].idx];
    for (int k = 0; k < d->nacc; k++) {
      acc_range(&d->acc[k], &s[n].lo, &s[n].hi);
      s[n++].w = !d->acc[k].ro;
    }
  }
  qsort(s, n, sizeof *s, bspan_cmp);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m && s[i].lo < s[m - 1].hi) {
      if (s[i].hi > s[m - 1].hi) s[m - 1].hi = s[i].hi;
      s[m - 1].w |= s[i].w;
    } else {
      s[m++] = s[i];
    }
  }
  int hit = 0;
  for (int u = a0; u < a1 && !hit; u++) {
    if (P->units[u].kind != U_NODE) continue;
    const dnode *d = &G->nodes[P->units[u].idx];
    for (int k = 0; k < d->nacc && !hit; k++) {
      uint64_t lo, hi;
      acc_range(&d->acc[k], &lo, &hi);
      size_t a = 0, b = m; /* first span ending after lo */
      while (a < b) {
        size_t c = (a + b) / 2;
        if (s[c].hi <= lo) a = c + 1;
        else b = c;
      }
      for (; a < m && s[a].lo < hi && !hit; a++) hit = !d->acc[k].ro || s[a].w;
    }
  }
  free(s);
  return hit;
}

/* A run of foreach launches over other tuples between two that could run
 * as one pass moves before the first when neither touches what the other
 * writes: a compiled AdamW step updates the moments over the parameters,
 * then computes its bias corrections over one-element step tensors, then
 * updates the parameters with them — the corrections move first, and the
 * two parameter runs become one chain (one pass over the optimizer state
 * instead of two). Free markers inside the moved run go after both. */
static int hoist_foreign_runs(plan *P, const dgraph *G) {
  unit *tmp = NULL;
  for (int v = 0; v < P->nunits; v++) {
    if (!is_fe_unit(P, G, v)) continue;
    int p = v - 1;
    while (p >= 0 && P->units[p].kind == U_FREE) p--;
    if (p < 0 || !is_fe_unit(P, G, p) || fe_compatible(P, G, p, v)) continue;
    /* X = [xs, v): launches v cannot join; Y = [ys, xs): launches it can */
    int xs = p;
    for (int q = p - 1; q >= 0; q--) {
      if (P->units[q].kind == U_FREE) continue;
      if (!is_fe_unit(P, G, q) || fe_compatible(P, G, q, v)) break;
      xs = q;
    }
    int ys = xs;
    for (int q = xs - 1; q >= 0; q--) {
      if (P->units[q].kind == U_FREE) continue;
      if (!is_fe_unit(P, G, q) || !fe_compatible(P, G, q, v)) break;
      ys = q;
    }
    if (ys == xs) continue;
    if (units_conflict(P, G, xs, v, ys, xs)) continue;
    if (!tmp && !(tmp = malloc(sizeof *tmp * (size_t)P->nunits))) return -1;
    /* X's launches, then Y (with its free markers), then X's free markers */
    int n = 0;
    for (int q = xs; q < v; q++)
      if (P->units[q].kind != U_FREE) tmp[n++] = P->units[q];
    for (int q = ys; q < xs; q++) tmp[n++] = P->units[q];
    for (int q = xs; q < v; q++)
      if (P->units[q].kind == U_FREE) tmp[n++] = P->units[q];
    memcpy(&P->units[ys], tmp, sizeof *tmp * (size_t)n);
  }
  free(tmp);
  return 0;
}

/* Runs of consecutive foreach launches (free markers between them move
 * after the run) become chains, as long as each next launch can join; then
 * the promises a chain writes before reading, that die in the graph and
 * that nothing else touches stay in registers: no store, no memory. */
static int plan_chains(plan *P, const dgraph *G, const pfacts *pf, const gstate *gl) {
  if (!chains_enabled()) return 0;
  if (hoist_foreign_runs(P, G) != 0) return -1;
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
    if (tpurt__may_fail(&G->nodes[g->nodes[m]])) return -1;
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
    tpurt__memplan_allocs_before(P, i, j, NULL);
    i = j;
  }
  return 0;
}

/* Group F against a kernel's output `flat` (dense, in F's element order):
 * -1 when an operand touches flat's bytes other than as flat itself in that
 * order, an output overlaps a range of no_out or any operand one of
 * no_any; else 1 if F reads flat, 0 if not. */
static int in_order(const plan *P, const dgraph *G, const fgroup *F, const tpurt_view *flat, const uint64_t (*no_out)[2], int nout,
                    const uint64_t (*no_any)[2], int nany) {
  uint64_t flo, fhi;
  view_range(flat, &flo, &fhi);
  int reads = 0;
  for (int k = 0; k < F->nin + F->nout; k++) {
    const vref *r = k < F->nin ? &F->in[k] : &F->out[k - F->nin];
    tpurt_view pb;
    const tpurt_view *v = tpurt__member_view(P, G, *r, &pb);
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
  int reads_out = in_order(P, G, F, &flat, no_out, nout, no_any, nany);
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
    P->red_name[node] = tpurt__intern(nm);
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
    tpurt__memplan_allocs_before(P, i, j, NULL);
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
  return in_order(P, G, F, &flat, no_out, 2, NULL, 0) > 0;
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
    P->epi[u] = tpurt__intern(nm);
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
    tpurt__memplan_allocs_before(P, i, j, NULL);
    i = j;
  }
  return 0;
}

/* --------------------------------------------- concurrent products
 *
 * On two threads, two products of a backward pass that do not touch each
 * other's outputs (a linear layer's input and weight gradients, dY W and
 * dY^T X: the same multiply-adds; the two batched products of attention's
 * backward) run as one kernel, each whole on a thread of its own
 * (kernels/gemm.c, tpurt__pair_enqueue), instead of one after the
 * other, each split over both threads: no product waits for the slower
 * thread at its end, each keeps its packed operands in its own core's
 * cache, and a thread the host's threads take the core from delays one
 * product, not both. The same bits: a product's result does not depend on
 * the threads it ran on. Conditions: the products are float ones the own
 * kernels run, their multiply-adds within PAIR_BALANCE of each other (the
 * pair takes as long as the longer one), neither writes what the other
 * reads or writes, and only free markers and recomputations the first
 * does not feed lie between their units; the allocations and those
 * recomputations move before the pair, as allocations do for epilogues. Only with
 * exactly two threads (a nested region runs inline: with more threads a
 * pair would leave the others idle). TORCH_TPU_DEFER_PAIRS=0 turns it
 * off; part of the plan key. */
#define PAIR_BALANCE 0.8

static int pairs_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_PAIRS");
  return !(e && *e == '0') && tpurt_num_threads() == 2;
}

static int64_t pair_macs(const plan *P, const dgraph *G, int u) {
  const unit *U = &P->units[u];
  if (U->kind != U_NODE) return 0;
  if ((P->epi && P->epi[u]) || (u > 0 && P->epi && P->epi[u - 1]) || (P->pro_skip && P->pro_skip[U->idx]) ||
      (P->red_epi && P->red_epi[U->idx]))
    return 0;
  const dnode *d = &G->nodes[U->idx];
  return tpurt__product_macs(d->fn, d->args, d->args_size);
}

/* Does either node write bytes the other touches? */
static int nodes_conflict(const dnode *a, const dnode *b) {
  for (int i = 0; i < a->nacc; i++)
    for (int j = 0; j < b->nacc; j++) {
      if (a->acc[i].ro && b->acc[j].ro) continue;
      uint64_t xl, xh, yl, yh;
      acc_range(&a->acc[i], &xl, &xh);
      acc_range(&b->acc[j], &yl, &yh);
      if (xl < yh && yl < xh) return 1;
    }
  return 0;
}

/* Can recompute unit r (between the pair's units u and w) run before u?
 * It is a recomputation, u writes none of its inputs, and u does not touch
 * the value it recomputes (u's addresses of it are not redirected to the
 * copy). */
static int hoistable(const plan *P, const dgraph *G, int u, int r) {
  if (P->units[r].kind != U_GROUP) return 0;
  int k = 0;
  while (k < P->nremat && P->remat[k].unit != r) k++;
  if (k == P->nremat) return 0;
  const fgroup *F = &P->groups[P->units[r].idx];
  if (F->pro_node || F->in_red || (P->epi && r > 0 && P->epi[r - 1])) return 0;
  for (int i = 0; i < F->nin; i++) {
    uint64_t lo, hi;
    view_range(&G->nodes[F->in[i].node].views[F->in[i].idx], &lo, &hi);
    if (tpurt__unit_writes(P, G, u, lo, hi)) return 0;
  }
  const dnode *d = &G->nodes[P->units[u].idx];
  for (int a = 0; a < d->nacc; a++)
    if (local_of(d->acc[a].p) == P->remat[k].l) return 0;
  return 1;
}

static int plan_pairs(plan *P, const dgraph *G) {
  if (!pairs_enabled()) return 0;
  uint8_t *hoist = NULL; /* per unit: a recomputation that runs before its pair */
  for (int u = 0; u < P->nunits; u++) {
    int64_t mu = pair_macs(P, G, u);
    if (!mu) continue;
    int w = u + 1;
    while (w < P->nunits && (P->units[w].kind == U_FREE || hoistable(P, G, u, w))) w++;
    if (w == P->nunits) break;
    int64_t mw = pair_macs(P, G, w);
    if (!mw || (double)(mu < mw ? mu : mw) < PAIR_BALANCE * (double)(mu < mw ? mw : mu) ||
        nodes_conflict(&G->nodes[P->units[u].idx], &G->nodes[P->units[w].idx]))
      continue;
    if (!P->pair && !(P->pair = calloc((size_t)P->nunits, sizeof *P->pair))) goto oom;
    if (!hoist && !(hoist = calloc((size_t)P->nunits, 1))) goto oom;
    P->pair[u] = w + 1;
    P->pair[w] = -1;
    for (int r = u + 1; r < w; r++) hoist[r] = P->units[r].kind == U_GROUP;
    P->kernels--;
    u = w; /* the second is taken: it cannot start a pair */
  }
  /* the steps between a pair's units: allocations and the hoisted
   * recomputations move before the pair; releases and frees stay after it
   * (stream-ordered: after the pair's kernel) */
  for (int i = 0; P->pair && i < P->nsteps; i++) {
    if (P->steps[i].kind != S_UNIT || P->pair[P->steps[i].a] <= 0) continue;
    int w = P->pair[P->steps[i].a] - 1, j = i + 1;
    while (j < P->nsteps && !(P->steps[j].kind == S_UNIT && P->steps[j].a == w)) j++;
    tpurt__memplan_allocs_before(P, i, j, hoist);
    i = j;
  }
  free(hoist);
  return 0;
oom:
  free(hoist);
  return -1;
}

/* ------------------------------------------------------------- the plan */

/* 1. units: groups, hoisted nodes, opaque nodes, free markers; chains and
 * prologue pairs; 2. the promises that take memory (memplan.c); 3. the
 * groups' programs with the stores still needed; 4. recomputation and the
 * steps (memplan.c); 5. the steps of pairs run as one kernel. */
static void free_pviews(tpurt_view **pv, int n) {
  for (int i = 0; pv && i < n; i++) free(pv[i]);
  free(pv);
}

plan *tpurt__plan_build(dgraph *G) {
  plan *P = calloc(1, sizeof *P);
  gstate *gs = malloc(sizeof *gs), *hs = malloc(sizeof *hs);
  pfacts *pf = calloc((size_t)(G->np ? G->np : 1), sizeof *pf);
  gstate *gl = NULL; /* groups' states */
  int ngl = 0, capgl = 0;
  int (*pro)[2] = NULL; /* per group: its reduction's node + 1, its write of the input (plan_prologues) */
  int *deferred_frees = NULL, *sunk = NULL; /* freed on every path, fail included */
  tpurt_view **pviews = NULL;  /* per node: its views as its group runs them, when permuted (group_add_permuted) */
  if (!P || !gs || !hs || !pf) goto fail;
  if (permute_enabled() && (!(P->perm = calloc((size_t)G->n + 1, sizeof(nperm))) ||
                            !(pviews = calloc((size_t)G->n + 1, sizeof(tpurt_view *)))))
    goto fail;
  P->nnodes = G->n;
  P->nprom = G->np;
  P->units = malloc(sizeof(unit) * (size_t)(G->n + 1));
  deferred_frees = malloc(sizeof(int) * (size_t)(G->n + 1));
  sunk = malloc(sizeof(int) * (size_t)(G->n + 1));
  if (!P->units || !deferred_frees || !sunk) goto fail;
  int ndf = 0, nsunk = 0, hs_first = -1; /* hs_first: the first node of hs */
  for (int l = 0; l < G->np; l++) {
    tpurt__promise *q = tpurt__promise_get(G->promises[l]);
    pf[l].live = q->live;
    pf[l].first = pf[l].last = -1;
  }
  /* 1. grouping. hs: the nodes hoisted before the open group gs (each
   * independent of gs), themselves grouped — a RoPE backward's arithmetic
   * over the query's elements while the key's gradients are summed in gs */
  group_reset(gs);
  group_reset(hs);
  const int hoist_products = hoist_products_enabled();
#define CLOSE_GROUP()                                                        \
  do {                                                                       \
    if (hs->nn > 0) {                                                        \
      if (!push_group(P, &gl, &ngl, &capgl, hs)) goto fail;                  \
      group_reset(hs);                                                       \
    }                                                                        \
    if (gs->nn > 0) {                                                        \
      if (!push_group(P, &gl, &ngl, &capgl, gs)) goto fail;                  \
      group_reset(gs);                                                       \
    }                                                                        \
    for (int _q = 0; _q < nsunk; _q++) push_unit(P, U_NODE, sunk[_q]);      \
    nsunk = 0;                                                               \
    for (int _f = 0; _f < ndf; _f++) push_unit(P, U_FREE, deferred_frees[_f]); \
    ndf = 0;                                                                 \
  } while (0)
  /* node i joins g as recorded or with its dims reordered */
#define JOIN(g) (group_add((g), G, i, d->views) || (P->perm && group_add_permuted((g), G, i, &P->perm[i], &pviews[i])))
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
      int clash = 0; /* with a product waiting for the group to close */
      for (int q = 0; q < nsunk && !clash; q++) clash = ew_conflicts_node(G, i, sunk[q]);
      if (clash) {
        /* ops hoisted before the group, all recorded after the waiting
         * products (so they already passed this test against each), open
         * the next group instead, after the products: the SiLU recomputed
         * in SwiGLU's backward then joins the ops that read it */
        if (hs->nn > 0 && hs_first > sunk[nsunk - 1]) {
          if (gs->nn > 0) {
            if (!push_group(P, &gl, &ngl, &capgl, gs)) goto fail;
            group_reset(gs);
          }
          for (int q = 0; q < nsunk; q++) push_unit(P, U_NODE, sunk[q]);
          nsunk = 0;
          gstate *t = gs; /* the free markers stay pending: they go after the carried group */
          gs = hs;
          hs = t;
        } else {
          CLOSE_GROUP();
        }
      }
      if (JOIN(gs)) continue;
      if (gs->nn > 0 && !tpurt__may_fail(d) && independent_of(gs, G, i)) {
        /* hoist: the node runs before the open group, in the hoisted group
         * or, where it cannot join that, in a new one after it */
        if (hs->nn > 0 && JOIN(hs)) continue;
        if (hs->nn > 0) {
          if (!push_group(P, &gl, &ngl, &capgl, hs)) goto fail;
          group_reset(hs);
        }
        hs_first = i;
        if (group_add(hs, G, i, d->views)) continue;
        goto fail;
      }
      CLOSE_GROUP();
      if (group_add(gs, G, i, d->views)) continue;
      goto fail; /* a single recorded program always fits */
    }
    if (gs->nn > 0 && hoist_products && is_product(G, i)) {
      if (nsunk > 0 || !product_independent_of(gs, G, i)) {
        sunk[nsunk++] = i; /* after the group (see above) */
        continue;
      }
      /* after the hoisted group (its nodes were recorded before this one),
       * before the open group */
      if (hs->nn > 0) {
        if (!push_group(P, &gl, &ngl, &capgl, hs)) goto fail;
        group_reset(hs);
      }
      push_unit(P, U_NODE, i);
      continue;
    }
    CLOSE_GROUP();
    push_unit(P, U_NODE, i);
  }
  CLOSE_GROUP();
#undef CLOSE_GROUP
#undef JOIN
  free(deferred_frees);
  deferred_frees = NULL;
  free(sunk);
  sunk = NULL;
  if (plan_chains(P, G, pf, gl) != 0) goto fail;
  pro = calloc((size_t)(ngl ? ngl : 1), sizeof *pro);
  if (!pro || plan_prologues(P, G, gl, pf, pro) != 0) goto fail;
  /* 2. which promises must live in memory */
  if (tpurt__memplan_materialize(P, G, gl, pf) != 0) goto fail;
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
    if (tpurt__assemble_group(g, outs, nout, F) != 0) goto fail;
    /* members whose instructions all died still count as fused away */
    F->name = fused_name(G, g->nodes, g->nn);
    if (copies_only(G, F)) {
      F->name = "copy";
      P->kernels += F->nout;
      continue;
    }
    P->kernels++;
    if (g->nn > 1 || F->pro_node) {
      P->fused_kernels++;
      P->ops_fused += g->nn;
    }
    if (F->pro_node) {
      const dnode *r = &G->nodes[F->pro_node - 1];
      char nm[320];
      snprintf(nm, sizeof nm, "%s+%s", F->name, r->name ? r->name : "reduce");
      F->pro_name = tpurt__intern(nm);
      P->ops_fused++;
    }
  }
  /* the opaque kernels: every node and chain but a reduction run inside
   * its prologue group's kernel */
  for (int u = 0; u < P->nunits; u++) {
    const unit *U = &P->units[u];
    if (U->kind == U_CHAIN || (U->kind == U_NODE && !(P->pro_skip && P->pro_skip[U->idx]))) P->kernels++;
  }
  /* 4. values recomputed for late readers, then the steps */
  if (tpurt__memplan_remat(P, G, gl) != 0 || tpurt__memplan_steps(P, G, pf) != 0) goto fail;
  /* 5. pairs run as one kernel: their steps */
  if (order_prologues(P) != 0 || plan_red_epilogues(P, G) != 0 || plan_epilogues(P, G) != 0 ||
      plan_pairs(P, G) != 0)
    goto fail;
  free(gs);
  free(hs);
  free(gl);
  free(pf);
  free(pro);
  free_pviews(pviews, G->n);
  return P;
fail:
  if (P) {
    free_plan_contents(P);
    free(P);
  }
  free(gs);
  free(hs);
  free(gl);
  free(pf);
  free(pro);
  free(deferred_frees);
  free(sunk);
  free_pviews(pviews, G->n);
  return NULL;
}

/* The settings above, and the memory plan's, change plans: part of the key. */
uint64_t tpurt__plan_mix_settings(uint64_t h) {
  h = mix(h, (uint64_t)tpurt__remat_enabled());
  h = mix(h, (uint64_t)chains_enabled());
  h = mix(h, (uint64_t)hoist_products_enabled());
  h = mix(h, (uint64_t)epilogues_enabled());
  h = mix(h, (uint64_t)prologues_enabled());
  h = mix(h, (uint64_t)red_epilogues_enabled());
  h = mix(h, (uint64_t)pairs_enabled());
  h = mix(h, (uint64_t)permute_enabled());
  h = mix(h, (uint64_t)tpurt__codegen_min_ops());
  return h;
}
