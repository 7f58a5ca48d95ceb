/*
 * codegen.h — generated elementwise kernels, the second kernel tier (see
 * codegen.c for the design). Internal to the runtime: elementwise.c asks
 * for the compiled kernel of a serialized launch and runs it over the
 * element ranges its interpreter would run.
 *
 * This header is also part of every generated source (embedded text): the
 * argument block below is the one ABI between the runtime and a kernel.
 */
#ifndef TPURT_CODEGEN_H
#define TPURT_CODEGEN_H

#include <stdint.h>

#include "../internal.h"

#define TPURT__CG_MAX_OPS (2 * TPURT_EW_MAX_IO)

/* Uniform draws of elements [lin0, lin0 + n) for a UNIFORM instruction's
 * baked parameters p (the interpreter's own function). */
typedef void (*tpurt__cg_uniform_fn)(const double *p, int64_t lin0, int n, float *out);

/* What a generated kernel reads: the coalesced iteration space (sizes,
 * byte strides of every operand, outputs first), operand addresses, the
 * launch's instruction list (constants and op parameters are read from it
 * at run time, so one kernel serves launches with other scalars). */
typedef struct tpurt__cg_args {
  int ndim;
  const int64_t *sizes;
  char *const *base;
  const int64_t (*bstr)[TPURT_MAX_DIMS];
  const tpurt_ew_inst *inst;
  tpurt__cg_uniform_fn uniform;
  uint64_t zero; /* 0, unknown to the compiler: the kernels' fold barrier */
} tpurt__cg_args;

/* Computes elements [lo, hi) (row-major over sizes); 1 on an integer
 * division by zero (elements of the range may then be partly written). */
typedef int (*tpurt__cg_fn)(const tpurt__cg_args *a, int64_t lo, int64_t hi);

#define TPURT__CG_SYMBOL "tpurt_cg_kernel"

#ifndef TPURT_CG_GENERATED
/* A launch as the code generator sees it: the serialized header's facts
 * (elementwise.c fills it from its ew_hdr and views). */
typedef struct tpurt__cg_launch {
  int compute, nout, nin, ninst, ndim;
  const uint8_t *dt;      /* nout + nin dtypes */
  const uint8_t *out_reg; /* nout */
  const tpurt_ew_inst *inst;
  const int64_t *sizes;
  const int64_t (*bstr)[TPURT_MAX_DIMS]; /* byte strides per operand */
  char *const *base;                     /* NULL: memory given per run (not checked for overlap) */
} tpurt__cg_launch;

/* The compiled kernel of this launch if it is ready, else NULL (the
 * interpreter runs it): compiles in the background on a miss (at once in
 * TORCH_TPU_CODEGEN=sync mode), counts the launch as compiled or
 * interpreted. Launches with fewer compute instructions than the gate are
 * not counted. Thread-safe, never blocks on a compile in async mode. */
TPURT_INTERNAL tpurt__cg_fn tpurt__codegen_find(const tpurt__cg_launch *l);
/* An instruction that computes nothing (the gate below does not count it). */
static inline int tpurt__cg_is_source(int op) {
  return op == TPURT_EW_LOAD || op == TPURT_EW_CONST || op == TPURT_EW_SCALAR || op == TPURT_EW_UNIFORM;
}
/* The compute instructions a launch needs to run generated code
 * (TORCH_TPU_CODEGEN_MIN_OPS), 0 when generation is off (TORCH_TPU_CODEGEN=0). */
TPURT_INTERNAL int tpurt__codegen_min_ops(void);

typedef struct tpurt__cg_stats {
  uint64_t kernels, failures, not_generated, launches_compiled, launches_interpreted;
  double compile_seconds;
} tpurt__cg_stats;
TPURT_INTERNAL void tpurt__codegen_stats(tpurt__cg_stats *out);
TPURT_INTERNAL void tpurt__codegen_reset_stats(void);

/* Tests: forget every kernel and re-read the environment (TORCH_TPU_CODEGEN,
 * CC) as a new process would; text appended to the next generated sources
 * (NULL: none), to make compiles fail. */
TPURT_TESTABLE void tpurt__codegen_reset(void);
TPURT_TESTABLE void tpurt__codegen_test_inject(const char *text);
/* Tests: the mode as TORCH_TPU_CODEGEN would set it ("0", "sync", "1"),
 * keeping the kernels built so far. */
TPURT_TESTABLE void tpurt__codegen_test_mode(const char *m);
#endif

#endif
