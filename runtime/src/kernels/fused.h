/*
 * fused.h — the kernels' side of fused execution: the one interface through
 * which the graph engine (runtime/src/graph/, DeferAndFuse) runs fused
 * work, and through which a kernel family runs an elementwise launch
 * inside its own kernel. Implemented by the families named in each
 * section; the graph engine includes this header and no family's own.
 *
 * The contract. A family that takes part in fusion says here how to
 * recognise its recorded launches (tpurt__gemm_fn, tpurt__reduce_fn,
 * tpurt__fe_chainable: by the kernel function an opaque node carries),
 * when one of them can host an elementwise launch (tpurt__*_target: the
 * buffer, element count and order the host kernel reads or writes, and the
 * condition under which it does), a hash of its arguments' structure where
 * a cached plan depends on more than their size (tpurt__*_signature), and
 * the enqueue of the fused kernel. Past these calls the graph engine treats
 * a family's arguments as bytes, as it does every kernel's (it finds the
 * promise addresses in them and redirects them to recomputed copies). A fused
 * kernel gives the bits the separate launches give: the elementwise launch
 * computes every element as it would alone, from the same stored values,
 * and the host kernel reads, folds and writes the same values in the same
 * order. Elementwise launches cross the seam serialized (tpurt__ew_args):
 * the host kernel runs them, whole or by ranges, without knowing programs.
 *
 *   1. elementwise programs (kernels/elementwise.c): ops that record as
 *      programs so that they fuse; a group run as one launch; a launch run
 *      inside another kernel, whole, by ranges, or into the host's buffer
 *   2. copies (copy.c)
 *   3. GEMM epilogues (kernels/gemm.c)
 *   4. reduction prologues and epilogues (kernels/reduce.c)
 *   5. foreach chains (kernels/optim.c)
 */
#ifndef TPURT_FUSED_H
#define TPURT_FUSED_H

#include "../internal.h"

/* ------------------------------------------------ 1. elementwise programs */

/* An op whose work is elementwise (a dropout, a norm's scaling, a cast)
 * builds a program and launches it through tpurt__elementwise_named: in
 * DeferAndFuse it records as a program node and fuses with the ops around
 * it. The graph engine runs a fused group through the same call.
 * tpurt__ew_emit appends instruction op(a, b; p0) to a program built by a
 * kernel; its register is its index. */
static inline int tpurt__ew_emit(tpurt_ew_program *pr, int op, int a, int b, double p0) {
  tpurt_ew_inst *in = &pr->inst[pr->ninst];
  memset(in, 0, sizeof *in);
  in->op = (uint16_t)op;
  in->dst = (uint8_t)pr->ninst;
  in->src[0] = (uint8_t)a;
  in->src[1] = (uint8_t)b;
  in->p[0] = p0;
  return pr->ninst++;
}
/* Registers an elementwise op reads (0 for sources: load, scalar, const, uniform). */
TPURT_INTERNAL int tpurt__ew_nsrc(int op);
/* tpurt_elementwise with an explicit kernel name (NULL: from the program). */
TPURT_INTERNAL tpurt_status tpurt__elementwise_named(tpurt_stream *s, const tpurt_ew_program *prog,
                                                    const tpurt_view *outs, const tpurt_view *ins, int nin,
                                                    const double *scalars, int nscalars, const char *name);

/* An elementwise launch run inside another kernel (a GEMM's epilogue,
 * kernels/gemm.c): its arguments (malloc'd, *bytes long; views and program
 * checked as tpurt_elementwise does), the whole launch as its kernel runs
 * it, and a run by ranges of its row-major iteration space on the calling
 * thread. tpurt__ew_epi_begin is NULL where ranges cannot run (programs
 * over rows shorter than 8 elements, no host memory): run it whole.
 * Elements computed by ranges have the bits the whole launch gives them. */
TPURT_INTERNAL tpurt_status tpurt__ew_args(const tpurt_ew_program *prog, const tpurt_view *outs, const tpurt_view *ins,
                                          int nin, const double *scalars, int nscalars, void **args, size_t *bytes);
