/*
 * execute.c — the graph engine's last stage: the plan cache and running a
 * plan (see graph.h for the stages).
 *
 * Plan cache. A plan depends only on the graph's structure — ops, shapes,
 * strides, dtypes, the aliasing pattern of buffers, which promises live on,
 * the settings that change plans — so it is cached under a hash of that
 * structure (graph_key) and replayed when a graph of the same structure is
 * cut again (a training step's graph, every step): no planning, only the
 * binding of launch scalars and addresses, which are read from the graph
 * being run. Plans live for the process.
 *
 * Running. A plan is a list of steps: give a promise memory, run a unit, take
 * the memory back; recomputed values get memory of their own for their late
 * readers (memplan.c), and addresses of a recomputed promise are redirected
 * to the copy from its recompute on. Units are enqueued on the stream in
 * order: a fused group as one elementwise launch (a lone copy as the copy
 * kernel), an opaque node as its kernel, a foreach chain as one pass, a
 * GEMM with its epilogue group and a reduction with its prologue and / or
 * epilogue group as one kernel, all through kernels/fused.h. A host read
 * that cut the graph is placed right after the last step that may write what
 * it reads, so the host waits for that value and not for the whole graph.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "graph.h"

/* ------------------------------------------------------------ plan cache */

#define PLAN_BUCKETS 1024
static plan *g_plans[PLAN_BUCKETS];
static pthread_mutex_t g_plan_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int g_nplans;

uint64_t tpurt__plan_cache_size(void) { return (uint64_t)atomic_load(&g_nplans); }

static inline uint64_t mixd(uint64_t h, double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return mix(h, u);
}

/* The memory ranges node d names, in order: a program's views, a free's
 * address (one byte), a kernel's notes. Range k as its address and the
 * bytes [lo, hi) it spans. */
static int node_nranges(const dnode *d) { return d->kind == N_EW ? d->nout + d->nin : d->kind == N_FREE ? 1 : d->nacc; }

static tpurt_devptr node_range(const dnode *d, int k, uint64_t *lo, uint64_t *hi) {
  if (d->kind == N_EW) {
    view_range(&d->views[k], lo, hi);
    return d->views[k].ptr;
  }
  if (d->kind == N_FREE) {
    *lo = d->freed;
    *hi = d->freed + 1;
    return d->freed;
  }
  acc_range(&d->acc[k], lo, hi);
  return d->acc[k].p;
}

/* Names an address for a node's hash: a promise of the graph by its local
 * index and offset; memory from outside by the caller's `outside` (lo: the
 * low end of the range that starts there, node_range's). */
typedef struct addr_namer {
  uint64_t (*outside)(struct addr_namer *n, uint64_t h, uint64_t lo);
} addr_namer;

static uint64_t name_addr(addr_namer *n, uint64_t h, tpurt_devptr p, uint64_t lo) {
  int l = local_of(p);
  if (l >= 0) return mix(mix(h, 0xA0 + (uint64_t)l), p & TPURT_PROMISE_OFFMASK);
  return n->outside(n, h, lo);
}

/* Node d folded into h: kind, kernel and argument size (and a foreach or
 * product launch's own signature), program, views (dtype, sizes, strides,
 * the view's place in its range) and memory notes, every address named by
 * n. The plan cache's key (graph_key) and early execution's node matching
 * (node_hash) both hash nodes this way. */
