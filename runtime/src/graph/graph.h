/*
 * graph.h — what the stages of the graph engine (DeferAndFuse) share; not
 * included outside runtime/src/graph/.
 *
 * A graph goes through the stages in order, one file each:
 *   record.c   recording: launches become nodes of the stream's pending
 *              graph, allocations become promises; cuts (flush reasons,
 *              loop detection, the size cap, segments) and the stats
 *   plan.c     planning and fusion: elementwise nodes into groups, foreach
 *              chains, reduction prologues and epilogues, GEMM epilogues;
 *              the plan's kernels and names
 *   memplan.c  the memory plan: which promises take memory, liveness and
 *              the alloc / release steps, recomputation of stored values
 *   execute.c  the plan cache (structural keys) and running a plan's steps
 *   replay.c   a recorded graph kept as a template and run again on other
 *              inputs without recording (compiled graphs)
 * Kernels are reached only through kernels/fused.h.
 *
 * Names here are private to the folder: types and inline helpers keep the
 * short names they have in the stages; functions with external linkage are
 * prefixed tpurt__.
 */
#ifndef TPURT_GRAPH_H
#define TPURT_GRAPH_H

#include "../internal.h"
#include "../kernels/fused.h"

/* ------------------------------------------------------ recorded graphs */

/* Node kinds: an elementwise program, an opaque kernel, a host->device
 * copy (data staged), a free marker. */
enum { N_EW = 1, N_OPAQUE, N_H2D, N_FREE };

/* A range of memory a kernel touches, as the launch validated it. */
typedef struct acc {
  tpurt_devptr p;
  int64_t lo, hi; /* bytes [p + lo, p + hi) */
  int ro;         /* the kernel only reads this range */
} acc;

/* A recorded launch. */
typedef struct dnode {
  uint64_t sig; /* structural signature for loop detection */
  uint8_t kind;
  uint8_t nout, nin, nscal;
  int ninst;
  tpurt_dtype compute;
  const char *name, *site;
  uint64_t corr; /* the host op that recorded it (trace.c) */
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

/* The memory a graph's nodes point into (record.c). */
typedef struct bump {
  struct bchunk *head;
} bump;

/* A stream's pending graph: its nodes in order and the promises allocated
 * while it was recorded. */
typedef struct dgraph {
  dnode *nodes;
  int n, cap;
  int nops; /* nodes that are not free markers */
  uint32_t *promises; /* allocated while recording, in order */
  int np, capp;
  bump mem;
  uint64_t id; /* graphs of the process, numbered from 1 (early execution tells them apart by it) */
} dgraph;

/* ---------------------------------------------------------------- hashing */

/* Node signatures (loop detection) and plan keys. */
static inline uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}

/* ------------------------------------------------------------------ plans */

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
  int copies; /* copies only: output k is a copy of input copy_src[k], each run by the copy kernel (plan.c) */
  uint8_t copy_src[TPURT_EW_MAX_IO];
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

/* A member node whose dims a group runs in another order (plan.c,
 * group_add_permuted): its views' dims d[0..nd) of the recorded ones
 * (the others have size 1); nd 0: the node runs as recorded. */
typedef struct nperm {
  uint8_t nd;
  uint8_t d[TPURT_MAX_DIMS];
} nperm;

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
  struct remat *remat;  /* recomputed values (memplan.c) */
  int nremat;
  int *remat_of; /* per local promise: its remat slot or -1 */
  fchain *chains;
  int nchains;
  const char **epi; /* per unit: a GEMM unit's name with the group after it as its epilogue, or NULL */
  uint8_t *pro_skip; /* per node: a reduction run inside its prologue group's kernel */
  int *red_epi;       /* per node: a reduction's epilogue group's unit + 1 (0: none) */
  const char **red_name; /* per node: the name of a reduction's kernel with its epilogue */
  int *pair; /* per unit: a product run with a later one (its unit + 1), the later one (-1), or 0 */
  nperm *perm; /* per node: its dims in its group's order; NULL with TORCH_TPU_DEFER_PERMUTE=0 */
  int kernels, fused_kernels, ops_fused, ops_eliminated, stores_eliminated;
  struct plan *next;
} plan;

/* Byte range [lo, hi) of a non-empty view. */
static inline void view_range(const tpurt_view *v, uint64_t *lo, uint64_t *hi) {
  int64_t l, h;
  tpurt__view_extent(v, &l, &h);
  *lo = v->ptr + (uint64_t)l;
  *hi = v->ptr + (uint64_t)h;
}

/* Byte range [lo, hi) of a kernel's access. */
static inline void acc_range(const acc *a, uint64_t *lo, uint64_t *hi) {
  *lo = a->p + (uint64_t)a->lo;
  *hi = a->p + (uint64_t)a->hi;
}

/* Local index of a promise of this graph (-1 if p is not one). */
static inline int local_of(tpurt_devptr p) {
  if (!tpurt__is_promise(p)) return -1;
  tpurt__promise *q = tpurt__promise_get(tpurt__promise_id(p));
  return q ? q->local : -1;
}

/* The memory notes of an opaque unit (a node or a chain). */
static inline int opaque_nacc(const plan *P, const dgraph *G, const unit *U) {
  return U->kind == U_NODE ? G->nodes[U->idx].nacc : P->chains[U->idx].nacc;
}
static inline const acc *opaque_acc(const plan *P, const dgraph *G, const unit *U, int i) {
  if (U->kind == U_NODE) return &G->nodes[U->idx].acc[i];
  const fchain *C = &P->chains[U->idx];
  return &G->nodes[C->acc[2 * i]].acc[C->acc[2 * i + 1]];
}