TPURT_INTERNAL tpurt_status tpurt__ew_kernel(void *args, char *err, size_t errlen);
typedef struct tpurt__ew_epi tpurt__ew_epi;
TPURT_INTERNAL tpurt__ew_epi *tpurt__ew_epi_begin(const void *args);
TPURT_INTERNAL void tpurt__ew_epi_range(tpurt__ew_epi *e, int64_t lo, int64_t hi);
/* Frees e; the error of a failed range, if any. */
TPURT_INTERNAL tpurt_status tpurt__ew_epi_end(tpurt__ew_epi *e, char *err, size_t errlen);
/* A launch one of whose outputs, `out`, goes to another kernel rather than
 * to memory (a reduction's prologue, kernels/reduce.c): that output's
 * address is not used; each run gives the memory its elements go to.
 * tpurt__ew_out_dense: is `out` dense row-major over the launch's
 * iteration space (element i at byte i * size)? — the condition of
 * tpurt__ew_into_begin, which is NULL only when out of host memory.
 * tpurt__ew_into_ranges: can it run by ranges (else only whole)? Ranges
 * run on the calling thread, on a clone per thread (same launch, own
 * error, own destination); tpurt__ew_epi_end frees either. */
TPURT_INTERNAL int tpurt__ew_out_dense(const void *args, int out);
TPURT_INTERNAL tpurt__ew_epi *tpurt__ew_into_begin(const void *args, int out);
TPURT_INTERNAL int tpurt__ew_into_ranges(const tpurt__ew_epi *e);
TPURT_INTERNAL tpurt__ew_epi *tpurt__ew_epi_clone(const tpurt__ew_epi *e);
/* Elements [lo, hi) of the iteration space; those of `out` to dst[0 .. hi - lo). */
TPURT_INTERNAL void tpurt__ew_into_range(tpurt__ew_epi *e, void *dst, int64_t lo, int64_t hi);
/* The whole launch on the pool; `out` to dst (numel elements). */
TPURT_INTERNAL void tpurt__ew_into_whole(tpurt__ew_epi *e, void *dst);

/* ---------------------------------------------------------------- 2. copies */

/* tpurt_copy_strided with a kernel name (copy.c). In DeferAndFuse a copy
 * that a one-load program makes with the same bits (casts, layout copies:
 * copy.c, copy_compute) records as that program, so that it fuses; a
 * group that is such a copy alone runs as this copy kernel instead. */
TPURT_INTERNAL tpurt_status tpurt__copy_strided_named(tpurt_stream *s, const tpurt_view *dst, const tpurt_view *src,
                                                     const char *name);

/* -------------------------------------------------------- 3. GEMM epilogues */

/* A GEMM whose output an elementwise launch reads (kernels/gemm.c, for
 * DeferAndFuse): tpurt__gemm_fn is the GEMM kernel's function; the C view
 * (and the A, B views) of its arguments when its f32 product can run the launch as its
 * epilogue (f32 operands, HIGHEST precision, C dense row-major); a
 * structure hash for plan keys; and the enqueue of the pair as one kernel
 * (the launch runs on each block of C as soon as the block is final, or
 * after the product where that path is not taken). */
TPURT_INTERNAL tpurt_kernel_fn tpurt__gemm_fn(void);
TPURT_INTERNAL int tpurt__gemm_epi_target(const void *gemm_args, tpurt_view *c, tpurt_view ab[2]);
TPURT_INTERNAL uint64_t tpurt__gemm_signature(const void *gemm_args);
TPURT_INTERNAL tpurt_status tpurt__gemm_epi_enqueue(tpurt_stream *s, const char *name, const void *gemm_args,
                                                   size_t gemm_size, const void *ew_args, size_t ew_size);

/* Two independent products as one kernel, each on a pool thread of its own
 * (kernels/gemm.c, for DeferAndFuse): the multiply-adds of a recorded
 * launch of fn (0: not a product the pair kernel runs) and the enqueue of
 * the pair (arguments copied; an error of either is the pair's). */