static uint64_t node_fold(uint64_t h, const dnode *d, addr_namer *n) {
  h = mix(mix(h, d->kind), d->sig);
  if (d->kind == N_EW) {
    h = mix(h, (uint64_t)d->compute | ((uint64_t)d->ninst << 8) | ((uint64_t)d->nout << 24) | ((uint64_t)d->nin << 32) |
                   ((uint64_t)d->nscal << 40));
    for (int k = 0; k < d->ninst; k++) {
      const tpurt_ew_inst *I = &d->inst[k];
      h = mix(h, (uint64_t)I->op | ((uint64_t)I->dst << 16) | ((uint64_t)I->src[0] << 24) | ((uint64_t)I->src[1] << 32) |
                     ((uint64_t)I->src[2] << 40));
      for (int q = 0; q < 4; q++) h = mixd(h, I->p[q]);
    }
    for (int k = 0; k < d->nout; k++) h = mix(h, d->out_reg[k]);
  } else if (d->kind != N_FREE) {
    h = mix(mix(mix(h, (uint64_t)(uintptr_t)d->fn), d->args_size), (uint64_t)d->nacc);
    if (tpurt__fe_chainable(d->fn)) h = mix(h, tpurt__fe_signature(d->args));
    if (d->fn == tpurt__gemm_fn()) h = mix(h, tpurt__gemm_signature(d->args));
  }
  /* the ranges in node_range's order: graph_key's first pass collects the outside ones in it */
  for (int k = 0, nr = node_nranges(d); k < nr; k++) {
    uint64_t lo, hi;
    tpurt_devptr p = node_range(d, k, &lo, &hi);
    h = name_addr(n, h, p, lo);
    if (d->kind == N_EW) {
      const tpurt_view *w = &d->views[k];
      if (local_of(p) < 0) h = mix(h, p - lo);
      h = mix(h, (uint64_t)w->dtype | ((uint64_t)w->ndim << 8));
      for (int q = 0; q < w->ndim; q++) h = mix(mix(h, (uint64_t)w->sizes[q]), (uint64_t)w->strides[q]);
    } else if (d->kind != N_FREE) {
      h = mix(mix(mix(h, (uint64_t)d->acc[k].lo), (uint64_t)d->acc[k].hi), (uint64_t)d->acc[k].ro);
    }
  }
  return h;
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

/* graph_key's names of outside memory: the cluster of the range and the
 * offset in it, ranges taken in order of appearance (the raw address where
 * the clusters could not be built: still correct, only less shared). */
typedef struct cluster_namer {
  addr_namer n;
  const xr *X;
  const int *canon, *byorder;
  const uint64_t *cstart;
  int nx, next;
} cluster_namer;

static uint64_t cluster_name(addr_namer *n, uint64_t h, uint64_t lo) {
  cluster_namer *c = (cluster_namer *)n;
  if (c->X && c->canon && c->byorder && c->cstart && c->next < c->nx) {
    const xr *r = &c->X[c->byorder[c->next]];
    h = mix(mix(h, 0xE0 + (uint64_t)c->canon[r->cluster]), lo - c->cstart[r->cluster]);
  } else {
    h = mix(h, lo);
  }
  c->next++;
  return h;
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
  for (int i = 0; i < G->n; i++)
    for (int k = 0, n = node_nranges(&G->nodes[i]); k < n; k++) {
      uint64_t lo, hi;
      if (local_of(node_range(&G->nodes[i], k, &lo, &hi)) < 0) ADD_X(lo, hi);
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
  cluster_namer cn = {{cluster_name}, X, canon, byorder, cstart, nx, 0};
  for (int i = 0; i < G->n; i++) {
    h = node_fold(h, &G->nodes[i], &cn.n);
    h2 = mix(h2, h);
  }
  for (int l = 0; l < G->np; l++) {
    tpurt__promise *q = tpurt__promise_get(G->promises[l]);
    h = mix(h, q->size);
    h = mix(h, q->live);
  }
  h = mix(h, (uint64_t)G->n);
  h = mix(h, (uint64_t)G->np);
  h = tpurt__plan_mix_settings(h);
  free(X);
  free(canon);
  free(cstart);
  free(byorder);
  *k1 = h;
  *k2 = mix(h2, h);
}

/* -------------------------------------------------------------- running */

typedef struct exec_ctx {
  tpurt_stream *s;
  dgraph *G;
  plan *P;
  tpurt_devptr *rreal; /* memory of each recomputed copy (0: none) */
  tpurt__host_read *read; /* a host read to place inside the graph, or NULL */
} exec_ctx;

/* The step after which a host read of [src, src + n) can run: the last
 * step whose unit may change those bytes (tpurt__unit_writes), and not before the
 * memory of the promise it reads is given (-1: before every step). A
 * promise recomputed for late readers (remat) is read at the end. */
static int read_position(const plan *P, const dgraph *G, tpurt_devptr src, size_t n) {
  int l = local_of(src);
  if (l >= 0 && P->nremat && P->remat_of[l] >= 0) return P->nsteps - 1;
  uint64_t lo = src, hi = src + n;
  int at = -1;
  for (int i = P->nsteps - 1; i >= 0 && at < 0; i--) {
    const pstep *S = &P->steps[i];
    if (S->kind == S_UNIT ? tpurt__unit_writes(P, G, S->a, lo, hi) : (S->kind == S_ALLOC && S->a == l)) at = i;
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

/* A kernel's name with the source line its op was recorded at. Names and
 * sites live for the process (the stream's worker reads launch names after
 * the launch; sites are interned by whoever sets the site callback), so
 * the pair is remembered by address in a small per-thread table: a graph
 * run again (each replay of a compiled graph) formats none of its names. */
static const char *site_name(const char *name, const char *site) {
  if (!site) return name;
  static _Thread_local struct {
    const char *name, *site, *both;
  } memo[512];
  uintptr_t h = ((uintptr_t)name * 0x9E3779B97F4A7C15ull) ^ ((uintptr_t)site * 0xC2B2AE3D27D4EB4Full);
  size_t k = (size_t)(h >> 32) % (sizeof memo / sizeof memo[0]);
  if (memo[k].name == name && memo[k].site == site) return memo[k].both;
  char nm[400];
  snprintf(nm, sizeof nm, "%s (recorded at %s)", name, site);
  const char *both = tpurt__intern(nm);
  memo[k].name = name;
  memo[k].site = site;
  memo[k].both = both;
  return both;
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
  tpurt_view pb;
  for (int k = 0; k < F->nout; k++)
    if (!tpurt__split_view(tpurt__member_view(x->P, G, F->out[k], &pb), F->ndim, F->sizes, &outs[k]))
      return tpurt__err(TPURT_ERR_INTERNAL, "deferred graph: %s: output view does not fit the group's shape", F->name);
  for (int k = 0; k < F->nin; k++)
    if (!tpurt__split_view(tpurt__member_view(x->P, G, F->in[k], &pb), F->ndim, F->sizes, &ins[k]))
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

/* Tracing: the recorded ops (their host op ids) unit u's launch contains,
 * named to the trace before it is enqueued. A GEMM's epilogue group comes
 * with it; a reduction's prologue group names its own nodes (the
 * reduction node is recorded with its launch). */
static void trace_unit_members(const exec_ctx *x, int u) {
  const unit *U = &x->P->units[u];
  const dgraph *G = x->G;
  uint64_t c[256];
  int n = 0;
  if (U->kind == U_NODE) c[n++] = G->nodes[U->idx].corr;
  const int *nodes = NULL;
  int nn = 0;
  if (U->kind == U_CHAIN) nodes = x->P->chains[U->idx].nodes, nn = x->P->chains[U->idx].nn;
  if (U->kind == U_GROUP) nodes = x->P->groups[U->idx].nodes, nn = x->P->groups[U->idx].nn;
  if (U->kind == U_NODE && x->P->epi && x->P->epi[u] && u + 1 < x->P->nunits && x->P->units[u + 1].kind == U_GROUP)
    nodes = x->P->groups[x->P->units[u + 1].idx].nodes, nn = x->P->groups[x->P->units[u + 1].idx].nn;
  if (U->kind == U_NODE && x->P->pair && x->P->pair[u] > 0) c[n++] = G->nodes[x->P->units[x->P->pair[u] - 1].idx].corr;
  for (int k = 0; k < nn && n < 256; k++) c[n++] = G->nodes[nodes[k]].corr;
  tpurt__trace_members(c, n);
}

/* Product unit u and the product unit P->pair[u] - 1 as one kernel, each
 * with its arguments as its own unit sees them (plan.c, concurrent
 * products). */
static tpurt_status run_pair(exec_ctx *x, int u) {
  int w = x->P->pair[u] - 1;
  const dnode *a = &x->G->nodes[x->P->units[u].idx], *b = &x->G->nodes[x->P->units[w].idx];
  const char *name = site_name("gemm pair", b->site);
  _Alignas(16) unsigned char bufa[1024], bufb[1024];
  void *aa = NULL, *ba = NULL;
  tpurt_status st = node_args(x, u, a, name, &aa, bufa, sizeof bufa);
  if (!st) st = node_args(x, w, b, name, &ba, bufb, sizeof bufb);
  if (!st) st = tpurt__pair_enqueue(x->s, name, a->fn, aa, a->args_size, b->fn, ba, b->args_size);
  free_node_args(a, aa, bufa);
  free_node_args(b, ba, bufb);
  return st;
}

static tpurt_status run_unit(exec_ctx *x, int u) {
  unit *U = &x->P->units[u];
  dgraph *G = x->G;
  if (TPURT__TRACE_ON()) trace_unit_members(x, u);
  if (U->kind == U_FREE) {
    dnode *d = &G->nodes[U->idx];
    if (local_of(d->freed) >= 0) return TPURT_OK; /* the plan releases it after its last use */
    tpurt_devptr p = d->freed;
    d->freed = 0; /* done: a failed run frees only the markers it did not reach (record.c) */
    return tpurt_free(p);
  }
  if (x->P->epi && x->P->epi[u]) return run_gemm_epi(x, u);
  if (x->P->pair && x->P->pair[u]) return x->P->pair[u] > 0 ? run_pair(x, u) : TPURT_OK; /* the second: ran with the first */
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
  if (F->copies) { /* copies only (plan.c copies_only): the copy kernel moves them faster */
    for (int k = 0; k < F->nout && !st; k++) st = tpurt__copy_strided_named(x->s, &outs[k], &ins[F->copy_src[k]], name);
    return st;
  }
  return tpurt__elementwise_named(x->s, &F->prog, outs, ins, F->nin, scal, ns, name);
}

/* TORCH_TPU_DEFER_DEBUG=1: every plan built is printed to stderr. */
static void debug_plan(const dgraph *G, const plan *P) {
  static _Atomic int on = -1; /* runs of several threads may ask first */
  int o = atomic_load_explicit(&on, memory_order_relaxed);
  if (o < 0) {
    const char *e = getenv("TORCH_TPU_DEFER_DEBUG");
    o = e && *e && *e != '0';
    atomic_store_explicit(&on, o, memory_order_relaxed);
  }
  if (!o) return;
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
      } else if (P->pair && P->pair[S->a])
        fprintf(stderr, "[defer]   step kernel node %d %s\n", U->idx,
                P->pair[S->a] > 0 ? "with a later product as a concurrent pair" : "(ran in its pair)");
      else
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

/* Step i of the plan. */
static tpurt_status run_step(exec_ctx *x, int i) {
  plan *P = x->P;
  dgraph *G = x->G;
  pstep *S = &P->steps[i];
  if (S->kind == S_UNIT) return run_unit(x, S->a);
  if (S->kind == S_ALLOC) {
    tpurt__promise *q = tpurt__promise_get(G->promises[S->a]);
    tpurt_devptr r = 0;
    tpurt_status st = tpurt_malloc(q->dev, q->size, x->s, &r);
    if (!st) atomic_store_explicit(&q->real, r, memory_order_release);
    return st;
  }
  if (S->kind == S_RELEASE) return tpurt__promise_free_real(tpurt__promise_get(G->promises[S->a]));
  if (S->kind == S_RALLOC) {
    tpurt__promise *q = tpurt__promise_get(G->promises[P->remat[S->a].l]);
    return tpurt_malloc(q->dev, q->size, x->s, &x->rreal[S->a]);
  }
  if (S->kind == S_RRELEASE) {
    tpurt_status st = tpurt_free(x->rreal[S->a]);
    x->rreal[S->a] = 0;
    return st;
  }
  return TPURT_OK;
}

/* Steps from..end (the ones before ran early, see below), the host read
 * placed after the last step that may write what it reads. */
static tpurt_status run_plan(exec_ctx *x, int from) {
  plan *P = x->P;
  tpurt_status st = TPURT_OK;
  int read_at = x->read ? read_position(P, x->G, x->read->src, x->read->n) : P->nsteps;
  if (read_at < from) st = place_read(x);
  for (int i = from; i < P->nsteps && !st; i++) {
    st = run_step(x, i);
    if (!st && i == read_at) st = place_read(x);
  }
  /* copies a failed run did not release */
  for (int r = 0; r < P->nremat; r++)
    if (x->rreal[r]) tpurt_free(x->rreal[r]);
  return st;
}

/* ------------------------------------------------------ early execution
 *
 * A training loop cuts the same graph every step (loss.item()): recorded
 * whole, then run, the device idles while the host records (a minGPT step
 * records for ~6.5 ms of its ~48), where strict eager's kernels start with
 * the first op. So when the last two graphs of a stream ran the same plan,
 * the next graph is predicted to be that plan's graph again: as its ops are
 * recorded and match the predicted ones node for node (node_hash: the
 * same program, views and notes, on the same promises of the graph), the
 * plan's steps whose nodes are all recorded run at once —
 * the same steps, in the same order, as at the cut. At the cut the graph's
 * key decides: the predicted plan's key, and the rest of the steps run (the
 * host read placed as usual); any other, and the early work is discarded —
 * the stream drains, the memory the early steps gave the graph's promises
 * goes back, and the graph runs from its first step with its own plan.
 * That is correct because early steps never change memory from outside
 * the graph: a unit that writes any (an optimizer's update of a parameter,
 * a gradient accumulated into a kept tensor, a running statistic) ends the
 * early run, and a free of outside memory that an earlier op of the graph
 * reads is postponed to the cut (zero_grad's frees of the last gradients,
 * which nothing before reads, run early). A
 * predicted graph that diverges costs the discarded work once; the next
 * graph is not predicted until two graphs ran the same plan again.
 * TORCH_TPU_DEFER_EARLY=0 turns it off. */

/* A node's structure as far as running a plan's units on it depends on it
 * (node_fold), memory from outside named only as such (not its address: a
 * plan's early steps only read that). Two nodes with equal hashes take the
 * same units. */
static uint64_t outside_any(addr_namer *n, uint64_t h, uint64_t lo) {
  (void)n;
  (void)lo;
  return mix(h, 0xE0);
}

static uint64_t node_hash(const dnode *d) {
  addr_namer n = {outside_any};
  return node_fold(0, d, &n);
}

typedef struct early {
  const plan *P;   /* the plan the last graph ran */
  int n, same;     /* its graph's node count; the graph before ran it too */
  uint64_t *sig;   /* per node of that graph: its node_hash */
  int *need;       /* per step: nodes recorded before it may run (its units' and every earlier step's) */
  /* the graph being recorded (its id; 0: none) */
  uint64_t gid;
  int matched, next, stopped, ran_any, failed;
  tpurt_devptr *rreal;
  int *postponed, npostponed; /* steps: frees of outside memory, run at the cut */
  int *freed, nfreed;         /* free markers of outside memory run early (their nodes keep the address for the key) */
} early;

static int early_enabled(void) {
  const char *e = getenv("TORCH_TPU_DEFER_EARLY");
  return !(e && *e == '0');
}

/* The units that run inside unit u's launch: its reduction's epilogue
 * group (red_epi), the epilogue unit after it (epi), its concurrent pair
 * (pair). Writes them to p; returns how many. */
static int partners(const plan *P, int u, int p[3]) {
  const unit *U = &P->units[u];
  int n = 0;
  if (U->kind == U_NODE && P->red_epi && P->red_epi[U->idx]) p[n++] = P->red_epi[U->idx] - 1;
  if (P->epi && P->epi[u] && u + 1 < P->nunits) p[n++] = u + 1;
  if (P->pair && P->pair[u] > 0) p[n++] = P->pair[u] - 1;
  return n;
}

/* The last node index unit u runs (with its partners), -1 if none. */
static int unit_last_node(const plan *P, int u) {
  const unit *U = &P->units[u];
  int m = -1;
  if (U->kind == U_NODE || U->kind == U_FREE) m = U->idx;
  if (U->kind == U_GROUP) {
    const fgroup *F = &P->groups[U->idx];
    for (int k = 0; k < F->nn; k++) m = F->nodes[k] > m ? F->nodes[k] : m;
    if (F->pro_node - 1 > m) m = F->pro_node - 1;
  }
  if (U->kind == U_CHAIN)
    for (int k = 0; k < P->chains[U->idx].nn; k++) m = P->chains[U->idx].nodes[k] > m ? P->chains[U->idx].nodes[k] : m;
  int p[3];
  for (int k = 0, n = partners(P, u, p); k < n; k++) {
    int e = unit_last_node(P, p[k]);
    m = e > m ? e : m;
  }
  return m;
}

/* Is p memory of s's pending graph (a promise it allocated)? */
static int in_graph(const tpurt_stream *s, tpurt_devptr p) {
  if (!tpurt__is_promise(p)) return 0;
  tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(p));
  return q && __atomic_load_n(&q->owner, __ATOMIC_ACQUIRE) == s;
}

/* May unit u (as the graph being recorded has it) write memory from
 * outside the graph? */
static int writes_outside(const exec_ctx *x, int u) {
  const plan *P = x->P;
  const dgraph *G = x->G;
  const unit *U = &P->units[u];
  if (U->kind == U_GROUP) {
    const fgroup *F = &P->groups[U->idx];
    for (int k = 0; k < F->nout; k++)
      if (!in_graph(x->s, G->nodes[F->out[k].node].views[F->out[k].idx].ptr)) return 1;
  } else if (U->kind == U_NODE || U->kind == U_CHAIN) {
    for (int k = 0, n = opaque_nacc(P, G, U); k < n; k++) {
      const acc *A = opaque_acc(P, G, U, k);
      if (!A->ro && !in_graph(x->s, A->p)) return 1;
    }
  }
  int p[3];
  for (int k = 0, n = partners(P, u, p); k < n; k++)
    if (writes_outside(x, p[k])) return 1;
  return 0;
}

/* Does a node of G before node `before` touch bytes [lo, hi)? */
static int touched_before(const dgraph *G, int before, uint64_t lo, uint64_t hi) {
  for (int j = 0; j < before; j++) {
    const dnode *d = &G->nodes[j];
    for (int k = 0, n = d->kind == N_FREE ? 0 : node_nranges(d); k < n; k++) {
      uint64_t a, b;
      node_range(d, k, &a, &b);
      if (a < hi && lo < b) return 1;
    }
  }
  return 0;
}

/* Can the free of outside memory in unit u run early? Only when no op of
 * the graph before it touches that memory: a graph run again from its start
 * after a discard then never reads it (the marker itself runs once: it
 * clears its address). Otherwise it waits for the cut (a higher peak). */
static int free_runs_early(const dgraph *G, const unit *U) {
  tpurt_devptr p = G->nodes[U->idx].freed;
  uint64_t n = tpurt__alloc_bytes(p);
  return n && !touched_before(G, U->idx, p, p + n);
}

/* Waits for the early kernels, then gives back the recomputed copies' memory. */
static void early_drain(tpurt_stream *s, early *E) {
  tpurt__stream_wait_seq(s, tpurt__stream_enqueued(s));
  for (int r = 0; r < E->P->nremat && E->rreal; r++)
    if (E->rreal[r]) tpurt_free(E->rreal[r]);
}

/* The early state's graph is over (run or discarded). */
static void early_reset(early *E) {
  E->gid = 0;
  E->matched = E->next = E->stopped = E->ran_any = E->failed = 0;
  E->npostponed = E->nfreed = 0;
  free(E->rreal);
  E->rreal = NULL;
}

/* After graph G ran plan P on s: remember it as the prediction. */
static void early_learn(tpurt_stream *s, const dgraph *G, const plan *P) {
  early *E = s->dearly;
  int on = early_enabled();
  if (!E) {
    if (!on || !(E = calloc(1, sizeof *E))) return;
    s->dearly = E;
  }
  if (!on) {
    E->same = 0;
    return;
  }
  if (E->P == P && E->n == G->n) {
    E->same = 1;
    return;
  }
  free(E->sig);
  free(E->need);
  free(E->postponed);
  free(E->freed);
  E->P = NULL;
  E->same = 0;
  E->sig = malloc(sizeof *E->sig * (size_t)(G->n ? G->n : 1));
  E->need = malloc(sizeof *E->need * (size_t)(P->nsteps ? P->nsteps : 1));
  E->postponed = malloc(sizeof *E->postponed * (size_t)(P->nsteps ? P->nsteps : 1));
  E->freed = malloc(sizeof *E->freed * (size_t)(P->nsteps ? P->nsteps : 1));
  if (!E->sig || !E->need || !E->postponed || !E->freed) return;
  for (int i = 0; i < G->n; i++) E->sig[i] = node_hash(&G->nodes[i]);
  int need = 0;
  for (int i = 0; i < P->nsteps; i++) {
    if (P->steps[i].kind == S_UNIT) {
      int m = unit_last_node(P, P->steps[i].a) + 1;
      need = m > need ? m : need;
    }
    E->need[i] = need;
  }
  E->P = P;
  E->n = G->n;
}

/* Node G->n - 1 was just recorded on s (caller holds s->dmu): run the
 * predicted plan's steps it completes. */
void tpurt__early_recorded(tpurt_stream *s, dgraph *G) {
  early *E = s->dearly;
  if (!E || !E->same || !E->P) return;
  if (E->gid != G->id) {
    if (E->gid) { /* a graph that ended without running here: its early work is not taken */
      early_drain(s, E);
      early_reset(E);
    }
    E->gid = G->id;
  }
  if (E->stopped) return;
  int i = G->n - 1;
  if (i != E->matched || i >= E->n || node_hash(&G->nodes[i]) != E->sig[i]) {
    E->stopped = 1;
    return;
  }
  E->matched = i + 1;
  const plan *P = E->P;
  if (E->next >= P->nsteps || E->need[E->next] > E->matched) return;
  if (P->nremat && !E->rreal && !(E->rreal = calloc((size_t)P->nremat, sizeof(tpurt_devptr)))) {
    E->stopped = 1;
    return;
  }
  for (int l = 0; l < G->np; l++) tpurt__promise_get(G->promises[l])->local = l;
  exec_ctx x = {s, G, (plan *)P, E->rreal, NULL};
  tpurt__defer_bypass++;
  uint64_t corr = tpurt__trace_corr;
  tpurt__trace_corr = 0;
  tpurt__trace_ctx = corr;
  while (E->next < P->nsteps && E->need[E->next] <= E->matched) {
    const pstep *S = &P->steps[E->next];
    int l = S->kind == S_ALLOC || S->kind == S_RELEASE ? S->a : S->kind == S_RALLOC ? P->remat[S->a].l : -1;
    if (l >= G->np) break; /* its promise is not allocated yet: a later op's */
    if (S->kind == S_UNIT) {
      const unit *U = &P->units[S->a];
      tpurt_devptr fp = U->kind == U_FREE ? G->nodes[U->idx].freed : 0;
      if (fp && !in_graph(s, fp)) {
        int now = free_runs_early(G, U);
        if (now && tpurt__is_promise(fp)) {
          /* a tensor of an earlier graph: its memory now, its id at the cut (an id
           * given back now could name a promise recorded later in this graph) */
          tpurt__promise_free_real(tpurt__promise_get(tpurt__promise_id(fp)));
          E->postponed[E->npostponed++] = E->next;
        } else if (now) {
          /* the marker clears its address when it runs; the key at the cut still needs it */
          if (run_step(&x, E->next) == TPURT_OK) E->freed[E->nfreed++] = U->idx;
          G->nodes[U->idx].freed = fp;
          E->ran_any = 1;
        } else {
          E->postponed[E->npostponed++] = E->next;
        }
        E->next++;
        continue;
      }
      if (writes_outside(&x, S->a)) {
        E->stopped = 1;
        break;
      }
    }
    if (run_step(&x, E->next) != TPURT_OK) { /* discarded at the cut; the run from the start reports it */
      E->stopped = E->ran_any = E->failed = 1;
      break;
    }
    E->ran_any = 1;
    E->next++;
  }
  tpurt__trace_corr = corr;
  tpurt__trace_ctx = 0;
  tpurt__trace_members(NULL, 0);
  tpurt__defer_bypass--;
}

/* At the cut of G: resume the early run (1: x runs from *from, the
 * postponed frees done), or discard it (0). */
static int early_take(tpurt_stream *s, dgraph *G, const plan *P, exec_ctx *x, int *from) {
  early *E = s->dearly;
  *from = 0;
  if (!E || !G->id || E->gid != G->id) return 0;
  for (int k = 0; k < E->nfreed; k++) G->nodes[E->freed[k]].freed = 0; /* done: not again, in any run */
  if (!E->ran_any) {
    early_reset(E);
    return 0;
  }
  if (P == E->P && E->next > 0 && !E->failed) {
    x->rreal = E->rreal;
    E->rreal = NULL;
    for (int k = 0; k < E->npostponed; k++) run_step(x, E->postponed[k]);
    *from = E->next;
    tpurt__defer_count_early((uint64_t)E->next, 1, 0);
    early_reset(E);
    return 1;
  }
  /* another graph: the early kernels finish, then their memory goes back */
  early_drain(s, E);
  for (int l = 0; l < G->np; l++) {
    tpurt__promise *q = tpurt__promise_get(G->promises[l]);
    if (atomic_load(&q->real) && !q->real_freed) tpurt__promise_free_real(q);
    atomic_store(&q->real, 0);
    q->real_freed = 0;
  }
  tpurt__defer_count_early((uint64_t)E->next, 0, 1);
  E->same = 0;
  early_reset(E);
  return 0;
}

/* The key is computed with the promises' local indices set (local_of); a
 * miss builds the plan and caches it. A known plan (a replayed graph's,
 * replay.c) is run without the key. */
tpurt_status tpurt__graph_execute(tpurt_stream *s, dgraph *G, tpurt__host_read *read, const plan *known,
                                  tpurt__graph_ran *ran) {
  for (int l = 0; l < G->np; l++) tpurt__promise_get(G->promises[l])->local = l;
  plan *P = (plan *)known;
  uint64_t k1 = 0, k2 = 0;
  if (!P) {
    graph_key(G, &k1, &k2);
    pthread_mutex_lock(&g_plan_mu);
    P = g_plans[k1 % PLAN_BUCKETS];
    while (P && !(P->key == k1 && P->key2 == k2 && P->nnodes == G->n && P->nprom == G->np)) P = P->next;
    pthread_mutex_unlock(&g_plan_mu);
  }
  int hit = P != NULL;
  tpurt_status st = TPURT_OK;
  if (!P) {
    int64_t tr0 = TPURT__TRACE_ON() ? tpurt__now_ns() : 0;
    P = tpurt__plan_build(G);
    if (tr0) tpurt__trace_emit(TPURT_TRACE_PLAN, tr0, tpurt__now_ns() - tr0, "plan build", NULL, s->dev, (int)s->id, 0, 0, G->n, P ? P->kernels : 0);
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
  exec_ctx x = {s, G, P, NULL, read};
  int from = 0;
  int resumed = early_take(s, G, P, &x, &from);
  if (P) {
    if (!resumed && P->nremat) x.rreal = calloc((size_t)P->nremat, sizeof(tpurt_devptr));
    if (!hit) debug_plan(G, P);
    uint64_t corr = tpurt__trace_corr; /* launches of the plan carry their ops' ids, not the flushing op's */
    tpurt__trace_corr = 0;
    tpurt__trace_ctx = corr; /* ... which each launch names as its context */
    if (P->nremat && !x.rreal)
      st = tpurt__err(TPURT_ERR_OUT_OF_MEMORY, "deferred graph: out of host memory");
    else
      st = run_plan(&x, from);
    if (!st && !known) early_learn(s, G, P);
    tpurt__trace_corr = corr;
    tpurt__trace_ctx = 0;
    tpurt__trace_members(NULL, 0);
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
  ran->P = P;
  ran->hit = hit;
  ran->bytes_materialized = mat;
  ran->bytes_recomputed = rbytes;
  ran->bytes_never_materialized = never;
  return st;
}