/* ------------------------------------------------- group building (plan.c) */

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

/* Per local promise facts gathered while planning. */
typedef struct pfacts {
  uint8_t live;    /* still held by the user at the end */
  uint8_t memread; /* read from memory by some unit (or written by an opaque kernel) */
  int first, last; /* units that touch it in memory */
} pfacts;

/* --------------------------------------------------------- across stages */

/* record.c: frees the memory behind a promise once (stream-ordered). */
TPURT_INTERNAL tpurt_status tpurt__promise_free_real(tpurt__promise *q);
/* record.c: a promise of size bytes on dev that no pending graph records
 * (a replayed graph's, replay.c): live as given, settled on stream home. */
TPURT_INTERNAL tpurt_status tpurt__promise_new_detached(int dev, size_t size, int live, tpurt_stream *home,
                                                        tpurt_devptr *out);
/* record.c: n bytes (16-aligned) of a graph's recorded memory, freed with it. */
TPURT_INTERNAL void *tpurt__bump_alloc(bump *b, size_t n);
/* record.c: streams with a non-empty pending graph. */
TPURT_INTERNAL int tpurt__defer_pending_graphs(void);
/* record.c: runs graph G taken from stream s (caller holds s->dmu) with
 * plan known (NULL: the plan cache's), settles its promises, counts the cut
 * (reason, site) in the stats and the flush log, and frees G; *used (if not
 * NULL) is the plan that ran (NULL: out of host memory). */
TPURT_INTERNAL tpurt_status tpurt__graph_run_cut(tpurt_stream *s, dgraph *G, tpurt_flush_reason reason,
                                                 const char *site, const plan *known, const plan **used);

/* plan.c: the plan of graph G (its promises' local indices set), or NULL
 * when out of host memory. */
TPURT_INTERNAL plan *tpurt__plan_build(dgraph *G);
/* Mixes the settings that change plans (TORCH_TPU_DEFER_*) into a plan key. */
TPURT_INTERNAL uint64_t tpurt__plan_mix_settings(uint64_t h);
/* A name kept for the process (plans and their kernel names live that long). */
TPURT_INTERNAL const char *tpurt__intern(const char *s);
/* v re-expressed over shape c (a refinement of v's shape). */
TPURT_INTERNAL int tpurt__split_view(const tpurt_view *v, int nc, const int64_t *c, tpurt_view *out);
/* The view r of a group member as the group runs it: the recorded view, or
 * (a permuted member) its dims reordered into buf. */
TPURT_INTERNAL const tpurt_view *tpurt__member_view(const plan *P, const dgraph *G, vref r, tpurt_view *buf);
/* Assembles g's program for live-out vregs outs into F. */
TPURT_INTERNAL int tpurt__assemble_group(const gstate *g, const int *outs, int nout, fgroup *F);
/* Can node d fail at run time (integer division by zero)? */
TPURT_INTERNAL int tpurt__may_fail(const dnode *d);

/* memplan.c, called by tpurt__plan_build in this order: which promises
 * take memory (P->materialize), after grouping, chains and prologue
 * pairing; the values recomputed for late readers, after the groups are
 * assembled; the steps (allocations before a promise's first touch,
 * releases after its last). tpurt__memplan_allocs_before moves the
 * allocations between steps i and j (and the units marked in `units`, if
 * not NULL) before step i (a pair of units run as one kernel at step i).
 * Each returns 0, or -1 out of host memory. */
TPURT_INTERNAL int tpurt__memplan_materialize(plan *P, const dgraph *G, const gstate *gl, pfacts *pf);
TPURT_INTERNAL int tpurt__memplan_remat(plan *P, const dgraph *G, const gstate *gl);
TPURT_INTERNAL int tpurt__memplan_steps(plan *P, const dgraph *G, pfacts *pf);
TPURT_INTERNAL void tpurt__memplan_allocs_before(plan *P, int i, int j, const uint8_t *units);
/* Can unit u change bytes [lo, hi)? */
TPURT_INTERNAL int tpurt__unit_writes(const plan *P, const dgraph *G, int u, uint64_t lo, uint64_t hi);
/* TORCH_TPU_DEFER_REMAT is not 0. */
TPURT_INTERNAL int tpurt__remat_enabled(void);

/* execute.c: runs graph G of stream s (caller holds s->dmu, with
 * tpurt__defer_bypass raised): finds its plan in the cache or builds it,
 * runs its steps, placing the host read `read` (or NULL) inside. What it
 * did goes to *ran for the stats. */
typedef struct tpurt__graph_ran {
  const plan *P; /* NULL: out of host memory while planning */
  int hit;       /* the plan came from the cache */
  uint64_t bytes_materialized, bytes_recomputed, bytes_never_materialized;
} tpurt__graph_ran;
TPURT_INTERNAL tpurt_status tpurt__graph_execute(tpurt_stream *s, dgraph *G, tpurt__host_read *read,
                                                 const plan *known, tpurt__graph_ran *ran);
/* Early execution of a predicted plan while its graph is recorded
 * (execute.c): node G->n - 1 was just recorded on s (caller holds s->dmu). */
TPURT_INTERNAL void tpurt__early_recorded(tpurt_stream *s, dgraph *G);
/* Its counters in the stats (record.c). */
TPURT_INTERNAL void tpurt__defer_count_early(uint64_t steps, int resumed, int discarded);
/* Plans in the cache. */
TPURT_INTERNAL uint64_t tpurt__plan_cache_size(void);

#endif