TPURT_INTERNAL int64_t tpurt__product_macs(tpurt_kernel_fn fn, const void *args, size_t size);
TPURT_INTERNAL tpurt_status tpurt__pair_enqueue(tpurt_stream *s, const char *name, tpurt_kernel_fn fa, const void *a,
                                               size_t na, tpurt_kernel_fn fb, const void *b, size_t nb);

/* ------------------------------------- 4. reduction prologues and epilogues */

/* A reduction whose input an elementwise launch computes, or whose
 * outputs one reads (kernels/reduce.c, for DeferAndFuse):
 * tpurt__reduce_fn is the reduction kernel's function;
 * tpurt__reduce_pro_target gives its input buffer, element count and dtype
 * when the reduction reads exactly elements [0, n) of it, each once, in
 * contiguous runs, on as many chunks as threads; tpurt__reduce_epi_target
 * its output's when it writes exactly elements [0, n) of one output; the
 * enqueue of the reduction with a prologue (its output `pro_out` is the
 * input, computed run by run into each thread's buffer and never stored)
 * and / or an epilogue (run on the outputs each chunk of the walk has
 * written, or whole after the walk), as one kernel. */
TPURT_INTERNAL tpurt_kernel_fn tpurt__reduce_fn(void);
TPURT_INTERNAL int tpurt__reduce_pro_target(const void *args, tpurt_devptr *in, int64_t *numel, tpurt_dtype *dt);
TPURT_INTERNAL int tpurt__reduce_epi_target(const void *args, tpurt_devptr *out, int64_t *numel, tpurt_dtype *dt);
TPURT_INTERNAL tpurt_status tpurt__reduce_fused_enqueue(tpurt_stream *s, const char *name, const void *args,
                                                       size_t size, const void *pro_args, size_t pro_size,
                                                       int pro_out, const void *epi_args, size_t epi_size);

/* -------------------------------------------------------- 5. foreach chains */

/* Chains of foreach launches (kernels/optim.c), for DeferAndFuse: k
 * consecutive launches over the same tuples run as one pass. */
typedef struct tpurt__fe_chain tpurt__fe_chain;
enum { TPURT__FE_CHAIN_MAX = 16 /* launches */ };
TPURT_INTERNAL int tpurt__fe_chainable(tpurt_kernel_fn fn);
/* Hash of a foreach launch's structure (op, operand kinds, shapes, dtypes,
 * strides; not its addresses or scalar values): a plan built on a chain
 * depends on it. */
TPURT_INTERNAL uint64_t tpurt__fe_signature(const void *args);
/* The chain of launches args[0..k), or NULL when they cannot run as one. */
TPURT_INTERNAL tpurt__fe_chain *tpurt__fe_chain_new(const void *const *args, int k);
/* Slots: the distinct views of every tuple. Slot i's address (in args) and
 * whether the chain reads it before writing it (a slot's value can stay in
 * registers only if it is first written). Stores of slots are kept unless
 * dropped. */
TPURT_INTERNAL int tpurt__fe_chain_nslots(const tpurt__fe_chain *c);
TPURT_INTERNAL tpurt_devptr tpurt__fe_chain_slot(const tpurt__fe_chain *c, const void *const *args, int i,
                                                 int *read_first);
TPURT_INTERNAL void tpurt__fe_chain_drop_store(tpurt__fe_chain *c, int i);
TPURT_INTERNAL int tpurt__fe_chain_stores(const tpurt__fe_chain *c);
/* A launch's device scalar (0: none or host values). */
TPURT_INTERNAL tpurt_devptr tpurt__fe_scalar_ptr(const void *args);
/* Enqueues the chain over the members' current argument blobs. */
TPURT_INTERNAL tpurt_status tpurt__fe_chain_enqueue(tpurt_stream *s, const char *name, const tpurt__fe_chain *c,
                                                   const void *const *args, const size_t *sizes);

#endif
